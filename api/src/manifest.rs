//! Parsing manifests: multi-document YAML (or JSON) text into typed objects, each document with
//! every problem found in it. No files are read here; callers pass the text.

use crate::v1beta1::{API_VERSION, Device, DeviceModel, DeviceStatus, GROUP};
use crate::validate::{Problem, schema};
use serde::Deserialize;
use serde_json::Value;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

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
///
/// A large text (a gateway's thousand devices in one file) is cut at document-start lines and its
/// parts parsed on as many threads as there are cores (up to [`MAX_THREADS`]): the result is the
/// one a single pass gives, which a part with any syntax error falls back to, so that errors
/// name their place in the whole text. Not in a process that called [`parse_in_one_pass`].
pub fn parse_documents(text: &str) -> Vec<Document> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if text.len() < PARALLEL_FROM || threads < 2 || !IN_PARTS.load(Ordering::Relaxed) {
        return parse_stream(text).documents;
    }
    let parts = cut(text, threads.min(MAX_THREADS));
    parse_parts(&parts).unwrap_or_else(|| parse_stream(text).documents)
}

static IN_PARTS: AtomicBool = AtomicBool::new(true);

/// Makes [`parse_documents`] parse every text in one pass, on the calling thread: for a process
/// whose threads share one malloc arena (edgecore and cloudcore, `rt::sys::single_arena`),
/// where the parts' threads wait on each other's allocations. Measured in edgecore's first start
/// with 1,000 devices in one file on two cores: the parse took 57-79 ms in two parts against
/// 55-64 ms in one pass, and the start was no faster (docs/benchmarks.md, session 52).
pub fn parse_in_one_pass() {
    IN_PARTS.store(false, Ordering::Relaxed);
}

/// Texts from this size on are parsed in parts (a smaller one parses faster than threads start).
const PARALLEL_FROM: usize = 128 * 1024;
/// The most threads one parse uses.
pub const MAX_THREADS: usize = 4;

/// What one pass over a YAML stream gave.
struct Stream {
    documents: Vec<Document>,
    /// Documents in the stream, empty ones included (what indexes count).
    count: usize,
    /// Whether the pass stopped at a syntax error.
    broken: bool,
}

