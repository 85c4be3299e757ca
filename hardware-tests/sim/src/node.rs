//! The test harness's processes: a child killed on drop with its log kept ([`Proc`]), and a
//! whole edgecore with its config, directory and ports ([`Node`]).

use super::*;

/// A child process killed on drop, with its log in the test directory.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(bin: &Path, args: &[&str], dir: &Path, log: &str) -> Self {
        Self::spawn_env(bin, args, dir, log, &[])
    }

    /// [`Proc::spawn`] with environment variables added.
    pub fn spawn_env(
        bin: &Path,
        args: &[&str],
        dir: &Path,
        log: &str,
        env: &[(&str, String)],
    ) -> Self {
        Self::try_spawn(bin, args, dir, log, env).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Proc::spawn_env`], or why it could not start.
    pub fn try_spawn(
        bin: &Path,
        args: &[&str],
        dir: &Path,
        log: &str,
        env: &[(&str, String)],
    ) -> Result<Self, String> {
        let log = dir.join(log);
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot write {}: {e}", log.display()))?;
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(dir)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::from(file))
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        Ok(Self { child, log })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: its processes' logs say why.
            eprintln!("----- {} -----\n{}", self.log.display(), self.log_text());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node: edgecore with its embedded broker, and the manifests directory it watches.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub edgecore: Proc,
    pub http: String,
    /// The embedded MQTT broker's port.
    pub mqtt: u16,
    pub socket: PathBuf,
    /// Where the binaries are.
    pub bins: PathBuf,
    agent: ureq::Agent,
}

impl Node {
    /// edgecore (the test build) on `manifests`.
    pub fn start(manifests: &str) -> Self {
        let edgecore = bin("edgecore");
        let bins = edgecore.parent().map(Path::to_path_buf).unwrap_or_default();
        Self::start_with(&bins, manifests)
    }

    /// edgecore from the directory `bins` on `manifests`.
    pub fn start_with(bins: &Path, manifests: &str) -> Self {
        Self::start_named(bins, "test-node", manifests, "")
    }

    /// edgecore named `node` from the directory `bins` on `manifests`, with `extra` YAML at the
    /// end of its config file (a `cloud:` section, say).
    pub fn start_named(bins: &Path, node: &str, manifests: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("manifests")).expect("mkdir");
        std::fs::write(dir.path().join("manifests/devices.yaml"), manifests).expect("manifest");
        let http_port = free_port();
        let mqtt_port = free_port();
        std::fs::write(
            dir.path().join("edgecore.yaml"),
            format!("nodeName: {node}\ndataDir: data\nmanifests: {{dir: manifests, pollIntervalMs: 200}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:{mqtt_port}\"}}\nhttp: {{address: \"127.0.0.1:{http_port}\"}}\ndmi: {{socket: dmi.sock}}\n{extra}"),
        )
        .expect("config");
        let edgecore = Proc::spawn(
            &bins.join("edgecore"),
            &["--config", "edgecore.yaml"],
            dir.path(),
            "edgecore.log",
        );
        let node = Self {
            socket: dir.path().join("dmi.sock"),
            http: format!("http://127.0.0.1:{http_port}"),
            mqtt: mqtt_port,
            agent: agent(),
            bins: bins.to_path_buf(),
            edgecore,
            dir,
        };
        eventually(30, "edgecore ready", || {
            (node.started() && node.socket.exists()).then_some(())
        });
        node
    }

    /// Kills edgecore (SIGKILL: no goodbye to the cloud); it stays down until [`Node::revive`].
    pub fn kill_edgecore(&mut self) {
        let _ = self.edgecore.child.kill();
        let _ = self.edgecore.child.wait();
    }

    /// edgecore started again on the same config and data (its log `edgecore-again.log`).
    pub fn revive(&mut self) {
        self.edgecore = Proc::spawn(
            &self.bins.join("edgecore"),
            &["--config", "edgecore.yaml"],
            self.dir.path(),
            "edgecore-again.log",
        );
        eventually(30, "edgecore ready again", || self.started().then_some(()));
    }

    /// Starts a mapper binary with a mapper-framework config pointing at this node.
    pub fn mapper(&self, bin_name: &str, protocol: &str, http_port: u16) -> Proc {
        self.mapper_env(bin_name, protocol, http_port, &[])
    }

    /// [`Node::mapper`] with environment variables added (a BLE mapper's D-Bus bus).
    pub fn mapper_env(
        &self,
        bin_name: &str,
        protocol: &str,
        http_port: u16,
        env: &[(&str, String)],
    ) -> Proc {
        self.mapper_named(
            bin_name,
            &format!("{protocol}-mapper"),
            protocol,
            http_port,
            env,
        )
    }

    /// A mapper called `name` (its socket `{name}.sock`, its log `{name}.log`), so that several
    /// mappers of one protocol can run side by side.
    pub fn mapper_named(
        &self,
        bin_name: &str,
        name: &str,
        protocol: &str,
        http_port: u16,
        env: &[(&str, String)],
    ) -> Proc {
        let socket = if name == format!("{protocol}-mapper") {
            protocol.to_string()
        } else {
            name.to_string()
        };
        let config = format!(
            "grpc_server:\n  socket_path: {socket}.sock\ncommon:\n  name: {name}\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: {protocol}\n  address: 127.0.0.1\n  edgecore_sock: dmi.sock\n  http_port: {http_port}\n  data_dir: {name}-data\n"
        );
        let file = format!("{name}.yaml");
        std::fs::write(self.dir.path().join(&file), config).expect("mapper config");
        // `cargo test --workspace` builds a package's binaries only when the package has
        // integration tests of its own; `bin` builds the missing ones.
        let path = self.bins.join(bin_name);
        let path = if path.exists() { path } else { bin(bin_name) };
        Proc::spawn_env(
            &path,
            &["--config-file", &file],
            self.dir.path(),
            &if name == format!("{protocol}-mapper") {
                format!("{bin_name}.log")
            } else {
                format!("{name}.log")
            },
            env,
        )
    }

    pub fn get(&self, path: &str) -> (u16, Value) {
        get(&self.agent, &format!("{}{path}", self.http))
    }

    /// Every module of this node's edgecore has started ([`edgecore_started`]).
    pub fn started(&self) -> bool {
        edgecore_started(&self.agent, &self.http)
    }

    pub fn twin(&self, id: &str) -> Option<Value> {
        let (status, v) = self.get(&format!("/api/v1/devices/{id}"));
        (status == 200).then_some(v)
    }

    /// `kectl ARGS` against this node; its stdout, or a panic with its stderr.
    pub fn kectl(&self, args: &[&str]) -> String {
        crate::run(
            Command::new(bin("kectl"))
                .args(args)
                .env("KECTL_SERVER", &self.http),
        )
    }
}
