//! The cloud side of the whole-stack tests: the real `cloudcore` and the real `kubectl`.

use crate::{Proc, bin, eventually, free_port};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The real `kubectl` with `kubeconfig`, in the network of process `netns` when given
/// (`nsenter -n`: an API on a booted system's own loopback): whether it succeeded, and its stdout.
pub fn kubectl_with(kubeconfig: &Path, netns: Option<u32>, args: &[&str]) -> (bool, String) {
    let mut c = match netns {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.args(["-t", &pid.to_string(), "-n"]).arg(kubectl_bin());
            c
        }
        None => Command::new(kubectl_bin()),
    };
    let out = c
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The real `kubectl`: `$KUBECTL`, the one `.ci/run` puts in `.venv`, or the PATH's.
pub fn kubectl_bin() -> PathBuf {
    if let Some(k) = crate::env_var("KUBECTL") {
        return k.into();
    }
    let venv = crate::workspace_root().join(".venv/bin/kubectl");
    if venv.exists() {
        venv
    } else {
        "kubectl".into()
    }
}

/// cloudcore (embedded API, controllers, cloudhub) in a temporary directory, on free ports.
pub struct Cloud {
    pub dir: tempfile::TempDir,
    pub proc: Option<Proc>,
    /// The embedded API's port (HTTPS).
    pub api: u16,
    pub hub: u16,
    pub certs: u16,
}

impl Cloud {
    pub fn start() -> Self {
        Self::start_with("", "")
    }

    /// Started with more lines under `modules` (indented by 2).
    pub fn start_with_modules(modules: &str) -> Self {
        Self::start_with("", modules)
    }

    /// Started with more lines under `modules.apiserver` (indented by 4) and under `modules`
    /// (indented by 2).
    fn start_with(apiserver: &str, modules: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (api, hub, certs) = (free_port(), free_port(), free_port());
        std::fs::write(
            dir.path().join("cloudcore.yaml"),
            format!("dataDir: data\nmodules:\n  apiserver:\n    listen: \"127.0.0.1:{api}\"\n{apiserver}  cloudHub:\n    listen: \"127.0.0.1:{hub}\"\n    certListen: \"127.0.0.1:{certs}\"\n{modules}  metrics:\n    listen: \"\"\n"),
        )
        .expect("config");
        let mut c = Self {
            dir,
            proc: None,
            api,
            hub,
            certs,
        };
        c.spawn();
        c
    }

    /// One replica of a fleet on etcd (`endpoints`), named `identity` in the leader Lease
    /// (short lease times, for tests to see a leader replaced within seconds).
    pub fn start_replica(endpoints: &[String], identity: &str) -> Self {
        Self::start_with(
            &format!("    etcd:\n      endpoints: [{}]\n", endpoints.join(", ")),
            &format!(
                "  leaderElection:\n    identity: {identity}\n    leaseDurationSeconds: 6\n    renewSeconds: 2\n"
            ),
        )
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }

    pub fn spawn(&mut self) {
        let p = Proc::spawn(
            &bin("cloudcore"),
            &["--config", "cloudcore.yaml"],
            self.dir.path(),
            "cloudcore.log",
        );
        eventually(30, "cloudcore ready", || {
            (self.kubeconfig().exists() && p.log_text().contains("cloudhub at")).then_some(())
        });
        self.proc = Some(p);
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("data/admin.kubeconfig")
    }

    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(kubectl_bin())
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .output()
            .expect("kubectl runs");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let (ok, text) = self.kubectl(args);
        assert!(ok, "kubectl {args:?}: {text}");
        text
    }

    /// `kubectl apply -f -` of `yaml`: what kubectl said; a panic with it when it failed.
    pub fn apply(&self, yaml: &str) -> String {
        let mut kubectl = Command::new(kubectl_bin());
        kubectl
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(["apply", "-f", "-"]);
        let out = crate::output_with(&mut kubectl, yaml.as_bytes());
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "kubectl apply: {said}");
        said
    }

    /// `kubectl port-forward {target} :{port}` running, with `extra` arguments and `env`, once it
    /// says the local port it listens on.
    pub fn port_forward(
        &self,
        target: &str,
        port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> PortForward {
        self.port_forward_with(&kubectl_bin(), target, port, extra, env)
    }

    /// As [`Cloud::port_forward`] with the `kubectl` at `kubectl`.
    pub fn port_forward_with(
        &self,
        kubectl: &std::path::Path,
        target: &str,
        port: u16,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> PortForward {
        port_forward(kubectl, &self.kubeconfig(), target, port, extra, env)
    }

    /// `kubectl patch device NAME` giving its `index`th property the desired value `value`,
    /// whether or not it had one.
    pub fn set_desired(&self, name: &str, index: usize, value: &str) {
        self.ok(&[
            "patch",
            "device",
            name,
            "--type=json",
            "-p",
            &format!(
                r#"[{{"op":"add","path":"/spec/properties/{index}/desired","value":{{"value":"{value}"}}}}]"#
            ),
        ]);
    }

    /// `kubectl get devicestatus NAME -o json`.
    pub fn status(&self, name: &str) -> Value {
        serde_json::from_str(&self.ok(&["get", "devicestatus", name, "-o", "json"]))
            .unwrap_or(Value::Null)
    }

    /// The admin's bearer token of the embedded API (the first field of `tokens.csv`).
    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("data/tokens.csv"))
            .expect("tokens.csv")
            .split(',')
            .next()
            .unwrap_or_default()
            .to_string()
    }

    pub fn token(&self) -> String {
        self.cli(&["gettoken"])
    }

    /// `cloudcore ARGS --config` this cloud's file: its stdout, trimmed; a panic with its
    /// stderr when it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        let config = self.dir.path().join("cloudcore.yaml");
        let out = crate::run(
            Command::new(bin("cloudcore"))
                .args(args)
                .arg("--config")
                .arg(config),
        );
        out.trim().to_string()
    }

    /// An edge's config for a fleet of replicas: each one's websocket and certificate server,
    /// this one's token.
    pub fn edge_config_replicas(&self, replicas: &[&Cloud], rebalance_seconds: u64) -> String {
        let hubs: Vec<String> = replicas
            .iter()
            .map(|r| format!("wss://127.0.0.1:{}", r.hub))
            .collect();
        let certs: Vec<String> = replicas
            .iter()
            .map(|r| format!("https://127.0.0.1:{}", r.certs))
            .collect();
        format!(
            "cloud:\n  server: {}\n  certServer: {}\n  servers: [{}]\n  certServers: [{}]\n  rebalanceSeconds: {rebalance_seconds}\n  token: \"{}\"\n  heartbeatSeconds: 2\n",
            hubs[0],
            certs[0],
            hubs.join(", "),
            certs.join(", "),
            self.token()
        )
    }

    pub fn edge_config(&self) -> String {
        self.edge_config_via(self.hub)
    }

    /// The edge's config with cloudhub reached on `hub_port` (a [`Proxy`] in front of it).
    pub fn edge_config_via(&self, hub_port: u16) -> String {
        format!(
            "cloud:\n  server: wss://127.0.0.1:{}\n  certServer: https://127.0.0.1:{}\n  token: \"{}\"\n  heartbeatSeconds: 2\n",
            hub_port,
            self.certs,
            self.token()
        )
    }
}

