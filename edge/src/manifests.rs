//! The local manifests directory: Device and DeviceModel YAML files (the same files `kectl
//! validate` checks) loaded at start and watched, so a gateway runs without any cloud. Invalid
//! objects are reported and skipped; a valid change applies without a restart.

use crate::catalog::object_id;
use crate::catalog::{Catalog, Change, SharedCatalog};
use api::paths::DeviceId;
use api::validate::set::validate_texts;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// The files of a directory with their modification times and sizes: what the watcher compares.
type Signature = Vec<(PathBuf, Option<SystemTime>, u64)>;

fn manifest_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("yaml" | "yml" | "json")
                )
        })
        .collect();
    files.sort();
    Ok(files)
}

fn signature(dir: &Path) -> Signature {
    manifest_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let meta = std::fs::metadata(&p).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.map(|m| m.len()).unwrap_or(0);
            (p, modified, len)
        })
        .collect()
}

/// What loading a directory gave: the valid objects for this node, and every problem found.
#[derive(Debug, Default)]
pub struct Loaded {
    pub catalog: Catalog,
    pub problems: Vec<String>,
    /// Devices skipped because their `spec.nodeName` names another node.
    pub other_nodes: Vec<String>,
    /// Devices declared in a document that has errors.
    pub invalid: BTreeSet<DeviceId>,
    /// Files that could not be read or parsed at all.
    pub broken_files: BTreeSet<String>,
}

/// Loads every manifest of `dir`. A missing directory is an empty set.
pub fn load(dir: &Path, node: &str) -> Loaded {
    let mut loaded = Loaded::default();
    let files = match manifest_files(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return loaded,
        Err(e) => {
            loaded
                .problems
                .push(format!("{}: cannot list manifests: {e}", dir.display()));
            return loaded;
        }
    };
    let mut inputs = Vec::new();
    for f in files {
        match std::fs::read_to_string(&f) {
            Ok(text) => inputs.push((f.display().to_string(), text)),
            Err(e) => {
                loaded
                    .problems
                    .push(format!("{}: cannot read: {e}", f.display()));
                loaded.broken_files.insert(f.display().to_string());
            }
        }
    }
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
    loaded
}

fn log_loaded(dir: &Path, loaded: &Loaded) {
    for p in &loaded.problems {
        tracing::warn!(dir = %dir.display(), "invalid manifest: {p}");
    }
    for d in &loaded.other_nodes {
        tracing::info!(device = %d, "device is bound to another node; skipped");
    }
}

/// Loads `dir` once into `catalog` and returns the changes from the previous content.
pub fn reload(dir: &Path, node: &str, catalog: &SharedCatalog) -> Vec<Change> {
    let loaded = load(dir, node);
    log_loaded(dir, &loaded);
    let mut current = crate::catalog::write(catalog);
    // A device whose file turned invalid keeps its last valid definition (and its twin): a
    // typo in a manifest must not delete a device.
    let mut next = loaded.catalog;
    for (id, device) in &current.devices {
        let origin = current.origins.get(id);
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
    let changes = current.diff(&next);
    *current = next;
    tracing::info!(
        dir = %dir.display(),
        devices = current.devices.len(),
        models = current.models.len(),
        changes = changes.len(),
        "loaded manifests"
    );
    changes
}

/// Watches `dir`, applies the changes of every valid edit to the twin and then publishes them
/// to `changes`: a subscriber (the DMI mapper manager) sees the twin as the edit left it, so one
/// edit that changes a setting and a desired value together reaches a mapper as one
/// UpdateDevice carrying both.
pub async fn watch(
    dir: PathBuf,
    node: String,
    interval: Duration,
    catalog: SharedCatalog,
    twin: twin::TwinService,
    changes: broadcast::Sender<Vec<Change>>,
    cancel: CancellationToken,
) {
    let mut last = signature(&dir);
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
        let diff = reload(&dir, &node, &catalog);
        if !diff.is_empty() {
            crate::app::apply_changes(&twin, &catalog, &diff).await;
            let _ = changes.send(diff);
        }
    }
}
