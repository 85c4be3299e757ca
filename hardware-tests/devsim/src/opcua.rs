//! OPC UA devices (`mapper-opcua`): each server URL of the manifests served by an async-opcua
//! server with a variable at every property's `nodeID`, of its `dataType` (or the model's
//! type), writable when the model says so. `ns=N` ids are in the N-th namespace of the server
//! (devsim registers `urn:devsim:nsN` for each index used), `nsu=URI` ids in the namespace
//! `URI`. The scenario's values are put into the address space every tick (subscribers are
//! told), and a value the mapper writes is taken from it.
//!
//! Faults: `noAnswer` and `reboot` stop the server for their seconds (connections dropped, the
//! port closed), `disconnect` restarts it (every session dropped); the others are Modbus's.

use crate::device::{SimDevice, SimPoint, Visit};
use mapper_opcua::config::Point;
use mapper_opcua::value::{from_twin, to_twin};
use opcua::crypto::SecurityPolicy;
use opcua::nodes::{AccessLevel, VariableBuilder};
use opcua::server::node_manager::memory::{SimpleNodeManager, simple_node_manager};
use opcua::server::{ANONYMOUS_USER_TOKEN_ID, ServerBuilder, diagnostics::NamespaceMetadata};
use opcua::types::{
    DataTypeId, DataValue, MessageSecurityMode, NodeId, ObjectId, Variant, VariantScalarTypeId,
};
use sim::modbus_sim::Sim;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

/// The variant type of a property: its visitor's `dataType`, else the model's type.
pub fn scalar_type(
    p: &Point,
    model_type: Option<api::v1beta1::PropertyType>,
) -> VariantScalarTypeId {
    use api::v1beta1::PropertyType as T;
    p.data_type.unwrap_or(match model_type {
        Some(T::Int) => VariantScalarTypeId::Int64,
        Some(T::Float) => VariantScalarTypeId::Float,
        Some(T::Double) => VariantScalarTypeId::Double,
        Some(T::Boolean) => VariantScalarTypeId::Boolean,
        _ => VariantScalarTypeId::String,
    })
}

fn data_type_id(t: VariantScalarTypeId) -> DataTypeId {
    use VariantScalarTypeId as V;
    match t {
        V::Boolean => DataTypeId::Boolean,
        V::SByte => DataTypeId::SByte,
        V::Byte => DataTypeId::Byte,
        V::Int16 => DataTypeId::Int16,
        V::UInt16 => DataTypeId::UInt16,
        V::Int32 => DataTypeId::Int32,
        V::UInt32 => DataTypeId::UInt32,
        V::Int64 => DataTypeId::Int64,
        V::UInt64 => DataTypeId::UInt64,
        V::Float => DataTypeId::Float,
        V::Double => DataTypeId::Double,
        V::DateTime => DataTypeId::DateTime,
        _ => DataTypeId::String,
    }
}

/// `value` as `p` holds it (as the mapper reads it back), or why it cannot be.
pub fn check(p: &Point, t: VariantScalarTypeId, value: &str) -> Result<String, String> {
    let _ = p;
    let v = from_twin(value, t, false).map_err(|e| e.to_string())?;
    to_twin(&v).map_err(|e| e.to_string())
}

/// What a property holds at the start.
pub fn initial(t: VariantScalarTypeId) -> String {
    match t {
        VariantScalarTypeId::Boolean => "false".into(),
        VariantScalarTypeId::String => String::new(),
        VariantScalarTypeId::DateTime => "2026-01-01T00:00:00Z".into(),
        _ => "0".into(),
    }
}

/// The host and port of an `opc.tcp://host:port/path` URL.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("opc.tcp://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':').unwrap_or((authority, "4840"));
    Some((
        host.trim_matches(['[', ']']).to_string(),
        port.parse().ok()?,
    ))
}

/// One property on a server: its node, type and simulator.
struct Served {
    name: String,
    node: NodeId,
    t: VariantScalarTypeId,
    sim: Sim,
    /// What the address space was last given (or last seen holding).
    last: Option<String>,
}

/// The devices of one server.
pub struct Server {
    pub devices: Vec<(SimDevice, Sim)>,
    pub pki: std::path::PathBuf,
}

/// Why a server cannot be built.
fn namespaces(devices: &[(SimDevice, Sim)]) -> Result<(u16, BTreeSet<String>), String> {
    let mut max_ns = 1u16;
    let mut uris = BTreeSet::new();
    for (d, _) in devices {
        for p in &d.points {
            let Visit::OpcUa(op, _) = &p.point else {
                continue;
            };
            match &op.node.namespace_uri {
                Some(u) => {
                    uris.insert(u.clone());
                }
                None if op.node.id.namespace < 2 => {
                    return Err(format!(
                        "{}: property {}: devsim serves nodes in namespaces 2 and up (or nsu=), not ns={}",
                        d.id, p.name, op.node.id.namespace
                    ));
                }
                None => max_ns = max_ns.max(op.node.id.namespace),
            }
        }
    }
    Ok((max_ns, uris))
}

