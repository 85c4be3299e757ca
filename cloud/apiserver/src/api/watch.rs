//! watch: the initial events, then the store's, with bookmarks.

use super::*;
use crate::resources::Resource;
use crate::selector::{Fields, Labels};
use crate::status::Status;
use crate::store::{EventType, Obj};
use crate::table::{self, Include};
use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

impl Api {
    pub(super) fn watch(
        &self,
        t: &Target,
        q: &Query,
        accept: &str,
        labels: Labels,
        fields: Fields,
    ) -> Result<Response, Status> {
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
                            .filter(|e| {
                                e.key.res == t.res.store_key
                                    && (t.ns.is_empty() || e.key.ns == t.ns)
                            })
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
        let store = self.store.clone();
        tokio::spawn(async move {
            let w = Watcher {
                res,
                version,
                ns,
                labels,
                fields,
                as_table,
            };
            // Older than the view's history: from etcd's own history when the store is on etcd
            // and it still has it, else 410 Gone.
            let mut first = first;
            if let Some((rv, _)) = expired {
                match store.replay(&w.res.store_key, rv).await {
                    Ok((evs, upto)) => {
                        first = evs
                            .into_iter()
                            .filter(|e| w.ns.is_empty() || e.key.ns == w.ns)
                            .map(|e| (e.kind, e.obj, e.prev))
                            .collect();
                        last_rv = last_rv.max(upto);
                    }
                    Err(compacted) => {
                        let s =
                            Status::gone(format!("too old resource version: {rv} ({compacted})"));
                        let line = format!("{{\"type\":\"ERROR\",\"object\":{}}}\n", s.to_json());
                        let _ = tx.send(Ok(Bytes::from(line))).await;
                        return;
                    }
                }
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
                            // Several events may share a revision (a grouped write): the
                            // batch is skipped up to what was sent before it, not event by event.
                            let floor = last_rv;
                            for e in batch.iter() {
                                if e.rv <= floor {
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
}

pub(super) struct Watcher {
    res: Arc<Resource>,
    version: String,
    ns: String,
    labels: Labels,
    fields: Fields,
    as_table: bool,
}

impl Watcher {
    pub(super) fn matches(&self, o: &Obj) -> bool {
        (self.labels.is_empty() || self.labels.matches(o))
            && (self.fields.is_empty() || self.fields.matches(&o.value()))
    }

    /// The line of an event, as a selector sees it: an object that starts matching is ADDED,
    /// one that stops matching is DELETED.
    pub(super) fn line(&self, kind: EventType, o: &Obj, prev: Option<&Obj>) -> Option<Bytes> {
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
                std::iter::once(v),
                Include::Metadata,
                o.rv,
                None,
            );
            out.put_slice(&tb);
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

    pub(super) fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.res.kind, "apiVersion": self.res.api_version(&self.version),
            "metadata": meta});
        Bytes::from(format!("{{\"type\":\"BOOKMARK\",\"object\":{obj}}}\n"))
    }
}
