//! `kubectl logs` of a pod on an edge node: `GET /api/v1/namespaces/{ns}/pods/{name}/log`, a
//! subresource of the embedded API ([`apiserver::Subresource`], authorized as `get` on
//! `pods/log` as kube-apiserver does; a node's certificate is never allowed it). The query is
//! checked here, once, as kube-apiserver checks `PodLogOptions`, against the stored pod (its
//! containers, its node); the log is then read through the node's streaming tunnel
//! ([`crate::cloudhub::tunnel`]) and streamed to the client as the node sends it.

use super::{Refused, failure, off};
use crate::cloudhub::CloudHub;
use crate::cloudhub::tunnel::Event;
use api::tunnel::{LogRequest, Open};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long a node has to accept a stream.
const WAIT: Duration = Duration::from_secs(10);

/// The `pods/log` subresource, read through the hub's tunnels once it runs.
pub(crate) fn subresource(api: super::NodeApi) -> apiserver::Subresource {
    apiserver::Subresource {
        group: String::new(),
        plural: "pods".into(),
        name: "log".into(),
        verb: "get",
        methods: &[axum::http::Method::GET],
        serve: Arc::new(move |pod, request| {
            let hub = api.hub();
            Box::pin(async move {
                match hub {
                    Some(hub) => serve(&hub, &pod, &request.query, &request.user).await,
                    None => off(),
                }
            })
        }),
    }
}

/// A query value as Go's `strconv.ParseBool` reads it (kube-apiserver's conversion).
fn boolean(query: &HashMap<String, String>, key: &str) -> Result<bool, Refused> {
    parse_bool(key, query.get(key).map(String::as_str))
}

/// A query value `v` of `key` as Go's `strconv.ParseBool` reads it; absent or empty is false.
pub(crate) fn parse_bool(key: &str, v: Option<&str>) -> Result<bool, Refused> {
    match v {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(v) => Err(Refused::NotBool {
            key: key.to_string(),
            value: v.to_string(),
        }),
    }
}

/// The container a request names (`asked`), or the pod's only one, as kube-apiserver picks it:
/// a name not in the pod's spec (its init containers too, with `init`) or no name for a pod of
/// several is refused, naming the choices.
pub(crate) fn container_of(
    pod: &Value,
    asked: Option<&str>,
    init: bool,
) -> Result<String, Refused> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let kinds: &[&str] = if init {
        &["initContainers", "containers"]
    } else {
        &["containers"]
    };
    let containers: Vec<&str> = kinds
        .iter()
        .flat_map(|k| pod["spec"][k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    match asked.filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c) => Ok(c.to_string()),
        Some(c) => Err(Refused::NoSuchContainer {
            container: c.to_string(),
            pod: name.to_string(),
        }),
        None => match pod["spec"]["containers"].as_array().map(Vec::as_slice) {
            Some([one]) => Ok(one["name"].as_str().unwrap_or_default().to_string()),
            _ => Err(Refused::WhichContainer {
                pod: name.to_string(),
                choices: containers.join(" "),
            }),
        },
    }
}

/// A whole number of the query, at least `min`.
fn number(query: &HashMap<String, String>, key: &str, min: i64) -> Result<Option<i64>, Refused> {
    let Some(v) = query.get(key).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let n: i64 = v.parse().map_err(|_| Refused::NotNumber {
        key: key.to_string(),
        value: v.to_string(),
    })?;
    if n < min {
        return Err(Refused::Below {
            key: key.to_string(),
            min,
            n,
        });
    }
    Ok(Some(n))
}

/// The request to the node: the query checked against the stored pod, as kube-apiserver checks
/// `PodLogOptions` (one container named or defaulted, sinceSeconds or sinceTime, not both).
pub(crate) fn request(
    pod: &Value,
    query: &HashMap<String, String>,
    now_nanos: i64,
) -> Result<LogRequest, (StatusCode, String)> {
    let bad = |m: String| (StatusCode::BAD_REQUEST, m);
    let refused = |e: Refused| (StatusCode::BAD_REQUEST, e.to_string());
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let container =
        container_of(pod, query.get("container").map(String::as_str), true).map_err(refused)?;
    if let Some(s) = query.get("stream").filter(|s| !s.is_empty() && *s != "All") {
        return Err(bad(format!(
            "stream: {s:?} is not supported; only All (stdout and stderr together)"
        )));
    }
    let since_seconds = number(query, "sinceSeconds", 1).map_err(refused)?;
    let since_time = query.get("sinceTime").filter(|t| !t.is_empty());
    let since_nanos = match (since_seconds, since_time) {
        (Some(_), Some(_)) => {
            return Err(bad(
                "at most one of sinceTime or sinceSeconds may be specified".into(),
            ));
        }
        (Some(s), None) => Some(now_nanos.saturating_sub(s.saturating_mul(1_000_000_000))),
        (None, Some(t)) => {
            let at = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339)
                .map_err(|e| bad(format!("sinceTime: {t:?} is not an RFC 3339 time: {e}")))?;
            Some(i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX))
        }
        (None, None) => None,
    };
    let tail_lines = number(query, "tailLines", 0).map_err(refused)?;
    let limit_bytes = number(query, "limitBytes", 1).map_err(refused)?;
    Ok(LogRequest {
        namespace: ns.to_string(),
        pod: name.to_string(),
        uid: pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        container: Some(container),
        follow: boolean(query, "follow").map_err(refused)?,
        previous: boolean(query, "previous").map_err(refused)?,
        timestamps: boolean(query, "timestamps").map_err(refused)?,
        tail_lines: tail_lines.map(|n| n as u64),
        since_nanos,
        limit_bytes: limit_bytes.map(|n| n as u64),
    })
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

