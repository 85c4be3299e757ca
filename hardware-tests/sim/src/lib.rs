//! The project's simulators and the harness of its end-to-end tests: the Modbus simulator
//! ([`modbus_sim`], also the `modbus-sim` binary), the OPC UA server ([`opcua_sim`]), a fake
//! BlueZ ([`bluez`]), a private containerd ([`containerd`]), and helpers that run the real
//! `edgecore`, `mapper-*` and `kectl` binaries (built by `cargo test --workspace`, or built
//! first when missing) in a temporary directory, beside the Python simulators of
//! `hardware-tests/sims/`. The tests and benches that use it are in `hardware-tests`; the
//! quickstart is a crate of its own.

pub mod bluez;
pub mod browser;
pub mod containerd;
pub mod etcd;
pub mod fixture;
pub mod jobs;
pub mod kubelet_calls;
pub mod modbus_sim;
pub mod opcua_sim;
pub mod poll;
pub mod rng;
pub mod stack;

pub use fixture::fill;
pub use poll::eventually;

mod node;
mod pysim;
pub use node::{Node, Proc};
pub use pysim::{PyModbus, PyModbusRandom, PySim, read_holding, write_holdings};

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

/// `scripts/package` (fast) of the workspace's binaries, each built first when missing, into
/// `out`, with `args` more (`--version V`) and `env`: the `.deb` files it made, in its order.
pub fn package(out: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<PathBuf> {
    let bins = bin_dir();
    for b in [
        "edgecore",
        "kectl",
        "cloudcore",
        "mapper-modbus",
        "mapper-serial",
        "mapper-opcua",
        "mapper-ble",
    ] {
        bin(b);
    }
    let made = run(Command::new(workspace_root().join("scripts/package"))
        .args(["--no-build", "--fast"])
        .args(args)
        .arg("--bin-dir")
        .arg(&bins)
        .arg("--out")
        .arg(out)
        .envs(env.iter().copied()));
    made.lines().map(PathBuf::from).collect()
}

/// The workspace's binaries: next to this test's own executable (`target/debug/deps/..`).
pub fn bin(name: &str) -> PathBuf {
    static BUILD: Once = Once::new();
    let dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target/debug"));
    let path = dir.join(name);
    if !path.exists() {
        BUILD.call_once(|| {
            assert!(
                build_binaries(&workspace_root(), false),
                "building the binaries failed"
            );
        });
    }
    assert!(path.exists(), "{} is not built", path.display());
    path
}

/// The directory of the workspace's binaries ([`bin`]'s, built if missing).
pub fn bin_dir() -> PathBuf {
    bin("edgecore")
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The workspace's root directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// The Python simulators' directory, `hardware-tests/sims`.
pub fn sims_dir() -> PathBuf {
    workspace_root().join("hardware-tests/sims")
}

/// The Python to run the simulators with: the project's `.venv` (made by `scripts/test` from
/// `hardware-tests/requirements.txt`) when there is one, else `python3` from `PATH`.
pub fn python() -> PathBuf {
    let venv = workspace_root().join(".venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// What to say when a Python simulator is missing.
pub const SETUP_HINT: &str = "run scripts/test --setup-only, which installs the simulators into .venv from hardware-tests/requirements.txt";

/// Builds the binaries ([`build_binaries`]) in the profile of the running program (a bench or
/// the quickstart) and returns their directory, the running program's own.
pub fn built_binaries(release: bool) -> anyhow::Result<PathBuf> {
    if !build_binaries(&workspace_root(), release) {
        anyhow::bail!("cargo build of the binaries failed");
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| anyhow::anyhow!("cannot find the binaries' directory"))
}

/// The error the mapper's REST API (on `http_port`) shows for a property of device
/// `default/{device}`.
pub fn property_error(http_port: u16, device: &str, property: &str) -> Option<String> {
    let (_, dev) = get(
        &agent(),
        &format!("http://127.0.0.1:{http_port}/api/v1/device/default/{device}"),
    );
    dev["data"]["properties"][property]["error"]
        .as_str()
        .map(str::to_string)
}

/// `cargo build` of `edgecore`, the mappers, `devsim`, `kectl` and `cloudcore` in the workspace at `root`,
/// with `--release` when `release`. `hardware-tests` is in the set (and depends on each of
/// them), so the features are those of `cargo run -p hardware-tests`, and the environment is
/// the shell's: a bench that calls this after `cargo run` rebuilds nothing.
pub fn build_binaries(root: &Path, release: bool) -> bool {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut args = vec![
        "build",
        "--bins",
        "-p",
        "hardware-tests",
        "-p",
        "quickstart",
        "-p",
        "sim",
        "-p",
        "edge",
        "-p",
        "mapper-modbus",
        "-p",
        "mapper-serial",
        "-p",
        "mapper-opcua",
        "-p",
        "mapper-ble",
        "-p",
        "devsim",
        "-p",
        "kectl",
        "-p",
        "cloud",
    ];
    if release {
        args.push("--release");
    }
    let mut cmd = Command::new(cargo);
    cmd.args(args).current_dir(root);
    // What `cargo run` and `cargo test` set for the program they run is not for this cargo:
    // ring's build script reruns when CARGO_MANIFEST_DIR changes, so a bench started with
    // `cargo run` rebuilt ring and all that depends on it, and the next `cargo run` rebuilt
    // them back.
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy();
        if k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_MANIFEST_")
            || [
                "CARGO_CRATE_NAME",
                "CARGO_BIN_NAME",
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "OUT_DIR",
            ]
            .contains(&k.as_ref())
        {
            cmd.env_remove(k.as_ref());
        }
    }
    cmd.status().is_ok_and(|s| s.success())
}

/// An environment variable that is set and not blank (the real-hardware tests' settings).
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A loopback TCP port nothing listens on, for a server a test is about to start.
///
/// Taken below the kernel's range of ephemeral ports (32768-60999 on Linux): a port the kernel
/// hands out for `:0` is also one it hands out as the source port of the next client
/// connection, and on a busy machine one of the other tests' clients took it before the server
/// bound it (the server then exits on "address in use"). Spread by process id, so that test
/// binaries running side by side try different ports first.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id().wrapping_mul(7_919);
    for _ in 0..COUNT {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // 8,729 and 12,000 are coprime: every port of the range comes once per cycle.
        let port = FIRST + base.wrapping_add(n.wrapping_mul(8_729)) % COUNT;
        let port = u16::try_from(port).unwrap_or(u16::MAX);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// VmRSS of process `pid` (`"self"` for this one), in KiB; 0 when it cannot be read.
pub fn vm_rss_kb(pid: &str) -> u64 {
    proc_status(pid, "VmRSS")
}

/// A field of `/proc/{pid}/status` (`VmRSS`, `RssAnon`, `Threads`...), its number (KiB for
/// sizes); 0 when it cannot be read.
pub fn proc_status(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The directory of the edgecore (and other binaries) a bench measures: `given` (another
/// build's, made absolute: edgecore runs in a directory of its own), or this workspace's
/// release build, built now.
pub fn bench_binaries(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    match given {
        Some(dir) => {
            std::fs::canonicalize(dir).map_err(|e| anyhow::anyhow!("--bins {}: {e}", dir.display()))
        }
        None => {
            eprintln!(
                "building the release binaries (edgecore, the mappers, devsim, kectl, cloudcore, the benches; \
                 minutes the first time; --bins DIR takes built ones) ..."
            );
            built_binaries(true)
        }
    }
}

/// A bench's edgecore in `dir`: [`bench_manifests`] in `manifests/devices.yaml` and an
/// `edgecore.yaml` for node `node` (embedded broker, HTTP API, DMI socket `dmi.sock`, data in
/// `data`), run with `edgecore --config edgecore.yaml` in `dir`. Returns the HTTP API's port.
pub fn bench_edgecore_dir(
    dir: &Path,
    node: &str,
    devices: usize,
    props: usize,
) -> std::io::Result<u16> {
    std::fs::create_dir_all(dir.join("manifests"))?;
    std::fs::write(
        dir.join("manifests/devices.yaml"),
        bench_manifests(devices, props),
    )?;
    let http = free_port();
    std::fs::write(
        dir.join("edgecore.yaml"),
        format!(
            "nodeName: {node}\ndataDir: data\nmanifests: {{dir: manifests}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:{}\"}}\nhttp: {{address: \"127.0.0.1:{http}\"}}\ndmi: {{socket: dmi.sock}}\n",
            free_port()
        ),
    )?;
    Ok(http)
}

/// The benches' manifests: a DeviceModel `m` of `props` INT ReadWrite properties `p0`..., and
/// `devices` Devices `dev-0`... of it (protocol `bench`, which no mapper serves).
pub fn bench_manifests(devices: usize, props: usize) -> String {
    bench_manifests_on(devices, props, None)
}

/// [`bench_manifests`], the devices on node `node` (`spec.nodeName`) when one is given: what a
/// cloud sends that node.
pub fn bench_manifests_on(devices: usize, props: usize, node: Option<&str>) -> String {
    let model: String = (0..props)
        .map(|p| format!("    - {{name: p{p}, type: INT, accessMode: ReadWrite}}\n"))
        .collect();
    let mut out = format!(
        "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {{name: m, namespace: default}}\nspec:\n  protocol: bench\n  properties:\n{model}"
    );
    let visitors: String = (0..props)
        .map(|p| format!("    - {{name: p{p}, visitors: {{protocolName: bench, configData: {{offset: {p}}}}}}}\n"))
        .collect();
    let node_line = node.map_or(String::new(), |n| format!("  nodeName: {n}\n"));
    for d in 0..devices {
        out.push_str(&format!(
            "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: dev-{d}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n{node_line}  protocol: {{protocolName: bench}}\n  properties:\n{visitors}"
        ));
    }
    out
}

/// A test that cannot run for want of something `scripts/test` installs (a Debian package,
/// root for a mount): skipped on a developer's machine, saying why; a failure under `CI`, where
/// everything is installed, so that a broken install step cannot pass as a skip.
/// `cmd` started with its stdin and stdout piped to the caller (its stderr as `cmd` says).
pub fn piped(
    cmd: &mut std::process::Command,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    std::process::ChildStdout,
) {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{:?} starts: {e}", cmd.get_program()));
    let stdin = child.stdin.take().expect("piped stdin");
    let stdout = child.stdout.take().expect("piped stdout");
    (child, stdin, stdout)
}

/// What `cmd` printed and how it ended, `input` given on its stdin.
pub fn output_with(cmd: &mut std::process::Command, input: &[u8]) -> std::process::Output {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{:?} starts: {e}", cmd.get_program()));
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input);
    }
    child.wait_with_output().expect("it ends")
}

/// The lines `out` prints, read on a thread of their own, as `keep` takes them (a line it
/// gives none for is left out).
pub fn lines<T: Send + 'static>(
    out: impl std::io::Read + Send + 'static,
    keep: impl Fn(String) -> Option<T> + Send + 'static,
) -> std::sync::mpsc::Receiver<T> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(v) = keep(line)
                && tx.send(v).is_err()
            {
                return;
            }
        }
    });
    rx
}

