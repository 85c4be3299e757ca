//! The kinds the API serves: the built-in ones, and those the stored CustomResourceDefinitions
//! declare. The registry is rebuilt whenever a CRD changes.

use crate::schema;
use crate::status::Cause;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;

/// A printer column (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub kind: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    /// A simple JSONPath (`.spec.nodeName`); empty for the built-in Name and Age columns.
    pub json_path: String,
}

/// One served version of a resource.
#[derive(Debug, Clone)]
pub struct Version {
    pub name: String,
    /// The CRD's `openAPIV3Schema`; `None` for built-in kinds.
    pub schema: Option<Value>,
    pub status: bool,
    pub columns: Vec<Column>,
}

#[derive(Debug, Clone)]
pub struct Resource {
    pub group: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub list_kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Served versions, the preferred first.
    pub versions: Vec<Version>,
    /// Where its objects are kept: `plural` for the core group, `plural.group` otherwise.
    pub store_key: Arc<str>,
    pub builtin: bool,
    /// Kept by the embedding program, not the store ([`crate::External`]): read-only.
    pub external: bool,
}

impl Resource {
    pub fn version(&self, v: &str) -> Option<&Version> {
        self.versions.iter().find(|x| x.name == v)
    }

    pub fn api_version(&self, v: &str) -> String {
        if self.group.is_empty() {
            v.to_string()
        } else {
            format!("{}/{v}", self.group)
        }
    }

    pub fn preferred(&self) -> &str {
        self.versions
            .first()
            .map(|v| v.name.as_str())
            .unwrap_or("v1")
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.external {
            return vec!["get", "list"];
        }
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    plural: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: bool,
    columns: Vec<Column>,
) -> Resource {
    Resource {
        group: group.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        categories: Vec::new(),
        versions: vec![Version {
            name: version.into(),
            schema: None,
            status,
            columns,
        }],
        store_key: if group.is_empty() {
            Arc::from(plural)
        } else {
            Arc::from(format!("{plural}.{group}").as_str())
        },
        builtin: true,
        external: false,
    }
}

fn col(name: &str, kind: &str, path: &str, priority: i64) -> Column {
    Column {
        name: name.into(),
        kind: kind.into(),
        format: String::new(),
        description: String::new(),
        priority,
        json_path: path.into(),
    }
}

/// The built-in kinds.
pub(crate) fn builtins() -> Vec<Resource> {
    let rbac = |plural: &str, kind: &str, namespaced: bool| {
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            plural,
            kind,
            namespaced,
            &[],
            false,
            Vec::new(),
        )
    };
    vec![
        rbac("roles", "Role", true),
        rbac("rolebindings", "RoleBinding", true),
        rbac("clusterroles", "ClusterRole", false),
        rbac("clusterrolebindings", "ClusterRoleBinding", false),
        builtin(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
            &["ns"],
            true,
            vec![col("Status", "string", ".status.phase", 0)],
        ),
        builtin(
            "",
            "v1",
            "configmaps",
            "ConfigMap",
            true,
            &["cm"],
            false,
            vec![col("Data", "integer", "#len(.data)+len(.binaryData)", 0)],
        ),
        builtin(
            "",
            "v1",
            "secrets",
            "Secret",
            true,
            &[],
            false,
            vec![
                col("Type", "string", ".type", 0),
                col("Data", "integer", "#len(.data)", 0),
            ],
        ),
        builtin(
            "",
            "v1",
            "nodes",
            "Node",
            false,
            &["no"],
            true,
            vec![
                col("Status", "string", "#node-ready", 0),
                col("Roles", "string", "#node-roles", 0),
                col("Version", "string", ".status.nodeInfo.kubeletVersion", 0),
                col("Internal-IP", "string", "#node-ip", 1),
            ],
        ),
        builtin(
            "",
            "v1",
            "events",
            "Event",
            true,
            &["ev"],
            false,
            vec![
                col("Type", "string", ".type", 0),
                col("Reason", "string", ".reason", 0),
                col("Object", "string", "#involved", 0),
                col("Message", "string", ".message", 0),
            ],
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "Lease",
            true,
            &[],
            false,
            vec![col("Holder", "string", ".spec.holderIdentity", 0)],
        ),
        builtin(
            "",
            "v1",
            "pods",
            "Pod",
            true,
            &["po"],
            true,
            vec![
                col("Ready", "string", "#pod-ready", 0),
                col("Status", "string", "#pod-status", 0),
                col("Restarts", "string", "#pod-restarts", 0),
                col("IP", "string", "#pod-ip", 1),
                col("Node", "string", "#pod-node", 1),
            ],
        ),
        builtin(
            "apps",
            "v1",
            "daemonsets",
            "DaemonSet",
            true,
            &["ds"],
            true,
            vec![
                col("Desired", "integer", ".status.desiredNumberScheduled", 0),
                col("Current", "integer", ".status.currentNumberScheduled", 0),
                col("Ready", "integer", ".status.numberReady", 0),
                col("Up-to-date", "integer", ".status.updatedNumberScheduled", 0),
                col("Available", "integer", ".status.numberAvailable", 0),
                col("Node Selector", "string", "#node-selector", 0),
            ],
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
            vec![col(
                "Created At",
                "string",
                ".metadata.creationTimestamp",
                0,
            )],
        ),
    ]
}

