//! create, update, patch, delete and deletecollection, and the common end of every write.

use super::*;
use crate::managed;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::resources::Resource;
use crate::schema;
use crate::status::{Status, success};
use crate::store::{Done, Outcome};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use serde_json::{Value, json};
use std::sync::Arc;

impl Api {
    pub(super) async fn create(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        headers: &HeaderMap,
        mut body: Value,
    ) -> Result<Response, Status> {
        check_type(&body, &t.res, &t.version)?;
        let meta = body
            .get_mut("metadata")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| Status::bad_request("metadata is required"))?;
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != t.ns && t.res.namespaced => {
                return Err(Status::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        let mut name = meta
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if name.is_empty()
            && let Some(prefix) = meta.get("generateName").and_then(Value::as_str)
        {
            let keep = prefix.len().min(63 - 5);
            name = format!("{}{}", &prefix[..keep], meta::name_suffix());
            meta.insert("name".into(), json!(name));
        }
        let label_name = t.res.plural == "namespaces";
        if let Some(c) = meta::check_name(&name, label_name) {
            return Err(Status::invalid(&t.res.kind, &t.res.group, &name, vec![c]));
        }
        self.check_namespace(t, &name).await?;
        let ctx = self.ctx(user, t, q, headers, name).await;
        self.write(t, q, ctx, move |c, old| {
            if old.is_some() {
                return Err(Status::already_exists(&c.res.group, &c.res.plural, &c.name));
            }
            finish(c, None, body.clone(), true)
        })
        .await
    }

    /// The object `ctx` names written by `change` (which sees what is stored, and refuses or says
    /// what to store), then [`Self::stored`]: answered 201 when it was made, else 200.
    async fn write(
        &self,
        t: &Target,
        q: &Query,
        ctx: WriteCtx,
        change: impl Fn(&WriteCtx, Option<Value>) -> Result<Outcome, Status> + Send + 'static,
    ) -> Result<Response, Status> {
        let ctx = Arc::new(ctx);
        let c = ctx.clone();
        let dry = dry_run(q)?;
        let done = self
            .store
            .mutate(
                key(t, &ctx.name),
                dry,
                Box::new(move |old, _| change(&c, old)),
            )
            .await?;
        let code = if done.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(self.stored(t, &ctx, &done, dry, code).await)
    }

    /// A write stored (or its dry run): the registry read again after a CRD's, the audit, and
    /// the answer with `code`.
    async fn stored(
        &self,
        t: &Target,
        ctx: &WriteCtx,
        done: &Done,
        dry: bool,
        code: StatusCode,
    ) -> Response {
        self.after_write(t).await;
        self.audit(ctx, done, dry).await;
        written(code, done, t, ctx)
    }

    pub(super) async fn update(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        headers: &HeaderMap,
        body: Value,
    ) -> Result<Response, Status> {
        check_type(&body, &t.res, &t.version)?;
        let name = t.name.clone().unwrap_or_default();
        if let Some(n) = body["metadata"]["name"].as_str()
            && n != name
        {
            return Err(Status::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        let ctx = self.ctx(user, t, q, headers, name).await;
        self.write(t, q, ctx, move |c, old| match old {
            None => Err(Status::not_found(&c.res.group, &c.res.plural, &c.name)),
            Some(old) => finish(c, Some(&old), body.clone(), true),
        })
        .await
    }

    pub(super) async fn patch(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        headers: &HeaderMap,
        kind: PatchType,
        raw: Bytes,
    ) -> Result<Response, Status> {
        let name = t.name.clone().unwrap_or_default();
        let body: Value = if kind == PatchType::Apply {
            check_yaml_depth(&raw)?;
            serde_yaml_ng::from_slice(&raw)
                .map_err(|e| Status::bad_request(format!("error decoding YAML: {e}")))?
        } else {
            serde_json::from_slice(&raw)
                .map_err(|e| Status::bad_request(format!("error decoding patch: {e}")))?
        };
        if kind == PatchType::Strategic && !t.res.builtin {
            return Err(Status::unsupported_media(
                "application/strategic-merge-patch+json (strategic merge patch is not supported for custom resources)",
            ));
        }
        if kind == PatchType::Apply {
            check_type(&body, &t.res, &t.version)?;
            if q.get("fieldManager").is_none_or(String::is_empty) {
                return Err(Status::bad_request(
                    "PATCH with apply requires a fieldManager",
                ));
            }
        }
        if kind == PatchType::Apply && t.ns.is_empty() == t.res.namespaced {
            return Err(Status::no_route("namespace"));
        }
        if kind == PatchType::Apply
            && let Err(e) = self.check_namespace(t, &name).await
            && self.store.read().get(&key(t, &name)).is_none()
        {
            return Err(e);
        }
        let force = q.get("force").map(String::as_str) == Some("true");
        let max_body = self.max_body;
        let ctx = self.ctx(user, t, q, headers, name).await;
        self.write(t, q, ctx, move |c, old| {
                    let now = meta::now_rfc3339();
                    match (kind, old) {
                        (PatchType::Apply, None) => {
                            let mut obj = body.clone();
                            if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
                                m.insert("name".into(), json!(c.name));
                            }
                            if let Some(cause) = meta::check_name(&c.name, c.res.plural == "namespaces") {
                                return Err(Status::invalid(&c.res.kind, &c.res.group, &c.name, vec![cause]));
                            }
                            managed::applied_new(&mut obj, &c.manager, &c.res.api_version(&c.version), &now);
                            finish(c, None, obj, false)
                        }
                        (_, None) => Err(Status::not_found(&c.res.group, &c.res.plural, &c.name)),
                        (PatchType::Apply, Some(old)) => {
                            let new = managed::apply(
                                &old,
                                &body,
                                &c.manager,
                                force,
                                &c.res.api_version(&c.version),
                                &now,
                                &c.res.plural,
                            )?;
                            finish(c, Some(&old), new, false)
                        }
                        (kind, Some(old)) => {
                            let mut new = old.clone();
                            match kind {
                                PatchType::Merge => patch::merge_patch(&mut new, &body),
                                PatchType::Json => patch::json_patch(&mut new, &body, max_body).map_err(|e| match e {
                                    patch::PatchError::TooLarge(limit) => Status::too_large(limit),
                                    e => Status::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}")),
                                })?,
                                PatchType::Strategic => patch::strategic_merge(&mut new, &body)
                                    .map_err(|e| Status::bad_request(format!("error applying strategic merge patch: {e}")))?,
                                PatchType::Apply => {}
                            }
                            // A patch keeps the stored version unless it names one itself.
                            finish(c, Some(&old), new, true)
                        }
                    }
        })
        .await
    }

    pub(super) async fn delete(
        &self,
        t: &Target,
        q: &Query,
        raw: Bytes,
    ) -> Result<Response, Status> {
        let name = t.name.clone().unwrap_or_default();
        let opts: Value = if raw.is_empty() {
            json!({})
        } else {
            serde_json::from_slice(&raw)
                .map_err(|e| Status::bad_request(format!("error decoding DeleteOptions: {e}")))?
        };
        let mut dry = dry_run(q)?;
        if opts["dryRun"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "All"))
        {
            dry = true;
        }
        let res = t.res.clone();
        let done = self
            .store
            .mutate(
                key(t, &name),
                dry,
                Box::new(move |old, _| delete_outcome(&res, &name, old, &opts)),
            )
            .await?;
        self.after_write(t).await;
        let v = outward(done.value, &t.res, &t.version);
        if done.deleted {
            let details = json!({"name": v["metadata"]["name"], "group": t.res.group,
                "kind": t.res.plural, "uid": v["metadata"]["uid"]});
            if t.res.builtin && t.res.plural != "customresourcedefinitions" {
                return Ok(json_response(StatusCode::OK, &v));
            }
            return Ok(json_response(StatusCode::OK, &success(details)));
        }
        Ok(json_response(StatusCode::OK, &v))
    }

