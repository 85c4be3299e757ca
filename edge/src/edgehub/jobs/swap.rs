//! The files of a job on this node, under `{dataDir}/upgrade/`: its state (`state.json`,
//! written whole and synced before it replaces the old one), the version the node runs
//! (`version`), the backup of the replaced file, and the renames that swap a file and put it
//! back. A kill at any point leaves the old state or the new one, and the old file or the new
//! one at edgecore's path, never neither.

use super::plan::{JobState, What};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The job's directory.
pub(crate) fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("upgrade")
}

/// The job's state, when there is one; one that cannot be read is ignored, saying so.
pub(crate) fn load(data_dir: &Path) -> Option<JobState> {
    let text = std::fs::read(dir(data_dir).join("state.json")).ok()?;
    match serde_json::from_slice(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "upgrade: upgrade/state.json is not readable; ignored");
            None
        }
    }
}

/// Writes `s`, whole and synced, over the old state.
pub(crate) fn save(data_dir: &Path, s: &JobState) -> Result<()> {
    let d = dir(data_dir);
    rt::fs::private_dir(&d)?;
    let text = serde_json::to_vec_pretty(s)?;
    write_synced(&d.join("state.json.tmp"), &text)?;
    std::fs::rename(d.join("state.json.tmp"), d.join("state.json"))?;
    sync_dir(&d);
    Ok(())
}

/// `bytes` written to `path` and synced.
pub(crate) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.sync_all()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Syncs a directory (its renames kept across a power cut); best effort.
pub(crate) fn sync_dir(d: &Path) {
    if let Ok(f) = std::fs::File::open(d) {
        let _ = f.sync_all();
    }
}

/// `from` renamed over `to`, and `to`'s directory synced.
pub(crate) fn swap_in(from: &Path, to: &Path) -> Result<()> {
    std::fs::rename(from, to)
        .with_context(|| format!("cannot put {} at {}", from.display(), to.display()))?;
    if let Some(parent) = to.parent() {
        sync_dir(parent);
    }
    Ok(())
}

/// The version this node runs: the release it was last upgraded to, else the build's own.
pub fn version(data_dir: &Path) -> String {
    std::fs::read_to_string(dir(data_dir).join("version"))
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| api::operations::valid_version(v))
        .unwrap_or_else(|| format!("v{}", env!("CARGO_PKG_VERSION")))
}

pub(crate) fn write_version(data_dir: &Path, v: &str) -> Result<()> {
    let d = dir(data_dir);
    let tmp = d.join("version.tmp");
    std::fs::write(&tmp, v).context("cannot write upgrade/version")?;
    std::fs::rename(&tmp, d.join("version")).context("cannot write upgrade/version")?;
    Ok(())
}

/// Puts the backup (`upgrade/edgecore.prev`, or `upgrade/edgecore.yaml.prev`) back at
/// `target`, and records the rollback in `s` for `why`. The error says why the rename failed
/// (it is recorded in the state too).
pub(crate) fn roll_back(data_dir: &Path, target: &Path, s: &mut JobState, why: &str) -> Result<()> {
    let prev = dir(data_dir).join(s.what.backup());
    let back = swap_in(&prev, target);
    s.step = super::plan::Step::RolledBack;
    s.reason = format!("{why}; rolled back to {}", s.from);
    if s.what == What::Binary {
        write_version(data_dir, &s.from)?;
    }
    s.act("RollBack", back.is_ok(), why);
    if let Err(e) = &back {
        s.reason = format!("{why}; the rollback failed: {e:#}");
    }
    save(data_dir, s)?;
    tracing::warn!(job = %s.job, reason = %s.reason, "upgrade: rolled back");
    back
}

/// For tests of a kill in the middle of the swap: `EDGECORE_UPGRADE_STEP_PAUSE_MS` pauses
/// before and after the rename.
pub(crate) fn step_pause() {
    if let Some(ms) = std::env::var("EDGECORE_UPGRADE_STEP_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edgehub::jobs::plan::Step;

    #[test]
    fn a_rollback_puts_the_backup_back_and_records_why() {
        let d = tempfile::tempdir().expect("tmp");
        let target = d.path().join("edgecore");
        std::fs::write(&target, "new").expect("new");
        std::fs::create_dir_all(dir(d.path())).expect("dir");
        std::fs::write(dir(d.path()).join("edgecore.prev"), "old").expect("old");
        let mut s = JobState::new(What::Binary, "up-1", "v2", "v1", 10);
        s.step = Step::Checking;
        roll_back(d.path(), &target, &mut s, "no session").expect("rolled back");
        assert_eq!(std::fs::read_to_string(&target).expect("target"), "old");
        assert_eq!(version(d.path()), "v1");
        let kept = load(d.path()).expect("state");
        assert_eq!(kept.step, Step::RolledBack);
        assert_eq!(kept.reason, "no session; rolled back to v1");
        assert_eq!(kept.actions.last().map(|a| a.status.as_str()), Some("True"));
    }

    #[test]
    fn a_rollback_without_a_backup_says_it_failed_in_the_state() {
        let d = tempfile::tempdir().expect("tmp");
        let target = d.path().join("edgecore.yaml");
        let mut s = JobState::new(What::Config, "cu-1", "v1", "its old config", 10);
        s.step = Step::Checking;
        assert!(roll_back(d.path(), &target, &mut s, "stopped").is_err());
        let kept = load(d.path()).expect("state");
        assert!(
            kept.reason
                .starts_with("stopped; the rollback failed: cannot put"),
            "{}",
            kept.reason
        );
        assert_eq!(
            kept.actions.last().map(|a| a.status.as_str()),
            Some("False")
        );
    }

    #[test]
    fn a_state_file_that_cannot_be_read_is_no_job() {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir(d.path())).expect("dir");
        std::fs::write(dir(d.path()).join("state.json"), "{").expect("bad");
        assert!(load(d.path()).is_none());
        std::fs::write(dir(d.path()).join("version"), "../x").expect("bad version");
        assert_eq!(version(d.path()), format!("v{}", env!("CARGO_PKG_VERSION")));
    }
}
