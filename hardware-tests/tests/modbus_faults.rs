//! Faults from the project's own simulator (`sim::modbus_sim`), run in this test
//! process, against the real `edgecore` and `mapper-modbus`: a silent device times out without
//! stalling another one, garbage frames are errors (never a crash) and the device recovers, and
//! dropped connections are made again.

use sim::modbus_sim::Sim;
use sim::{Node, agent, eventually, free_port, get, reported};
use std::time::{Duration, Instant};

fn device(name: &str, port: u16) -> String {
    sim::fill(
        include_str!("manifests/modbus_faults_device.yaml"),
        &[("name", &name), ("port", &port)],
    )
}

const MODEL: &str = include_str!("manifests/modbus_faults_model.yaml");

#[test]
fn a_silent_device_does_not_stall_others_and_garbage_and_drops_are_survived() {
    let slow = Sim::with(|s| {
        s.holding.insert(0, 1);
    });
    let fast = Sim::with(|s| {
        s.holding.insert(0, 1);
        // Every connection is dropped after 20 requests: the mapper must reconnect.
        s.drop_after = Some(20);
    });
    let (slow_port, _rt1) = slow.start("127.0.0.1:0").expect("simulator");
    let (fast_port, _rt2) = fast.start("127.0.0.1:0").expect("simulator");
    let node = Node::start(&format!(
        "{MODEL}{}{}",
        device("slow", slow_port),
        device("fast", fast_port)
    ));
    let rest_port = free_port();
    let mut mapper = node.mapper("mapper-modbus", "modbus", rest_port);

    let value = |d: &str| {
        node.twin(&format!("default/{d}"))
            .and_then(|t| reported(&t, "count"))
    };
    eventually(20, "both devices report", || {
        (value("slow").is_some() && value("fast").is_some()).then_some(())
    });

    // Ten changes of the fast device while the slow one answers: what they take on this
    // machine, now (the verdict below compares with it, not with a fixed time).
    let ten_changes = |first: u16| {
        let started = Instant::now();
        for n in first..first + 10 {
            fast.edit(|s| s.holding.insert(0, n));
            eventually(5, "fast value", || {
                (value("fast").as_deref() == Some(n.to_string().as_str())).then_some(())
            });
        }
        started.elapsed()
    };
    let healthy = ten_changes(100);

    // The slow device stops answering in time (3 s delay, 300 ms timeout): it goes offline
    // while the fast one's changes keep arriving at its 100 ms cycle.
    slow.edit(|s| s.delay = Duration::from_secs(3));
    eventually(10, "slow offline", || {
        let t = node.twin("default/slow")?;
        (t["state"] == "offline").then_some(())
    });
    let took = ten_changes(2);
    // A fast read that waited for the slow device's 300 ms timeout would add that to each
    // change (3 s over ten, more than the healthy run's ~1 s at a 100 ms cycle): twice the
    // healthy run's time is the bound, so a busy machine slows both alike.
    assert!(
        took < healthy * 2 + Duration::from_millis(500),
        "{took:?} for 10 changes with the slow device silent, {healthy:?} with it answering"
    );
    let fast_twin = node.twin("default/fast").expect("fast twin");
    assert_eq!(fast_twin["state"], "online");
    // While it does not answer, the slow device is reconnected at a growing backoff, and
    // "reconnected" is logged once (the first time after it had answered), not at every try.
    std::thread::sleep(Duration::from_secs(2));
    let reconnected = mapper
        .log_text()
        .lines()
        .filter(|l| l.contains("reconnected") && l.contains("default/slow") && l.contains("INFO"))
        .count();
    assert!(reconnected <= 1, "{}", mapper.log_text());

    // Garbage answers: errors and reconnects, never a crash; good answers again: online.
    fast.set_mangle(sim::modbus_sim::Mangle::Garbage);
    eventually(10, "fast offline on garbage", || {
        let t = node.twin("default/fast")?;
        (t["state"] == "offline").then_some(())
    });
    fast.set_mangle(sim::modbus_sim::Mangle::None);
    fast.edit(|s| s.holding.insert(0, 77));
    eventually(15, "fast back", || {
        (value("fast").as_deref() == Some("77")).then_some(())
    });
    slow.edit(|s| s.delay = Duration::ZERO);
    eventually(15, "slow back online", || {
        let t = node.twin("default/slow")?;
        (t["state"] == "online").then_some(())
    });
    assert!(
        mapper.child.try_wait().ok().flatten().is_none(),
        "the mapper must still run"
    );
    // The dropped connections were made again (20 requests per connection).
    let (_, metrics) = get(
        &agent(),
        &format!("http://127.0.0.1:{rest_port}/api/v1/ping"),
    );
    assert_eq!(metrics["statusCode"], 200);
    let text = ureq::get(&format!("http://127.0.0.1:{rest_port}/metrics"))
        .call()
        .ok()
        .and_then(|mut r| r.body_mut().read_to_string().ok())
        .unwrap_or_default();
    let reconnects: f64 = text
        .lines()
        .find(|l| l.starts_with("mapper_reconnects_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(reconnects >= 3.0, "{reconnects} reconnects\n{text}");
}

/// Established TCP connections to `port` on loopback, as `ss` sees them (the simulator's side
/// of each counts once).
fn connections_to(port: u16) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-Htn", "state", "established"])
        .arg(format!("( sport = :{port} )"))
        .output()
        .expect("ss (iproute2)");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

#[test]
fn units_behind_one_gateway_share_its_connection_each_value_on_its_own_device() {
    // A Modbus TCP gateway with three units behind it, each with its own value; unit 9 is not
    // there (the gateway answers exception 11 for it).
    let units: Vec<Sim> = (1..=3u16)
        .map(|u| {
            Sim::with(|s| {
                s.holding.insert(0, 100 * u);
            })
        })
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let by_id = units
        .iter()
        .enumerate()
        .map(|(i, s)| ((i + 1) as u8, s.clone()))
        .collect();
    rt.spawn(sim::modbus_sim::serve_units(
        listener,
        sim::modbus_sim::Units::ById(by_id),
    ));
    let device = |name: &str, unit: u8| {
        sim::fill(
            include_str!("manifests/modbus_gateway_device.yaml"),
            &[("name", &name), ("port", &port), ("unit", &unit)],
        )
    };
    let node = Node::start(&format!(
        "{MODEL}{}{}{}{}",
        device("unit-1", 1),
        device("unit-2", 2),
        device("unit-3", 3),
        device("unit-9", 9)
    ));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    let value = |d: &str| {
        node.twin(&format!("default/{d}"))
            .and_then(|t| reported(&t, "count"))
    };
    eventually(20, "each unit's value on its own device", || {
        (value("unit-1").as_deref() == Some("100")
            && value("unit-2").as_deref() == Some("200")
            && value("unit-3").as_deref() == Some("300"))
        .then_some(())
    });
    // The unit that is not there says why on its own twin; the others stay online.
    eventually(10, "unit-9's exception on its twin", || {
        let t = node.twin("default/unit-9")?;
        t["properties"]["count"]["error"]["message"]
            .as_str()
            .filter(|m| m.contains("exception"))
            .map(|_| ())
    });
    assert_eq!(value("unit-9"), None);
    // A change on one unit lands on its device only.
    units[1].edit(|s| s.holding.insert(0, 222));
    eventually(10, "unit-2's new value", || {
        (value("unit-2").as_deref() == Some("222")).then_some(())
    });
    assert_eq!(value("unit-1").as_deref(), Some("100"));
    assert_eq!(value("unit-3").as_deref(), Some("300"));
    for d in ["unit-1", "unit-2", "unit-3"] {
        let t = node.twin(&format!("default/{d}")).expect("twin");
        assert_eq!(t["state"], "online", "{t}");
    }
    // Four devices, one gateway: one connection (a gateway takes a few at most).
    assert_eq!(connections_to(port), 1, "connections to the gateway");
}
