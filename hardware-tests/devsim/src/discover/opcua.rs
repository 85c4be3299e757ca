//! Discovery of an OPC UA server: its address space browsed from a node (the Objects folder by
//! default) along hierarchical references, through nested folders and objects; every variable
//! found becomes a property with its `nodeID` visitor, its model type from the value's type,
//! `ReadWrite` when the server's access level says it takes writes, and `minimum`, `maximum`
//! and `unit` from its `EURange` and `EngineeringUnits`. Only Browse and Read are sent.

use super::{Draft, Seen};
use opcua::client::{ClientBuilder, IdentityToken, Session};
use opcua::crypto::SecurityPolicy;
use opcua::types::{
    AttributeId, BrowseDescription, BrowseDirection, BrowseResultMask, DataValue, EUInformation,
    MessageSecurityMode, NodeClass, NodeId, ObjectId, Range, ReadValueId, ReferenceTypeId,
    TimestampsToReturn, UserTokenPolicy, Variant, VariantScalarTypeId,
};
use std::collections::HashSet;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// What to browse.
#[derive(Clone, Debug)]
pub struct Options {
    /// `opc.tcp://host:port/path`.
    pub url: String,
    /// The node to browse from (`ns=2;s=Line1`); the Objects folder when `None`.
    pub from: Option<String>,
    /// How many levels below it.
    pub depth: usize,
    pub timeout: Duration,
    /// The name of the drafted objects (`NAME` and `NAME-model`).
    pub name: String,
    pub max_properties: usize,
}

/// A variable found.
#[derive(Clone, Debug)]
pub struct Variable {
    /// Browse names from the starting node.
    pub path: Vec<String>,
    pub node: NodeId,
    pub value: Option<Variant>,
    /// The value's bad status, or why it could not be read.
    pub error: Option<String>,
    pub value_rank: i32,
    pub writable: bool,
    pub readable: bool,
    pub range: Option<(f64, f64)>,
    pub unit: Option<String>,
    pub description: Option<String>,
}

/// What a browse found.
#[derive(Clone, Debug, Default)]
pub struct Browsed {
    pub variables: Vec<Variable>,
    /// Browse and Read requests sent.
    pub requests: usize,
    /// The server's namespace array (index -> URI).
    pub namespaces: Vec<String>,
    pub notes: Vec<String>,
}

async fn connect(
    o: &Options,
    pki: &std::path::Path,
) -> Result<
    (
        Arc<Session>,
        tokio::task::JoinHandle<opcua::types::StatusCode>,
    ),
    String,
> {
    let mut client = ClientBuilder::new()
        .application_name("devsim discover")
        .application_uri("urn:devsim:discover")
        .product_uri("urn:devsim:discover")
        .pki_dir(pki)
        .create_sample_keypair(false)
        .session_retry_limit(0)
        .request_timeout(o.timeout)
        .session_name("devsim discover")
        .client()
        .map_err(|e| format!("cannot set up the OPC UA client: {}", e.join("; ")))?;
    let endpoint = (
        o.url.as_str(),
        SecurityPolicy::None.to_uri(),
        MessageSecurityMode::None,
        UserTokenPolicy::anonymous(),
    );
    let (session, event_loop) = tokio::time::timeout(
        o.timeout * 2,
        client.connect_to_matching_endpoint(endpoint, IdentityToken::Anonymous),
    )
    .await
    .map_err(|_| format!("{}: no answer within {:?}", o.url, o.timeout * 2))?
    .map_err(|e| {
        format!(
            "{}: {e} (discover opens a session without security, anonymously: the server must offer that endpoint)",
            o.url
        )
    })?;
    let events = event_loop.spawn();
    let up = tokio::time::timeout(o.timeout * 2, session.wait_for_connection())
        .await
        .unwrap_or(false);
    if !up {
        events.abort();
        return Err(format!("{}: no session", o.url));
    }
    Ok((session, events))
}

/// Browses `o.url` from `o.from`. Never writes.
pub async fn browse(o: &Options) -> Result<Browsed, String> {
    let pki = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let (session, events) = connect(o, pki.path()).await?;
    let out = walk(&session, o).await;
    let _ = session.disconnect().await;
    events.abort();
    out
}

