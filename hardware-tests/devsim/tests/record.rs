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

fn meters_manifest(line: &std::path::Path) -> String {
    std::fs::read_to_string(sim::workspace_root().join("examples/modbus-rtu.yaml"))
        .expect("example")
        .replace("/dev/ttyUSB0", &line.display().to_string())
        .replace("nodeName: edge-node-1", "nodeName: test-node")
}

fn voltage(node: &Node, id: &str) -> Option<String> {
    sim::reported(&node.twin(id)?, "voltage")
}

/// The RTU tap between `mapper-modbus` and two meters on one (simulated) RS-485 line records
/// each slave's frames; the recording, replayed on a line, gives each meter its own value back.
#[test]
fn an_rtu_tap_recording_replays_to_the_same_twin_values() {
    use devsim::layout::load;
    use devsim::record::{serve_line, tap};
    use devsim::run::{Options, start};
    use devsim::scenario::Scenario;
    if sim::missing("socat", "socat") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("meters.pcap");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let scenario = Scenario::parse(
        "devices:\n  meter-a:\n    properties:\n      voltage: {value: {constant: 229.5}}\n  meter-b:\n    properties:\n      voltage: {value: {constant: 231.5}}\n",
    )
    .expect("scenario");
    let options = Options {
        pty_dir: dir.path().join("lines"),
        ..Options::default()
    };
    let served = rt
        .block_on(start(
            load(&meters_manifest(std::path::Path::new("/dev/ttyUSB0"))).expect("valid"),
            &scenario,
            &options,
        ))
        .expect("served");
    let line = served[0].line.clone().expect("a serial line");
    let open = |p: &std::path::Path| {
        tokio_serial::SerialStream::open(&tokio_serial::new(p.to_string_lossy(), 9600))
            .expect("a pty opens")
    };
    // mapper -> pty pair -> tap -> the meters' line.
    let mapper_side = sim::PtyPair::start(dir.path(), "tap");
    let (a, l) = (mapper_side.a.clone(), line.clone());
    let out = pcap.clone();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let recording = rt.spawn(async move {
        let stop = async {
            let _ = stop_rx.await;
        };
        tap(open(&a), open(&l), &out, stop).await
    });
    {
        let node = Node::start(&meters_manifest(&mapper_side.b));
        let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
        for (id, v) in [("default/meter-a", "229.5"), ("default/meter-b", "231.5")] {
            eventually(60, &format!("{v} through the tap"), || {
                (voltage(&node, id).as_deref() == Some(v)).then_some(())
            });
        }
    }
    // Stopped as Ctrl-C stops it: what the tap saw is still returned.
    let _ = stop_tx.send(());
    let counts = rt
        .block_on(recording)
        .expect("the tap ends")
        .expect("the tap's counts");
    assert!(
        counts.requests > 0 && counts.answers > 0 && counts.bad_crc == 0,
        "{counts:?}"
    );
    let rec = Recording::read(&pcap).expect("a readable recording");
    let units: std::collections::BTreeSet<u8> = rec.exchanges.keys().map(|(u, _)| *u).collect();
    assert_eq!(units, [1, 2].into(), "both slaves recorded: {rec:?}");

    // Replay: mapper -> pty pair -> the recording.
    let replay_side = sim::PtyPair::start(dir.path(), "replay");
    let a = replay_side.a.clone();
    rt.spawn(async move { serve_line(open(&a), rec, ReplayOptions::default()).await });
    let node = Node::start(&meters_manifest(&replay_side.b));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    for (id, v) in [("default/meter-a", "229.5"), ("default/meter-b", "231.5")] {
        eventually(60, &format!("{v} from the recording"), || {
            (voltage(&node, id).as_deref() == Some(v)).then_some(())
        });
    }
}

/// `devsim replay --line` holds a pty pair (socat): SIGINT, SIGTERM and SIGHUP each end it with
/// that pair gone, as Ctrl-C does.
#[test]
fn a_signal_ends_a_line_replay_and_leaves_no_pty_pair() {
    use std::io::BufRead;
    use std::process::Command;
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("oven.pcap");
    let oven = Sim::oven();
    let (oven_port, _oven_rt) = oven.start("127.0.0.1:0").expect("the oven");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // A recording of one read through the proxy.
    rt.block_on(async {
        use tokio_modbus::client::Reader;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = listener.local_addr().expect("its port").port();
        let out = pcap.clone();
        let recording = tokio::spawn(async move {
            let _ = proxy(listener, format!("127.0.0.1:{oven_port}"), &out).await;
        });
        let mut ctx = tokio_modbus::client::tcp::connect(([127, 0, 0, 1], port).into())
            .await
            .expect("connect");
        let _ = ctx.read_holding_registers(0, 1).await.expect("an answer");
        drop(ctx);
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        recording.abort();
    });
    for (signal, name) in [("INT", "a"), ("TERM", "b"), ("HUP", "c")] {
        let line = dir.path().join(format!("tty-{name}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_devsim"))
            .args(["replay", pcap.to_str().expect("path"), "--line"])
            .arg(&line)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("devsim runs");
        let pid = child.id();
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert!(first.contains("replaying"), "{first}");
        let socat: Vec<u32> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|s| s.parse::<u32>().ok())
                    == Some(pid)
            })
            .collect();
        assert_eq!(socat.len(), 1, "SIG{signal}: one socat for the pty pair");
        assert!(line.exists(), "the mapper's end of the pair");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let code = child.wait().expect("exits").code();
        assert_eq!(code, Some(0), "SIG{signal} ends it as Ctrl-C does");
        for p in &socat {
            // socat is reaped by devsim's drop of the pair: no process, not even a zombie.
            assert!(
                !std::path::Path::new(&format!("/proc/{p}")).exists(),
                "SIG{signal}: socat {p} is still there"
            );
        }
    }
}
