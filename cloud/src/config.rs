//! `cloudcore`'s configuration file (YAML). Every key has a default, so `cloudcore` with no
//! file runs on a fresh machine; relative paths are taken from the directory of the file.
//!
//! ```yaml
//! dataDir: /var/lib/cloudcore        # default: ./cloudcore-data
//! kubeconfig: /root/.kube/config     # a real cluster instead of the embedded API (default: none;
//!                                    #   in-cluster: the pod's ServiceAccount, cloud/deploy/)
//! modules:
//!   apiserver:                       # the embedded Kubernetes-compatible API
//!     enable: true
//!     listen: "127.0.0.1:6443"       # "0.0.0.0:6443" to reach it from other machines
//!     sans: [cloud.example.com]      # more names/addresses for its certificate
//!     watchHistory: 10000            # events kept for watches to resume from (older: 410 Gone)
//!     maxBodyBytes: 3145728          # larger request bodies get 413
//!     bookmarkIntervalSeconds: 60
//!     fsync: false                   # true: fsync every commit (survives power loss)
//!     etcd:                          # keep the objects in etcd instead of SQLite (replicas)
//!       endpoints: [http://10.0.0.1:2379, http://10.0.0.2:2379, http://10.0.0.3:2379]
//!       prefix: /cloudcore/          # the keys' prefix (several fleets can share one etcd)
//!       compactEverySeconds: 300     # etcd's history is compacted to where it was one period ago
//!       caFile: etcd-ca.crt          # https:// endpoints: etcd's CA, and this replica's client
//!       certFile: etcd-client.crt    #   certificate and key (etcd's --client-cert-auth)
//!       keyFile: etcd-client.key
//!   deviceController:                # devices to their nodes, reports into DeviceStatus
//!     enable: true
//!     patchIntervalMs: 100           # at most one DeviceStatus patch per device per interval
//!     maxInFlight: 128               # API writes at once
//!     profiles: true                 # per-node device-profile-config-{node} ConfigMaps
//!   cloudHub:                        # edge nodes: websocket sessions and joining by token
//!     enable: true
//!     listen: "0.0.0.0:10000"        # wss://HOST:10000/{projectID}/{node}/events
//!     certListen: "0.0.0.0:10002"    # https://HOST:10002/ca.crt and /edge.crt
//!     advertiseAddress: [192.0.2.10] # names/addresses edges use (added to the certificate)
//!     nodeLimit: 1000                # sessions at once
//!     maxFrameBytes: 33554432        # larger frames close the session (KubeEdge: 32 MiB)
//!     keepaliveSeconds: 30           # a silent session is closed after this
//!     nodeQps: 200                   # reports/s a node may send (burst nodeBurst: 400); its
//!                                    #   answers and keepalives are not counted
//!     resendSeconds: 5               # unacknowledged messages are sent again after this
//!     tokenTtlHours: 24              # validity of `cloudcore gettoken` tokens
//!     edgeCertDays: 365
//!   leaderElection:                  # replicas: who runs the controllers that run once
//!     enable: auto                   # auto: on with `etcd` or `kubeconfig`; true; false
//!     namespace: kubeedge            # the coordination.k8s.io Lease...
//!     name: cloudcore                # ...and its name
//!     identity: ""                   # this replica's holderIdentity (default: host name + a random id)
//!     leaseDurationSeconds: 15       # a leader silent this long is replaced
//!     renewSeconds: 5                # the leader renews this often
//!   admissionWebhook:                # with kubeconfig: the cluster's API server asks cloudcore
//!     enable: auto                   #   whether a Device's desired values can land (auto: on
//!                                    #   with kubeconfig); served on certListen
//!     url: ""                        # what the API server calls; default
//!                                    #   https://{advertiseAddress[0]}:{certListen port}/admission/devices
//!     failurePolicy: Ignore          # Fail: no Device write while cloudcore is unreachable
//!   cloudStream:                     # a real cluster's `kubectl logs/exec/attach/port-forward`
//!     enable: auto                   #   of edge pods: the kubelet's endpoints the API server
//!                                    #   calls (auto: on when clientCaFile is given)
//!     listen: "0.0.0.0:10003"        # where the API server's node connections are sent (a DNAT
//!                                    #   of each edge node's port 10350: docs/real-cluster.md)
//!     clientCaFile: /etc/kubernetes/pki/ca.crt  # the CA of the API server's kubelet client
//!                                    #   certificate (--kubelet-client-certificate)
//!     certFile: ""                   # the serving certificate and key; default: one signed by
//!     keyFile: ""                    #   cloudcore's CA for advertiseAddress
//!   metrics:
//!     listen: "127.0.0.1:9091"       # Prometheus /metrics (plain HTTP); "" turns it off
//! ```

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use rt::config::{ConfigError, ConfigFile};