fn describe(node: &NodeId, kinds: u32) -> BrowseDescription {
    BrowseDescription {
        node_id: node.clone(),
        browse_direction: BrowseDirection::Forward,
        reference_type_id: ReferenceTypeId::HierarchicalReferences.into(),
        include_subtypes: true,
        node_class_mask: kinds,
        result_mask: BrowseResultMask::All as u32,
    }
}

/// The children of `node` of the classes `kinds`: `(reference type, node, browse name,
/// class)`, following continuation points.
async fn children(
    session: &Session,
    node: &NodeId,
    kinds: u32,
    requests: &mut usize,
) -> Result<Vec<(NodeId, NodeId, String, NodeClass)>, String> {
    *requests += 1;
    let mut results = session
        .browse(&[describe(node, kinds)], 1000, None)
        .await
        .map_err(|e| format!("browse {node}: {e}"))?;
    let mut out = Vec::new();
    while let Some(r) = results.pop() {
        if r.status_code.is_bad() {
            return Err(format!("browse {node}: {}", r.status_code));
        }
        for d in r.references.unwrap_or_default() {
            out.push((
                d.reference_type_id,
                d.node_id.node_id,
                d.browse_name.name.to_string(),
                d.node_class,
            ));
        }
        if r.continuation_point.is_null() {
            break;
        }
        *requests += 1;
        results = session
            .browse_next(false, &[r.continuation_point])
            .await
            .map_err(|e| format!("browse {node} (next): {e}"))?;
    }
    Ok(out)
}

async fn read(
    session: &Session,
    ids: Vec<ReadValueId>,
    requests: &mut usize,
) -> Result<Vec<DataValue>, String> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(200) {
        *requests += 1;
        let got = session
            .read(chunk, TimestampsToReturn::Neither, 0.0)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if got.len() != chunk.len() {
            return Err(format!(
                "read: {} values for {} nodes",
                got.len(),
                chunk.len()
            ));
        }
        out.extend(got);
    }
    Ok(out)
}

fn attribute(node: &NodeId, a: AttributeId) -> ReadValueId {
    ReadValueId {
        node_id: node.clone(),
        attribute_id: a as u32,
        ..Default::default()
    }
}

