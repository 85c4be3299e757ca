//! The REST handlers: get, list, watch, create, update, patch, delete and deletecollection on
//! every served resource, with the status subresource, dry runs and field validation, as the
//! Kubernetes API conventions define them.

use crate::discovery;
use crate::managed;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::resources::{Registry, Resource};
use crate::schema;
use crate::selector::{Fields, Labels};
use crate::status::{Cause, Status, qualified, success};
use crate::store::{Done, EventType, Key, Obj, Outcome, Store};
use crate::table::{self, Include};
use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The API's shared state.
pub struct Api {
    pub store: Store,
    registry: RwLock<Arc<Registry>>,
    pub max_body: usize,
    pub server_addr: String,
    pub bookmark_every: Duration,
    pub stop: CancellationToken,
}

pub type Query = HashMap<String, String>;

type Entry<'a> = (&'a (String, String), &'a Arc<Obj>);

/// An event a watch sends: its type, the object, the object before.
type Replay = (EventType, Arc<Obj>, Option<Arc<Obj>>);

/// How unknown fields are treated (`fieldValidation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Validation {
    Strict,
    Warn,
    Ignore,
}

/// What a handler needs to know about the resource a path names.
#[derive(Clone)]
pub struct Target {
    pub res: Arc<Resource>,
    pub version: String,
    pub ns: String,
    pub name: Option<String>,
    pub sub: Option<String>,
}

struct WriteCtx {
    res: Arc<Resource>,
    version: String,
    ns: String,
    name: String,
    validation: Validation,
    manager: String,
    sub: String,
    warnings: Mutex<Vec<String>>,
}

impl Api {
    pub fn new(
        store: Store,
        max_body: usize,
        server_addr: String,
        bookmark_every: Duration,
        stop: CancellationToken,
    ) -> Self {
        let api = Self {
            store,
            registry: RwLock::new(Arc::new(Registry::default())),
            max_body,
            server_addr,
            bookmark_every,
            stop,
        };
        api.refresh_registry();
        api
    }

