//! The fleet jobs' part on this node: image pre-pulls ([`prepull`]), upgrades of edgecore and
//! updates of its config, each after the job's `checkItems` ([`checks`]).
//!
//! An upgrade (`NodeUpgradeJob`, [`api::operations::Upgrade`]): the node answers `InProgress`
//! and works beside its session: it downloads the release from its certificate server with its
//! node certificate into `{dataDir}/upgrade/` ([`super::certserver::download`]), checks its
//! SHA-256, runs it once (`--version`: a binary that cannot start, for another machine or
//! truncated, stops here), keeps the running binary as `upgrade/edgecore.prev` (`BackUp`), then
//! renames the new one over its own path (atomic: the path holds the old or the new binary,
//! never neither, whenever edgecore is killed) and restarts into it (`exec`, same process id,
//! after a clean stop: [`Relaunch`]). The new edgecore reads `upgrade/state.json` first thing
//! at start ([`on_start`]); what it does then, and how its trial ends, are [`plan`]'s rules.
//! `upgrade/version` names the release it runs (the node's version: `kubectl get nodes` and
//! the fleet page) from its start on trial, and the old one again after a rollback. The cloud
//! asks again every few seconds; every answer comes from the state file ([`swap`]), so it
//! survives the restarts. A question for a job already done is answered from it again.
//!
//! A `ConfigUpdateJob` ([`api::operations::ConfigUpdate`]) goes the same way with the config
//! file in the binary's place: its fields set in the file's YAML ([`apply_fields`]), the result
//! parsed as edgecore parses it at start (a field that is not one, a bad value, and the job
//! fails naming it, nothing written), the file kept as `upgrade/edgecore.yaml.prev`, the new
//! one renamed over it, a restart, the same trial.

pub(crate) mod checks;
pub(crate) mod plan;
mod prepull;
mod swap;
mod watcher;

pub use swap::version;
pub use watcher::{Restart, stop_with_watcher};

use anyhow::{Context, Result, bail};
use api::message::Message;
use api::operations::{ConfigUpdate, NodePhase, Upgrade, UpgradeResult};
use plan::{AtStart, JobState, Step, Trial, What};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio_rustls::rustls::ClientConfig;
use tokio_util::sync::CancellationToken;

/// edgecore's own files, as the process was started, and whether it must start again: `main`
/// makes it first thing (before an upgrade could rename anything over the binary), the jobs ask
/// it, and `main` starts the binary again in its place after the program stopped.
#[derive(Debug, Default)]
pub struct Relaunch {
    /// The path this edgecore was started from.
    exe: Option<PathBuf>,
    /// The config file it was started with (none: it runs on the defaults).
    config: Option<PathBuf>,
    asked: AtomicBool,
}

impl Relaunch {
    /// This process's binary (`std::env::current_exe`, read before an upgrade could rename
    /// anything over it), and its config file when it has one.
    pub fn of_process(exe: Option<PathBuf>, config: Option<&Path>) -> Self {
        Self {
            exe,
            config: config.map(|f| std::path::absolute(f).unwrap_or_else(|_| f.to_path_buf())),
            asked: AtomicBool::new(false),
        }
    }

    /// The file `what` replaces.
    fn target(&self, what: What) -> Result<PathBuf> {
        match what {
            What::Binary => self.exe.clone().context("edgecore's own path is not known"),
            What::Config => self
                .config
                .clone()
                .context("edgecore's config file is not known"),
        }
    }

    /// Asks for a restart and stops the program (`stop`).
    fn ask(&self, stop: &CancellationToken) {
        self.asked.store(true, Ordering::SeqCst);
        stop.cancel();
    }

    /// edgecore ended with `error`: when it was on trial after an upgrade or a config update (a
    /// config that parses but cannot run: a port taken, a path it may not write), the old one
    /// is put back and a restart asked. True when it was.
    pub fn roll_back_after_failure(&self, data_dir: &Path, error: &str) -> bool {
        let rolled = self.roll_back_if(data_dir, |s| plan::stopped_on_trial(s, error));
        if rolled {
            self.asked.store(true, Ordering::SeqCst);
        }
        rolled
    }

