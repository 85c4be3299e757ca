//! Pieces the cloud bench programs share (`cloud-bench`, `cloudhub-bench`,
//! `devicecontroller-bench`, `replicas-bench`, `cloud-e2e-bench`, `pods-bench`): a release
//! `cloudcore` started on a fresh data directory, `/metrics` scraped, simulated edge nodes
//! holding cloudhub sessions as KubeEdge's edgehub does.

use anyhow::{Context, Result};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A kind of the devices API group (`Device`, `DeviceModel`, `DeviceStatus`) for kube-rs's
/// dynamic objects.
pub fn ar(kind: &str) -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
        "devices.kubeedge.io",
        "v1beta1",
        kind,
    ))
}

/// A kind of the devices API group in `default`, for kube-rs's dynamic objects.
pub fn devices_api(client: &kube::Client, kind: &str) -> kube::Api<kube::api::DynamicObject> {
    kube::Api::namespaced_with(client.clone(), "default", &ar(kind))
}

/// Creates the object `v` (JSON with its `apiVersion` and `kind`) with `api`.
pub async fn create(api: &kube::Api<kube::api::DynamicObject>, v: serde_json::Value) -> Result<()> {
    let o: kube::api::DynamicObject = serde_json::from_value(v)?;
    api.create(&kube::api::PostParams::default(), &o).await?;
    Ok(())
}

/// CPU time process `pid` has used (user and system), in seconds; 0 when it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // After the command's `(name)`, fields 3 on: utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Linux reports them in USER_HZ, 100 a second on every architecture it runs on.
    (ticks(11) + ticks(12)) as f64 / 100.0
}

/// The resident memory of process `pid`, KiB.
pub fn rss_kib(pid: u32) -> u64 {
    sim::vm_rss_kb(&pid.to_string())
}

/// The lines of a `  cloudHub:` block of `modules` (without its header), and the rest.
fn split_hub(modules: &str) -> (String, String) {
    let mut hub = String::new();
    let mut rest = String::new();
    let mut inside = false;
    for line in modules.lines() {
        if line == "  cloudHub:" {
            inside = true;
            continue;
        }
        if inside && line.starts_with("    ") {
            hub.push_str(line);
            hub.push('\n');
            continue;
        }
        inside = false;
        rest.push_str(line);
        rest.push('\n');
    }
    (hub, rest)
}

pub struct Server {
    config: std::path::PathBuf,
    starts: usize,
    /// Run under heaptrack (`BENCH_HEAPTRACK`).
    profiled: bool,
    pub child: Child,
    _dir: tempfile::TempDir,
    pub kubeconfig: std::path::PathBuf,
    pub metrics: String,
    /// cloudhub's websocket address.
    pub hub: String,
    /// The API's port (HTTPS).
    pub api: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.profiled {
            let _ = Command::new("pkill")
                .args(["-TERM", "-x", "cloudcore"])
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the release `cloudcore` beside this program on a fresh data directory, with `modules`
/// YAML (indented by 2) under `modules`.
pub fn start_server(modules: &str) -> Result<Server> {
    start_server_on(modules, "")
}

/// [`start_server`] with more lines (indented by 4) under `modules.apiserver` (`etcd:`).
pub fn start_server_on(modules: &str, apiserver: &str) -> Result<Server> {
    // `CLOUDCORE=path`: another build's cloudcore (a bench's figures before and after a change,
    // with the same bench).
    let exe = match std::env::var_os("CLOUDCORE") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::env::current_exe()?
            .parent()
            .context("no directory")?
            .join("cloudcore"),
    };
    let dir = tempfile::tempdir()?;
    let free = || -> Result<u16> {
        Ok(std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port())
    };
    let (port, mport, hport, cport) = (free()?, free()?, free()?, free()?);
    let config = dir.path().join("cloudcore.yaml");
    // A `cloudHub:` block in `modules` joins the one with the ports (kept across restarts).
    let (hub_extra, modules) = split_hub(modules);
    std::fs::write(
        &config,
        format!(
            "dataDir: data\nmodules:\n  apiserver:\n    listen: \"127.0.0.1:{port}\"\n{apiserver}  cloudHub:\n    listen: \"127.0.0.1:{hport}\"\n    certListen: \"127.0.0.1:{cport}\"\n{hub_extra}  metrics:\n    listen: \"127.0.0.1:{mport}\"\n{modules}"
        ),
    )?;
    let log = std::fs::File::create(dir.path().join("log"))?;
    let child = Command::new(&exe)
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stderr(log)
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| {
            format!(
                "cannot start {} (build it with cargo build --release -p cloud)",
                exe.display()
            )
        })?;
    let kubeconfig = dir.path().join("data/admin.kubeconfig");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(dir.path().join("log"))
        .unwrap_or_default()
        .contains("cloudcore: API at")
    {
        anyhow::ensure!(Instant::now() < deadline, "cloudcore did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Server {
        config,
        starts: 1,
        profiled: false,
        child,
        _dir: dir,
        kubeconfig,
        metrics: format!("127.0.0.1:{mport}"),
        hub: format!("127.0.0.1:{hport}"),
        api: port,
    })
}

