//! mapper-serial's framing against a device that sometimes answers after the timeout: two
//! properties read by requests whose replies look alike (`V=<n>`), the device on one end of a
//! socat pty pair answering every third read of `b` late. A late reply of `b` must never be taken
//! for `a`'s (`a` = 1, `b` = 2), nor a duplicate reply for the next one's. `SERIAL_LATE_SECS`
//! runs it longer (default 4 s).

use hardware_tests::PtyPair;
use mapper_serial::device::{Device, Point, Port};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TIMEOUT_MS: u64 = 200;

fn object(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

/// Answers `A?` with `V=1` after 50 ms and `B?` with `V=2` at once; every third `B?` 25 ms
/// after the timeout, that is while the next request (`A?`) waits for its reply; every fifth
/// `A?` twice.
fn device(path: std::path::PathBuf, stop: Arc<AtomicBool>, late: Arc<AtomicU64>) {
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the device's end");
    let writer = Arc::new(Mutex::new(port.try_clone().expect("clone")));
    let mut lines = BufReader::new(port);
    let (mut reads_of_a, mut reads_of_b) = (0u64, 0u64);
    let mut line = String::new();
    while !stop.load(Ordering::Relaxed) {
        line.clear();
        if lines.read_line(&mut line).unwrap_or(0) == 0 {
            break;
        }
        let send = |text: &'static [u8]| {
            if let Ok(mut w) = writer.lock() {
                let _ = w.write_all(text);
                let _ = w.flush();
            }
        };
        match line.trim() {
            "A?" => {
                reads_of_a += 1;
                std::thread::sleep(Duration::from_millis(50));
                send(b"V=1\n");
                if reads_of_a % 5 == 0 {
                    std::thread::sleep(Duration::from_micros(300));
                    send(b"V=1\n");
                }
            }
            "B?" => {
                reads_of_b += 1;
                if reads_of_b % 3 == 0 {
                    late.fetch_add(1, Ordering::Relaxed);
                    let w = writer.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(TIMEOUT_MS + 25));
                        if let Ok(mut w) = w.lock() {
                            let _ = w.write_all(b"V=2\n");
                            let _ = w.flush();
                        }
                    });
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
    let secs: u64 = std::env::var("SERIAL_LATE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = PtyPair::start(dir.path(), "serial");
    let stop = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicU64::new(0));
    let dev = {
        let (b, stop, late) = (pair.b.clone(), stop.clone(), late.clone());
        std::thread::spawn(move || device(b, stop, late))
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
    rt.block_on(async {
        let until = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < until {
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
    });
    stop.store(true, Ordering::Relaxed);
    drop(pair);
    let _ = dev.join();
    let late = late.load(Ordering::Relaxed);
    println!("{good} values right, {errors} errors, {late} late replies");
    assert!(late >= 2, "the device answered late only {late} times");
    assert!(good > 10, "{good}");
}
