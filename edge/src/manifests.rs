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
type Signature = Option<Vec<(PathBuf, Option<SystemTime>, u64)>>;

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
pub(crate) struct ListError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Loads every manifest of `dir`. A directory that is missing or cannot be listed completely
/// is an error, never an empty set: an error while reading the source of truth is no evidence
/// that devices were deleted.
pub(crate) fn load(dir: &Path, node: &str) -> Result<Loaded, ListError> {
    let mut loaded = Loaded::default();
    let files = manifest_files(dir).map_err(|source| ListError {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut inputs = Vec::new();
    for f in files {
        match std::fs::read_to_string(&f) {
            Ok(text) => inputs.push((f.display().to_string(), text)),
            // Removed since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            // Unreadable (permissions, too many open files): its devices keep their last
            // valid definitions.
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
    Ok(loaded)
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
    let loaded = load(dir, node)?;
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
    Ok(())
}

/// Watches `dir`, applies the changes of every valid edit to the twin and then publishes them
/// to `changes`: a subscriber (the DMI mapper manager) sees the twin as the edit left it, so one
/// edit that changes a setting and a desired value together reaches a mapper as one
/// UpdateDevice carrying both.
///
/// `loaded` says whether the directory was read at start; until it has been, twins that the
/// manifests no longer declare are not removed (see [`prune_undeclared`]).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn watch(
    dir: PathBuf,
    node: String,
    interval: Duration,
    sources: SharedSources,
    sync: crate::meta::sync::CatalogSync,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    mut loaded: bool,
    cancel: CancellationToken,
) {
    let (catalog, twin) = (sync.catalog.clone(), sync.twin.clone());
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