    /// Puts the old file back when `why` gives a reason for the job in the state file; true when
    /// it did.
    fn roll_back_if(&self, data_dir: &Path, why: impl FnOnce(&JobState) -> Option<String>) -> bool {
        let Some(mut s) = swap::load(data_dir) else {
            return false;
        };
        let Some(why) = why(&s) else {
            return false;
        };
        let Ok(target) = self.target(s.what) else {
            return false;
        };
        swap::roll_back(data_dir, &target, &mut s, &why).is_ok()
    }

    /// When edgecore stopped to start again (upgraded or rolled back): `exec`s its binary with
    /// the same arguments. Returns only when it could not, saying why; `None` when no restart
    /// was asked.
    pub fn exec_if_asked(&self) -> Option<std::io::Error> {
        if !self.asked.load(Ordering::SeqCst) {
            return None;
        }
        let exe = self.exe.as_ref()?;
        use std::os::unix::process::CommandExt;
        tracing::info!(exe = %exe.display(), "edgecore: starting again");
        Some(
            std::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .exec(),
        )
    }
}

/// What the start of edgecore does about a job under way: `Some(seconds)` when this is the new
/// edgecore (or config) on trial ([`Jobs::trial`] then watches its session). A second start
/// during the trial rolls back here and asks a restart (`Err` is then what to stop with).
pub fn on_start(
    data_dir: &Path,
    relaunch: &Relaunch,
    stop: &CancellationToken,
) -> Result<Option<u32>> {
    let Some(mut s) = swap::load(data_dir) else {
        return Ok(None);
    };
    let running_new = s.step.under_way()
        && relaunch
            .target(s.what)
            .ok()
            .and_then(|t| pki::sha256_file(&t).ok())
            .is_some_and(|d| d == s.sha256);
    match plan::at_start(&s, running_new) {
        AtStart::Nothing => Ok(None),
        AtStart::NotSwapped { step, reason } => {
            s.step = step;
            s.reason = reason;
            swap::save(data_dir, &s)?;
            tracing::warn!(job = %s.job, reason = %s.reason, "upgrade: not upgraded");
            Ok(None)
        }
        AtStart::RollBack(why) => {
            s.starts += 1;
            swap::roll_back(data_dir, &relaunch.target(s.what)?, &mut s, &why)?;
            relaunch.ask(stop);
            bail!("rolled back: {why}; starting the old edgecore");
        }
        AtStart::Trial(seconds) => {
            s.starts += 1;
            s.step = Step::Checking;
            // The version this node says it runs (its session's node info) is the new one now.
            if s.what == What::Binary {
                swap::write_version(data_dir, &s.version)?;
            }
            swap::save(data_dir, &s)?;
            tracing::info!(job = %s.job, version = %s.version, seconds, "upgrade: the new edgecore starts; its session must be back in time");
            Ok(Some(seconds))
        }
    }
}

/// Whether `connected` turns true within `seconds` (the session's state, set by edgehub).
async fn session_back(mut connected: watch::Receiver<bool>, seconds: u32) -> bool {
    let wait = connected.wait_for(|up| *up);
    matches!(
        tokio::time::timeout(Duration::from_secs(seconds.into()), wait).await,
        Ok(Ok(_))
    )
}

/// The jobs of this node: their work, and the session's state a trial watches.
pub(crate) struct Jobs {
    data_dir: PathBuf,
    relaunch: Arc<Relaunch>,
    /// The program's stop, for a restart.
    stop: CancellationToken,
    /// Whether the session with the cloud is up (edgehub sets it).
    connected: watch::Sender<bool>,
    /// Upgrades and config updates downloading or checking, before a state file is written.
    working: Mutex<HashMap<String, UpgradeResult>>,
    /// Image pre-pull jobs running ([`prepull::AT_ONCE`] at most).
    prepulls: Arc<tokio::sync::Semaphore>,
    /// The container runtime, when edged runs (what a pre-pull pulls into).
    runtime: Option<Arc<edged::Runtime>>,
}

