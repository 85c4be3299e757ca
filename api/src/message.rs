//! The cloud-edge message of KubeEdge (beehive `model.Message`), as JSON on the websocket:
//! `{"header":{...},"route":{...},"content":...}`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// Operations (`route.operation`).
pub mod operation {
    pub const INSERT: &str = "insert";
    pub const DELETE: &str = "delete";
    pub const QUERY: &str = "query";
    pub const UPDATE: &str = "update";
    pub const PATCH: &str = "patch";
    pub const UPLOAD: &str = "upload";
    pub const RESPONSE: &str = "response";
    pub const ERROR: &str = "error";
    pub const KEEPALIVE: &str = "keepalive";
    /// Every operation above.
    pub const ALL: [&str; 9] = [
        INSERT, DELETE, QUERY, UPDATE, PATCH, UPLOAD, RESPONSE, ERROR, KEEPALIVE,
    ];
}

/// Groups (`route.group`).
pub mod group {
    pub const RESOURCE: &str = "resource";
    pub const TWIN: &str = "twin";
    pub const META: &str = "meta";
    pub const USER: &str = "user";
    pub const FUNC: &str = "func";
}

/// Sources (`route.source`) used by the device path.
pub mod source {
    pub const DEVICE_CONTROLLER: &str = "devicecontroller";
    pub const EDGE_CONTROLLER: &str = "edgecontroller";
    pub const CLOUD_HUB: &str = "cloudhub";
    pub const EDGE_HUB: &str = "edgehub";
    pub const TWIN: &str = "twin";
    pub const WEBSOCKET: &str = "websocket";
}

/// The content of an acknowledgement.
pub const ACK_CONTENT: &str = "OK";

/// `header` of a message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageHeader {
    #[serde(rename = "msg_id")]
    pub id: String,
    #[serde(
        rename = "parent_msg_id",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub parent_id: String,
    /// Milliseconds since the Unix epoch.
    #[serde(default)]
    pub timestamp: i64,
    #[serde(
        rename = "resourceversion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub resource_version: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sync: bool,
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub message_type: String,
}

/// `route` of a message: where it comes from, and what it does to which resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageRoute {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub destination: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource: String,
}

/// A cloud-edge message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub header: MessageHeader,
    #[serde(default)]
    pub route: MessageRoute,
    #[serde(default)]
    pub content: Value,
}

/// Milliseconds since the Unix epoch, now.
pub fn now_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Message {
    /// A new message with a fresh id and the current time.
    pub fn new(
        source: &str,
        group: &str,
        operation: &str,
        resource: impl Into<String>,
        content: Value,
    ) -> Self {
        Self {
            header: MessageHeader {
                id: uuid::Uuid::new_v4().to_string(),
                timestamp: now_millis(),
                ..MessageHeader::default()
            },
            route: MessageRoute {
                source: source.into(),
                group: group.into(),
                operation: operation.into(),
                resource: resource.into(),
                ..MessageRoute::default()
            },
            content,
        }
    }

    /// Sets `header.resourceversion` (messages that need an ACK must carry one).
    pub fn with_resource_version(mut self, rv: impl Into<String>) -> Self {
        self.header.resource_version = rv.into();
        self
    }

    /// A response to this message: a new id, `parent_msg_id` = this id, same source, group and
    /// resource, operation `response`.
    pub fn response(&self, content: Value) -> Self {
        let mut m = Self::new(
            &self.route.source,
            &self.route.group,
            operation::RESPONSE,
            self.route.resource.clone(),
            content,
        );
        m.header.parent_id = self.header.id.clone();
        m
    }

    /// The acknowledgement of this message: a response with content `"OK"`.
    pub fn ack(&self) -> Self {
        self.response(Value::String(ACK_CONTENT.into()))
    }

    /// An error answer to this message: like [`Message::response`], operation `error`.
    pub fn error_response(&self, reason: impl Into<String>) -> Self {
        let mut m = self.response(Value::String(reason.into()));
        m.route.operation = operation::ERROR.into();
        m
    }

    /// The edge's keepalive (every 15 s by default).
    pub fn keepalive() -> Self {
        Self::new(
            source::WEBSOCKET,
            group::RESOURCE,
            operation::KEEPALIVE,
            "node",
            Value::String("ping".into()),
        )
    }

    /// Whether this message answers another (it has a parent).
    pub fn is_response(&self) -> bool {
        !self.header.parent_id.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serialises_with_kubeedge_key_names() {
        let mut m = Message::new(
            "devicecontroller",
            "resource",
            "insert",
            "node/n1/default/device/d1",
            json!({"a": 1}),
        )
        .with_resource_version("42");
        m.header.id = "id-1".into();
        m.header.timestamp = 1700000000000;
        let v = serde_json::to_value(&m).expect("serialises");
        assert_eq!(
            v,
            json!({
                "header": {"msg_id": "id-1", "timestamp": 1700000000000_i64, "resourceversion": "42"},
                "route": {"source": "devicecontroller", "group": "resource", "operation": "insert",
                          "resource": "node/n1/default/device/d1"},
                "content": {"a": 1}
            })
        );
    }

    #[test]
    fn parses_a_kubeedge_message_with_every_header_field() {
        let text = r#"{"header":{"msg_id":"b","parent_msg_id":"a","timestamp":5,"resourceversion":"7","sync":true,"type":"t"},
            "route":{"source":"twin","destination":"x","group":"twin","operation":"update","resource":"node/n/membership"},
            "content":"OK"}"#;
        let m: Message = serde_json::from_str(text).expect("parses");
        assert_eq!(m.header.parent_id, "a");
        assert!(m.header.sync);
        assert_eq!(m.header.message_type, "t");
        assert_eq!(m.route.destination, "x");
        let again: Message =
            serde_json::from_value(serde_json::to_value(&m).expect("ser")).expect("de");
        assert_eq!(again, m);
    }

    #[test]
    fn ack_points_at_its_parent() {
        let m = Message::new(
            "devicecontroller",
            "resource",
            "insert",
            "node/n1/default/device/d1",
            json!({}),
        );
        let ack = m.ack();
        assert_eq!(ack.header.parent_id, m.header.id);
        assert_ne!(ack.header.id, m.header.id);
        assert_eq!(ack.route.operation, "response");
        assert_eq!(ack.route.resource, m.route.resource);
        assert_eq!(ack.content, json!("OK"));
        assert!(ack.is_response());
        let err = m.error_response("no such device");
        assert_eq!(err.route.operation, "error");
        assert_eq!(err.header.parent_id, m.header.id);
    }

    #[test]
    fn keepalive_matches_edgehub() {
        let k = Message::keepalive();
        assert_eq!(
            (
                k.route.source.as_str(),
                k.route.group.as_str(),
                k.route.resource.as_str(),
                k.route.operation.as_str()
            ),
            ("websocket", "resource", "node", "keepalive")
        );
        assert_eq!(k.content, json!("ping"));
    }
}