/// The nodes being served, each with its node manager.
type Nodes = Vec<(Arc<SimpleNodeManager>, Served)>;

/// Builds the server for `port`: every property's node holding its simulator's value.
fn build(
    at: std::net::SocketAddr,
    server: &Server,
) -> Result<(opcua::server::Server, opcua::server::ServerHandle, Nodes), String> {
    let (max_ns, uris) = namespaces(&server.devices)?;
    let users = [ANONYMOUS_USER_TOKEN_ID];
    let mut builder = ServerBuilder::new()
        .application_name("devsim")
        .application_uri("urn:devsim:server")
        .product_uri("urn:devsim")
        .create_sample_keypair(true)
        .pki_dir(&server.pki)
        .host(at.ip().to_string())
        .port(at.port())
        .discovery_urls(vec![format!("opc.tcp://{at}/")])
        .trust_client_certs(true);
    for (id, policy, mode) in [
        ("none", SecurityPolicy::None, MessageSecurityMode::None),
        (
            "basic256sha256_sign",
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::Sign,
        ),
        (
            "basic256sha256_sign_encrypt",
            SecurityPolicy::Basic256Sha256,
            MessageSecurityMode::SignAndEncrypt,
        ),
    ] {
        builder = builder.add_endpoint(id, ("/", policy, mode, &users as &[&str]));
    }
    let mut all: Vec<String> = (2..=max_ns).map(|n| format!("urn:devsim:ns{n}")).collect();
    all.extend(uris.iter().cloned());
    for uri in &all {
        builder = builder.with_node_manager(simple_node_manager(
            NamespaceMetadata {
                namespace_uri: uri.clone(),
                ..Default::default()
            },
            uri,
        ));
    }
    let (srv, handle) = builder.build().map_err(|e| e.to_string())?;
    let index = |uri: &str| handle.get_namespace_index(uri);
    for n in 2..=max_ns {
        if index(&format!("urn:devsim:ns{n}")) != Some(n) {
            return Err(format!(
                "the server did not give namespace index {n} to devsim's"
            ));
        }
    }
    let managers: Vec<(u16, Arc<SimpleNodeManager>)> = all
        .iter()
        .filter_map(|uri| {
            Some((
                index(uri)?,
                handle
                    .node_managers()
                    .get_by_name::<SimpleNodeManager>(uri)?,
            ))
        })
        .collect();
    let manager_of = |ns: u16| -> Option<Arc<SimpleNodeManager>> {
        managers
            .iter()
            .find(|(i, _)| *i == ns)
            .map(|(_, m)| m.clone())
    };
    let mut served = Vec::new();
    let mut inserted: std::collections::HashSet<NodeId> = Default::default();
    for (d, sim) in &server.devices {
        for p in &d.points {
            let Visit::OpcUa(op, t) = &p.point else {
                continue;
            };
            let ns = match &op.node.namespace_uri {
                Some(u) => index(u).ok_or_else(|| format!("namespace {u} missing"))?,
                None => op.node.id.namespace,
            };
            let node = NodeId {
                namespace: ns,
                identifier: op.node.id.identifier.clone(),
            };
            if !inserted.insert(node.clone()) {
                // Another property's node: served once, from the first that names it.
                continue;
            }
            let nm = manager_of(ns).ok_or_else(|| format!("no node manager for ns={ns}"))?;
            let text = sim
                .edit(|s| s.text.get(&p.name).cloned())
                .unwrap_or_else(|| p.initial.clone());
            let value = from_twin(&text, *t, false).unwrap_or(Variant::Empty);
            // As the address space shows it (the sync below tells a client's write by a change).
            let shown = to_twin(&value).ok();
            let access = if p.writable {
                AccessLevel::CURRENT_READ | AccessLevel::CURRENT_WRITE
            } else {
                AccessLevel::CURRENT_READ
            };
            let name = format!("{}.{}", d.id.replace('/', "."), p.name);
            {
                let mut space = nm.address_space().write();
                VariableBuilder::new(&node, name.as_str(), name.as_str())
                    .data_type(data_type_id(*t))
                    .value(value)
                    .access_level(access)
                    .user_access_level(access)
                    .organized_by(ObjectId::ObjectsFolder)
                    .insert(&mut *space);
            }
            served.push((
                nm,
                Served {
                    name: p.name.clone(),
                    node,
                    t: *t,
                    sim: sim.clone(),
                    last: shown,
                },
            ));
        }
    }
    Ok((srv, handle, served))
}

