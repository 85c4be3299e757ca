//! mapper-serial's framing against a device that sometimes answers twice and sometimes after the
//! timeout: two properties read by requests whose replies look alike (`V=<n>`), the device on one
//! end of a socat pty pair. A late reply of `b` must never be taken for `a`'s (`a` = 1, `b` = 2),
//! nor a repeated reply for the next one's.
//!
//! The faults are placed in the order of the exchange, not at moments on a clock, so the test
//! means the same on a busy machine: the repetition of a reply is written with the reply, so it
//! is on the line before the mapper can send its next request (what the mapper must drop); a late
//! reply is written once the mapper has given up waiting for it and before its next request
//! reaches the device (what the mapper's drain after a timeout must drop). A late reply whose
//! moment passed (the next request came first, the device's thread having been held up) is not
//! sent: no mapper could tell it from the next answer on a line whose replies look alike.
//!
//! The run lasts until the device has sent `SERIAL_LATE_ROUNDS` (default 4) late replies and as
//! many repeated ones.

use mapper_serial::device::{Device, Point, Port};
use serde_json::{Value, json};
use sim::PtyPair;
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 200;

fn object(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// What the device did, for the verdict.
#[derive(Default)]
struct Faults {
    late: AtomicU64,
    repeated: AtomicU64,
    late_skipped: AtomicU64,
}

/// Answers `A?` with `V=1` after 50 ms and `B?` with `V=2` at once. Every third `A?` is answered
/// twice in one write. Every third `B?` is answered 25 ms after the mapper's timeout, unless the
/// next request arrives first.
fn device(path: std::path::PathBuf, stop: Arc<AtomicBool>, faults: Arc<Faults>) {
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the device's end");
    let mut writer = port.try_clone().expect("clone");
    // Requests come through a channel, so that waiting for a late reply's moment can also watch
    // for the next request.
    let (tx, requests) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(port).lines() {
            let Ok(l) = line else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut send = |text: &[u8]| {
        let _ = writer.write_all(text);
        let _ = writer.flush();
    };
    let (mut reads_of_a, mut reads_of_b) = (0u64, 0u64);
    let mut pending: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let line = match pending.take() {
            Some(l) => l,
            None => match requests.recv_timeout(Duration::from_millis(100)) {
                Ok(l) => l,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            },
        };
        match line.trim() {
            "A?" => {
                reads_of_a += 1;
                std::thread::sleep(Duration::from_millis(50));
                if reads_of_a.is_multiple_of(3) {
                    send(b"V=1\nV=1\n");
                    faults.repeated.fetch_add(1, Ordering::Relaxed);
                } else {
                    send(b"V=1\n");
                }
            }
            "B?" => {
                reads_of_b += 1;
                if reads_of_b.is_multiple_of(3) {
                    match requests.recv_timeout(Duration::from_millis(TIMEOUT_MS + 25)) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            send(b"V=2\n");
                            faults.late.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(next) => {
                            faults.late_skipped.fetch_add(1, Ordering::Relaxed);
                            pending = Some(next);
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => break,
                    }
                } else {
                    send(b"V=2\n");
                }
            }
            _ => {}
        }
    }
}

#[test]
fn a_late_or_repeated_reply_is_never_taken_for_another_request() {
    let rounds: u64 = std::env::var("SERIAL_LATE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = PtyPair::start(dir.path(), "serial");
    let stop = Arc::new(AtomicBool::new(false));
    let faults = Arc::new(Faults::default());
    let dev = {
        let (b, stop, faults) = (pair.b.clone(), stop.clone(), faults.clone());
        std::thread::spawn(move || device(b, stop, faults))
    };
    let port = Port::from_config(&object(json!({
        "serialPort": pair.a.display().to_string(), "baudRate": 115200, "mode": "ascii",
        "timeout": TIMEOUT_MS, "terminator": "\n"
    })))
    .expect("port");
    let point = |name: &str, request: &str| {
        Point::from_config(
            &port,
            name,
            &object(json!({"request": request, "pattern": "V=(\\d+)"})),
            Some("INT"),
            None,
            None,
        )
        .expect("point")
    };
    let points = vec![point("a", "A?"), point("b", "B?")];
    let mut device = Device::new(port, points);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (mut good, mut errors) = (0u64, 0u64);
    // A bound for a machine that never lets the device answer; not the verdict.
    let give_up = Instant::now() + Duration::from_secs(300);
    rt.block_on(async {
        while faults.late.load(Ordering::Relaxed) < rounds
            || faults.repeated.load(Ordering::Relaxed) < rounds
        {
            assert!(
                Instant::now() < give_up,
                "the device sent {} late and {} repeated replies in 300 s",
                faults.late.load(Ordering::Relaxed),
                faults.repeated.load(Ordering::Relaxed)
            );
            for (i, r) in device.read(&[0, 1]).await {
                match r {
                    Ok(v) => {
                        let want = if i == 0 { "1" } else { "2" };
                        assert_eq!(v, want, "property {i} got the other property's reply");
                        good += 1;
                    }
                    Err(_) => errors += 1,
                }
            }
        }
        // The reads after the last fault: its reply must not land on them either.
        for _ in 0..2 {
            for (i, r) in device.read(&[0, 1]).await {
                if let Ok(v) = r {
                    let want = if i == 0 { "1" } else { "2" };
                    assert_eq!(v, want, "property {i} got the other property's reply");
                }
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    drop(pair);
    let _ = dev.join();
    let skipped = faults.late_skipped.load(Ordering::Relaxed);
    println!("{good} values right, {errors} errors, {skipped} late replies whose moment passed");
    // Every late reply costs its read a timeout; every other read is answered.
    assert!(good >= 2 * rounds, "{good}");
}
