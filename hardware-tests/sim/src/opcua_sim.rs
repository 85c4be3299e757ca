//! An in-process OPC UA server on async-opcua's server SDK: a PLC-like address space in the
//! namespace [`NAMESPACE`], endpoints without security and with Basic256Sha256 (Sign and
//! SignAndEncrypt), anonymous and user/password identities, on its own runtime so that sync
//! tests and benches can drive it.
//!
//! Nodes (namespace [`NAMESPACE`]):
//! - `s=Temperature` Double, writable; `s=Setpoint` Int16, writable; `s=Batch` String, writable
//! - `i=1002` Boolean (`Running`)
//! - `s=Locked` Double: readable, writable in its AccessLevel but not in its UserAccessLevel,
//!   so a write gets `BadUserAccessDenied`
//! - `s=Levels` Int32[4], writable
//! - `g=` [`GUID_NODE`] Double, `b=` [`OPAQUE_NODE`] UInt32
//! - `s=Tag{k}` Double for `k` in `0..tags`

use opcua::crypto::SecurityPolicy;
use opcua::nodes::{AccessLevel, VariableBuilder};
use opcua::server::address_space::Variable;
use opcua::server::node_manager::memory::{SimpleNodeManager, simple_node_manager};
use opcua::server::{
    ANONYMOUS_USER_TOKEN_ID, ServerBuilder, ServerHandle, ServerUserToken,
    diagnostics::NamespaceMetadata,
};
use opcua::types::{
    ByteString, DataTypeId, DataValue, Guid, MessageSecurityMode, NodeId, ObjectId, Variant,
};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

pub const NAMESPACE: &str = "urn:kubeedge-rs:opcua-sim";
pub const GUID_NODE: &str = "72962b91-fa75-4ae6-8d28-b404dc7daf63";
/// Base64 of the opaque node id's bytes.
pub const OPAQUE_NODE: &str = "AAECAwQF";
pub const USER: &str = "operator";
pub const PASSWORD: &str = "line-1-secret";

#[derive(Clone, Debug)]
pub struct Options {
    /// 0: any free port.
    pub port: u16,
    pub tags: usize,
    /// The server's PKI directory (its certificate is created there).
    pub pki: PathBuf,
    /// The server's `MaxNodesPerRead` (0: its default).
    pub max_nodes_per_read: usize,
}

pub struct OpcSim {
    pub port: u16,
    /// The index of [`NAMESPACE`].
    pub ns: u16,
    pub options: Options,
    handle: ServerHandle,
    nm: Arc<SimpleNodeManager>,
    rt: tokio::runtime::Runtime,
}

