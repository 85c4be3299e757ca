//! Figures of the MQTT `$hw` path (printed; see docs/benchmarks.md): an app sends QoS 1
//! `$hw/events/device/default/dev-N/twin/update` (`{"twin":{"pK":{"actual":{"value":"..."}}}}`)
//! to 1000 devices x 10 INT properties and waits for each `twin/update/result`, with 1 and with
//! 64 requests outstanding, through the release edgecore on its embedded broker and on Mosquitto.
//! The generator's ceiling is measured the same way against an echo responder (a client that
//! answers every update on its result topic at once), so that the generator is shown not to be
//! the limit. Prints the p50 and p99 round trip and the acknowledged updates per second, and
//! edgecore's resident memory after the runs.
//!
//! `cargo run --release -p hardware-tests --bin mqtt-bench [-- --seconds 5]`

use clap::Parser;
use rumqttc::{AsyncClient, Event, MqttOptions, NetworkOptions, Packet, QoS};
use sim::{Proc, free_port, percentile};
use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "mqtt-bench", about = "Figures of the MQTT $hw path")]
struct Args {
    /// Seconds measured per run (after one second of warm-up).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Only the runs on the embedded broker (no Mosquitto, no generator ceiling).
    #[arg(long)]
    embedded_only: bool,
    /// Only the twin/get latency during a burst, on the embedded broker.
    #[arg(long)]
    burst_only: bool,
}

const DEVICES: usize = 1000;
const PROPS: usize = 10;

fn manifests() -> String {
    let props: String = (0..PROPS)
        .map(|p| format!("    - {{name: p{p}, type: INT, accessMode: ReadWrite}}\n"))
        .collect();
    let mut out = format!(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {{name: m, namespace: default}}\nspec:\n  protocol: bench\n  properties:\n{props}"
    );
    let visitors: String = (0..PROPS)
        .map(|p| format!("    - {{name: p{p}, visitors: {{protocolName: bench, configData: {{offset: {p}}}}}}}\n"))
        .collect();
    for d in 0..DEVICES {
        out.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: dev-{d}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: bench}}\n  properties:\n{visitors}"
        ));
    }
    out
}

fn options(id: &str, port: u16) -> (MqttOptions, NetworkOptions) {
    let mut o = MqttOptions::new(id, "127.0.0.1", port);
    o.set_keep_alive(Duration::from_secs(30))
        .set_inflight(1000)
        .set_max_packet_size(1 << 20, 1 << 20);
    let mut n = NetworkOptions::new();
    n.set_tcp_nodelay(true);
    (o, n)
}

fn event_id(payload: &[u8]) -> Option<u64> {
    let key = b"\"event_id\":\"";
    let at = payload.windows(key.len()).position(|w| w == key)? + key.len();
    let end = payload[at..].iter().position(|b| *b == b'"')? + at;
    std::str::from_utf8(&payload[at..end]).ok()?.parse().ok()
}

/// Answers every twin/update on its result topic at once: the generator's ceiling.
async fn echo(port: u16) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let (o, n) = options("echo-responder", port);
    let (client, mut events) = AsyncClient::new(o, 4096);
    events.set_network_options(n);
    client
        .subscribe("$hw/events/device/+/+/twin/update", QoS::AtLeastOnce)
        .await
        .map_err(anyhow::Error::from)?;
    Ok(tokio::spawn(async move {
        while let Ok(ev) = events.poll().await {
            if let Event::Incoming(Packet::Publish(p)) = ev {
                let topic = format!("{}/result", p.topic);
                let _ = client
                    .publish(topic, QoS::AtLeastOnce, false, p.payload.to_vec())
                    .await;
            }
        }
    }))
}

struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    per_second: f64,
    /// CPU time of the process under test (edgecore, or Mosquitto) per acknowledged update, µs.
    cpu_us: Option<f64>,
    /// CPU time of this generator per acknowledged update, µs.
    generator_cpu_us: Option<f64>,
}