/// Every served resource, by group and plural.
#[derive(Debug, Default)]
pub struct Registry {
    pub resources: Vec<Arc<Resource>>,
    by_name: HashMap<(String, String), Arc<Resource>>,
}

impl Registry {
    /// The built-in kinds, the embedding program's `externals`, plus those of `crds` (stored
    /// CRD objects) that are valid.
    pub fn build(crds: &[Value], externals: &[crate::External]) -> Self {
        let mut r = Self::default();
        for b in builtins() {
            r.add(b);
        }
        for e in externals {
            let mut res = builtin(
                &e.group,
                &e.version,
                &e.plural,
                &e.kind,
                e.namespaced,
                &[],
                false,
                Vec::new(),
            );
            res.external = true;
            r.add(res);
        }
        for crd in crds {
            if crd["metadata"]["deletionTimestamp"].is_string() {
                continue;
            }
            match from_crd(crd) {
                Ok(res) => {
                    if !r
                        .by_name
                        .contains_key(&(res.group.clone(), res.plural.clone()))
                    {
                        r.add(res)
                    }
                }
                Err(causes) => tracing::warn!(
                    crd = crd["metadata"]["name"].as_str().unwrap_or_default(),
                    causes = ?causes.iter().map(Cause::line).collect::<Vec<_>>(),
                    "stored CRD is not valid; its resource is not served"
                ),
            }
        }
        r
    }

    fn add(&mut self, res: Resource) {
        let res = Arc::new(res);
        self.by_name
            .insert((res.group.clone(), res.plural.clone()), res.clone());
        self.resources.push(res);
    }

    pub fn get(&self, group: &str, plural: &str) -> Option<&Arc<Resource>> {
        self.by_name.get(&(group.to_string(), plural.to_string()))
    }

    /// The resource serving `kind` in `group`.
    pub fn by_kind(&self, group: &str, kind: &str) -> Option<&Arc<Resource>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.kind == kind)
    }

    /// Groups and their served versions, the preferred first; the core group comes first.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in &self.resources {
            let versions: Vec<String> = r.versions.iter().map(|v| v.name.clone()).collect();
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) => {
                    for v in versions {
                        if !vs.contains(&v) {
                            vs.push(v);
                        }
                    }
                    vs.sort_by_key(|v| std::cmp::Reverse(version_priority(v)));
                }
                None => out.push((r.group.clone(), versions)),
            }
        }
        out
    }

    /// Resources served at `group/version`.
    pub fn in_version<'a>(
        &'a self,
        group: &'a str,
        version: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Resource>> + 'a {
        self.resources
            .iter()
            .filter(move |r| r.group == group && r.version(version).is_some())
    }
}

