//! Figures of the gateway's page (printed; see docs/benchmarks.md), in Debian's chromium through
//! chromedriver against the real edgecore: N devices of 3 properties each, their values updated
//! by an MQTT app (`twin/update`, round robin at R updates per second). Measures the page's load
//! until the device list shows all N (median of 3, from navigation start), the time to the first
//! value on a device's page, the bytes per twin update on the page's event stream, and
//! edgecore's resident memory with the page open in B browsers.
//!
//! `cargo run --release -p hardware-tests --bin ui-bench [-- --devices 1000 --rate 200 --browsers 10]`

use clap::Parser;
use sim::Node;
use sim::browser::{browser, chromedriver, wait_text};
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "ui-bench", about = "The gateway page's figures")]
struct Args {
    #[arg(long, default_value_t = 1000)]
    devices: usize,
    /// Twin updates per second, all devices together.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    #[arg(long, default_value_t = 10)]
    browsers: usize,
}

fn manifest(n: usize) -> String {
    let mut out = String::from(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: meter, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n    - {name: power, type: FLOAT, unit: kW}\n    - {name: energy, type: FLOAT, unit: kWh}\n    - {name: status, type: STRING}\n",
    );
    let visitor = |o: u32| {
        format!("{{protocolName: modbus, configData: {{register: HoldingRegister, offset: {o}}}}}")
    };
    for d in 0..n {
        out.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: d{d:04}, namespace: default}}\nspec:\n  deviceModelRef: {{name: meter}}\n  nodeName: test-node\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 1}}}}\n  properties:\n    - {{name: power, visitors: {}}}\n    - {{name: energy, visitors: {}}}\n    - {{name: status, visitors: {}}}\n",
            visitor(0),
            visitor(1),
            visitor(2)
        ));
    }
    out
}

/// An MQTT app updating `power` of every device in turn at `rate` per second until `stop`.
fn updater(port: u16, n: usize, rate: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) {
    let mut opts = rumqttc::MqttOptions::new("ui-bench-app", "127.0.0.1", port);
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut conn) = rumqttc::Client::new(opts, 1024);
    std::thread::spawn(move || for _ in conn.iter() {});
    let started = Instant::now();
    let mut k: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while k < due {
            let d = (k as usize) % n;
            let payload = format!(
                r#"{{"event_id":"","timestamp":0,"twin":{{"power":{{"actual":{{"value":"{}"}},"metadata":{{"type":"float"}}}}}}}}"#,
                // A new value every round, or the twin has nothing to say.
                (k / n as u64) as f64 + d as f64 / 10_000.0
            );
            if client
                .publish(
                    format!("$hw/events/device/default/d{d:04}/twin/update"),
                    rumqttc::QoS::AtMostOnce,
                    false,
                    payload,
                )
                .is_ok()
            {
                sent.fetch_add(1, Ordering::Relaxed);
            }
            k += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Reads the page's event stream (`query`: what it follows) for `secs`: (bytes, device events).
fn stream_bytes(http: &str, query: &str, secs: u64) -> (usize, usize) {
    let addr = http.trim_start_matches("http://");
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return (0, 0);
    };
    let _ = s.write_all(
        format!("GET /api/v1/events{query} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n\r\n")
            .as_bytes(),
    );
    let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut body = Vec::new();
    let mut buf = [0u8; 65536];
    while Instant::now() < deadline {
        if let Ok(n) = s.read(&mut buf) {
            body.extend_from_slice(&buf[..n]);
        }
    }
    let text = String::from_utf8_lossy(&body);
    let header_end = text.find("\r\n\r\n").map_or(0, |i| i + 4);
    let events = text
        .lines()
        .filter(|l| l.strip_prefix("event:").map(str::trim) == Some("device"))
        .count();
    (body.len() - header_end, events)
}