impl Jobs {
    pub(crate) fn new(
        data_dir: PathBuf,
        relaunch: Arc<Relaunch>,
        stop: CancellationToken,
        runtime: Option<Arc<edged::Runtime>>,
    ) -> Self {
        Self {
            data_dir,
            relaunch,
            stop,
            connected: watch::channel(false).0,
            working: Mutex::new(HashMap::new()),
            prepulls: Arc::new(tokio::sync::Semaphore::new(prepull::AT_ONCE)),
            runtime,
        }
    }

    /// The session with the cloud went up or down.
    pub(crate) fn session(&self, up: bool) {
        self.connected.send_replace(up);
    }

    /// The new edgecore's trial ([`on_start`]'s seconds): `Successful` once the session is back,
    /// else rolled back and restarted into the old one.
    pub(crate) async fn trial(self: Arc<Self>, seconds: u32) {
        let back = session_back(self.connected.subscribe(), seconds).await;
        let Some(mut s) = swap::load(&self.data_dir) else {
            return;
        };
        match plan::trial_ended(&s, back) {
            Trial::Passed { action, reason } => {
                s.step = Step::Successful;
                s.reason = reason.clone();
                s.act(action, true, reason);
                match swap::save(&self.data_dir, &s) {
                    Ok(()) => tracing::info!(job = %s.job, version = %s.version, "upgrade: done"),
                    Err(e) => tracing::warn!(
                        error = format!("{e:#}"),
                        "upgrade: cannot record the upgrade"
                    ),
                }
            }
            Trial::RollBack(why) => {
                let back = self
                    .relaunch
                    .target(s.what)
                    .and_then(|t| swap::roll_back(&self.data_dir, &t, &mut s, &why));
                match back {
                    Ok(()) => self.relaunch.ask(&self.stop),
                    Err(e) => tracing::warn!(error = format!("{e:#}"), "upgrade: rollback failed"),
                }
            }
        }
    }

    /// The answer to a job's question (`operations/{kind}/{job}`): `None` when `kind` is not a
    /// job's; the pre-pull's answer may come later, through `later`. An upgrade downloads from
    /// the session's certificate server with its TLS client (`link`; none yet: `InProgress`).
    pub(crate) fn answer(
        self: &Arc<Self>,
        kind: &str,
        job: &str,
        msg: &Message,
        link: Option<(String, Arc<ClientConfig>)>,
        later: &tokio::sync::mpsc::Sender<Message>,
    ) -> Option<Message> {
        let result = match kind {
            api::operations::IMAGE_PREPULL => {
                return prepull::start(
                    self.runtime.clone(),
                    self.data_dir.clone(),
                    &self.prepulls,
                    msg,
                    later.clone(),
                );
            }
            api::operations::NODE_UPGRADE => {
                match (serde_json::from_value(msg.content.clone()), link) {
                    (Ok(q), Some((cert_server, tls))) => self.upgrade(job, q, &cert_server, tls),
                    (Err(e), _) => self.not_understood(&e),
                    (_, None) => UpgradeResult {
                        phase: NodePhase::InProgress,
                        reason: "connecting".into(),
                        current_version: version(&self.data_dir),
                        historic_version: String::new(),
                        action_flow: Vec::new(),
                    },
                }
            }
            api::operations::CONFIG_UPDATE => match serde_json::from_value(msg.content.clone()) {
                Ok(q) => self.configure(job, q),
                Err(e) => self.not_understood(&e),
            },
            _ => return None,
        };
        let mut answer = msg.response(serde_json::to_value(&result).unwrap_or_default());
        answer.route.source = "edgehub".into();
        Some(answer)
    }

    fn not_understood(&self, e: &serde_json::Error) -> UpgradeResult {
        UpgradeResult {
            phase: NodePhase::Failure,
            reason: format!("the job's question is not understood here: {e}"),
            current_version: version(&self.data_dir),
            historic_version: String::new(),
            action_flow: Vec::new(),
        }
    }

    fn working(&self) -> std::sync::MutexGuard<'_, HashMap<String, UpgradeResult>> {
        self.working.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `job`'s answer when it has one here: from its state file, else from its work before it.
    fn known(&self, job: &str) -> Option<UpgradeResult> {
        if let Some(s) = swap::load(&self.data_dir).filter(|s| s.job == job) {
            return Some(s.result());
        }
        self.working().get(job).cloned()
    }

