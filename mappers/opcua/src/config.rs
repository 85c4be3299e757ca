//! A device's OPC UA configuration read from KubeEdge `configData`: the connection from
//! `spec.protocol.configData`, a [`Point`] from each property's `visitors.configData`.

use api::validate::names::Excerpt;
use mapper_sdk::configdata::{ConfigError, bad, flag, get, integer, number, text};
use opcua::crypto::SecurityPolicy;
use opcua::types::{MessageSecurityMode, NodeId, NumericRange, VariantScalarTypeId};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// How the session is opened.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    /// `opc.tcp://host:port/path`.
    pub url: String,
    pub policy: SecurityPolicy,
    pub mode: MessageSecurityMode,
    pub identity: Identity,
    /// The server's certificate (DER or PEM) to add to the trust list at start.
    pub server_certificate: Option<PathBuf>,
    /// The application instance certificate and key, instead of the one the mapper creates.
    pub certificate: Option<(PathBuf, PathBuf)>,
    /// Each service call's timeout; also how long a connection attempt may take.
    pub timeout: Duration,
    pub keep_alive: Duration,
    /// Overrides the server's `MaxNodesPerRead` (0: use the server's).
    pub max_nodes_per_read: usize,
}

#[derive(Clone, PartialEq)]
pub enum Identity {
    Anonymous,
    User { name: String, password: String },
    Certificate { cert: PathBuf, key: PathBuf },
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Anonymous => write!(f, "Anonymous"),
            Self::User { name, .. } => write!(f, "User({name})"),
            Self::Certificate { cert, .. } => write!(f, "Certificate({})", cert.display()),
        }
    }
}

/// The policy names `securityPolicy` takes (the short names of the OPC UA profiles; their
/// URIs are accepted too).
pub const POLICIES: &[&str] = &[
    "None",
    "Basic256Sha256",
    "Aes128Sha256RsaOaep",
    "Aes256Sha256RsaPss",
    "Basic128Rsa15",
    "Basic256",
];

/// A policy by its short name (any case, `-` and `_` ignored: `Aes128_Sha256_RsaOaep`) or URI.
fn policy(name: &str) -> Option<SecurityPolicy> {
    let norm = |s: &str| s.replace(['-', '_'], "").to_ascii_lowercase();
    let wanted = norm(name.trim());
    let by_name = [
        SecurityPolicy::None,
        SecurityPolicy::Basic256Sha256,
        SecurityPolicy::Aes128Sha256RsaOaep,
        SecurityPolicy::Aes256Sha256RsaPss,
        SecurityPolicy::Basic128Rsa15,
        SecurityPolicy::Basic256,
    ]
    .into_iter()
    .find(|p| norm(p.to_str()) == wanted);
    by_name.or_else(|| {
        Some(SecurityPolicy::from_uri(name.trim())).filter(|p| *p != SecurityPolicy::Unknown)
    })
}

