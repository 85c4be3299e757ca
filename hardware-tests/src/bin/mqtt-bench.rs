//! (Over 800 lines, in one file: a bench, not a library; its scenarios drive one set of brokers,
//! clients and rows that no other bench uses. Its helpers go to `hardware_tests::bench` when
//! another bench needs them.)
//!
//! Figures of the MQTT `$hw` path (printed; see docs/benchmarks.md): an app sends QoS 1
//! `$hw/events/device/default/dev-N/twin/update` (`{"twin":{"pK":{"actual":{"value":"..."}}}}`)
//! to 1000 devices x 10 INT properties and waits for each `twin/update/result`, with 1 and with
//! 64 requests outstanding, through the release edgecore on its embedded broker and on Mosquitto
//! (with and without `set_tcp_nodelay`), and through an echo responder on each of those two
//! Mosquittos (a client that answers every update on its result topic at once: the client's own
//! ceiling on that broker; each row's p50 is also given against the echo's on the same broker).
//!
//! Each path is measured with the clients users write their apps with, in one run: rumqttc
//! (Rust), paho-mqtt (Python, `hardware-tests/sims/paho_twin_app.py`, in `.venv`; two processes
//! of 32 for 64 outstanding), and Mosquitto's own `mosquitto_pub -l` (a burst of updates to one
//! device, its results counted by `mosquitto_sub`). Each row gives the p50, p99 and largest
//! round trip, the acknowledged updates per second, and its ratio to the same client's figure
//! on Mosquitto (with `set_tcp_nodelay`) and on the echo responder; then edgecore's resident
//! memory after the runs.
//!
//! With `--subscriptions 1000,10000`, first the same with apps that subscribe once per device
//! (as KubeEdge apps typically do), holding that many subscriptions each.
//!
//! `cargo run --release -p hardware-tests --bin mqtt-bench [-- --seconds 5] [--subscriptions 1000,10000]`

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
    /// Also the apps that subscribe once per device (as KubeEdge apps typically do), holding
    /// these numbers of subscriptions in all (their devices' result topics, then others'), on
    /// the echo responder, edgecore + Mosquitto and the embedded broker: `--subscriptions
    /// 1000,10000,100000`.
    #[arg(long, value_delimiter = ',')]
    subscriptions: Vec<usize>,
    /// Only the per-device subscription runs.
    #[arg(long)]
    subscriptions_only: bool,
    /// The directory of another build's `edgecore` to measure (an older commit's, for a
    /// before/after); default: this workspace's release build.
    #[arg(long)]
    bins: Option<std::path::PathBuf>,
}

/// The result topics an app that subscribes per device holds: its devices' (`devices`), then
/// other devices' (named after `app`) up to `n` in all.
fn per_device_topics(app: &str, devices: std::ops::Range<usize>, n: usize) -> Vec<String> {
    let result = |d: &str| format!("$hw/events/device/default/{d}/twin/update/result");
    let mut topics: Vec<String> = devices.map(|d| result(&format!("dev-{d}"))).collect();
    let others = n.saturating_sub(topics.len());
    topics.extend((0..others).map(|k| result(&format!("other-{app}-{k}"))));
    topics
}

const DEVICES: usize = 1000;
const PROPS: usize = 10;

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
    // Subscribed before any request is sent: a request lost to the race would stall a run.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::SubAck(_)))) => break,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(anyhow::anyhow!("the echo responder got no SUBACK")),
        }
    }
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
    max_ms: f64,
    per_second: f64,
    /// CPU time of the process under test (edgecore, or Mosquitto) per acknowledged update, µs.
    cpu_us: Option<f64>,
}