    /// Whether another job is under way here (working, or between its swap and its check).
    /// (A job whose work failed stays in `working` with its answer.)
    fn busy(&self) -> bool {
        self.working()
            .values()
            .any(|r| r.phase == NodePhase::InProgress)
            || swap::load(&self.data_dir).is_some_and(|s| s.step.under_way())
    }

    /// The end of a job's work beside the session: a restart when it is ready, else the
    /// job's answer says why not.
    fn finished(&self, job: &str, current: &str, done: Result<()>, s: &JobState) {
        match done {
            Ok(()) => {
                self.working().remove(job);
                self.relaunch.ask(&self.stop);
            }
            Err(e) => {
                let why = format!("{e:#}");
                tracing::warn!(%job, reason = %why, "upgrade: not done");
                let mut r = plan::failed(current, why);
                r.action_flow = s.actions.clone();
                self.working().insert(job.to_string(), r);
            }
        }
    }

    /// A `NodeUpgradeJob`'s question: its answer from its state when it has one here, else
    /// the upgrade starts (download from `cert_server` with `tls`).
    fn upgrade(
        self: &Arc<Self>,
        job: &str,
        q: Upgrade,
        cert_server: &str,
        tls: Arc<ClientConfig>,
    ) -> UpgradeResult {
        if let Some(r) = self.known(job) {
            return r;
        }
        let current = version(&self.data_dir);
        if let Some(refused) = plan::refuse_upgrade(&current, &q, self.busy()) {
            return refused;
        }
        let first = UpgradeResult {
            phase: NodePhase::InProgress,
            reason: format!("downloading {}", q.version),
            current_version: current.clone(),
            historic_version: current.clone(),
            action_flow: Vec::new(),
        };
        let mut s = JobState::new(What::Binary, job, &q.version, &current, q.health_seconds);
        s.sha256 = q.sha256.clone();
        self.working().insert(job.to_string(), first.clone());
        let (me, job, base) = (self.clone(), job.to_string(), cert_server.to_string());
        tokio::spawn(async move {
            let done = me.prepare(&base, tls, &q, &mut s).await;
            me.finished(&job, &current, done, &s);
        });
        first
    }

    /// A check that failed: recorded in `s`, and the error.
    fn refused(s: &mut JobState, e: anyhow::Error) -> anyhow::Error {
        s.act("Check", false, format!("{e:#}"));
        e
    }

    /// Download, check, back up, swap: ready to restart into the new edgecore.
    async fn prepare(
        &self,
        base: &str,
        tls: Arc<ClientConfig>,
        q: &Upgrade,
        s: &mut JobState,
    ) -> Result<()> {
        let d = swap::dir(&self.data_dir);
        rt::fs::private_dir(&d)?;
        let exe = self.relaunch.target(What::Binary)?;
        let checked = checks::run(&q.check_items, &self.data_dir)
            .await
            .map_err(|why| Self::refused(s, anyhow::anyhow!("checkItems: {why}")))?;
        let new = d.join(format!("edgecore-{}", q.version));
        let got = match super::certserver::download(base, &q.path, tls, &new).await {
            Ok(digest) if digest == q.sha256 => Ok(()),
            Ok(digest) => Err(anyhow::anyhow!(
                "the release's SHA-256 is {digest}, not {} as the job says",
                q.sha256
            )),
            Err(e) => Err(e),
        };
        if let Err(e) = got {
            let _ = std::fs::remove_file(&new);
            return Err(Self::refused(s, e));
        }
        let said = runs(&new).await.map_err(|e| Self::refused(s, e))?;
        s.act(
            "Check",
            true,
            format!("SHA-256 matches; it runs ({said}){}", also(&checked)),
        );
        let prev = d.join(What::Binary.backup());
        let _ = std::fs::remove_file(&prev);
        if std::fs::hard_link(&exe, &prev).is_err() {
            std::fs::copy(&exe, &prev)
                .with_context(|| format!("cannot keep {} as {}", exe.display(), prev.display()))?;
        }
        swap::sync_dir(&d);
        s.act(
            "BackUp",
            true,
            format!("{} kept as upgrade/edgecore.prev", s.from),
        );
        self.swap(s, &new, &exe, format!("restarting into {}", q.version))
    }

