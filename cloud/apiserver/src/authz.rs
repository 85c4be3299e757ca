//! Authorization, in kube-apiserver's order: members of `system:masters` may do anything; a
//! node (`system:node:NAME` in `system:nodes`) may reach its own objects (the Node authorizer);
//! everyone, nodes included, may do what RBAC grants them (Role, ClusterRole, RoleBinding,
//! ClusterRoleBinding of `rbac.authorization.k8s.io/v1`, stored like any object and read at
//! every request, so a binding grants and takes away access at once). Nothing else is allowed.
//!
//! What a node reaches, as the Node authorizer and NodeRestriction allow a kubelet:
//! - its own Node (read, update, patch, status) and its Lease in `kube-node-lease`;
//! - the pods bound to it (`spec.nodeName`): read, list and watch by `spec.nodeName`, status,
//!   delete; the ConfigMaps and Secrets those pods name (volumes, `envFrom`, `env`);
//! - the Devices bound to it and their status, and the DeviceModels they name;
//! - creating Events.
//!
//! A node may create its own Node and Lease: their name is in the body, so that create is
//! decided once the body is read ([`own_create`]), as NodeRestriction does.

use crate::User;
use crate::selector::Fields;
use crate::status::{Status, qualified};
use crate::store::{Key, Tables};
use serde_json::{Value, json};

/// What a request asks to do, as kube-apiserver's authorizers see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attributes<'a> {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`,
    /// `impersonate`.
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub sub: Option<&'a str>,
    pub ns: &'a str,
    pub name: Option<&'a str>,
    /// The parsed `fieldSelector` of a list or watch, the very one the list or watch then
    /// filters with: a node may list what it pins to itself.
    pub field_selector: Option<&'a Fields>,
}

const NODE_PREFIX: &str = "system:node:";
const RBAC: &str = "rbac.authorization.k8s.io";
const DEVICES: &str = "devices.kubeedge.io";

/// Whether `user` may do `a`.
pub(crate) fn allowed(t: &Tables, user: &User, a: &Attributes) -> bool {
    user.in_group("system:masters") || node_allows(t, user, a) || rbac_allows(t, user, a)
}

/// The 403 kube-apiserver answers, in its words.
pub(crate) fn forbidden(user: &User, a: &Attributes) -> Status {
    let resource = match a.sub {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    let what = match a.name {
        Some(n) => format!("{} \"{n}\"", qualified(a.group, a.resource)),
        None => qualified(a.group, a.resource),
    };
    let scope = if a.ns.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.ns)
    };
    let mut s = Status::new(
        403,
        "Forbidden",
        format!(
            "{what} is forbidden: User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.name, a.verb, a.group
        ),
    );
    s.details =
        Some(json!({"name": a.name.unwrap_or_default(), "group": a.group, "kind": a.resource}));
    s
}

/// The node a user is, when it is one.
pub(crate) fn node_of(user: &User) -> Option<&str> {
    user.name
        .strip_prefix(NODE_PREFIX)
        .filter(|n| !n.is_empty() && user.in_group("system:nodes"))
}

fn object(t: &Tables, store_key: &str, ns: &str, name: &str) -> Option<Value> {
    t.get(&Key {
        res: store_key.into(),
        ns: ns.to_string(),
        name: name.to_string(),
    })
    .map(|o| o.value())
}

/// Whether the selector keeps a list or watch to objects with `value` at `path`.
fn pinned(selector: Option<&Fields>, path: &str, value: &str) -> bool {
    selector.is_some_and(|f| f.pins(path, value))
}

fn bound_to(obj: &Value, node: &str) -> bool {
    obj["spec"]["nodeName"].as_str() == Some(node)
}

/// The pods of `ns` bound to `node`.
fn pods_of<'a>(t: &'a Tables, ns: &'a str, node: &'a str) -> impl Iterator<Item = Value> + 'a {
    t.objects
        .get("pods")
        .into_iter()
        .flat_map(move |m| m.iter())
        .filter(move |((pns, _), _)| pns == ns)
        .map(|(_, o)| o.value())
        .filter(move |p| bound_to(p, node))
}

