//! `edgecore`'s configuration file (YAML). Every key has a default, so `edgecore` with no file
//! runs on a fresh machine; relative paths are taken from the directory of the config file.
//!
//! ```yaml
//! nodeName: edge-node-1          # default: the host name
//! nodeLabels: {site: plant-3}   # the Node's labels, sent at each session's start
//! dataDir: /var/lib/edgecore      # default: ./edgecore-data
//! modules: {eventbus: true, dmi: true, http: true, manifests: true}   # the twin always runs
//! manifests: {dir: manifests, pollIntervalMs: 1000}   # default dir: {dataDir}/manifests
//! mqtt: {mode: embedded, address: "127.0.0.1:1883", clientId: edgecore}  # or tcp://host:port
//! # the embedded broker's users and topics, in Mosquitto's files (default: anyone, any topic):
//! # mqtt: {passwordFile: mqtt.passwd, aclFile: mqtt.acl, allowAnonymous: false}
//! # and a TLS listener, client certificates as users (Mosquitto's use_identity_as_username):
//! # mqtt: {tls: {address: "0.0.0.0:8883", certFile: broker.crt, keyFile: broker.key,
//! #        caFile: clients-ca.crt, requireCertificate: true, useIdentityAsUsername: true}}
//! dmi: {socket: /etc/kubeedge/dmi.sock, maxConnections: 256}   # default: {dataDir}/dmi.sock
//! http: {address: "127.0.0.1:10360", maxConnections: 256}
//! # without http.tokenFile, only these Host names are answered besides IP addresses,
//! # localhost and the host name (DNS rebinding): http: {hosts: [gateway-3.plant.example]}
//! # the embedded broker's bounds: mqtt.maxConnections (1024), and per client
//! # mqtt.maxQueuedMessages (1000), mqtt.maxQueuedBytes (16777216), mqtt.maxInflightMessages (20)
//! # on an external broker (mode: external): a broker silent for twice mqtt.keepAliveSeconds (30)
//! # is left and joined again; mqtt.quickAck (true) acknowledges its segments at once
//! store: {synchronous: normal}                         # or full (fsync every commit)
//! twin: {maxValueBytes: 65536, maxDocumentBytes: 1048576}
//! # join a cloudcore (edgehub; none: local manifests only); the token (cloudcore gettoken) is
//! # needed only until the node has its certificate ({dataDir}/certs)
//! cloud: {server: "wss://cloud.example.com:10000", certServer: "https://cloud.example.com:10002", token: "TOKEN", heartbeatSeconds: 15}
//! # the link: reports at most qps a second (burst above it), the session made again when
//! # the cloud sends nothing (not even a pong) for keepaliveSeconds
//! #   qps: 100, burst: 200, keepaliveSeconds: 30
//! # cloudcore replicas: more addresses, tried in turn (or one name that resolves to several);
//! # the node returns to its own replica (picked by its name) within rebalanceSeconds
//! #   servers: [wss://cloud-b:10000, wss://cloud-c:10000]
//! #   certServers: [https://cloud-b:10002, https://cloud-c:10002]
//! #   rebalanceSeconds: 300
//! # run the static pods of a directory (default {dataDir}/pods) on containerd through CRI
//! edged: {runtimeEndpoint: "unix:///run/containerd/containerd.sock", staticPodPath: pods}
//! ```

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use twin::Synchronous;

pub use rt::config::{ConfigError, ConfigFile};

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// The name of this edge node; devices whose `spec.nodeName` names another node are skipped.
    pub node_name: String,
    /// Labels of this node's Node, sent when its session starts (as KubeEdge's edged
    /// registers with `nodeLabels`); a label a node may not set on itself (NodeRestriction:
    /// `node-restriction.kubernetes.io/...`, most of `kubernetes.io`) is refused here.
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// Where the twin database (`edgecore.db` and its journal `edgecore-log.db`) and the default
    /// socket live.
    pub data_dir: PathBuf,
    pub modules: Modules,
    pub manifests: Manifests,
    pub mqtt: Mqtt,
    pub dmi: Dmi,
    pub http: Http,
    pub store: StoreConfig,
    pub twin: TwinLimits,
    /// The twins' history (`edgecore-history.db` beside the twins): windows per tier and bounds.
    pub history: twin::history::HistoryConfig,
    /// The cloud this node joins (edgehub); none: local manifests only.
    pub cloud: Option<Cloud>,
    /// edged: pods run on a container runtime through CRI; none: no pods.
    pub edged: Option<Edged>,
}