fn parse_stream(text: &str) -> Stream {
    let mut stream = Stream {
        documents: Vec::new(),
        count: 0,
        broken: false,
    };
    for (index, doc) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        stream.count = index + 1;
        let value = match Value::deserialize(doc) {
            Ok(v) => v,
            Err(e) => {
                stream.documents.push(Document::failed(
                    index,
                    String::new(),
                    String::new(),
                    Problem::error("", format!("not valid YAML: {e}")),
                ));
                stream.broken = true;
                // The parser cannot go on past a syntax error in a stream.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        stream.documents.push(parse_value(index, value));
    }
    stream
}

/// Cuts `text` into at most `parts` pieces of about equal size, every piece but the first
/// starting on a document-start line (`---` at the start of a line, then a blank or the line's
/// end: YAML allows no such line inside a document's content). A text with directives (`%`
/// lines, which belong to the document after them) is not cut.
fn cut(text: &str, parts: usize) -> Vec<&str> {
    if parts < 2 || text.starts_with('%') || text.contains("\n%") {
        return vec![text];
    }
    let bytes = text.as_bytes();
    let is_start = |at: usize| {
        bytes[at..].starts_with(b"---")
            && matches!(bytes.get(at + 3), None | Some(b' ' | b'\t' | b'\r' | b'\n'))
    };
    let mut out = Vec::with_capacity(parts);
    let mut from = 0;
    for k in 1..parts {
        let target = (text.len() * k / parts).max(from + 1);
        // The first document-start line after `target` (a byte after a newline is where a
        // character starts, whatever `target` fell on).
        let at = (target..bytes.len()).find(|&i| bytes[i - 1] == b'\n' && is_start(i));
        let Some(at) = at else { break };
        out.push(&text[from..at]);
        from = at;
    }
    out.push(&text[from..]);
    out
}

/// Whether `text` holds nothing but blank and comment lines.
fn no_document(text: &str) -> bool {
    text.trim_start_matches('\u{feff}').lines().all(|l| {
        let l = l.trim();
        l.is_empty() || l.starts_with('#')
    })
}

/// Parses `parts`, each on a thread of its own, into the documents of their whole text; `None`
/// when a part has a syntax error (or a thread cannot be had): then the text is parsed in one.
fn parse_parts(parts: &[&str]) -> Option<Vec<Document>> {
    let (first, rest) = parts.split_first()?;
    let streams = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(rest.len());
        for part in rest {
            let h = std::thread::Builder::new()
                .name("manifest-parse".into())
                .spawn_scoped(s, || parse_stream(part));
            handles.push(h.ok());
        }
        let mut streams = vec![Some(parse_stream(first))];
        streams.extend(handles.into_iter().map(|h| h.and_then(|h| h.join().ok())));
        streams
    });
    let mut out = Vec::new();
    let mut offset = 0;
    for (i, stream) in streams.into_iter().enumerate() {
        let mut stream = stream?;
        if stream.broken {
            return None;
        }
        // A stream with no document at all reads as one empty document; only the first part
        // can be one (the others start with a marker), when the text opens with comments.
        if i == 0 && no_document(first) {
            stream.count = 0;
        }
        out.extend(stream.documents.into_iter().map(|mut d| {
            d.index += offset;
            d
        }));
        offset += stream.count;
    }
    Some(out)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn device(name: &str) -> String {
        format!(
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 502}}}}\n  properties:\n    - {{name: t, desired: {{value: \"5\"}}, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 1}}}}}}\n"
        )
    }

    /// What manifests are made of, the awkward parts included: markers that are content, block
    /// and quoted scalars and flow collections that a marker line cuts, document ends,
    /// directives, syntax errors, schema errors.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            12 => "[a-z]{1,8}".prop_map(|n| device(&n)),
            3 => Just("apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m}\nspec:\n  properties:\n    - {name: t, type: INT, accessMode: ReadWrite}\n".to_string()),
            2 => Just("apiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {name: bad}\nspec: {properties: 7}\n".to_string()),
            1 => Just("# only a comment\n".to_string()),
            1 => Just(String::new()),
            1 => Just("note: |\n  text\n  ---\n  more\n".to_string()),
            1 => Just("|\nliteral at the top\n".to_string()),
            1 => Just("top: 'quoted\n---\nstill quoted'\n".to_string()),
            1 => Just("list: [1,\n---\n2]\n".to_string()),
            1 => Just("a: 1\n...\n".to_string()),
            1 => Just("%YAML 1.2\n".to_string()),
            1 => Just("key: [unclosed\n".to_string()),
            1 => Just("plain\nscalar\n".to_string()),
            1 => Just("----\nnot: a marker\n".to_string()),
            1 => Just("{inline: true}\n".to_string()),
            1 => "[a-z:\\- \n]{0,24}",
        ]
    }

    fn separator() -> impl Strategy<Value = &'static str> {
        prop_oneof![
            4 => Just("---\n"),
            1 => Just("--- \n"),
            1 => Just("---\r\n"),
            1 => Just("--- # a comment\n"),
            1 => Just("---\t"),
            1 => Just("...\n---\n"),
            1 => Just("\n"),
            1 => Just(""),
        ]
    }

    fn same(a: &[Document], b: &[Document]) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        /// Cut anywhere it may be cut and parsed in parts, a text gives what one pass over it
        /// gives: the same documents, at the same indexes, with the same problems.
        #[test]
        fn a_text_parsed_in_parts_gives_what_one_pass_gives(
            pieces in proptest::collection::vec((separator(), piece()), 0..8),
            parts in 2usize..8,
        ) {
            let text: String = pieces.iter().map(|(s, p)| format!("{s}{p}")).collect();
            let whole = parse_stream(&text).documents;
            let cuts = cut(&text, parts);
            prop_assert_eq!(cuts.concat(), text.clone());
            for part in &cuts[1..] {
                prop_assert!(part.starts_with("---"), "{part:?}");
            }
            if let Some(got) = parse_parts(&cuts) {
                prop_assert!(same(&got, &whole), "parts {cuts:?}\ngot {got:?}\nwhole {whole:?}");
            }
        }
    }

    /// A gateway's thousand devices in one file are parsed in parts, into what one pass gives.
    #[test]
    fn a_large_manifest_is_parsed_in_parts() {
        let mut text = String::new();
        for i in 0..1000 {
            text.push_str("---\n");
            text.push_str(&device(&format!("dev-{i}")));
        }
        assert!(text.len() >= PARALLEL_FROM);
        let cuts = cut(&text, 3);
        assert_eq!(cuts.len(), 3);
        let parts = parse_parts(&cuts).expect("parsed in parts");
        let whole = parse_stream(&text).documents;
        assert_eq!(parts.len(), 1000);
        assert!(same(&parts, &whole));
        assert!(same(&parse_documents(&text), &whole));
        assert_eq!(parts[999].name, "dev-999");
        assert_eq!(parts[999].index, 999);
        // One bad document anywhere: the whole text is parsed in one pass, its error placed
        // in the whole text.
        let broken = text.replacen("name: dev-700,", "name: [dev-700,", 1);
        let docs = parse_documents(&broken);
        let last = docs.last().expect("documents");
        assert!(
            last.problems[0].to_string().contains("line 6304"),
            "{:?}",
            last.problems
        );
    }
}