/// `kubeconfig: in-cluster`: the cluster cloudcore runs in as a pod.
pub const IN_CLUSTER: &str = "in-cluster";

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// The embedded API's database, certificates and admin kubeconfig.
    pub data_dir: PathBuf,
    /// A kubeconfig of a real cluster; when set, the embedded API does not start.
    pub kubeconfig: Option<PathBuf>,
    pub modules: Modules,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("cloudcore-data"),
            kubeconfig: None,
            modules: Modules::default(),
        }
    }
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Modules {
    pub apiserver: ApiServer,
    pub device_controller: DeviceController,
    pub edge_controller: Switch,
    pub daemon_set_controller: Switch,
    pub cloud_hub: CloudHub,
    pub leader_election: LeaderElection,
    pub admission_webhook: AdmissionWebhook,
    pub cloud_stream: CloudStream,
    pub metrics: MetricsModule,
}

/// The kubelet's streaming endpoints of edge nodes, for a real cluster's API server
/// (`modules.cloudStream`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudStream {
    /// `auto` (on when `clientCaFile` is given), `true` or `false`.
    pub enable: Auto,
    pub listen: SocketAddr,
    /// The CA whose client certificates are taken (the API server's kubelet client's).
    pub client_ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl Default for CloudStream {
    fn default() -> Self {
        Self {
            enable: Auto::Auto,
            listen: SocketAddr::from(([0, 0, 0, 0], 10003)),
            client_ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

/// The validating admission webhook a real cluster's API server calls on Device writes
/// (`modules.admissionWebhook`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AdmissionWebhook {
    /// `auto` (on with `kubeconfig`), `true` or `false`.
    pub enable: Auto,
    /// The URL the API server calls; empty: from `cloudHub.advertiseAddress` and `certListen`.
    pub url: String,
    /// `Ignore` or `Fail`: what the API server does when cloudcore does not answer.
    pub failure_policy: String,
}

impl Default for AdmissionWebhook {
    fn default() -> Self {
        Self {
            enable: Auto::Auto,
            url: String::new(),
            failure_policy: "Ignore".into(),
        }
    }
}

/// Leader election among replicas (`modules.leaderElection`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElection {
    /// `auto` (on when the objects are shared: `etcd` or `kubeconfig`), `true` or `false`.
    pub enable: Auto,
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration_seconds: u64,
    pub renew_seconds: u64,
}

/// `auto`, `true` or `false`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Auto {
    #[default]
    Auto,
    On,
    Off,
}

impl<'de> Deserialize<'de> for Auto {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Bool(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Bool(true) => Ok(Self::On),
            Raw::Bool(false) => Ok(Self::Off),
            Raw::Text(t) if t == "auto" => Ok(Self::Auto),
            Raw::Text(t) => Err(serde::de::Error::custom(format!(
                "{t:?}: expected auto, true or false"
            ))),
        }
    }
}

impl Default for LeaderElection {
    fn default() -> Self {
        Self {
            enable: Auto::Auto,
            namespace: "kubeedge".into(),
            name: "cloudcore".into(),
            identity: String::new(),
            lease_duration_seconds: 15,
            renew_seconds: 5,
        }
    }
}

/// A module that is on unless `enable: false`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Switch {
    pub enable: bool,
}

impl Default for Switch {
    fn default() -> Self {
        Self { enable: true }
    }
}

/// cloudhub: the edge nodes' websocket sessions and the certificate server they join through.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CloudHub {
    pub enable: bool,
    /// The websocket server (TLS, client certificates required).
    pub listen: SocketAddr,
    /// The certificate server: `/ca.crt`, `/edge.crt`.
    pub cert_listen: SocketAddr,
    /// Names and addresses the edge nodes reach the cloud by (in the serving certificate).
    pub advertise_address: Vec<String>,
    /// Sessions at once; more are refused.
    pub node_limit: usize,
    /// Frames larger than this close the session.
    pub max_frame_bytes: usize,
    /// A session silent this long is closed.
    pub keepalive_seconds: u64,
    /// Messages per second a node may send, and the burst above it.
    pub node_qps: u32,
    pub node_burst: u32,
    /// A message not acknowledged within this is sent again.
    pub resend_seconds: u64,
    /// How long a token of `cloudcore gettoken` is valid.
    pub token_ttl_hours: u64,
    /// How long an edge certificate is valid.
    pub edge_cert_days: i64,
    /// Streams (`kubectl logs`) open at once through one node's tunnel; one more is refused
    /// (429). One user holds at most half of them.
    pub streams_per_node: usize,
    /// A stream that carries nothing either way for this long is closed (the kubelet's
    /// streaming-connection-idle-timeout, 4 h).
    pub stream_idle_seconds: u64,
}

