//! Resources whose objects the embedding program keeps, not the store: read-only kinds served
//! beside the stored ones (cloudcore's `metrics.k8s.io` `NodeMetrics` and `PodMetrics`, what
//! `kubectl top` reads). They are in discovery like any kind, authorized like any request (`get`,
//! `list` on `{plural}` in their group), and answered by the program; any other verb is refused
//! (405), as metrics-server refuses it.

use std::sync::Arc;

/// A read-only kind served by the embedding program.
#[derive(Clone)]
pub struct External {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub kind: String,
    pub namespaced: bool,
    pub serve: ServeExternal,
}

/// A `get` (with `name`) or a `list` of an [`External`] kind: its namespace (empty for every
/// namespace, or a cluster-scoped kind) and the request's query.
pub struct ExternalRequest<'a> {
    pub ns: String,
    pub name: Option<String>,
    pub query: std::collections::HashMap<String, String>,
    /// A stored object, by resource (the store's key: `pods`), namespace and name: what the
    /// program's answer may depend on (a pod's node).
    pub stored: &'a (dyn Fn(&str, &str, &str) -> Option<serde_json::Value> + Sync),
}

/// What answers an [`External`] kind: the objects (a `get` takes the one named; none is a 404).
pub type ServeExternal = Arc<dyn Fn(&ExternalRequest) -> Vec<serde_json::Value> + Send + Sync>;

impl std::fmt::Debug for External {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "External({}/{} {})",
            self.group, self.version, self.plural
        )
    }
}
