//! One OPC UA device: a session to its server, batched Reads, typed Writes, and a subscription
//! for the properties that ask for one.
//!
//! The session is the mapper's to manage: async-opcua's own reconnect is off, so a lost
//! connection reaches the SDK as a link error, the SDK backs off, and [`Device::connect`] opens
//! a new session and creates the subscription again.

use crate::config::{Connection, Identity, Point};
use crate::value::{from_twin, to_twin};
use mapper_sdk::{Driver, DriverError, ReadValue, driver::Changes, driver::Reading};
use opcua::client::{
    Client, ClientBuilder, ClientEndpoint, DataChangeCallback, IdentityToken, Password, Session,
};
use opcua::crypto::CertificateStore;
use opcua::types::{
    AttributeId, DataChangeFilter, DataChangeTrigger, DataValue, EndpointDescription,
    ExtensionObject, MonitoredItemCreateRequest, MonitoringMode, MonitoringParameters, NodeId,
    QualifiedName, ReadValueId, StatusCode, TimestampsToReturn, UserTokenType, VariableId, Variant,
    VariantScalarTypeId, WriteValue,
};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

pub struct Device {
    id: String,
    conn: Connection,
    points: Vec<Point>,
    pki: PathBuf,
    client: Option<Client>,
    session: Option<Arc<Session>>,
    events: Option<tokio::task::JoinHandle<()>>,
    /// Cleared by the event task when the connection is lost.
    alive: Arc<AtomicBool>,
    /// Each point's node id with its namespace resolved, or why it cannot be.
    nodes: Vec<Result<NodeId, DriverError>>,
    /// Each point's value type and whether it is an array, as last read.
    types: Vec<Option<(VariantScalarTypeId, bool)>>,
    /// Points whose monitored item the server accepted.
    monitored: Vec<bool>,
    max_per_read: usize,
    changes: Changes,
    requests: u64,
}

/// Status codes that mean the connection, not the node, failed.
fn is_link(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BadNotConnected
            | StatusCode::BadConnectionClosed
            | StatusCode::BadTimeout
            | StatusCode::BadRequestTimeout
            | StatusCode::BadCommunicationError
            | StatusCode::BadSecureChannelClosed
            | StatusCode::BadSecureChannelIdInvalid
            | StatusCode::BadSessionClosed
            | StatusCode::BadSessionIdInvalid
            | StatusCode::BadSessionNotActivated
            | StatusCode::BadServerNotConnected
            | StatusCode::BadServerHalted
            | StatusCode::BadTcpInternalError
            | StatusCode::BadConnectionRejected
            | StatusCode::BadDisconnect
            | StatusCode::BadShutdown
    )
}

fn status_error(s: StatusCode, what: &str) -> DriverError {
    let m = format!("{what}: {s}");
    if is_link(s) {
        DriverError::link(m)
    } else {
        DriverError::device(m)
    }
}

/// A value as the twin's string, or the node's bad status.
fn reading(dv: &DataValue) -> Result<ReadValue, DriverError> {
    let status = dv.status.unwrap_or(StatusCode::Good);
    if status.is_bad() {
        return Err(status_error(status, "the server answered"));
    }
    match &dv.value {
        Some(v) => to_twin(v)
            .map(ReadValue::from)
            .map_err(|e| DriverError::device(e.to_string())),
        None => Err(DriverError::device("the server sent no value")),
    }
}

fn value_type(v: &Variant) -> Option<(VariantScalarTypeId, bool)> {
    match v {
        Variant::Array(a) => Some((a.value_type, true)),
        other => other.scalar_type_id().map(|t| (t, false)),
    }
}

impl Device {
    /// `pki` is where the application certificate and the trust list live.
    pub fn new(id: String, conn: Connection, points: Vec<Point>, pki: PathBuf) -> Self {
        let n = points.len();
        Self {
            id,
            conn,
            points,
            pki,
            client: None,
            session: None,
            events: None,
            alive: Arc::new(AtomicBool::new(false)),
            nodes: vec![Err(DriverError::config("not connected")); n],
            types: vec![None; n],
            monitored: vec![false; n],
            max_per_read: usize::MAX,
            changes: Changes::default(),
            requests: 0,
        }
    }

