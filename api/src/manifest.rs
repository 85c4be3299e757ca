//! Parsing manifests: multi-document YAML (or JSON) text into typed objects, each document with
//! every problem found in it. No files are read here; callers pass the text.

use crate::v1beta1::{API_VERSION, Device, DeviceModel, DeviceStatus, GROUP};
use crate::validate::{Problem, schema};
use serde::Deserialize;
use serde_json::Value;
use std::sync::OnceLock;

/// One object of a manifest.
#[derive(Clone, Debug, PartialEq)]
pub enum Object {
    Device(Box<Device>),
    DeviceModel(Box<DeviceModel>),
    DeviceStatus(Box<DeviceStatus>),
}

impl Object {
    /// `Device`, `DeviceModel` or `DeviceStatus`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Device(_) => "Device",
            Self::DeviceModel(_) => "DeviceModel",
            Self::DeviceStatus(_) => "DeviceStatus",
        }
    }

    /// `metadata.name`, empty when absent.
    pub fn name(&self) -> &str {
        let meta = match self {
            Self::Device(o) => &o.metadata,
            Self::DeviceModel(o) => &o.metadata,
            Self::DeviceStatus(o) => &o.metadata,
        };
        meta.name.as_deref().unwrap_or_default()
    }
}

/// One document of a manifest: what it is (as far as could be read) and its schema problems.
#[derive(Clone, Debug)]
pub struct Document {
    /// Position in the text, from 0 (empty documents are skipped but counted).
    pub index: usize,
    /// `kind`, or empty when it could not be read.
    pub kind: String,
    /// `metadata.name`, or empty when it could not be read.
    pub name: String,
    /// The typed object, when the document is a known kind and has no schema error.
    pub object: Option<Object>,
    /// When the document has schema errors: the object read from what remains once the fields in
    /// error are dropped, so that its other problems can be reported too. Never to be applied.
    pub partial: Option<Object>,
    /// Problems found while reading the document: syntax, kind, schema.
    pub problems: Vec<Problem>,
}

impl Document {
    fn failed(index: usize, kind: String, name: String, problem: Problem) -> Self {
        Self {
            index,
            kind,
            name,
            object: None,
            partial: None,
            problems: vec![problem],
        }
    }
}

const KINDS: [&str; 3] = ["Device", "DeviceModel", "DeviceStatus"];

fn schemas() -> &'static [Option<Value>; 3] {
    static SCHEMAS: OnceLock<[Option<Value>; 3]> = OnceLock::new();
    SCHEMAS.get_or_init(|| crate::crd::schemas_of(KINDS))
}

fn cached_schema(kind: &str) -> Option<&'static Value> {
    let i = KINDS.iter().position(|k| *k == kind)?;
    schemas()[i].as_ref()
}

/// Derives the schemas the parse checks documents against, ahead of the first parse (a
/// server calls it on a thread of its own while it opens its stores).
pub fn prepare() {
    schemas();
}

/// Parses every document of `text`. A document that cannot be read at all (bad syntax) is reported
/// and parsing goes on with the next one where the YAML parser can resynchronise; YAML that is
/// broken beyond that yields one document with the error.
pub fn parse_documents(text: &str) -> Vec<Document> {
    let mut out = Vec::new();
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = match Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                out.push(Document::failed(
                    index,
                    String::new(),
                    String::new(),
                    Problem::error("", format!("not valid YAML: {e}")),
                ));
                // The parser cannot go on past a syntax error in a stream.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        out.push(parse_value(index, value));
    }
    out
}

/// Reads one document already parsed to JSON (taken, not copied, into the typed object).
pub fn parse_value(index: usize, value: Value) -> Document {
    let str_at = |ptr: &str| {
        value
            .pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let kind = str_at("/kind");
    let name = str_at("/metadata/name");
    if !value.is_object() {
        return Document::failed(
            index,
            kind,
            name,
            Problem::error(
                "",
                "a manifest document must be an object with apiVersion and kind",
            ),
        );
    }
    let api_version = str_at("/apiVersion");
    if kind.is_empty() {
        return Document::failed(
            index,
            kind,
            name,
            Problem::error("kind", "required field is missing"),
        );
    }
    if api_version != API_VERSION {
        let message = if api_version.is_empty() {
            "required field is missing".to_string()
        } else if api_version.starts_with(&format!("{GROUP}/")) {
            format!("{api_version:?} is not supported; this tool speaks {API_VERSION}")
        } else {
            format!(
                "{api_version:?} {kind} is not a device object (expected apiVersion {API_VERSION})"
            )
        };
        return Document::failed(index, kind, name, Problem::error("apiVersion", message));
    }
    let Some(schema_value) = cached_schema(&kind) else {
        return Document::failed(
            index,
            kind.clone(),
            name,
            Problem::error(
                "kind",
                format!("unknown kind {kind:?} (expected Device, DeviceModel or DeviceStatus)"),
            ),
        );
    };
    let mut problems = Vec::new();
    schema::check(&value, schema_value, "", &mut problems);
    if problems.iter().any(Problem::is_error) {
        // `metadata` is the API server's to check, not the schema's: keep it whole.
        let meta = value.get("metadata").cloned();
        let mut pruned = value;
        schema::prune(&mut pruned, schema_value);
        if let (Some(meta), Some(obj)) = (meta, pruned.as_object_mut()) {
            obj.insert("metadata".into(), meta);
        }
        let partial = typed(&kind, pruned).ok();
        return Document {
            index,
            kind,
            name,
            object: None,
            partial,
            problems,
        };
    }
    let object = match typed(&kind, value) {
        Ok(o) => Some(o),
        Err(e) => {
            problems.push(Problem::error("", format!("cannot be read as {kind}: {e}")));
            None
        }
    };
    Document {
        index,
        kind,
        name,
        object,
        partial: None,
        problems,
    }
}

fn typed(kind: &str, value: Value) -> serde_json::Result<Object> {
    match kind {
        "Device" => serde_json::from_value(value).map(|d| Object::Device(Box::new(d))),
        "DeviceModel" => serde_json::from_value(value).map(|d| Object::DeviceModel(Box::new(d))),
        _ => serde_json::from_value(value).map(|d| Object::DeviceStatus(Box::new(d))),
    }
}