    /// The state saved as `Swapping`, `new` renamed over `target`, the state `Restarting`.
    fn swap(&self, s: &mut JobState, new: &Path, target: &Path, restarting: String) -> Result<()> {
        s.step = Step::Swapping;
        swap::save(&self.data_dir, s)?;
        swap::step_pause();
        swap::swap_in(new, target)?;
        swap::step_pause();
        s.step = Step::Restarting;
        s.reason = restarting;
        swap::save(&self.data_dir, s)?;
        tracing::info!(job = %s.job, what = ?s.what, "upgrade: replaced; restarting");
        Ok(())
    }

    /// A `ConfigUpdateJob`'s question: its answer from its state when it has one here, else
    /// the update starts.
    fn configure(self: &Arc<Self>, job: &str, q: ConfigUpdate) -> UpgradeResult {
        if let Some(r) = self.known(job) {
            return r;
        }
        let current = version(&self.data_dir);
        if self.busy() {
            return plan::failed(
                &current,
                "another upgrade or config update is under way on this node".into(),
            );
        }
        let Ok(file) = self.relaunch.target(What::Config) else {
            return plan::failed(
                &current,
                "edgecore runs on its defaults (no --config file): there is no config to update"
                    .into(),
            );
        };
        let first = UpgradeResult {
            phase: NodePhase::InProgress,
            reason: "checking the new config".into(),
            current_version: current.clone(),
            historic_version: current.clone(),
            action_flow: Vec::new(),
        };
        let mut s = JobState::new(
            What::Config,
            job,
            &current,
            "its old config",
            q.health_seconds,
        );
        self.working().insert(job.to_string(), first.clone());
        let (me, job) = (self.clone(), job.to_string());
        tokio::spawn(async move {
            let done = me.prepare_config(&file, &q, &mut s).await;
            me.finished(&job, &current, done, &s);
        });
        first
    }

    /// Check, write beside, back up, swap: ready to restart on the new config.
    async fn prepare_config(&self, file: &Path, q: &ConfigUpdate, s: &mut JobState) -> Result<()> {
        let d = swap::dir(&self.data_dir);
        rt::fs::private_dir(&d)?;
        let checked = checks::run(&q.check_items, &self.data_dir)
            .await
            .map_err(|why| Self::refused(s, anyhow::anyhow!("checkItems: {why}")))?;
        let new = self
            .new_config(file, q)
            .map_err(|why| Self::refused(s, anyhow::anyhow!("the new config: {why}")))?;
        let fields: Vec<&str> = q.update_fields.keys().map(String::as_str).collect();
        s.act(
            "Check",
            true,
            format!(
                "the new config parses ({}){}",
                fields.join(", "),
                also(&checked)
            ),
        );
        let staged = d.join("edgecore.yaml.new");
        swap::write_synced(&staged, new.as_bytes())?;
        // The config keeps its owner's permissions.
        if let Ok(m) = std::fs::metadata(file) {
            let _ = std::fs::set_permissions(&staged, m.permissions());
        }
        s.sha256 = pki::sha256_file(&staged)
            .with_context(|| format!("cannot read {}", staged.display()))?;
        let prev = d.join(What::Config.backup());
        std::fs::copy(file, &prev)
            .with_context(|| format!("cannot keep {} as {}", file.display(), prev.display()))?;
        swap::sync_dir(&d);
        s.act(
            "BackUp",
            true,
            "the old config kept as upgrade/edgecore.yaml.prev",
        );
        self.swap(s, &staged, file, "restarting on the new config".into())
    }

    /// The config `file` with `q`'s fields set, parsed as edgecore parses it at start.
    fn new_config(
        &self,
        file: &Path,
        q: &ConfigUpdate,
    ) -> std::result::Result<String, ConfigError> {
        let old = std::fs::read_to_string(file).map_err(|e| ConfigError::Unreadable {
            file: file.display().to_string(),
            error: e.to_string(),
        })?;
        let new = apply_fields(&old, &q.update_fields)?;
        let base = file.parent().unwrap_or(Path::new("."));
        let parsed = crate::config::Config::parse(&new, file, base)
            .map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let real = |p: &Path| {
            std::fs::canonicalize(p)
                .or_else(|_| std::path::absolute(p))
                .unwrap_or_else(|_| p.to_path_buf())
        };
        if real(&parsed.data_dir) != real(&self.data_dir) {
            return Err(ConfigError::DataDir);
        }
        Ok(new)
    }
}

