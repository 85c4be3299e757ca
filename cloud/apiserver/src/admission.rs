//! What Kubernetes checks on the object a user writes, once the authorizer has let the verb
//! through: rules that depend on the object's content, decided on the object as it will be
//! stored (after a patch is applied), never on the request's text.
//!
//! - **NodeRestriction, labels**: a node may set on its own Node only the labels a kubelet sets.
//!   ([`api::validate::node::may_set_label`]). A create names the labels it may not set, an
//!   update or patch the ones it may not modify (added, changed or removed).
//! - **Desired values that can never land**: a Device's desired value must fit its model's
//!   type, minimum and maximum, and its property must not be ReadOnly (the checks and words of
//!   `api::validate`, as the edge's), else 422 naming the field path. Only values that change
//!   are judged, so a value stored before (or a model changed since) does not hold back a
//!   write of another property.
//! - **Authority follows the author**: an ImagePrePullJob may name in `imageSecrets` only a
//!   Secret its author may `get` (cloudcore reads it with its own rights and sends it to the
//!   nodes), judged when the field is set or changed.
//! - **RBAC escalation**: a Role or ClusterRole may grant only what its author holds in that
//!   namespace (cluster-wide for a ClusterRole), unless the author may `escalate` it; a binding
//!   may give only a role whose every rule its author holds where the binding applies, unless
//!   the author may `bind` that role. `system:masters` holds everything.

use crate::User;
use crate::authz::{self, Attributes};
use crate::status::{Cause, Status, qualified};
use crate::store::Tables;
use api::validate::node::may_set_label;
use serde_json::Value;
use std::collections::BTreeSet;

const RBAC: &str = "rbac.authorization.k8s.io";
const JOBS: &str = "operations.kubeedge.io";

/// Who writes, with what the checks above need to know about them, read before the write.
pub(crate) struct Author {
    pub user: User,
    /// The RBAC objects when the write is one of them (roles and bindings), for the escalation
    /// check, or an ImagePrePullJob, for its Secret; `None` otherwise (and for
    /// `system:masters`).
    pub rbac: Option<Tables>,
    /// The DeviceModels when the write is a Device's spec, for its desired values.
    pub models: Option<Tables>,
    /// The Pod Security levels of the namespace when the write is a pod (not its status).
    pub pod_security: Option<crate::podsecurity::Policy>,
}

const DEVICES: &str = "devices.kubeedge.io";

/// The store key of DeviceModels.
pub(crate) const MODELS_KEY: &str = "devicemodels.devices.kubeedge.io";

/// The desired values of `new` that can never land on the device, as 422 causes: each one
/// that changed from `old` and does not fit its model (type, minimum, maximum, access mode).
fn desired_values(models: &Tables, ns: &str, old: Option<&Value>, new: &Value) -> Vec<Cause> {
    use api::v1beta1::DeviceModel;
    let Some(model) = new["spec"]["deviceModelRef"]["name"]
        .as_str()
        .and_then(|name| {
            models.get(&crate::store::Key {
                res: std::sync::Arc::from(MODELS_KEY),
                ns: ns.to_string(),
                name: name.to_string(),
            })
        })
        .and_then(|m| serde_json::from_value::<DeviceModel>(m.value()).ok())
    else {
        return Vec::new();
    };
    unlandable_causes(new, old, &model)
}

/// The causes of [`desired_values`] against `model`.
fn unlandable_causes(
    new: &Value,
    old: Option<&Value>,
    model: &api::v1beta1::DeviceModel,
) -> Vec<Cause> {
    use api::v1beta1::Device;
    let Ok(device) = serde_json::from_value::<Device>(new.clone()) else {
        return Vec::new();
    };
    let before = old.and_then(|o| serde_json::from_value::<Device>(o.clone()).ok());
    let rules = &new["metadata"]["annotations"][api::alarm::ANNOTATION];
    api::validate::unlandable_desired(&device, model, before.as_ref())
        .into_iter()
        .map(|(i, problem)| {
            let value = &new["spec"]["properties"][i]["desired"]["value"];
            Cause::invalid(problem.path, value, &problem.message)
        })
        .chain(
            api::alarm::changed_problems(&device, model, before.as_ref())
                .into_iter()
                .map(|p| Cause::invalid(p.path, rules, &p.message)),
        )
        .collect()
}

