//! A Modbus RTU device that sometimes answers after the mapper's timeout (issue: a late answer
//! swapped two properties' values for seconds, the device still `online`). On RTU nothing in a
//! frame says which request it answers, so a late answer to a read of `b` would be taken for
//! the answer to the next read of `a`, a request of the same shape. The device here is the
//! project's own, written for the test on one end of a socat pty pair: slave 4, input register
//! 0 = 1111 (`a`) and 50 = 2222 (`b`), every third read of `b` answered 1.4 s late (the
//! mapper's timeout is 1 s). The real edgecore and mapper-modbus read it for a while; `a` must
//! never show 2222 nor `b` 1111.

use sim::{Node, PtyPair, eventually, free_port, reported};
use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Modbus RTU's CRC, low byte first (mapper-serial's implementation).
fn crc(data: &[u8]) -> Vec<u8> {
    mapper_serial::checksum::Checksum::Crc16Modbus.compute(data)
}

/// Serves function 4 (read input registers) for slave 4 on `tty` until `stop`; counts the late
/// answers it gave.
fn late_device(tty: std::path::PathBuf, stop: Arc<AtomicBool>, late: Arc<AtomicU64>) {
    let mut port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&tty)
        .expect("the device's end of the line");
    let mut buf = Vec::new();
    let mut reads_of_b = 0u64;
    let mut chunk = [0u8; 256];
    while !stop.load(Ordering::Relaxed) {
        let n = match port.read(&mut chunk) {
            Ok(n) => n,
            Err(_) => break,
        };
        buf.extend_from_slice(&chunk[..n]);
        while buf.len() >= 8 {
            let frame: Vec<u8> = buf.drain(..8).collect();
            if crc(&frame[..6]) != frame[6..8] {
                // Out of step: resynchronise on the next byte.
                buf.clear();
                continue;
            }
            let (slave, function) = (frame[0], frame[1]);
            let address = u16::from_be_bytes([frame[2], frame[3]]);
            let count = u16::from_be_bytes([frame[4], frame[5]]);
            if slave != 4 || function != 4 || count != 1 {
                continue;
            }
            let value: u16 = match address {
                0 => 1111,
                50 => 2222,
                _ => 0,
            };
            if address == 50 {
                reads_of_b += 1;
                if reads_of_b.is_multiple_of(3) {
                    std::thread::sleep(Duration::from_millis(1400));
                    late.fetch_add(1, Ordering::Relaxed);
                }
            }
            let mut answer = vec![4, 4, 2];
            answer.extend_from_slice(&value.to_be_bytes());
            let crc = crc(&answer);
            answer.extend_from_slice(&crc);
            if port.write_all(&answer).is_err() {
                return;
            }
        }
    }
}

#[test]
fn a_late_rtu_answer_is_never_attached_to_another_property() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pty = PtyPair::start(dir.path(), "tty");
    let stop = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicU64::new(0));
    let device = {
        let (tty, stop, late) = (pty.a.clone(), stop.clone(), late.clone());
        std::thread::spawn(move || late_device(tty, stop, late))
    };
    let tty = pty.b.display().to_string();
    let node = Node::start(&sim::fill(
        include_str!("manifests/modbus_rtu_late.yaml"),
        &[("tty", &tty)],
    ));
    let _mapper = node.mapper("mapper-modbus", "modbus", free_port());
    eventually(20, "both values reported", || {
        let t = node.twin("default/late-4")?;
        (reported(&t, "a").is_some() && reported(&t, "b").is_some()).then_some(())
    });
    let seconds: u64 = std::env::var("RTU_LATE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut checks = 0u64;
    while Instant::now() < end {
        if let Some(t) = node.twin("default/late-4") {
            let (a, b) = (reported(&t, "a"), reported(&t, "b"));
            assert!(
                a.as_deref() != Some("2222") && b.as_deref() != Some("1111"),
                "a value attached to the wrong property: a={a:?} b={b:?} after {} late answers",
                late.load(Ordering::Relaxed)
            );
            checks += 1;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let late = late.load(Ordering::Relaxed);
    println!("rtu late answers: {late} in {seconds} s, {checks} twin checks, none swapped");
    assert!(late >= 2, "the device answered late {late} times");
    drop(pty);
    let _ = device.join();
}
