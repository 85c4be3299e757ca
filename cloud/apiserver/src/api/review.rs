//! `authorization.k8s.io/v1`: the reviews `kubectl auth can-i` sends. A
//! SelfSubjectAccessReview asks whether the caller may do something, a SubjectAccessReview (or a
//! LocalSubjectAccessReview, in one namespace) whether someone else may, for those allowed to
//! create one; a SelfSubjectRulesReview lists the caller's rules in a namespace (`--list`).
//! Nothing is stored: each is answered with its `status`.

use super::*;
use crate::User;
use crate::authz::{self, Attributes};
use crate::selector::Fields;
use serde_json::json;

/// Paths every authenticated user may read (kube-apiserver's `system:discovery` and
/// `system:public-info-viewer`).
fn public_path(path: &str) -> bool {
    [
        "/api", "/apis", "/version", "/openapi", "/healthz", "/livez", "/readyz",
    ]
    .iter()
    .any(|p| path == *p || path.starts_with(&format!("{p}/")))
}

impl Api {
    pub(super) fn review(
        &self,
        user: &User,
        version: &str,
        rest: &[&str],
        body: Value,
    ) -> Result<Response, Status> {
        let (ns, kind) = match rest {
            [kind] => ("", *kind),
            ["namespaces", ns, kind] => (*ns, *kind),
            _ => return Err(Status::no_route("authorization.k8s.io")),
        };
        if version != "v1" {
            return Err(Status::no_route(&format!("authorization.k8s.io/{version}")));
        }
        let t = self.store.read();
        let status = match kind {
            "selfsubjectaccessreviews" if ns.is_empty() => access(&t, user, &body["spec"], None),
            "subjectaccessreviews" | "localsubjectaccessreviews" => {
                let local = kind == "localsubjectaccessreviews";
                if local == ns.is_empty() {
                    return Err(Status::no_route(kind));
                }
                let asks = Attributes {
                    verb: "create",
                    group: "authorization.k8s.io",
                    resource: kind,
                    sub: None,
                    ns,
                    name: None,
                    field_selector: None,
                };
                if !authz::allowed(&t, user, &asks) {
                    return Err(authz::forbidden(user, &asks));
                }
                let spec = &body["spec"];
                let groups = spec["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
                let subject = User::new(spec["user"].as_str().unwrap_or_default(), groups);
                access(&t, &subject, spec, local.then_some(ns))
            }
            "selfsubjectrulesreviews" if ns.is_empty() => {
                let ns = body["spec"]["namespace"].as_str().unwrap_or_default();
                let (rules, incomplete) = authz::rules_review(&t, user, ns);
                let mut non_resource = vec![
                    json!({"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"]}),
                ];
                if user.in_group("system:masters") {
                    non_resource.push(json!({"verbs": ["*"], "nonResourceURLs": ["*"]}));
                }
                json!({"resourceRules": rules, "nonResourceRules": non_resource, "incomplete": incomplete})
            }
            _ => return Err(Status::no_route(kind)),
        };
        let kind_name = match kind {
            "selfsubjectaccessreviews" => "SelfSubjectAccessReview",
            "subjectaccessreviews" => "SubjectAccessReview",
            "localsubjectaccessreviews" => "LocalSubjectAccessReview",
            _ => "SelfSubjectRulesReview",
        };
        let mut out = json!({"kind": kind_name, "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": null}, "spec": body["spec"], "status": status});
        if !ns.is_empty() {
            out["metadata"]["namespace"] = json!(ns);
        }
        Ok(json_response(StatusCode::CREATED, &out))
    }
}

/// The status of an access review of `spec` for `user` (in `ns` when the review is local).
fn access(t: &crate::store::Tables, user: &User, spec: &Value, ns: Option<&str>) -> Value {
    if let Some(path) = spec["nonResourceAttributes"]["path"].as_str() {
        let verb = spec["nonResourceAttributes"]["verb"]
            .as_str()
            .unwrap_or("get");
        let allowed = user.in_group("system:masters") || (verb == "get" && public_path(path));
        return json!({"allowed": allowed});
    }
    let r = &spec["resourceAttributes"];
    let text = |k: &str| r[k].as_str().unwrap_or_default();
    let name = text("name");
    // A selector that does not parse selects nothing the authorizer can rely on.
    let fields = r["fieldSelector"]["rawSelector"]
        .as_str()
        .and_then(|raw| Fields::parse_any(raw).ok());
    let attrs = Attributes {
        verb: text("verb"),
        group: text("group"),
        resource: text("resource"),
        sub: Some(text("subresource")).filter(|s| !s.is_empty()),
        ns: ns.unwrap_or(text("namespace")),
        name: Some(name).filter(|n| !n.is_empty()),
        field_selector: fields.as_ref(),
    };
    if authz::allowed(t, user, &attrs) {
        json!({"allowed": true})
    } else {
        json!({"allowed": false, "reason": authz::forbidden(user, &attrs).message})
    }
}
