//! Pod Security admission, as kube-apiserver applies the Pod Security Standards: a namespace's
//! `pod-security.kubernetes.io/enforce` label (`privileged`, `baseline`, `restricted`) refuses a
//! pod that breaks its level (403, the checks named as kube-apiserver names them), `warn` adds a
//! warning to the answer and stores the pod. A namespace without the labels is `privileged`,
//! kube-apiserver's default; `-version` labels are read as `latest`. Checked on a pod's create
//! and on an update that changes its spec; a pod's status (written by its node) is not judged.

use serde_json::Value;

/// A Pod Security Standard level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    fn parse(s: &str) -> Option<Level> {
        match s {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// What a namespace's labels ask: the level enforced and the level warned about. A label with
/// a value that is no level is read as `restricted` for enforce (the safe reading of a typo)
/// and ignored for warn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Policy {
    pub enforce: Level,
    pub warn: Option<Level>,
}

impl Policy {
    pub(crate) fn of_namespace(ns: Option<&Value>) -> Policy {
        let label = |k: &str| {
            ns.and_then(|n| {
                n["metadata"]["labels"][format!("pod-security.kubernetes.io/{k}")].as_str()
            })
        };
        Policy {
            enforce: label("enforce").map_or(Level::Privileged, |v| {
                Level::parse(v).unwrap_or(Level::Restricted)
            }),
            warn: label("warn").and_then(Level::parse),
        }
    }
}

/// The containers of a pod spec: containers, init containers and ephemeral containers.
fn containers(spec: &Value) -> std::vec::IntoIter<&Value> {
    ["containers", "initContainers", "ephemeralContainers"]
        .into_iter()
        .flat_map(|k| spec[k].as_array().into_iter().flatten())
        .collect::<Vec<_>>()
        .into_iter()
}