/// A DeviceStatus twin's reported value.
pub fn reported(status: &Value, prop: &str) -> Option<String> {
    status["status"]["twins"]
        .as_array()?
        .iter()
        .find(|t| t["propertyName"] == prop)?["reported"]["value"]
        .as_str()
        .map(str::to_string)
}

/// `examples/modbus-tcp.yaml` with the device at `port`, in a temporary file.
pub fn oven_manifest(port: u16) -> PathBuf {
    let text = std::fs::read_to_string(crate::workspace_root().join("examples/modbus-tcp.yaml"))
        .expect("example")
        .replace("port: 5020", &format!("port: {port}"));
    let file = std::env::temp_dir().join(format!("oven-{port}.yaml"));
    std::fs::write(&file, text).expect("write");
    file
}

/// `kubectl port-forward {target} :{port}` with `kubeconfig`, running once it says the local port
/// it listens on.
pub fn port_forward(
    kubectl: &std::path::Path,
    kubeconfig: &std::path::Path,
    target: &str,
    port: u16,
    extra: &[&str],
    env: &[(&str, &str)],
) -> PortForward {
    use std::io::BufRead;
    let mut child = Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "port-forward",
            target,
            &format!(":{port}"),
            "--address=127.0.0.1",
        ])
        .args(extra)
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl port-forward runs");
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    // "Forwarding from 127.0.0.1:PORT -> REMOTE"
    let _ = out.read_line(&mut line);
    let local = line
        .strip_prefix("Forwarding from 127.0.0.1:")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok());
    let Some(local) = local else {
        let _ = child.kill();
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err);
        panic!("kubectl port-forward {target} :{port}: {line:?} {err}");
    };
    // The rest of its output is read as it comes, so kubectl never blocks on a full pipe.
    std::thread::spawn(move || for _ in out.lines() {});
    PortForward {
        child: Some(child),
        local,
    }
}

/// The `kubectl`s to try a client-side feature with: [`kubectl_bin`], then Debian's or the
/// PATH's `/usr/bin/kubectl` when it is there and another version (on the developers' machine,
/// 1.32 beside the pinned newest), each with its version.
pub fn kubectls() -> Vec<(PathBuf, String)> {
    let version = |k: &std::path::Path| {
        Command::new(k)
            .args(["version", "--client"])
            .output()
            .ok()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
    };
    let mut all = Vec::new();
    for k in [kubectl_bin(), PathBuf::from("/usr/bin/kubectl")] {
        if let Some(v) = version(&k)
            && !v.is_empty()
            && !all.iter().any(|(_, seen)| *seen == v)
        {
            all.push((k, v));
        }
    }
    all
}

/// A running `kubectl port-forward`; killed when dropped.
pub struct PortForward {
    pub child: Option<std::process::Child>,
    /// The local port it forwards.
    pub local: u16,
}

impl PortForward {
    /// No forward: `get` straight to a local port (what a forward is measured against).
    pub fn to(local: u16) -> Self {
        Self { child: None, local }
    }

    /// An HTTP/1.0 `GET path` through the forward: the status line and the body.
    pub fn get(&self, path: &str) -> std::io::Result<(String, Vec<u8>)> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.local))?;
        c.set_read_timeout(Some(std::time::Duration::from_secs(60)))?;
        // The Host a client of the forwarded port sends (curl http://127.0.0.1:PORT/...).
        write!(
            c,
            "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.local
        )?;
        let mut all = Vec::new();
        c.read_to_end(&mut all)?;
        let split = all
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| {
                std::io::Error::other(format!(
                    "no HTTP answer: {:?}",
                    String::from_utf8_lossy(&all)
                ))
            })?;
        let status = String::from_utf8_lossy(&all[..split])
            .lines()
            .next()
            .unwrap_or_default()
            .to_string();
        Ok((status, all[split + 4..].to_vec()))
    }

    /// kubectl's exit and what it wrote on stderr, once it ends within `secs`.
    pub fn ended(&mut self, secs: u64) -> Option<(std::process::ExitStatus, String)> {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(secs);
        let child = self.child.as_mut()?;
        while std::time::Instant::now() < until {
            if let Ok(Some(status)) = child.try_wait() {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                return Some((status, err));
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        None
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
