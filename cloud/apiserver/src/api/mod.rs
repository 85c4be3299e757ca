//! The REST handlers: get, list, watch, create, update, patch, delete and deletecollection on
//! every served resource, with the status subresource, dry runs and field validation, as the
//! Kubernetes API conventions define them.

use crate::discovery;
use crate::patch::PatchType;
use crate::resources::{Registry, Resource};
use crate::selector::{Fields, Labels};
use crate::status::{Status, qualified};
use crate::store::{EventType, Key, Obj, Store};
use crate::{User, authz};
use axum::body::Body;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

mod builtin;
mod encode;
#[cfg(test)]
pub(crate) mod garbage;
#[cfg(test)]
mod node_reach;
mod read;
mod review;
mod watch;
mod write;

use builtin::builtin_rules;
use encode::*;
pub(crate) use encode::{decode, json_response};
pub(crate) use write::delete_outcome;

/// The API's shared state.
pub struct Api {
    pub store: Store,
    registry: RwLock<Arc<Registry>>,
    pub max_body: usize,
    /// KiB of request bodies being decoded and handled at once. A body's decoded form takes
    /// tens of times its size (a 1.5 MiB CRD of small schemas took ~95 MB), so concurrent
    /// large bodies wait for each other instead of adding up to the machine's memory.
    body_budget: Arc<tokio::sync::Semaphore>,
    pub server_addr: String,
    pub bookmark_every: Duration,
    pub stop: CancellationToken,
    /// Subresources the embedding program serves ([`crate::Subresource`]).
    pub subresources: Vec<crate::Subresource>,
    /// Read-only kinds the embedding program serves ([`crate::External`]).
    pub externals: Vec<crate::External>,
}

pub(crate) type Query = HashMap<String, String>;

/// A request's body, and what only a subresource the embedding program serves uses: the
/// query as sent and the connection's upgrade.
#[derive(Default)]
pub struct Incoming {
    pub body: Body,
    pub raw_query: String,
    pub upgrade: Option<hyper::upgrade::OnUpgrade>,
}

impl From<Body> for Incoming {
    fn from(body: Body) -> Self {
        Self {
            body,
            ..Self::default()
        }
    }
}

/// The store keys of RBAC's four kinds.
const RBAC_KEYS: [&str; 4] = [
    "roles.rbac.authorization.k8s.io",
    "clusterroles.rbac.authorization.k8s.io",
    "rolebindings.rbac.authorization.k8s.io",
    "clusterrolebindings.rbac.authorization.k8s.io",
];

