//! What the API holds before it serves: the default namespaces, and the objects it is told to
//! install (cloudcore's CRDs, the fleet's Secret) created or brought up to date.

use anyhow::{Context, Result};
use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, header};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

use crate::api::{Api, Query};
use crate::{User, authz, store};

/// The default namespaces, and `install` created or brought up to date.
pub(crate) async fn bootstrap(api: &Arc<Api>, install: &[Value]) -> Result<()> {
    let mut objects: Vec<Value> = [
        "default",
        "kube-system",
        "kube-public",
        "kube-node-lease",
        "kubeedge",
    ]
    .iter()
    .map(|ns| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
    .collect();
    objects.extend(authz::bootstrap_roles());
    objects.extend(install.iter().cloned());
    for obj in objects {
        let (group, version) = match obj["apiVersion"]
            .as_str()
            .unwrap_or_default()
            .rsplit_once('/')
        {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (
                String::new(),
                obj["apiVersion"].as_str().unwrap_or_default().to_string(),
            ),
        };
        let kind = obj["kind"].as_str().unwrap_or_default();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let reg = api.registry();
        let res = reg
            .by_kind(&group, kind)
            .with_context(|| format!("cannot install {kind} {name}: kind not served"))?;
        let base = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let ns_part = match obj["metadata"]["namespace"].as_str() {
            Some(ns) if res.namespaced => format!("/namespaces/{ns}"),
            _ => String::new(),
        };
        let path = format!("{base}{ns_part}/{}", res.plural);
        let key = store::Key {
            res: res.store_key.clone(),
            ns: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            name: name.clone(),
        };
        let existing = api.store.read().get(&key).map(|o| o.value());
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, "application/json".parse()?);
        headers.insert(header::USER_AGENT, "cloudcore".parse()?);
        let (method, path, body) = match existing {
            None => (Method::POST, path, obj.clone()),
            Some(old) if old["spec"] != obj["spec"] => {
                let mut o = obj.clone();
                o["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
                (Method::PUT, format!("{path}/{name}"), o)
            }
            Some(_) => continue,
        };
        let creating = method == Method::POST;
        let r = api
            .clone()
            .dispatch(
                &User::server(),
                method,
                &path,
                Query::new(),
                headers,
                Body::from(body.to_string()),
            )
            .await;
        // Another replica starting at the same time made or updated it first (with the same
        // objects: every replica installs the same).
        if r.status() == StatusCode::CONFLICT {
            tracing::debug!(%kind, %name, creating, "bootstrap: written by another server first");
            // What follows may need it (a namespace): wait until this server's view has it.
            for _ in 0..250 {
                if api.store.read().get(&key).is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            continue;
        }
        if !r.status().is_success() {
            use http_body_util::BodyExt;
            let code = r.status();
            let text = r
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            anyhow::bail!(
                "cannot install {kind} {name}: {code}: {}",
                String::from_utf8_lossy(&text)
            );
        }
    }
    Ok(())
}