/// Whether `pod` names ConfigMap (`secret` false) or Secret `name` in a volume or its env.
fn pod_names(pod: &Value, secret: bool, name: &str) -> bool {
    let spec = &pod["spec"];
    let volumes = spec["volumes"].as_array().into_iter().flatten();
    // How a volume names it (`secret.secretName` or `configMap.name`, or a projected source),
    // and the env (`envFrom`'s ref, a variable's key ref).
    let (kind, field, from, key_ref) = if secret {
        ("secret", "secretName", "secretRef", "secretKeyRef")
    } else {
        ("configMap", "name", "configMapRef", "configMapKeyRef")
    };
    let by_volume = volumes.into_iter().any(|v| {
        v[kind][field].as_str() == Some(name)
            || v["projected"]["sources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s[kind]["name"].as_str() == Some(name))
    });
    let containers = ["containers", "initContainers"]
        .iter()
        .flat_map(|k| spec[*k].as_array().into_iter().flatten());
    let by_env = containers.into_iter().any(|c| {
        c["envFrom"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e[from]["name"].as_str() == Some(name))
            || c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|e| e["valueFrom"][key_ref]["name"].as_str() == Some(name))
    });
    by_volume || by_env
}

fn node_allows(t: &Tables, user: &User, a: &Attributes) -> bool {
    let Some(node) = node_of(user) else {
        return false;
    };
    let read = matches!(a.verb, "get" | "list" | "watch");
    let listed = matches!(a.verb, "list" | "watch");
    match (a.group, a.resource) {
        ("", "nodes") => match a.name {
            Some(n) => n == node && matches!(a.verb, "get" | "watch" | "update" | "patch"),
            None => listed && pinned(a.field_selector, "metadata.name", node),
        },
        ("coordination.k8s.io", "leases") => {
            a.ns == "kube-node-lease"
                && a.name == Some(node)
                && matches!(a.verb, "get" | "watch" | "update" | "patch" | "delete")
        }
        ("", "pods") => match a.name {
            Some(name) => {
                let bound = object(t, "pods", a.ns, name).is_some_and(|p| bound_to(&p, node));
                bound
                    && match a.sub {
                        None => matches!(a.verb, "get" | "watch" | "delete"),
                        Some("status") => matches!(a.verb, "get" | "update" | "patch"),
                        Some(_) => false,
                    }
            }
            None => listed && pinned(a.field_selector, "spec.nodeName", node),
        },
        ("", kind @ ("configmaps" | "secrets")) => {
            let secret = kind == "secrets";
            let named = |name: &str| pods_of(t, a.ns, node).any(|p| pod_names(&p, secret, name));
            match a.name {
                Some(n) => matches!(a.verb, "get" | "watch") && named(n),
                // A list of one name: the selector pins `metadata.name` to a name the node's
                // pods name.
                None => {
                    listed
                        && (a.field_selector.into_iter())
                            .flat_map(|f| f.pinned("metadata.name"))
                            .any(named)
                }
            }
        }
        (DEVICES, "devices") => match a.name {
            Some(name) => {
                let bound = object(t, &format!("devices.{DEVICES}"), a.ns, name)
                    .is_some_and(|d| bound_to(&d, node));
                bound
                    && match a.sub {
                        None => read,
                        Some("status") => matches!(a.verb, "get" | "update" | "patch"),
                        Some(_) => false,
                    }
            }
            None => false,
        },
        (DEVICES, "devicemodels") => {
            let Some(name) = a.name.filter(|_| read) else {
                return false;
            };
            t.objects
                .get(format!("devices.{DEVICES}").as_str())
                .into_iter()
                .flat_map(|m| m.iter())
                .filter(|((ns, _), _)| ns == a.ns)
                .map(|(_, o)| o.value())
                .any(|d| bound_to(&d, node) && d["spec"]["deviceModelRef"]["name"] == name)
        }
        ("", "events") | ("events.k8s.io", "events") => matches!(a.verb, "create" | "patch"),
        _ => false,
    }
}

/// The node a create by `user` must name in its body for [`allowed`]'s refusal to be lifted:
/// a node creating its own Node, or its own Lease in `kube-node-lease`.
pub(crate) fn own_create<'u>(user: &'u User, a: &Attributes) -> Option<&'u str> {
    let node = node_of(user)?;
    let own = a.verb == "create"
        && a.name.is_none()
        && a.sub.is_none()
        && match (a.group, a.resource) {
            ("", "nodes") => true,
            ("coordination.k8s.io", "leases") => a.ns == "kube-node-lease",
            _ => false,
        };
    own.then_some(node)
}