/// User plus system CPU time of process `pid` ("self" for this one), in seconds.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Sends updates with `outstanding` in flight for `seconds` after one second of warm-up.
/// `pid` is the process whose CPU time per update is shown (edgecore, or the broker).
async fn run(
    port: u16,
    outstanding: usize,
    seconds: f64,
    pid: Option<u32>,
) -> anyhow::Result<Figures> {
    let (o, n) = options(&format!("bench-{outstanding}-{}", free_port()), port);
    let (client, mut events) = AsyncClient::new(o, 4096);
    events.set_network_options(n);
    client
        .subscribe("$hw/events/device/+/+/twin/update/result", QoS::AtLeastOnce)
        .await
        .map_err(anyhow::Error::from)?;
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let permits = Arc::new(tokio::sync::Semaphore::new(0));
    let samples: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let (s2, p2, m2) = (sent.clone(), permits.clone(), samples.clone());
    let receiver = tokio::spawn(async move {
        let mut subscribed = false;
        while let Ok(ev) = events.poll().await {
            match ev {
                Event::Incoming(Packet::SubAck(_)) if !subscribed => {
                    subscribed = true;
                    p2.add_permits(outstanding);
                }
                Event::Incoming(Packet::Publish(p)) => {
                    let Some(id) = event_id(&p.payload) else {
                        continue;
                    };
                    let start = s2.lock().ok().and_then(|mut s| s.remove(&id));
                    if let Some(start) = start {
                        let now = Instant::now();
                        if let Ok(mut m) = m2.lock() {
                            m.push((now, (now - start).as_secs_f64() * 1000.0));
                        }
                        p2.add_permits(1);
                    }
                }
                _ => {}
            }
        }
    });
    let begin = Instant::now();
    let measure_from = begin + Duration::from_secs(1);
    let end = measure_from + Duration::from_secs_f64(seconds);
    let mut i: u64 = 0;
    let mut cpu_from = None;
    while Instant::now() < end {
        if cpu_from.is_none() && Instant::now() >= measure_from {
            cpu_from = Some((
                pid.and_then(|p| cpu_seconds(&p.to_string())),
                cpu_seconds("self"),
            ));
        }
        let Ok(permit) = tokio::time::timeout(Duration::from_secs(10), permits.acquire()).await
        else {
            return Err(anyhow::anyhow!(
                "no result within 10 s ({outstanding} outstanding)"
            ));
        };
        permit.map_err(anyhow::Error::from)?.forget();
        i += 1;
        let d = (i as usize) % DEVICES;
        let p = (i as usize / DEVICES) % PROPS;
        let topic = format!("$hw/events/device/default/dev-{d}/twin/update");
        let body = format!(
            "{{\"event_id\":\"{i}\",\"timestamp\":0,\"twin\":{{\"p{p}\":{{\"actual\":{{\"value\":\"{i}\"}}}}}}}}"
        );
        if let Ok(mut s) = sent.lock() {
            s.insert(i, Instant::now());
        }
        client
            .publish(topic, QoS::AtLeastOnce, false, body)
            .await
            .map_err(anyhow::Error::from)?;
    }
    let cpu_to = (
        pid.and_then(|p| cpu_seconds(&p.to_string())),
        cpu_seconds("self"),
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    receiver.abort();
    let _ = client.disconnect().await;
    let mut lat: Vec<f64> = samples
        .lock()
        .map(|m| {
            m.iter()
                .filter(|(t, _)| *t >= measure_from && *t <= end)
                .map(|(_, l)| *l)
                .collect()
        })
        .unwrap_or_default();
    let count = lat.len();
    lat.sort_by(f64::total_cmp);
    let per_update =
        |from: Option<f64>, to: Option<f64>| Some((to? - from?) * 1e6 / (count.max(1) as f64));
    let (from, gen_from) = cpu_from.unwrap_or((None, None));
    Ok(Figures {
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        per_second: count as f64 / seconds,
        cpu_us: per_update(from, cpu_to.0),
        generator_cpu_us: per_update(gen_from, cpu_to.1),
    })
}

/// `twin/get` round trips, one every 20 ms, while another client publishes `burst` QoS 1
/// updates back to back; returns (p50, p99, max) in ms of the gets during and 2 s after it.
async fn get_during_burst(port: u16, burst: usize) -> anyhow::Result<(f64, f64, f64)> {
    let (o, n) = options("bench-getter", port);
    let (getter, mut get_events) = AsyncClient::new(o, 1024);
    get_events.set_network_options(n);
    getter
        .subscribe(
            "$hw/events/device/default/dev-1/twin/get/result",
            QoS::AtLeastOnce,
        )
        .await
        .map_err(anyhow::Error::from)?;
    let (o, n) = options("bench-flood", port);
    let (flood, mut flood_events) = AsyncClient::new(o, 16_384);
    flood_events.set_network_options(n);
    let flood_loop = tokio::spawn(async move { while flood_events.poll().await.is_ok() {} });
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let get_loop = tokio::spawn(async move {
        while let Ok(ev) = get_events.poll().await {
            if let Event::Incoming(Packet::Publish(p)) = ev
                && let Some(id) = event_id(&p.payload)
            {
                let _ = answers_tx.send((id, Instant::now()));
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let flooding = tokio::spawn(async move {
        for i in 0..burst {
            let body = format!(
                "{{\"event_id\":\"f{i}\",\"twin\":{{\"p1\":{{\"actual\":{{\"value\":\"{i}\"}}}}}}}}"
            );
            if flood
                .publish(
                    "$hw/events/device/default/dev-1/twin/update",
                    QoS::AtLeastOnce,
                    false,
                    body,
                )
                .await
                .is_err()
            {
                break;
            }
        }
        flood
    });
    let mut sent: HashMap<u64, Instant> = HashMap::new();
    let mut lat = Vec::new();
    let mut i = 0u64;
    let mut done_at: Option<Instant> = None;
    loop {
        i += 1;
        sent.insert(i, Instant::now());
        getter
            .publish(
                "$hw/events/device/default/dev-1/twin/get",
                QoS::AtLeastOnce,
                false,
                format!("{{\"event_id\":\"{i}\"}}"),
            )
            .await
            .map_err(anyhow::Error::from)?;
        tokio::time::sleep(Duration::from_millis(20)).await;
        while let Ok((id, at)) = answers.try_recv() {
            if let Some(t) = sent.remove(&id) {
                lat.push((at - t).as_secs_f64() * 1000.0);
            }
        }
        if done_at.is_none() && flooding.is_finished() {
            done_at = Some(Instant::now());
        }
        if done_at.is_some_and(|d| d.elapsed() > Duration::from_secs(2)) {
            break;
        }
        if i > 3000 {
            return Err(anyhow::anyhow!("the burst was not sent within 60 s"));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    while let Ok((id, at)) = answers.try_recv() {
        if let Some(t) = sent.remove(&id) {
            lat.push((at - t).as_secs_f64() * 1000.0);
        }
    }
    let unanswered = sent.len();
    get_loop.abort();
    flood_loop.abort();
    if unanswered > 0 {
        return Err(anyhow::anyhow!(
            "{unanswered} twin/get requests unanswered during the burst"
        ));
    }
    lat.sort_by(f64::total_cmp);
    let max = lat.last().copied().unwrap_or_default();
    Ok((percentile(&lat, 50.0), percentile(&lat, 99.0), max))
}

/// edgecore's RssAnon (MB) after `seconds` of a publisher sending 64 KiB QoS 0 messages as fast
/// as it can to 100 subscribers that never read (keep-alive 0, so they stay connected with
/// full queues), and the messages it published.
async fn stalled_subscribers(port: u16, pid: u32, seconds: f64) -> anyhow::Result<(f64, u64)> {
    let mut stalled = Vec::new();
    for i in 0..100 {
        let mut s =
            std::net::TcpStream::connect(("127.0.0.1", port)).map_err(anyhow::Error::from)?;
        use std::io::{Read, Write};
        let id = format!("stalled-{i:03}");
        let mut connect = b"\x00\x04MQTT\x04\x02\x00\x00".to_vec();
        connect.extend_from_slice(&(id.len() as u16).to_be_bytes());
        connect.extend_from_slice(id.as_bytes());
        let mut packet = vec![0x10, connect.len() as u8];
        packet.extend_from_slice(&connect);
        s.write_all(&packet).map_err(anyhow::Error::from)?;
        let mut ack = [0u8; 4];
        s.read_exact(&mut ack).map_err(anyhow::Error::from)?;
        let topic = b"rel/#";
        let mut sub = vec![0x00, 0x01, 0x00, topic.len() as u8];
        sub.extend_from_slice(topic);
        sub.push(0);
        let mut packet = vec![0x82, sub.len() as u8];
        packet.extend_from_slice(&sub);
        s.write_all(&packet).map_err(anyhow::Error::from)?;
        let mut suback = [0u8; 5];
        s.read_exact(&mut suback).map_err(anyhow::Error::from)?;
        stalled.push(s);
    }
    let (o, n) = options("bench-publisher", port);
    let (publisher, mut events) = AsyncClient::new(o, 1024);
    events.set_network_options(n);
    let driver = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    let payload = vec![b'x'; 64 << 10];
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let mut sent = 0u64;
    while Instant::now() < end {
        publisher
            .publish("rel/x", QoS::AtMostOnce, false, payload.clone())
            .await
            .map_err(anyhow::Error::from)?;
        sent += 1;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_mb(pid);
    driver.abort();
    drop(stalled);
    Ok((rss, sent))
}

fn mosquitto(dir: &Path, port: u16) -> anyhow::Result<std::process::Child> {
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        // Mosquitto leaves Nagle's algorithm on unless told (set_tcp_nodelay, default false):
        // every exchange would then wait for a delayed ACK, whatever the clients do.
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay true\n"),
    )
    .map_err(anyhow::Error::from)?;
    let child = Command::new("mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("mosquitto: {e} (apt-get install mosquitto)"))?;
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(child);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(anyhow::anyhow!("mosquitto did not start"))
}

fn edgecore(bins: &Path, dir: &Path, mode: &str, port: u16) -> anyhow::Result<(Proc, String)> {
    let http = free_port();
    std::fs::create_dir_all(dir.join("manifests")).map_err(anyhow::Error::from)?;
    std::fs::write(dir.join("manifests/devices.yaml"), manifests()).map_err(anyhow::Error::from)?;
    std::fs::write(
        dir.join("edgecore.yaml"),
        format!("nodeName: bench\ndataDir: data\nmanifests: {{dir: manifests}}\nmqtt: {{mode: {mode}, address: \"127.0.0.1:{port}\", clientId: edgecore-bench}}\nhttp: {{address: \"127.0.0.1:{http}\"}}\ndmi: {{socket: dmi.sock}}\n"),
    )
    .map_err(anyhow::Error::from)?;
    let proc = Proc::spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        dir,
        "edgecore.log",
    );
    let url = format!("http://127.0.0.1:{http}");
    let agent = sim::agent();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = agent
            .get(format!("{url}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        if metrics.contains(&format!("edgecore_devices {DEVICES}"))
            && metrics.contains("edgecore_mqtt_connected 1")
        {
            return Ok((proc, url));
        }
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!("edgecore not ready: {metrics}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rss_mb(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("RssAnon:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0)
        .unwrap_or(0.0)
}

fn print_row(what: &str, outstanding: usize, f: &Figures) {
    let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    println!(
        "| {what} | {outstanding} | {:.2} | {:.2} | {:.0} | {} | {} |",
        f.p50_ms,
        f.p99_ms,
        f.per_second,
        us(f.cpu_us),
        us(f.generator_cpu_us)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = async {
        eprintln!("building the release edgecore ...");
        let bins = sim::built_binaries(true)?;
        let dir = tempfile::tempdir().map_err(anyhow::Error::from)?;
        println!("| path | outstanding | p50 ms | p99 ms | acknowledged updates/s | CPU µs/update (broker or edgecore) | generator CPU µs/update |");
        println!("|---|---|---|---|---|---|---|");

        let mut rss_external = 0.0;
        if !args.embedded_only && !args.burst_only {
        // The generator's ceiling: an echo responder on Mosquitto.
        let port = free_port();
        let mut broker = mosquitto(dir.path(), port)?;
        let responder = echo(port).await?;
        for n in [1, 64] {
            print_row("echo responder on Mosquitto (generator ceiling)", n, &run(port, n, args.seconds, Some(broker.id())).await?);
        }
        responder.abort();

        // edgecore on Mosquitto.
        let (core, _) = edgecore(&bins, &dir.path().join("external"), "external", port)?;
        for n in [1, 64] {
            print_row("edgecore + Mosquitto", n, &run(port, n, args.seconds, Some(core.child.id())).await?);
        }
        rss_external = rss_mb(core.child.id());
        drop(core);
        let _ = broker.kill();
        let _ = broker.wait();

        }
        // edgecore on its embedded broker.
        let port = free_port();
        let (core, _) = edgecore(&bins, &dir.path().join("embedded"), "embedded", port)?;
        for n in if args.burst_only { vec![] } else { vec![1, 64] } {
            print_row("edgecore, embedded broker", n, &run(port, n, args.seconds, Some(core.child.id())).await?);
        }
        let rss_embedded = rss_mb(core.child.id());
        let (p50, p99, max) = get_during_burst(port, 10_000).await?;
        println!(
            "\ntwin/get every 20 ms during and after a burst of 10,000 QoS 1 updates (embedded broker): p50 {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms"
        );
        let (rss_stalled, sent) = stalled_subscribers(port, core.child.id(), args.seconds).await?;
        println!(
            "edgecore RssAnon with 100 subscribers that never read and a publisher sending {sent} x 64 KiB QoS 0 in {}s: {rss_stalled:.1} MB (each subscriber's queue is bounded by mqtt.maxQueuedBytes, 16 MiB, of payloads shared between subscribers)",
            args.seconds
        );
        drop(core);
        println!("\nedgecore RssAnon after the runs: {rss_embedded:.1} MB with its embedded broker, {rss_external:.1} MB on Mosquitto");
        Ok::<(), anyhow::Error>(())
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mqtt-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