impl Server {
    /// The data directory (its `pki/` holds the CA).
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.config
            .parent()
            .map(|d| d.join("data"))
            .unwrap_or_default()
    }

    /// SIGTERM, then a new start on the same data directory with `modules` instead.
    pub fn restart(&mut self, modules: &str) -> Result<()> {
        // The cloudHub block stays as the first start wrote it.
        let (_, modules) = split_hub(modules);
        let modules = modules.as_str();
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        if self.profiled {
            // heaptrack's script does not pass SIGTERM on to the program it runs.
            let _ = Command::new("pkill")
                .args(["-TERM", "-x", "cloudcore"])
                .status();
        }
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.config)?;
        let head = text
            .split("  metrics:")
            .next()
            .unwrap_or_default()
            .to_string();
        std::fs::write(
            &self.config,
            format!(
                "{head}  metrics:\n    listen: \"{}\"\n{modules}",
                self.metrics
            ),
        )?;
        let dir = self.config.parent().context("no directory")?.to_path_buf();
        let exe = std::env::current_exe()?
            .parent()
            .context("no directory")?
            .join("cloudcore");
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("log"))?;
        // BENCH_HEAPTRACK=FILE runs the restarted cloudcore under heaptrack (its memory figures
        // then include heaptrack's own).
        let profile = std::env::var("BENCH_HEAPTRACK").ok();
        let mut cmd = match &profile {
            Some(out) => {
                let mut c = Command::new("heaptrack");
                c.args(["-o", &format!("{out}.{}", self.starts + 1)])
                    .arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        self.profiled = profile.is_some();
        self.child = cmd
            .arg("--config")
            .arg(&self.config)
            .env("RUST_LOG", "warn")
            .stderr(log)
            .stdout(Stdio::null())
            .spawn()?;
        self.starts += 1;
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_to_string(dir.join("log"))
            .unwrap_or_default()
            .matches("cloudcore: API at")
            .count()
            < self.starts
        {
            anyhow::ensure!(Instant::now() < deadline, "cloudcore did not restart");
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

/// Raises this process's open-files limit to the hard one; returns the limit.
pub fn raise_nofile() -> u64 {
    rt::bootstrap::raise_nofile_limit()
}

/// A metric's value from the text of `/metrics`.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
        .unwrap_or(0.0)
}

/// `GET http://{addr}/metrics`.
pub async fn scrape(addr: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// Runs `n` operations over `concurrency` tasks; returns operations per second.
pub async fn run<F, Fut>(n: usize, concurrency: usize, op: F) -> Result<f64>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<()>> + Send,
{
    let op = Arc::new(op);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let op = op.clone();
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<(), anyhow::Error>(());
                }
                op(i).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// A TLS client configuration of a simulated edge node: trusts `ca_pem`, presents `cert`/`key`.
pub fn node_tls(
    ca_pem: &str,
    cert: &str,
    key: &str,
) -> Result<Arc<tokio_rustls::rustls::ClientConfig>> {
    Ok(pki::tls::client_config(ca_pem, Some((cert, key)))?)
}

/// A simulated edge node's TLS client configuration.
pub type NodeTls = Arc<tokio_rustls::rustls::ClientConfig>;

/// A simulated edge node's websocket session.
pub type NodeSession =
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>;

/// Connects as edge node `name` to cloudhub at `hub` (`host:port`), as KubeEdge's edgehub does.
pub async fn connect_node(
    name: &str,
    hub: &str,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
) -> Result<NodeSession> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let tcp = tokio::net::TcpStream::connect(hub).await?;
    let host = hub.rsplit_once(':').map_or(hub, |(h, _)| h).to_string();
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(
            tokio_rustls::rustls::pki_types::ServerName::try_from(host)?,
            tcp,
        )
        .await?;
    let mut req = format!("wss://{hub}/e632aba927ea4ac2b575ec1603d56f10/{name}/events")
        .into_client_request()?;
    req.headers_mut().insert("node_id", name.parse()?);
    req.headers_mut()
        .insert("project_id", "e632aba927ea4ac2b575ec1603d56f10".parse()?);
    let (ws, _) = tokio_tungstenite::client_async(req, stream).await?;
    Ok(ws)
}

/// Holds a simulated node's session as edgehub does (a keepalive every 15 s) until it ends.
pub async fn hold_session(ws: &mut NodeSession) {
    use futures_util::{SinkExt, StreamExt};
    let mut beat = tokio::time::interval(Duration::from_secs(15));
    loop {
        tokio::select! {
            _ = beat.tick() => {
                let ping = api::message::Message::new("websocket", "resource", "keepalive", "node", serde_json::json!("ping"));
                let text = serde_json::to_string(&ping).unwrap_or_default();
                if ws.send(tokio_tungstenite::tungstenite::Message::text(text)).await.is_err() {
                    return;
                }
            }
            f = ws.next() => match f {
                Some(Ok(_)) => {}
                _ => return,
            },
        }
    }
}

/// `--name N` from the command line, or `default`.
pub fn arg(name: &str, default: usize) -> Result<usize> {
    let argv: Vec<String> = std::env::args().collect();
    match argv.iter().position(|a| a == name) {
        Some(i) => argv
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} needs a number")),
        None => Ok(default),
    }
}

/// A simulated edge node's TLS client configuration, its certificate (`CN=system:node:{name}`)
/// signed here with the CA of a data directory.
pub fn signed_node_tls(
    ca_pem: &str,
    ca_key: &str,
    name: &str,
) -> Result<Arc<tokio_rustls::rustls::ClientConfig>> {
    let (cert, key) = pki::sign_leaf(
        ca_pem,
        ca_key,
        &format!("system:node:{name}"),
        Some("system:nodes"),
        &[],
        false,
        1,
    )?;
    node_tls(ca_pem, &cert, &key)
}

/// Processes killed (and waited for) when this is dropped.
pub struct Kill(pub Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `bin` with `args` in `dir`, its standard error in `dir/{log}`.
pub fn spawn(
    bin: &std::path::Path,
    args: &[&str],
    dir: &std::path::Path,
    log: &str,
) -> Result<Child> {
    Command::new(bin)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(log))?)
        .spawn()
        .with_context(|| format!("cannot start {}", bin.display()))
}