/// Whether a binding's subject is `user`.
fn subject_is(subject: &Value, binding_ns: &str, user: &User) -> bool {
    let name = subject["name"].as_str().unwrap_or_default();
    match subject["kind"].as_str() {
        Some("User") => name == user.name,
        Some("Group") => user.in_group(name),
        Some("ServiceAccount") => {
            let ns = subject["namespace"].as_str().unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn has(list: &Value, want: &str) -> bool {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .any(|v| v == "*" || v == want)
}

/// Whether one of a role's rules grants `a`.
fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&rule["verbs"], a.verb) || !has(&rule["apiGroups"], a.group) {
        return false;
    }
    let resource = match a.sub {
        Some(s) => format!("{}/{s}", a.resource),
        None => a.resource.to_string(),
    };
    let resources = rule["resources"].as_array().into_iter().flatten();
    let resource_ok = resources.into_iter().filter_map(Value::as_str).any(|r| {
        r == "*"
            || r == resource
            || a.sub.is_some_and(|s| {
                r.strip_prefix("*/") == Some(s) || r == format!("{}/*", a.resource)
            })
    });
    if !resource_ok {
        return false;
    }
    match rule["resourceNames"].as_array() {
        Some(names) if !names.is_empty() => a
            .name
            .is_some_and(|n| names.iter().any(|v| v.as_str() == Some(n))),
        _ => true,
    }
}

/// The rules of the role a binding in `binding_ns` refers to (`roleRef`).
pub(crate) fn role_rules(t: &Tables, role_ref: &Value, binding_ns: &str) -> Vec<Value> {
    let name = role_ref["name"].as_str().unwrap_or_default();
    let role = match role_ref["kind"].as_str() {
        Some("ClusterRole") => object(t, &format!("clusterroles.{RBAC}"), "", name),
        Some("Role") => object(t, &format!("roles.{RBAC}"), binding_ns, name),
        _ => None,
    };
    role.and_then(|r| r["rules"].as_array().cloned())
        .unwrap_or_default()
}

/// Every rule RBAC grants `user` in namespace `ns` (cluster-wide ones with `ns` empty).
pub(crate) fn rbac_rules(t: &Tables, user: &User, ns: &str) -> Vec<Value> {
    let mut rules = Vec::new();
    let bindings = |kind: &str| {
        t.objects
            .get(format!("{kind}.{RBAC}").as_str())
            .into_iter()
            .flat_map(|m| m.iter())
    };
    for ((bns, _), b) in bindings("clusterrolebindings") {
        let b = b.value();
        let subjects = b["subjects"].as_array().into_iter().flatten();
        if subjects.into_iter().any(|s| subject_is(s, bns, user)) {
            rules.extend(role_rules(t, &b["roleRef"], ""));
        }
    }
    if !ns.is_empty() {
        for ((bns, _), b) in bindings("rolebindings") {
            if bns != ns {
                continue;
            }
            let b = b.value();
            let subjects = b["subjects"].as_array().into_iter().flatten();
            if subjects.into_iter().any(|s| subject_is(s, bns, user)) {
                rules.extend(role_rules(t, &b["roleRef"], bns));
            }
        }
    }
    rules
}

fn rbac_allows(t: &Tables, user: &User, a: &Attributes) -> bool {
    rbac_rules(t, user, a.ns).iter().any(|r| rule_allows(r, a))
}

/// What a node may do, as rules for `kubectl auth can-i --list` (object-scoped rules, such as
/// "the pods bound to it", cannot be written as rules: the review says it is incomplete).
fn node_rules(node: &str) -> Vec<Value> {
    vec![
        json!({"verbs": ["get", "watch", "update", "patch"], "apiGroups": [""], "resources": ["nodes", "nodes/status"], "resourceNames": [node]}),
        json!({"verbs": ["get", "watch", "update", "patch", "delete"], "apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [node]}),
        json!({"verbs": ["create", "patch"], "apiGroups": ["", "events.k8s.io"], "resources": ["events"]}),
    ]
}

/// The rules `user` has in `ns`, for a SelfSubjectRulesReview; `true` when some of what it may
/// do cannot be shown as rules.
pub(crate) fn rules_review(t: &Tables, user: &User, ns: &str) -> (Vec<Value>, bool) {
    if user.in_group("system:masters") {
        return (
            vec![json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]})],
            false,
        );
    }
    let mut rules = rbac_rules(t, user, ns);
    let node = node_of(user);
    if let Some(n) = node {
        rules.extend(node_rules(n));
    }
    let resource_rules = rules
        .into_iter()
        .filter(|r| r.get("nonResourceURLs").is_none())
        .map(|r| {
            let mut out = json!({"verbs": r["verbs"], "apiGroups": r["apiGroups"], "resources": r["resources"]});
            if let Some(names) = r.get("resourceNames").filter(|n| !n.is_null()) {
                out["resourceNames"] = names.clone();
            }
            out
        })
        .collect();
    (resource_rules, node.is_some())
}

