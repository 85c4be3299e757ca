//! The local manifests directory: Device and DeviceModel YAML files (the same files `kectl
//! validate` checks) loaded at start and watched, so a gateway runs without any cloud. Invalid
//! objects are reported and skipped; a valid change applies without a restart.

use crate::catalog::object_id;
use crate::catalog::{Catalog, SharedCatalog, SharedSources, Sources};
use api::paths::DeviceId;
use api::validate::set::validate_texts;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// The files of a directory with their modification times and sizes: what the watcher compares.
/// `None` when the directory cannot be listed.
pub(crate) type Signature = Option<Vec<(PathBuf, Option<SystemTime>, u64)>>;

/// The manifest files of `dir`, all of them or an error: an entry that cannot be read or
/// looked at fails the listing, so that a partial listing is never taken for deletions.
fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    Ok(manifest_entries(dir)?.into_iter().map(|(p, _)| p).collect())
}

/// [`manifest_files`] with each file's metadata.
fn manifest_entries(dir: &Path) -> std::io::Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml" | "json")
        ) {
            continue;
        }
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => files.push((path, m)),
            Ok(_) => {}
            // Removed between the listing and now: a deletion like any other.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("{}: {e}", path.display()),
                ));
            }
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// Logs a failed read of the manifests and reports it (metrics, `/healthz`).
pub(crate) fn failed(metrics: &crate::metrics::Metrics, catalog: &SharedCatalog, e: &ListError) {
    let kept = crate::catalog::read(catalog).devices.len();
    tracing::error!(error = %e, devices_kept = kept, "cannot read the manifests; keeping the last good set of devices until a read succeeds");
    metrics.set_manifests_error(Some(e.to_string()));
}

/// Removes the twins of devices the catalog does not declare: run once, after the first
/// complete read of the manifests (they are the source of truth).
pub(crate) async fn prune_undeclared(twin: &twin::TwinService, catalog: &SharedCatalog) {
    let declared: BTreeSet<_> = crate::catalog::read(catalog)
        .devices
        .keys()
        .cloned()
        .collect();
    let rows = match twin.list().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list twins to remove undeclared devices");
            return;
        }
    };
    for row in rows {
        if !declared.contains(&row.id()) {
            tracing::info!(device = %row.id(), "device no longer in the manifests; removing its twin");
            let _ = twin.apply(twin::service::Op::Remove(row.id())).await;
        }
    }
}

fn signature(dir: &Path) -> Signature {
    let files = manifest_entries(dir).ok()?;
    Some(
        files
            .into_iter()
            .map(|(p, m)| {
                let modified = m.modified().ok();
                (p, modified, m.len())
            })
            .collect(),
    )
}

/// What loading a directory gave: the valid objects for this node, and every problem found.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub catalog: Catalog,
    pub problems: Vec<String>,
    /// Devices skipped because their `spec.nodeName` names another node.
    pub other_nodes: Vec<String>,
    /// Devices declared in a document that has errors.
    pub invalid: BTreeSet<DeviceId>,
    /// Files that could not be read or parsed at all.
    pub broken_files: BTreeSet<String>,
}

/// The manifests directory could not be read as a whole: nothing may be concluded from it.
#[derive(Debug, thiserror::Error)]
#[error("cannot list the manifests directory {dir}: {source}")]
pub struct ListError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Loads every manifest of `dir`. A directory that is missing or cannot be listed completely
/// is an error, never an empty set: an error while reading the source of truth is no evidence
/// that devices were deleted.
pub(crate) fn load(dir: &Path, node: &str) -> Result<Loaded, ListError> {
    Ok(load_inputs(read_inputs(dir)?, node))
}

/// The texts of a directory's manifest files, and the files that could not be read.
pub(crate) struct Inputs {
    texts: Vec<(String, String)>,
    unreadable: Loaded,
}