/// A `cloudcore` of the built binaries, serving from `dir` (data in `dir/cloud`).
pub struct Cloud {
    /// cloudhub's websocket port and its certificate port.
    pub hub: u16,
    pub certs: u16,
    /// A client of its API, as its admin.
    pub client: kube::Client,
    /// A join token for edge nodes.
    pub token: String,
}

impl Cloud {
    /// The config of an edgecore `edge-node-1` joined to this cloud (data in `edge`, no
    /// manifests, the DMI socket `dmi.sock`) with its HTTP and MQTT ports: `cloud` more keys of
    /// its cloud section (`, key: value`), `more` YAML lines after it.
    pub fn edge_config(&self, http: u16, mqtt: u16, cloud: &str, more: &str) -> String {
        format!(
            "nodeName: edge-node-1\ndataDir: edge\nmodules: {{manifests: false}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:{mqtt}\"}}\nhttp: {{address: \"127.0.0.1:{http}\"}}\ndmi: {{socket: dmi.sock}}\ncloud: {{server: \"wss://127.0.0.1:{}\", certServer: \"https://127.0.0.1:{}\", token: \"{}\"{cloud}}}\n{more}",
            self.hub,
            self.certs,
            self.token.trim()
        )
    }
}

/// Starts `cloudcore` from `bins` in `dir` (killed with `kill`), once its API and certificate
/// port answer.
pub async fn start_cloud(
    bins: &std::path::Path,
    dir: &std::path::Path,
    kill: &mut Kill,
) -> Result<Cloud> {
    let free = sim::free_port;
    let (api, hub, certs) = (free(), free(), free());
    std::fs::write(
        dir.join("cloudcore.yaml"),
        format!(
            "dataDir: cloud\nmodules:\n  apiserver:\n    listen: \"127.0.0.1:{api}\"\n  cloudHub:\n    listen: \"127.0.0.1:{hub}\"\n    certListen: \"127.0.0.1:{certs}\"\n  metrics:\n    listen: \"\"\n"
        ),
    )?;
    kill.0.push(spawn(
        &bins.join("cloudcore"),
        &["--config", "cloudcore.yaml"],
        dir,
        "cloudcore.log",
    )?);
    let kubeconfig = dir.join("cloud/admin.kubeconfig");
    let t0 = Instant::now();
    while !(kubeconfig.exists() && std::net::TcpStream::connect(("127.0.0.1", certs)).is_ok()) {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "cloudcore did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let client = cloud::cluster_client(&kubeconfig).await?;
    let token = String::from_utf8(
        Command::new(bins.join("cloudcore"))
            .args(["gettoken", "--config"])
            .arg(dir.join("cloudcore.yaml"))
            .output()?
            .stdout,
    )?;
    Ok(Cloud {
        hub,
        certs,
        client,
        token,
    })
}

/// Round times in milliseconds as the benches print them: p50, p99, max and their count.
pub fn percentiles(mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} rounds)",
        sim::percentile(&v, 50.0),
        sim::percentile(&v, 99.0),
        v.last().copied().unwrap_or(0.0),
        v.len()
    )
}