async fn serve(
    hub: &CloudHub,
    pod: &Value,
    query: &HashMap<String, String>,
    user: &str,
) -> Response {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let Some(node) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) else {
        return failure(
            StatusCode::BAD_REQUEST,
            format!("pod {name} is not scheduled to a node yet: it has no log"),
        );
    };
    let req = match request(pod, query, now_nanos()) {
        Ok(r) => r,
        Err((code, message)) => return failure(code, message),
    };
    let stream = match super::open_stream(hub, node, &Open::Log(req), user, WAIT).await {
        Ok(s) => s,
        Err(refused) => return *refused,
    };
    // The body as the node sends it; a stream cut before its end (the tunnel closed) ends with
    // a last line naming the pod, the node and why, then an error, so the client says so
    // instead of taking it as the whole log (kubectl alone says only "unexpected EOF").
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let what = format!("pod {namespace}/{name} on node {node}");
    let body = futures_util::stream::unfold(Reading::Open(stream, what), |r| async move {
        match r {
            Reading::Open(mut s, what) => loop {
                match s.next().await {
                    Event::Data(b) => {
                        return Some((Ok(axum::body::Bytes::from(b)), Reading::Open(s, what)));
                    }
                    Event::Ready => {}
                    Event::End(o) if o.code == 200 => return None,
                    Event::End(o) => {
                        tracing::info!(node = %s.node, code = o.code, message = %o.message, "a log stream ended early");
                        let line =
                            format!("\n[cloudcore] the log of {what} was cut: {}\n", o.message);
                        return Some((Ok(axum::body::Bytes::from(line)), Reading::Cut(o.message)));
                    }
                }
            },
            Reading::Cut(message) => {
                // The server writes out what it has while the body waits; an error at once
                // would close the connection with the last line still unsent.
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Some((Err(std::io::Error::other(message)), Reading::Done))
            }
            Reading::Done => None,
        }
    });
    (
        [("content-type", "text/plain")],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// Where a log's body is: streaming from the node, cut (its last line written, its error next),
/// or done.
enum Reading {
    Open(crate::cloudhub::tunnel::Stream, String),
    Cut(String),
    Done,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    pub(crate) fn pod(containers: &[&str]) -> Value {
        json!({"metadata": {"namespace": "default", "name": "m", "uid": "u1"},
               "spec": {"nodeName": "edge-1",
                        "containers": containers.iter().map(|c| json!({"name": c})).collect::<Vec<_>>()}})
    }

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|&(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn the_query_is_checked_as_kube_apiserver_checks_pod_log_options() {
        let r = request(
            &pod(&["main"]),
            &q(&[("follow", "true"), ("tailLines", "5")]),
            0,
        )
        .expect("ok");
        assert_eq!(r.container.as_deref(), Some("main"), "the only one");
        assert!(r.follow && !r.previous);
        assert_eq!((r.tail_lines, r.uid.as_str()), (Some(5), "u1"));
        let err =
            |p: &Value, query: &[(&str, &str)]| request(p, &q(query), 0).expect_err("refused").1;
        assert_eq!(
            err(&pod(&["a", "b"]), &[]),
            "a container name must be specified for pod m, choose one of: [a b]"
        );
        assert_eq!(
            err(&pod(&["a"]), &[("container", "x")]),
            "container x is not valid for pod m"
        );
        assert_eq!(
            err(&pod(&["a"]), &[("sinceSeconds", "0")]),
            "sinceSeconds: must be greater than or equal to 1, not 0"
        );
        assert!(
            err(
                &pod(&["a"]),
                &[("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:00Z")]
            )
            .contains("at most one")
        );
        assert!(err(&pod(&["a"]), &[("tailLines", "-1")]).contains("tailLines"));
        assert!(err(&pod(&["a"]), &[("tailLines", "ten")]).contains("not a whole number"));
        assert!(err(&pod(&["a"]), &[("follow", "yes")]).contains("follow"));
        assert!(err(&pod(&["a"]), &[("limitBytes", "0")]).contains("limitBytes"));
        assert!(err(&pod(&["a"]), &[("sinceTime", "yesterday")]).contains("RFC 3339"));
        assert!(err(&pod(&["a"]), &[("stream", "Stdout")]).contains("only All"));
        // sinceSeconds is an instant taken here, once.
        let r = request(&pod(&["a"]), &q(&[("sinceSeconds", "10")]), 100_000_000_000).expect("ok");
        assert_eq!(r.since_nanos, Some(90_000_000_000));
        let r = request(
            &pod(&["a"]),
            &q(&[("sinceTime", "1970-01-01T00:01:40+00:00")]),
            0,
        )
        .expect("ok");
        assert_eq!(r.since_nanos, Some(100_000_000_000));
    }
}
