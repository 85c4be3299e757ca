//! Resource paths of cloud-edge messages and the MQTT topics of the edge eventbus, built and
//! parsed from one definition each so that both directions agree.

use std::fmt;

/// Errors of parsing a resource path or a topic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("resource {0:?} is not a known device resource path")]
    Resource(String),
    #[error("topic {0:?} is not a known $hw or $ke device topic")]
    Topic(String),
}

/// A device id as the edge knows it: `{namespace}/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub namespace: String,
    pub name: String,
}

impl DeviceId {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parses `{namespace}/{name}`.
    pub fn parse(id: &str) -> Option<Self> {
        let (ns, name) = id.split_once('/')?;
        (segment_ok(ns) && segment_ok(name)).then(|| Self::new(ns, name))
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

fn segment_ok(s: &str) -> bool {
    !s.is_empty() && !s.contains('/') && !s.contains('+') && !s.contains('#')
}

/// A resource path of a cloud-edge message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource {
    /// `node/{node}/{namespace}/{kind}/{name}`: an object sent to a node (kind `device`,
    /// `devicemodel`, `pod`, ...).
    Object {
        node: String,
        namespace: String,
        kind: String,
        name: String,
    },
    /// `node/{node}/membership`: devices added to or removed from a node.
    Membership { node: String },
    /// `node/{node}/membership/detail`: the edge asks for its device list.
    MembershipDetail { node: String },
    /// `node/{node}/device/{namespace}/{name}/twin/edge_updated`: twin values from the edge.
    TwinEdgeUpdated { node: String, device: DeviceId },
    /// `node/{node}/device/{namespace}/{name}/state/update`: device state from the edge.
    StateUpdate { node: String, device: DeviceId },
    /// `node/{node}/twin`: the cloud's answer to an upstream twin message.
    TwinResponse { node: String },
}

impl Resource {
    /// `node/{node}/{namespace}/device/{name}`.
    pub fn device(node: &str, namespace: &str, name: &str) -> Self {
        Self::object(node, namespace, "device", name)
    }

    /// `node/{node}/{namespace}/devicemodel/{name}`.
    pub fn device_model(node: &str, namespace: &str, name: &str) -> Self {
        Self::object(node, namespace, "devicemodel", name)
    }

    fn object(node: &str, namespace: &str, kind: &str, name: &str) -> Self {
        Self::Object {
            node: node.into(),
            namespace: namespace.into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    /// The node the resource belongs to.
    pub fn node(&self) -> &str {
        match self {
            Self::Object { node, .. }
            | Self::Membership { node }
            | Self::MembershipDetail { node }
            | Self::TwinEdgeUpdated { node, .. }
            | Self::StateUpdate { node, .. }
            | Self::TwinResponse { node } => node,
        }
    }

    /// Parses a resource that the cloud sent to `node`, whole (`node/{node}/...`, as this
    /// project's cloudcore sent them before it trimmed them) or trimmed as KubeEdge's cloudhub
    /// writes it (`{namespace}/{kind}/{name}`, `membership`, `twin`).
    pub fn parse_downstream(node: &str, s: &str) -> Result<Self, PathError> {
        let whole = s
            .strip_prefix("node/")
            .and_then(|r| r.strip_prefix(node))
            .is_some_and(|r| r.starts_with('/'));
        if whole {
            Self::parse(s)
        } else {
            Self::parse(&format!("node/{node}/{s}")).map_err(|_| PathError::Resource(s.to_string()))
        }
    }

    /// Parses a resource path.
    pub fn parse(s: &str) -> Result<Self, PathError> {
        let err = || PathError::Resource(s.to_string());
        let parts: Vec<&str> = s.split('/').collect();
        if parts.len() < 3 || parts[0] != "node" || parts.iter().any(|p| p.is_empty()) {
            return Err(err());
        }
        let node = parts[1].to_string();
        Ok(match parts[2..] {
            ["membership"] => Self::Membership { node },
            ["membership", "detail"] => Self::MembershipDetail { node },
            ["twin"] => Self::TwinResponse { node },
            ["device", ns, name, "twin", "edge_updated"] => Self::TwinEdgeUpdated {
                node,
                device: DeviceId::new(ns, name),
            },
            ["device", ns, name, "state", "update"] => Self::StateUpdate {
                node,
                device: DeviceId::new(ns, name),
            },
            [ns, kind, name] => Self::Object {
                node,
                namespace: ns.into(),
                kind: kind.into(),
                name: name.into(),
            },
            _ => return Err(err()),
        })
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Object {
                node,
                namespace,
                kind,
                name,
            } => write!(f, "node/{node}/{namespace}/{kind}/{name}"),
            Self::Membership { node } => write!(f, "node/{node}/membership"),
            Self::MembershipDetail { node } => write!(f, "node/{node}/membership/detail"),
            Self::TwinEdgeUpdated { node, device } => {
                write!(f, "node/{node}/device/{device}/twin/edge_updated")
            }
            Self::StateUpdate { node, device } => {
                write!(f, "node/{node}/device/{device}/state/update")
            }
            Self::TwinResponse { node } => write!(f, "node/{node}/twin"),
        }
    }
}

/// An enum of topic kinds, each with its KubeEdge suffix: `ALL` pairs them and `suffix` reads it.
macro_rules! topic_kinds {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $kind:ident = $suffix:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $kind,)+
        }