/// Starts `edgecore` on `dir/edgecore.yaml` (written by the caller) and, once its DMI socket is
/// there, `mapper-modbus` registered with it (both killed with `kill`).
pub async fn start_edge_and_modbus_mapper(
    bins: &std::path::Path,
    dir: &std::path::Path,
    kill: &mut Kill,
) -> Result<()> {
    kill.0.push(spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        dir,
        "edgecore.log",
    )?);
    let t0 = Instant::now();
    while !dir.join("dmi.sock").exists() {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(60),
            "edgecore did not start; its log is in {}",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::write(
        dir.join("mapper.yaml"),
        format!(
            "grpc_server:\n  socket_path: modbus.sock\ncommon:\n  name: modbus-mapper\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: modbus\n  address: 127.0.0.1\n  edgecore_sock: dmi.sock\n  http_port: {}\n  data_dir: mapper-data\n",
            sim::free_port()
        ),
    )?;
    kill.0.push(spawn(
        &bins.join("mapper-modbus"),
        &["--config-file", "mapper.yaml"],
        dir,
        "mapper.log",
    )?);
    Ok(())
}

/// The reported value of `prop` in a `DeviceStatus`.
pub fn reported(st: &kube::api::DynamicObject, prop: &str) -> Option<String> {
    st.data["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == prop)?["reported"]["value"]
        .as_str()
        .map(str::to_string)
}

/// Waits (reading every 10 ms, for at most 30 s) until `DeviceStatus` `device` reports `value`
/// for `prop`; the milliseconds it took from `since`.
pub async fn until_reported(
    statuses: &kube::Api<kube::api::DynamicObject>,
    device: &str,
    prop: &str,
    value: &str,
    since: Instant,
) -> Result<f64> {
    loop {
        if let Ok(st) = statuses.get(device).await
            && reported(&st, prop).as_deref() == Some(value)
        {
            return Ok(since.elapsed().as_secs_f64() * 1000.0);
        }
        anyhow::ensure!(
            since.elapsed() < Duration::from_secs(30),
            "value {value} never reached DeviceStatus {device}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `n`th device of edgecore's benches (`edgecore-bench`, `history-bench`): `default/dev-{n}`.
pub fn device_id(n: usize) -> api::paths::DeviceId {
    api::paths::DeviceId::new("default", format!("dev-{n}"))
}

/// Device `n` of model `m` with `props` properties `p0`.. of one type.
pub fn device_decl(
    n: usize,
    props: usize,
    value_type: api::v1beta1::PropertyType,
    writable: bool,
) -> twin::engine::DeviceDecl {
    twin::engine::DeviceDecl {
        id: device_id(n),
        description: String::new(),
        model: "m".into(),
        protocol: "modbus".into(),
        properties: (0..props)
            .map(|p| twin::engine::PropertyDecl {
                name: format!("p{p}"),
                value_type,
                writable,
                desired: None,
                minimum: None,
                maximum: None,
                unit: None,
            })
            .collect(),
    }
}