/// Whether the list's count says all `n` devices are there (on one page, or in pages of 50).
fn whole(count: &str, n: usize) -> bool {
    count.starts_with(&format!("{n} of {n} "))
        || count.ends_with(&format!(" of {n} devices ({n} in all)"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(driver) = chromedriver() else {
        return ExitCode::FAILURE;
    };
    let bins = match sim::built_binaries(!cfg!(debug_assertions)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("ui-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let node = Node::start_with(&bins, &manifest(args.devices));
    let pid = node.edgecore.child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    while node.get("/api/v1/devices").1.as_array().map_or(0, Vec::len) < args.devices {
        if Instant::now() > deadline {
            eprintln!(
                "ui-bench: edgecore did not take the {} devices",
                args.devices
            );
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    {
        let (stop, sent, port, n, rate) = (
            stop.clone(),
            sent.clone(),
            node.mqtt,
            args.devices,
            args.rate,
        );
        std::thread::spawn(move || updater(port, n, rate, stop, sent));
    }
    std::thread::sleep(Duration::from_secs(3));
    let rss_idle = sim::vm_rss_kb(&pid);
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ui-bench: no runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let n = args.devices;
    let ui = format!("{}/ui", node.http);
    let (loads, firsts) = rt.block_on(async {
        let c = browser(&driver).await;
        let mut loads = Vec::new();
        let mut firsts = Vec::new();
        let now = r#"return performance.now()"#;
        for _ in 0..3 {
            let _ = c.goto("about:blank").await;
            let _ = c.goto(&ui).await;
            wait_text(&c, "#device-count", 60, "the whole list", |t| whole(t, n)).await;
            if let Ok(v) = c.execute(now, vec![]).await {
                loads.push(v.as_f64().unwrap_or(0.0));
            }
            let _ = c.goto("about:blank").await;
            let _ = c.goto(&format!("{ui}#/device/default/d{:04}", n / 2)).await;
            wait_text(
                &c,
                r#"tr[data-prop="power"] [data-value]"#,
                60,
                "a value",
                |t| !t.is_empty(),
            )
            .await;
            if let Ok(v) = c.execute(now, vec![]).await {
                firsts.push(v.as_f64().unwrap_or(0.0));
            }
        }
        let _ = c.close().await;
        (loads, firsts)
    });
    let before = sent.load(Ordering::Relaxed);
    let (bytes, events) = stream_bytes(&node.http, "", 5);
    let updates = sent.load(Ordering::Relaxed) - before;
    // What an open page receives a minute: following every device (as it did), a page of the
    // list (the first 50, as the page follows them), one device's page.
    let list: Vec<String> = (0..n.min(50)).map(|d| format!("default/d{d:04}")).collect();
    let per_minute = |query: String| stream_bytes(&node.http, &query, 20).0 * 3;
    let all_minute = per_minute(String::new());
    let list_minute = per_minute(format!("?devices={}", list.join(",")));
    let one_minute = per_minute(format!("?devices=default/d{:04}", n / 2));
    let rss_open = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..args.browsers {
            let c = browser(&driver).await;
            let _ = c.goto(&ui).await;
            wait_text(&c, "#device-count", 120, "the whole list", |t| whole(t, n)).await;
            clients.push(c);
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        let rss = sim::vm_rss_kb(&pid);
        for c in clients {
            let _ = c.close().await;
        }
        rss
    });
    stop.store(true, Ordering::Relaxed);
    println!("| figure | value |");
    println!("|---|---|");
    println!(
        "| page load to the list of {n} devices (median of 3) | {:.0} ms |",
        median(loads)
    );
    println!(
        "| time to the first value on a device's page (median of 3) | {:.0} ms |",
        median(firsts)
    );
    println!(
        "| event stream: {events} events for {updates} updates in 5 s | {} bytes per event |",
        bytes.checked_div(events).unwrap_or(0)
    );
    println!(
        "| bytes a minute an open page receives at {} updates/s: every device's values / a list page of 50 / one device's page | {} / {} / {} KB |",
        args.rate,
        all_minute / 1024,
        list_minute / 1024,
        one_minute / 1024
    );
    println!(
        "| edgecore RSS, {} updates/s: no page / the page open in {} browsers | {} / {} MB |",
        args.rate,
        args.browsers,
        rss_idle / 1024,
        rss_open / 1024
    );
    ExitCode::SUCCESS
}