fn read_inputs(dir: &Path) -> Result<Inputs, ListError> {
    let mut unreadable = Loaded::default();
    let files = manifest_files(dir).map_err(|source| ListError {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut texts = Vec::new();
    for f in files {
        match std::fs::read_to_string(&f) {
            Ok(text) => texts.push((f.display().to_string(), text)),
            // Removed since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Unreadable (permissions, too many open files): its devices keep their last
            // valid definitions.
            Err(e) => {
                unreadable
                    .problems
                    .push(format!("{}: cannot read: {e}", f.display()));
                unreadable.broken_files.insert(f.display().to_string());
            }
        }
    }
    Ok(Inputs { texts, unreadable })
}

/// Validates what [`read_inputs`] read: the objects for `node`, and every problem.
fn load_inputs(inputs: Inputs, node: &str) -> Loaded {
    let Inputs {
        texts: inputs,
        mut unreadable,
    } = inputs;
    let loaded = &mut unreadable;
    let report = validate_texts(&inputs);
    loaded
        .broken_files
        .extend(report.unparsed_files.iter().cloned());
    let origins: BTreeMap<DeviceId, String> = report
        .declared_devices
        .iter()
        .map(|(file, id)| (id.clone(), file.clone()))
        .collect();
    loaded.problems.extend(
        report
            .findings
            .iter()
            .filter(|f| f.problem.is_error())
            .map(|f| format!("{f} (skipped)")),
    );
    let valid: BTreeSet<DeviceId> = report
        .valid_devices
        .iter()
        .map(|d| object_id(&d.metadata))
        .collect();
    let devices = report
        .valid_devices
        .into_iter()
        .filter(|d| match d.spec.node_name.as_deref() {
            Some(n) if !n.is_empty() && n != node => {
                loaded.other_nodes.push(format!(
                    "{}/{} (nodeName {n})",
                    api::v1beta1::namespace_of(&d.metadata),
                    d.metadata.name.as_deref().unwrap_or_default()
                ));
                false
            }
            _ => true,
        })
        .collect();
    loaded.invalid = origins
        .keys()
        .filter(|id| !valid.contains(id))
        .cloned()
        .collect();
    loaded.catalog = Catalog::build(report.valid_models, devices);
    loaded.catalog.origins = origins;
    unreadable
}

fn log_loaded(dir: &Path, loaded: &Loaded) {
    for p in &loaded.problems {
        tracing::warn!(dir = %dir.display(), "invalid manifest: {p}");
    }
    for d in &loaded.other_nodes {
        tracing::info!(device = %d, "device is bound to another node; skipped");
    }
}

/// Loads `dir` once as the local source of `catalog` and returns the changes from the previous
/// content. When the directory cannot be read, the sources keep their last good content and the
/// error is returned.
pub(crate) fn reload(dir: &Path, node: &str, sources: &mut Sources) -> Result<(), ListError> {
    // Not stored for a start: no key to compute.
    let (loaded, _) = load_packed(dir, read_inputs(dir)?, node, "")?;
    take(dir, loaded, sources);
    Ok(())
}

/// [`reload`] at start: when the files, the node and this edgecore's version are those of the
/// last start, what they gave then is taken from `meta` instead of parsing and validating every
/// document again (the same result, for a fraction of the time and without the parse's
/// transient memory); otherwise they are parsed ([`load_packed`]). What a parse gave is returned
/// in its stored form, for the caller to store with [`store_for_next_start`] once the twins are
/// served: the first answer does not wait on a write nobody needs before the next start.
///
/// Also returns the directory's signature taken before its files were read, for [`watch`] to
/// start from: a file changed while the start reads and applies them is then seen as changed.
pub(crate) async fn reload_at_start(
    dir: &Path,
    node: &str,
    sources: &mut Sources,
    meta: &crate::meta::store::MetaStore,
    early: Option<EarlyParse>,
) -> (Signature, Result<Option<Parsed>, ListError>) {
    if let Some(early) = early {
        match early.0.await {
            Ok((seen, parsed)) => {
                let parsed = parsed.map(|(loaded, text)| {
                    take(dir, loaded, sources);
                    Some(Parsed { text })
                });
                return (seen, parsed);
            }
            Err(_) => {
                tracing::warn!(dir = %dir.display(), "the start's early parse of the manifests did not finish; parsing them now")
            }
        }
    }
    let seen = signature(dir);
    (seen, read_at_start(dir, node, sources, meta).await)
}

async fn read_at_start(
    dir: &Path,
    node: &str,
    sources: &mut Sources,
    meta: &crate::meta::store::MetaStore,
) -> Result<Option<Parsed>, ListError> {
    let inputs = read_inputs(dir)?;
    let key = cache::key(&inputs, node);
    let cached = match meta.manifests_cache().await {
        Ok(Some(text)) => cache::read(&text, &key),
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the stored result of the last start's manifests; parsing them");
            None
        }
    };
    let (loaded, to_store) = match cached {
        Some(loaded) => {
            tracing::info!(dir = %dir.display(), "manifests unchanged since the last start: their result is read back instead of parsing them");
            (loaded, None)
        }
        None => {
            let (loaded, text) = load_packed(dir, inputs, node, &key)?;
            (loaded, Some(Parsed { text }))
        }
    };
    take(dir, loaded, sources);
    Ok(to_store)
}

/// A first start's parse of the manifests ([`parse_early`]), for [`reload_at_start`].
/// What it read comes with the directory's signature taken before.
pub(crate) struct EarlyParse(tokio::sync::oneshot::Receiver<EarlyRead>);

type EarlyRead = (Signature, Result<(Loaded, String), ListError>);

/// Begins the parse of `dir` on a thread of its own, for a start that cannot have a stored
/// result of it (a first start: no database yet), so that it runs while the databases are
/// created and the listeners start instead of after them (with 1,000 devices on two cores, the
/// databases take ~17 ms and the parse ~55 ms).
///
/// In a process that named its helper ([`parse_in_helper`]), the parse runs in that helper:
/// see there why.
pub(crate) fn parse_early(dir: PathBuf, node: String) -> EarlyParse {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("manifests".into())
        .spawn(move || {
            let _ = tx.send(early_read(HELPER.get().map(PathBuf::as_path), &dir, &node));
        });
    if let Err(e) = spawned {
        // The receiver then reads a closed channel, and the manifests are parsed in line.
        tracing::warn!(error = %e, "cannot start a thread to parse the manifests early");
    }
    EarlyParse(rx)
}

/// [`parse_early`]'s work, in `helper` when given.
fn early_read(helper: Option<&Path>, dir: &Path, node: &str) -> EarlyRead {
    let seen = signature(dir);
    let helped = helper.and_then(|exe| {
        in_helper(exe, dir, node).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the manifests' parse in a helper process failed; parsing them in edgecore");
            None
        })
    });
    let parsed = match helped {
        Some(parsed) => Ok(parsed),
        None => read_inputs(dir).and_then(|inputs| {
            let key = cache::key(&inputs, node);
            load_packed(dir, inputs, node, &key)
        }),
    };
    (seen, parsed)
}