/// edged's settings: its own crate's.
pub use edged::Config as Edged;

/// edgehub: how this node reaches its cloudcore.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Cloud {
    /// cloudhub's websocket server: `wss://host:10000`.
    pub server: String,
    /// The certificate server: `https://host:10002`.
    pub cert_server: String,
    /// More cloudcore replicas (after `server`): tried in turn when one cannot be reached.
    pub servers: Vec<String>,
    /// Their certificate servers, in the same order (after `certServer`).
    pub cert_servers: Vec<String>,
    /// Connected to another replica than its own (the one its name picks among them), the node
    /// goes back to its own once it answers again, at a random moment within this many seconds
    /// (so that the nodes of a replica that comes back return gradually, not all at once).
    pub rebalance_seconds: u64,
    /// From `cloudcore gettoken`; needed only until the node has its certificate.
    pub token: String,
    pub project_id: String,
    pub heartbeat_seconds: u64,
    /// The cloud sent no frame (a message, an answer, a pong to the node's ping) for this
    /// long: the session is dropped and made again (a link that went silent without closing).
    pub keepalive_seconds: u64,
    /// Reports per second this node sends upstream (twin and state messages, pod status), and
    /// the burst above it. Answers and keepalives do not count. A report carries every value
    /// of a device that changed since its last one, so at 100 a second each of 1,000 devices
    /// that change all the time reaches the cloud at least every 10 s.
    pub qps: u32,
    pub burst: u32,
    /// The node certificate is renewed (with itself, no token) when less than a fifth of its
    /// lifetime or fewer than this many days are left, whichever comes first.
    pub renew_before_days: u64,
    /// The streaming tunnel beside the session (`kubectl logs` through the cloud).
    pub streams: Streams,
    /// How often what the node and its pods use is sent up (`kubectl top`); 0: never.
    pub metrics_seconds: u64,
}

/// The streaming tunnel this node opens beside its session, on which the cloud reads its pods'
/// logs; the node never listens for it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Streams {
    /// Off: the tunnel is not opened, and the cloud says so to whoever asks for a log.
    pub enable: bool,
    /// Streams open at once; one more is refused (429) with this number.
    pub max_streams: usize,
    /// The bytes per second all streams together send up (so that a log never takes the link
    /// from the twins' reports).
    pub bytes_per_second: u32,
}

impl Default for Streams {
    fn default() -> Self {
        Self {
            enable: true,
            max_streams: 16,
            bytes_per_second: 2 * 1024 * 1024,
        }
    }
}

impl Cloud {
    /// Every replica's websocket and certificate servers, `server` first.
    pub fn replicas(&self) -> Vec<(String, String)> {
        let mut out = vec![(self.server.clone(), self.cert_server.clone())];
        for (i, s) in self.servers.iter().enumerate() {
            if *s == self.server {
                continue;
            }
            let cert = self
                .cert_servers
                .get(i)
                .cloned()
                .unwrap_or_else(|| self.cert_server.clone());
            out.push((s.clone(), cert));
        }
        out
    }
}