fn names<'a>(it: impl Iterator<Item = &'a Value>) -> String {
    it.map(|c| format!("{:?}", c["name"].as_str().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `check (container "a" must ...)` or `check (containers "a", "b" must ...)` for the
/// containers `found`, when there are any.
fn each(out: &mut Vec<String>, found: Vec<&Value>, check: &str, must: &str) {
    if found.is_empty() {
        return;
    }
    let which = if found.len() == 1 {
        "container"
    } else {
        "containers"
    };
    // The pod-level checks name the pod too: "pod or container ...".
    let (check, or_pod) = match check.strip_prefix("pod or ") {
        Some(c) => (c, "pod or "),
        None => (check, ""),
    };
    out.push(format!(
        "{check} ({or_pod}{which} {} must {must})",
        names(found.into_iter())
    ));
}

/// The capabilities the containers add that `allowed` does not allow, quoted, once each.
fn added_caps(spec: &Value, allowed: impl Fn(&str) -> bool) -> Vec<String> {
    let mut added: Vec<String> = containers(spec)
        .flat_map(|c| {
            c["securityContext"]["capabilities"]["add"]
                .as_array()
                .into_iter()
                .flatten()
        })
        .filter_map(Value::as_str)
        .filter(|cap| !allowed(cap))
        .map(|cap| format!("{cap:?}"))
        .collect();
    added.dedup();
    added
}

/// Capabilities baseline lets a container add.
const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls baseline allows.
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
];

/// Volume kinds restricted allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// What `pod` breaks of `level`, each as kube-apiserver words it (`host namespaces
/// (hostNetwork=true)`, `privileged (container "c" must not set ...)`), in its order.
pub(crate) fn violations(level: Level, pod: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if level == Level::Privileged {
        return out;
    }
    let spec = &pod["spec"];
    let sc = |c: &Value| c["securityContext"].clone();
    // Baseline.
    let host: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .into_iter()
        .filter(|k| spec[*k] == true)
        .map(|k| format!("{k}=true"))
        .collect();
    if !host.is_empty() {
        out.push(format!("host namespaces ({})", host.join(", ")));
    }
    let privileged: Vec<&Value> = containers(spec)
        .filter(|c| sc(c)["privileged"] == true)
        .collect();
    each(
        &mut out,
        privileged,
        "privileged",
        "not set securityContext.privileged=true",
    );
    let added = added_caps(spec, |cap| BASELINE_CAPS.contains(&cap));
    if !added.is_empty() {
        out.push(format!(
            "non-default capabilities (containers must not include {} in securityContext.capabilities.add)",
            added.join(", ")
        ));
    }
    let host_paths: Vec<&Value> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v.get("hostPath").is_some())
        .collect();
    if !host_paths.is_empty() {
        let which = if host_paths.len() == 1 {
            "volume"
        } else {
            "volumes"
        };
        out.push(format!(
            "hostPath volumes ({which} {})",
            names(host_paths.into_iter())
        ));
    }
    let mut ports = Vec::new();
    for c in containers(spec) {
        for p in c["ports"].as_array().into_iter().flatten() {
            if let Some(h) = p["hostPort"].as_i64().filter(|h| *h != 0) {
                ports.push(h.to_string());
            }
        }
    }
    if !ports.is_empty() {
        out.push(format!(
            "hostPort (containers must not use hostPort {})",
            ports.join(", ")
        ));
    }
    let contexts: Vec<&Value> = std::iter::once(&spec["securityContext"])
        .chain(containers(spec).map(|c| &c["securityContext"]))
        .collect();
    let profiles = contexts.iter().copied();
    if profiles
        .clone()
        .any(|s| matches!(s["appArmorProfile"]["type"].as_str(), Some(t) if t != "RuntimeDefault" && t != "Localhost"))
        || pod["metadata"]["annotations"].as_object().is_some_and(|a| {
            a.iter().any(|(k, v)| {
                k.starts_with("container.apparmor.security.beta.kubernetes.io/")
                    && !matches!(v.as_str(), Some(v) if v == "runtime/default" || v.starts_with("localhost/"))
            })
        })
    {
        out.push("forbidden AppArmor profile".into());
    }
    if profiles.clone().any(|s| {
        let o = &s["seLinuxOptions"];
        !o["user"].is_null()
            || !o["role"].is_null()
            || !matches!(
                o["type"].as_str(),
                None | Some(
                    "" | "container_t"
                        | "container_init_t"
                        | "container_kvm_t"
                        | "container_engine_t"
                )
            )
    }) {
        out.push("seLinuxOptions (the pod and its containers must not set user or role, nor a type other than container_t and its kin)".into());
    }
    if containers(spec).any(|c| matches!(sc(c)["procMount"].as_str(), Some(m) if m != "Default")) {
        out.push("procMount (containers must not set securityContext.procMount to a value other than Default)".into());
    }
    if profiles
        .clone()
        .any(|s| s["seccompProfile"]["type"] == "Unconfined")
    {
        out.push("seccompProfile (the pod and its containers must not set securityContext.seccompProfile.type to \"Unconfined\")".into());
    }
    let sysctls: Vec<String> = spec["securityContext"]["sysctls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["name"].as_str())
        .filter(|n| !SAFE_SYSCTLS.contains(n))
        .map(|n| format!("{n:?}"))
        .collect();
    if !sysctls.is_empty() {
        out.push(format!("forbidden sysctls ({})", sysctls.join(", ")));
    }
    if level == Level::Baseline {
        return out;
    }
    // Restricted.
    let volumes: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let kind = v.as_object()?.keys().find(|k| k.as_str() != "name")?;
            (!RESTRICTED_VOLUMES.contains(&kind.as_str()))
                .then(|| format!("{:?} uses {kind}", v["name"].as_str().unwrap_or_default()))
        })
        .collect();
    if !volumes.is_empty() {
        out.push(format!("restricted volume types ({})", volumes.join(", ")));
    }
    let escalating: Vec<&Value> = containers(spec)
        .filter(|c| sc(c)["allowPrivilegeEscalation"] != false)
        .collect();
    each(
        &mut out,
        escalating,
        "allowPrivilegeEscalation != false",
        "set securityContext.allowPrivilegeEscalation=false",
    );
    let pod_non_root = spec["securityContext"]["runAsNonRoot"] == true;
    let rooted: Vec<&Value> = containers(spec)
        .filter(|c| match &sc(c)["runAsNonRoot"] {
            Value::Bool(b) => !b,
            _ => !pod_non_root,
        })
        .collect();
    if spec["securityContext"]["runAsNonRoot"] == false {
        out.push(
            "runAsNonRoot != true (pod must not set securityContext.runAsNonRoot=false)".into(),
        );
    } else {
        each(
            &mut out,
            rooted,
            "pod or runAsNonRoot != true",
            "set securityContext.runAsNonRoot=true",
        );
    }
    if profiles.clone().any(|s| s["runAsUser"] == 0) {
        out.push("runAsUser=0 (the pod and its containers must not set runAsUser=0)".into());
    }
    let pod_seccomp = matches!(
        spec["securityContext"]["seccompProfile"]["type"].as_str(),
        Some("RuntimeDefault" | "Localhost")
    );
    let unconfined: Vec<&Value> = containers(spec)
        .filter(|c| match sc(c)["seccompProfile"]["type"].as_str() {
            Some(t) => t != "RuntimeDefault" && t != "Localhost",
            None => !pod_seccomp,
        })
        .collect();
    each(
        &mut out,
        unconfined,
        "pod or seccompProfile",
        "set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
    );
    let undropped: Vec<&Value> = containers(spec)
        .filter(|c| {
            !sc(c)["capabilities"]["drop"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x == "ALL"))
        })
        .collect();
    each(
        &mut out,
        undropped,
        "unrestricted capabilities",
        "set securityContext.capabilities.drop=[\"ALL\"]",
    );
    let added = added_caps(spec, |cap| cap == "NET_BIND_SERVICE");
    if !added.is_empty() {
        out.push(format!(
            "unrestricted capabilities (containers must not include {} in securityContext.capabilities.add)",
            added.join(", ")
        ));
    }
    out
}

