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
            // A default ClusterRole of an older version gains the rules it lacks (its own and
            // any added to it are kept), as kube-apiserver reconciles them, unless annotated
            // `rbac.authorization.kubernetes.io/autoupdate: "false"`.
            Some(old) if kind == "ClusterRole" => match reconciled_rules(&old, &obj) {
                Some(rules) => {
                    let mut o = old.clone();
                    o["rules"] = rules;
                    (Method::PUT, format!("{path}/{name}"), o)
                }
                None => continue,
            },
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
                Body::from(body.to_string()).into(),
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

/// The rules of stored ClusterRole `old` with those of `default` it lacks added, or `None` when
/// it lacks none or may not be updated (`autoupdate: "false"`).
fn reconciled_rules(old: &Value, default: &Value) -> Option<Value> {
    if old["metadata"]["annotations"]["rbac.authorization.kubernetes.io/autoupdate"] == "false" {
        return None;
    }
    let mut rules = old["rules"].as_array().cloned().unwrap_or_default();
    let before = rules.len();
    for r in default["rules"].as_array().into_iter().flatten() {
        if !rules.contains(r) {
            rules.push(r.clone());
        }
    }
    (rules.len() > before).then_some(Value::Array(rules))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_default_role_gains_the_rules_it_lacks_and_keeps_its_own() {
        let default =
            json!({"rules": [{"verbs": ["get"], "resources": ["devices", "devices/history"]}]});
        let old = json!({"metadata": {}, "rules": [
            {"verbs": ["get"], "resources": ["devices"]},
            {"verbs": ["list"], "resources": ["widgets"]}]});
        let rules = reconciled_rules(&old, &default).expect("updated");
        assert_eq!(rules.as_array().map(Vec::len), Some(3), "{rules}");
        assert_eq!(rules[2], default["rules"][0]);
        let mut current = old.clone();
        current["rules"] = rules;
        assert_eq!(
            reconciled_rules(&current, &default),
            None,
            "nothing lacking"
        );
        let mut pinned = old;
        pinned["metadata"]["annotations"] =
            json!({"rbac.authorization.kubernetes.io/autoupdate": "false"});
        assert_eq!(
            reconciled_rules(&pinned, &default),
            None,
            "autoupdate false"
        );
    }
}