/// The executable [`parse_early`] runs as `edgecore`'s [`HELPER_COMMAND`], when set.
static HELPER: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The hidden subcommand of `edgecore` that parses a manifests directory and writes what it
/// gave, in its stored form, to its standard output ([`helper`]).
pub const HELPER_COMMAND: &str = "parse-manifests";

/// Makes a first start's parse ([`parse_early`]) run in a process of its own: `exe` (this
/// edgecore's binary, `/proc/self/exe` where there is one, so that an upgrade renaming a new
/// binary over it changes nothing) with [`HELPER_COMMAND`]. Why: the parse of a gateway's
/// thousand devices is edgecore's largest burst of allocations (a 935 KB file: ~170,000 YAML
/// events, as many JSON values, then typed objects), and in edgecore all threads share one
/// malloc arena (`rt::sys::single_arena`), where the parse can use one core only and its
/// freed transients stay resident around what it made. The helper has glibc's arenas per
/// thread and parses a large file on every core (`api::manifest::parse_documents`); edgecore
/// reads its result back as a restart reads the stored one, and holds nothing of the burst.
/// Should the helper fail (it cannot start, it dies, its output does not read back), the
/// parse runs in edgecore as without a helper, and the start says so in its log.
pub fn parse_in_helper(exe: PathBuf) {
    let _ = HELPER.set(exe);
}

/// The exit code of [`HELPER_COMMAND`] when the directory cannot be listed: edgecore then
/// reads it itself, to say why where a start says it.
pub const HELPER_CANNOT_LIST: u8 = 3;

