//! A recording made through `devsim`'s proxy between the real `mapper-modbus` (under the real
//! edgecore) and a simulated oven replays, as a device, to the same twin values.

use devsim::record::{Recording, ReplayOptions, proxy, serve};
use sim::modbus_sim::Sim;
use sim::{Node, eventually, free_port};

fn oven_manifest(port: u16) -> String {
    std::fs::read_to_string(sim::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("port: 5020", &format!("port: {port}"))
        .replace("nodeName: edge-node-1", "nodeName: test-node")
}

fn temperature(node: &Node) -> Option<String> {
    sim::reported(&node.twin("default/oven-1")?, "temperature")
}

#[test]
fn a_recording_replays_to_the_same_twin_values() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("oven.pcap");
    let oven = Sim::oven();
    let (oven_port, _oven_rt) = oven.start("127.0.0.1:0").expect("the oven");
    let rt = tokio::runtime::Runtime::new().expect("runtime");

    // Recording: mapper -> proxy -> oven.
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("listen");
    let proxy_port = listener.local_addr().expect("its port").port();
    let out = pcap.clone();
    let recording = rt.spawn(async move {
        let _ = proxy(listener, format!("127.0.0.1:{oven_port}"), &out).await;
    });
    {
        let node = Node::start(&oven_manifest(proxy_port));
        let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
        eventually(60, "21.5 through the proxy", || {
            (temperature(&node).as_deref() == Some("21.5")).then_some(())
        });
        // The set point the manifest declares was written through the proxy too.
        eventually(60, "the set point written", || {
            (oven.holding(1) == Some(80)).then_some(())
        });
        oven.edit(|s| {
            s.holding.insert(0, 333);
        });
        eventually(60, "33.3 through the proxy", || {
            (temperature(&node).as_deref() == Some("33.3")).then_some(())
        });
    }
    recording.abort();
    let bytes = std::fs::read(&pcap).expect("the recording");
    assert_eq!(&bytes[..4], &0xa1b2_c3d4u32.to_le_bytes(), "a pcap file");

    // Replay: mapper -> the recording.
    let rec = Recording::read(&pcap).expect("a readable recording");
    assert!(rec.answers() >= 3, "{rec:?}");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("listen");
    let replay_port = listener.local_addr().expect("its port").port();
    rt.spawn(serve(listener, rec, ReplayOptions::default()));
    let node = Node::start(&oven_manifest(replay_port));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let mut seen = Vec::new();
    eventually(90, "33.3 from the recording", || {
        let t = temperature(&node);
        if let Some(v) = &t
            && seen.last() != Some(v)
        {
            seen.push(v.clone());
        }
        (t.as_deref() == Some("33.3")).then_some(())
    });
    assert!(
        seen.iter().all(|v| v == "21.5" || v == "33.3"),
        "only recorded values: {seen:?}"
    );
    assert_eq!(
        node.twin("default/oven-1")
            .and_then(|t| sim::reported(&t, "setpoint")),
        Some("80".into())
    );
}