/// Runs `cmd`: its stdout; a panic with its output when it fails.
pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `tool` is a command on the PATH.
pub fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether `tool` (from Debian's `package`) is missing, the test then skipped saying so.
pub fn missing(tool: &str, package: &str) -> bool {
    let missing = !have(tool);
    if missing {
        skip(&format!("{tool} (Debian's {package} package) is not there"));
    }
    missing
}

/// Whether this test runs as root (it owns `/proc/self` as it runs).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

pub fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI installs what this test needs, yet: {why}"
    );
    eprintln!("skipped: {why}");
}

/// Whether the edgecore whose HTTP API is at `base` (`http://host:port`) has started every
/// module: `/readyz` answers and does not say `starting` (it answers from the stored twins
/// before the manifests are read and the mappers' socket is open).
pub fn edgecore_started(agent: &ureq::Agent, base: &str) -> bool {
    match agent.get(format!("{base}/readyz")).call() {
        Ok(mut r) => !r
            .body_mut()
            .read_to_string()
            .unwrap_or_default()
            .starts_with("starting"),
        Err(_) => false,
    }
}

pub fn get(agent: &ureq::Agent, url: &str) -> (u16, Value) {
    match agent.get(url).call() {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let v = r.body_mut().read_json::<Value>().unwrap_or(Value::Null);
            (status, v)
        }
        Err(_) => (0, Value::Null),
    }
}

