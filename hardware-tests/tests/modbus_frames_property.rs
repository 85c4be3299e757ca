//! Property test of the Modbus client against a device that misbehaves as real ones do: for
//! each request, drawn from a seeded generator, the device answers correctly, late (after the
//! client's timeout), twice, with half a frame, with garbage, as another slave (RTU) or with
//! another transaction id (TCP), with an exception, or not at all. Every property reads one
//! holding register of the same shape (function 3, one register) at addresses far apart, each
//! holding a value that names it: whatever the sequence, a value the client returns for a
//! property must be that property's, never another's. An error is fine; a wrong value is not.
//!
//! RTU runs over a socat pty pair; TCP over loopback. `FRAMES_CASES` sets the reads per
//! transport (default 100) and `FRAMES_SEED` the seed (default: time-based, printed).
//!
//! What RTU can promise, and so what the device does: nothing in an RTU frame says which request
//! it answers, so a frame of the right shape that arrives while a request waits for its answer
//! is that answer. A late answer therefore comes within the client's drain window (the line is
//! drained until silent for a timeout after one), and a repeated answer before the next request
//! goes out. The device places these faults in the order of the exchange, not at moments on a
//! clock, so that the test means the same on a busy machine: a repeated answer is written with
//! the answer (one write), and a late answer is written once the client's timeout has passed
//! and only if its next request has not reached the device first (the device's thread having
//! been held up: that answer is then not sent at all, as no client could tell it from the next
//! one's). TCP's transaction ids tell every answer apart, so its device may answer at any time.

use mapper_modbus::device::{Connection, Device, ModelHints, Point};
use serde_json::{Value, json};
use sim::PtyPair;
use sim::rng::Rng;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

const TIMEOUT_MS: u64 = 150;
/// Properties `p0..`: holding register `100 * i`, value `1000 + i`.
const POINTS: u16 = 6;

fn value_of(address: u16) -> u16 {
    1000 + address / 100
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Ok,
    Late,
    Duplicate,
    Truncated,
    Garbage,
    OtherSlave,
    OtherTransaction,
    Exception,
    Silent,
}

fn fault(rng: &mut Rng, tcp: bool) -> Fault {
    match rng.below(16) {
        0 => Fault::Late,
        1 => Fault::Duplicate,
        2 => Fault::Truncated,
        3 => Fault::Garbage,
        4 if tcp => Fault::OtherTransaction,
        4 => Fault::OtherSlave,
        5 => Fault::Exception,
        6 => Fault::Silent,
        _ => Fault::Ok,
    }
}

fn crc(data: &[u8]) -> Vec<u8> {
    mapper_serial::checksum::Checksum::Crc16Modbus.compute(data)
}

/// The PDU answering "read holding registers at `address`, `count`": or an exception.
fn answer_pdu(address: u16, count: u16, exception: bool) -> Vec<u8> {
    if exception {
        return vec![0x83, 0x04];
    }
    let mut pdu = vec![0x03, (count * 2) as u8];
    for a in address..address + count {
        pdu.extend_from_slice(&value_of(a).to_be_bytes());
    }
    pdu
}