    pub fn registry(&self) -> Arc<Registry> {
        self.registry
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Rebuilds the registry from the stored CRDs.
    pub fn refresh_registry(&self) {
        let crds: Vec<Value> = {
            let t = self.store.read();
            t.objects
                .get("customresourcedefinitions.apiextensions.k8s.io")
                .map(|m| m.values().map(|o| o.value()).collect())
                .unwrap_or_default()
        };
        let reg = Arc::new(Registry::build(&crds));
        *self.registry.write().unwrap_or_else(|e| e.into_inner()) = reg;
    }

    /// Routes a request under `/api` or `/apis`.
    pub async fn dispatch(
        self: Arc<Self>,
        method: Method,
        path: &str,
        query: Query,
        headers: HeaderMap,
        body: Body,
    ) -> Response {
        match self.route(method, path, query, headers, body).await {
            Ok(r) => r,
            Err(s) => s.into_response(),
        }
    }

    async fn route(
        &self,
        method: Method,
        path: &str,
        query: Query,
        headers: HeaderMap,
        body: Body,
    ) -> Result<Response, Status> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let reg = self.registry();
        let accept = header_str(&headers, header::ACCEPT);
        let (group, version, rest) = match segs.as_slice() {
            ["api"] => {
                if let Some(media) = discovery::aggregated(accept) {
                    return Ok(typed(discovery::aggregated_list(&reg, true, media), media));
                }
                return Ok(json_response(
                    StatusCode::OK,
                    &discovery::api_versions(&self.server_addr),
                ));
            }
            ["apis"] => {
                if let Some(media) = discovery::aggregated(accept) {
                    return Ok(typed(discovery::aggregated_list(&reg, false, media), media));
                }
                return Ok(json_response(
                    StatusCode::OK,
                    &discovery::api_group_list(&reg),
                ));
            }
            ["api", v, rest @ ..] => ("", *v, rest),
            ["apis", g] => {
                return discovery::api_group(&reg, g)
                    .map(|v| json_response(StatusCode::OK, &v))
                    .ok_or_else(|| Status::no_route(path));
            }
            ["apis", g, v, rest @ ..] => (*g, *v, rest),
            _ => return Err(Status::no_route(path)),
        };
        if rest.is_empty() {
            return discovery::resource_list(&reg, group, version)
                .map(|v| json_response(StatusCode::OK, &v))
                .ok_or_else(|| Status::no_route(path));
        }
        let (ns, plural, name, sub) = match rest {
            ["namespaces", ns, sub @ ("status" | "finalize")] if group.is_empty() => {
                ("", "namespaces", Some(*ns), Some(*sub))
            }
            ["namespaces", ns, plural, tail @ ..] => {
                (*ns, *plural, tail.first().copied(), tail.get(1).copied())
            }
            [plural, tail @ ..] => ("", *plural, tail.first().copied(), tail.get(1).copied()),
            [] => return Err(Status::no_route(path)),
        };
        if rest.len() > 5 {
            return Err(Status::no_route(path));
        }
        let res = reg
            .get(group, plural)
            .filter(|r| r.version(version).is_some())
            .cloned()
            .ok_or_else(|| Status::no_route(path))?;
        if res.namespaced == ns.is_empty() && name.is_some() {
            return Err(Status::no_route(path));
        }
        if !res.namespaced && !ns.is_empty() {
            return Err(Status::no_route(path));
        }
        let sub = sub.map(str::to_string);
        if let Some(s) = &sub {
            let ok = (s == "status" && res.version(version).is_some_and(|v| v.status))
                || (s == "finalize" && res.plural == "namespaces");
            if !ok {
                return Err(Status::no_route(path));
            }
        }
        let t = Target {
            res,
            version: version.to_string(),
            ns: ns.to_string(),
            name: name.map(str::to_string),
            sub,
        };
        let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        match (method, t.name.is_some()) {
            (Method::GET, true) => self.get(&t, accept),
            (Method::GET, false) if is_watch => self.watch(&t, &query, accept),
            (Method::GET, false) => self.list(&t, &query, accept),
            (Method::POST, false) => {
                let body = self.read_body(&headers, body).await?;
                self.create(&t, &query, &headers, body).await
            }
            (Method::PUT, true) => {
                let body = self.read_body(&headers, body).await?;
                self.update(&t, &query, &headers, body).await
            }
            (Method::PATCH, true) => {
                let ct = header_str(&headers, header::CONTENT_TYPE).to_string();
                let kind = PatchType::from_content_type(&ct)
                    .ok_or_else(|| Status::unsupported_media(&ct))?;
                let raw = self.collect(body).await?;
                self.patch(&t, &query, &headers, kind, raw).await
            }
            (Method::DELETE, true) => {
                let raw = self.collect(body).await?;
                self.delete(&t, &query, raw).await
            }
            (Method::DELETE, false) => {
                let raw = self.collect(body).await?;
                self.delete_collection(&t, &query, raw).await
            }
            (m, _) => Err(Status::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            ))),
        }
    }

    async fn collect(&self, body: Body) -> Result<Bytes, Status> {
        use http_body_util::BodyExt;
        let limited = http_body_util::Limited::new(body, self.max_body);
        match limited.collect().await {
            Ok(c) => Ok(c.to_bytes()),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    Err(Status::too_large(self.max_body))
                } else {
                    Err(Status::bad_request(format!(
                        "cannot read the request body: {e}"
                    )))
                }
            }
        }
    }

    async fn read_body(&self, headers: &HeaderMap, body: Body) -> Result<Value, Status> {
        let ct = header_str(headers, header::CONTENT_TYPE).to_string();
        let raw = self.collect(body).await?;
        decode(&ct, &raw)
    }

    fn get(&self, t: &Target, accept: &str) -> Result<Response, Status> {
        let name = t.name.clone().unwrap_or_default();
        let obj = {
            let tables = self.store.read();
            tables.get(&key(t, &name)).cloned()
        }
        .ok_or_else(|| Status::not_found(&t.res.group, &t.res.plural, &name))?;
        let v = outward(obj.value(), &t.res, &t.version);
        if table::wants_table(accept) {
            let rv = obj.rv;
            let tb = table::table(&t.res, &t.version, &[v], Include::Metadata, rv, None);
            return Ok(typed_table(tb));
        }
        Ok(json_response(StatusCode::OK, &v))
    }

    fn list(&self, t: &Target, q: &Query, accept: &str) -> Result<Response, Status> {
        let (labels, fields) = selectors(t, q)?;
        let limit: usize = match q.get("limit") {
            Some(l) => l
                .parse::<i64>()
                .map_err(|_| Status::bad_request(format!("invalid limit {l:?}")))?
                .max(0) as usize,
            None => 0,
        };
        let start = match q.get("continue").filter(|c| !c.is_empty()) {
            Some(c) => Some(decode_continue(c)?),
            None => None,
        };
        let (rv, items, cont, remaining) = {
            let tables = self.store.read();
            let rv = tables.rv;
            let mut items: Vec<Arc<Obj>> = Vec::new();
            let mut cont = None;
            let mut remaining = 0usize;
            if let Some(map) = tables.objects.get(&t.res.store_key) {
                use std::ops::Bound;
                let lower = match &start {
                    Some(k) => Bound::Excluded(k.clone()),
                    None => Bound::Unbounded,
                };
                let range: Box<dyn Iterator<Item = Entry<'_>>> = if t.ns.is_empty() {
                    Box::new(map.range((lower, Bound::Unbounded)))
                } else {
                    let lo = match &start {
                        Some(k) if k.0 == t.ns => Bound::Excluded(k.clone()),
                        _ => Bound::Included((t.ns.clone(), String::new())),
                    };
                    let ns = t.ns.clone();
                    Box::new(
                        map.range((lo, Bound::Unbounded))
                            .take_while(move |((n, _), _)| *n == ns),
                    )
                };
                let mut last: Option<&(String, String)> = None;
                for (k, o) in range {
                    if !labels.is_empty() && !labels.matches(o) {
                        continue;
                    }
                    if !fields.is_empty() && !fields.matches(&o.value()) {
                        continue;
                    }
                    if limit > 0 && items.len() == limit {
                        // The next page starts after the last item of this one.
                        if cont.is_none()
                            && let Some((ns, name)) = last
                        {
                            cont = Some(encode_continue(rv, ns, name));
                        }
                        remaining += 1;
                        continue;
                    }
                    last = Some(k);
                    items.push(o.clone());
                }
            }
            (rv, items, cont, remaining)
        };
        if table::wants_table(accept) {
            let values: Vec<Value> = items
                .iter()
                .map(|o| outward(o.value(), &t.res, &t.version))
                .collect();
            let tb = table::table(
                &t.res,
                &t.version,
                &values,
                Include::parse(q.get("includeObject").map(String::as_str)),
                rv,
                cont.as_deref(),
            );
            return Ok(typed_table(tb));
        }
        let api_version = t.res.api_version(&t.version);
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = &cont {
            meta["continue"] = json!(c);
            meta["remainingItemCount"] = json!(remaining);
        }
        let mut out =
            BytesMut::with_capacity(64 + items.iter().map(|o| o.json_len() + 1).sum::<usize>());
        out.put_slice(
            format!(
                "{{\"kind\":\"{}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":[",
                t.res.list_kind
            )
            .as_bytes(),
        );
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                out.put_u8(b',');
            }
            put_object(&mut out, o, &t.res, &t.version, &api_version);
        }
        out.put_slice(b"]}");
        Ok(raw_json(StatusCode::OK, out.freeze()))
    }

    fn watch(&self, t: &Target, q: &Query, accept: &str) -> Result<Response, Status> {
        let (labels, fields) = selectors(t, q)?;
        let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
        let initial_events = q.get("sendInitialEvents").map(String::as_str) == Some("true");
        let timeout = q
            .get("timeoutSeconds")
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(1800);
        let as_table = table::wants_table(accept);
        let from: Option<u64> = match q.get("resourceVersion").map(String::as_str) {
            None | Some("") | Some("0") => None,
            Some(s) => Some(
                s.parse()
                    .map_err(|_| Status::bad_request(format!("invalid resource version: {s:?}")))?,
            ),
        };
        let mut rx = self.store.subscribe();
        // What to send first, and from which version on live events follow.
        let (first, mut last_rv, expired) = {
            let tables = self.store.read();
            match from {
                Some(rv) if !initial_events => match tables.events_since(rv) {
                    Some(evs) => (
                        evs.into_iter()
                            .filter(|e| e.key.res == t.res.store_key)
                            .map(|e| (e.kind, e.obj, None))
                            .collect::<Vec<_>>(),
                        tables.rv.max(rv),
                        None,
                    ),
                    None => (Vec::new(), tables.rv, Some((rv, tables.compacted))),
                },
                _ => {
                    let objs: Vec<Replay> = tables
                        .objects
                        .get(&t.res.store_key)
                        .map(|m| {
                            m.iter()
                                .filter(|((ns, _), _)| t.ns.is_empty() || *ns == t.ns)
                                .map(|(_, o)| (EventType::Added, o.clone(), None))
                                .collect()
                        })
                        .unwrap_or_default();
                    (objs, tables.rv, None)
                }
            }
        };
        let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
        let res = t.res.clone();
        let version = t.version.clone();
        let ns = t.ns.clone();
        let stop = self.stop.clone();
        let bookmark_every = self.bookmark_every;
        tokio::spawn(async move {
            let w = Watcher {
                res,
                version,
                ns,
                labels,
                fields,
                as_table,
            };
            if let Some((rv, compacted)) = expired {
                let s = Status::gone(format!("too old resource version: {rv} ({compacted})"));
                let line = format!("{{\"type\":\"ERROR\",\"object\":{}}}\n", s.to_json());
                let _ = tx.send(Ok(Bytes::from(line))).await;
                return;
            }
            for (kind, obj, prev) in first {
                if let Some(b) = w.line(kind, &obj, prev.as_deref())
                    && tx.send(Ok(b)).await.is_err()
                {
                    return;
                }
            }
            if initial_events {
                let b = w.bookmark(last_rv, true);
                if tx.send(Ok(b)).await.is_err() {
                    return;
                }
            }
            let deadline = tokio::time::sleep(Duration::from_secs(timeout));
            tokio::pin!(deadline);
            let mut tick = tokio::time::interval(bookmark_every);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = &mut deadline => return,
                    _ = stop.cancelled() => return,
                    _ = tick.tick(), if bookmarks => {
                        if tx.send(Ok(w.bookmark(last_rv, false))).await.is_err() {
                            return;
                        }
                    }
                    got = rx.recv() => match got {
                        Ok(batch) => {
                            for e in batch.iter() {
                                if e.rv <= last_rv {
                                    continue;
                                }
                                last_rv = e.rv;
                                if e.key.res != w.res.store_key || (!w.ns.is_empty() && e.key.ns != w.ns) {
                                    continue;
                                }
                                if let Some(b) = w.line(e.kind, &e.obj, e.prev.as_deref())
                                    && tx.send(Ok(b)).await.is_err()
                                {
                                    return;
                                }
                            }
                        }
                        // A watcher that fell this far behind is ended; its client resumes
                        // from the last version it saw, which the history still holds.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, resource = %w.res.plural, "watch fell behind; closed for the client to resume");
                            return;
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(body_rx);
        let ct = if as_table {
            "application/json;as=Table;v=v1;g=meta.k8s.io"
        } else {
            "application/json"
        };
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(ct));
        Ok(r)
    }

    fn ctx(&self, t: &Target, q: &Query, headers: &HeaderMap, name: String) -> WriteCtx {
        let validation = match q.get("fieldValidation").map(String::as_str) {
            Some("Strict") => Validation::Strict,
            Some("Ignore") => Validation::Ignore,
            _ => Validation::Warn,
        };
        let manager = q.get("fieldManager").cloned().unwrap_or_else(|| {
            header_str(headers, header::USER_AGENT)
                .split('/')
                .next()
                .filter(|s| !s.is_empty())
                .unwrap_or("unknown")
                .to_string()
        });
        WriteCtx {
            res: t.res.clone(),
            version: t.version.clone(),
            ns: t.ns.clone(),
            name,
            validation,
            manager,
            sub: t.sub.clone().unwrap_or_default(),
            warnings: Mutex::new(Vec::new()),
        }
    }

    fn check_namespace(&self, t: &Target, name: &str) -> Result<(), Status> {
        if !t.res.namespaced {
            return Ok(());
        }
        let tables = self.store.read();
        let nk = Key {
            res: Arc::from("namespaces"),
            ns: String::new(),
            name: t.ns.clone(),
        };
        match tables.get(&nk) {
            None => Err(Status::not_found("", "namespaces", &t.ns)),
            Some(o) if o.deleting => Err(Status::new(
                403,
                "Forbidden",
                format!(
                    "{} \"{name}\" is forbidden: unable to create new content in namespace {} because it is being terminated",
                    qualified(&t.res.group, &t.res.plural),
                    t.ns
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    async fn create(
        &self,
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
        self.check_namespace(t, &name)?;
        let ctx = Arc::new(self.ctx(t, q, headers, name.clone()));
        let c2 = ctx.clone();
        let dry = dry_run(q)?;
        let done = self
            .store
            .mutate(
                key(t, &name),
                dry,
                Box::new(move |old, _| {
                    if old.is_some() {
                        return Err(Status::already_exists(
                            &c2.res.group,
                            &c2.res.plural,
                            &c2.name,
                        ));
                    }
                    finish(&c2, None, body, true)
                }),
            )
            .await?;
        self.after_write(t);
        Ok(written(StatusCode::CREATED, &done, t, &ctx))
    }

    async fn update(
        &self,
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
        let ctx = Arc::new(self.ctx(t, q, headers, name.clone()));
        let c2 = ctx.clone();
        let done = self
            .store
            .mutate(
                key(t, &name),
                dry_run(q)?,
                Box::new(move |old, _| match old {
                    None => Err(Status::not_found(&c2.res.group, &c2.res.plural, &c2.name)),
                    Some(old) => finish(&c2, Some(&old), body, true),
                }),
            )
            .await?;
        self.after_write(t);
        Ok(written(StatusCode::OK, &done, t, &ctx))
    }

    async fn patch(
        &self,
        t: &Target,
        q: &Query,
        headers: &HeaderMap,
        kind: PatchType,
        raw: Bytes,
    ) -> Result<Response, Status> {
        let name = t.name.clone().unwrap_or_default();
        let body: Value = if kind == PatchType::Apply {
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
        if kind == PatchType::Apply {
            self.check_namespace(t, &name).or_else(|e| {
                if self.store.read().get(&key(t, &name)).is_some() {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        }
        let force = q.get("force").map(String::as_str) == Some("true");
        let ctx = Arc::new(self.ctx(t, q, headers, name.clone()));
        let c2 = ctx.clone();
        let done = self
            .store
            .mutate(
                key(t, &name),
                dry_run(q)?,
                Box::new(move |old, _| {
                    let c = &c2;
                    let now = meta::now_rfc3339();
                    match (kind, old) {
                        (PatchType::Apply, None) => {
                            let mut obj = body;
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
                                PatchType::Json => patch::json_patch(&mut new, &body).map_err(|e| {
                                    Status::new(422, "Invalid", format!("the server rejected our request due to an error in our request: {e}"))
                                })?,
                                PatchType::Strategic => patch::strategic_merge(&mut new, &body)
                                    .map_err(|e| Status::bad_request(format!("error applying strategic merge patch: {e}")))?,
                                PatchType::Apply => {}
                            }
                            // A patch keeps the stored version unless it names one itself.
                            finish(c, Some(&old), new, true)
                        }
                    }
                }),
            )
            .await?;
        self.after_write(t);
        let code = if done.created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        };
        Ok(written(code, &done, t, &ctx))
    }

    async fn delete(&self, t: &Target, q: &Query, raw: Bytes) -> Result<Response, Status> {
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
        self.after_write(t);
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

    async fn delete_collection(
        &self,
        t: &Target,
        q: &Query,
        raw: Bytes,
    ) -> Result<Response, Status> {
        let (labels, fields) = selectors(t, q)?;
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

    fn after_write(&self, t: &Target) {
        if t.res.plural == "customresourcedefinitions" {
            self.refresh_registry();
        }
    }
}

fn dry_run(q: &Query) -> Result<bool, Status> {
    match q.get("dryRun").map(String::as_str) {
        None | Some("") => Ok(false),
        Some("All") => Ok(true),
        Some(other) => Err(Status::bad_request(format!(
            "Invalid dry run value: {other:?}: supported values: \"All\""
        ))),
    }
}

fn key(t: &Target, name: &str) -> Key {
    Key {
        res: t.res.store_key.clone(),
        ns: t.ns.clone(),
        name: name.to_string(),
    }
}

fn header_str(h: &HeaderMap, k: header::HeaderName) -> &str {
    h.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default()
}

/// Decodes a request body by its content type.
pub fn decode(ct: &str, raw: &[u8]) -> Result<Value, Status> {
    let base = ct.split(';').next().unwrap_or_default().trim();
    let v: Value = match base {
        "" | "application/json" | "*/*" => serde_json::from_slice(raw).map_err(|e| {
            Status::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        crate::proto::MEDIA => crate::proto::decode(raw).map_err(|e| match e {
            crate::proto::Refused::Garbage(m) => Status::bad_request(m),
            crate::proto::Refused::Kind(m) => {
                let mut s = Status::unsupported_media(crate::proto::MEDIA);
                s.message = m;
                s
            }
        })?,
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml_ng::from_slice(raw)
            .map_err(|e| {
            Status::bad_request(format!(
                "the body of the request could not be decoded as YAML: {e}"
            ))
        })?,
        other => return Err(Status::unsupported_media(other)),
    };
    if !v.is_object() {
        return Err(Status::bad_request(
            "the body of the request must be an object",
        ));
    }
    Ok(v)
}

/// Refuses a body of another group or kind than the URL's.
fn check_type(body: &Value, res: &Resource, version: &str) -> Result<(), Status> {
    let want = res.api_version(version);
    match body.get("apiVersion").and_then(Value::as_str) {
        Some(v) if v == want => {}
        Some(v)
            if res
                .version(v.rsplit('/').next().unwrap_or_default())
                .is_some()
                && v.rsplit_once('/').map(|(g, _)| g).unwrap_or("") == res.group => {}
        Some(v) => {
            return Err(Status::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({want})"
            )));
        }
        None => {}
    }
    match body.get("kind").and_then(Value::as_str) {
        Some(k) if k == res.kind => Ok(()),
        Some(k) => Err(Status::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            res.kind
        ))),
        None => Ok(()),
    }
}

/// The label and field selectors of a request.
fn selectors(t: &Target, q: &Query) -> Result<(Labels, Fields), Status> {
    let labels = Labels::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| Status::bad_request(format!("unable to parse requirement: {e}")))?;
    let fields = Fields::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &allowed_fields(&t.res, &t.version),
    )
    .map_err(Status::bad_request)?;
    Ok((labels, fields))
}

/// Field selector paths a resource supports.
fn allowed_fields(res: &Resource, version: &str) -> Vec<String> {
    let mut out = vec!["metadata.name".to_string()];
    if res.namespaced {
        out.push("metadata.namespace".into());
    }
    match res.kind.as_str() {
        "Secret" => out.push("type".into()),
        "Namespace" => out.push("status.phase".into()),
        "Node" => out.push("spec.unschedulable".into()),
        "Event" => {
            for f in [
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            ] {
                out.push(f.into());
            }
        }
        _ => {}
    }
    let _ = version;
    out
}

/// An object as a client sees it at `version`.
fn outward(mut v: Value, res: &Resource, version: &str) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(res.api_version(version)));
        m.insert("kind".into(), json!(res.kind));
    }
    v
}

fn put_object(out: &mut BytesMut, o: &Obj, res: &Resource, version: &str, api_version: &str) {
    if o.api_version == api_version {
        out.put_slice(&o.json());
    } else {
        let v = outward(o.value(), res, version);
        out.put_slice(&serde_json::to_vec(&v).unwrap_or_default());
    }
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}")});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

fn decode_continue(c: &str) -> Result<(String, String), Status> {
    let bad = || Status::bad_request(format!("continue key is not valid: {c:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let start = v["start"].as_str().ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    Ok((ns.to_string(), name.to_string()))
}

pub fn json_response(code: StatusCode, v: &Value) -> Response {
    raw_json(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

fn raw_json(code: StatusCode, b: Bytes) -> Response {
    let mut r = (code, b).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn typed(v: Value, media: &'static str) -> Response {
    let mut r = json_response(StatusCode::OK, &v);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media));
    r.headers_mut()
        .insert(header::VARY, HeaderValue::from_static("Accept"));
    r
}

fn typed_table(v: Value) -> Response {
    typed(v, "application/json;as=Table;v=v1;g=meta.k8s.io")
}

fn written(code: StatusCode, done: &Done, t: &Target, ctx: &WriteCtx) -> Response {
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

struct Watcher {
    res: Arc<Resource>,
    version: String,
    ns: String,
    labels: Labels,
    fields: Fields,
    as_table: bool,
}

impl Watcher {
    fn matches(&self, o: &Obj) -> bool {
        (self.labels.is_empty() || self.labels.matches(o))
            && (self.fields.is_empty() || self.fields.matches(&o.value()))
    }

    /// The line of an event, as a selector sees it: an object that starts matching is ADDED,
    /// one that stops matching is DELETED.
    fn line(&self, kind: EventType, o: &Obj, prev: Option<&Obj>) -> Option<Bytes> {
        let now = self.matches(o);
        let before = prev.map(|p| self.matches(p));
        let kind = match (kind, before, now) {
            (EventType::Deleted, _, _) if before.unwrap_or(now) => EventType::Deleted,
            (EventType::Deleted, _, _) => return None,
            (_, _, true) if before == Some(false) => EventType::Added,
            (k, _, true) => k,
            (_, Some(true), false) => EventType::Deleted,
            (_, _, false) => return None,
        };
        let mut out = BytesMut::with_capacity(o.json_len() + 40);
        out.put_slice(format!("{{\"type\":\"{}\",\"object\":", kind.as_str()).as_bytes());
        if self.as_table {
            let v = outward(o.value(), &self.res, &self.version);
            let tb = table::table(
                &self.res,
                &self.version,
                &[v],
                Include::Metadata,
                o.rv,
                None,
            );
            out.put_slice(&serde_json::to_vec(&tb).unwrap_or_default());
        } else {
            put_object(
                &mut out,
                o,
                &self.res,
                &self.version,
                &self.res.api_version(&self.version),
            );
        }
        out.put_slice(b"}\n");
        Some(out.freeze())
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.res.kind, "apiVersion": self.res.api_version(&self.version),
            "metadata": meta});
        Bytes::from(format!("{{\"type\":\"BOOKMARK\",\"object\":{obj}}}\n"))
    }
}

/// Whether `a` and `b` differ in what `metadata.generation` counts: everything but metadata, and
/// status when the resource has a status subresource.
fn spec_changed(a: &Value, b: &Value, status_sub: bool) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            m.remove("apiVersion");
            m.remove("kind");
            if status_sub {
                m.remove("status");
            }
        }
        v
    };
    strip(a) != strip(b)
}

fn same_ignoring_bookkeeping(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            m.remove("resourceVersion");
            m.remove("managedFields");
        }
        if let Some(m) = v.as_object_mut() {
            m.remove("apiVersion");
        }
        v
    };
    strip(a) == strip(b)
}