impl Connection {
    pub fn from_config(c: &Map<String, Value>) -> Result<Self, ConfigError> {
        let url = text(c, "url")
            .or_else(|| text(c, "endpoint"))
            .ok_or_else(|| bad("url", "required: the server's opc.tcp:// endpoint URL"))?;
        if !url.starts_with("opc.tcp://") || url.len() <= "opc.tcp://".len() {
            return Err(bad(
                "url",
                format!("{url:?} is not an opc.tcp://host:port endpoint"),
            ));
        }
        let policy = match text(c, "securityPolicy") {
            None => SecurityPolicy::None,
            Some(p) => policy(&p).ok_or_else(|| {
                bad(
                    "securityPolicy",
                    format!("{p:?} is not one of {}", POLICIES.join(", ")),
                )
            })?,
        };
        let mode = match text(c, "securityMode") {
            None if policy == SecurityPolicy::None => MessageSecurityMode::None,
            None => MessageSecurityMode::SignAndEncrypt,
            Some(m) => match m.trim().to_ascii_lowercase().as_str() {
                "none" => MessageSecurityMode::None,
                "sign" => MessageSecurityMode::Sign,
                "signandencrypt" | "sign_and_encrypt" | "sign-and-encrypt" => {
                    MessageSecurityMode::SignAndEncrypt
                }
                _ => {
                    return Err(bad(
                        "securityMode",
                        format!("{m:?} is not one of None, Sign, SignAndEncrypt"),
                    ));
                }
            },
        };
        if (policy == SecurityPolicy::None) != (mode == MessageSecurityMode::None) {
            return Err(bad(
                "securityMode",
                format!(
                    "{mode:?} does not go with securityPolicy {}: None goes with None only",
                    policy.to_str()
                ),
            ));
        }
        let path = |key: &str| text(c, key).map(PathBuf::from);
        let user = text(c, "userName").or_else(|| text(c, "username"));
        let identity = match (user, path("identityCertificate")) {
            (Some(_), Some(_)) => {
                return Err(bad(
                    "identityCertificate",
                    "give userName or identityCertificate, not both",
                ));
            }
            (Some(name), None) => {
                let password = match (text(c, "password"), path("passwordFile")) {
                    (Some(p), None) => p,
                    (None, Some(f)) => std::fs::read_to_string(&f)
                        .map(|p| p.trim_end_matches(['\r', '\n']).to_string())
                        .map_err(|e| {
                            bad("passwordFile", format!("cannot read {}: {e}", f.display()))
                        })?,
                    (None, None) => {
                        return Err(bad("password", "userName needs password or passwordFile"));
                    }
                    (Some(_), Some(_)) => {
                        return Err(bad(
                            "passwordFile",
                            "give password or passwordFile, not both",
                        ));
                    }
                };
                Identity::User { name, password }
            }
            (None, Some(cert)) => Identity::Certificate {
                cert,
                key: path("identityPrivateKey").ok_or_else(|| {
                    bad(
                        "identityPrivateKey",
                        "identityCertificate needs its private key",
                    )
                })?,
            },
            (None, None) => Identity::Anonymous,
        };
        let certificate = match (path("certificate"), path("privateKey")) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => return Err(bad("privateKey", "certificate needs its privateKey")),
            (None, Some(_)) => return Err(bad("certificate", "privateKey needs its certificate")),
        };
        let ms = |key: &str, default: u64| -> Result<Duration, ConfigError> {
            match integer::<u64>(c, key)? {
                None => Ok(Duration::from_millis(default)),
                Some(0) => Err(bad(key, "must be more than 0 ms")),
                Some(v) => Ok(Duration::from_millis(v)),
            }
        };
        Ok(Self {
            url,
            policy,
            mode,
            identity,
            server_certificate: path("serverCertificate"),
            certificate,
            timeout: ms("timeout", 5000)?,
            keep_alive: ms("keepAlive", 5000)?,
            max_nodes_per_read: integer::<usize>(c, "maxNodesPerRead")?.unwrap_or(0),
        })
    }
}

/// A node id as configured: `nsu=` ids are resolved to an index once connected.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRef {
    pub namespace_uri: Option<String>,
    pub id: NodeId,
}

/// A `nodeID` that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0} is not a node id (ns=<index>;<i|s|g|b>=<id>, or nsu=<namespace uri>;<i|s|g|b>=<id>)")]
pub struct NodeIdError(Excerpt);

impl FromStr for NodeRef {
    type Err = NodeIdError;

    /// `ns=2;s=Temp`, `i=2258`, `ns=1;g=<guid>`, `ns=1;b=<base64>`, `nsu=<uri>;s=Temp`.
    fn from_str(s: &str) -> Result<Self, NodeIdError> {
        let s = s.trim();
        let explain = || NodeIdError(Excerpt::of(s));
        if let Some(rest) = s.strip_prefix("nsu=") {
            let (uri, id) = rest.split_once(';').ok_or_else(explain)?;
            if uri.is_empty() || id.starts_with("ns=") {
                return Err(explain());
            }
            let uri = uri.replace("%3b", ";").replace("%25", "%");
            let id = NodeId::from_str(id).map_err(|_| explain())?;
            return Ok(Self {
                namespace_uri: Some(uri),
                id,
            });
        }
        NodeId::from_str(s)
            .map(|id| Self {
                namespace_uri: None,
                id,
            })
            .map_err(|_| explain())
    }
}

/// How a subscribed property is sampled by the server.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub interval: Duration,
    pub queue_size: u32,
    /// `(deadband type, value)`: 1 absolute, 2 percent of the EURange.
    pub deadband: Option<(u32, f64)>,
}

/// One property's node.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub node: NodeRef,
    /// The variant type written; learnt from the node's value when not given.
    pub data_type: Option<VariantScalarTypeId>,
    pub index_range: Option<NumericRange>,
    pub subscribe: Option<Sampling>,
}

