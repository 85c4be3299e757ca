//! End to end over OPC UA: the real `edgecore`, `mapper-opcua` and `kectl` against the
//! third-party python asyncua server (`sims/opcua_server.py`: typed variables, some changing by
//! themselves) and the project's in-process async-opcua server (`opcua_sim`, restarted under
//! the mapper). Needs `python3` with `asyncua` (`.ci/run` installs it).

use sim::opcua_sim::{OpcSim, Options};
use sim::{Node, PySim, eventually, free_port, property_error, reported};
use std::time::Duration;

const ASYNCUA: &str = "pip install 'asyncua==2.1.*'";

fn manifests(asyncua: u16, sim: &str, sim_ns: u16) -> String {
    sim::fill(
        include_str!("manifests/opcua.yaml"),
        &[("asyncua", &asyncua), ("sim", &sim), ("sim_ns", &sim_ns)],
    )
}

#[test]
fn asyncua_and_in_process_servers_through_edgecore() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = free_port();
    let _asyncua = PySim::start("opcua_server.py", &[&port.to_string()], ASYNCUA);
    let sim = OpcSim::start(Options {
        port: 0,
        tags: 0,
        pki: dir.path().join("sim-pki"),
        max_nodes_per_read: 0,
    })
    .expect("in-process server");
    let node = Node::start(&manifests(port, &sim.url(), sim.ns));
    let http = free_port();
    let mapper = node.mapper("mapper-opcua", "opcua", http);

    // Every kind of value from the asyncua server, typed as the twin carries them.
    let twin = eventually(30, "line-1's values", || {
        let t = node.twin("default/line-1")?;
        for p in ["speed", "count", "running", "batch", "locked", "tick"] {
            reported(&t, p)?;
        }
        // The state comes in its own report, after the first values.
        (t["state"] == "online").then_some(t)
    });
    assert_eq!(reported(&twin, "speed").as_deref(), Some("120.5"));
    assert_eq!(reported(&twin, "count").as_deref(), Some("7"));
    assert_eq!(reported(&twin, "running").as_deref(), Some("true"));
    assert_eq!(reported(&twin, "batch").as_deref(), Some("B-0001"));
    // The subscribed tick moves by itself.
    let first: i64 = reported(&twin, "tick")
        .and_then(|v| v.parse().ok())
        .expect("tick");
    eventually(10, "tick rising", || {
        let t: i64 = reported(&node.twin("default/line-1")?, "tick")?
            .parse()
            .ok()?;
        (t > first + 3).then_some(())
    });
    // A node the server does not have fails that property only, with the server's reason.
    let e = eventually(10, "missing's error", || {
        property_error(http, "line-1", "missing")
    });
    assert!(e.contains("BadNodeIdUnknown"), "{e}");

    // Desired values are written in the node's type and read back.
    node.kectl(&["twin", "set", "default/line-1", "speed", "99.25"]);
    node.kectl(&["twin", "set", "default/line-1", "count", "42"]);
    node.kectl(&["twin", "set", "default/line-1", "batch", "B-0042"]);
    eventually(10, "writes read back", || {
        let t = node.twin("default/line-1")?;
        (reported(&t, "speed")? == "99.25"
            && reported(&t, "count")? == "42"
            && reported(&t, "batch")? == "B-0042")
            .then_some(())
    });
    // A DateTime reads as RFC 3339 without quotes, and a written one (or an array) reads back
    // as the very text written, so no delta is left.
    let t = node.twin("default/line-1").expect("twin");
    assert_eq!(
        reported(&t, "stamp").as_deref(),
        Some("2024-01-02T03:04:05Z"),
        "{t}"
    );
    assert_eq!(
        reported(&t, "levels").as_deref(),
        Some("[0.5,1.5,2.5]"),
        "{t}"
    );
    node.kectl(&[
        "twin",
        "set",
        "default/line-1",
        "stamp",
        "2024-05-06T07:08:09.123Z",
    ]);
    node.kectl(&["twin", "set", "default/line-1", "levels", "[1.25,2,3.5]"]);
    eventually(
        10,
        "the DateTime and the array read back as written",
        || {
            let t = node.twin("default/line-1")?;
            (reported(&t, "stamp")? == "2024-05-06T07:08:09.123Z"
                && reported(&t, "levels")? == "[1.25,2,3.5]")
                .then_some(())
        },
    );

    // The server's refusals: a read-only node, and an Int32 node written as a Double.
    node.kectl(&["twin", "set", "default/line-1", "locked", "2.5"]);
    node.kectl(&["twin", "set", "default/line-1", "count-as-double", "3.5"]);
    eventually(10, "refusals in the mapper's log", || {
        let log = mapper.log_text();
        (log.contains("BadUserAccessDenied") && log.contains("BadTypeMismatch")).then_some(())
    });
    let twin = node.twin("default/line-1").expect("twin");
    assert_eq!(reported(&twin, "locked").as_deref(), Some("1.5"), "{twin}");
    assert_eq!(reported(&twin, "count").as_deref(), Some("42"), "{twin}");
    assert_eq!(twin["state"], "online", "{twin}");

    // The in-process server: a subscribed value follows changes; the server restarts under
    // the mapper and the subscription comes back.
    eventually(20, "oven-1's temperature", || {
        (reported(&node.twin("default/oven-1")?, "temperature")? == "20.5").then_some(())
    });
    sim.set("Temperature", 180.25f64);
    eventually(10, "the change reported", || {
        (reported(&node.twin("default/oven-1")?, "temperature")? == "180.25").then_some(())
    });
    let options = sim.stop();
    eventually(15, "oven-1 offline", || {
        (node.twin("default/oven-1")?["state"] == "offline").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let sim = OpcSim::start(options).expect("restart on the same port");
    eventually(30, "oven-1 back online with its initial value", || {
        let t = node.twin("default/oven-1")?;
        (t["state"] == "online" && reported(&t, "temperature")? == "20.5").then_some(())
    });
    sim.set("Temperature", 75.5f64);
    eventually(10, "a change after the restart", || {
        (reported(&node.twin("default/oven-1")?, "temperature")? == "75.5").then_some(())
    });
    // The client's config names its server: no "Endpoint config contains no endpoints" at start.
    assert!(
        !mapper.log_text().contains("contains no endpoints"),
        "{}",
        mapper.log_text()
    );
    // line-1 on the other server never noticed.
    assert_eq!(
        node.twin("default/line-1").expect("twin")["state"],
        "online"
    );
}

/// asyncua's own example server (`uaserver --populate`, as its users start it), unchanged: its
/// sample nodes `MyWritableVariable` (`ns=2;i=2`), `MyVariable` (`ns=2;i=3`, a sine written
/// every second) and `MyVarArray` (`ns=2;i=4`).
struct UaServer(std::process::Child);

impl Drop for UaServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn asyncua_uaserver_sample_nodes() {
    let port = free_port();
    let server = std::process::Command::new(sim::python())
        .args([
            "-c",
            "from asyncua.tools import uaserver; uaserver()",
            "-u",
            &format!("opc.tcp://127.0.0.1:{port}"),
            "-p",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 runs");
    let _server = UaServer(server);
    // It takes some 13 s to start on these machines.
    eventually(60, "uaserver listening", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).ok()
    });
    let manifests = sim::fill(
        include_str!("manifests/opcua_plant.yaml"),
        &[("port", &port)],
    );
    let node = Node::start(&manifests);
    let http = free_port();
    let _mapper = node.mapper("mapper-opcua", "opcua", http);
    let twin = eventually(40, "the sample nodes' values", || {
        let t = node.twin("default/ua-example")?;
        for p in ["writable", "sine", "array"] {
            reported(&t, p)?;
        }
        (t["state"] == "online").then_some(t)
    });
    assert_eq!(reported(&twin, "writable").as_deref(), Some("6.7"));
    let array: Vec<f64> = reported(&twin, "array")
        .and_then(|a| serde_json::from_str(&a).ok())
        .expect("MyVarArray as a JSON array");
    assert_eq!(array.len(), 2, "{twin}");
    // MyVariable changes every second by itself; the subscription brings each change.
    let first = reported(&twin, "sine").expect("sine");
    eventually(10, "MyVariable changing", || {
        let now = reported(&node.twin("default/ua-example")?, "sine")?;
        (now != first).then_some(())
    });
    node.kectl(&["twin", "set", "default/ua-example", "writable", "12.5"]);
    eventually(10, "MyWritableVariable written and read back", || {
        (reported(&node.twin("default/ua-example")?, "writable")? == "12.5").then_some(())
    });
}
