//! `kubectl top` on the embedded API: `metrics.k8s.io/v1beta1` `nodes` and `pods` (as
//! metrics-server serves them on a cluster), answered from the reports cloudhub keeps
//! ([`crate::cloudhub::usage`]); a pod's figures only for a pod stored and bound to the node
//! that reported them.

/// `metrics.k8s.io/v1beta1` `nodes` and `pods`, from the hub's reports once it runs.
pub(super) fn metrics_api(api: &super::NodeApi) -> Vec<apiserver::External> {
    let kind = |plural: &str, kind: &str, namespaced: bool, nodes: bool| {
        let api = api.clone();
        apiserver::External {
            group: "metrics.k8s.io".into(),
            version: "v1beta1".into(),
            plural: plural.into(),
            kind: kind.into(),
            namespaced,
            serve: std::sync::Arc::new(move |r: &apiserver::ExternalRequest| {
                let Some(hub) = api.hub() else {
                    return Vec::new();
                };
                if nodes {
                    hub.usage.nodes(r.name.as_deref())
                } else {
                    hub.usage.pods(&r.ns, r.name.as_deref(), |ns, name| {
                        (r.stored)("pods", ns, name)
                            .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
                    })
                }
            }),
        }
    };
    vec![
        kind("nodes", "NodeMetrics", false, true),
        kind("pods", "PodMetrics", true, false),
    ]
}
