//! Runs the crate's own `apiserver` binary on a temporary data directory, with the project's
//! CRDs installed (as cloudcore installs them), and the real `kubectl` against it.
//!
//! With `APISERVER_STORE=etcd` every server keeps its objects in a real etcd of its own
//! (Debian's `etcd-server`) instead of SQLite: the same tests, on the other store
//! (`scripts/test` runs them both ways).
#![allow(dead_code)]

pub mod cases;
pub mod harness;

pub use harness::*;
use std::path::Path;
use std::process::Command;

/// The CRDs cloudcore installs: the device API's (generated from `api`'s types) and
/// KubeEdge's ObjectSync ones (`cloud/crds/`), as one YAML file.
fn write_crds(file: &Path) {
    let mut yaml = String::new();
    for crd in api::crd::crds() {
        yaml.push_str("---\n");
        yaml.push_str(&serde_yaml_ng::to_string(&crd).expect("a CRD as YAML"));
    }
    let dir = workspace().join("cloud/crds");
    for entry in std::fs::read_dir(&dir).expect("cloud/crds") {
        let path = entry.expect("an entry").path();
        yaml.push_str("---\n");
        yaml.push_str(&std::fs::read_to_string(&path).expect("a CRD file"));
        yaml.push('\n');
    }
    std::fs::write(file, yaml).expect("CRDs written");
}

/// A running `apiserver`; kubectl as its admin through `Deref` (`server.ok(&["get", ...])`).
pub struct Server {
    pub dir: std::path::PathBuf,
    pub port: u16,
    pub kubeconfig: std::path::PathBuf,
    kube: Kubectl,
    args: Vec<String>,
    starts: usize,
    process: Process,
    /// The etcd the server keeps its objects in, on the etcd store.
    pub etcd: Option<sim::etcd::EtcdCluster>,
    /// Its members' URLs (of `etcd`, or of one shared with other servers).
    etcd_urls: Vec<String>,
    /// Environment of the server's process beyond the tests' own (fault injection).
    env: Vec<(String, String)>,
    _tmp: tempfile::TempDir,
}

/// Whether these tests run on the etcd store (`APISERVER_STORE=etcd`).
pub fn on_etcd() -> bool {
    std::env::var("APISERVER_STORE").is_ok_and(|s| s == "etcd")
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts with extra command-line `args` (`--watch-history 100`).
    pub fn start_with(args: &[&str]) -> Self {
        let etcd = on_etcd().then(|| sim::etcd::EtcdCluster::start(1).expect("etcd starts"));
        Self::start_on(args, etcd, Vec::new())
    }

    /// Starts on an etcd shared with other servers.
    pub fn start_shared(etcd: &sim::etcd::EtcdCluster) -> Self {
        Self::start_on(&[], None, etcd.endpoints())
    }

    /// [`Server::start_shared`] with a view that follows etcd `ms` late (fault injection:
    /// `APISERVER_FAULT_VIEW_LAG_MS`), as a server's view under a fleet's load is.
    pub fn start_shared_lagging(etcd: &sim::etcd::EtcdCluster, ms: u64) -> Self {
        Self::start_with_env(
            &[],
            etcd.endpoints(),
            vec![("APISERVER_FAULT_VIEW_LAG_MS".into(), ms.to_string())],
        )
    }

    /// [`Server::start_shared`] with more command-line `args`.
    pub fn start_shared_with(etcd: &sim::etcd::EtcdCluster, args: &[&str]) -> Self {
        Self::start_on(args, None, etcd.endpoints())
    }

    fn start_on(
        args: &[&str],
        etcd: Option<sim::etcd::EtcdCluster>,
        etcd_urls: Vec<String>,
    ) -> Self {
        Self::start_full(args, etcd, etcd_urls, Vec::new())
    }

    fn start_with_env(args: &[&str], etcd_urls: Vec<String>, env: Vec<(String, String)>) -> Self {
        Self::start_full(args, None, etcd_urls, env)
    }

    fn start_full(
        args: &[&str],
        etcd: Option<sim::etcd::EtcdCluster>,
        mut etcd_urls: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Self {
        if let Some(e) = &etcd {
            etcd_urls = e.endpoints();
        }
        let tmp = tempfile::tempdir().expect("temp dir");
        write_crds(&tmp.path().join("crds.yaml"));
        let kube = Kubectl::admin_of(tmp.path());
        let mut c = Self {
            port: free_port(),
            dir: tmp.path().to_path_buf(),
            kubeconfig: kube.kubeconfig.clone(),
            kube,
            args: args.iter().map(|a| a.to_string()).collect(),
            starts: 0,
            process: Process::default(),
            etcd,
            etcd_urls,
            env,
            _tmp: tmp,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_apiserver"));
        cmd.arg("--data-dir")
            .arg(self.dir.join("data"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--install")
            .arg(self.dir.join("crds.yaml"))
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .args(
                (!self.etcd_urls.is_empty())
                    .then(|| ["--etcd".to_string(), self.etcd_urls.join(",")])
                    .into_iter()
                    .flatten(),
            );
        let log = self.dir.join("apiserver.log");
        self.process = Process::start(&mut cmd, &log);
        // It prints where its API is once it serves (CRDs installed).
        self.process
            .wait_serving("apiserver", &log, "apiserver: API at", &mut self.starts);
    }

    /// Makes the store forget its history up to now: etcd compacted (on SQLite the tests
    /// write past `--watch-history` instead).
    pub fn forget_history(&self) {
        if let Some(e) = &self.etcd {
            e.compact().expect("etcd compacts");
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
    }

    /// A kube-rs client of the admin kubeconfig.
    pub async fn client(&self) -> kube::Client {
        self.client_as(None).await
    }

    /// [`Server::client`] acting as `user` (`Impersonate-User`; the admin may impersonate).
    pub async fn client_as(&self, user: Option<&str>) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("a client config");
        config.auth_info.impersonate = user.map(str::to_string);
        kube::Client::try_from(config).expect("a kube-rs client")
    }

    pub fn data(&self) -> std::path::PathBuf {
        self.dir.join("data")
    }
}

crate::served!(Server);
