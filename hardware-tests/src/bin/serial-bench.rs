//! `serial-bench`: the figures of the serial mapper, printed (docs/benchmarks.md).
//!
//! ```text
//! cargo run --release -p hardware-tests --bin serial-bench [-- --seconds 5]
//! ```
//!
//! A socat pty pair; on one end a responder thread of this process answers binary frames
//! (`AA 01` + CRC-16/MODBUS gets a 9-byte answer, `AA 02` gets none: a silent device); on the
//! other end the mapper's serial driver (`mapper_serial` through the SDK's `Driver`).
//!
//! 1. Frames per second: one device reading as fast as it can (request, answer, CRC checked,
//!    three fields decoded). A pty ignores the baud rate, so this is the mapper's own ceiling;
//!    the line's is printed beside it.
//! 2. A slow device on a shared port: the read latency of a device polled every 50 ms, alone
//!    and then with a silent device (timeout 200 ms) on the same port polled every 50 ms too.
//!    The answering device is delayed by at most the silent one's timeout.

use clap::Parser;
use mapper_sdk::{DeviceConfig, Driver, PropertyConfig, Protocol};
use mapper_serial::checksum::Checksum;
use mapper_serial::mapper::Serial;
use serde_json::{Value, json};
use sim::{PtyPair, object, percentile};
use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "serial-bench", about = "Figures of the serial mapper")]
struct Args {
    /// Seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

/// Answers `AA 01 crc` with `AA 01 00 7B 05 00 01 crc` on `path`; ignores anything else.
fn responder(path: &Path) -> std::io::Result<()> {
    let mut port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 64];
        let answer = Checksum::Crc16Modbus.append(vec![0xAA, 0x01, 0x00, 0x7B, 0x05, 0x00, 0x01]);
        while let Ok(n) = port.read(&mut chunk) {
            if n == 0 {
                return;
            }
            buf.extend_from_slice(&chunk[..n]);
            while buf.len() >= 4 {
                if buf[0] != 0xAA {
                    buf.remove(0);
                    continue;
                }
                let frame: Vec<u8> = buf.drain(..4).collect();
                if frame[1] == 0x01 && port.write_all(&answer).is_err() {
                    return;
                }
            }
        }
    });
    Ok(())
}

fn device(path: &str, request: &str, timeout_ms: u64) -> DeviceConfig {
    let field = |name: &str, extra: Value| {
        let mut v = object(json!({"request": request, "responseLength": 9}));
        v.extend(object(extra));
        PropertyConfig {
            name: name.into(),
            visitor: v,
            ..Default::default()
        }
    };
    DeviceConfig {
        namespace: "default".into(),
        name: request.replace(' ', ""),
        protocol: object(json!({
            "serialPort": path, "baudRate": 115200, "mode": "binary",
            "checksum": "crc16-modbus", "timeout": timeout_ms, "frameGap": 0
        })),
        properties: vec![
            field("a", json!({"offset": 2, "dataType": "int16", "scale": 0.1})),
            field(
                "b",
                json!({"offset": 4, "dataType": "uint16", "endianness": "little"}),
            ),
            field("c", json!({"offset": 6, "bit": 0})),
        ],
    }
}

/// Reads `cfg` every `period` for `seconds`; the latencies of the reads, in ms.
async fn poll(cfg: DeviceConfig, period: Duration, seconds: f64) -> Result<Vec<f64>, String> {
    let mut d = Serial.driver(&cfg).map_err(|e| e.to_string())?;
    d.connect().await.map_err(|e| e.to_string())?;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut lat = Vec::new();
    while Instant::now() < end {
        tick.tick().await;
        let t = Instant::now();
        let out = d.read(&[0, 1, 2]).await;
        if out.iter().all(|(_, r)| r.is_ok()) {
            lat.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    lat.sort_by(f64::total_cmp);
    Ok(lat)
}

fn run(seconds: f64) -> Result<(), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let pty = PtyPair::start(dir.path(), "line");
    responder(&pty.a).map_err(|e| format!("responder: {e}"))?;
    let path = pty.b.display().to_string();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;

    // 1. Frames per second.
    let (frames, secs) = rt.block_on(async {
        let mut d = Serial
            .driver(&device(&path, "AA 01", 1000))
            .map_err(|e| e.to_string())?;
        d.connect().await.map_err(|e| e.to_string())?;
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(seconds);
        let mut n = 0u64;
        while Instant::now() < end {
            for (i, r) in d.read(&[0, 1, 2]).await {
                r.map_err(|e| format!("property {i}: {e}"))?;
            }
            n += 1;
        }
        Ok::<_, String>((n, start.elapsed().as_secs_f64()))
    })?;
    println!(
        "\n## Serial frames per second: a 4-byte request and a 9-byte answer with CRC-16, three fields, over a socat pty pair\n"
    );
    println!("| | exchanges/s |");
    println!("|---|---|");
    println!(
        "| mapper-serial over the pty | {:.0} |",
        frames as f64 / secs
    );
    for baud in [9600u32, 115_200] {
        // 13 bytes of 10 bits, plus 3.5 characters of silence after each frame.
        let per = (13.0 * 10.0 + 7.0 * 10.0) / f64::from(baud);
        println!("| the line's limit at {baud} baud 8N1 | {:.0} |", 1.0 / per);
    }

    // 2. A silent device on the same port.
    let period = Duration::from_millis(50);
    let alone = rt.block_on(poll(device(&path, "AA 01", 1000), period, seconds))?;
    let (shared, silent) = rt.block_on(async {
        let fast = poll(device(&path, "AA 01", 1000), period, seconds);
        let slow = async {
            let mut d = Serial
                .driver(&device(&path, "AA 02", 200))
                .map_err(|e| e.to_string())?;
            d.connect().await.map_err(|e| e.to_string())?;
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut timeouts = 0;
            while Instant::now() < end {
                if d.read(&[0]).await.iter().any(|(_, r)| r.is_err()) {
                    timeouts += 1;
                }
                tokio::time::sleep(period).await;
            }
            Ok::<_, String>(timeouts)
        };
        let (a, b) = tokio::join!(fast, slow);
        Ok::<_, String>((a?, b?))
    })?;
    println!(
        "\n## A device polled every 50 ms, alone and sharing its port with a silent device (timeout 200 ms, polled every 50 ms: {silent} timeouts in {seconds} s)\n"
    );
    println!("| read latency of the answering device | reads | p50 ms | p99 ms | max ms |");
    println!("|---|---|---|---|---|");
    for (what, v) in [("alone", &alone), ("with the silent device", &shared)] {
        println!(
            "| {what} | {} | {:.2} | {:.2} | {:.2} |",
            v.len(),
            percentile(v, 50.0),
            percentile(v, 99.0),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args.seconds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("serial-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