async fn walk(session: &Session, o: &Options) -> Result<Browsed, String> {
    let mut out = Browsed::default();
    let start = match &o.from {
        Some(text) => text
            .parse::<NodeId>()
            .map_err(|_| format!("--from {text:?} is not a node id (ns=2;s=Line1, i=85)"))?,
        None => ObjectId::ObjectsFolder.into(),
    };
    let has_property: NodeId = ReferenceTypeId::HasProperty.into();
    let structure = NodeClass::Object as u32 | NodeClass::Variable as u32;
    let mut seen: HashSet<NodeId> = HashSet::from([start.clone()]);
    // (node, path, class)
    let mut todo: Vec<(NodeId, Vec<String>, NodeClass)> =
        vec![(start, Vec::new(), NodeClass::Object)];
    // (variable, its EURange, its EngineeringUnits)
    let mut found: Vec<(Variable, Option<NodeId>, Option<NodeId>)> = Vec::new();
    while let Some((node, path, class)) = todo.pop() {
        let kids = children(session, &node, structure, &mut out.requests).await?;
        let mut range = None;
        let mut unit = None;
        let mut next = Vec::new();
        for (reference, child, name, child_class) in kids {
            if reference == has_property && class == NodeClass::Variable {
                // A property of a variable tells of it (its range, its unit); an object's
                // properties (SerialNumber, Manufacturer) are variables of their own, below.
                match name.as_str() {
                    "EURange" => range = Some(child),
                    "EngineeringUnits" => unit = Some(child),
                    _ => {}
                }
                continue;
            }
            // The server's own objects (namespace 0) are not the device's.
            if child.namespace == 0 || !seen.insert(child.clone()) {
                continue;
            }
            let mut p = path.clone();
            p.push(name);
            next.push((child, p, child_class));
        }
        if class == NodeClass::Variable {
            found.push((
                Variable {
                    path: path.clone(),
                    node: node.clone(),
                    value: None,
                    error: None,
                    value_rank: -1,
                    writable: false,
                    readable: false,
                    range: None,
                    unit: None,
                    description: None,
                },
                range,
                unit,
            ));
        }
        if path.len() < o.depth {
            // Depth first, in the server's order.
            next.reverse();
            todo.extend(next);
        } else if !next.is_empty() {
            out.notes.push(format!(
                "{}: {} nodes below, not browsed (--depth {})",
                path.join("/"),
                next.len(),
                o.depth
            ));
        }
    }
    // Each variable's value, rank, access level and description, and its range and unit.
    let mut ids = Vec::new();
    for (v, range, unit) in &found {
        for a in [
            AttributeId::Value,
            AttributeId::ValueRank,
            AttributeId::AccessLevel,
            AttributeId::Description,
        ] {
            ids.push(attribute(&v.node, a));
        }
        for p in [range, unit] {
            ids.push(attribute(
                p.as_ref().unwrap_or(&NodeId::null()),
                AttributeId::Value,
            ));
        }
    }
    let values = read(session, ids, &mut out.requests).await?;
    for ((mut v, _, _), dv) in found.into_iter().zip(values.chunks(6)) {
        let status = dv[0].status.unwrap_or_default();
        if status.is_bad() {
            v.error = Some(status.to_string());
        }
        v.value = dv[0].value.clone();
        if let Some(Variant::Int32(r)) = dv[1].value {
            v.value_rank = r;
        }
        if let Some(Variant::Byte(level)) = dv[2].value {
            v.readable = level & 1 != 0;
            v.writable = level & 2 != 0;
        }
        if let Some(Variant::LocalizedText(t)) = &dv[3].value {
            // Servers often give the browse name again: no description.
            let text = t.text.to_string();
            v.description =
                (!text.trim().is_empty() && v.path.last() != Some(&text)).then_some(text);
        }
        if let Some(Variant::ExtensionObject(e)) = &dv[4].value {
            v.range = e.inner_as::<Range>().map(|r| (r.low, r.high));
        }
        if let Some(Variant::ExtensionObject(e)) = &dv[5].value {
            v.unit = e
                .inner_as::<EUInformation>()
                .map(|u| u.display_name.text.to_string())
                .filter(|u| !u.is_empty());
        }
        out.variables.push(v);
    }
    out.requests += 1;
    if let Ok(ns) = session.read_namespace_array().await {
        let mut pairs: Vec<(u16, String)> = ns
            .known_namespaces()
            .iter()
            .map(|(u, i)| (*i, u.clone()))
            .collect();
        pairs.sort();
        out.namespaces = pairs.into_iter().map(|(_, u)| u).collect();
    }
    Ok(out)
}

/// The model type and visitor `dataType` of a value, and what to say of it.
fn types(v: &Variable) -> (&'static str, Option<&'static str>, Option<String>) {
    use VariantScalarTypeId as T;
    let scalar = match &v.value {
        Some(Variant::Array(a)) => {
            return (
                "STRING",
                None,
                Some(format!(
                    "an array of {:?}: the mapper reports it as JSON text (indexRange picks items)",
                    a.value_type
                )),
            );
        }
        Some(value) => value.scalar_type_id(),
        None => None,
    };
    match scalar {
        Some(T::Boolean) => ("BOOLEAN", Some("Boolean"), None),
        Some(T::SByte) => ("INT", Some("SByte"), None),
        Some(T::Byte) => ("INT", Some("Byte"), None),
        Some(T::Int16) => ("INT", Some("Int16"), None),
        Some(T::UInt16) => ("INT", Some("UInt16"), None),
        Some(T::Int32) => ("INT", Some("Int32"), None),
        Some(T::UInt32) => ("INT", Some("UInt32"), None),
        Some(T::Int64) => ("INT", Some("Int64"), None),
        Some(T::UInt64) => ("INT", Some("UInt64"), None),
        Some(T::Float) => ("FLOAT", Some("Float"), None),
        Some(T::Double) => ("DOUBLE", Some("Double"), None),
        Some(T::String) => ("STRING", Some("String"), None),
        Some(T::DateTime) => ("STRING", Some("DateTime"), None),
        Some(other) => (
            "STRING",
            None,
            Some(format!("a {other:?}: the mapper reports it as text")),
        ),
        None => (
            "STRING",
            None,
            Some("no value could be read: the type is a guess".into()),
        ),
    }
}

/// A property name from a browse path: its names joined with `.`, each kept to the characters
/// a property name may hold.
fn property_name(path: &[String]) -> String {
    let name: String = path
        .iter()
        .map(|p| {
            p.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || "-_,:@#".contains(c) {
                        c
                    } else {
                        '_'
                    }
                })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join(".");
    name.chars().take(128).collect()
}

fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// The draft manifests of what `b` found: one Device for the server.
pub fn draft(b: &Browsed, o: &Options) -> Draft {
    let mut seen: Vec<Seen> = Vec::new();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Drafted by `discover` from {} ({} requests, Browse and Read only: nothing was written).\n# Review every property: names come from the browse path, types from the values read.",
        o.url, b.requests
    );
    for (i, ns) in b.namespaces.iter().enumerate().skip(1) {
        let _ = writeln!(out, "# Namespace {i}: {ns}");
    }
    for note in &b.notes {
        let _ = writeln!(out, "# {note}");
    }
    let mut model_props = String::new();
    let mut device_props = String::new();
    let mut names: HashSet<String> = HashSet::new();
    let mut left = 0;
    for v in &b.variables {
        if names.len() == o.max_properties {
            left += 1;
            continue;
        }
        let mut name = property_name(&v.path);
        // Two paths that clean up to one name: the second gets its node id's number.
        if !names.insert(name.clone()) {
            name = format!("{name}#{}", names.len());
            names.insert(name.clone());
        }
        let (model_type, data_type, note) = types(v);
        let shown = match (&v.value, &v.error) {
            (_, Some(e)) => format!("could not be read: {e}"),
            (Some(value), None) => match mapper_opcua::value::to_twin(value) {
                Ok(t) => {
                    if v.error.is_none() {
                        seen.push((o.name.clone(), name.clone(), model_type, t.clone()));
                    }
                    format!("read {t}")
                }
                Err(e) => format!("read a value the mapper cannot report: {e}"),
            },
            (None, None) => "no value".into(),
        };
        let mut comment = shown;
        if let Some(n) = note {
            let _ = write!(comment, "; {n}");
        }
        if !v.readable && v.error.is_none() {
            comment.push_str("; the access level says it cannot be read");
        }
        let _ = write!(
            model_props,
            "    - name: {}   # {comment}\n      type: {model_type}\n      accessMode: {}\n",
            quote(&name),
            if v.writable { "ReadWrite" } else { "ReadOnly" }
        );
        if let Some(d) = &v.description {
            let _ = writeln!(model_props, "      description: {}", quote(d));
        }
        if let Some((low, high)) = v.range {
            let _ = writeln!(
                model_props,
                "      minimum: \"{low}\"\n      maximum: \"{high}\""
            );
        }
        if let Some(u) = &v.unit {
            let _ = writeln!(model_props, "      unit: {}", quote(u));
        }
        let mut visitor = format!("nodeID: {}", quote(&v.node.to_string()));
        if let Some(t) = data_type {
            let _ = write!(visitor, ", dataType: {t}");
        }
        let _ = writeln!(
            device_props,
            "    - name: {}\n      collectCycle: 1000\n      reportCycle: 1000\n      visitors: {{protocolName: opcua, configData: {{{visitor}}}}}",
            quote(&name)
        );
    }
    if left > 0 {
        let _ = writeln!(
            out,
            "# {left} more variables not drafted (--max-properties {})",
            o.max_properties
        );
    }
    if names.is_empty() {
        let _ = writeln!(
            out,
            "# No variable found below {} (depth {}): nothing to draft.",
            o.from.as_deref().unwrap_or("the Objects folder"),
            o.depth
        );
        return Draft {
            manifests: out,
            seen,
        };
    }
    let name = &o.name;
    let _ = write!(
        out,
        "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: {name}-model\n  namespace: default\nspec:\n  protocol: opcua\n  properties:\n{model_props}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  # nodeName: the edge node that reaches the server\n  deviceModelRef:\n    name: {name}-model\n  protocol:\n    protocolName: opcua\n    configData: {{url: {}}}\n  properties:\n{device_props}",
        quote(&o.url)
    );
    Draft {
        manifests: out,
        seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn browse_paths_make_property_names() {
        let p = |v: &[&str]| property_name(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            p(&["Line1", "Oven", "Temperature"]),
            "Line1.Oven.Temperature"
        );
        assert_eq!(p(&["Tank 2", "Level (m)"]), "Tank_2.Level__m_");
        assert_eq!(p(&[&"x".repeat(200)]).len(), 128);
        api::validate::names::check_twin_key(&p(&["Tank 2", "Level (m)"])).expect("a valid name");
    }
}