/// Why [`helper`] gave no result.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    #[error(transparent)]
    List(#[from] ListError),
    #[error("cannot write the result: {0}")]
    Write(std::io::Error),
}

/// [`HELPER_COMMAND`]'s work: parses `dir`'s manifests for `node` and writes the key of the
/// result and the result in its stored form, one line each, to standard output.
pub fn helper(dir: &Path, node: &str) -> Result<(), HelperError> {
    use std::io::Write;
    let inputs = read_inputs(dir)?;
    let key = cache::key(&inputs, node);
    let loaded = load_inputs(inputs, node);
    let text = cache::write(&loaded, &key);
    // The process ends once this is written: nothing to free.
    std::mem::forget(loaded);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{key}")
        .and_then(|()| writeln!(out, "{text}"))
        .and_then(|()| out.flush())
        .map_err(HelperError::Write)
}

/// Runs [`helper`] in `exe` and reads back what it wrote; `None` when it could not list the
/// directory.
fn in_helper(exe: &Path, dir: &Path, node: &str) -> Result<Option<(Loaded, String)>, String> {
    let out = std::process::Command::new(exe)
        .arg(HELPER_COMMAND)
        .arg("--node")
        .arg(node)
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start {} {HELPER_COMMAND}: {e}", exe.display()))?;
    if out.status.code() == Some(HELPER_CANNOT_LIST.into()) {
        return Ok(None);
    }
    if !out.status.success() {
        return Err(format!(
            "{} {HELPER_COMMAND}: {}",
            exe.display(),
            out.status
        ));
    }
    let text = String::from_utf8(out.stdout)
        .map_err(|_| format!("{HELPER_COMMAND} wrote a result that is not UTF-8"))?;
    let (key, stored) = (text.trim_end().split_once('\n'))
        .ok_or_else(|| format!("{HELPER_COMMAND} wrote no result"))?;
    let loaded = cache::read(stored, key)
        .ok_or_else(|| format!("{HELPER_COMMAND} wrote a result that does not read back"))?;
    Ok(Some((loaded, stored.to_string())))
}

/// What a start's parse of the manifests gave, in its stored form.
pub(crate) struct Parsed {
    text: String,
}

/// Stores what [`reload_at_start`] parsed, for the next start to read back.
pub(crate) async fn store_for_next_start(meta: &crate::meta::store::MetaStore, parsed: Parsed) {
    if let Err(e) = meta.save_manifests_cache(&parsed.text).await {
        tracing::warn!(error = %e, "cannot store the manifests' result for the next start (it parses them again)");
    }
}

/// Parses `inputs`; returns what they gave and its stored form, for the next start. What the
/// parse made lies among its freed transients, which would stay resident around it: so it is
/// written out, dropped and read back from that text as a restart reads it, and packs together
/// (with 1,000 devices a first start idles ~2.3 MB lower, a start after an upgrade ~4.4 MB).
/// Should the text not read back (it does: a test says so), the directory is parsed again.
fn load_packed(
    dir: &Path,
    inputs: Inputs,
    node: &str,
    key: &str,
) -> Result<(Loaded, String), ListError> {
    let loaded = load_inputs(inputs, node);
    let text = cache::write(&loaded, key);
    drop(loaded);
    match cache::read(&text, key) {
        Some(loaded) => Ok((loaded, text)),
        None => {
            tracing::warn!(dir = %dir.display(), "the manifests' result does not read back; parsing them again");
            Ok((load(dir, node)?, text))
        }
    }
}

/// Makes `loaded` the local source.
fn take(dir: &Path, loaded: Loaded, sources: &mut Sources) {
    log_loaded(dir, &loaded);
    let previous = sources.local.take().unwrap_or_default();
    // A device whose file turned invalid keeps its last valid definition (and its twin): a
    // typo in a manifest must not delete a device.
    let mut next = loaded.catalog;
    for (id, device) in &previous.devices {
        let origin = previous.origins.get(id);
        let kept =
            loaded.invalid.contains(id) || origin.is_some_and(|f| loaded.broken_files.contains(f));
        if kept && !next.devices.contains_key(id) {
            tracing::warn!(device = %id, "manifest of the device is invalid; keeping its last valid definition");
            next.devices.insert(id.clone(), device.clone());
            if let Some(o) = origin {
                next.origins.insert(id.clone(), o.clone());
            }
        }
    }
    let (devices, models) = (next.devices.len(), next.models.len());
    sources.local = Some(next);
    tracing::info!(dir = %dir.display(), devices, models, "loaded manifests");
}