/// Runs the server on `listener` until `stop` is notified.
async fn run_once(
    listener: tokio::net::TcpListener,
    server: &Server,
    stop: Arc<tokio::sync::Notify>,
) -> Result<(), String> {
    let at = listener.local_addr().map_err(|e| e.to_string())?;
    let (srv, handle, mut served) = build(at, server)?;
    // The server's reads are not seen one by one: a scenario's clock that starts with the first
    // request starts when the server does.
    for (_, sim) in &server.devices {
        sim.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    let subscriptions = handle.subscriptions().clone();
    let sync = async {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tick.tick().await;
            for (nm, s) in &mut served {
                let now = {
                    let space = nm.address_space().read();
                    match space.find(&s.node) {
                        Some(opcua::nodes::NodeType::Variable(v)) => v
                            .value(
                                opcua::types::TimestampsToReturn::Neither,
                                &opcua::types::NumericRange::None,
                                &opcua::types::DataEncoding::Binary,
                                0.0,
                            )
                            .value
                            .and_then(|v| to_twin(&v).ok()),
                        _ => None,
                    }
                };
                if now.is_some() && now != s.last {
                    // Written by a client: the device holds it, and a client subscribed to
                    // the node hears of it, as from a real server (a client's write does not
                    // reach the subscriptions by itself here).
                    let v = now.clone().unwrap_or_default();
                    if let Ok(value) = from_twin(&v, s.t, false) {
                        let _ =
                            nm.set_value(&subscriptions, &s.node, None, DataValue::new_now(value));
                    }
                    s.sim.edit(|st| st.text.insert(s.name.clone(), v));
                    s.last = now;
                    continue;
                }
                let want = s.sim.edit(|st| st.text.get(&s.name).cloned());
                if want.is_some() && want != s.last {
                    let text = want.clone().unwrap_or_default();
                    if let Ok(v) = from_twin(&text, s.t, false) {
                        let _ = nm.set_value(&subscriptions, &s.node, None, DataValue::new_now(v));
                    }
                    s.last = want;
                }
            }
        }
    };
    tokio::select! {
        r = srv.run_with(listener) => r.map_err(|e| e.to_string()),
        () = sync => Ok(()),
        () = stop.notified() => {
            handle.cancel();
            Ok(())
        }
    }
}

/// Serves `server` on `listener` (its address kept across stops) until the runtime ends:
/// stopped while any of its devices is silent, started again (every session dropped) when a
/// device's `epoch` moves.
pub async fn serve(listener: tokio::net::TcpListener, server: Server) {
    let Ok(address) = listener.local_addr() else {
        return;
    };
    let mut listener = Some(listener);
    let server = Arc::new(server);
    let state = |server: &Server| -> (bool, Vec<u32>) {
        let silent = server.devices.iter().any(|(_, s)| s.edit(|st| st.silent));
        let epochs = server
            .devices
            .iter()
            .map(|(_, s)| s.edit(|st| st.epoch))
            .collect();
        (silent, epochs)
    };
    let mut first = true;
    loop {
        let (silent, epochs) = state(&server);
        if silent {
            // The port closed while it is.
            listener = None;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let bound = match listener.take() {
            Some(l) => Ok(l),
            None => tokio::net::TcpListener::bind(address).await,
        };
        let listener = match bound {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(%address, error = %e, "cannot listen again; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if !first {
            tracing::info!(%address, "OPC UA server started again");
        }
        first = false;
        let stop = Arc::new(tokio::sync::Notify::new());
        let watch = {
            let (server, stop) = (server.clone(), stop.clone());
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let (silent, now) = state(&server);
                    if silent || now != epochs {
                        stop.notify_one();
                        return;
                    }
                }
            }
        };
        let run = run_once(listener, &server, stop.clone());
        tokio::select! {
            r = run => {
                if let Err(e) = r {
                    tracing::warn!(%address, error = %e, "OPC UA server stopped");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            () = watch => {
                // Let the server close its sessions and port.
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

/// An OPC UA device of the manifests, its properties read by the mapper's own parser; or
/// every problem with its field path.
pub fn layout(
    id: &str,
    device: &api::v1beta1::Device,
    model: &api::v1beta1::DeviceModel,
    config: &serde_json::Map<String, serde_json::Value>,
    named: &[String],
) -> Result<SimDevice, Vec<(String, String)>> {
    let conn = mapper_opcua::config::Connection::from_config(config)
        .map_err(|e| vec![(format!("spec.protocol.configData.{}", e.key), e.reason)])?;
    let (host, port) = host_port(&conn.url).ok_or_else(|| {
        vec![(
            "spec.protocol.configData.url".to_string(),
            format!("{:?} has no host:port", conn.url),
        )]
    })?;
    let mut errors = Vec::new();
    let mut points: Vec<SimPoint> = Vec::new();
    for (at, p, mp, visitor) in crate::device::properties(device, model, named, &mut errors) {
        let point = match Point::from_config(visitor, Duration::from_secs(1)) {
            Ok(pt) => pt,
            Err(e) => {
                errors.push((format!("{at}.visitors.configData.{}", e.key), e.reason));
                continue;
            }
        };
        // Two properties may read one node (an `indexRange` of it, one polled and one
        // subscribed), as the mapper takes them: the node is served once, from the first.
        let t = scalar_type(&point, mp.and_then(|m| m.type_));
        points.push(SimPoint::of(p, mp, initial(t), Visit::OpcUa(point, t)));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(SimDevice {
        address: format!("{host}:{port}"),
        opcua: Some(conn.url),
        ..SimDevice::bare(id, points)
    })
}