    pub(super) async fn delete_collection(
        &self,
        t: &Target,
        q: &Query,
        raw: Bytes,
        labels: &Labels,
        fields: &Fields,
    ) -> Result<Response, Status> {
        let names: Vec<(String, String)> = {
            let tables = self.store.read();
            tables
                .objects
                .get(&t.res.store_key)
                .map(|m| {
                    m.iter()
                        .filter(|((ns, _), o)| {
                            (t.ns.is_empty() || *ns == t.ns)
                                && labels.matches(o)
                                && (fields.is_empty() || fields.matches(&o.value()))
                        })
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut items = Vec::new();
        for (ns, name) in names {
            let mut t2 = t.clone();
            t2.ns = ns;
            t2.name = Some(name);
            let r = self.delete(&t2, q, raw.clone()).await;
            match r {
                Ok(_) => items.push(json!(t2.name)),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(json_response(
            StatusCode::OK,
            &success(json!({"kind": t.res.plural, "group": t.res.group})),
        ))
    }
}

pub(super) fn written(code: StatusCode, done: &Done, t: &Target, ctx: &WriteCtx) -> Response {
    let v = outward(done.value.clone(), &t.res, &t.version);
    let mut r = json_response(code, &v);
    let warnings = ctx.warnings.lock().map(|w| w.clone()).unwrap_or_default();
    for w in warnings {
        let text = format!("299 - {}", json!(w));
        if let Ok(h) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, h);
        }
    }
    r
}

/// Whether `a` and `b` differ in what `metadata.generation` counts: everything but metadata, and
/// status when the resource has a status subresource.
pub(super) fn spec_changed(a: &Value, b: &Value, status_sub: bool) -> bool {
    let skip =
        |k: &str| matches!(k, "metadata" | "apiVersion" | "kind") || (status_sub && k == "status");
    !same_but(a, b, &skip)
}

pub(super) fn same_ignoring_bookkeeping(a: &Value, b: &Value) -> bool {
    let skip_meta = |k: &str| matches!(k, "resourceVersion" | "managedFields");
    let skip = |k: &str| k == "apiVersion";
    same_but(a, b, &|k| skip(k) || k == "metadata")
        && match (a.get("metadata"), b.get("metadata")) {
            (Some(x), Some(y)) => same_but(x, y, &skip_meta),
            (x, y) => x == y,
        }
}

/// Whether two values are equal when the members of their top level for which `skip` holds
/// are left out (both compared in place: these run on every write, on whole objects).
fn same_but(a: &Value, b: &Value, skip: &dyn Fn(&str) -> bool) -> bool {
    match (a.as_object(), b.as_object()) {
        (Some(x), Some(y)) => {
            let mut xs = x.iter().filter(|(k, _)| !skip(k));
            let mut ys = y.iter().filter(|(k, _)| !skip(k));
            // Both maps iterate in key order: equal maps give equal sequences.
            loop {
                match (xs.next(), ys.next()) {
                    (None, None) => return true,
                    (Some((ka, va)), Some((kb, vb))) if ka == kb && va == vb => {}
                    _ => return false,
                }
            }
        }
        _ => a == b,
    }
}

/// The common end of create, update and patch, run in the writer on the current object.
pub(super) fn finish(
    c: &WriteCtx,
    old: Option<&Value>,
    mut new: Value,
    track_update: bool,
) -> Result<Outcome, Status> {
    let status_sub = c.res.version(&c.version).is_some_and(|v| v.status);
    if !new.is_object() {
        return Err(Status::bad_request("the object must be a JSON object"));
    }
    if !new["metadata"].is_object() {
        new["metadata"] = json!({});
    }
    new["apiVersion"] = json!(c.res.api_version(&c.version));
    new["kind"] = json!(c.res.kind);
    new["metadata"]["name"] = json!(c.name);
    if c.res.namespaced {
        new["metadata"]["namespace"] = json!(c.ns);
    } else if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    let now = meta::now_rfc3339();
    match old {
        Some(old) => {
            let want = new["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let have = old["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default();
            if !want.is_empty() && want != have {
                return Err(Status::stale(&c.res.group, &c.res.plural, &c.name));
            }
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ] {
                match old["metadata"].get(k) {
                    Some(v) => new["metadata"][k] = v.clone(),
                    None => {
                        if let Some(m) = new["metadata"].as_object_mut() {
                            m.remove(k);
                        }
                    }
                }
            }
            if c.sub == "status" {
                let status = new.get("status").cloned();
                let mut kept = old.clone();
                match status {
                    Some(s) => kept["status"] = s,
                    None => {
                        if let Some(m) = kept.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
                kept["metadata"]["managedFields"] = new["metadata"]["managedFields"].clone();
                new = kept;
            } else if status_sub {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
        }
        None => {
            let m = new["metadata"]
                .as_object_mut()
                .ok_or_else(|| Status::bad_request("metadata must be an object"))?;
            m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
            m.insert("creationTimestamp".into(), json!(now));
            m.insert("generation".into(), json!(1));
            for k in [
                "resourceVersion",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "selfLink",
            ] {
                m.remove(k);
            }
            if status_sub
                && !c.res.builtin
                && let Some(o) = new.as_object_mut()
            {
                o.remove("status");
            }
        }
    }
    builtin_rules(c, old, &mut new)?;
    let what = (c.res.group.as_str(), c.res.plural.as_str());
    crate::admission::admit(&c.author, what, &c.ns, &c.name, old, &new)?;
    if let Some(policy) = c.author.pod_security
        && crate::podsecurity::judged(old, &new)
    {
        use crate::podsecurity::{message, violations};
        let found = violations(policy.enforce, &new);
        if !found.is_empty() {
            return Err(Status::new(
                403,
                "Forbidden",
                format!(
                    "pods \"{}\" is forbidden: {}",
                    c.name,
                    message(policy.enforce, &found)
                ),
            ));
        }
        if let Some(level) = policy.warn {
            let found = violations(level, &new);
            if !found.is_empty()
                && let Ok(mut w) = c.warnings.lock()
            {
                w.push(format!(
                    "would {}",
                    message(level, &found).replacen("violates", "violate", 1)
                ));
            }
        }
    }
    let mut causes = meta::check_meta(&new["metadata"]);
    if let Some(schema_v) = c.res.version(&c.version).and_then(|v| v.schema.as_ref()) {
        let f = schema::apply(&mut new, schema_v);
        if !f.unknown.is_empty() {
            match c.validation {
                Validation::Strict => {
                    let list: Vec<String> = f
                        .unknown
                        .iter()
                        .map(|p| format!("unknown field \"{p}\""))
                        .collect();
                    return Err(Status::bad_request(format!(
                        "{kind} in version \"{v}\" cannot be handled as a {kind}: strict decoding error: {}",
                        list.join(", "),
                        kind = c.res.kind,
                        v = c.version
                    )));
                }
                Validation::Warn => {
                    if let Ok(mut w) = c.warnings.lock() {
                        w.extend(f.unknown.iter().map(|p| format!("unknown field \"{p}\"")));
                    }
                }
                Validation::Ignore => {}
            }
        }
        causes.extend(f.causes);
    }
    if !causes.is_empty() {
        return Err(Status::invalid(&c.res.kind, &c.res.group, &c.name, causes));
    }
    if let Some(old) = old
        && spec_changed(old, &new, status_sub)
    {
        let g = old["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    if track_update {
        managed::record_update(
            old,
            &mut new,
            &c.manager,
            &c.res.api_version(&c.version),
            &c.sub,
            &now,
        );
    }
    if let Some(old) = old {
        if same_ignoring_bookkeeping(old, &new) {
            return Ok(Outcome::Unchanged(old.clone()));
        }
        let finalizers_left = new["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
            || (c.res.plural == "namespaces"
                && new["spec"]["finalizers"]
                    .as_array()
                    .is_some_and(|a| !a.is_empty()));
        if new["metadata"]["deletionTimestamp"].is_string() && !finalizers_left {
            return Ok(Outcome::Delete(new));
        }
    }
    if (c.res.group.as_str(), c.res.plural.as_str()) == ("devices.kubeedge.io", "devices")
        && c.sub.is_empty()
    {
        *c.audit.lock().unwrap_or_else(|e| e.into_inner()) = desired_changes(old, &new);
    }
    Ok(Outcome::Put(new))
}

/// The desired values of a Device's properties that `new` sets differently from `old`:
/// `(property, was, now)`.
fn desired_changes(old: Option<&Value>, new: &Value) -> Vec<(String, Option<String>, String)> {
    let desired = |obj: &Value, name: &str| -> Option<String> {
        obj["spec"]["properties"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| match &p["desired"]["value"] {
                Value::Null => None,
                Value::String(s) => Some(s.clone()),
                v => Some(v.to_string()),
            })
    };
    let mut out = Vec::new();
    for p in new["spec"]["properties"].as_array().into_iter().flatten() {
        let Some(name) = p["name"].as_str() else {
            continue;
        };
        let Some(now) = desired(new, name) else {
            continue;
        };
        let was = old.and_then(|o| desired(o, name));
        if was.as_deref() != Some(now.as_str()) {
            out.push((name.to_string(), was, now));
        }
    }
    out
}

/// What deleting `old` does: removes it, or marks it deleted while finalizers remain.
pub(crate) fn delete_outcome(
    res: &Resource,
    name: &str,
    old: Option<Value>,
    opts: &Value,
) -> Result<Outcome, Status> {
    let Some(mut old) = old else {
        return Err(Status::not_found(&res.group, &res.plural, name));
    };
    if let Some(uid) = opts["preconditions"]["uid"].as_str()
        && old["metadata"]["uid"].as_str() != Some(uid)
    {
        return Err(Status::conflict(
            &res.group,
            &res.plural,
            name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old["metadata"]["uid"].as_str().unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = opts["preconditions"]["resourceVersion"].as_str()
        && old["metadata"]["resourceVersion"].as_str() != Some(rv)
    {
        return Err(Status::stale(&res.group, &res.plural, name));
    }
    let has_finalizers = old["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|a| !a.is_empty())
        || (res.plural == "namespaces"
            && old["spec"]["finalizers"]
                .as_array()
                .is_some_and(|a| !a.is_empty()));
    if !has_finalizers {
        return Ok(Outcome::Delete(old));
    }
    if old["metadata"]["deletionTimestamp"].is_string() {
        return Ok(Outcome::Unchanged(old));
    }
    old["metadata"]["deletionTimestamp"] = json!(meta::now_rfc3339());
    old["metadata"]["deletionGracePeriodSeconds"] = json!(0);
    if res.plural == "namespaces" {
        if !old["status"].is_object() {
            old["status"] = json!({});
        }
        old["status"]["phase"] = json!("Terminating");
    }
    Ok(Outcome::Put(old))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generation_counts_spec_changes_only() {
        let a = json!({"metadata": {"labels": {"x": "1"}}, "spec": {"n": 1}, "status": {"s": 1}});
        let relabelled =
            json!({"metadata": {"labels": {"x": "2"}}, "spec": {"n": 1}, "status": {"s": 1}});
        let new_status = json!({"metadata": {}, "spec": {"n": 1}, "status": {"s": 2}});
        let new_spec = json!({"metadata": {}, "spec": {"n": 2}, "status": {"s": 1}});
        assert!(!spec_changed(&a, &relabelled, true));
        assert!(!spec_changed(&a, &new_status, true));
        assert!(
            spec_changed(&a, &new_status, false),
            "no status subresource: status is spec"
        );
        assert!(spec_changed(&a, &new_spec, true));
    }

    #[test]
    fn a_write_that_changes_only_bookkeeping_changes_nothing() {
        let a = json!({"apiVersion": "v1", "metadata": {"name": "x", "resourceVersion": "1", "managedFields": [1]}, "data": {"k": "v"}});
        let b = json!({"apiVersion": "v2", "metadata": {"name": "x", "resourceVersion": "9"}, "data": {"k": "v"}});
        let c = json!({"metadata": {"name": "x"}, "data": {"k": "w"}});
        assert!(same_ignoring_bookkeeping(&a, &b));
        assert!(!same_ignoring_bookkeeping(&a, &c));
    }

    /// The comparisons as they were first written (each side copied and stripped): the
    /// oracle of the in-place ones.
    fn stripped(v: &Value, top: &[&str], meta: &[&str]) -> Value {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            for k in meta {
                m.remove(*k);
            }
        }
        if let Some(m) = v.as_object_mut() {
            for k in top {
                m.remove(*k);
            }
        }
        v
    }

    fn object_like() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            (0i64..3).prop_map(|i| json!(i)),
            "[ab]{0,2}".prop_map(Value::String),
        ];
        let tree = leaf.prop_recursive(3, 16, 4, |inner| {
            prop::collection::btree_map(key(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect()))
        });
        prop::collection::btree_map(key(), tree, 0..6)
            .prop_map(|m| Value::Object(m.into_iter().collect()))
    }

    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "metadata",
            "apiVersion",
            "kind",
            "status",
            "spec",
            "resourceVersion",
            "managedFields",
            "name",
        ])
        .prop_map(str::to_string)
    }

    use proptest::prelude::*;

    proptest! {
        /// The in-place comparisons decide as copying and stripping both sides did, on pairs
        /// that differ in a few members (often only in the ones left out).
        #[test]
        fn in_place_comparisons_agree_with_stripped_copies(
            a in object_like(),
            changes in prop::collection::vec((key(), prop::option::of(object_like())), 0..3),
            meta_changes in prop::collection::vec((key(), prop::option::of(object_like())), 0..3),
            status_sub in any::<bool>(),
        ) {
            let mut b = a.clone();
            for (k, v) in changes {
                let m = b.as_object_mut().expect("an object");
                match v {
                    Some(v) => { m.insert(k, v); }
                    None => { m.remove(&k); }
                }
            }
            if let Some(m) = b.get_mut("metadata").and_then(Value::as_object_mut) {
                for (k, v) in meta_changes {
                    match v {
                        Some(v) => { m.insert(k, v); }
                        None => { m.remove(&k); }
                    }
                }
            }
            let mut top = vec!["metadata", "apiVersion", "kind"];
            if status_sub {
                top.push("status");
            }
            prop_assert_eq!(
                spec_changed(&a, &b, status_sub),
                stripped(&a, &top, &[]) != stripped(&b, &top, &[])
            );
            let meta = ["resourceVersion", "managedFields"];
            prop_assert_eq!(
                same_ignoring_bookkeeping(&a, &b),
                stripped(&a, &["apiVersion"], &meta) == stripped(&b, &["apiVersion"], &meta)
            );
        }
    }
}
