//! A small etcd v3 client on the gRPC code generated from `proto/etcd/v3.proto`: the calls the
//! etcd store makes, over several members' addresses. A call that cannot reach a member (refused,
//! reset, or no answer within [`CALL_TIMEOUT`]) goes to the next one, so a stopped member costs a
//! reconnect, not an error.
//!
//! Why not the `etcd-client` crate: it compiles etcd's protobuf files with a system `protoc` at
//! build time, and a fresh clone of this project builds with no `protoc` (its protobuf is
//! compiled by the pure-Rust `protox`, as the DMI's is).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tonic::transport::{Channel, Endpoint};

#[allow(clippy::all, unreachable_pub)]
pub(crate) mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::kv_client::KvClient;
use pb::watch_client::WatchClient;

/// The longest a call waits for the members, in all.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a call waits before asking again when no member could take it (an election).
const NO_LEADER_RETRY: Duration = Duration::from_millis(100);
/// The longest one member is given: a request a follower took just before its leader died is
/// held by it (etcd checks for a leader when a request arrives, not after), and is asked again
/// elsewhere after this, rather than after the whole [`CALL_TIMEOUT`].
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);

/// `message` with etcd's require-leader metadata (`rpctypes.MetadataRequireLeaderKey`).
fn leader_required<T>(message: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut().insert(
        "hasleader",
        tonic::metadata::MetadataValue::from_static("true"),
    );
    r
}

/// Clients of the members, and the one in use.
pub(crate) struct Etcd {
    members: Vec<(String, Channel)>,
    current: AtomicUsize,
}

/// What a failed call says: its member and gRPC status.
#[derive(Debug, Clone, thiserror::Error)]
#[error("etcd at {member}: {} ({:?})", status.message(), status.code())]
pub(crate) struct EtcdError {
    pub member: String,
    pub status: tonic::Status,
}

impl Etcd {
    /// Clients of `endpoints` (`http://host:2379`, `https://host:2379` with `tls`, or
    /// `host:2379`), connected when first used.
    pub(crate) fn new(
        endpoints: &[String],
        tls: Option<&super::EtcdTls>,
    ) -> Result<Self, super::OpenError> {
        use super::OpenError;
        let bad = |endpoint: &str, why: String| OpenError::Endpoint {
            endpoint: endpoint.to_string(),
            why,
        };
        if endpoints.is_empty() {
            return Err(OpenError::NoEndpoints);
        }
        let mut members = Vec::new();
        for e in endpoints {
            let url = if e.contains("://") {
                e.clone()
            } else if tls.is_some() {
                format!("https://{e}")
            } else {
                format!("http://{e}")
            };
            let mut ep = Endpoint::from_shared(url.clone())
                .map_err(|err| bad(e, format!("not a URL: {err}")))?
                .connect_timeout(Duration::from_secs(2))
                .tcp_nodelay(true)
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_timeout(Duration::from_secs(5))
                .keep_alive_while_idle(true);
            match (url.starts_with("https://"), tls) {
                (true, Some(t)) => {
                    let mut c = tonic::transport::ClientTlsConfig::new()
                        .ca_certificate(tonic::transport::Certificate::from_pem(&t.ca));
                    if let (Some(cert), Some(key)) = (&t.cert, &t.key) {
                        c = c.identity(tonic::transport::Identity::from_pem(cert, key));
                    }
                    ep = ep.tls_config(c).map_err(|err| bad(e, err.to_string()))?;
                }
                (true, None) => {
                    return Err(bad(
                        e,
                        "https: give the CA that signed etcd's certificate (etcd.caFile)".into(),
                    ));
                }
                (false, Some(_)) => {
                    return Err(bad(
                        e,
                        "plain http but TLS is configured: use https://".into(),
                    ));
                }
                (false, None) => {}
            }
            members.push((url, ep.connect_lazy()));
        }
        Ok(Self {
            members,
            current: AtomicUsize::new(0),
        })
    }