/// The ClusterRoles and the binding kube-apiserver makes at start (RBAC's bootstrap policy),
/// as far as this API serves: `cluster-admin` (bound to `system:masters`), `admin`, `edit` and
/// `view`, which a RoleBinding gives in one namespace. As Kubernetes aggregates them, `admin`
/// holds all of `edit`, and `edit` all of `view`, so a namespace admin may bind either.
pub(crate) fn bootstrap_roles() -> Vec<Value> {
    let role = |name: &str, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "rules": rules})
    };
    let read = json!(["get", "list", "watch"]);
    let write = json!([
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection"
    ]);
    let core_viewable = json!([
        "configmaps",
        "endpoints",
        "events",
        "limitranges",
        "persistentvolumeclaims",
        "pods",
        "pods/log",
        "pods/status",
        "replicationcontrollers",
        "resourcequotas",
        "services",
        "namespaces"
    ]);
    // `devices/history`: a device's history read from its gateway; `devices/alarms`: its
    // alarms acknowledged there (`update`: edit and admin) (cloudcore's subresources).
    let kubeedge = json!([
        "devices",
        "devices/status",
        "devices/history",
        "devices/alarms",
        "devicemodels",
        "devicestatuses"
    ]);
    let apps = json!(["daemonsets", "deployments", "replicasets", "statefulsets"]);
    // A shell in a pod's container, its own process, its ports: edit and admin, as on a
    // cluster (view reads logs only).
    let pod_streams = json!(["pods/attach", "pods/exec", "pods/portforward"]);
    // `kubectl top` (metrics-server's aggregated-metrics-reader, aggregated into all three).
    let metrics = json!(["pods", "nodes"]);
    // What edit may do; admin adds roles of its namespace and access reviews.
    let edit = vec![
        json!({"verbs": write, "apiGroups": [""], "resources": ["configmaps", "endpoints", "events", "pods", "pods/status", "secrets", "services", "persistentvolumeclaims"]}),
        json!({"verbs": read, "apiGroups": [""], "resources": ["namespaces", "pods/log"]}),
        json!({"verbs": write, "apiGroups": [""], "resources": pod_streams}),
        json!({"verbs": read, "apiGroups": ["metrics.k8s.io"], "resources": metrics}),
        json!({"verbs": write, "apiGroups": ["apps"], "resources": apps}),
        json!({"verbs": write, "apiGroups": [DEVICES], "resources": kubeedge}),
        json!({"verbs": write, "apiGroups": ["coordination.k8s.io"], "resources": ["leases"]}),
        json!({"verbs": read, "apiGroups": [""], "resources": core_viewable}),
    ];
    vec![
        role(
            "cluster-admin",
            json!([{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
                   {"verbs": ["*"], "nonResourceURLs": ["*"]}]),
        ),
        role(
            "admin",
            Value::Array(
                [
                    edit.clone(),
                    vec![
                        json!({"verbs": write, "apiGroups": [RBAC], "resources": ["roles", "rolebindings"]}),
                        json!({"verbs": ["create"], "apiGroups": ["authorization.k8s.io"], "resources": ["localsubjectaccessreviews"]}),
                    ],
                ]
                .concat(),
            ),
        ),
        role(
            "edit",
            Value::Array(edit),
        ),
        role(
            "view",
            json!([
                {"verbs": read, "apiGroups": [""], "resources": core_viewable},
                {"verbs": read, "apiGroups": ["apps"], "resources": apps},
                {"verbs": read, "apiGroups": [DEVICES], "resources": kubeedge},
                {"verbs": read, "apiGroups": ["metrics.k8s.io"], "resources": metrics}
            ]),
        ),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "cluster-admin", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": RBAC, "kind": "Group", "name": "system:masters"}]}),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs<'a>(
        verb: &'a str,
        resource: &'a str,
        ns: &'a str,
        name: Option<&'a str>,
    ) -> Attributes<'a> {
        Attributes {
            verb,
            group: "",
            resource,
            sub: None,
            ns,
            name,
            field_selector: None,
        }
    }

    #[test]
    fn rules_match_verbs_groups_resources_and_names() {
        let rule = json!({"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods", "pods/status"], "resourceNames": ["a"]});
        assert!(rule_allows(&rule, &attrs("get", "pods", "d", Some("a"))));
        assert!(!rule_allows(&rule, &attrs("get", "pods", "d", Some("b"))));
        assert!(
            !rule_allows(&rule, &attrs("list", "pods", "d", None)),
            "named rules do not list"
        );
        assert!(!rule_allows(
            &rule,
            &attrs("delete", "pods", "d", Some("a"))
        ));
        let mut status = attrs("get", "pods", "d", Some("a"));
        status.sub = Some("status");
        assert!(rule_allows(&rule, &status));
        let mut other_group = attrs("get", "pods", "d", Some("a"));
        other_group.group = "apps";
        assert!(!rule_allows(&rule, &other_group));
        let any = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]});
        assert!(rule_allows(&any, &other_group));
        // A device's history is its own subresource: reading devices does not grant it.
        let mut history = attrs("get", "devices", "d", Some("oven"));
        history.group = "devices.kubeedge.io";
        history.sub = Some("history");
        let devices = json!({"verbs": ["get"], "apiGroups": ["devices.kubeedge.io"], "resources": ["devices"]});
        assert!(!rule_allows(&devices, &history));
        let with = json!({"verbs": ["get"], "apiGroups": ["devices.kubeedge.io"], "resources": ["devices", "devices/history"]});
        assert!(rule_allows(&with, &history));
    }

    #[test]
    fn subjects_are_users_groups_and_service_accounts() {
        let u = User::new("bob", vec!["team".into()]);
        assert!(subject_is(&json!({"kind": "User", "name": "bob"}), "d", &u));
        assert!(subject_is(
            &json!({"kind": "Group", "name": "team"}),
            "d",
            &u
        ));
        assert!(subject_is(
            &json!({"kind": "Group", "name": "system:authenticated"}),
            "d",
            &u
        ));
        assert!(!subject_is(
            &json!({"kind": "User", "name": "alice"}),
            "d",
            &u
        ));
        let sa = User::new("system:serviceaccount:d:robot", vec![]);
        assert!(subject_is(
            &json!({"kind": "ServiceAccount", "name": "robot"}),
            "d",
            &sa
        ));
        assert!(!subject_is(
            &json!({"kind": "ServiceAccount", "name": "robot"}),
            "e",
            &sa
        ));
    }

    #[test]
    fn a_node_is_only_a_node_with_both_its_name_and_group() {
        let n = User::new("system:node:n1", vec!["system:nodes".into()]);
        assert_eq!(node_of(&n), Some("n1"));
        assert_eq!(node_of(&User::new("system:node:n1", vec![])), None);
        assert_eq!(node_of(&User::new("n1", vec!["system:nodes".into()])), None);
    }

    #[test]
    fn a_pod_names_its_config_maps_and_secrets_in_volumes_and_env() {
        let pod = json!({"spec": {"volumes": [{"name": "v", "secret": {"secretName": "s1"}}],
            "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "cm1"}}],
                "env": [{"name": "E", "valueFrom": {"secretKeyRef": {"name": "s2", "key": "k"}}}]}]}});
        assert!(pod_names(&pod, true, "s1"));
        assert!(pod_names(&pod, true, "s2"));
        assert!(pod_names(&pod, false, "cm1"));
        assert!(
            !pod_names(&pod, false, "s1"),
            "a Secret's name is not a ConfigMap's"
        );
        assert!(!pod_names(&pod, true, "other"));
    }

    #[test]
    fn the_forbidden_message_is_kube_apiservers() {
        let u = User::new("system:node:n1", vec!["system:nodes".into()]);
        let s = forbidden(&u, &attrs("list", "secrets", "", None));
        assert_eq!(
            s.to_json()["message"],
            "secrets is forbidden: User \"system:node:n1\" cannot list resource \"secrets\" in API group \"\" at the cluster scope"
        );
        let mut a = attrs("delete", "devices", "default", Some("d1"));
        a.group = DEVICES;
        assert_eq!(
            forbidden(&u, &a).to_json()["message"],
            "devices.devices.kubeedge.io \"d1\" is forbidden: User \"system:node:n1\" cannot delete resource \"devices\" in API group \"devices.kubeedge.io\" in the namespace \"default\""
        );
    }
}
