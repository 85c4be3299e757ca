//! End to end over Modbus RTU: pymodbus's serial server on one end of a socat pty pair, two
//! devices (slave 1 and 2) on the other end sharing one line through the real `mapper-modbus`,
//! and the real `edgecore` and `kectl`. Needs `socat` and `python3` with `pymodbus`
//! (`.ci/run` installs them). A pty ignores baud rate and timing: this tests framing and the
//! shared line; the silence between frames is tested with paused time in `mapper-modbus`.

use sim::{Node, PtyPair, PyModbus, eventually, free_port, reported};

fn device(name: &str, slave: u8, tty: &str) -> String {
    sim::fill(
        include_str!("manifests/modbus_rtu_device.yaml"),
        &[("name", &name), ("tty", &tty), ("slave", &slave)],
    )
}

const MODEL: &str = include_str!("manifests/modbus_rtu_model.yaml");

#[test]
fn two_devices_share_one_serial_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pty = PtyPair::start(dir.path(), "tty");
    let _sim = PyModbus::start_rtu(&pty.a);

    let tty = pty.b.display().to_string();
    let node = Node::start(&format!(
        "{MODEL}{}{}",
        device("meter-1", 1, &tty),
        device("meter-2", 2, &tty)
    ));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());

    for d in ["default/meter-1", "default/meter-2"] {
        // The online state comes in its own report, after the first values.
        let t = eventually(20, "both meters report and are online", || {
            let t = node.twin(d)?;
            (reported(&t, "scratch").is_some() && t["state"] == "online").then_some(t)
        });
        assert_eq!(reported(&t, "raw").as_deref(), Some("650"), "{d}");
        let p: f64 = reported(&t, "pressure")
            .and_then(|v| v.parse().ok())
            .expect("pressure");
        assert!((p - 123.456).abs() < 1e-3);
        assert_eq!(t["state"], "online");
    }

    // A desired value goes over the shared line and comes back.
    node.kectl(&["twin", "set", "default/meter-2", "scratch", "4242"]);
    eventually(10, "written over RTU and reported", || {
        let t = node.twin("default/meter-2")?;
        (reported(&t, "scratch").as_deref() == Some("4242")).then_some(())
    });
    // pymodbus serves one register map to every slave id: meter-1 sees the write too, which
    // proves both devices read the same line after it.
    eventually(10, "meter-1 reads the same register", || {
        let t = node.twin("default/meter-1")?;
        (reported(&t, "scratch").as_deref() == Some("4242")).then_some(())
    });
}
