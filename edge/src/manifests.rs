//! The local manifests directory: Device and DeviceModel YAML files (the same files `kectl
//! validate` checks) loaded at start and watched, so a gateway runs without any cloud. Invalid
//! objects are reported and skipped; a valid change applies without a restart.

use crate::catalog::{Catalog, Change, SharedCatalog};
use api::validate::set::validate_texts;
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
            Err(e) => loaded
                .problems
                .push(format!("{}: cannot read: {e}", f.display())),
        }
    }
    let report = validate_texts(&inputs);
    loaded.problems.extend(
        report
            .findings
            .iter()
            .filter(|f| f.problem.is_error())
            .map(|f| format!("{f} (skipped)")),
    );
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
    loaded.catalog = Catalog::build(report.valid_models, devices);
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
    let mut current = match catalog.write() {
        Ok(c) => c,
        Err(poisoned) => poisoned.into_inner(),
    };
    let changes = current.diff(&loaded.catalog);
    *current = loaded.catalog;
    tracing::info!(
        dir = %dir.display(),
        devices = current.devices.len(),
        models = current.models.len(),
        changes = changes.len(),
        "loaded manifests"
    );
    changes
}

/// Watches `dir` and publishes the changes of every valid edit to `changes`.
pub async fn watch(
    dir: PathBuf,
    node: String,
    interval: Duration,
    catalog: SharedCatalog,
    changes: broadcast::Sender<Vec<Change>>,
    cancel: CancellationToken,
) {
    let mut last = signature(&dir);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let now = signature(&dir);
        if now == last {
            continue;
        }
        last = now;
        let diff = reload(&dir, &node, &catalog);
        if !diff.is_empty() {
            let _ = changes.send(diff);
        }
    }
}