/// The common end of create, update and patch, run in the writer on the current object.
fn finish(
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
    Ok(Outcome::Put(new))
}

/// Kind-specific defaults and checks of the built-in kinds.
fn builtin_rules(c: &WriteCtx, old: Option<&Value>, new: &mut Value) -> Result<(), Status> {
    let invalid = |causes: Vec<Cause>| Status::invalid(&c.res.kind, &c.res.group, &c.name, causes);
    match (c.res.group.as_str(), c.res.kind.as_str()) {
        ("", "Namespace") => {
            for field in ["spec", "status"] {
                if let Some(v) = new.get(field).filter(|v| !v.is_object() && !v.is_null()) {
                    return Err(invalid(vec![Cause::type_invalid(
                        field,
                        v,
                        "must be an object",
                    )]));
                }
            }
            if old.is_none() {
                new["spec"]["finalizers"] = json!(["kubernetes"]);
                new["status"] = json!({"phase": "Active"});
            }
        }
        ("", "ConfigMap") => {
            let mut causes = Vec::new();
            for field in ["data", "binaryData"] {
                if let Some(d) = new.get(field).filter(|d| !d.is_null()) {
                    match d.as_object() {
                        Some(m) => {
                            for (k, v) in m {
                                let key_ok = !k.is_empty()
                                    && k.len() <= 253
                                    && k.chars()
                                        .all(|ch| ch.is_ascii_alphanumeric() || "-._".contains(ch));
                                if !key_ok {
                                    causes.push(Cause::invalid(field, &json!(k),
                                        "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"));
                                }
                                let ok = match (field, v.as_str()) {
                                    ("data", Some(_)) => true,
                                    ("binaryData", Some(s)) => {
                                        base64::engine::general_purpose::STANDARD.decode(s).is_ok()
                                    }
                                    _ => false,
                                };
                                if !ok {
                                    causes.push(Cause::type_invalid(
                                        format!("{field}.{k}"),
                                        v,
                                        if field == "data" {
                                            "must be a string"
                                        } else {
                                            "must be base64-encoded"
                                        },
                                    ));
                                }
                            }
                        }
                        None => {
                            causes.push(Cause::type_invalid(field, d, "must be a map of strings"))
                        }
                    }
                }
            }
            if !causes.is_empty() {
                return Err(invalid(causes));
            }
        }
        ("", "Secret") => {
            for field in ["data", "stringData"] {
                if let Some(v) = new.get(field).filter(|v| !v.is_object() && !v.is_null()) {
                    return Err(invalid(vec![Cause::type_invalid(
                        field,
                        v,
                        "must be a map of strings",
                    )]));
                }
            }
            if let Some(sd) = new.as_object_mut().and_then(|m| m.remove("stringData"))
                && let Some(m) = sd.as_object()
            {
                for (k, v) in m {
                    let s = v.as_str().unwrap_or_default();
                    new["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
                }
            }
            if !new["type"].is_string() {
                new["type"] = json!("Opaque");
            }
            let mut causes = Vec::new();
            if let Some(m) = new["data"].as_object() {
                for (k, v) in m {
                    if !v.as_str().is_some_and(|s| {
                        base64::engine::general_purpose::STANDARD.decode(s).is_ok()
                    }) {
                        causes.push(Cause::type_invalid(
                            format!("data[{k}]"),
                            v,
                            "must be base64-encoded",
                        ));
                    }
                }
            }
            if let Some(old) = old
                && old["type"] != new["type"]
            {
                causes.push(Cause::invalid("type", &new["type"], "field is immutable"));
            }
            if !causes.is_empty() {
                return Err(invalid(causes));
            }
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            if c.sub == "status" {
                return Ok(());
            }
            let res = crate::resources::from_crd(new).map_err(invalid)?;
            if let Some(old) = old
                && (old["spec"]["group"] != new["spec"]["group"]
                    || old["spec"]["names"]["plural"] != new["spec"]["names"]["plural"])
            {
                return Err(invalid(vec![Cause::invalid(
                    "spec.group",
                    &new["spec"]["group"],
                    "field is immutable",
                )]));
            }
            if old.is_none() {
                let f = new["metadata"]["finalizers"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let cleanup = json!("customresourcecleanup.apiextensions.k8s.io");
                if !f.contains(&cleanup) {
                    let mut f = f;
                    f.push(cleanup);
                    new["metadata"]["finalizers"] = Value::Array(f);
                }
            }
            let now = meta::now_rfc3339();
            let storage: Vec<Value> = new["spec"]["versions"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter(|v| v["storage"] == json!(true))
                        .map(|v| v["name"].clone())
                        .collect()
                })
                .unwrap_or_default();
            let mut stored = old
                .and_then(|o| o["status"]["storedVersions"].as_array().cloned())
                .unwrap_or_default();
            for s in storage {
                if !stored.contains(&s) {
                    stored.push(s);
                }
            }
            let since = old
                .and_then(|o| {
                    o["status"]["conditions"][0]["lastTransitionTime"]
                        .as_str()
                        .map(str::to_string)
                })
                .unwrap_or(now);
            let mut names = new["spec"]["names"].clone();
            names["singular"] = json!(res.singular);
            names["listKind"] = json!(res.list_kind);
            new["status"] = json!({
                "acceptedNames": names,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": since},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": since}
                ],
                "storedVersions": stored,
            });
        }
        _ => {}
    }
    Ok(())
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