/// kube-apiserver's refusal: `violates PodSecurity "restricted:latest": ...`.
pub(crate) fn message(level: Level, found: &[String]) -> String {
    format!(
        "violates PodSecurity \"{}:latest\": {}",
        level.name(),
        found.join(", ")
    )
}

/// Whether a write of the pod `new` over `old` is judged: a create, or an update that changes
/// the spec.
pub(crate) fn judged(old: Option<&Value>, new: &Value) -> bool {
    old.is_none_or(|o| o["spec"] != new["spec"])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": spec})
    }

    /// What the attacker sent: every host door at once.
    #[test]
    fn the_root_pod_breaks_baseline_and_restricted_and_is_privileged_only() {
        let p = pod(json!({
            "hostNetwork": true, "hostPID": true, "nodeName": "gw-plant-b",
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "image": "busybox", "securityContext": {"privileged": true},
                "volumeMounts": [{"name": "root", "mountPath": "/host"}]}]}));
        assert!(violations(Level::Privileged, &p).is_empty());
        let b = violations(Level::Baseline, &p);
        assert_eq!(
            b,
            [
                "host namespaces (hostNetwork=true, hostPID=true)",
                "privileged (container \"c\" must not set securityContext.privileged=true)",
                "hostPath volumes (volume \"root\")"
            ]
        );
        let r = violations(Level::Restricted, &p);
        assert!(r.len() > b.len() && r.starts_with(&b), "{r:?}");
        assert!(
            r.iter().any(|v| v.contains("\"root\" uses hostPath")),
            "{r:?}"
        );
    }

    #[test]
    fn a_restricted_pod_passes_every_level() {
        let p = pod(json!({
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [{"name": "cfg", "configMap": {"name": "x"}}, {"name": "tmp", "emptyDir": {}}],
            "containers": [{"name": "c", "image": "x", "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]}));
        for level in [Level::Privileged, Level::Baseline, Level::Restricted] {
            assert_eq!(violations(level, &p), Vec::<String>::new(), "{level:?}");
        }
        // A plain pod: baseline yes, restricted no.
        let plain = pod(json!({"containers": [{"name": "c", "image": "x"}]}));
        assert!(violations(Level::Baseline, &plain).is_empty());
        let r = violations(Level::Restricted, &plain);
        assert_eq!(r.len(), 4, "{r:?}");
    }

    #[test]
    fn baseline_checks_each_door() {
        let cases = [
            (
                json!({"hostIPC": true, "containers": []}),
                "host namespaces (hostIPC=true)",
            ),
            (
                json!({"initContainers": [{"name": "i", "securityContext": {"capabilities": {"add": ["SYS_ADMIN", "CHOWN"]}}}]}),
                "non-default capabilities",
            ),
            (
                json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
                "hostPort",
            ),
            (
                json!({"containers": [{"name": "c", "securityContext": {"procMount": "Unmasked"}}]}),
                "procMount",
            ),
            (
                json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
                "seccompProfile",
            ),
            (
                json!({"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}]}}),
                "forbidden sysctls (\"kernel.msgmax\")",
            ),
            (
                json!({"securityContext": {"seLinuxOptions": {"type": "spc_t"}}}),
                "seLinuxOptions",
            ),
            (
                json!({"ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}]}),
                "privileged (container \"e\"",
            ),
        ];
        for (spec, want) in cases {
            let v = violations(Level::Baseline, &pod(spec.clone()));
            assert!(v.len() == 1 && v[0].starts_with(want), "{spec}: {v:?}");
        }
    }

    #[test]
    fn the_namespace_labels_decide_the_level() {
        let ns = |labels: Value| json!({"metadata": {"name": "n", "labels": labels}});
        assert_eq!(Policy::of_namespace(None).enforce, Level::Privileged);
        let p = Policy::of_namespace(Some(&ns(json!({
            "pod-security.kubernetes.io/enforce": "baseline",
            "pod-security.kubernetes.io/enforce-version": "v1.30",
            "pod-security.kubernetes.io/warn": "restricted"}))));
        assert_eq!(
            p,
            Policy {
                enforce: Level::Baseline,
                warn: Some(Level::Restricted)
            }
        );
        let typo = Policy::of_namespace(Some(&ns(
            json!({"pod-security.kubernetes.io/enforce": "basline"}),
        )));
        assert_eq!(typo.enforce, Level::Restricted);
    }
}