impl OpcSim {
    pub fn start(mut options: Options) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", options.port)))
            .with_context(|| format!("bind 127.0.0.1:{}", options.port))?;
        let port = listener.local_addr()?.port();
        // A restart comes back on the same port.
        options.port = port;
        let users = [ANONYMOUS_USER_TOKEN_ID, "operator"];
        let url = format!("opc.tcp://127.0.0.1:{port}/");
        let mut builder = ServerBuilder::new()
            .application_name("kubeedge-rs OPC UA simulator")
            // Not NAMESPACE: the server's diagnostics take the application URI's namespace.
            .application_uri("urn:kubeedge-rs:opcua-sim:server")
            .product_uri("urn:kubeedge-rs:opcua-sim")
            .create_sample_keypair(true)
            .pki_dir(&options.pki)
            .host("127.0.0.1")
            .port(port)
            .discovery_urls(vec![url])
            .trust_client_certs(true)
            .add_user_token("operator", ServerUserToken::user_pass(USER, PASSWORD))
            .add_endpoint(
                "none",
                (
                    "/",
                    SecurityPolicy::None,
                    MessageSecurityMode::None,
                    &users as &[&str],
                ),
            )
            .add_endpoint(
                "basic256sha256_sign",
                (
                    "/",
                    SecurityPolicy::Basic256Sha256,
                    MessageSecurityMode::Sign,
                    &users as &[&str],
                ),
            )
            .add_endpoint(
                "basic256sha256_sign_encrypt",
                (
                    "/",
                    SecurityPolicy::Basic256Sha256,
                    MessageSecurityMode::SignAndEncrypt,
                    &users as &[&str],
                ),
            )
            .with_node_manager(simple_node_manager(
                NamespaceMetadata {
                    namespace_uri: NAMESPACE.to_owned(),
                    ..Default::default()
                },
                "sim",
            ));
        if options.max_nodes_per_read > 0 {
            builder.limits_mut().operational.max_nodes_per_read = options.max_nodes_per_read;
        }
        let (server, handle) = rt
            .block_on(async { builder.build() })
            .map_err(anyhow::Error::msg)?;
        let nm = handle
            .node_managers()
            .get_of_type::<SimpleNodeManager>()
            .context("no simple node manager")?;
        let ns = handle
            .get_namespace_index(NAMESPACE)
            .context("the simulator's namespace is missing")?;
        {
            let mut space = nm.address_space().write();
            let folder = NodeId::new(ns, "Line1");
            space.add_folder(&folder, "Line1", "Line1", &ObjectId::ObjectsFolder.into());
            let mut vars = vec![
                writable(Variable::new(
                    &NodeId::new(ns, "Temperature"),
                    "Temperature",
                    "Temperature",
                    20.5f64,
                )),
                writable(Variable::new(
                    &NodeId::new(ns, "Setpoint"),
                    "Setpoint",
                    "Setpoint",
                    50i16,
                )),
                writable(Variable::new(
                    &NodeId::new(ns, "Batch"),
                    "Batch",
                    "Batch",
                    "B-0001",
                )),
                Variable::new(&NodeId::new(ns, 1002u32), "Running", "Running", true),
                writable(Variable::new(
                    &NodeId::new(ns, "Levels"),
                    "Levels",
                    "Levels",
                    vec![1i32, 2, 3, 4],
                )),
                Variable::new(
                    &NodeId::new(ns, Guid::from_str(GUID_NODE)?),
                    "GuidTag",
                    "GuidTag",
                    7.25f64,
                ),
                Variable::new(
                    &NodeId::new(
                        ns,
                        ByteString::from_base64(OPAQUE_NODE).context("opaque id")?,
                    ),
                    "OpaqueTag",
                    "OpaqueTag",
                    9u32,
                ),
            ];
            for k in 0..options.tags {
                let name = format!("Tag{k}");
                vars.push(writable(Variable::new(
                    &NodeId::new(ns, name.as_str()),
                    name.as_str(),
                    name.as_str(),
                    k as f64,
                )));
            }
            space.add_variables(vars, &folder);
            VariableBuilder::new(&NodeId::new(ns, "Locked"), "Locked", "Locked")
                .data_type(DataTypeId::Double)
                .value(1.5f64)
                .access_level(AccessLevel::CURRENT_READ | AccessLevel::CURRENT_WRITE)
                .user_access_level(AccessLevel::CURRENT_READ)
                .organized_by(folder.clone())
                .insert(&mut *space);
        }
        rt.spawn(async move {
            if let Err(e) = server.run_with(listener).await {
                tracing::warn!(error = %e, "OPC UA simulator stopped");
            }
        });
        Ok(Self {
            port,
            ns,
            options,
            handle,
            nm,
            rt,
        })
    }

    pub fn url(&self) -> String {
        format!("opc.tcp://127.0.0.1:{}/", self.port)
    }

    /// The server's certificate (DER), for a client's trust list.
    pub fn certificate(&self) -> PathBuf {
        self.options.pki.join("own").join("cert.der")
    }

    fn node(&self, name: &str) -> NodeId {
        match name.parse::<u32>() {
            Ok(n) => NodeId::new(self.ns, n),
            Err(_) => NodeId::new(self.ns, name),
        }
    }

    /// Sets a node's value (`"Temperature"`, or `"1002"` for a numeric id), notifying
    /// subscribers.
    pub fn set(&self, name: &str, value: impl Into<Variant>) {
        let id = self.node(name);
        let _ = self.nm.set_value(
            self.handle.subscriptions(),
            &id,
            None,
            DataValue::new_now(value.into()),
        );
    }

    /// A node's value now.
    pub fn get(&self, name: &str) -> Option<Variant> {
        let id = self.node(name);
        let space = self.nm.address_space().read();
        match space.find(&id)? {
            opcua::nodes::NodeType::Variable(v) => {
                v.value(
                    opcua::types::TimestampsToReturn::Neither,
                    &opcua::types::NumericRange::None,
                    &opcua::types::DataEncoding::Binary,
                    0.0,
                )
                .value
            }
            _ => None,
        }
    }

    /// Stops the server (connections dropped, the port closed) and returns its options, to
    /// start it again on the same port.
    pub fn stop(self) -> Options {
        self.handle.cancel();
        self.rt.shutdown_timeout(std::time::Duration::from_secs(2));
        self.options
    }
}

fn writable(mut v: Variable) -> Variable {
    v.set_access_level(AccessLevel::CURRENT_READ | AccessLevel::CURRENT_WRITE);
    v.set_user_access_level(AccessLevel::CURRENT_READ | AccessLevel::CURRENT_WRITE);
    v
}
