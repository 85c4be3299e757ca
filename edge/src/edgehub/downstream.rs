//! What the cloud sends a node, taken in: devices and models kept and published to the catalog,
//! pods, ConfigMaps and Secrets handed to edged, a device's history asked, and the fleet jobs'
//! questions ([`super::jobs`]); the cloud's answers to the node's reports kept to be cleared
//! from the outbox together.

use super::{EdgeHub, link};
use anyhow::{Context, Result};
use api::message::Message;
use api::paths::{DeviceId, Resource};
use serde_json::Value;

impl EdgeHub {
    /// A message from the cloud; what to answer, if anything.
    /// `catalog_stale`: set when an object was stored; the catalog is rebuilt once for many
    /// (rebuilding it per object made a node given thousands of devices take each one more
    /// slowly than the last).
    pub(super) async fn received(
        &self,
        msg: Message,
        link: &mut link::Link,
        later: &tokio::sync::mpsc::Sender<Message>,
        catalog_stale: &mut bool,
    ) -> Option<Message> {
        if !msg.header.parent_id.is_empty()
            && matches!(msg.route.operation.as_str(), "response" | "error")
        {
            // The cloud's answer to a report: stored (or refused for good) either way.
            if let Some(entries) = link.answered(&msg.header.parent_id, tokio::time::Instant::now())
            {
                if msg.route.operation == "error" {
                    tracing::warn!(content = %msg.content, "edgehub: the cloud refused a report; dropped");
                }
                // Cleared from the outbox with the other answers before it is read again.
                link.clear_later(entries);
            }
            return None;
        }
        let resource = match Resource::parse_downstream(&self.node, &msg.route.resource) {
            Ok(r) => r,
            Err(_) => {
                tracing::debug!(resource = %msg.route.resource, "edgehub: a message for no module here; ignored");
                return None;
            }
        };
        let Resource::Object {
            namespace,
            kind,
            name,
            ..
        } = resource
        else {
            // Membership: the devices themselves come as objects.
            return None;
        };
        let id = DeviceId::new(&namespace, &name);
        let stored = match (kind.as_str(), msg.route.operation.as_str()) {
            ("pod" | "configmap" | "secret", "insert" | "update") => {
                self.store_pod_object(&kind, (&namespace, &name), &msg.content)
                    .await
            }
            ("pod" | "configmap" | "secret", "delete") => {
                self.delete_pod_object(&kind, &namespace, &name).await
            }
            ("device" | "devicemodel", "insert" | "update") => {
                *catalog_stale = true;
                self.store_object(&kind, &id, &msg.content).await
            }
            ("device" | "devicemodel", "delete") => {
                *catalog_stale = true;
                self.delete_object(&kind, &id).await
            }
            ("devicehistory", "query") => return Some(self.answer_history(&msg, &id).await),
            ("devicealarm", "acknowledge") => return Some(self.answer_ack(&msg, &id).await),
            (job_kind, api::operations::OPERATION) if namespace == api::operations::NAMESPACE => {
                let link = self.link.lock().unwrap_or_else(|e| e.into_inner()).clone();
                if let Some(answer) = self.jobs.answer(job_kind, &name, &msg, link, later) {
                    return Some(answer);
                }
                tracing::debug!(%kind, "edgehub: not a job known here; ignored");
                return None;
            }
            _ => {
                tracing::debug!(%kind, op = %msg.route.operation, "edgehub: not a device message; ignored");
                return None;
            }
        };
        let mut answer = msg.ack();
        answer.route.source = "edgehub".into();
        match stored {
            Ok(()) => Some(answer),
            Err(e) => {
                // Not acknowledged: the cloud sends it again.
                tracing::warn!(object = %id, %kind, error = format!("{e:#}"), "edgehub: cannot store an object from the cloud");
                None
            }
        }
    }

