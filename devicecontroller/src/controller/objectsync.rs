//! What nodes acknowledged before this start, from their ObjectSync records (cloudhub writes one
//! per node and object, `{node}.{uid}`): the first reconcile sends a node only what it lacks,
//! and the deletions it missed while away.

use super::Key;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

/// An object a node acknowledged, from its ObjectSync record.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivered {
    pub node: String,
    pub kind: &'static str,
    pub key: Key,
    pub uid: String,
    pub resource_version: String,
}

/// Reads an ObjectSync record (`{node}.{uid}`; a node name may hold dots, a uid does not).
pub fn delivered_of(v: &Value) -> Option<Delivered> {
    let name = v["metadata"]["name"].as_str()?;
    let (node, uid) = name.rsplit_once('.')?;
    let kind = match v["spec"]["objectKind"].as_str()? {
        "Device" => "device",
        "DeviceModel" => "devicemodel",
        _ => return None,
    };
    Some(Delivered {
        node: node.to_string(),
        kind,
        key: (
            v["metadata"]["namespace"].as_str()?.to_string(),
            v["spec"]["objectName"].as_str()?.to_string(),
        ),
        uid: uid.to_string(),
        resource_version: v["status"]["objectResourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    })
}

/// The ObjectSync records, all namespaces.
fn records(client: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "reliablesyncs.kubeedge.io",
        "v1alpha1",
        "ObjectSync",
    ));
    Api::all_with(client.clone(), &ar)
}

/// Every ObjectSync record, watched (replicas: what nodes acknowledge through any replica).
pub(super) fn watch_records(
    client: &kube::Client,
) -> futures_util::stream::BoxStream<
    'static,
    Result<kube::runtime::watcher::Event<DynamicObject>, kube::runtime::watcher::Error>,
> {
    use futures_util::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    watcher(records(client), watcher::Config::default())
        .default_backoff()
        .boxed()
}

/// Every ObjectSync record of devices and models. On an error, none: every node is then sent
/// everything it must hold (harmless), but deletions made while the controller was down do not
/// reach nodes that were away; logged.
pub(super) async fn list_delivered(client: &kube::Client) -> Vec<Delivered> {
    let api = records(client);
    let mut out = Vec::new();
    let mut lp = kube::api::ListParams::default().limit(500);
    loop {
        match api.list(&lp).await {
            Ok(list) => {
                out.extend(
                    list.items
                        .iter()
                        .filter_map(|o| serde_json::to_value(o).ok())
                        .filter_map(|v| delivered_of(&v)),
                );
                match list.metadata.continue_ {
                    Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                    _ => break,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot list ObjectSync records: every node is sent everything again, and deletions made while cloudcore was down may not reach nodes that were away");
                return Vec::new();
            }
        }
    }
    tracing::info!(records = out.len(), "ObjectSync records read");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(name: &str, kind: &str) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "plant"},
            "spec": {"objectKind": kind, "objectName": "oven-1"},
            "status": {"objectResourceVersion": "42"}
        })
    }

    #[test]
    fn a_record_names_its_node_before_the_last_dot_and_the_uid_after() {
        let d = delivered_of(&record("edge.site-1.0b1c", "Device")).expect("a device record");
        assert_eq!(
            d,
            Delivered {
                node: "edge.site-1".into(),
                kind: "device",
                key: ("plant".into(), "oven-1".into()),
                uid: "0b1c".into(),
                resource_version: "42".into(),
            }
        );
        let m = delivered_of(&record("edge-1.u", "DeviceModel")).expect("a model record");
        assert_eq!(m.kind, "devicemodel");
    }

    #[test]
    fn records_of_other_kinds_or_without_a_name_a_uid_or_a_namespace_are_not_the_controllers() {
        assert_eq!(delivered_of(&record("edge-1.u", "Pod")), None);
        assert_eq!(delivered_of(&record("nodot", "Device")), None);
        let mut v = record("edge-1.u", "Device");
        v["metadata"]["namespace"] = Value::Null;
        assert_eq!(delivered_of(&v), None);
        let mut v = record("edge-1.u", "Device");
        v["status"] = json!({});
        assert_eq!(
            delivered_of(&v).map(|d| d.resource_version),
            Some(String::new()),
            "a record not yet acknowledged has no version"
        );
    }
}