/// The result of loading the manifests, stored from one start to the next.
mod cache {
    use super::{Inputs, Loaded};
    use crate::catalog::{Catalog, StoredDevice};
    use api::paths::DeviceId;
    use api::v1beta1::DeviceModel;
    use serde::{Deserialize, Serialize};

    /// What the result depends on: this edgecore (its version, and its binary's size and time,
    /// so that a rebuild with other validation rules parses again), the node's name, and every
    /// file's name and text (SHA-256, hex).
    pub(super) fn key(inputs: &Inputs, node: &str) -> String {
        let mut d = ring::digest::Context::new(&ring::digest::SHA256);
        let mut field = |b: &[u8]| {
            d.update(&(b.len() as u64).to_le_bytes());
            d.update(b);
        };
        field(env!("CARGO_PKG_VERSION").as_bytes());
        let binary = std::env::current_exe()
            .and_then(std::fs::metadata)
            .map(|m| format!("{} {:?}", m.len(), m.modified().ok()))
            .unwrap_or_default();
        field(binary.as_bytes());
        field(node.as_bytes());
        for (name, text) in &inputs.texts {
            field(name.as_bytes());
            field(text.as_bytes());
        }
        for p in &inputs.unreadable.problems {
            field(p.as_bytes());
        }
        d.finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    #[derive(Serialize, Deserialize)]
    struct Stored {
        key: String,
        /// `(namespace/name, effective device as JSON, file)`.
        devices: Vec<(String, String, Option<String>)>,
        models: Vec<DeviceModel>,
        /// Files of devices whose documents are invalid, by `namespace/name`.
        origins: Vec<(String, String)>,
        problems: Vec<String>,
        other_nodes: Vec<String>,
        invalid: Vec<String>,
        broken_files: Vec<String>,
    }

    pub(super) fn write(loaded: &Loaded, key: &str) -> String {
        let c = &loaded.catalog;
        let stored = Stored {
            key: key.to_string(),
            devices: (c.devices.iter())
                .map(|(id, d)| {
                    (
                        id.to_string(),
                        d.json().to_string(),
                        c.origins.get(id).cloned(),
                    )
                })
                .collect(),
            models: c.models.values().cloned().collect(),
            origins: (c.origins.iter())
                .filter(|(id, _)| !c.devices.contains_key(*id))
                .map(|(id, f)| (id.to_string(), f.clone()))
                .collect(),
            problems: loaded.problems.clone(),
            other_nodes: loaded.other_nodes.clone(),
            invalid: loaded.invalid.iter().map(DeviceId::to_string).collect(),
            broken_files: loaded.broken_files.iter().cloned().collect(),
        };
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// The stored result if it was stored under `key`; `None` otherwise or when any of it does
    /// not read back (then the files are parsed).
    pub(super) fn read(text: &str, key: &str) -> Option<Loaded> {
        let stored: Stored = serde_json::from_str(text).ok()?;
        if stored.key != key {
            return None;
        }
        let id = |s: &str| DeviceId::parse(s);
        let mut catalog = Catalog::default();
        for (i, json, origin) in stored.devices {
            let i = id(&i)?;
            if let Some(f) = origin {
                catalog.origins.insert(i.clone(), f);
            }
            catalog.devices.insert(i, StoredDevice::from_json(json));
        }
        for (i, f) in stored.origins {
            catalog.origins.insert(id(&i)?, f);
        }
        for m in stored.models {
            catalog
                .models
                .insert(crate::catalog::object_id(&m.metadata), m);
        }
        Some(Loaded {
            catalog,
            problems: stored.problems,
            other_nodes: stored.other_nodes,
            invalid: stored
                .invalid
                .iter()
                .map(|s| id(s))
                .collect::<Option<_>>()?,
            broken_files: stored.broken_files.into_iter().collect(),
        })
    }
}

/// Watches `dir`, applies the changes of every valid edit to the twin and then publishes them
/// to `changes`: a subscriber (the DMI mapper manager) sees the twin as the edit left it, so one
/// edit that changes a setting and a desired value together reaches a mapper as one
/// UpdateDevice carrying both.
///
/// `loaded` says whether the directory was read at start; until it has been, twins that the
/// manifests no longer declare are not removed (see [`prune_undeclared`]). `last` is the
/// directory's signature taken before the start read it ([`reload_at_start`]): a file changed
/// since is read again at once.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn watch(
    dir: PathBuf,
    node: String,
    interval: Duration,
    sources: SharedSources,
    sync: crate::meta::sync::CatalogSync,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    mut loaded: bool,
    mut last: Signature,
    cancel: CancellationToken,
) {
    let (catalog, twin) = (sync.catalog.clone(), sync.twin.clone());
    // A change is applied once the directory has looked the same for one more interval, so a
    // file caught half-written (truncated by an editor or `cp`, not yet refilled) is never
    // loaded: an empty file would otherwise remove its devices for a moment.
    let mut seen = last.clone();
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let now = signature(&dir);
        let settled = now == seen;
        seen = now.clone();
        if now == last || !settled {
            continue;
        }
        last = now;
        let mut src = sources.lock().await;
        match reload(&dir, &node, &mut src) {
            Ok(()) => metrics.set_manifests_error(None),
            Err(e) => {
                // Keep the last good set, and look again at the next poll.
                failed(&metrics, &catalog, &e);
                last = None;
                continue;
            }
        };
        let changes = sync.publish(&src).await;
        tracing::debug!(changes, "manifest changes published");
        drop(src);
        if !loaded {
            loaded = true;
            prune_undeclared(&twin, &catalog).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `load` gives and what the stored result reads back as are the same, problems and
    /// all; another key reads nothing back.
    #[test]
    fn the_stored_result_reads_back_as_the_load_gave_it() {
        let dir = tempfile::tempdir().expect("dir");
        let model = "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n    - {name: t, type: INT, accessMode: ReadWrite, minimum: \"0\", maximum: \"9\"}\n";
        let device = |name: &str, node: &str, desired: &str| {
            format!(
                "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  nodeName: {node}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 502}}}}\n  properties:\n    - {{name: t, desired: {{value: \"{desired}\"}}, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 1}}}}}}\n"
            )
        };
        let text = format!(
            "{model}{}{}{}",
            device("a", "n1", "5"),
            device("elsewhere", "n2", "5"),
            device("bad", "n1", "5").replace("name: t,", "name: unknown,")
        );
        std::fs::write(dir.path().join("devices.yaml"), text).expect("write");
        std::fs::write(dir.path().join("broken.yaml"), "kind: Device\nspec: [").expect("write");
        let inputs = read_inputs(dir.path()).expect("read");
        let key = cache::key(&inputs, "n1");
        let loaded = load_inputs(inputs, "n1");
        assert_eq!(loaded.catalog.devices.len(), 1, "{:?}", loaded.problems);
        assert!(!loaded.invalid.is_empty(), "{:?}", loaded.problems);
        assert!(!loaded.other_nodes.is_empty() && !loaded.broken_files.is_empty());
        let text = cache::write(&loaded, &key);
        let back = cache::read(&text, &key).expect("read back");
        assert_eq!(back.catalog, loaded.catalog);
        assert_eq!(back.problems, loaded.problems);
        assert_eq!(back.other_nodes, loaded.other_nodes);
        assert_eq!(back.invalid, loaded.invalid);
        assert_eq!(back.broken_files, loaded.broken_files);
        assert!(cache::read(&text, "another key").is_none());
        // Parsed and packed, it is the same as parsed.
        let (packed, stored) = load_packed(
            dir.path(),
            read_inputs(dir.path()).expect("read"),
            "n1",
            &key,
        )
        .expect("loads");
        assert_eq!(stored, text);
        assert_eq!(packed.catalog, loaded.catalog);
        assert_eq!(packed.problems, loaded.problems);
        assert_eq!(packed.invalid, loaded.invalid);
        // Another node, or one changed byte in a file, is another key.
        let inputs = read_inputs(dir.path()).expect("read");
        assert_ne!(cache::key(&inputs, "n2"), key);
        assert_eq!(cache::key(&inputs, "n1"), key);
        std::fs::write(dir.path().join("broken.yaml"), "kind: Device\nspec: {").expect("write");
        assert_ne!(
            cache::key(&read_inputs(dir.path()).expect("read"), "n1"),
            key
        );
    }

    /// A helper that cannot start, fails or writes no result leaves the parse to edgecore,
    /// which gives what it gives without a helper.
    #[test]
    fn a_helper_that_fails_leaves_the_parse_to_edgecore() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join("oven.yaml"),
            include_str!("../tests/common/manifests/oven.yaml"),
        )
        .expect("write");
        let (_, alone) = early_read(None, dir.path(), "test-node");
        let (alone, stored) = alone.expect("loads");
        assert_eq!(alone.catalog.devices.len(), 1);
        for exe in ["/no/such/edgecore", "/bin/false", "/bin/true", "/bin/echo"] {
            let exe = Path::new(exe);
            assert!(
                in_helper(exe, dir.path(), "test-node").is_err(),
                "{}",
                exe.display()
            );
            let (seen, parsed) = early_read(Some(exe), dir.path(), "test-node");
            let (parsed, text) = parsed.expect("loads");
            assert_eq!(parsed.catalog, alone.catalog, "{}", exe.display());
            assert_eq!(text, stored);
            assert_eq!(seen, signature(dir.path()));
        }
    }