/// `dataType` names (OPC UA's built-in types, case-insensitive), with the twin's names as
/// aliases.
pub const DATA_TYPES: &[(&str, VariantScalarTypeId)] = &[
    ("boolean", VariantScalarTypeId::Boolean),
    ("bool", VariantScalarTypeId::Boolean),
    ("sbyte", VariantScalarTypeId::SByte),
    ("byte", VariantScalarTypeId::Byte),
    ("int16", VariantScalarTypeId::Int16),
    ("uint16", VariantScalarTypeId::UInt16),
    ("int32", VariantScalarTypeId::Int32),
    ("int", VariantScalarTypeId::Int32),
    ("uint32", VariantScalarTypeId::UInt32),
    ("int64", VariantScalarTypeId::Int64),
    ("uint64", VariantScalarTypeId::UInt64),
    ("float", VariantScalarTypeId::Float),
    ("double", VariantScalarTypeId::Double),
    ("string", VariantScalarTypeId::String),
    ("datetime", VariantScalarTypeId::DateTime),
];

impl Point {
    /// `collect` is the property's `collectCycle`: the sampling interval unless
    /// `samplingInterval` is given.
    pub fn from_config(c: &Map<String, Value>, collect: Duration) -> Result<Self, ConfigError> {
        let raw = text(c, "nodeID").ok_or_else(|| {
            bad(
                "nodeID",
                "required: the node to read, e.g. ns=2;s=Temperature",
            )
        })?;
        let node = NodeRef::from_str(&raw).map_err(|e| bad("nodeID", e.to_string()))?;
        let data_type = match text(c, "dataType") {
            None => None,
            Some(t) => Some(
                DATA_TYPES
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(t.trim()))
                    .map(|(_, v)| *v)
                    .ok_or_else(|| {
                        bad(
                            "dataType",
                            format!(
                                "{t:?} is not one of {}",
                                DATA_TYPES
                                    .iter()
                                    .map(|(n, _)| *n)
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        )
                    })?,
            ),
        };
        let index_range = match text(c, "indexRange") {
            None => None,
            Some(r) if r.trim().is_empty() => None,
            Some(r) => Some(NumericRange::from_str(r.trim()).map_err(|_| {
                bad(
                    "indexRange",
                    format!("{r:?} is not an index range (5, 0:3, or 0:1,2:3)"),
                )
            })?),
        };
        let subscribe = if flag(c, "subscribe")? {
            let interval = match integer::<u64>(c, "samplingInterval")? {
                Some(v) => Duration::from_millis(v),
                None => collect,
            };
            let deadband = match text(c, "deadbandType")
                .map(|t| t.trim().to_ascii_lowercase())
                .as_deref()
            {
                None | Some("none") | Some("") => None,
                Some(t @ ("absolute" | "percent")) => {
                    let v = number(c, "deadbandValue")?
                        .ok_or_else(|| bad("deadbandValue", "required with deadbandType"))?;
                    if v < 0.0 || (t == "percent" && v > 100.0) {
                        return Err(bad("deadbandValue", format!("{v} is out of range")));
                    }
                    Some((if t == "absolute" { 1 } else { 2 }, v))
                }
                Some(t) => {
                    return Err(bad(
                        "deadbandType",
                        format!("{t:?} is not one of none, absolute, percent"),
                    ));
                }
            };
            Some(Sampling {
                interval,
                queue_size: match integer::<u32>(c, "queueSize")? {
                    None => 1,
                    Some(0) => return Err(bad("queueSize", "must be at least 1")),
                    Some(q) => q,
                },
                deadband,
            })
        } else {
            for key in [
                "samplingInterval",
                "queueSize",
                "deadbandType",
                "deadbandValue",
            ] {
                if get(c, key).is_some() {
                    return Err(bad(key, "only applies with subscribe: true"));
                }
            }
            None
        };
        Ok(Self {
            node,
            data_type,
            index_range,
            subscribe,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use sim::object as map;

    #[test]
    fn node_ids_in_every_form() {
        let n = NodeRef::from_str("ns=2;s=Line1.Speed").expect("string id");
        assert_eq!(n.id, NodeId::new(2, "Line1.Speed"));
        let n = NodeRef::from_str("i=2258").expect("numeric id in ns 0");
        assert_eq!(n.id, NodeId::new(0, 2258u32));
        let n = NodeRef::from_str("ns=3;g=72962b91-fa75-4ae6-8d28-b404dc7daf63").expect("guid");
        assert_eq!(n.id.namespace, 3);
        let n = NodeRef::from_str("ns=1;b=M/RbKBsRVkePCePcx24oRA==").expect("opaque");
        assert_eq!(n.id.namespace, 1);
        let n = NodeRef::from_str("nsu=urn:plant:line1;s=Batch").expect("namespace uri");
        assert_eq!(n.namespace_uri.as_deref(), Some("urn:plant:line1"));
        assert_eq!(n.id, NodeId::new(0, "Batch"));
        for bad in [
            "",
            "Temp",
            "ns=x;s=T",
            "nsu=;s=T",
            "nsu=urn:x",
            "nsu=urn:x;ns=2;s=T",
        ] {
            let e = NodeRef::from_str(bad).expect_err(bad);
            assert!(e.to_string().contains("not a node id"), "{e}");
        }
    }

    #[test]
    fn connection_defaults_and_security() {
        let c = Connection::from_config(&map(json!({"url": "opc.tcp://plc:4840"}))).expect("ok");
        assert_eq!(c.policy, SecurityPolicy::None);
        assert_eq!(c.mode, MessageSecurityMode::None);
        assert_eq!(c.identity, Identity::Anonymous);
        let c = Connection::from_config(&map(json!({
            "url": "opc.tcp://plc:4840", "SecurityPolicy": "basic256sha256",
            "userName": "op", "password": "pw"
        })))
        .expect("ok");
        assert_eq!(c.policy, SecurityPolicy::Basic256Sha256);
        assert_eq!(
            c.mode,
            MessageSecurityMode::SignAndEncrypt,
            "secure by default"
        );
        assert!(matches!(c.identity, Identity::User { ref name, .. } if name == "op"));
        assert!(
            !format!("{:?}", c.identity).contains("pw"),
            "password not logged"
        );
        let e = Connection::from_config(&map(json!({
            "url": "opc.tcp://plc:4840", "securityPolicy": "None", "securityMode": "Sign"
        })))
        .expect_err("mismatch");
        assert_eq!(e.key, "securityMode");
        let e = Connection::from_config(&map(json!({"url": "http://plc"}))).expect_err("scheme");
        assert_eq!(e.key, "url");
        let e = Connection::from_config(&map(
            json!({"url": "opc.tcp://p:1", "securityPolicy": "Basic512"}),
        ))
        .expect_err("unknown policy");
        assert!(e.to_string().contains("Basic256Sha256"), "{e}");
        let e = Connection::from_config(&map(json!({"url": "opc.tcp://p:1", "userName": "op"})))
            .expect_err("no password");
        assert_eq!(e.key, "password");
    }

    #[test]
    fn points_and_subscriptions() {
        let p = Point::from_config(
            &map(json!({"nodeID": "ns=2;i=3", "dataType": "Double", "indexRange": "1:2"})),
            Duration::from_millis(500),
        )
        .expect("ok");
        assert_eq!(p.data_type, Some(VariantScalarTypeId::Double));
        assert!(p.index_range.is_some());
        assert_eq!(p.subscribe, None);
        let p = Point::from_config(
            &map(json!({"nodeID": "ns=2;i=3", "subscribe": "true", "deadbandType": "absolute", "deadbandValue": 0.5})),
            Duration::from_millis(250),
        )
        .expect("ok");
        assert_eq!(
            p.subscribe,
            Some(Sampling {
                interval: Duration::from_millis(250),
                queue_size: 1,
                deadband: Some((1, 0.5)),
            })
        );
        let e = Point::from_config(
            &map(json!({"nodeID": "ns=2;i=3", "queueSize": 5})),
            Duration::ZERO,
        )
        .expect_err("queue without subscribe");
        assert_eq!(e.key, "queueSize");
        let e = Point::from_config(
            &map(json!({"nodeID": "ns=2;i=3", "dataType": "decimal"})),
            Duration::ZERO,
        )
        .expect_err("type");
        assert_eq!(e.key, "dataType");
        let e = Point::from_config(&map(json!({"dataType": "int32"})), Duration::ZERO)
            .expect_err("no node");
        assert_eq!(e.key, "nodeID");
    }
}