        impl $name {
            const ALL: &'static [(Self, &'static str)] = &[$((Self::$kind, $suffix),)+];

            /// The topic suffix.
            pub fn suffix(self) -> &'static str {
                Self::ALL
                    .iter()
                    .find(|(k, _)| *k == self)
                    .map(|(_, s)| *s)
                    .unwrap_or_default()
            }
        }
    };
}

topic_kinds! {
    /// What a device topic is about; the suffix after `$hw/events/device/{ns}/{name}/`.
    DeviceTopicKind {
        TwinUpdate = "twin/update",
        TwinUpdateResult = "twin/update/result",
        TwinUpdateDelta = "twin/update/delta",
        TwinUpdateDocument = "twin/update/document",
        TwinGet = "twin/get",
        TwinGetResult = "twin/get/result",
        TwinCloudUpdated = "twin/cloud_updated",
        StateUpdate = "state/update",
        StateUpdateResult = "state/update/result",
        /// `…/updated`: attribute update result.
        Updated = "updated",
        /// `…/alarm`: an alarm of the device raised, cleared, acknowledged (edgecore's own;
        /// `api::alarm`).
        Alarm = "alarm",
    }
}

topic_kinds! {
    /// What a node topic is about; the suffix after `$hw/events/node/{node}/`.
    NodeTopicKind {
        MembershipGet = "membership/get",
        MembershipGetResult = "membership/get/result",
        MembershipUpdated = "membership/updated",
    }
}

/// An MQTT topic of the edge eventbus.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Topic {
    /// `$hw/events/device/{ns}/{name}/{suffix}`.
    Device {
        device: DeviceId,
        kind: DeviceTopicKind,
    },
    /// `$hw/events/node/{node}/{suffix}`.
    Node { node: String, kind: NodeTopicKind },
    /// `$ke/events/device/{ns}/{name}/data/update`: mapper data for third parties.
    DataUpdate { device: DeviceId },
    /// `$hw/events/connected/{client}`.
    Connected { client: String },
    /// `$hw/events/disconnected/{client}`.
    Disconnected { client: String },
}

/// The topic filters edgecore subscribes to (QoS 1), as KubeEdge's eventbus.
pub const EDGE_SUBSCRIPTIONS: [&str; 6] = [
    "$hw/events/upload/#",
    "$hw/events/device/+/+/state/update",
    "$hw/events/device/+/+/twin/+",
    "$hw/events/node/+/membership/get",
    "SYS/dis/upload_records",
    "+/user/#",
];

impl Topic {
    /// A device topic.
    pub fn device(device: DeviceId, kind: DeviceTopicKind) -> Self {
        Self::Device { device, kind }
    }