/// Kubernetes' version ordering: GA before beta before alpha, higher numbers first; anything else
/// last.
pub(crate) fn version_priority(v: &str) -> (u8, u64, u64) {
    let Some(rest) = v.strip_prefix('v') else {
        return (0, 0, 0);
    };
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let Ok(major) = digits.parse::<u64>() else {
        return (0, 0, 0);
    };
    let tail = &rest[digits.len()..];
    if tail.is_empty() {
        return (3, major, 0);
    }
    let (level, num) = if let Some(n) = tail.strip_prefix("beta") {
        (2, n)
    } else if let Some(n) = tail.strip_prefix("alpha") {
        (1, n)
    } else {
        return (0, 0, 0);
    };
    match num.parse::<u64>() {
        Ok(n) => (level, major, n),
        Err(_) => (0, 0, 0),
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The resource a CRD declares, or the causes why it is not valid.
pub(crate) fn from_crd(crd: &Value) -> Result<Resource, Vec<Cause>> {
    let mut causes = Vec::new();
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    let name = crd["metadata"]["name"].as_str().unwrap_or_default();
    if group.is_empty() {
        causes.push(Cause::required("spec.group"));
    } else if !group.contains('.') {
        causes.push(Cause::invalid(
            "spec.group",
            &json!(group),
            "should be a domain with at least one dot",
        ));
    }
    if plural.is_empty() {
        causes.push(Cause::required("spec.names.plural"));
    } else if !crate::meta::is_dns_label(&plural) {
        causes.push(Cause::invalid(
            "spec.names.plural",
            &json!(plural),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'",
        ));
    }
    if kind.is_empty() {
        causes.push(Cause::required("spec.names.kind"));
    }
    if !plural.is_empty() && !group.is_empty() && name != format!("{plural}.{group}") {
        causes.push(Cause::invalid(
            "metadata.name",
            &json!(name),
            &format!("must be spec.names.plural+\".\"+spec.group ({plural}.{group})"),
        ));
    }
    let namespaced = match spec["scope"].as_str() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        other => {
            causes.push(Cause::not_supported(
                "spec.scope",
                &json!(other.unwrap_or_default()),
                &[json!("Cluster"), json!("Namespaced")],
            ));
            true
        }
    };
    let mut versions = Vec::new();
    let mut storage = 0;
    match spec["versions"].as_array() {
        None => causes.push(Cause::required("spec.versions")),
        Some(vs) if vs.is_empty() => causes.push(Cause::invalid(
            "spec.versions",
            &json!([]),
            "must have exactly one version marked as storage version",
        )),
        Some(vs) => {
            for (i, v) in vs.iter().enumerate() {
                let path = format!("spec.versions[{i}]");
                let vname = v["name"].as_str().unwrap_or_default();
                if vname.is_empty() {
                    causes.push(Cause::required(format!("{path}.name")));
                }
                if v["storage"].as_bool() == Some(true) {
                    storage += 1;
                }
                let schema_v = &v["schema"]["openAPIV3Schema"];
                if schema_v.is_null() {
                    causes.push(Cause::required(format!("{path}.schema.openAPIV3Schema")));
                } else {
                    let at = format!("{path}.schema.openAPIV3Schema");
                    match schema::check_size(schema_v, &at) {
                        Ok(()) => causes.extend(schema::check_structural(schema_v, &at, true)),
                        Err(c) => causes.push(c),
                    }
                }
                if v["served"].as_bool() != Some(true) {
                    continue;
                }
                let mut columns = Vec::new();
                if let Some(cols) = v["additionalPrinterColumns"].as_array() {
                    for (j, c) in cols.iter().enumerate() {
                        let jp = c["jsonPath"].as_str().unwrap_or_default();
                        if !jp.starts_with('.') {
                            causes.push(Cause::invalid(
                                format!("{path}.additionalPrinterColumns[{j}].jsonPath"),
                                &json!(jp),
                                "must be a simple json path starting with .",
                            ));
                        }
                        columns.push(Column {
                            name: c["name"].as_str().unwrap_or_default().into(),
                            kind: c["type"].as_str().unwrap_or("string").into(),
                            format: c["format"].as_str().unwrap_or_default().into(),
                            description: c["description"].as_str().unwrap_or_default().into(),
                            priority: c["priority"].as_i64().unwrap_or(0),
                            json_path: jp.into(),
                        });
                    }
                }
                versions.push(Version {
                    name: vname.to_string(),
                    schema: (!schema_v.is_null()).then(|| schema_v.clone()),
                    status: v["subresources"]["status"].is_object(),
                    columns,
                });
            }
            if storage != 1 {
                causes.push(Cause::invalid(
                    "spec.versions",
                    &json!(storage),
                    "must have exactly one version marked as storage version",
                ));
            }
        }
    }
    if !causes.is_empty() {
        return Err(causes);
    }
    versions.sort_by_key(|v| std::cmp::Reverse(version_priority(&v.name)));
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    Ok(Resource {
        list_kind: names["listKind"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| format!("{kind}List")),
        store_key: Arc::from(format!("{plural}.{group}").as_str()),
        group,
        plural,
        singular,
        kind,
        namespaced,
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        versions,
        builtin: false,
        external: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_as_kubernetes_does() {
        let mut v = vec!["v1alpha2", "v1beta1", "v1", "v2beta1", "foo", "v1alpha10"];
        v.sort_by_key(|x| std::cmp::Reverse(version_priority(x)));
        assert_eq!(
            v,
            ["v1", "v2beta1", "v1beta1", "v1alpha10", "v1alpha2", "foo"]
        );
    }

    #[test]
    fn a_crd_without_storage_version_is_refused() {
        let crd = json!({"metadata": {"name": "things.example.com"}, "spec": {"group": "example.com",
            "names": {"plural": "things", "kind": "Thing"}, "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": false,
              "schema": {"openAPIV3Schema": {"type": "object"}}}]}});
        let e = from_crd(&crd).expect_err("must fail");
        assert!(e.iter().any(|c| c.field == "spec.versions"), "{e:?}");
    }
}