pub fn post(agent: &ureq::Agent, url: &str, body: &str) -> (u16, Value) {
    match agent
        .post(url)
        .header("content-type", "application/json")
        .send(body)
    {
        Ok(mut r) => {
            let status = r.status().as_u16();
            let v = r.body_mut().read_json::<Value>().unwrap_or(Value::Null);
            (status, v)
        }
        Err(_) => (0, Value::Null),
    }
}

pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// A JSON object's map (configData in tests and benches); empty for anything else.
pub fn object(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

/// Percentile `p` (0-100) of sorted `v`; NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The reported value of `prop` in a twin document.
pub fn reported(twin: &Value, prop: &str) -> Option<String> {
    twin["properties"][prop]["reported"]["value"]
        .as_str()
        .map(str::to_string)
}

/// The reported value of `prop` in a `twin/update/document` message.
pub fn document_reported(payload: &[u8], prop: &str) -> Option<String> {
    let v: Value = serde_json::from_slice(payload).ok()?;
    v["twin"][prop]["current"]["actual"]["value"]
        .as_str()
        .map(str::to_string)
}

/// A message from [`mqtt_messages`], stamped on arrival.
pub struct MqttMessage {
    pub at: Instant,
    /// The wall-clock time at `at`, to compare with times other processes wrote.
    pub wall: std::time::SystemTime,
    pub topic: String,
    pub payload: Vec<u8>,
}

/// Messages on `filter` from the MQTT broker on 127.0.0.1:`port`; returns once the
/// subscription is acknowledged.
pub fn mqtt_messages(
    port: u16,
    filter: &str,
) -> anyhow::Result<std::sync::mpsc::Receiver<MqttMessage>> {
    static CLIENTS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = CLIENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut opts = rumqttc::MqttOptions::new(
        format!("bench-{}-{n}", std::process::id()),
        "127.0.0.1",
        port,
    );
    opts.set_keep_alive(Duration::from_secs(30));
    let (client, mut connection) = rumqttc::Client::new(opts, 256);
    client.subscribe(filter, rumqttc::QoS::AtMostOnce)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (sub_tx, sub_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _client = client;
        for event in connection.iter() {
            match event {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                    let _ = sub_tx.send(());
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    let msg = MqttMessage {
                        at: Instant::now(),
                        wall: std::time::SystemTime::now(),
                        topic: p.topic.clone(),
                        payload: p.payload.to_vec(),
                    };
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    });
    sub_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| anyhow::anyhow!("no SUBACK from the broker"))?;
    Ok(rx)
}

/// A pair of connected ptys (`socat`): a device emulator on one end, a mapper on the other.
/// socat stops on drop.
#[derive(Debug)]
pub struct PtyPair {
    proc: Child,
    pub a: PathBuf,
    pub b: PathBuf,
}

impl PtyPair {
    /// The pair as `dir/NAME-a` and `dir/NAME-b`.
    pub fn start(dir: &Path, name: &str) -> Self {
        let (a, b) = (dir.join(format!("{name}-a")), dir.join(format!("{name}-b")));
        Self::link(a, b).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The pair as the links `a` and `b` (made again if they are there), or why not.
    pub fn link(a: PathBuf, b: PathBuf) -> Result<Self, String> {
        let _ = std::fs::remove_file(&a);
        let _ = std::fs::remove_file(&b);
        let proc = Command::new("socat")
            .arg(format!("pty,raw,echo=0,link={}", a.display()))
            .arg(format!("pty,raw,echo=0,link={}", b.display()))
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot run socat for a pty pair ({e}); apt-get install socat"))?;
        let pair = Self { proc, a, b };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !(pair.a.exists() && pair.b.exists()) {
            if Instant::now() > deadline {
                return Err("socat made no pty pair within 5 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(pair)
    }
}

impl Drop for PtyPair {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

/// A TCP proxy to `127.0.0.1:{upstream}` that can cut the link: [`Proxy::cut`] drops every
/// connection and refuses new ones (as a site's uplink that goes down), [`Proxy::restore`]
/// lets them through again. [`Proxy::blackhole`] is the hard case: every connection stays
/// open but no byte passes either way (a dead modem, a NAT that forgot the flow), new ones are
/// taken and held; [`Proxy::unblock`] lets the held bytes through, as TCP's retransmissions
/// would. Runs on its own thread.
pub struct Proxy {
    pub port: u16,
    cut: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    paused: std::sync::Arc<tokio::sync::watch::Sender<bool>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Bytes from `from` to `to` while the proxy is not paused; what was read as it paused waits.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut paused: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if paused.wait_for(|p| !*p).await.is_err() {
            break;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if paused.wait_for(|p| !*p).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Runs `task` on a thread of its own with a single-threaded runtime, apart from the caller's
/// (a test's synchronous body, a signal watcher). Nothing runs when no runtime can be made.
pub fn on_own_thread(task: impl std::future::Future<Output = ()> + Send + 'static) {
    std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(task);
        }
    });
}

impl Proxy {
    pub fn start(upstream: u16) -> Self {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy bind");
        let port = std_listener.local_addr().expect("addr").port();
        std_listener.set_nonblocking(true).expect("nonblocking");
        let (tx, rx) = tokio::sync::watch::channel(false);
        let cut = std::sync::Arc::new(tx);
        let (pause_tx, pause_rx) = tokio::sync::watch::channel(false);
        let paused = std::sync::Arc::new(pause_tx);
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refusing = closed.clone();
        on_own_thread(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(std_listener) else {
                return;
            };
            while let Ok((down, _)) = listener.accept().await {
                if *rx.borrow() || refusing.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let mut rx = rx.clone();
                let mut pause = pause_rx.clone();
                tokio::spawn(async move {
                    // Taken, and held while the link is a black hole.
                    if pause.wait_for(|p| !*p).await.is_err() {
                        return;
                    }
                    let Ok(up) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let (down_r, down_w) = down.into_split();
                    let (up_r, up_w) = up.into_split();
                    tokio::select! {
                        _ = async {
                            tokio::join!(
                                pump(down_r, up_w, pause.clone()),
                                pump(up_r, down_w, pause.clone())
                            )
                        } => {}
                        _ = rx.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self {
            port,
            cut,
            paused,
            closed,
        }
    }

    /// No byte passes either way and nothing closes; new connections are taken and held.
    pub fn blackhole(&self) {
        let _ = self.paused.send(true);
    }

    /// The bytes held pass, and new ones with them.
    pub fn unblock(&self) {
        let _ = self.paused.send(false);
    }

    /// Refuses new connections; those open go on (a link that holds a session and will not
    /// let a new one start).
    pub fn refuse_new(&self) {
        self.closed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        let _ = self.cut.send(true);
    }

    pub fn restore(&self) {
        self.closed
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let _ = self.cut.send(false);
    }
}