/// User plus system CPU time of process `pid`, in seconds.
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
/// With `subscriptions` > 0 the app subscribes once per device, that many topics in all
/// (100 per SUBSCRIBE); else once, to a wildcard.
async fn run(
    port: u16,
    outstanding: usize,
    seconds: f64,
    pid: Option<u32>,
    subscriptions: usize,
) -> anyhow::Result<Figures> {
    let app = format!("bench-{outstanding}-{}", free_port());
    let (o, n) = options(&app, port);
    let (client, mut events) = AsyncClient::new(o, 4096);
    events.set_network_options(n);
    let batches: Vec<Vec<String>> = if subscriptions == 0 {
        vec![vec!["$hw/events/device/+/+/twin/update/result".to_string()]]
    } else {
        per_device_topics(&app, 0..DEVICES, subscriptions)
            .chunks(100)
            .map(<[String]>::to_vec)
            .collect()
    };
    let mut subacks = batches.len();
    let subscribing = {
        let client = client.clone();
        tokio::spawn(async move {
            for b in batches {
                let filters = b
                    .into_iter()
                    .map(|t| rumqttc::SubscribeFilter::new(t, QoS::AtLeastOnce));
                client.subscribe_many(filters).await?;
            }
            Ok::<(), rumqttc::ClientError>(())
        })
    };
    let sent: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let permits = Arc::new(tokio::sync::Semaphore::new(0));
    let samples: Arc<Mutex<Vec<(Instant, f64)>>> = Arc::default();
    let (s2, p2, m2) = (sent.clone(), permits.clone(), samples.clone());
    let receiver = tokio::spawn(async move {
        while let Ok(ev) = events.poll().await {
            match ev {
                Event::Incoming(Packet::SubAck(_)) if subacks > 0 => {
                    subacks -= 1;
                    if subacks == 0 {
                        p2.add_permits(outstanding);
                    }
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
    subscribing
        .await
        .map_err(anyhow::Error::from)?
        .map_err(anyhow::Error::from)?;
    // The subscriptions acknowledged first (the receiver gives the permits then).
    let Ok(first) = tokio::time::timeout(Duration::from_secs(60), permits.acquire()).await else {
        return Err(anyhow::anyhow!(
            "no SUBACK for every subscription within 60 s"
        ));
    };
    drop(first.map_err(anyhow::Error::from)?);
    let begin = Instant::now();
    let measure_from = begin + Duration::from_secs(1);
    let end = measure_from + Duration::from_secs_f64(seconds);
    let mut i: u64 = 0;
    let mut cpu_from = None;
    while Instant::now() < end {
        if cpu_from.is_none() && Instant::now() >= measure_from {
            cpu_from = Some(pid.and_then(|p| cpu_seconds(&p.to_string())));
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
    let cpu_to = pid.and_then(|p| cpu_seconds(&p.to_string()));
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
    let from = cpu_from.flatten();
    Ok(Figures {
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        max_ms: lat.last().copied().unwrap_or_default(),
        per_second: count as f64 / seconds,
        cpu_us: per_update(from, cpu_to),
    })
}

/// The client libraries an app is written with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Client {
    Rumqttc,
    Paho,
    MosquittoPub,
}

impl Client {
    const ALL: [Client; 3] = [Client::Rumqttc, Client::Paho, Client::MosquittoPub];

    fn name(self) -> &'static str {
        match self {
            Client::Rumqttc => "rumqttc",
            Client::Paho => "paho-mqtt (Python)",
            Client::MosquittoPub => "mosquitto_pub -l / mosquitto_sub",
        }
    }

    /// Requests outstanding per run; 0: a burst (`mosquitto_pub -l` does not wait for answers).
    fn outstanding(self) -> &'static [usize] {
        match self {
            Client::MosquittoPub => &[0],
            _ => &[1, 64],
        }
    }
}

/// The paho-mqtt app (`hardware-tests/sims/paho_twin_app.py`): one process for 1 outstanding,
/// two of 32 (each on its half of the devices) for 64, as an app spread over processes would.
fn paho(
    port: u16,
    outstanding: usize,
    seconds: f64,
    subscriptions: usize,
) -> anyhow::Result<Figures> {
    let procs = if outstanding > 1 { 2 } else { 1 };
    let children = (0..procs)
        .map(|i| {
            Command::new(sim::python())
                .arg(sim::sims_dir().join("paho_twin_app.py"))
                .args(["--port", &port.to_string()])
                .args(["--outstanding", &(outstanding / procs).max(1).to_string()])
                .args(["--seconds", &seconds.to_string()])
                .args(["--devices", &(DEVICES / procs).to_string()])
                .args(["--offset", &(i * DEVICES / procs).to_string()])
                .args(["--subscriptions", &(subscriptions / procs).to_string()])
                .args([
                    "--client-id",
                    &format!("paho-{outstanding}-{i}-{}", free_port()),
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| anyhow::anyhow!("paho app: {e} ({})", sim::SETUP_HINT))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut lat = Vec::new();
    let mut per_second = 0.0;
    for c in children {
        let out = c.wait_with_output().map_err(anyhow::Error::from)?;
        if !out.status.success() {
            return Err(anyhow::anyhow!(
                "paho app failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .map_err(|e| anyhow::anyhow!("paho app's output: {e}"))?;
        per_second += v["acked"].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(1.0);
        lat.extend(
            v["latencies_ms"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(serde_json::Value::as_f64),
        );
    }
    lat.sort_by(f64::total_cmp);
    Ok(Figures {
        p50_ms: percentile(&lat, 50.0),
        p99_ms: percentile(&lat, 99.0),
        max_ms: lat.last().copied().unwrap_or_default(),
        per_second,
        cpu_us: None,
    })
}

/// `mosquitto_pub` or `mosquitto_sub` on the broker at `port`, QoS 1, on `topic`.
fn mosquitto_client(tool: &str, port: u16, topic: &str) -> Command {
    let mut c = Command::new(tool);
    c.args([
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-q",
        "1",
        "-t",
        topic,
    ]);
    c
}

/// `mosquitto_pub -q 1 -l` sends `count` updates of one device, 500 lines per run of it, as
/// fast as it can, and `mosquitto_sub` counts the results: acknowledged updates per second.
fn mosquitto_pub_burst(port: u16, count: usize) -> anyhow::Result<Figures> {
    use std::io::{BufRead, Write};
    let topic = "$hw/events/device/default/dev-7/twin/update";
    let result = format!("{topic}/result");
    let mut sub = mosquitto_client("mosquitto_sub", port, &result)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| anyhow::anyhow!("mosquitto_sub: {e} (apt-get install mosquitto-clients)"))?;
    let lines = sub
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(lines).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    // Subscribed once a probe published on the result topic comes back.
    let deadline = Instant::now() + Duration::from_secs(10);
    'probe: loop {
        let _ = mosquitto_client("mosquitto_pub", port, &result)
            .args(["-m", r#"{"event_id":"probe"}"#])
            .status();
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
            if l.contains("probe") {
                break 'probe;
            }
        }
        if Instant::now() > deadline {
            let _ = sub.kill();
            return Err(anyhow::anyhow!("mosquitto_sub did not subscribe"));
        }
    }
    while rx.try_recv().is_ok() {}
    // Batches of BATCH lines, each waited for: a burst larger than a subscriber's queue (1000
    // messages in Mosquitto and the embedded broker) would measure dropped results instead.
    const BATCH: usize = 500;
    let started = Instant::now();
    let mut seen = 0;
    while seen < count {
        let mut publisher = mosquitto_client("mosquitto_pub", port, topic)
            .arg("-l")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("mosquitto_pub: {e}"))?;
        if let Some(mut stdin) = publisher.stdin.take() {
            let body: String = (seen..seen + BATCH)
                .map(|i| {
                    format!(
                        "{{\"event_id\":\"b{i}\",\"twin\":{{\"p{}\":{{\"actual\":{{\"value\":\"{i}\"}}}}}}}}\n",
                        i % PROPS
                    )
                })
                .collect();
            stdin
                .write_all(body.as_bytes())
                .map_err(anyhow::Error::from)?;
        }
        let mut got = 0;
        while got < BATCH {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(l) if l.contains("\"b") => got += 1,
                Ok(_) => {}
                Err(_) => {
                    let _ = sub.kill();
                    return Err(anyhow::anyhow!(
                        "only {} of {} results came",
                        seen + got,
                        seen + BATCH
                    ));
                }
            }
        }
        let _ = publisher.wait();
        seen += BATCH;
    }
    let took = started.elapsed().as_secs_f64();
    let _ = sub.kill();
    let _ = sub.wait();
    Ok(Figures {
        p50_ms: f64::NAN,
        p99_ms: f64::NAN,
        max_ms: f64::NAN,
        per_second: count as f64 / took,
        cpu_us: None,
    })
}

async fn measure(
    client: Client,
    port: u16,
    outstanding: usize,
    seconds: f64,
    pid: Option<u32>,
    subscriptions: usize,
) -> anyhow::Result<Figures> {
    match client {
        Client::Rumqttc => run(port, outstanding, seconds, pid, subscriptions).await,
        Client::Paho => {
            tokio::task::spawn_blocking(move || paho(port, outstanding, seconds, subscriptions))
                .await
                .map_err(anyhow::Error::from)?
        }
        Client::MosquittoPub => {
            let count = ((seconds * 2000.0) as usize).div_ceil(500) * 500;
            tokio::task::spawn_blocking(move || mosquitto_pub_burst(port, count))
                .await
                .map_err(anyhow::Error::from)?
        }
    }
}

/// One measured row: the path, the client, the requests outstanding, the figures.
struct Row {
    path: &'static str,
    client: Client,
    outstanding: usize,
    figures: Figures,
}

const ECHO: &str = "echo responder on Mosquitto (the client's ceiling)";
const ECHO_NAGLE: &str = "echo responder on Mosquitto as it comes (Nagle on)";
const MOSQUITTO: &str = "edgecore + Mosquitto (set_tcp_nodelay true)";
const MOSQUITTO_NAGLE: &str = "edgecore + Mosquitto (default: Nagle on)";
const EMBEDDED: &str = "edgecore, embedded broker";

/// Measures `path` with every client and adds the rows.
async fn measure_all(
    rows: &mut Vec<Row>,
    path: &'static str,
    port: u16,
    seconds: f64,
    pid: Option<u32>,
) -> anyhow::Result<()> {
    measure_with(rows, path, port, seconds, pid, &Client::ALL, 0).await
}

/// Measures `path` with `clients`, subscribing per device to `subscriptions` topics (0: one
/// wildcard), and adds the rows.
async fn measure_with(
    rows: &mut Vec<Row>,
    path: &'static str,
    port: u16,
    seconds: f64,
    pid: Option<u32>,
    clients: &[Client],
    subscriptions: usize,
) -> anyhow::Result<()> {
    for &client in clients {
        for &n in client.outstanding() {
            let figures = measure(client, port, n, seconds, pid, subscriptions)
                .await
                .map_err(|e| anyhow::anyhow!("{path}, {}: {e}", client.name()))?;
            let row = Row {
                path,
                client,
                outstanding: n,
                figures,
            };
            print_row(rows, &row);
            rows.push(row);
        }
    }
    Ok(())
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

/// Mosquitto on `port`; `nodelay`: `set_tcp_nodelay true` (Mosquitto leaves Nagle's algorithm
/// on by default, and many installations keep the default).
/// A Mosquitto killed when dropped, whatever ends the run.
struct Broker(std::process::Child);

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mosquitto(dir: &Path, port: u16, nodelay: bool) -> anyhow::Result<Broker> {
    let conf = dir.join(format!("mosquitto-{port}.conf"));
    std::fs::write(
        &conf,
        format!("listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\nset_tcp_nodelay {nodelay}\n"),
    )
    .map_err(anyhow::Error::from)?;
    let broker = Broker(
        Command::new("mosquitto")
            .arg("-c")
            .arg(&conf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("mosquitto: {e} (apt-get install mosquitto)"))?,
    );
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(broker);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(anyhow::anyhow!("mosquitto did not start"))
}

fn edgecore(bins: &Path, dir: &Path, mode: &str, port: u16) -> anyhow::Result<(Proc, String)> {
    let http = free_port();
    std::fs::create_dir_all(dir.join("manifests")).map_err(anyhow::Error::from)?;
    std::fs::write(
        dir.join("manifests/devices.yaml"),
        sim::bench_manifests(DEVICES, PROPS),
    )
    .map_err(anyhow::Error::from)?;
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
        // Whole lines: the HELP text of the gauge reads "... edgecore_mqtt_connected 1 while".
        let devices = format!("edgecore_devices {DEVICES}");
        if metrics.lines().any(|l| l == devices)
            && metrics.lines().any(|l| l == "edgecore_mqtt_connected 1")
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
    sim::proc_status(&pid.to_string(), "RssAnon") as f64 / 1024.0
}

/// Prints `row` with its ratio to the same client's figure on Mosquitto and on the echo
/// responder (measured before it).
fn print_row(rows: &[Row], row: &Row) {
    let f = &row.figures;
    let ms = |v: f64| {
        if v.is_nan() {
            "-".to_string()
        } else {
            format!("{v:.2}")
        }
    };
    let same = |path: &str| {
        rows.iter()
            .find(|r| r.path == path && r.client == row.client && r.outstanding == row.outstanding)
            .filter(|r| r.path != row.path)
    };
    let ratio = |path: &str| {
        same(path).map_or("-".to_string(), |r| {
            format!("{:.2}", f.per_second / r.figures.per_second)
        })
    };
    // Edgecore on Mosquitto as it comes is compared with the echo on that same broker.
    let echo = if row.path == MOSQUITTO_NAGLE {
        ECHO_NAGLE
    } else {
        ECHO
    };
    let p50_ratio = same(echo)
        .filter(|r| !f.p50_ms.is_nan() && r.figures.p50_ms > 0.0)
        .map_or("-".to_string(), |r| {
            format!("{:.2}", f.p50_ms / r.figures.p50_ms)
        });
    let n = if row.outstanding == 0 {
        "burst".to_string()
    } else {
        row.outstanding.to_string()
    };
    println!(
        "| {} | {} | {n} | {} | {} | {} | {:.0} | {} | {} | {p50_ratio} | {} |",
        row.path,
        row.client.name(),
        ms(f.p50_ms),
        ms(f.p99_ms),
        ms(f.max_ms),
        f.per_second,
        ratio(MOSQUITTO),
        ratio(echo),
        f.cpu_us.map_or("-".to_string(), |v| format!("{v:.0}")),
    );
}

/// The apps that subscribe once per device, `n` subscriptions per app in all (rumqttc and
/// paho; `mosquitto_sub` takes its topics as arguments, which do not fit 100,000), on the
/// echo responder, edgecore + Mosquitto and the embedded broker, in one run.
async fn per_device(bins: &Path, dir: &Path, n: usize, seconds: f64) -> anyhow::Result<()> {
    println!("\nApps subscribing per device, {n} subscriptions per app:\n");
    println!(
        "| path | client | outstanding | p50 ms | p99 ms | max ms | acknowledged updates/s | ÷ Mosquitto | ÷ echo | p50 ÷ echo's p50 | CPU µs/update (broker or edgecore; rumqttc runs) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let clients = [Client::Rumqttc, Client::Paho];
    let mut rows = Vec::new();
    let measure = async |rows: &mut Vec<Row>, path, port, pid| {
        measure_with(rows, path, port, seconds, pid, &clients, n).await
    };
    let port = free_port();
    let broker = mosquitto(dir, port, true)?;
    let responder = echo(port).await?;
    measure(&mut rows, ECHO, port, Some(broker.0.id())).await?;
    responder.abort();
    let (core, _) = edgecore(bins, &dir.join(format!("external-{n}")), "external", port)?;
    measure(&mut rows, MOSQUITTO, port, Some(core.child.id())).await?;
    drop(core);
    drop(broker);
    let port = free_port();
    let (core, _) = edgecore(bins, &dir.join(format!("embedded-{n}")), "embedded", port)?;
    measure(&mut rows, EMBEDDED, port, Some(core.child.id())).await?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let result = async {
        let bins = sim::bench_binaries(args.bins.as_deref())?;
        let dir = tempfile::tempdir().map_err(anyhow::Error::from)?;
        let mut rows = Vec::new();
        let mut rss_external = 0.0;
        for &n in &args.subscriptions {
            per_device(&bins, dir.path(), n, args.seconds).await?;
        }
        if args.subscriptions_only {
            return Ok(());
        }
        println!("\nOne wildcard subscription per app:\n");
        println!("| path | client | outstanding | p50 ms | p99 ms | max ms | acknowledged updates/s | ÷ Mosquitto | ÷ echo | p50 ÷ echo's p50 | CPU µs/update (broker or edgecore; rumqttc runs) |");
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        if !args.embedded_only && !args.burst_only {
            // The clients' ceiling: an echo responder on Mosquitto.
            let port = free_port();
            let broker = mosquitto(dir.path(), port, true)?;
            let responder = echo(port).await?;
            measure_all(&mut rows, ECHO, port, args.seconds, Some(broker.0.id())).await?;
            responder.abort();

            // edgecore on Mosquitto, as the bench's config and as Mosquitto comes.
            let (core, _) = edgecore(&bins, &dir.path().join("external"), "external", port)?;
            measure_all(&mut rows, MOSQUITTO, port, args.seconds, Some(core.child.id())).await?;
            rss_external = rss_mb(core.child.id());
            drop(core);
            drop(broker);
            let port = free_port();
            let broker = mosquitto(dir.path(), port, false)?;
            // The same echo on Mosquitto as it comes: what any responder there can reach.
            let responder = echo(port).await?;
            measure_all(&mut rows, ECHO_NAGLE, port, args.seconds, Some(broker.0.id())).await?;
            responder.abort();
            let (core, _) = edgecore(&bins, &dir.path().join("external-nagle"), "external", port)?;
            measure_all(&mut rows, MOSQUITTO_NAGLE, port, args.seconds, Some(core.child.id())).await?;
            drop(core);
            drop(broker);
        }
        // edgecore on its embedded broker.
        let port = free_port();
        let (core, _) = edgecore(&bins, &dir.path().join("embedded"), "embedded", port)?;
        if !args.burst_only {
            measure_all(&mut rows, EMBEDDED, port, args.seconds, Some(core.child.id())).await?;
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
