//! End to end over serial lines: the real `edgecore`, `mapper-serial` and `kectl` against a
//! device emulator written with pyserial (`sims/serial_device.py`) on one end of a socat pty
//! pair. An ASCII line with three devices (one answering, one silent, one late) and a binary
//! line with CRC-16 framed requests. Needs `socat` and `python3` with `pyserial` (`.ci/run`
//! installs them).

use sim::{Node, PtyPair, PySim, eventually, free_port, property_error, reported};

const PYSERIAL: &str = "pip install pyserial";

fn manifests(ascii: &str, binary: &str) -> String {
    sim::fill(
        include_str!("manifests/serial.yaml"),
        &[("ascii", &ascii), ("binary", &binary)],
    )
}

#[test]
fn ascii_and_binary_devices_on_shared_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ascii = PtyPair::start(dir.path(), "ascii");
    let binary = PtyPair::start(dir.path(), "binary");
    let _ascii_device = PySim::start(
        "serial_device.py",
        &["ascii", &ascii.a.display().to_string()],
        PYSERIAL,
    );
    let _binary_device = PySim::start(
        "serial_device.py",
        &["binary", &binary.a.display().to_string()],
        PYSERIAL,
    );
    let node = Node::start(&manifests(
        &ascii.b.display().to_string(),
        &binary.b.display().to_string(),
    ));
    let http = free_port();
    let _mapper = node.mapper("mapper-serial", "serial", http);

    // ASCII: three properties from one reply line, typed; the temperature rises per read.
    let twin = eventually(20, "thermo-1's values", || {
        let t = node.twin("default/thermo-1")?;
        reported(&t, "temperature")?;
        reported(&t, "setpoint")?;
        Some(t)
    });
    assert_eq!(reported(&twin, "humidity").as_deref(), Some("41.5"));
    assert_eq!(reported(&twin, "status").as_deref(), Some("OK"));
    let first: f64 = reported(&twin, "temperature")
        .and_then(|v| v.parse().ok())
        .expect("a number");
    eventually(10, "the temperature rising", || {
        let t: f64 = reported(&node.twin("default/thermo-1")?, "temperature")?
            .parse()
            .ok()?;
        (t > first).then_some(())
    });
    // One MEAS? per cycle for the three properties: as many as COUNT? requests, not three times.
    let (meas, counts) = eventually(10, "request counters", || {
        let t = node.twin("default/thermo-1")?;
        let m: i64 = reported(&t, "meas-requests")?.parse().ok()?;
        let c: i64 = reported(&t, "count-requests")?.parse().ok()?;
        (c >= 5).then_some((m, c))
    });
    assert!(
        (meas - counts).abs() <= 2,
        "{meas} MEAS? requests for {counts} cycles: properties with one request must share it"
    );

    // A garbled reply fails that property only, with the reply in the error.
    let e = eventually(10, "noise's error", || {
        property_error(http, "thermo-1", "noise")
    });
    assert!(e.contains("does not match"), "{e}");
    assert_eq!(reported(&twin, "noise"), None);

    // The silent and the late device go offline; thermo-1 on the same line stays online, and
    // the late answers are never taken for its replies.
    for dev in ["silent-2", "late-3"] {
        eventually(15, &format!("{dev} offline"), || {
            (node.twin(&format!("default/{dev}"))?["state"] == "offline").then_some(())
        });
    }
    let e = property_error(http, "silent-2", "temperature").unwrap_or_default();
    assert!(e.contains("no complete reply within 300ms"), "{e}");
    let twin = node.twin("default/thermo-1").expect("twin");
    assert_eq!(twin["state"], "online", "{twin}");
    assert_eq!(reported(&twin, "status").as_deref(), Some("OK"));
    assert_eq!(reported(&twin, "humidity").as_deref(), Some("41.5"));

    // A desired value is written with the template; the reply is checked; it reads back.
    node.kectl(&["twin", "set", "default/thermo-1", "setpoint", "75"]);
    eventually(10, "setpoint 75 reported", || {
        (reported(&node.twin("default/thermo-1")?, "setpoint")? == "75").then_some(())
    });
    // Out of the model's range: refused at the edge with the reason, never sent.
    let out = std::process::Command::new(sim::bin("kectl"))
        .args(["twin", "set", "default/thermo-1", "setpoint", "150"])
        .env("KECTL_SERVER", &node.http)
        .output()
        .expect("kectl runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("150 is above the model maximum 100"),
        "{stderr}"
    );
    std::thread::sleep(std::time::Duration::from_millis(800));
    let twin = node.twin("default/thermo-1").expect("twin");
    assert_eq!(reported(&twin, "setpoint").as_deref(), Some("75"), "{twin}");

    // Binary: fields by offset, sign, scale, endianness and bit, CRC-16 checked.
    let twin = eventually(20, "counter-1's values", || {
        let t = node.twin("default/counter-1")?;
        reported(&t, "count")?;
        reported(&t, "setpoint")?;
        Some(t)
    });
    assert_eq!(reported(&twin, "temperature").as_deref(), Some("-12.5"));
    let count: i64 = reported(&twin, "count")
        .and_then(|v| v.parse().ok())
        .expect("count");
    assert!(count >= 1, "{twin}");
    assert!(
        matches!(reported(&twin, "odd").as_deref(), Some("true" | "false")),
        "{twin}"
    );
    assert_eq!(reported(&twin, "setpoint").as_deref(), Some("100"));
    // The frame with a wrong checksum fails that property, naming both sums.
    let e = eventually(10, "checked's error", || {
        property_error(http, "counter-1", "checked")
    });
    assert!(e.contains("bad checksum: received"), "{e}");
    // A binary write: AA 10 <value> with its CRC, then read back.
    node.kectl(&["twin", "set", "default/counter-1", "setpoint", "321"]);
    eventually(10, "setpoint 321 reported", || {
        (reported(&node.twin("default/counter-1")?, "setpoint")? == "321").then_some(())
    });
    assert_eq!(
        node.twin("default/counter-1").expect("twin")["state"],
        "online"
    );
}