/// `; {checked}`, or nothing when no check item was asked.
fn also(checked: &str) -> String {
    if checked.is_empty() {
        String::new()
    } else {
        format!("; {checked}")
    }
}

/// Runs a new binary once: it must start and say what it is (`--version`, within 20 s).
async fn runs(new: &Path) -> Result<String> {
    let trial = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(new).arg("--version").output(),
    )
    .await;
    match trial {
        Ok(Ok(o)) if o.status.success() => {
            Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
        }
        Ok(Ok(o)) => bail!(
            "the new edgecore does not run: --version ended with {}",
            o.status
        ),
        Ok(Err(e)) => bail!("the new edgecore does not run: {e}"),
        Err(_) => bail!("the new edgecore's --version did not end within 20 s"),
    }
}

/// Why a config update's new config is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {file}: {error}")]
    Unreadable { file: String, error: String },
    #[error("the config is not YAML: {0}")]
    NotYaml(String),
    #[error("{0:?} is not a field path (names joined by dots)")]
    NotAPath(String),
    #[error("{path}: {through} is not a mapping in the config")]
    NotAMapping { path: String, through: String },
    #[error("{0}")]
    Invalid(String),
    #[error("dataDir cannot be changed by a job (the twins and this job's state are kept there)")]
    DataDir,
}