    fn client(&mut self) -> Result<&mut Client, DriverError> {
        if self.client.is_none() {
            let host = std::env::var("HOSTNAME")
                .ok()
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "localhost".into());
            let mut b = ClientBuilder::new()
                .application_name("mapper-opcua")
                .application_uri(format!("urn:{host}:kubeedge:mapper-opcua"))
                .product_uri("urn:kubeedge:mapper-opcua")
                .pki_dir(&self.pki)
                .create_sample_keypair(true)
                .trust_server_certs(false)
                .verify_server_certs(true)
                .session_retry_limit(0)
                .request_timeout(self.conn.timeout)
                .keep_alive_interval(self.conn.keep_alive)
                .max_failed_keep_alive_count(2)
                .session_name(format!("mapper-opcua {}", self.id))
                // The session goes to the endpoint the server offers (found at connect); this
                // entry only names the server, so that the client's config is not empty (it
                // logged "Endpoint config contains no endpoints" at every start).
                .endpoint("device", ClientEndpoint::new(self.conn.url.clone()))
                .default_endpoint("device");
            if let Some((cert, key)) = &self.conn.certificate {
                b = b
                    .create_sample_keypair(false)
                    .certificate_path(cert)
                    .private_key_path(key);
            }
            let client = b.client().map_err(|e| {
                DriverError::config(format!(
                    "cannot set up the OPC UA client (pki {}): {}",
                    self.pki.display(),
                    e.join("; ")
                ))
            })?;
            if let Some(path) = &self.conn.server_certificate {
                trust(&self.pki, path).map_err(|e| DriverError::config(e.to_string()))?;
            }
            self.client = Some(client);
        }
        self.client
            .as_mut()
            .ok_or_else(|| DriverError::config("no client"))
    }

    async fn close(&mut self) {
        self.alive.store(false, Ordering::Relaxed);
        if let Some(s) = self.session.take() {
            let _ = tokio::time::timeout(Duration::from_secs(1), s.disconnect()).await;
        }
        if let Some(t) = self.events.take() {
            t.abort();
        }
        self.monitored.iter_mut().for_each(|m| *m = false);
        // What the old session sent is stale.
        self.changes.clear();
    }

    /// Once connected: namespaces resolved, the server's read limit, the subscription.
    async fn setup(&mut self, session: &Arc<Session>) -> Result<(), DriverError> {
        for (i, p) in self.points.iter().enumerate() {
            self.nodes[i] = match &p.node.namespace_uri {
                None => Ok(p.node.id.clone()),
                Some(uri) => match session.get_namespace_index(uri).await {
                    Ok(ns) => {
                        let mut id = p.node.id.clone();
                        id.namespace = ns;
                        Ok(id)
                    }
                    Err(e) if is_link(e.status()) => {
                        return Err(DriverError::link(format!("reading the namespaces: {e}")));
                    }
                    Err(_) => Err(DriverError::config(format!(
                        "the server has no namespace {uri}"
                    ))),
                },
            };
        }
        self.max_per_read = if self.conn.max_nodes_per_read > 0 {
            self.conn.max_nodes_per_read
        } else {
            let limit: NodeId =
                VariableId::Server_ServerCapabilities_OperationLimits_MaxNodesPerRead.into();
            self.requests += 1;
            match session
                .read(
                    &[ReadValueId::from(limit)],
                    TimestampsToReturn::Neither,
                    0.0,
                )
                .await
            {
                Ok(v) => match v.first().and_then(|d| d.value.as_ref()) {
                    Some(Variant::UInt32(n)) if *n > 0 => *n as usize,
                    _ => usize::MAX,
                },
                Err(e) if is_link(e.status()) => {
                    return Err(DriverError::link(format!("reading MaxNodesPerRead: {e}")));
                }
                Err(_) => usize::MAX,
            }
        };
        self.subscribe(session).await
    }

    async fn subscribe(&mut self, session: &Arc<Session>) -> Result<(), DriverError> {
        let wanted: Vec<usize> = (0..self.points.len())
            .filter(|&i| self.points[i].subscribe.is_some() && self.nodes[i].is_ok())
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let fastest = wanted
            .iter()
            .filter_map(|&i| self.points[i].subscribe.as_ref().map(|s| s.interval))
            .min()
            .unwrap_or(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        let tx = self.changes.sender();
        let callback = DataChangeCallback::new(move |dv, item| {
            let i = item.client_handle().saturating_sub(1) as usize;
            let _ = tx.send((i, reading(&dv)));
        });
        self.requests += 1;
        let sub = session
            .create_subscription(fastest, 60, 10, 0, 0, true, callback)
            .await
            .map_err(|e| status_error(e.status(), "creating the subscription"))?;
        let items: Vec<MonitoredItemCreateRequest> = wanted
            .iter()
            .filter_map(|&i| {
                let s = self.points[i].subscribe.as_ref()?;
                let node = self.nodes[i].as_ref().ok()?.clone();
                let filter = match s.deadband {
                    Some((kind, value)) => ExtensionObject::from_message(DataChangeFilter {
                        trigger: DataChangeTrigger::StatusValue,
                        deadband_type: kind,
                        deadband_value: value,
                    }),
                    None => ExtensionObject::null(),
                };
                Some(MonitoredItemCreateRequest {
                    item_to_monitor: ReadValueId {
                        node_id: node,
                        attribute_id: AttributeId::Value as u32,
                        index_range: self.points[i].index_range.clone().unwrap_or_default(),
                        data_encoding: QualifiedName::null(),
                    },
                    monitoring_mode: MonitoringMode::Reporting,
                    requested_parameters: MonitoringParameters {
                        client_handle: i as u32 + 1,
                        sampling_interval: s.interval.as_secs_f64() * 1000.0,
                        filter,
                        queue_size: s.queue_size,
                        discard_oldest: true,
                    },
                })
            })
            .collect();
        self.requests += 1;
        let created = session
            .create_monitored_items(sub, TimestampsToReturn::Both, items)
            .await
            .map_err(|e| status_error(e.status(), "creating the monitored items"))?;
        for (&i, r) in wanted.iter().zip(created.iter()) {
            let status = r.result.status_code;
            if status.is_good() {
                self.monitored[i] = true;
            } else {
                // Polled instead, so the property shows the server's reason every cycle.
                tracing::warn!(device = %self.id, node = %self.points[i].node.id, status = %status, "monitored item refused; polling it");
            }
        }
        Ok(())
    }

    fn session(&self) -> Result<Arc<Session>, DriverError> {
        match &self.session {
            Some(s) if self.alive.load(Ordering::Relaxed) => Ok(s.clone()),
            _ => Err(DriverError::link("the OPC UA session is down")),
        }
    }

    fn read_id(&self, i: usize) -> Result<ReadValueId, DriverError> {
        let node = self.nodes[i].clone()?;
        Ok(ReadValueId {
            node_id: node,
            attribute_id: AttributeId::Value as u32,
            index_range: self.points[i].index_range.clone().unwrap_or_default(),
            data_encoding: QualifiedName::null(),
        })
    }
}