    /// Parses a topic name.
    pub fn parse(s: &str) -> Result<Self, PathError> {
        let err = || PathError::Topic(s.to_string());
        if let Some(rest) = s.strip_prefix("$hw/events/device/") {
            let (device, suffix) = split_device(rest).ok_or_else(err)?;
            let kind = DeviceTopicKind::ALL
                .iter()
                .find(|(_, suf)| *suf == suffix)
                .map(|(k, _)| *k)
                .ok_or_else(err)?;
            return Ok(Self::Device { device, kind });
        }
        if let Some(rest) = s.strip_prefix("$hw/events/node/") {
            let (node, suffix) = rest.split_once('/').ok_or_else(err)?;
            if !segment_ok(node) {
                return Err(err());
            }
            let kind = NodeTopicKind::ALL
                .iter()
                .find(|(_, suf)| *suf == suffix)
                .map(|(k, _)| *k)
                .ok_or_else(err)?;
            return Ok(Self::Node {
                node: node.into(),
                kind,
            });
        }
        if let Some(rest) = s.strip_prefix("$ke/events/device/") {
            return match split_device(rest) {
                Some((device, "data/update")) => Ok(Self::DataUpdate { device }),
                _ => Err(err()),
            };
        }
        if let Some(client) = s
            .strip_prefix("$hw/events/connected/")
            .filter(|c| segment_ok(c))
        {
            return Ok(Self::Connected {
                client: client.into(),
            });
        }
        if let Some(client) = s
            .strip_prefix("$hw/events/disconnected/")
            .filter(|c| segment_ok(c))
        {
            return Ok(Self::Disconnected {
                client: client.into(),
            });
        }
        Err(err())
    }
}