impl Default for CloudHub {
    fn default() -> Self {
        Self {
            enable: true,
            listen: SocketAddr::from(([0, 0, 0, 0], 10000)),
            cert_listen: SocketAddr::from(([0, 0, 0, 0], 10002)),
            advertise_address: Vec::new(),
            node_limit: 1000,
            max_frame_bytes: 32 << 20,
            keepalive_seconds: 30,
            node_qps: 200,
            node_burst: 400,
            resend_seconds: 5,
            token_ttl_hours: 24,
            edge_cert_days: 365,
            streams_per_node: 16,
            stream_idle_seconds: 4 * 3600,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DeviceController {
    pub enable: bool,
    pub patch_interval_ms: u64,
    pub max_in_flight: usize,
    pub profiles: bool,
}

impl Default for DeviceController {
    fn default() -> Self {
        let d = devicecontroller::controller::Config::default();
        Self {
            enable: true,
            patch_interval_ms: d.patch_interval.as_millis() as u64,
            max_in_flight: d.max_in_flight,
            profiles: d.profiles,
        }
    }
}

impl DeviceController {
    pub fn config(&self) -> devicecontroller::controller::Config {
        devicecontroller::controller::Config {
            patch_interval: std::time::Duration::from_millis(self.patch_interval_ms),
            max_in_flight: self.max_in_flight,
            profiles: self.profiles,
            ..devicecontroller::controller::Config::default()
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MetricsModule {
    /// `host:port` of the Prometheus endpoint; empty: none.
    pub listen: String,
}

impl Default for MetricsModule {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:9091".into(),
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ApiServer {
    pub enable: bool,
    pub listen: SocketAddr,
    pub sans: Vec<String>,
    pub watch_history: usize,
    pub max_body_bytes: usize,
    pub bookmark_interval_seconds: u64,
    pub fsync: bool,
    /// etcd instead of the SQLite file: what several replicas share.
    pub etcd: Option<Etcd>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Etcd {
    pub endpoints: Vec<String>,
    pub prefix: String,
    pub compact_every_seconds: u64,
    /// TLS to etcd: its CA, and this replica's client certificate and key (PEM files).
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl Default for Etcd {
    fn default() -> Self {
        let d = apiserver::EtcdOptions::default();
        Self {
            endpoints: d.endpoints,
            prefix: d.prefix,
            compact_every_seconds: d.compact_every.as_secs(),
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl Default for ApiServer {
    fn default() -> Self {
        let d = apiserver::Config::default();
        Self {
            enable: true,
            listen: d.listen,
            sans: Vec::new(),
            watch_history: d.history,
            max_body_bytes: d.max_body,
            bookmark_interval_seconds: d.bookmark_every.as_secs(),
            fsync: false,
            etcd: None,
        }
    }
}

impl Config {
    /// Parses config text; `file` only names it in errors.
    pub fn parse(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        let invalid = |key: String, message: String| ConfigError::invalid(file, key, message);
        let mut config: Config = rt::config::parse(text, file)?;
        let abs = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        config.data_dir = abs(&config.data_dir);
        if let Some(k) = &config.kubeconfig
            && k != Path::new(IN_CLUSTER)
        {
            config.kubeconfig = Some(abs(k));
        }
        if let Some(e) = config.modules.apiserver.etcd.as_mut() {
            for f in [&mut e.ca_file, &mut e.cert_file, &mut e.key_file]
                .into_iter()
                .flatten()
            {
                *f = abs(f);
            }
        }
        let cs = &mut config.modules.cloud_stream;
        for f in [&mut cs.client_ca_file, &mut cs.cert_file, &mut cs.key_file]
            .into_iter()
            .flatten()
        {
            *f = abs(f);
        }
        if cs.enable == Auto::On && cs.client_ca_file.is_none() {
            return Err(invalid(
                "modules.cloudStream.clientCaFile".into(),
                "give the CA of the API server's kubelet client certificate (kubeadm: /etc/kubernetes/pki/ca.crt): only clients it signed may stream".into(),
            ));
        }
        if cs.cert_file.is_some() != cs.key_file.is_some() {
            return Err(invalid(
                "modules.cloudStream.certFile".into(),
                "certFile and keyFile go together".into(),
            ));
        }
        let a = &config.modules.apiserver;
        if a.watch_history < 100 {
            return Err(invalid(
                "modules.apiserver.watchHistory".into(),
                format!("{} is too small: at least 100 events", a.watch_history),
            ));
        }
        if a.max_body_bytes < 4096 {
            return Err(invalid(
                "modules.apiserver.maxBodyBytes".into(),
                format!("{} is too small: at least 4096 bytes", a.max_body_bytes),
            ));
        }
        let w = &config.modules.admission_webhook;
        if !matches!(w.failure_policy.as_str(), "Ignore" | "Fail") {
            return Err(invalid(
                "modules.admissionWebhook.failurePolicy".into(),
                format!("{:?}: expected Ignore or Fail", w.failure_policy),
            ));
        }
        if !w.url.is_empty() && !w.url.starts_with("https://") {
            return Err(invalid(
                "modules.admissionWebhook.url".into(),
                format!("{:?}: an API server calls webhooks over https://", w.url),
            ));
        }
        if a.bookmark_interval_seconds == 0 {
            return Err(invalid(
                "modules.apiserver.bookmarkIntervalSeconds".into(),
                "must be at least 1".into(),
            ));
        }
        if let Some(e) = &a.etcd {
            if e.endpoints.is_empty() {
                return Err(invalid(
                    "modules.apiserver.etcd.endpoints".into(),
                    "give at least one member's client URL (http://HOST:2379)".into(),
                ));
            }
            if e.cert_file.is_some() != e.key_file.is_some() {
                return Err(invalid(
                    "modules.apiserver.etcd.certFile".into(),
                    "certFile and keyFile go together".into(),
                ));
            }
            if (e.cert_file.is_some() || e.endpoints.iter().any(|u| u.starts_with("https://")))
                && e.ca_file.is_none()
            {
                return Err(invalid(
                    "modules.apiserver.etcd.caFile".into(),
                    "TLS to etcd needs the CA that signed etcd's certificate".into(),
                ));
            }
            if !e.prefix.starts_with('/') {
                return Err(invalid(
                    "modules.apiserver.etcd.prefix".into(),
                    format!("{:?} must start with /", e.prefix),
                ));
            }
        }
        let le = &config.modules.leader_election;
        if le.renew_seconds == 0 || le.renew_seconds * 2 > le.lease_duration_seconds {
            return Err(invalid(
                "modules.leaderElection.renewSeconds".into(),
                format!(
                    "{} must be at least 1 and at most half of leaseDurationSeconds ({})",
                    le.renew_seconds, le.lease_duration_seconds
                ),
            ));
        }
        if config.modules.device_controller.max_in_flight == 0 {
            return Err(invalid(
                "modules.deviceController.maxInFlight".into(),
                "must be at least 1".into(),
            ));
        }
        let m = &config.modules.metrics.listen;
        if !m.is_empty() && m.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "modules.metrics.listen".into(),
                format!("{m:?} is not host:port"),
            ));
        }
        if config.kubeconfig.is_none() && !a.enable {
            return Err(invalid(
                "modules.apiserver.enable".into(),
                "the embedded API can only be turned off when `kubeconfig` names a cluster".into(),
            ));
        }
        Ok(config)
    }

    /// Whether replicas elect a leader: on `auto`, when the objects are shared with other
    /// replicas (etcd, or a cluster).
    /// Whether cloudcore serves and registers the admission webhook, and the URL it registers
    /// (`None` when there is none to give: no `url` and no `advertiseAddress`).
    pub fn admission_webhook(&self) -> Option<Option<String>> {
        let w = &self.modules.admission_webhook;
        let on = match w.enable {
            Auto::On => true,
            Auto::Off => false,
            Auto::Auto => self.kubeconfig.is_some(),
        };
        if !on || !self.modules.cloud_hub.enable {
            return None;
        }
        if !w.url.is_empty() {
            return Some(Some(w.url.clone()));
        }
        let hub = &self.modules.cloud_hub;
        Some(hub.advertise_address.first().map(|host| {
            let host = if host.contains(':') {
                format!("[{host}]")
            } else {
                host.clone()
            };
            format!(
                "https://{host}:{}/admission/devices",
                hub.cert_listen.port()
            )
        }))
    }

    /// Whether cloudcore serves the kubelet's streaming endpoints (with cloudhub only: the
    /// streams go through its tunnels).
    pub fn cloud_stream(&self) -> bool {
        let c = &self.modules.cloud_stream;
        self.modules.cloud_hub.enable
            && match c.enable {
                Auto::On => true,
                Auto::Off => false,
                Auto::Auto => c.client_ca_file.is_some(),
            }
    }

    pub fn elects_leader(&self) -> bool {
        match self.modules.leader_election.enable {
            Auto::On => true,
            Auto::Off => false,
            Auto::Auto => self.kubeconfig.is_some() || self.modules.apiserver.etcd.is_some(),
        }
    }

    /// The election's settings; the identity is the host name and a random id unless set.
    pub fn leader_settings(&self) -> crate::leader::Settings {
        let le = &self.modules.leader_election;
        let identity = if le.identity.is_empty() {
            let host = rt::host::name().unwrap_or_else(|| "cloudcore".into());
            format!("{host}_{}", uuid::Uuid::new_v4())
        } else {
            le.identity.clone()
        };
        crate::leader::Settings {
            namespace: le.namespace.clone(),
            name: le.name.clone(),
            identity,
            lease_duration: std::time::Duration::from_secs(le.lease_duration_seconds),
            renew_every: std::time::Duration::from_secs(le.renew_seconds),
        }
    }

    /// The embedded API's settings, with the CRDs cloudcore installs (the etcd TLS files read).
    pub fn apiserver(
        &self,
        install: Vec<serde_json::Value>,
    ) -> Result<apiserver::Config, ConfigError> {
        let a = &self.modules.apiserver;
        let read = |key: &str, p: &Option<PathBuf>| -> Result<Option<String>, ConfigError> {
            p.as_ref()
                .map(|p| {
                    std::fs::read_to_string(p).map_err(|e| ConfigError::Invalid {
                        file: p.clone(),
                        key: format!("modules.apiserver.etcd.{key}"),
                        message: format!("cannot read {}: {e}", p.display()),
                    })
                })
                .transpose()
        };
        let tls = match &a.etcd {
            Some(e) if e.ca_file.is_some() => Some(apiserver::EtcdTls {
                ca: read("caFile", &e.ca_file)?.unwrap_or_default(),
                cert: read("certFile", &e.cert_file)?,
                key: read("keyFile", &e.key_file)?,
            }),
            _ => None,
        };
        Ok(apiserver::Config {
            data_dir: self.data_dir.clone(),
            listen: a.listen,
            sans: a.sans.clone(),
            history: a.watch_history,
            max_body: a.max_body_bytes,
            bookmark_every: std::time::Duration::from_secs(a.bookmark_interval_seconds),
            fsync: a.fsync,
            install,
            etcd: a.etcd.as_ref().map(|e| apiserver::EtcdOptions {
                endpoints: e.endpoints.clone(),
                prefix: e.prefix.clone(),
                compact_every: std::time::Duration::from_secs(e.compact_every_seconds),
                tls: tls.clone(),
            }),
            leader: None,
            revoked: None,
            pages: Some(crate::ui::pages()),
            subresources: Vec::new(),
            externals: Vec::new(),
        })
    }
}

impl ConfigFile for Config {
    fn parse_text(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        Self::parse(text, file, base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/cloudcore.yaml"), Path::new("/etc"))
    }

    #[test]
    fn empty_text_gives_the_defaults() {
        let c = parse("").expect("defaults");
        assert_eq!(c.data_dir, Path::new("/etc/cloudcore-data"));
        assert_eq!(c.modules.apiserver.listen.port(), 6443);
        assert!(c.kubeconfig.is_none());
    }

    #[test]
    fn in_cluster_is_a_kubeconfig_of_its_own_and_a_path_is_made_absolute() {
        let c = parse("kubeconfig: in-cluster\n").expect("in-cluster");
        assert_eq!(c.kubeconfig.as_deref(), Some(Path::new(IN_CLUSTER)));
        let c = parse("kubeconfig: k.yaml\n").expect("a file");
        assert_eq!(c.kubeconfig.as_deref(), Some(Path::new("/etc/k.yaml")));
    }

    #[test]
    fn cloud_stream_is_on_with_a_client_ca_and_needs_one() {
        assert!(!parse("").expect("defaults").cloud_stream());
        let c = parse("modules:\n  cloudStream:\n    clientCaFile: pki/ca.crt\n").expect("on");
        assert!(c.cloud_stream());
        assert_eq!(
            c.modules.cloud_stream.client_ca_file.as_deref(),
            Some(Path::new("/etc/pki/ca.crt"))
        );
        assert_eq!(c.modules.cloud_stream.listen.port(), 10003);
        let e = parse("modules:\n  cloudStream:\n    enable: true\n").expect_err("no CA");
        assert!(
            e.to_string().contains("modules.cloudStream.clientCaFile"),
            "{e}"
        );
        let e = parse("modules:\n  cloudStream:\n    clientCaFile: a\n    certFile: b\n")
            .expect_err("no key");
        assert!(e.to_string().contains("certFile and keyFile"), "{e}");
        let off = "modules:\n  cloudStream:\n    clientCaFile: a\n  cloudHub:\n    enable: false\n";
        assert!(
            !parse(off).expect("off").cloud_stream(),
            "no tunnels without cloudhub"
        );
    }

    #[test]
    fn the_admission_webhook_is_on_with_a_kubeconfig_at_the_advertised_address() {
        assert_eq!(parse("").expect("defaults").admission_webhook(), None);
        let c = parse("kubeconfig: k\n").expect("cluster");
        assert_eq!(
            c.admission_webhook(),
            Some(None),
            "served, nothing to register"
        );
        let c = parse(
            "kubeconfig: k\nmodules:\n  cloudHub:\n    advertiseAddress: [cloud.example.com]\n",
        )
        .expect("cluster");
        assert_eq!(
            c.admission_webhook(),
            Some(Some(
                "https://cloud.example.com:10002/admission/devices".into()
            ))
        );
        let c = parse("kubeconfig: k\nmodules:\n  admissionWebhook:\n    enable: false\n")
            .expect("off");
        assert_eq!(c.admission_webhook(), None);
        for (bad, key) in [
            ("url: http://x/", "url"),
            ("failurePolicy: Sometimes", "failurePolicy"),
        ] {
            let e = parse(&format!("modules:\n  admissionWebhook:\n    {bad}\n")).expect_err(bad);
            assert!(
                e.to_string()
                    .contains(&format!("key `modules.admissionWebhook.{key}`")),
                "{e}"
            );
        }
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let e = parse("modules:\n  apiserver:\n    listen: nowhere\n").expect_err("bad address");
        assert!(
            e.to_string()
                .starts_with("config file /etc/cloudcore.yaml: key `modules.apiserver.listen`"),
            "{e}"
        );
        let e = parse("modules:\n  apiserver:\n    lisen: x\n").expect_err("typo");
        assert!(
            e.to_string().contains("key `modules.apiserver.lisen`"),
            "{e}"
        );
        let e = parse("modules:\n  apiserver:\n    enable: false\n").expect_err("no API at all");
        assert!(
            e.to_string().contains("key `modules.apiserver.enable`"),
            "{e}"
        );
        let e = parse("modules:\n  apiserver:\n    watchHistory: 5\n").expect_err("tiny");
        assert!(e.to_string().contains("watchHistory"), "{e}");
    }

    #[test]
    fn etcd_and_leader_election() {
        let c = parse("modules:\n  apiserver:\n    etcd:\n      endpoints: [http://a:2379]\n")
            .expect("etcd");
        assert!(c.elects_leader(), "auto is on with etcd");
        let api = c.apiserver(Vec::new()).expect("apiserver config");
        assert_eq!(api.etcd.expect("etcd").prefix, "/cloudcore/");
        assert!(
            !parse("").expect("defaults").elects_leader(),
            "alone: no election"
        );
        let off = parse("modules:\n  apiserver:\n    etcd: {endpoints: [http://a:2379]}\n  leaderElection: {enable: false}\n").expect("off");
        assert!(!off.elects_leader());
        let e =
            parse("modules:\n  apiserver:\n    etcd: {endpoints: []}\n").expect_err("no members");
        assert!(
            e.to_string().contains("modules.apiserver.etcd.endpoints"),
            "{e}"
        );
        let e = parse("modules:\n  leaderElection: {enable: maybe}\n").expect_err("not auto");
        assert!(
            e.to_string().contains("expected auto, true or false"),
            "{e}"
        );
        let e =
            parse("modules:\n  leaderElection: {renewSeconds: 10}\n").expect_err("renew too slow");
        assert!(e.to_string().contains("renewSeconds"), "{e}");
    }
}