/// Serves the misbehaving device on `stream` until it closes or `stop`: `framing` cuts a
/// request out of the bytes read and wraps an answer PDU.
fn serve(
    mut reader: impl Read + Send + 'static,
    writer: Arc<Mutex<Box<dyn Write + Send>>>,
    tcp: bool,
    seed: u64,
    stop: Arc<AtomicBool>,
) {
    let mut rng = Rng::new(seed);
    let mut buf = Vec::new();
    // What the client writes comes through a channel, so that waiting for a late answer's
    // moment can also watch for the client's next request.
    let (tx, incoming) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 512];
        loop {
            match reader.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.send(chunk[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let send = |bytes: Vec<u8>| {
        if let Ok(mut w) = writer.lock() {
            let _ = w.write_all(&bytes);
            let _ = w.flush();
        }
    };
    while !stop.load(Ordering::Relaxed) {
        match incoming.recv_timeout(Duration::from_millis(100)) {
            Ok(bytes) => buf.extend_from_slice(&bytes),
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        loop {
            // A request: RTU slave, 3, address, count, CRC (8 bytes); TCP MBAP (7) + 5.
            let len = if tcp { 12 } else { 8 };
            if buf.len() < len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..len).collect();
            let (pdu, header) = if tcp {
                (frame[7..].to_vec(), frame[..7].to_vec())
            } else {
                if crc(&frame[..6]) != frame[6..8] {
                    // Not a request: the client is out of step; drop what we have.
                    buf.clear();
                    break;
                }
                (frame[1..6].to_vec(), vec![frame[0]])
            };
            if pdu[0] != 3 {
                continue;
            }
            let address = u16::from_be_bytes([pdu[1], pdu[2]]);
            let count = u16::from_be_bytes([pdu[3], pdu[4]]);
            let f = fault(&mut rng, tcp);
            let wrap = |pdu: Vec<u8>, other: bool| -> Vec<u8> {
                if tcp {
                    let mut h = header.clone();
                    if other {
                        h[1] = h[1].wrapping_add(7);
                    }
                    let l = (pdu.len() + 1) as u16;
                    h[4..6].copy_from_slice(&l.to_be_bytes());
                    let mut out = h;
                    out.extend_from_slice(&pdu);
                    out
                } else {
                    let slave = if other { header[0] ^ 0x01 } else { header[0] };
                    let mut out = vec![slave];
                    out.extend_from_slice(&pdu);
                    let c = crc(&out);
                    out.extend_from_slice(&c);
                    out
                }
            };
            let good = wrap(answer_pdu(address, count, false), false);
            match f {
                Fault::Ok => send(good),
                Fault::Late => {
                    // After the client's timeout, unless its next request comes first.
                    match incoming.recv_timeout(Duration::from_millis(TIMEOUT_MS + 30)) {
                        Err(mpsc::RecvTimeoutError::Timeout) => send(good),
                        Ok(next) => buf.extend_from_slice(&next),
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                Fault::Duplicate => {
                    // The answer twice (a device that repeats itself, an echo), in one write: the
                    // repetition is on the line before the next request can go out.
                    let mut twice = good.clone();
                    twice.extend_from_slice(&good);
                    send(twice);
                }
                Fault::Truncated => send(good[..good.len() / 2].to_vec()),
                Fault::Garbage => {
                    let junk: Vec<u8> = (0..1 + rng.below(12))
                        .map(|_| rng.next_u64() as u8)
                        .collect();
                    send(junk);
                }
                Fault::OtherSlave | Fault::OtherTransaction => {
                    // Another device's (or an old request's) answer of the same shape, with
                    // another value, then the right one.
                    let mut pdu = answer_pdu(address, count, false);
                    pdu[2] ^= 0x55;
                    send(wrap(pdu, true));
                    send(good);
                }
                Fault::Exception => send(wrap(answer_pdu(address, count, true), false)),
                Fault::Silent => {}
            }
        }
    }
}

fn points() -> Vec<Point> {
    (0..POINTS)
        .map(|i| {
            let Value::Object(v) = json!({
                "register": "HoldingRegister", "offset": i * 100, "limit": 1, "dataType": "uint16"
            }) else {
                unreachable!()
            };
            Point::from_config(&format!("p{i}"), &v, &ModelHints::default()).expect("point")
        })
        .collect()
}

/// Reads random subsets of the properties `cases` times; panics on any value attached to the
/// wrong property. Returns (values read, errors).
fn exercise(config: Value, cases: u64, seed: u64) -> (u64, u64) {
    let Value::Object(c) = config else {
        unreachable!()
    };
    let connection = Connection::from_config(&c).expect("connection");
    let mut device = Device::new(connection, points());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut rng = Rng::new(seed.rotate_left(17));
    let (mut ok, mut errors) = (0, 0);
    rt.block_on(async {
        for case in 0..cases {
            let due: Vec<usize> = (0..POINTS as usize).filter(|_| rng.below(2) == 0).collect();
            for (i, r) in device.read(&due).await {
                match r {
                    Ok(v) => {
                        let want = value_of(i as u16 * 100).to_string();
                        assert_eq!(
                            &*v,
                            want.as_str(),
                            "case {case} (seed {seed}): property p{i} got another property's value"
                        );
                        ok += 1;
                    }
                    // A link error has closed the connection; the next read makes it again.
                    Err(_) => errors += 1,
                }
            }
        }
    });
    (ok, errors)
}

fn settings() -> (u64, u64) {
    let cases = std::env::var("FRAMES_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let seed = std::env::var("FRAMES_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    (cases, seed)
}

#[test]
fn rtu_no_sequence_of_bad_frames_attaches_a_value_to_the_wrong_property() {
    let (cases, seed) = settings();
    println!("RTU: {cases} reads, FRAMES_SEED={seed}");
    let dir = tempfile::tempdir().expect("tempdir");
    let pair = PtyPair::start(dir.path(), "line");
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&pair.b)
        .expect("the device's end");
    let writer: Arc<Mutex<Box<dyn Write + Send>>> =
        Arc::new(Mutex::new(Box::new(port.try_clone().expect("clone"))));
    let stop = Arc::new(AtomicBool::new(false));
    let device = {
        let stop = stop.clone();
        std::thread::spawn(move || serve(port, writer, false, seed, stop))
    };
    let (ok, errors) = exercise(
        json!({"serialPort": pair.a.display().to_string(), "baudRate": 9600, "slaveID": 4, "timeout": TIMEOUT_MS}),
        cases,
        seed,
    );
    stop.store(true, Ordering::Relaxed);
    drop(pair);
    let _ = device.join();
    println!("RTU: {ok} values, all right; {errors} errors");
    assert!(ok > cases / 2, "too few values read: {ok}");
}

#[test]
fn tcp_no_sequence_of_bad_frames_attaches_a_value_to_the_wrong_property() {
    let (cases, seed) = settings();
    println!("TCP: {cases} reads, FRAMES_SEED={seed}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("addr").port();
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                n += 1;
                let writer: Arc<Mutex<Box<dyn Write + Send>>> =
                    Arc::new(Mutex::new(Box::new(stream.try_clone().expect("clone"))));
                let stop = stop.clone();
                let seed = seed.wrapping_add(n);
                std::thread::spawn(move || serve(stream, writer, true, seed, stop));
            }
        });
    }
    let (ok, errors) = exercise(
        json!({"ip": "127.0.0.1", "port": port, "slaveID": 1, "timeout": TIMEOUT_MS}),
        cases,
        seed,
    );
    stop.store(true, Ordering::Relaxed);
    println!("TCP: {ok} values, all right; {errors} errors");
    assert!(ok > cases / 2, "too few values read: {ok}");
}