fn split_device(rest: &str) -> Option<(DeviceId, &str)> {
    let mut it = rest.splitn(3, '/');
    let (ns, name, suffix) = (it.next()?, it.next()?, it.next()?);
    (segment_ok(ns) && segment_ok(name)).then(|| (DeviceId::new(ns, name), suffix))
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Device { device, kind } => {
                write!(f, "$hw/events/device/{device}/{}", kind.suffix())
            }
            Self::Node { node, kind } => write!(f, "$hw/events/node/{node}/{}", kind.suffix()),
            Self::DataUpdate { device } => write!(f, "$ke/events/device/{device}/data/update"),
            Self::Connected { client } => write!(f, "$hw/events/connected/{client}"),
            Self::Disconnected { client } => write!(f, "$hw/events/disconnected/{client}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths_round_trip_on_kubeedge_strings() {
        let cases = [
            (
                "node/worker-node1/default/device/beta1-device",
                Resource::device("worker-node1", "default", "beta1-device"),
            ),
            (
                "node/worker-node1/default/devicemodel/beta1-model",
                Resource::device_model("worker-node1", "default", "beta1-model"),
            ),
            (
                "node/worker-node1/membership",
                Resource::Membership {
                    node: "worker-node1".into(),
                },
            ),
            (
                "node/worker-node1/membership/detail",
                Resource::MembershipDetail {
                    node: "worker-node1".into(),
                },
            ),
            ("node/n1/twin", Resource::TwinResponse { node: "n1".into() }),
            (
                "node/n1/device/default/beta1-device/twin/edge_updated",
                Resource::TwinEdgeUpdated {
                    node: "n1".into(),
                    device: DeviceId::new("default", "beta1-device"),
                },
            ),
            (
                "node/n1/device/plant/d/state/update",
                Resource::StateUpdate {
                    node: "n1".into(),
                    device: DeviceId::new("plant", "d"),
                },
            ),
        ];
        for (text, resource) in cases {
            assert_eq!(Resource::parse(text).as_ref(), Ok(&resource), "{text}");
            assert_eq!(resource.to_string(), text);
        }
    }

    #[test]
    fn downstream_resources_are_read_whole_or_trimmed() {
        for (wire, want) in [
            ("default/device/d1", Resource::device("n1", "default", "d1")),
            (
                "node/n1/default/device/d1",
                Resource::device("n1", "default", "d1"),
            ),
            (
                "default/devicemodel/m",
                Resource::device_model("n1", "default", "m"),
            ),
            ("membership", Resource::Membership { node: "n1".into() }),
            (
                "node/n1/membership",
                Resource::Membership { node: "n1".into() },
            ),
            ("twin", Resource::TwinResponse { node: "n1".into() }),
            // A namespace called `node`, trimmed: not mistaken for a node's prefix.
            (
                "node/pod/p",
                Resource::Object {
                    node: "n1".into(),
                    namespace: "node".into(),
                    kind: "pod".into(),
                    name: "p".into(),
                },
            ),
        ] {
            assert_eq!(Resource::parse_downstream("n1", wire), Ok(want), "{wire}");
        }
        // Another node's whole resource is not taken as this node's trimmed one.
        assert!(Resource::parse_downstream("n1", "node/n2/default/device/d1").is_err());
        assert!(Resource::parse_downstream("n1", "").is_err());
        assert_eq!(
            Resource::parse_downstream("n1", "a/b/c/d"),
            Err(PathError::Resource("a/b/c/d".into()))
        );
    }

    #[test]
    fn bad_resource_paths_are_errors() {
        for bad in [
            "",
            "node",
            "node/n1",
            "pod/n1/default/device/d",
            "node//default/device/d",
            "node/n1/a/b/c/d",
            "node/n1/device/ns/d/twin/other",
        ] {
            assert!(Resource::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hw_topics_round_trip_on_kubeedge_strings() {
        let d = || DeviceId::new("default", "beta1-device");
        // The device topics: KubeEdge's string after `$hw/events/device/default/beta1-device/`.
        let device = [
            ("twin/update", DeviceTopicKind::TwinUpdate),
            ("twin/update/result", DeviceTopicKind::TwinUpdateResult),
            ("twin/update/delta", DeviceTopicKind::TwinUpdateDelta),
            ("twin/update/document", DeviceTopicKind::TwinUpdateDocument),
            ("twin/get", DeviceTopicKind::TwinGet),
            ("twin/get/result", DeviceTopicKind::TwinGetResult),
            ("twin/cloud_updated", DeviceTopicKind::TwinCloudUpdated),
            ("state/update", DeviceTopicKind::StateUpdate),
            ("state/update/result", DeviceTopicKind::StateUpdateResult),
            ("updated", DeviceTopicKind::Updated),
        ];
        let node = [
            ("membership/get", NodeTopicKind::MembershipGet),
            ("membership/get/result", NodeTopicKind::MembershipGetResult),
            ("membership/updated", NodeTopicKind::MembershipUpdated),
        ];
        let mut cases: Vec<(String, Topic)> = device
            .into_iter()
            .map(|(tail, kind)| {
                let text = format!("$hw/events/device/default/beta1-device/{tail}");
                (text, Topic::device(d(), kind))
            })
            .chain(node.into_iter().map(|(tail, kind)| {
                let topic = Topic::Node {
                    node: "edge-1".into(),
                    kind,
                };
                (format!("$hw/events/node/edge-1/{tail}"), topic)
            }))
            .collect();
        cases.extend([
            (
                "$ke/events/device/default/beta1-device/data/update".to_string(),
                Topic::DataUpdate { device: d() },
            ),
            (
                "$hw/events/connected/app1".to_string(),
                Topic::Connected {
                    client: "app1".into(),
                },
            ),
            (
                "$hw/events/disconnected/app1".to_string(),
                Topic::Disconnected {
                    client: "app1".into(),
                },
            ),
        ]);
        for (text, topic) in cases {
            assert_eq!(Topic::parse(&text).as_ref(), Ok(&topic), "{text}");
            assert_eq!(topic.to_string(), text);
        }
    }

    #[test]
    fn bad_topics_are_errors() {
        for bad in [
            "$hw/events/device/default/twin/update",
            "$hw/events/device/default/d/twin/upd",
            "$hw/events/device/+/+/twin/update",
            "$hw/events/node//membership/get",
            "$ke/events/device/default/d/data",
            "hw/events/device/default/d/twin/update",
            "",
        ] {
            assert!(Topic::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn device_ids() {
        assert_eq!(
            DeviceId::parse("default/d1"),
            Some(DeviceId::new("default", "d1"))
        );
        assert_eq!(DeviceId::new("a", "b").to_string(), "a/b");
        assert_eq!(DeviceId::parse("d1"), None);
        assert_eq!(DeviceId::parse("a/b/c"), None);
    }
}