/// Why a write of the Device `new` (replacing `old`) is refused because a desired value that
/// changed cannot land on a device of `model`, in the embedded API's words (kube-apiserver's
/// for an invalid object); `None` when it may be stored. cloudcore's admission webhook for a
/// real cluster says the same.
pub fn refused_device(
    new: &Value,
    old: Option<&Value>,
    model: &api::v1beta1::DeviceModel,
) -> Option<String> {
    let causes = unlandable_causes(new, old, model);
    if causes.is_empty() {
        return None;
    }
    let name = new["metadata"]["name"].as_str().unwrap_or_default();
    Some(Status::invalid("Device", DEVICES, name, causes).message)
}

/// The check of a write of `new` (with `old` the stored object, if any) of `plural` in
/// `group`, named `name` in `ns`, by `author`.
pub(crate) fn admit(
    author: &Author,
    (group, plural): (&str, &str),
    ns: &str,
    name: &str,
    old: Option<&Value>,
    new: &Value,
) -> Result<(), Status> {
    let forbidden = |why: String| {
        Status::new(
            403,
            "Forbidden",
            format!(
                "{} \"{name}\" is forbidden: {why}",
                qualified(group, plural)
            ),
        )
    };
    if let Some(node) = authz::node_of(&author.user)
        && (group, plural) == ("", "nodes")
        && name == node
    {
        let refused = node_labels(old.map(labels).as_ref(), &labels(new));
        if !refused.is_empty() {
            let list = refused.into_iter().collect::<Vec<_>>().join(", ");
            return Err(forbidden(match old {
                None => format!("is not allowed to set the following labels: {list}"),
                Some(_) => format!("is not allowed to modify labels: {list}"),
            }));
        }
    }
    if (group, plural) == (DEVICES, "devices")
        && let Some(models) = &author.models
    {
        let causes = desired_values(models, ns, old, new);
        if !causes.is_empty() {
            return Err(Status::invalid("Device", DEVICES, name, causes));
        }
    }
    if (group, plural) == (JOBS, "imageprepulljobs")
        && let Some(t) = &author.rbac
    {
        let secret = |v: &Value| {
            v["spec"]["imagePrePullTemplate"]["imageSecrets"]
                .as_str()
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        if let Some(s) = secret(new)
            && old.and_then(secret).as_ref() != Some(&s)
            && let Some((secret_ns, secret_name)) = s.split_once('/')
        {
            let may = Attributes {
                verb: "get",
                group: "",
                resource: "secrets",
                sub: None,
                ns: secret_ns,
                name: Some(secret_name),
                field_selector: None,
            };
            if !authz::allowed(t, &author.user, &may) {
                return Err(forbidden(format!(
                    "spec.imagePrePullTemplate.imageSecrets names the Secret {s}, which User \"{}\" may not get: a job uses only Secrets its author may read",
                    author.user.name
                )));
            }
        }
    }
    if group == RBAC
        && let Some(t) = &author.rbac
        && !author.user.in_group("system:masters")
    {
        let user = &author.user;
        let (granted, scope) = match plural {
            "roles" | "clusterroles" => {
                let may = Attributes {
                    verb: "escalate",
                    group: RBAC,
                    resource: plural,
                    sub: None,
                    ns,
                    name: Some(name),
                    field_selector: None,
                };
                if authz::allowed(t, user, &may) {
                    return Ok(());
                }
                (rules(&new["rules"]), ns)
            }
            "rolebindings" | "clusterrolebindings" => {
                let role = &new["roleRef"];
                let kind = match role["kind"].as_str() {
                    Some("ClusterRole") => "clusterroles",
                    _ => "roles",
                };
                let may = Attributes {
                    verb: "bind",
                    group: RBAC,
                    resource: kind,
                    sub: None,
                    ns,
                    name: role["name"].as_str(),
                    field_selector: None,
                };
                if authz::allowed(t, user, &may) {
                    return Ok(());
                }
                (authz::role_rules(t, role, ns), ns)
            }
            _ => return Ok(()),
        };
        let held = authz::rbac_rules(t, user, scope);
        let missing: Vec<&Value> = granted.iter().filter(|r| !covered(&held, r)).collect();
        if !missing.is_empty() {
            let groups: Vec<String> = user.groups.iter().map(|g| format!("{g:?}")).collect();
            let list: Vec<String> = missing.iter().map(|r| show(r)).collect();
            return Err(forbidden(format!(
                "user {:?} (groups=[{}]) is attempting to grant RBAC permissions not currently held:\n{}",
                user.name,
                groups.join(" "),
                list.join("\n")
            )));
        }
    }
    Ok(())
}

fn labels(obj: &Value) -> Vec<(String, String)> {
    (obj["metadata"]["labels"].as_object().into_iter().flatten())
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect()
}

/// The labels among those a node changes (from `old`, `None` at a create, to `new`) that it
/// may not set.
fn node_labels(old: Option<&Vec<(String, String)>>, new: &[(String, String)]) -> BTreeSet<String> {
    let before = old.map(Vec::as_slice).unwrap_or_default();
    let changed = (new.iter())
        .filter(|l| !before.contains(l))
        .chain(
            before
                .iter()
                .filter(|(k, _)| !new.iter().any(|(n, _)| n == k)),
        )
        .map(|(k, _)| k);
    changed.filter(|k| !may_set_label(k)).cloned().collect()
}

fn rules(v: &Value) -> Vec<Value> {
    v.as_array().cloned().unwrap_or_default()
}

fn strings(v: &Value) -> Vec<&str> {
    (v.as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect()
}

/// A rule as kube-apiserver prints it in an escalation refusal.
fn show(rule: &Value) -> String {
    let list = |k: &str| {
        let v: Vec<String> = strings(&rule[k]).iter().map(|s| format!("{s:?}")).collect();
        v.join(" ")
    };
    let mut parts = Vec::new();
    for (key, shown) in [
        ("apiGroups", "APIGroups"),
        ("resources", "Resources"),
        ("resourceNames", "ResourceNames"),
        ("nonResourceURLs", "NonResourceURLs"),
        ("verbs", "Verbs"),
    ] {
        if !strings(&rule[key]).is_empty() {
            parts.push(format!("{shown}:[{}]", list(key)));
        }
    }
    format!("{{{}}}", parts.join(", "))
}

/// Whether the rules `held` grant everything `rule` grants: each of its verbs on each of its
/// resources (by each of its names) or URLs. A `*` in `rule` is covered only by a `*`.
fn covered(held: &[Value], rule: &Value) -> bool {
    let verbs = strings(&rule["verbs"]);
    let urls = strings(&rule["nonResourceURLs"]);
    if !urls.is_empty() {
        return urls.iter().all(|url| {
            verbs.iter().all(|verb| {
                held.iter().any(|h| {
                    matches(&h["verbs"], verb)
                        && strings(&h["nonResourceURLs"]).iter().any(|u| {
                            u == url || u.strip_suffix('*').is_some_and(|p| url.starts_with(p))
                        })
                })
            })
        });
    }
    let names = strings(&rule["resourceNames"]);
    let names: Vec<Option<&str>> = match names.is_empty() {
        true => vec![None],
        false => names.into_iter().map(Some).collect(),
    };
    let groups = strings(&rule["apiGroups"]);
    let resources = strings(&rule["resources"]);
    groups.iter().all(|g| {
        resources.iter().all(|r| {
            verbs.iter().all(|verb| {
                names.iter().all(|name| {
                    held.iter().any(|h| {
                        matches(&h["verbs"], verb)
                            && matches(&h["apiGroups"], g)
                            && resource_covered(&h["resources"], r)
                            && match strings(&h["resourceNames"]) {
                                n if n.is_empty() => true,
                                n => name.is_some_and(|name| n.contains(&name)),
                            }
                    })
                })
            })
        })
    })
}

fn matches(held: &Value, want: &str) -> bool {
    strings(held).iter().any(|h| *h == "*" || *h == want)
}

fn resource_covered(held: &Value, want: &str) -> bool {
    strings(held).iter().any(|h| {
        *h == "*"
            || *h == want
            || want.split_once('/').is_some_and(|(res, sub)| {
                h.strip_prefix("*/") == Some(sub) || h.strip_suffix("/*") == Some(res)
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    fn l(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        (pairs.iter())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_node_sets_the_kubelets_labels_and_its_own_but_no_restricted_one() {
        let new = l(&[
            ("kubernetes.io/hostname", "n1"),
            ("topology.kubernetes.io/zone", "a"),
            ("kubelet.kubernetes.io/x", "1"),
            ("sub.node.kubernetes.io/y", "1"),
            ("site", "plant-3"),
            ("example.com/line", "4"),
            ("node-restriction.kubernetes.io/site", "other"),
            ("a.node-restriction.kubernetes.io/b", "1"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("k8s.io/x", "1"),
            ("x.k8s.io/y", "1"),
        ]);
        assert_eq!(
            node_labels(None, &new),
            set(&[
                "a.node-restriction.kubernetes.io/b",
                "k8s.io/x",
                "node-restriction.kubernetes.io/site",
                "node-role.kubernetes.io/control-plane",
                "x.k8s.io/y",
            ])
        );
    }

    #[test]
    fn a_node_keeps_restricted_labels_it_does_not_change_and_may_not_remove_or_change_them() {
        let old = l(&[("node-restriction.kubernetes.io/site", "a"), ("site", "x")]);
        // Unchanged: allowed; its own label changed: allowed.
        let kept = l(&[("node-restriction.kubernetes.io/site", "a"), ("site", "y")]);
        assert!(node_labels(Some(&old), &kept).is_empty());
        let changed = l(&[("node-restriction.kubernetes.io/site", "b"), ("site", "x")]);
        assert_eq!(
            node_labels(Some(&old), &changed),
            set(&["node-restriction.kubernetes.io/site"])
        );
        let removed = l(&[("site", "x")]);
        assert_eq!(
            node_labels(Some(&old), &removed),
            set(&["node-restriction.kubernetes.io/site"])
        );
    }

    #[test]
    fn a_rule_is_covered_only_by_rules_granting_at_least_as_much() {
        let held = vec![
            json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "configmaps"]}),
            json!({"verbs": ["*"], "apiGroups": ["apps"], "resources": ["deployments"]}),
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]}),
            json!({"verbs": ["update"], "apiGroups": [""], "resources": ["*/status"]}),
            json!({"verbs": ["get"], "nonResourceURLs": ["/healthz", "/metrics/*"]}),
        ];
        let yes = |r: Value| assert!(covered(&held, &r), "{r}");
        let no = |r: Value| assert!(!covered(&held, &r), "{r}");
        yes(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}));
        yes(
            json!({"verbs": ["delete", "create"], "apiGroups": ["apps"], "resources": ["deployments"]}),
        );
        yes(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1"]}),
        );
        yes(json!({"verbs": ["update"], "apiGroups": [""], "resources": ["pods/status"]}));
        yes(json!({"verbs": ["get"], "nonResourceURLs": ["/metrics/cpu"]}));
        yes(json!({"verbs": [], "apiGroups": [""], "resources": ["pods"]}));
        no(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"]}));
        no(
            json!({"verbs": ["get"], "apiGroups": [""], "resources": ["secrets"], "resourceNames": ["s1", "s2"]}),
        );
        no(json!({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}));
        no(json!({"verbs": ["get"], "apiGroups": ["*"], "resources": ["pods"]}));
        no(json!({"verbs": ["get"], "apiGroups": [""], "resources": ["*"]}));
        no(json!({"verbs": ["watch"], "apiGroups": [""], "resources": ["pods"]}));
        no(json!({"verbs": ["update"], "apiGroups": [""], "resources": ["pods"]}));
        no(json!({"verbs": ["get"], "nonResourceURLs": ["*"]}));
        // cluster-admin's rules are covered by cluster-admin's only.
        let admin = vec![
            json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}),
            json!({"verbs": ["*"], "nonResourceURLs": ["*"]}),
        ];
        for r in &admin {
            assert!(covered(&admin, r));
            assert!(!covered(&held, r));
        }
    }

    #[test]
    fn a_refused_rule_is_printed_as_kube_apiserver_prints_it() {
        let r = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]});
        assert_eq!(
            show(&r),
            r#"{APIGroups:["*"], Resources:["*"], Verbs:["*"]}"#
        );
    }
}