/// `fields` set in the YAML `text` (each by its dotted path, its value read as YAML: `20` a
/// number, `true` a boolean, `[a, b]` a list, anything else a string), written back as YAML.
/// Mappings along a path are made where missing; a path through something that is not one is
/// refused, naming it. (Comments are not kept.)
pub fn apply_fields(
    text: &str,
    fields: &std::collections::BTreeMap<String, String>,
) -> std::result::Result<String, ConfigError> {
    use serde_yaml_ng::{Mapping, Value};
    let mut doc: Value = if text.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::NotYaml(e.to_string()))?
    };
    for (path, value) in fields {
        let parts: Vec<&str> = path.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(ConfigError::NotAPath(path.clone()));
        }
        let v: Value =
            serde_yaml_ng::from_str(value).unwrap_or_else(|_| Value::String(value.clone()));
        let mut at = &mut doc;
        for (i, part) in parts.iter().enumerate() {
            if at.is_null() {
                *at = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(m) = at else {
                return Err(ConfigError::NotAMapping {
                    path: path.clone(),
                    through: parts[..i].join("."),
                });
            };
            let key = Value::String((*part).to_string());
            if i + 1 == parts.len() {
                m.insert(key, v.clone());
                break;
            }
            at = m.entry(key).or_insert(Value::Null);
        }
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| ConfigError::NotYaml(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|&(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn fields_are_set_by_their_path_as_yaml_values() {
        let text = "node: {name: gw-1}\ncloud:\n  metricsSeconds: 15\n";
        let out = apply_fields(
            text,
            &fields(&[
                ("cloud.metricsSeconds", "30"),
                ("cloud.streams.enable", "false"),
                ("node.labels", "[a, b]"),
                ("node.name", "gw-2"),
            ]),
        )
        .expect("applied");
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&out).expect("yaml");
        assert_eq!(v["cloud"]["metricsSeconds"], serde_yaml_ng::Value::from(30));
        assert_eq!(
            v["cloud"]["streams"]["enable"],
            serde_yaml_ng::Value::from(false)
        );
        assert_eq!(v["node"]["name"], serde_yaml_ng::Value::from("gw-2"));
        assert_eq!(v["node"]["labels"][1], serde_yaml_ng::Value::from("b"));
        // An empty file takes fields too.
        assert!(
            apply_fields("", &fields(&[("a.b", "1")]))
                .expect("empty")
                .contains("b: 1")
        );
        // A path through a value, or with an empty name: refused, named.
        assert_eq!(
            apply_fields(text, &fields(&[("node.name.first", "x")]))
                .expect_err("through")
                .to_string(),
            "node.name.first: node.name is not a mapping in the config"
        );
        assert!(matches!(
            apply_fields(text, &fields(&[("cloud..x", "1")])),
            Err(ConfigError::NotAPath(_))
        ));
        assert!(matches!(
            apply_fields("a: [", &fields(&[])),
            Err(ConfigError::NotYaml(_))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn the_trial_passes_when_the_session_is_back_before_its_time() {
        let (tx, rx) = watch::channel(false);
        let watching = tokio::spawn(session_back(rx, 30));
        tokio::time::sleep(Duration::from_secs(29)).await;
        tx.send_replace(true);
        assert!(watching.await.expect("task"));
    }

    #[tokio::test(start_paused = true)]
    async fn the_trial_fails_when_its_time_ends_without_a_session() {
        let (tx, rx) = watch::channel(false);
        let started = tokio::time::Instant::now();
        assert!(!session_back(rx, 30).await);
        assert_eq!(started.elapsed(), Duration::from_secs(30));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_up_when_the_trial_starts_passes_it_at_once() {
        let (_tx, rx) = watch::channel(true);
        let started = tokio::time::Instant::now();
        assert!(session_back(rx, 30).await);
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    /// A config update swapped in: the new config in place, the old one kept, its state.
    fn config_update_swapped() -> (tempfile::TempDir, PathBuf, JobState) {
        let d = tempfile::tempdir().expect("tmp");
        let config = d.path().join("edgecore.yaml");
        std::fs::write(&config, "new").expect("config");
        std::fs::create_dir_all(swap::dir(d.path())).expect("dir");
        std::fs::write(swap::dir(d.path()).join("edgecore.yaml.prev"), "old").expect("prev");
        let s = JobState::new(What::Config, "cu-1", "v1", "its old config", 10);
        (d, config, s)
    }

    /// An edgecore that ends with an error on trial puts the old config back and asks a
    /// restart; one that ends after its trial passed does not.
    #[test]
    fn a_failure_on_trial_rolls_back_and_asks_a_restart() {
        let (d, config, mut s) = config_update_swapped();
        s.step = Step::Checking;
        s.starts = 1;
        swap::save(d.path(), &s).expect("save");
        let relaunch = Relaunch::of_process(None, Some(&config));
        assert!(relaunch.roll_back_after_failure(d.path(), "port taken"));
        assert!(relaunch.asked.load(Ordering::SeqCst));
        assert_eq!(std::fs::read_to_string(&config).expect("config"), "old");
        let kept = swap::load(d.path()).expect("state");
        assert_eq!(kept.step, Step::RolledBack);
        assert!(
            kept.reason
                .starts_with("edgecore on its new config stopped: port taken")
        );
        // Done: a second failure finds nothing on trial.
        let again = Relaunch::of_process(None, Some(&config));
        assert!(!again.roll_back_after_failure(d.path(), "later"));
        assert!(!again.asked.load(Ordering::SeqCst));
    }

    /// A second start during the trial rolls back at start, before anything else runs.
    #[test]
    fn a_second_start_on_trial_rolls_back_before_it_runs() {
        let (d, config, mut s) = config_update_swapped();
        s.sha256 = pki::sha256_file(&config).expect("digest");
        s.step = Step::Restarting;
        swap::save(d.path(), &s).expect("save");
        let relaunch = Relaunch::of_process(None, Some(&config));
        let stop = CancellationToken::new();
        assert_eq!(
            on_start(d.path(), &relaunch, &stop).expect("first"),
            Some(10)
        );
        assert_eq!(swap::load(d.path()).expect("state").step, Step::Checking);
        assert!(!stop.is_cancelled());
        let err = on_start(d.path(), &relaunch, &stop).expect_err("second");
        assert!(
            err.to_string().contains("stopped during its health check"),
            "{err}"
        );
        assert!(stop.is_cancelled() && relaunch.asked.load(Ordering::SeqCst));
        assert_eq!(std::fs::read_to_string(&config).expect("config"), "old");
    }
}