    /// The cloud asks for a device's history (cloudcore's `devices/history`): answered from
    /// the store as the local API answers `GET .../properties/{p}/history`, or refused with
    /// that API's status and message.
    async fn answer_history(&self, msg: &Message, id: &DeviceId) -> Message {
        let q: twin::history::QueryText =
            serde_json::from_value(msg.content.clone()).unwrap_or_default();
        let property = msg.content["property"].as_str().unwrap_or_default();
        let now = twin::now_millis();
        let series = match q.parse(now) {
            Ok(query) => self
                .twin
                .history(id, property, query, now)
                .await
                .map_err(|e| (e.code(), e.to_string())),
            Err(e) => Err((400, e.to_string())),
        };
        let mut answer = match series {
            Ok(series) => msg.response(serde_json::to_value(series).unwrap_or_default()),
            Err((code, message)) => {
                let mut m = msg.response(serde_json::json!({"code": code, "message": message}));
                m.route.operation = "error".into();
                m
            }
        };
        answer.route.source = "edgehub".into();
        answer
    }

    /// A cloud user acknowledges an alarm (cloudcore's `devices/alarms`): content
    /// `{"rule", "by"}`; answered with the alarm as it now stands, or refused with the local
    /// API's status and message.
    async fn answer_ack(&self, msg: &Message, id: &DeviceId) -> Message {
        let rule = msg.content["rule"].as_str().unwrap_or_default();
        let by = msg.content["by"].as_str().unwrap_or_default();
        let mut answer = match self.alarms.acknowledge(id, rule, by).await {
            Ok(alarm) => msg.response(serde_json::to_value(alarm).unwrap_or_default()),
            Err(e) => {
                let code = match e {
                    crate::alarms::AckError::NoRule(..) => 404,
                    crate::alarms::AckError::Refused(_) => 409,
                };
                let mut m =
                    msg.response(serde_json::json!({"code": code, "message": e.to_string()}));
                m.route.operation = "error".into();
                m
            }
        };
        answer.route.source = "edgehub".into();
        answer
    }

    /// A pod, ConfigMap or Secret for edged: stored, then handed to edged.
    async fn store_pod_object(
        &self,
        kind: &str,
        (namespace, name): (&str, &str),
        content: &Value,
    ) -> Result<()> {
        let content: Value = match content {
            Value::String(s) => serde_json::from_str(s).context("content is not JSON")?,
            v => v.clone(),
        };
        if kind == "pod" {
            serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(content.clone())
                .context("content is not a Pod")?;
        }
        self.meta
            .save_pod_object(kind, namespace, name, &content)
            .await?;
        if let Some(p) = &self.pods {
            p.put(kind, (namespace.to_string(), name.to_string()), content)?;
        }
        Ok(())
    }

    async fn delete_pod_object(&self, kind: &str, namespace: &str, name: &str) -> Result<()> {
        self.meta.delete_pod_object(kind, namespace, name).await?;
        if let Some(p) = &self.pods {
            p.remove(kind, &(namespace.to_string(), name.to_string()));
        }
        Ok(())
    }

    async fn store_object(&self, kind: &str, id: &DeviceId, content: &Value) -> Result<()> {
        let content = match content {
            Value::String(s) => serde_json::from_str(s).context("content is not JSON")?,
            v => v.clone(),
        };
        let mut src = self.sources.lock().await;
        if kind == "device" {
            let d: api::v1beta1::Device =
                serde_json::from_value(content).context("content is not a Device")?;
            self.meta.save_cloud_device(id, &d).await?;
            src.cloud.devices.insert(id.clone(), d);
        } else {
            let m: api::v1beta1::DeviceModel =
                serde_json::from_value(content).context("content is not a DeviceModel")?;
            self.meta.save_cloud_model(id, &m).await?;
            src.cloud.models.insert(id.clone(), m);
        }
        Ok(())
    }

    async fn delete_object(&self, kind: &str, id: &DeviceId) -> Result<()> {
        let mut src = self.sources.lock().await;
        self.meta.delete_cloud_object(kind, id).await?;
        if kind == "device" {
            src.cloud.devices.remove(id);
        } else {
            src.cloud.models.remove(id);
        }
        Ok(())
    }
}
