//! What a node may say about itself: its name and the labels of its own Node, as Kubernetes'
//! NodeRestriction admission decides for a kubelet. The API server applies it to a node's own
//! writes; cloudcore to the labels a node sends when it registers through cloudhub (written
//! with cloudcore's own credentials, so the API server cannot tell them from cloudcore's).

use super::names::{NameError, check_dns1123_subdomain};

/// Whether a node may set label `key` on its own Node:
/// - a label without a prefix, or with one outside `kubernetes.io` and `k8s.io`: yes;
/// - a prefix `node-restriction.kubernetes.io` or a subdomain of it: never (it is there for
///   an administrator to steer workloads by, as a node cannot forge it);
/// - any other prefix in `kubernetes.io` or `k8s.io` (`node-role.kubernetes.io/...`): only the
///   labels a kubelet sets on its Node itself ([`kubelet_label`]).
pub fn may_set_label(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    if within(prefix, "node-restriction.kubernetes.io") {
        return false;
    }
    if !within(prefix, "kubernetes.io") && !within(prefix, "k8s.io") {
        return true;
    }
    kubelet_label(key)
}

/// The labels a kubelet sets on its Node (the kubelet's own list): the host name, OS and
/// architecture, instance type, region and zone, and anything under `kubelet.kubernetes.io` or
/// `node.kubernetes.io`.
pub fn kubelet_label(key: &str) -> bool {
    const LABELS: &[&str] = &[
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "failure-domain.beta.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/zone",
    ];
    let prefix = key.split_once('/').map(|(p, _)| p).unwrap_or_default();
    LABELS.contains(&key)
        || within(prefix, "kubelet.kubernetes.io")
        || within(prefix, "node.kubernetes.io")
}

/// Whether `prefix` is `domain` or a subdomain of it.
fn within(prefix: &str, domain: &str) -> bool {
    prefix == domain
        || prefix
            .strip_suffix(domain)
            .is_some_and(|head| head.ends_with('.'))
}

/// Checks a node name as Kubernetes checks a Node's name (a DNS-1123 subdomain): a join, a
/// certificate request and a Node all refuse `system:masters` or `a/b`.
pub fn check_name(name: &str) -> Result<(), NameError> {
    check_dns1123_subdomain(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_may_set_its_own_labels_and_the_kubelets_but_no_restricted_or_role_label() {
        for key in [
            "site",
            "example.com/line",
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
            "kubelet.kubernetes.io/x",
            "sub.node.kubernetes.io/y",
            "node.kubernetes.io/instance-type",
            "notkubernetes.io/x",
        ] {
            assert!(may_set_label(key), "{key}");
        }
        for key in [
            "node-restriction.kubernetes.io/site",
            "a.node-restriction.kubernetes.io/b",
            "node-role.kubernetes.io/control-plane",
            "node-role.kubernetes.io/edge",
            "kubernetes.io/role",
            "k8s.io/x",
            "x.k8s.io/y",
        ] {
            assert!(!may_set_label(key), "{key}");
        }
    }

    #[test]
    fn a_node_name_is_a_dns_subdomain() {
        assert!(check_name("edge-1.plant-3").is_ok());
        for bad in ["system:masters", "a/b", "", "Edge", "-a", &"a".repeat(254)] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }
}
