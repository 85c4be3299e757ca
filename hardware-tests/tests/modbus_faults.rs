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