    /// A file that changes after the start has read the directory, before its watcher runs, is
    /// read again by the watcher: it starts from the directory as the start read it, not as it
    /// is when it begins.
    #[tokio::test]
    async fn a_change_made_while_the_start_reads_is_applied() {
        let dir = tempfile::tempdir().expect("dir");
        let manifests = dir.path().join("manifests");
        std::fs::create_dir(&manifests).expect("mkdir");
        let model = "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata: {name: m, namespace: default}\nspec:\n  protocol: modbus\n  properties:\n    - {name: t, type: INT, accessMode: ReadWrite}\n";
        let device = |name: &str| {
            format!(
                "---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  deviceModelRef: {{name: m}}\n  protocol: {{protocolName: modbus, configData: {{ip: 127.0.0.1, port: 502}}}}\n  properties:\n    - {{name: t, visitors: {{protocolName: modbus, configData: {{register: HoldingRegister, offset: 1}}}}}}\n"
            )
        };
        let file = manifests.join("devices.yaml");
        std::fs::write(&file, format!("{model}{}", device("a"))).expect("write");
        let store = twin::Store::open(&dir.path().join("t.db"), twin::Synchronous::Normal)
            .await
            .expect("store");
        let twin = twin::TwinService::start(store, twin::Limits::default())
            .await
            .expect("twin");
        let meta = crate::meta::store::MetaStore::new(twin.store().clone());
        let catalog: SharedCatalog = Default::default();
        let sources: SharedSources = Default::default();
        let sync = crate::meta::sync::CatalogSync::new(twin.clone(), catalog.clone());
        let mut src = sources.lock().await;
        let (seen, read) = reload_at_start(&manifests, "n", &mut src, &meta, None).await;
        assert!(read.is_ok());
        sync.publish(&src).await;
        drop(src);
        let a = DeviceId::new("default", "a");
        assert!(twin.get(&a).await.expect("get").is_some());
        // Changed before the watcher begins (another size: seen whatever the clock's grain).
        std::fs::write(&file, format!("{model}{}{}", device("a"), device("b"))).expect("write");
        let cancel = CancellationToken::new();
        let watcher = tokio::spawn(watch(
            manifests,
            "n".into(),
            Duration::from_millis(20),
            sources,
            sync,
            Default::default(),
            true,
            seen,
            cancel.clone(),
        ));
        let b = DeviceId::new("default", "b");
        let mut found = false;
        for _ in 0..500 {
            if twin.get(&b).await.ok().flatten().is_some() {
                found = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        cancel.cancel();
        let _ = watcher.await;
        assert!(
            found,
            "the device added while the start read is not applied"
        );
    }
}