/// The identity for `endpoint`, checked against the token types it accepts.
fn identity(i: &Identity, endpoint: &EndpointDescription) -> Result<IdentityToken, DriverError> {
    let wanted = match i {
        Identity::Anonymous => UserTokenType::Anonymous,
        Identity::User { .. } => UserTokenType::UserName,
        Identity::Certificate { .. } => UserTokenType::Certificate,
    };
    let accepted: Vec<UserTokenType> = endpoint
        .user_identity_tokens
        .iter()
        .flatten()
        .map(|t| t.token_type)
        .collect();
    if !accepted.is_empty() && !accepted.contains(&wanted) {
        return Err(DriverError::config(format!(
            "the endpoint does not accept {wanted:?} identities; it accepts {accepted:?} (set userName/password or identityCertificate)"
        )));
    }
    Ok(match i {
        Identity::Anonymous => IdentityToken::Anonymous,
        Identity::User { name, password } => {
            IdentityToken::UserName(name.clone(), Password(password.clone()))
        }
        Identity::Certificate { cert, key } => {
            IdentityToken::new_x509_path(cert, key).map_err(|e| {
                DriverError::config(format!("identityCertificate {}: {e}", cert.display()))
            })?
        }
    })
}

/// Why the session could not be opened, with what to do about a certificate.
fn connect_error(url: &str, code: StatusCode, pki: &std::path::Path) -> DriverError {
    let hint = match code {
        StatusCode::BadCertificateUntrusted
        | StatusCode::BadSecurityChecksFailed
        | StatusCode::BadCertificateInvalid => format!(
            ": the server's certificate is not trusted; it was saved in {}; move it to {} or give serverCertificate",
            pki.join("rejected").display(),
            pki.join("trusted").display()
        ),
        StatusCode::BadUserAccessDenied
        | StatusCode::BadIdentityTokenRejected
        | StatusCode::BadIdentityTokenInvalid => {
            ": the server refused the identity (userName/password or identityCertificate)".into()
        }
        _ => String::new(),
    };
    let m = format!("{url}: cannot open a session: {code}{hint}");
    if hint.is_empty() && is_link(code) {
        DriverError::link(m)
    } else {
        DriverError::config(m)
    }
}