/// What this server reads from its view to decide any request (a namespace exists and is not
/// terminating, who may do what): a request waits until the view holds every write of these
/// the server answered (a write is answered on etcd's commit; see
/// [`crate::store::Store::own_writes`]), so that a client that created a namespace or a role
/// is decided against it at once. (A Device's write waits for the DeviceModels too: only it
/// reads them.)
pub(crate) const DECIDING: [&str; 5] = [
    "namespaces",
    RBAC_KEYS[0],
    RBAC_KEYS[1],
    RBAC_KEYS[2],
    RBAC_KEYS[3],
];

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
pub(crate) struct Target {
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
    /// Who writes, for the checks of [`crate::admission`].
    author: crate::admission::Author,
    /// A Device's desired values this write changes (`property`, `was`, `now`), recorded as
    /// Events on the Device once it is stored: who set which value when.
    audit: Mutex<Vec<(String, Option<String>, String)>>,
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
            body_budget: Arc::new(tokio::sync::Semaphore::new(Self::budget_kib(max_body))),
            server_addr,
            bookmark_every,
            stop,
            subresources: Vec::new(),
            externals: Vec::new(),
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
        let reg = Arc::new(Registry::build(&crds, &self.externals));
        *self.registry.write().unwrap_or_else(|e| e.into_inner()) = reg;
    }

    /// Routes a request under `/api` or `/apis`.
    pub async fn dispatch(
        self: Arc<Self>,
        user: &User,
        method: Method,
        path: &str,
        query: Query,
        headers: HeaderMap,
        incoming: Incoming,
    ) -> Response {
        let Incoming {
            body,
            raw_query,
            upgrade,
        } = incoming;
        self.store.own_writes(&DECIDING).await;
        let mut body = Some(body);
        let routed = self
            .route(
                user, method, path, query, headers, &mut body, raw_query, upgrade,
            )
            .await;
        match routed {
            Ok(r) => r,
            Err(s) => {
                // A refusal before the body was read reads what the client is still sending,
                // so that the client reads this answer instead of a reset connection.
                if let Some(b) = body.take() {
                    drain(b, self.max_body).await;
                }
                s.into_response()
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn route(
        &self,
        user: &User,
        method: Method,
        path: &str,
        query: Query,
        headers: HeaderMap,
        body: &mut Option<Body>,
        raw_query: String,
        upgrade: Option<hyper::upgrade::OnUpgrade>,
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
        // A body declared far beyond the limit is refused from its header, unread (one just over
        // it is read on, so that a client still writing it reads the 413: `collect`).
        if let Some(len) = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > (self.max_body as u64).saturating_mul(2)
        {
            // Not read at all: the connection closes on it.
            body.take();
            return Err(Status::too_large(self.max_body));
        }
        if group == "authorization.k8s.io" && method == Method::POST {
            let (body, _budget) = self.read_body(&headers, taken(body)).await?;
            return self.review(user, version, rest, body);
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
        let mut served = None;
        if let Some(s) = &sub {
            served = self
                .subresources
                .iter()
                .find(|x| x.group == res.group && x.plural == res.plural && x.name == *s)
                .cloned();
            let ok = (s == "status" && res.version(version).is_some_and(|v| v.status))
                || (s == "finalize" && res.plural == "namespaces")
                || served.is_some();
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
        let verb = match (&method, t.name.is_some()) {
            // A subresource the embedding program serves: the verb it names.
            _ if served.is_some() => served.as_ref().map_or("", |x| x.verb),
            (&Method::GET, _) if is_watch => "watch",
            (&Method::GET, true) => "get",
            (&Method::GET, false) => "list",
            (&Method::POST, _) => "create",
            (&Method::PUT, _) => "update",
            (&Method::PATCH, _) => "patch",
            (&Method::DELETE, true) => "delete",
            (&Method::DELETE, false) => "deletecollection",
            _ => "",
        };
        // The selectors are parsed once, here: the authorizer decides on the very terms the
        // list, watch or deletecollection then filters with. One that does not parse is
        // refused (400) once the request is allowed without it.
        let selected =
            matches!(verb, "list" | "watch" | "deletecollection").then(|| selectors(&t, &query));
        let attrs = authz::Attributes {
            verb,
            group: &t.res.group,
            resource: &t.res.plural,
            sub: t.sub.as_deref(),
            ns: &t.ns,
            name: t.name.as_deref(),
            field_selector: selected
                .as_ref()
                .and_then(|s| s.as_ref().ok())
                .map(|(_, f)| f),
        };
        if !authz::allowed(&self.store.read(), user, &attrs) {
            // A node's own Node or Lease: its name is in the body.
            if let Some(node) = authz::own_create(user, &attrs) {
                let (body, _budget) = self.read_body(&headers, taken(body)).await?;
                if body["metadata"]["name"].as_str() == Some(node) {
                    return self.create(user, &t, &query, &headers, body).await;
                }
            }
            return Err(authz::forbidden(user, &attrs));
        }
        let (labels, fields) = selected.transpose()?.unwrap_or_default();
        // A read of the latest objects (no resourceVersion, as kubectl and controllers read)
        // sees every write acknowledged before it, through any server. The next page of a
        // list continues the first one's read (its token holds where): no round to etcd and
        // no wait for the view per page (a list of 100,000 in pages of 500 paid 200 of them).
        if method == Method::GET
            && !is_watch
            && query.get("resourceVersion").is_none_or(|v| v.is_empty())
            && query.get("continue").is_none_or(|v| v.is_empty())
        {
            self.store.fresh().await;
        }
        if t.res.external {
            return self.external(&t, &method, verb, query);
        }
        if let Some(x) = served {
            if !x.methods.contains(&method) {
                let names: Vec<&str> = x.methods.iter().map(Method::as_str).collect();
                return Err(Status::new(
                    405,
                    "MethodNotAllowed",
                    format!(
                        "{}/{} only answers {}",
                        t.res.plural,
                        x.name,
                        names.join(" and ")
                    ),
                ));
            }
            let name = t.name.clone().unwrap_or_default();
            let obj = {
                let tables = self.store.read();
                tables.get(&key(&t, &name)).cloned()
            }
            .ok_or_else(|| Status::not_found(&t.res.group, &t.res.plural, &name))?;
            let request = crate::SubresourceRequest {
                user: user.name.clone(),
                method,
                query,
                raw_query,
                headers,
                upgrade,
            };
            return Ok((x.serve)(obj.value(), request).await);
        }
        match (method, t.name.is_some()) {
            (Method::GET, true) => self.get(&t, accept),
            (Method::GET, false) if is_watch => self.watch(&t, &query, accept, labels, fields),
            (Method::GET, false) => self.list(&t, &query, accept, &labels, &fields).await,
            (Method::POST, false) => {
                let (body, _budget) = self.read_body(&headers, taken(body)).await?;
                self.create(user, &t, &query, &headers, body).await
            }
            (Method::PUT, true) => {
                let (body, _budget) = self.read_body(&headers, taken(body)).await?;
                self.update(user, &t, &query, &headers, body).await
            }
            (Method::PATCH, true) => {
                let ct = header_str(&headers, header::CONTENT_TYPE).to_string();
                let kind = PatchType::from_content_type(&ct)
                    .ok_or_else(|| Status::unsupported_media(&ct))?;
                let (raw, _budget) = self.collect(taken(body)).await?;
                self.patch(user, &t, &query, &headers, kind, raw).await
            }
            (Method::DELETE, true) => {
                let (raw, _budget) = self.collect(taken(body)).await?;
                self.delete(&t, &query, raw).await
            }
            (Method::DELETE, false) => {
                let (raw, _budget) = self.collect(taken(body)).await?;
                self.delete_collection(&t, &query, raw, &labels, &fields)
                    .await
            }
            (m, _) => Err(Status::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({m})"
            ))),
        }
    }

    /// A `get` or `list` of a kind the embedding program serves; any other verb is 405.
    fn external(
        &self,
        t: &Target,
        method: &Method,
        verb: &str,
        query: Query,
    ) -> Result<Response, Status> {
        let e = self
            .externals
            .iter()
            .find(|e| e.group == t.res.group && e.plural == t.res.plural)
            .ok_or_else(|| Status::no_route(&t.res.plural))?;
        if *method != Method::GET || !matches!(verb, "get" | "list") || t.sub.is_some() {
            return Err(Status::new(
                405,
                "MethodNotAllowed",
                format!(
                    "{}.{} is read-only: get and list only",
                    t.res.plural, t.res.group
                ),
            ));
        }
        let stored = |res: &str, ns: &str, name: &str| {
            self.store
                .read()
                .get(&Key {
                    res: Arc::from(res),
                    ns: ns.to_string(),
                    name: name.to_string(),
                })
                .map(|o| o.value())
        };
        let request = crate::external::ExternalRequest {
            ns: t.ns.clone(),
            name: t.name.clone(),
            query,
            stored: &stored,
        };
        let items = (e.serve)(&request);
        let api_version = t.res.api_version(&t.version);
        match &t.name {
            Some(name) => items
                .into_iter()
                .next()
                .map(|o| json_response(StatusCode::OK, &o))
                .ok_or_else(|| Status::not_found(&t.res.group, &t.res.plural, name)),
            None => Ok(json_response(
                StatusCode::OK,
                &serde_json::json!({"kind": t.res.list_kind, "apiVersion": api_version,
                    "metadata": {}, "items": items}),
            )),
        }
    }

    /// One body of the largest size at once (thousands of ordinary ones).
    fn budget_kib(max_body: usize) -> usize {
        (max_body / 1024).clamp(1, u32::MAX as usize)
    }

    /// A request body, read whole, with its share of the body budget (held while the request
    /// is handled: drop it when done).
    async fn collect(
        &self,
        body: Body,
    ) -> Result<(Bytes, tokio::sync::OwnedSemaphorePermit), Status> {
        let raw = self.collect_bytes(body).await?;
        let want = (raw.len() / 1024).clamp(1, Self::budget_kib(self.max_body)) as u32;
        let permit = self
            .body_budget
            .clone()
            .acquire_many_owned(want)
            .await
            .map_err(|_| Status::new(503, "ServiceUnavailable", "the server is stopping"))?;
        Ok((raw, permit))
    }

    async fn collect_bytes(&self, mut body: Body) -> Result<Bytes, Status> {
        use http_body_util::BodyExt;
        let mut buf = BytesMut::new();
        while let Some(frame) = body.frame().await {
            let frame = frame
                .map_err(|e| Status::bad_request(format!("cannot read the request body: {e}")))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            if buf.len() + data.len() > self.max_body {
                drain(body, self.max_body).await;
                return Err(Status::too_large(self.max_body));
            }
            buf.extend_from_slice(&data);
        }
        Ok(buf.freeze())
    }

    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Value, tokio::sync::OwnedSemaphorePermit), Status> {
        let ct = header_str(headers, header::CONTENT_TYPE).to_string();
        let (raw, permit) = self.collect(body).await?;
        Ok((decode(&ct, &raw)?, permit))
    }

    async fn ctx(
        &self,
        user: &User,
        t: &Target,
        q: &Query,
        headers: &HeaderMap,
        name: String,
    ) -> WriteCtx {
        let device = t.res.group == "devices.kubeedge.io" && t.res.plural == "devices";
        if device && t.sub.is_none() {
            // Its desired values are checked against its model: with the models this server
            // wrote (see DECIDING).
            self.store.own_writes(&[crate::admission::MODELS_KEY]).await;
        }
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
            audit: Mutex::new(Vec::new()),
            author: crate::admission::Author {
                user: user.clone(),
                rbac: ((t.res.group == "rbac.authorization.k8s.io"
                    || (t.res.group == "operations.kubeedge.io"
                        && t.res.plural == "imageprepulljobs"))
                    && !user.in_group("system:masters"))
                .then(|| self.store.read().only(&RBAC_KEYS)),
                models: (device && t.sub.is_none())
                    .then(|| self.store.read().only(&[crate::admission::MODELS_KEY])),
                pod_security: (t.res.group.is_empty() && t.res.plural == "pods" && t.sub.is_none())
                    .then(|| {
                        let tables = self.store.read();
                        let ns = tables
                            .get(&Key {
                                res: Arc::from("namespaces"),
                                ns: String::new(),
                                name: t.ns.clone(),
                            })
                            .map(|o| o.value());
                        crate::podsecurity::Policy::of_namespace(ns.as_ref())
                    }),
            },
        }
    }

    /// Whether `t`'s namespace takes new content: it exists and is not being deleted. A
    /// namespace this server does not hold is looked for again once its view holds what etcd
    /// has (created a moment ago through another server), as kube-apiserver's namespace
    /// admission looks one up live when its cache misses.
    async fn check_namespace(&self, t: &Target, name: &str) -> Result<(), Status> {
        match self.namespace_takes(t, name) {
            Err(e) if e.code == 404 && self.store.shared() => {
                self.store.fresh().await;
                self.namespace_takes(t, name)
            }
            r => r,
        }
    }

    fn namespace_takes(&self, t: &Target, name: &str) -> Result<(), Status> {
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

    async fn after_write(&self, t: &Target) {
        if t.res.plural == "customresourcedefinitions" {
            // The registry is built from the view: once it holds this write.
            self.store.own_writes(&[&t.res.store_key]).await;
            self.refresh_registry();
        }
    }

    /// Records a stored Device write's desired value changes as Events on the Device (reason
    /// `DesiredValueSet`, the user in the message), as the audit of who set which value when.
    /// An Event that cannot be stored is logged; the write stands.
    async fn audit(&self, c: &WriteCtx, done: &crate::store::Done, dry: bool) {
        let changes = std::mem::take(&mut *c.audit.lock().unwrap_or_else(|e| e.into_inner()));
        if dry || changes.is_empty() || done.deleted {
            return;
        }
        let reg = self.registry();
        let Some(events) = reg
            .resources
            .iter()
            .find(|r| r.group.is_empty() && r.plural == "events")
        else {
            return;
        };
        let now = crate::meta::now_rfc3339();
        let uid = done.value["metadata"]["uid"].clone();
        let version = done.value["apiVersion"].clone();
        for (k, (property, was, value)) in changes.into_iter().enumerate() {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let name = format!("{}.{:x}{k}", c.name, nanos);
            let message = match &was {
                Some(w) => format!(
                    "{property} set to {value} (was {w}) by {}",
                    c.author.user.name
                ),
                None => format!("{property} set to {value} by {}", c.author.user.name),
            };
            let event = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": c.ns, "uid": uuid::Uuid::new_v4().to_string(),
                    "creationTimestamp": now},
                "involvedObject": {"apiVersion": version, "kind": "Device", "name": c.name,
                    "namespace": c.ns, "uid": uid, "fieldPath": format!("spec.properties{{{property}}}.desired")},
                "reason": "DesiredValueSet",
                "message": message,
                "type": "Normal",
                "source": {"component": "cloudcore"},
                "reportingComponent": "cloudcore",
                "reportingInstance": "apiserver",
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            });
            let key = crate::store::Key {
                res: events.store_key.clone(),
                ns: c.ns.clone(),
                name,
            };
            let put = self
                .store
                .mutate(
                    key,
                    false,
                    Box::new(move |old, _| match old {
                        Some(o) => Ok(crate::store::Outcome::Unchanged(o)),
                        None => Ok(crate::store::Outcome::Put(event.clone())),
                    }),
                )
                .await;
            if let Err(e) = put {
                tracing::warn!(device = %c.name, %property, error = %e.message, "cannot record who set a desired value (an Event)");
            }
        }
        // Bounded: a Device keeps its last AUDIT_KEPT such Events (the API keeps Events until
        // deleted, and a set point moved by a script every second would add 86,400 a day).
        // Counted once the view holds the Events just written (on etcd a write is answered
        // on the commit, which the view follows).
        self.store.own_writes(&[&events.store_key]).await;
        let mine: Vec<(u64, String)> = {
            let tables = self.store.read();
            let Some(objects) = tables.objects.get(&events.store_key) else {
                return;
            };
            let prefix = format!("{}.", c.name);
            objects
                .iter()
                .filter(|((ns, name), _)| *ns == c.ns && name.starts_with(&prefix))
                .filter(|(_, o)| {
                    serde_json::from_slice::<Value>(&o.json()).is_ok_and(|v| {
                        v["reason"] == "DesiredValueSet"
                            && v["involvedObject"]["name"] == c.name.as_str()
                    })
                })
                .map(|((_, name), o)| (o.rv, name.clone()))
                .collect()
        };
        if mine.len() <= AUDIT_KEPT {
            return;
        }
        let mut mine = mine;
        mine.sort_unstable();
        for (_, name) in &mine[..mine.len() - AUDIT_KEPT] {
            let key = crate::store::Key {
                res: events.store_key.clone(),
                ns: c.ns.clone(),
                name: name.clone(),
            };
            let _ = self
                .store
                .mutate(
                    key,
                    false,
                    Box::new(|old, _| match old {
                        Some(v) => Ok(crate::store::Outcome::Delete(v)),
                        None => Ok(crate::store::Outcome::Unchanged(Value::Null)),
                    }),
                )
                .await;
        }
    }
}

