//! get and list, with continue tokens and tables.

use super::*;
use crate::status::Status;
use crate::store::Obj;
use crate::table::{self, Include};
use axum::http::StatusCode;
use axum::response::Response;
use base64::Engine;
use bytes::{BufMut, BytesMut};
use serde_json::{Value, json};
use std::sync::Arc;

impl Api {
    pub(super) fn get(&self, t: &Target, accept: &str) -> Result<Response, Status> {
        let name = t.name.clone().unwrap_or_default();
        let obj = {
            let tables = self.store.read();
            tables.get(&key(t, &name)).cloned()
        }
        .ok_or_else(|| Status::not_found(&t.res.group, &t.res.plural, &name))?;
        let v = outward(obj.value(), &t.res, &t.version);
        if table::wants_table(accept) {
            let rv = obj.rv;
            let tb = table::table(
                &t.res,
                &t.version,
                std::iter::once(v),
                Include::Metadata,
                rv,
                None,
            );
            return Ok(typed_table(tb));
        }
        Ok(json_response(StatusCode::OK, &v))
    }

    pub(super) async fn list(
        &self,
        t: &Target,
        q: &Query,
        accept: &str,
        labels: &Labels,
        fields: &Fields,
    ) -> Result<Response, Status> {
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
        // Items the earlier pages of this list gave.
        let before = start.as_ref().map_or(0, |s| s.2);
        let start = start.map(|(ns, name, _)| (ns, name));
        let (rv, items, cont, remaining) = {
            let tables = self.store.read();
            let rv = tables.rv;
            let mut items: Vec<Arc<Obj>> = Vec::new();
            let mut cont = None;
            let mut remaining = None;
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
                        // There is more: the next page starts after the last item of this
                        // one. A page costs what it holds: the rest is not walked to be counted.
                        if let Some((ns, name)) = last {
                            cont = Some(encode_continue(rv, ns, name, before + items.len()));
                        }
                        break;
                    }
                    last = Some(k);
                    items.push(o.clone());
                }
                // How many remain, when it costs nothing to know (every object of the kind,
                // unfiltered: the map's size less what the pages gave), as kube-apiserver
                // gives it only when it can count cheaply; else left out.
                if cont.is_some() && t.ns.is_empty() && labels.is_empty() && fields.is_empty() {
                    remaining = Some(map.len().saturating_sub(before + items.len()));
                }
            }
            (rv, items, cont, remaining)
        };
        let page = Page {
            res: t.res.clone(),
            version: t.version.clone(),
            table: table::wants_table(accept)
                .then(|| Include::parse(q.get("includeObject").map(String::as_str))),
            rv,
            items,
            cont,
            remaining,
        };
        // A large list (a fleet's 100,000 Devices: seconds of CPU to encode) is encoded on a
        // thread for blocking work, not on one of the runtime's few workers, whose other tasks
        // (nodes' sessions, watches) would wait for it.
        if page.items.len() < ENCODE_APART_FROM {
            return Ok(page.encode());
        }
        tokio::task::spawn_blocking(move || page.encode())
            .await
            .map_err(|e| Status::internal(format!("the list could not be encoded: {e}")))
    }
}

/// Lists of at least this many objects are encoded apart from the runtime's workers.
const ENCODE_APART_FROM: usize = 2_000;

/// A list's objects as taken from the view, to be encoded.
struct Page {
    res: Arc<crate::resources::Resource>,
    version: String,
    /// As a Table (`Accept: ...;as=Table`), with what each row includes.
    table: Option<Include>,
    rv: u64,
    items: Vec<Arc<Obj>>,
    cont: Option<String>,
    remaining: Option<usize>,
}

impl Page {
    fn encode(self) -> Response {
        let Page {
            res,
            version,
            table,
            rv,
            items,
            cont,
            remaining,
        } = self;
        if let Some(include) = table {
            let values = items.iter().map(|o| outward(o.value(), &res, &version));
            let tb = table::table(&res, &version, values, include, rv, cont.as_deref());
            return typed_table(tb);
        }
        let api_version = res.api_version(&version);
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if let Some(c) = &cont {
            meta["continue"] = json!(c);
            if let Some(n) = remaining {
                meta["remainingItemCount"] = json!(n);
            }
        }
        let mut out =
            BytesMut::with_capacity(64 + items.iter().map(|o| o.json_len() + 1).sum::<usize>());
        out.put_slice(
            format!(
                "{{\"kind\":\"{}\",\"apiVersion\":\"{api_version}\",\"metadata\":{meta},\"items\":[",
                res.list_kind
            )
            .as_bytes(),
        );
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                out.put_u8(b',');
            }
            put_object(&mut out, o, &res, &version, &api_version);
        }
        out.put_slice(b"]}");
        raw_json(StatusCode::OK, out.freeze())
    }
}

/// A list's continue token: where the next page starts (after `ns/name`) and how many items
/// the pages so far gave (`n`, for the count of those that remain).
pub(super) fn encode_continue(rv: u64, ns: &str, name: &str, given: usize) -> String {
    let v = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}"), "n": given});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

/// A continue token read back: the key the next page starts after, and the items given so far
/// (0 for a token without `n`).
pub(super) fn decode_continue(c: &str) -> Result<(String, String, usize), Status> {
    let bad = || Status::bad_request(format!("continue key is not valid: {c:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(c)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let start = v["start"].as_str().ok_or_else(bad)?;
    let (ns, name) = start.split_once('/').ok_or_else(bad)?;
    let given = v["n"].as_u64().unwrap_or(0) as usize;
    Ok((ns.to_string(), name.to_string(), given))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_token_gives_back_where_the_list_stopped() {
        let token = encode_continue(42, "plant", "oven-1", 500);
        let (ns, name, given) = decode_continue(&token).expect("our own token");
        assert_eq!(
            (ns.as_str(), name.as_str(), given),
            ("plant", "oven-1", 500)
        );
    }

    #[test]
    fn a_forged_continue_token_is_a_400_that_quotes_it() {
        for bad in [
            "not base64!",
            "e30", // {}
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r#"{"start":"noslash"}"#),
        ] {
            let e = decode_continue(bad).expect_err("refused");
            assert_eq!(e.code, 400, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
    }
}