    /// Runs `call` on the member in use, then on each other member while the failure says the
    /// member could not be reached or has no leader; when none could, again every
    /// [`NO_LEADER_RETRY`] until [`CALL_TIMEOUT`] has passed. Every request carries etcd's
    /// require-leader metadata (`hasleader: true`): a member that lost its leader refuses at
    /// once ("etcdserver: no leader") instead of holding the request until its own timeout,
    /// so a write after a leader's death waits for the election, not for a timeout.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_noting(call, &mut false).await
    }

    /// [`Etcd::call`], setting `unsure` when an attempt ended without an answer (no answer in
    /// time, a broken connection): a write asked again may have been made by that attempt.
    async fn call_noting<T, F, Fut>(&self, call: F, unsure: &mut bool) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
        loop {
            match self.call_members(&call, deadline, unsure).await {
                Err(e)
                    if unreachable(&e.status)
                        && tokio::time::Instant::now() + NO_LEADER_RETRY < deadline =>
                {
                    tokio::time::sleep(NO_LEADER_RETRY).await;
                }
                r => return r,
            }
        }
    }

    /// One round of [`Etcd::call`] over the members, each given until `deadline`.
    async fn call_members<T, F, Fut>(
        &self,
        call: &F,
        deadline: tokio::time::Instant,
        unsure: &mut bool,
    ) -> Result<T, EtcdError>
    where
        F: Fn(Channel) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let start = self.current.load(Ordering::Relaxed);
        let n = self.members.len();
        let mut last = None;
        for i in 0..n {
            let at = (start + i) % n;
            let (url, ch) = &self.members[at];
            let until = deadline.min(tokio::time::Instant::now() + ATTEMPT_TIMEOUT);
            let status = match tokio::time::timeout_at(until, call(ch.clone())).await {
                Ok(Ok(r)) => {
                    if i > 0 {
                        self.current.store(at, Ordering::Relaxed);
                        tracing::info!(member = %url, "etcd: using this member");
                    }
                    return Ok(r.into_inner());
                }
                Ok(Err(s)) => s,
                Err(_) => {
                    tonic::Status::deadline_exceeded(format!("no answer within {CALL_TIMEOUT:?}"))
                }
            };
            let retry = unreachable(&status);
            // Refused at the door (no connection, no leader): nothing was done. Anything else
            // may have been.
            if !(status.message().contains("no leader") || status.message().contains("connect")) {
                *unsure |= matches!(
                    status.code(),
                    tonic::Code::DeadlineExceeded | tonic::Code::Unknown | tonic::Code::Cancelled
                ) || status.code() == tonic::Code::Unavailable;
            }
            // What a member that answered said ("no leader") is said over what one that could
            // not be reached did.
            let said = |e: &EtcdError| e.status.message().contains("no leader");
            if !last.as_ref().is_some_and(said) || !retry {
                last = Some(EtcdError {
                    member: url.clone(),
                    status,
                });
            }
            if !retry {
                break;
            }
        }
        Err(last.unwrap_or_else(|| EtcdError {
            member: String::new(),
            status: tonic::Status::unavailable("no etcd member"),
        }))
    }

    pub(crate) async fn range(
        &self,
        req: pb::RangeRequest,
    ) -> Result<pb::RangeResponse, EtcdError> {
        self.call(|ch| {
            let req = req.clone();
            async move {
                KvClient::new(ch)
                    .max_decoding_message_size(64 << 20)
                    .range(leader_required(req))
                    .await
            }
        })
        .await
    }

    pub(crate) async fn txn(&self, req: pb::TxnRequest) -> Result<pb::TxnResponse, EtcdError> {
        self.txn_noting(req, &mut false).await
    }

    /// [`Etcd::txn`], setting `unsure` when it was asked again after an attempt whose outcome is
    /// not known (the transaction may then have been applied by it).
    pub(crate) async fn txn_noting(
        &self,
        req: pb::TxnRequest,
        unsure: &mut bool,
    ) -> Result<pb::TxnResponse, EtcdError> {
        self.call_noting(
            |ch| {
                let req = req.clone();
                async move {
                    KvClient::new(ch)
                        .max_decoding_message_size(64 << 20)
                        .txn(leader_required(req))
                        .await
                }
            },
            unsure,
        )
        .await
    }

    pub(crate) async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        self.call(|ch| async move {
            KvClient::new(ch)
                .compact(leader_required(pb::CompactionRequest {
                    revision,
                    physical: false,
                }))
                .await
        })
        .await
        .map(|_| ())
    }

    /// A watch: the sender of further requests (kept open while the watch is) and the stream of
    /// its responses.
    pub(crate) async fn watch(
        &self,
        create: pb::WatchCreateRequest,
    ) -> Result<
        (
            mpsc::Sender<pb::WatchRequest>,
            tonic::Streaming<pb::WatchResponse>,
        ),
        EtcdError,
    > {
        let first = pb::WatchRequest {
            request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)),
        };
        self.call(|ch| {
            let (tx, rx) = mpsc::channel(4);
            // The first request is in the channel before the call: etcd answers once it has it.
            let _ = tx.try_send(first.clone());
            let requests = tokio_stream::wrappers::ReceiverStream::new(rx);
            async move {
                let mut client = WatchClient::new(ch).max_decoding_message_size(64 << 20);
                client
                    .watch(leader_required(requests))
                    .await
                    .map(|r| r.map(|stream| (tx, stream)))
            }
        })
        .await
    }

    /// Moves to the next member (after a watch on the current one broke).
    pub(crate) fn next_member(&self) {
        let n = self.members.len();
        let _ = self
            .current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| Some((c + 1) % n));
    }
}

/// The failures that say a member could not be reached (another may answer).
fn unreachable(s: &tonic::Status) -> bool {
    use tonic::Code;
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Unknown | Code::Cancelled
    ) || s.message().contains("no leader")
}

/// The end of the key range that holds every key starting with `prefix` (etcd's "prefix"
/// range: the prefix with its last byte plus one).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_range_ends_after_every_key_of_the_prefix() {
        assert_eq!(prefix_end(b"/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}

#[cfg(test)]
mod endpoint_tests {
    use super::*;
    use crate::store::{EtcdTls, OpenError};

    #[tokio::test]
    async fn endpoints_that_cannot_work_are_refused_by_name() {
        assert!(matches!(Etcd::new(&[], None), Err(OpenError::NoEndpoints)));
        let https = Etcd::new(&["https://127.0.0.1:2379".into()], None)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            https.contains("https://127.0.0.1:2379") && https.contains("etcd.caFile"),
            "{https}"
        );
        let tls = EtcdTls {
            ca: String::new(),
            cert: None,
            key: None,
        };
        let plain = Etcd::new(&["http://127.0.0.1:2379".into()], Some(&tls))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(plain.contains("use https://"), "{plain}");
        assert!(
            Etcd::new(&["127.0.0.1:2379".into()], None).is_ok(),
            "a bare host:port is http"
        );
    }
}