/// The desired-value Events a Device keeps (see [`Api::audit`]).
const AUDIT_KEPT: usize = 100;

/// How long a refused body is read on (see [`drain`]).
const DRAIN_FOR: Duration = Duration::from_secs(10);

/// Reads and drops up to `limit` more bytes of a refused body, for at most [`DRAIN_FOR`], so
/// that a client still writing it (HTTP/1.1 without `Expect: 100-continue`: kube-rs, kubectl)
/// reads the 413 instead of a connection reset under its write. Beyond that the connection is
/// closed with the body unread.
/// The request's body, once: a route that reads it takes it from the slot ([`Api::dispatch`]
/// drains what is left in the slot after a refusal).
fn taken(body: &mut Option<Body>) -> Body {
    body.take().unwrap_or_else(Body::empty)
}

async fn drain(mut body: Body, limit: usize) {
    use http_body_util::BodyExt;
    let mut left = limit;
    let _ = tokio::time::timeout(DRAIN_FOR, async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |d| d.len());
            if n >= left {
                return;
            }
            left -= n;
        }
    })
    .await;
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

/// The label and field selectors of a request.
fn selectors(t: &Target, q: &Query) -> Result<(Labels, Fields), Status> {
    let labels = Labels::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
        .map_err(|e| Status::bad_request(e.to_string()))?;
    let fields = Fields::parse(
        q.get("fieldSelector").map(String::as_str).unwrap_or(""),
        &allowed_fields(&t.res, &t.version),
    )
    .map_err(|e| Status::bad_request(e.to_string()))?;
    Ok((labels, fields))
}

#[cfg(test)]
mod body_budget;