impl Default for Cloud {
    fn default() -> Self {
        Self {
            server: String::new(),
            cert_server: String::new(),
            servers: Vec::new(),
            cert_servers: Vec::new(),
            rebalance_seconds: 300,
            token: String::new(),
            project_id: "e632aba927ea4ac2b575ec1603d56f10".into(),
            heartbeat_seconds: 15,
            keepalive_seconds: 30,
            qps: 100,
            burst: 200,
            renew_before_days: 0,
            streams: Streams::default(),
            metrics_seconds: 15,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Modules {
    pub eventbus: bool,
    pub dmi: bool,
    pub http: bool,
    pub manifests: bool,
}

impl Default for Modules {
    fn default() -> Self {
        Self {
            eventbus: true,
            dmi: true,
            http: true,
            manifests: true,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Manifests {
    /// A directory of Device and DeviceModel YAML files; default `{dataDir}/manifests`.
    pub dir: Option<PathBuf>,
    /// How often the directory is checked for changes, in milliseconds.
    pub poll_interval_ms: u64,
}

impl Default for Manifests {
    fn default() -> Self {
        Self {
            dir: None,
            poll_interval_ms: 1000,
        }
    }
}

/// Where the MQTT broker of the eventbus is.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum MqttMode {
    /// A broker inside edgecore, listening on `address`.
    Embedded,
    /// Any MQTT 3.1.1 broker at `address`.
    External,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Mqtt {
    pub mode: MqttMode,
    /// `host:port`: where the embedded broker listens, or the external broker to connect to.
    pub address: String,
    /// edgecore's client id on an external broker. On the embedded broker edgecore is linked
    /// in-process and has no client id: an app may use any, this one included.
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    /// Most clients the embedded broker serves at once; more wait to be accepted.
    pub max_connections: usize,
    /// The embedded broker's bounds per client (Mosquitto's names): messages and bytes queued
    /// for it, and QoS 1 messages sent to it and not yet acknowledged.
    pub max_queued_messages: usize,
    pub max_queued_bytes: usize,
    pub max_inflight_messages: usize,
    /// The embedded broker's users: a Mosquitto password file (`mosquitto_passwd -c FILE
    /// USER`). With one, only its users connect (unless `allowAnonymous`); without, anyone on
    /// the broker's address does, as with KubeEdge's.
    pub password_file: Option<PathBuf>,
    /// The embedded broker's topics per user: a Mosquitto ACL file (`user NAME`, `topic
    /// [read|write|readwrite] TOPIC`, `pattern ... %u %c`). Without one, every topic.
    pub acl_file: Option<PathBuf>,
    /// Whether clients without a user name may connect (default: only when there is no
    /// `passwordFile`).
    pub allow_anonymous: Option<bool>,
    /// A second listener of the embedded broker, over TLS (none by default).
    pub tls: Option<MqttTls>,
    /// On an external broker: acknowledge every TCP segment from it at once (through an
    /// in-process relay that sets TCP_QUICKACK), so that a broker with Nagle's algorithm on
    /// (Mosquitto as it comes) does not hold each answer up to 40 ms. The relay costs ~0.07 ms
    /// an exchange: `false` connects directly, for a broker with `set_tcp_nodelay true`.
    pub quick_ack: bool,
    /// On an external broker: edgecore's MQTT keep-alive, in seconds (1-65535). A broker that
    /// stops answering without closing the connection is found within twice this: the ping
    /// sent after this long without traffic goes unanswered, and the client reconnects.
    pub keep_alive_seconds: u16,
}

/// The embedded broker's TLS listener, with Mosquitto's options: `certfile`, `keyfile`,
/// `cafile`, `require_certificate`, `use_identity_as_username`.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MqttTls {
    /// `host:port` (Mosquitto's port for MQTT over TLS is 8883).
    pub address: String,
    /// The broker's certificate chain and key (PEM).
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// The CA whose client certificates are accepted (PEM); without it, none is asked for.
    pub ca_file: Option<PathBuf>,
    /// Refuse a TLS client without a certificate from `caFile`.
    #[serde(default)]
    pub require_certificate: bool,
    /// A client with a certificate is the user its certificate's common name says (the ACL
    /// applies to it), and no password is asked; clients without one log in as on the plain
    /// listener.
    #[serde(default)]
    pub use_identity_as_username: bool,
}

impl Default for Mqtt {
    fn default() -> Self {
        Self {
            mode: MqttMode::Embedded,
            address: "127.0.0.1:1883".into(),
            client_id: "edgecore".into(),
            username: None,
            password: None,
            max_connections: 1024,
            max_queued_messages: 1000,
            max_queued_bytes: 16 << 20,
            max_inflight_messages: 20,
            password_file: None,
            acl_file: None,
            allow_anonymous: None,
            tls: None,
            quick_ack: true,
            keep_alive_seconds: 30,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Dmi {
    /// The Unix socket of the DMI server; default `{dataDir}/dmi.sock`. KubeEdge's mappers
    /// expect `/etc/kubeedge/dmi.sock`.
    pub socket: Option<PathBuf>,
    /// Most mapper connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// A group (its name, or its number) given the socket (0660) and the socket's directory
    /// (0750): mappers that run as their own users in that group reach the socket and nothing
    /// else of edgecore's (its data directory stays 0700, its key edgecore's alone). The
    /// socket must then be outside `dataDir`. The packages use `kubeedge-mappers`, with the
    /// socket `/run/edgecore/dmi.sock`; `edgecore join` writes both when the group exists.
    pub socket_group: Option<String>,
    /// How often each registered mapper is probed (a `GetDevice` call, which KubeEdge's mappers
    /// answer too), in milliseconds.
    pub probe_interval_ms: u64,
    /// How long a probe may take before it counts as failed, in milliseconds.
    pub probe_timeout_ms: u64,
    /// Failed probes in a row after which a mapper is unreachable: its devices become `unknown`
    /// and move to another live mapper of their protocol. A failed call to the mapper counts at
    /// once.
    pub probe_failures: u32,
}

impl Default for Dmi {
    fn default() -> Self {
        let liveness = crate::dmi::liveness::Liveness::default();
        Self {
            socket: None,
            max_connections: 256,
            socket_group: None,
            probe_interval_ms: liveness.interval.as_millis() as u64,
            probe_timeout_ms: liveness.timeout.as_millis() as u64,
            probe_failures: liveness.failures,
        }
    }
}

impl Dmi {
    /// The mapper liveness settings.
    pub fn liveness(&self) -> crate::dmi::liveness::Liveness {
        crate::dmi::liveness::Liveness {
            interval: std::time::Duration::from_millis(self.probe_interval_ms),
            timeout: std::time::Duration::from_millis(self.probe_timeout_ms),
            failures: self.probe_failures,
        }
    }
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Http {
    pub address: SocketAddr,
    /// Most connections served at once; more wait to be accepted.
    pub max_connections: usize,
    /// A file whose first line is a token every request must carry (`Authorization: Bearer
    /// TOKEN`; `kectl` sends `KECTL_TOKEN`), but `/healthz` and `/readyz`. Without one, anyone
    /// who reaches `address` (loopback by default) may use the API.
    pub token_file: Option<PathBuf>,
    /// Without a token, the `Host` names the API answers besides IP addresses, `localhost`
    /// (and `*.localhost`) and this machine's host name: a web page the operator opens cannot
    /// reach it through a name of its own that resolves to this machine (DNS rebinding).
    pub hosts: Vec<String>,
}

impl Default for Http {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([127, 0, 0, 1], DEFAULT_HTTP_PORT)),
            max_connections: 256,
            token_file: None,
            hosts: Vec::new(),
        }
    }
}

/// The default port of the local HTTP API.
pub const DEFAULT_HTTP_PORT: u16 = 10360;

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StoreConfig {
    pub synchronous: Synchronous,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TwinLimits {
    pub max_value_bytes: usize,
    pub max_document_bytes: usize,
}

impl Default for TwinLimits {
    fn default() -> Self {
        let l = twin::Limits::default();
        Self {
            max_value_bytes: l.max_value_bytes,
            max_document_bytes: l.max_document_bytes,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_name: default_node_name(),
            node_labels: Default::default(),
            data_dir: PathBuf::from("edgecore-data"),
            modules: Modules::default(),
            manifests: Manifests::default(),
            mqtt: Mqtt::default(),
            dmi: Dmi::default(),
            http: Http::default(),
            store: StoreConfig::default(),
            twin: TwinLimits::default(),
            history: twin::history::HistoryConfig::default(),
            cloud: None,
            edged: None,
        }
    }
}

fn default_node_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "edge-node".into())
}

impl Config {
    /// Parses config text; `file` only names it in errors.
    pub fn parse(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        let invalid = |key: String, message: String| ConfigError::invalid(file, key, message);
        let mut config: Config = rt::config::parse(text, file)?;
        config.resolve(base);
        config.check().map_err(|(k, m)| invalid(k.into(), m))?;
        Ok(config)
    }

    fn resolve(&mut self, base: &Path) {
        let abs = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        self.data_dir = abs(&self.data_dir);
        self.mqtt.password_file = self.mqtt.password_file.as_deref().map(abs);
        self.mqtt.acl_file = self.mqtt.acl_file.as_deref().map(abs);
        if let Some(t) = &mut self.mqtt.tls {
            t.cert_file = abs(&t.cert_file);
            t.key_file = abs(&t.key_file);
            t.ca_file = t.ca_file.as_deref().map(abs);
        }
        self.http.token_file = self.http.token_file.as_deref().map(abs);
        self.manifests.dir = Some(match &self.manifests.dir {
            Some(d) => abs(d),
            None => self.data_dir.join("manifests"),
        });
        self.dmi.socket = Some(match &self.dmi.socket {
            Some(s) => abs(s),
            None => self.data_dir.join("dmi.sock"),
        });
        if let Some(e) = &mut self.edged {
            e.static_pod_path = Some(match &e.static_pod_path {
                Some(d) => abs(d),
                None => self.data_dir.join("pods"),
            });
            e.pod_log_dir = Some(match &e.pod_log_dir {
                Some(d) => abs(d),
                None => self.data_dir.join("pod-logs"),
            });
        }
    }

    fn check(&self) -> Result<(), (&'static str, String)> {
        api::validate::names::check_dns1123_subdomain(&self.node_name)
            .map_err(|e| ("nodeName", e.to_string()))?;
        if let Some(g) = &self.dmi.socket_group {
            if rt::host::group_id(g).is_none() {
                return Err((
                    "dmi.socketGroup",
                    format!("{g:?} is neither a group of /etc/group nor a group number"),
                ));
            }
            if self.dmi_socket().starts_with(&self.data_dir) {
                return Err((
                    "dmi.socketGroup",
                    format!(
                        "the socket {} is inside dataDir, which is edgecore's alone (0700): give dmi.socket outside it (the packages use /run/edgecore/dmi.sock)",
                        self.dmi_socket().display()
                    ),
                ));
            }
        }
        use api::validate::names::{label_key_ok, label_value_ok};
        for (k, v) in &self.node_labels {
            if !label_key_ok(k) || !label_value_ok(v) {
                return Err((
                    "nodeLabels",
                    format!(
                        "{k}={v} is not a Kubernetes label (name and value: at most 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit; a prefix is a DNS subdomain)"
                    ),
                ));
            }
            if !api::validate::node::may_set_label(k) {
                return Err((
                    "nodeLabels",
                    format!(
                        "{k}: a node may not set this label on its own Node (NodeRestriction); an administrator sets it"
                    ),
                ));
            }
        }
        split_host_port(&self.mqtt.address, None).map_err(|e| ("mqtt.address", e.to_string()))?;
        if let Some(t) = &self.mqtt.tls {
            split_host_port(&t.address, None).map_err(|e| ("mqtt.tls.address", e.to_string()))?;
            if t.ca_file.is_none() && (t.require_certificate || t.use_identity_as_username) {
                return Err((
                    "mqtt.tls.caFile",
                    "is needed to require or use client certificates".into(),
                ));
            }
        }
        if self.manifests.poll_interval_ms == 0 {
            return Err(("manifests.pollIntervalMs", "must be more than 0".into()));
        }
        for (key, n) in [
            ("http.maxConnections", self.http.max_connections),
            ("mqtt.maxConnections", self.mqtt.max_connections),
            ("mqtt.maxQueuedMessages", self.mqtt.max_queued_messages),
            ("mqtt.maxQueuedBytes", self.mqtt.max_queued_bytes),
            ("mqtt.maxInflightMessages", self.mqtt.max_inflight_messages),
            (
                "mqtt.keepAliveSeconds",
                usize::from(self.mqtt.keep_alive_seconds),
            ),
            ("dmi.maxConnections", self.dmi.max_connections),
            ("dmi.probeIntervalMs", self.dmi.probe_interval_ms as usize),
            ("dmi.probeTimeoutMs", self.dmi.probe_timeout_ms as usize),
            ("dmi.probeFailures", self.dmi.probe_failures as usize),
        ] {
            if n == 0 {
                return Err((key, "must be more than 0".into()));
            }
        }
        if let Some(c) = &self.cloud {
            if !c.server.starts_with("wss://") {
                return Err((
                    "cloud.server",
                    format!("{:?} is not wss://host:port", c.server),
                ));
            }
            if !c.cert_server.starts_with("https://") {
                return Err((
                    "cloud.certServer",
                    format!("{:?} is not https://host:port", c.cert_server),
                ));
            }
            if let Some(s) = c.servers.iter().find(|s| !s.starts_with("wss://")) {
                return Err(("cloud.servers", format!("{s:?} is not wss://host:port")));
            }
            if let Some(s) = c.cert_servers.iter().find(|s| !s.starts_with("https://")) {
                return Err((
                    "cloud.certServers",
                    format!("{s:?} is not https://host:port"),
                ));
            }
            if !c.cert_servers.is_empty() && c.cert_servers.len() != c.servers.len() {
                return Err((
                    "cloud.certServers",
                    format!(
                        "{} certificate servers for {} servers: give one per server, in the same order (or none: certServer serves them all)",
                        c.cert_servers.len(),
                        c.servers.len()
                    ),
                ));
            }
            if c.heartbeat_seconds == 0 || c.qps == 0 || c.burst == 0 {
                return Err((
                    "cloud.heartbeatSeconds",
                    "heartbeatSeconds, qps and burst must be more than 0".into(),
                ));
            }
            if c.keepalive_seconds <= c.heartbeat_seconds {
                return Err((
                    "cloud.keepaliveSeconds",
                    format!(
                        "{} is not more than heartbeatSeconds ({}): the cloud's answer to one ping could never come in time",
                        c.keepalive_seconds, c.heartbeat_seconds
                    ),
                ));
            }
        }
        if self.twin.max_value_bytes == 0
            || self.twin.max_document_bytes < self.twin.max_value_bytes
        {
            return Err((
                "twin.maxDocumentBytes",
                "must be at least maxValueBytes, which must be more than 0".into(),
            ));
        }
        Ok(())
    }

    /// The manifests directory (resolved).
    pub fn manifests_dir(&self) -> PathBuf {
        self.manifests
            .dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("manifests"))
    }

    /// The DMI socket path (resolved).
    pub fn dmi_socket(&self) -> PathBuf {
        self.dmi
            .socket
            .clone()
            .unwrap_or_else(|| self.data_dir.join("dmi.sock"))
    }

    /// The twin database file.
    pub fn database(&self) -> PathBuf {
        self.data_dir.join("edgecore.db")
    }

    pub fn limits(&self) -> twin::Limits {
        twin::Limits {
            max_value_bytes: self.twin.max_value_bytes,
            max_document_bytes: self.twin.max_document_bytes,
        }
    }
}

pub use rt::address::split_host_port;

impl ConfigFile for Config {
    fn parse_text(text: &str, file: &Path, base: &Path) -> Result<Self, ConfigError> {
        Self::parse(text, file, base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_in_the_module_docs_is_a_valid_config() {
        let source = include_str!("config.rs");
        let yaml: String = source
            .lines()
            .skip_while(|l| !l.starts_with("//! ```yaml"))
            .skip(1)
            .take_while(|l| !l.starts_with("//! ```"))
            .map(|l| format!("{}\n", l.trim_start_matches("//!").trim_start_matches(' ')))
            .collect();
        assert!(yaml.contains("nodeName"), "{yaml}");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("edgecore.yaml");
        std::fs::write(&file, &yaml).expect("written");
        let config = Config::load(&file).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        assert_eq!(config.node_name, "edge-node-1");
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/edgecore.yaml"), Path::new("/etc"))
    }

    #[test]
    fn a_cloud_section_needs_wss_and_https_addresses() {
        let c = parse("cloud: {server: \"wss://c:10000\", certServer: \"https://c:10002\"}\n")
            .expect("cloud");
        let cloud = c.cloud.expect("section");
        assert_eq!(cloud.heartbeat_seconds, 15);
        assert_eq!(cloud.project_id, "e632aba927ea4ac2b575ec1603d56f10");
        let e = parse("cloud: {server: \"ws://c:10000\", certServer: \"https://c:10002\"}\n")
            .expect_err("plain ws");
        assert!(e.to_string().contains("key `cloud.server`"), "{e}");
        let e = parse("cloud: {server: \"wss://c:10000\"}\n").expect_err("no cert server");
        assert!(e.to_string().contains("key `cloud.certServer`"), "{e}");
        assert!(parse("").expect("defaults").cloud.is_none());
    }

    #[test]
    fn empty_text_gives_the_defaults() {
        let c = parse("").expect("defaults");
        assert_eq!(c.mqtt.mode, MqttMode::Embedded);
        assert_eq!(c.dmi_socket(), Path::new("/etc/edgecore-data/dmi.sock"));
        assert_eq!(c.http.address.port(), DEFAULT_HTTP_PORT);
    }

    #[test]
    fn errors_name_the_file_and_the_key() {
        let e = parse("mqtt:\n  mode: sideways\n").expect_err("bad mode");
        let s = e.to_string();
        assert!(
            s.starts_with("config file /etc/edgecore.yaml: key `mqtt.mode`"),
            "{s}"
        );
        let e = parse("mqtt:\n  adress: x\n").expect_err("typo");
        assert!(e.to_string().contains("key `mqtt.adress`"), "{e}");
        let e = parse("mqtt:\n  address: nowhere\n").expect_err("no port");
        assert!(e.to_string().contains("key `mqtt.address`"), "{e}");
        assert_eq!(parse("").expect("defaults").mqtt.keep_alive_seconds, 30);
        for bad in ["0", "65536", "-1", "thirty"] {
            let e = parse(&format!("mqtt: {{keepAliveSeconds: {bad}}}\n")).expect_err(bad);
            assert!(
                e.to_string().contains("key `mqtt.keepAliveSeconds`"),
                "{bad}: {e}"
            );
        }
        let e = parse("nodeName: Not_A_Name\n").expect_err("bad name");
        assert!(e.to_string().contains("key `nodeName`"), "{e}");
        let tls = "mqtt:\n  tls: {address: \"0.0.0.0:8883\", certFile: b.crt, keyFile: b.key";
        let e = parse(&format!("{tls}, requireCertificate: true}}\n")).expect_err("no CA");
        assert!(e.to_string().contains("key `mqtt.tls.caFile`"), "{e}");
        let e = parse(&format!("{tls}, cafile: c.crt}}\n")).expect_err("typo");
        assert!(e.to_string().contains("cafile"), "{e}");
        let c = parse(&format!("{tls}, caFile: c.crt}}\n")).expect("valid");
        let t = c.mqtt.tls.expect("tls");
        assert_eq!(t.ca_file.as_deref(), Some(Path::new("/etc/c.crt")));
        assert_eq!(t.cert_file, Path::new("/etc/b.crt"));
    }

    #[test]
    fn relative_paths_are_taken_from_the_config_directory() {
        let c = parse("dataDir: data\nmanifests:\n  dir: /srv/m\n").expect("valid");
        assert_eq!(c.database(), Path::new("/etc/data/edgecore.db"));
        assert_eq!(c.manifests_dir(), Path::new("/srv/m"));
    }

    #[test]
    fn replicas_are_listed_in_order_with_their_certificate_servers() {
        let c = parse(
            "cloud:\n  server: wss://a:10000\n  certServer: https://a:10002\n  servers: [wss://a:10000, wss://b:10000, wss://c:10000]\n  certServers: [https://a:10002, https://b:10002, https://c:10002]\n",
        )
        .expect("replicas");
        let r = c.cloud.expect("cloud").replicas();
        assert_eq!(
            r,
            vec![
                ("wss://a:10000".to_string(), "https://a:10002".to_string()),
                ("wss://b:10000".to_string(), "https://b:10002".to_string()),
                ("wss://c:10000".to_string(), "https://c:10002".to_string()),
            ]
        );
        let e = parse("cloud:\n  server: wss://a:10000\n  certServer: https://a:10002\n  servers: [wss://b:10000, wss://c:10000]\n  certServers: [https://b:10002]\n")
            .expect_err("one certificate server for two");
        assert!(e.to_string().contains("cloud.certServers"), "{e}");
        let e = parse("cloud:\n  server: wss://a:10000\n  certServer: https://a:10002\n  servers: [http://b:10000]\n")
            .expect_err("not wss");
        assert!(e.to_string().contains("cloud.servers"), "{e}");
    }
}