/// Adds the certificate at `path` (DER or PEM) to the trust list in `pki`.
/// A server certificate that cannot be trusted.
#[derive(Debug, thiserror::Error)]
enum TrustError {
    #[error("serverCertificate {}: {message}", path.display())]
    Certificate {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

fn trust(pki: &std::path::Path, path: &std::path::Path) -> Result<(), TrustError> {
    let unreadable = |e: &dyn std::fmt::Display| TrustError::Certificate {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let cert = CertificateStore::read_cert(path).map_err(|e| unreadable(&e))?;
    let dir = pki.join("trusted");
    std::fs::create_dir_all(&dir).map_err(|source| TrustError::Io {
        path: dir.clone(),
        source,
    })?;
    let der = cert.to_der().map_err(|e| unreadable(&e))?;
    let name = CertificateStore::cert_file_name(&cert);
    let file = dir.join(&name);
    std::fs::write(&file, der).map_err(|source| TrustError::Io {
        path: file.clone(),
        source,
    })?;
    // A copy left in rejected/ by an earlier attempt would still make it untrusted.
    let _ = std::fs::remove_file(pki.join("rejected").join(&name));
    Ok(())
}

impl Driver for Device {
    async fn connect(&mut self) -> Result<(), DriverError> {
        self.close().await;
        let conn = self.conn.clone();
        let url = conn.url.clone();
        let timeout = conn.timeout;
        let pki = self.pki.clone();
        let client = self.client()?;
        let endpoints = tokio::time::timeout(timeout, client.get_server_endpoints_from_url(&url))
            .await
            .map_err(|_| DriverError::link(format!("{url}: no answer in {timeout:?}")))?
            .map_err(|e| DriverError::link(format!("{url}: cannot get endpoints: {e}")))?;
        let endpoint = Client::find_matching_endpoint(&endpoints, &url, conn.policy, conn.mode)
            .ok_or_else(|| {
                let offered: Vec<String> = endpoints
                    .iter()
                    .map(|e| {
                        let p = e.security_policy_uri.as_ref();
                        format!("{}/{:?}", p.rsplit('#').next().unwrap_or(p), e.security_mode)
                    })
                    .collect();
                DriverError::config(format!(
                    "{url} offers no endpoint with securityPolicy {} and securityMode {:?}; it offers {}",
                    conn.policy.to_str(),
                    conn.mode,
                    offered.join(", ")
                ))
            })?;
        let identity = identity(&conn.identity, &endpoint)?;
        let (session, event_loop) = client
            .connect_to_endpoint_directly(endpoint, identity)
            .map_err(|e| DriverError::config(format!("{url}: {e}")))?;

        // The event loop: reports the first connection, then a loss, then ends (reconnecting
        // is the SDK's).
        let (first_tx, first_rx) = oneshot::channel::<Result<(), StatusCode>>();
        let alive = Arc::new(AtomicBool::new(false));
        let task_alive = alive.clone();
        let lost_tx = self.changes.sender();
        let any = !self.points.is_empty();
        let id = self.id.clone();
        let events = tokio::spawn(async move {
            use futures_util::StreamExt;
            use opcua::client::SessionPollResult as P;
            let stream = event_loop.enter();
            futures_util::pin_mut!(stream);
            let mut first = Some(first_tx);
            while let Some(r) = stream.next().await {
                match r {
                    Ok(P::Reconnected(_)) => {
                        task_alive.store(true, Ordering::Relaxed);
                        if let Some(f) = first.take() {
                            let _ = f.send(Ok(()));
                        }
                    }
                    Ok(P::ConnectionLost(code)) => {
                        task_alive.store(false, Ordering::Relaxed);
                        tracing::warn!(device = %id, status = %code, "OPC UA connection lost");
                        break;
                    }
                    Ok(P::ReconnectFailed(code)) | Err(code) => {
                        task_alive.store(false, Ordering::Relaxed);
                        if let Some(f) = first.take() {
                            let _ = f.send(Err(code));
                        }
                        break;
                    }
                    Ok(_) => {}
                }
            }
            task_alive.store(false, Ordering::Relaxed);
            if first.is_none() && any {
                // Lost after it was up: the SDK hears of it at once, not at the next poll
                // (which may never come when every property is subscribed).
                let _ = lost_tx.send((0, Err(DriverError::link("the OPC UA session was lost"))));
            }
        });
        self.events = Some(events);
        self.alive = alive;
        let first = tokio::time::timeout(timeout * 2, first_rx).await;
        match first {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(code))) => return Err(connect_error(&url, code, &pki)),
            Ok(Err(_)) => return Err(DriverError::link(format!("{url}: the session ended"))),
            Err(_) => {
                self.close().await;
                return Err(DriverError::link(format!(
                    "{url}: no session in {:?}",
                    timeout * 2
                )));
            }
        }
        self.session = Some(session.clone());
        self.setup(&session).await
    }

    /// Reads `due` in as few Read calls as the server's `MaxNodesPerRead` allows.
    async fn read(&mut self, due: &[usize]) -> Vec<Reading> {
        let session = match self.session() {
            Ok(s) => s,
            Err(e) => return due.iter().map(|&i| (i, Err(e.clone()))).collect(),
        };
        let mut out = Vec::with_capacity(due.len());
        let mut asked = Vec::with_capacity(due.len());
        let mut ids = Vec::with_capacity(due.len());
        for &i in due {
            match self.read_id(i) {
                Ok(r) => {
                    asked.push(i);
                    ids.push(r);
                }
                Err(e) => out.push((i, Err(e))),
            }
        }
        let per_call = self.max_per_read.max(1);
        for (idx, chunk) in asked.chunks(per_call).zip(ids.chunks(per_call)) {
            self.requests += 1;
            match session.read(chunk, TimestampsToReturn::Neither, 0.0).await {
                Ok(values) if values.len() == chunk.len() => {
                    for (&i, dv) in idx.iter().zip(values.iter()) {
                        let r = reading(dv);
                        if r.is_ok()
                            && let Some(v) = &dv.value
                        {
                            self.types[i] = value_type(v);
                        }
                        out.push((i, r));
                    }
                }
                Ok(values) => {
                    let e = DriverError::device(format!(
                        "the server answered {} values for {} nodes",
                        values.len(),
                        chunk.len()
                    ));
                    out.extend(idx.iter().map(|&i| (i, Err(e.clone()))));
                }
                Err(e) => {
                    let e = status_error(e.status(), "Read");
                    out.extend(idx.iter().map(|&i| (i, Err(e.clone()))));
                }
            }
        }
        out
    }

    /// Writes `value` as the node's type: `dataType` when given, else the type its value had.
    async fn write(&mut self, i: usize, value: &str) -> Result<(), DriverError> {
        let session = self.session()?;
        let id = self.read_id(i)?;
        let (t, array) = match (self.points[i].data_type, self.types[i]) {
            (Some(t), learnt) => (t, learnt.is_some_and(|(_, a)| a)),
            (None, Some(learnt)) => learnt,
            (None, None) => {
                // Read once to learn the type.
                let r = self.read(&[i]).await;
                if let Some((_, Err(e))) = r.into_iter().next() {
                    return Err(e);
                }
                self.types[i].ok_or_else(|| {
                    DriverError::config("the node's type is unknown: give dataType")
                })?
            }
        };
        let variant = from_twin(value, t, array).map_err(|e| DriverError::config(e.to_string()))?;
        let write = WriteValue {
            node_id: id.node_id,
            attribute_id: AttributeId::Value as u32,
            index_range: id.index_range,
            value: DataValue {
                value: Some(variant),
                ..DataValue::null()
            },
        };
        self.requests += 1;
        let status = session
            .write(&[write])
            .await
            .map_err(|e| status_error(e.status(), "Write"))?;
        match status.first() {
            Some(s) if s.is_good() => Ok(()),
            Some(s) if is_link(*s) => Err(status_error(*s, "Write")),
            // Refused for this value (type, range, access): not tried again until it changes.
            Some(s) => Err(DriverError::config(format!(
                "the server refused the write: {}",
                s
            ))),
            None => Err(DriverError::device("the server answered no write result")),
        }
    }

    async fn stop(&mut self) {
        self.close().await;
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    async fn changes(&mut self) -> Vec<Reading> {
        self.changes.next_batch().await
    }

    fn subscribed(&self, i: usize) -> bool {
        self.monitored.get(i).copied().unwrap_or(false) && self.alive.load(Ordering::Relaxed)
    }
}
