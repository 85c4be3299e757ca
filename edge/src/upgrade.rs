//! A `NodeUpgradeJob`'s part on this node: edgecore replaced by a release, proved, or rolled
//! back by itself.
//!
//! 1. The cloud asks (`operations/nodeupgradejob/{job}`, [`api::operations::Upgrade`]); the node
//!    answers `InProgress` and works beside its session: it downloads the release from its
//!    certificate server with its node certificate into `{dataDir}/upgrade/`, checks its SHA-256,
//!    runs it once (`--version`: a binary that cannot start, for another machine or truncated,
//!    stops here), keeps the running binary as `upgrade/edgecore.prev` (`BackUp`), then renames
//!    the new one over its own path (atomic: the path holds the old or the new binary, never
//!    neither, whenever edgecore is killed) and restarts into it (`exec`, same process id, after
//!    a clean stop).
//! 2. The new edgecore reads `upgrade/state.json` first thing at start: when it is the release
//!    (its own SHA-256), it has `healthSeconds` to get its session with the cloud back; then the
//!    job is `Successful`. `upgrade/version` names the release it runs (the node's version:
//!    `kubectl get nodes` and the fleet page) from its start on trial, and the old one again
//!    after a rollback. Otherwise it renames `edgecore.prev` back and
//!    restarts into the old one (`RollBack`); so does a new edgecore started a second time while
//!    its check was going (it stopped during it).
//! 3. The cloud asks again every few seconds; every answer comes from the state file, so it
//!    survives the restarts. A question for a job already done is answered from it again.
//!
//! A `ConfigUpdateJob` ([`api::operations::ConfigUpdate`]) goes the same way with the config
//! file in the binary's place: its fields set in the file's YAML ([`apply_fields`]), the result
//! parsed as edgecore parses it at start (a field that is not one, a bad value, and the job
//! fails naming it, nothing written), the file kept as `upgrade/edgecore.yaml.prev`, the new
//! one renamed over it, a restart; the session must be back within `healthSeconds`, or the old
//! file is put back and edgecore restarts on it.

use anyhow::{Context, Result, bail};
use api::operations::{Action, ConfigUpdate, NodePhase, Upgrade, UpgradeResult};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The path this edgecore was started from (read before anything can replace it).
static EXE: OnceLock<PathBuf> = OnceLock::new();
/// The config file this edgecore was started with (none: it runs on the defaults).
static CONFIG: OnceLock<PathBuf> = OnceLock::new();
/// Set when edgecore must start again from [`EXE`] once it has stopped.
static RESTART: AtomicBool = AtomicBool::new(false);
/// The whole program's stop.
static SHUTDOWN: OnceLock<CancellationToken> = OnceLock::new();

/// Where this edgecore runs from; called first thing in `main`.
pub fn remember_exe() {
    if let Ok(p) = std::env::current_exe() {
        let _ = EXE.set(p);
    }
}

/// The config file edgecore runs with (`--config`), for a `ConfigUpdateJob`; called in `main`.
pub fn remember_config(file: &Path) {
    let _ = CONFIG.set(std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf()));
}

/// edgecore ended with an error while on trial after a config update or an upgrade (a config
/// that parses but cannot run: a port taken, a path it may not write): the old one is put back
/// and `main` restarts into it ([`restart_if_asked`]). True when it did.
pub fn roll_back_after_failure(data_dir: &Path, error: &str) -> bool {
    let Some(mut s) = load(data_dir).filter(|s| s.step == Step::Checking) else {
        return false;
    };
    let why = format!("{} stopped: {error}", s.on_trial());
    if roll_back(data_dir, &mut s, &why).is_err() {
        return false;
    }
    RESTART.store(true, Ordering::SeqCst);
    true
}

/// The program's stop, for an upgrade to restart it.
pub(crate) fn set_shutdown(token: CancellationToken) {
    let _ = SHUTDOWN.set(token);
}

/// Whether edgecore stopped to start again (upgraded or rolled back): `main` then `exec`s
/// [`EXE`] with its arguments. The error says why it could not.
pub fn restart_if_asked() -> Option<std::io::Error> {
    if !RESTART.load(Ordering::SeqCst) {
        return None;
    }
    let exe = EXE.get()?;
    use std::os::unix::process::CommandExt;
    tracing::info!(exe = %exe.display(), "edgecore: starting again");
    Some(
        std::process::Command::new(exe)
            .args(std::env::args_os().skip(1))
            .exec(),
    )
}

fn restart() {
    RESTART.store(true, Ordering::SeqCst);
    if let Some(t) = SHUTDOWN.get() {
        t.cancel();
    }
}

/// Where an upgrade's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Step {
    /// Downloaded and checked; the binary is being replaced.
    Swapping,
    /// Replaced; edgecore restarts into it.
    Restarting,
    /// The new edgecore runs and waits for its session.
    Checking,
    Successful,
    RolledBack,
    Failed,
}

/// What a job replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
enum What {
    /// edgecore's binary (`NodeUpgradeJob`).
    #[default]
    Binary,
    /// Its config file (`ConfigUpdateJob`).
    Config,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct State {
    #[serde(default)]
    what: What,
    job: String,
    version: String,
    sha256: String,
    from: String,
    step: Step,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    starts: u32,
    health_seconds: u32,
    #[serde(default)]
    actions: Vec<Action>,
}

impl State {
    fn result(&self) -> UpgradeResult {
        let (phase, current) = match self.step {
            Step::Successful => (NodePhase::Successful, self.version.clone()),
            Step::RolledBack | Step::Failed => (NodePhase::Failure, self.from.clone()),
            _ => (NodePhase::InProgress, self.from.clone()),
        };
        UpgradeResult {
            phase,
            reason: self.reason.clone(),
            current_version: current,
            historic_version: self.from.clone(),
            action_flow: self.actions.clone(),
        }
    }

    /// What runs on trial, in words.
    fn on_trial(&self) -> String {
        match self.what {
            What::Binary => format!("the new edgecore ({})", self.version),
            What::Config => "edgecore on its new config".into(),
        }
    }

    /// The file replaced and the replacement's path.
    fn target(&self) -> Result<PathBuf> {
        match self.what {
            What::Binary => EXE
                .get()
                .cloned()
                .context("edgecore's own path is not known"),
            What::Config => CONFIG
                .get()
                .cloned()
                .context("edgecore's config file is not known"),
        }
    }

    fn act(&mut self, action: &str, ok: bool, reason: impl Into<String>) {
        self.actions
            .push(Action::at(action, ok, reason, std::time::SystemTime::now()));
    }
}

fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join("upgrade")
}

fn load(data_dir: &Path) -> Option<State> {
    let text = std::fs::read(dir(data_dir).join("state.json")).ok()?;
    match serde_json::from_slice(&text) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "upgrade: upgrade/state.json is not readable; ignored");
            None
        }
    }
}

/// Written whole and synced before it replaces the old one: a kill leaves one or the other.
fn save(data_dir: &Path, s: &State) -> Result<()> {
    let d = dir(data_dir);
    rt::fs::private_dir(&d)?;
    let tmp = d.join("state.json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).with_context(|| format!("{}", tmp.display()))?;
        f.write_all(&serde_json::to_vec_pretty(s)?)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, d.join("state.json"))?;
    sync_dir(&d);
    Ok(())
}

fn sync_dir(d: &Path) {
    if let Ok(f) = std::fs::File::open(d) {
        let _ = f.sync_all();
    }
}

/// The version this node runs: the release it was last upgraded to, else the build's own.
pub fn version(data_dir: &Path) -> String {
    std::fs::read_to_string(dir(data_dir).join("version"))
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| api::operations::valid_version(v))
        .unwrap_or_else(|| format!("v{}", env!("CARGO_PKG_VERSION")))
}

fn write_version(data_dir: &Path, v: &str) -> Result<()> {
    let d = dir(data_dir);
    let tmp = d.join("version.tmp");
    std::fs::write(&tmp, v).context("cannot write upgrade/version")?;
    std::fs::rename(&tmp, d.join("version")).context("cannot write upgrade/version")?;
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).with_context(|| format!("{}", path.display()))?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the start of edgecore does about an upgrade under way: `Some(seconds)` when this is
/// the new edgecore on trial (its session must be back within them: [`watch_health`]). A new
/// edgecore started a second time during its trial rolls back here and restarts (`Err` is
/// then what to stop with).
pub fn on_start(data_dir: &Path) -> Result<Option<u32>> {
    let Some(mut s) = load(data_dir) else {
        return Ok(None);
    };
    if !matches!(s.step, Step::Swapping | Step::Restarting | Step::Checking) {
        return Ok(None);
    }
    let running_new = sha256_file(&s.target()?).is_ok_and(|d| d == s.sha256);
    if !running_new {
        // The swap did not happen (killed before the rename), or a rollback's rename did.
        let (step, reason) = match (s.step, s.what) {
            (Step::Swapping, What::Binary) => (
                Step::Failed,
                format!(
                    "edgecore stopped before its binary was replaced; {} kept",
                    s.from
                ),
            ),
            (Step::Swapping, What::Config) => (
                Step::Failed,
                "edgecore stopped before its config was replaced; the old config kept".into(),
            ),
            (_, What::Binary) => (
                Step::RolledBack,
                format!("the old edgecore ({}) runs again", s.from),
            ),
            (_, What::Config) => (
                Step::RolledBack,
                "edgecore runs on its old config again".into(),
            ),
        };
        s.step = step;
        s.reason = reason;
        save(data_dir, &s)?;
        tracing::warn!(job = %s.job, reason = %s.reason, "upgrade: not upgraded");
        return Ok(None);
    }
    s.starts += 1;
    if s.step == Step::Checking && s.starts > 1 {
        let why = format!("{} stopped during its health check", s.on_trial());
        roll_back(data_dir, &mut s, &why)?;
        restart();
        bail!("rolled back: {why}; starting the old edgecore");
    }
    s.step = Step::Checking;
    // The version this node says it runs (its session's node info) is the new one from now.
    if s.what == What::Binary {
        write_version(data_dir, &s.version)?;
    }
    save(data_dir, &s)?;
    tracing::info!(job = %s.job, version = %s.version, seconds = s.health_seconds, "upgrade: the new edgecore starts; its session must be back in time");
    Ok(Some(s.health_seconds))
}

/// Puts `upgrade/edgecore.prev` back at edgecore's path (or `upgrade/edgecore.yaml.prev` at its
/// config's).
fn roll_back(data_dir: &Path, s: &mut State, why: &str) -> Result<()> {
    let target = s.target()?;
    let prev = dir(data_dir).join(match s.what {
        What::Binary => "edgecore.prev",
        What::Config => "edgecore.yaml.prev",
    });
    let back = std::fs::rename(&prev, &target)
        .with_context(|| format!("cannot put {} back at {}", prev.display(), target.display()));
    if let Some(parent) = target.parent() {
        sync_dir(parent);
    }
    s.step = Step::RolledBack;
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

/// The new edgecore's trial: `Successful` once `connected` (edgehub's session), else rolled
/// back and restarted into the old one after `seconds`.
pub async fn watch_health(
    data_dir: PathBuf,
    connected: Arc<crate::metrics::Metrics>,
    seconds: u32,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds.into());
    loop {
        if connected.cloud_connected.load(Ordering::Relaxed) == 1 {
            if let Some(mut s) = load(&data_dir) {
                s.step = Step::Successful;
                s.reason = match s.what {
                    What::Binary => {
                        format!("{} runs; its session with the cloud is back", s.version)
                    }
                    What::Config => {
                        "edgecore runs on its new config; its session with the cloud is back".into()
                    }
                };
                let action = match s.what {
                    What::Binary => "Upgrade",
                    What::Config => "Update",
                };
                s.act(action, true, s.reason.clone());
                let kept = save(&data_dir, &s);
                match kept {
                    Ok(()) => tracing::info!(job = %s.job, version = %s.version, "upgrade: done"),
                    Err(e) => {
                        tracing::warn!(
                            error = format!("{e:#}"),
                            "upgrade: cannot record the upgrade"
                        )
                    }
                }
            }
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            if let Some(mut s) = load(&data_dir) {
                let why = format!(
                    "{} had no session with the cloud within {seconds}s",
                    s.on_trial()
                );
                if let Err(e) = roll_back(&data_dir, &mut s, &why) {
                    tracing::warn!(error = format!("{e:#}"), "upgrade: rollback failed");
                    return;
                }
                restart();
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// This node's side of upgrade questions.
pub(crate) struct Upgrader {
    data_dir: PathBuf,
    /// Jobs downloading or checking, before a state file is written.
    working: Mutex<HashMap<String, UpgradeResult>>,
}

impl Upgrader {
    pub(crate) fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            working: Mutex::new(HashMap::new()),
        }
    }

    fn working(&self) -> std::sync::MutexGuard<'_, HashMap<String, UpgradeResult>> {
        self.working.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `job`'s answer when it has one here: from its state file, else from its work before it.
    fn known(&self, job: &str) -> Option<UpgradeResult> {
        if let Some(s) = load(&self.data_dir).filter(|s| s.job == job) {
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
            || load(&self.data_dir).is_some_and(|s| {
                matches!(s.step, Step::Swapping | Step::Restarting | Step::Checking)
            })
    }

    /// The answer to `job`'s question: from its state when it has one here, else the work
    /// starts (download from `cert_server` with `tls`).
    pub(crate) fn answer(
        self: &Arc<Self>,
        job: &str,
        q: Upgrade,
        cert_server: &str,
        tls: Arc<tokio_rustls::rustls::ClientConfig>,
    ) -> UpgradeResult {
        if let Some(r) = self.known(job) {
            return r;
        }
        let current = version(&self.data_dir);
        if current == q.version {
            return UpgradeResult {
                phase: NodePhase::Successful,
                reason: format!("already runs {current}"),
                current_version: current,
                historic_version: String::new(),
                action_flow: Vec::new(),
            };
        }
        if !api::operations::valid_version(&q.version) || q.path.contains("..") {
            return failed(&current, format!("{:?} is not a release name", q.version));
        }
        if self.busy() {
            return failed(&current, "another upgrade is under way on this node".into());
        }
        let r = UpgradeResult {
            phase: NodePhase::InProgress,
            reason: format!("downloading {}", q.version),
            current_version: current.clone(),
            historic_version: current.clone(),
            action_flow: Vec::new(),
        };
        self.working().insert(job.to_string(), r.clone());
        let (me, job, base) = (self.clone(), job.to_string(), cert_server.to_string());
        tokio::spawn(async move {
            let mut s = State {
                what: What::Binary,
                job: job.clone(),
                version: q.version.clone(),
                sha256: q.sha256.clone(),
                from: current.clone(),
                step: Step::Swapping,
                reason: String::new(),
                starts: 0,
                health_seconds: q.health_seconds.max(5),
                actions: Vec::new(),
            };
            match me.prepare(&base, tls, &q, &mut s).await {
                Ok(()) => {
                    me.working().remove(&job);
                    restart();
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    tracing::warn!(%job, reason = %why, "upgrade: not upgraded");
                    let mut r = failed(&current, why);
                    r.action_flow = s.actions.clone();
                    me.working().insert(job, r);
                }
            }
        });
        r
    }

    /// Download, check, back up, swap: ready to restart into the new edgecore.
    async fn prepare(
        &self,
        base: &str,
        tls: Arc<tokio_rustls::rustls::ClientConfig>,
        q: &Upgrade,
        s: &mut State,
    ) -> Result<()> {
        let d = dir(&self.data_dir);
        rt::fs::private_dir(&d)?;
        let exe = EXE
            .get()
            .cloned()
            .context("edgecore's own path is not known")?;
        let checked = match crate::edgehub::checks::run(&q.check_items, &self.data_dir).await {
            Ok(found) => found,
            Err(why) => {
                s.act("Check", false, why.to_string());
                bail!("checkItems: {why}");
            }
        };
        let new = d.join(format!("edgecore-{}", q.version));
        let got = download(base, &q.path, tls, &new).await;
        let got = match got {
            Ok(digest) if digest == q.sha256 => Ok(()),
            Ok(digest) => Err(anyhow::anyhow!(
                "the release's SHA-256 is {digest}, not {} as the job says",
                q.sha256
            )),
            Err(e) => Err(e),
        };
        if let Err(e) = got {
            let _ = std::fs::remove_file(&new);
            s.act("Check", false, format!("{e:#}"));
            return Err(e);
        }
        // Run once: it must start and say what it is.
        let trial = tokio::time::timeout(
            Duration::from_secs(20),
            tokio::process::Command::new(&new).arg("--version").output(),
        )
        .await;
        let said = match trial {
            Ok(Ok(o)) if o.status.success() => {
                String::from_utf8_lossy(&o.stdout).trim().to_string()
            }
            Ok(Ok(o)) => {
                let e = anyhow::anyhow!(
                    "the new edgecore does not run: --version ended with {}",
                    o.status
                );
                s.act("Check", false, format!("{e:#}"));
                return Err(e);
            }
            Ok(Err(e)) => {
                let e = anyhow::anyhow!("the new edgecore does not run: {e}");
                s.act("Check", false, format!("{e:#}"));
                return Err(e);
            }
            Err(_) => {
                let e = anyhow::anyhow!("the new edgecore's --version did not end within 20 s");
                s.act("Check", false, format!("{e:#}"));
                return Err(e);
            }
        };
        let checked = if checked.is_empty() {
            String::new()
        } else {
            format!("; {checked}")
        };
        s.act(
            "Check",
            true,
            format!("SHA-256 matches; it runs ({said}){checked}"),
        );
        let prev = d.join("edgecore.prev");
        let _ = std::fs::remove_file(&prev);
        if std::fs::hard_link(&exe, &prev).is_err() {
            std::fs::copy(&exe, &prev)
                .with_context(|| format!("cannot keep {} as {}", exe.display(), prev.display()))?;
        }
        sync_dir(&d);
        s.act(
            "BackUp",
            true,
            format!("{} kept as upgrade/edgecore.prev", s.from),
        );
        s.step = Step::Swapping;
        save(&self.data_dir, s)?;
        step_pause();
        std::fs::rename(&new, &exe)
            .with_context(|| format!("cannot put the new edgecore at {}", exe.display()))?;
        if let Some(parent) = exe.parent() {
            sync_dir(parent);
        }
        step_pause();
        s.step = Step::Restarting;
        s.reason = format!("restarting into {}", q.version);
        save(&self.data_dir, s)?;
        tracing::info!(job = %s.job, version = %q.version, "upgrade: binary replaced; restarting");
        Ok(())
    }
}

impl Upgrader {
    /// The answer to a `ConfigUpdateJob`'s question: from its state when it has one here,
    /// else the update starts.
    pub(crate) fn configure(self: &Arc<Self>, job: &str, q: ConfigUpdate) -> UpgradeResult {
        if let Some(r) = self.known(job) {
            return r;
        }
        let current = version(&self.data_dir);
        if self.busy() {
            return failed(
                &current,
                "another upgrade or config update is under way on this node".into(),
            );
        }
        let Some(file) = CONFIG.get().cloned() else {
            return failed(
                &current,
                "edgecore runs on its defaults (no --config file): there is no config to update"
                    .into(),
            );
        };
        let r = UpgradeResult {
            phase: NodePhase::InProgress,
            reason: "checking the new config".into(),
            current_version: current.clone(),
            historic_version: current.clone(),
            action_flow: Vec::new(),
        };
        self.working().insert(job.to_string(), r.clone());
        let (me, job) = (self.clone(), job.to_string());
        tokio::spawn(async move {
            let mut s = State {
                what: What::Config,
                job: job.clone(),
                version: current.clone(),
                sha256: String::new(),
                from: "its old config".into(),
                step: Step::Swapping,
                reason: String::new(),
                starts: 0,
                health_seconds: q.health_seconds.max(5),
                actions: Vec::new(),
            };
            match me.prepare_config(&file, &q, &mut s).await {
                Ok(()) => {
                    me.working().remove(&job);
                    restart();
                }
                Err(e) => {
                    let why = format!("{e:#}");
                    tracing::warn!(%job, reason = %why, "config update: not applied");
                    let mut r = failed(&current, why);
                    r.action_flow = s.actions.clone();
                    me.working().insert(job, r);
                }
            }
        });
        r
    }

    /// Check, write beside, back up, swap: ready to restart on the new config.
    async fn prepare_config(&self, file: &Path, q: &ConfigUpdate, s: &mut State) -> Result<()> {
        let d = dir(&self.data_dir);
        rt::fs::private_dir(&d)?;
        let checked = match crate::edgehub::checks::run(&q.check_items, &self.data_dir).await {
            Ok(found) => found,
            Err(why) => {
                s.act("Check", false, why.to_string());
                bail!("checkItems: {why}");
            }
        };
        let checked_config = (|| {
            let old = std::fs::read_to_string(file)
                .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
            let new = apply_fields(&old, &q.update_fields)?;
            let base = file.parent().unwrap_or(Path::new("."));
            let parsed =
                crate::config::Config::parse(&new, file, base).map_err(|e| e.to_string())?;
            let same = |a: &Path, b: &Path| {
                let real = |p: &Path| {
                    std::fs::canonicalize(p)
                        .or_else(|_| std::path::absolute(p))
                        .unwrap_or_else(|_| p.to_path_buf())
                };
                real(a) == real(b)
            };
            if !same(&parsed.data_dir, &self.data_dir) {
                return Err("dataDir cannot be changed by a job (the twins and this job's state are kept there)".to_string());
            }
            Ok(new)
        })();
        let new = match checked_config {
            Ok(n) => n,
            Err(why) => {
                s.act("Check", false, why.clone());
                bail!("the new config: {why}");
            }
        };
        let fields: Vec<&str> = q.update_fields.keys().map(String::as_str).collect();
        let checked = if checked.is_empty() {
            String::new()
        } else {
            format!("; {checked}")
        };
        s.act(
            "Check",
            true,
            format!("the new config parses ({}){checked}", fields.join(", ")),
        );
        let staged = d.join("edgecore.yaml.new");
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&staged)
                .with_context(|| format!("cannot write {}", staged.display()))?;
            f.write_all(new.as_bytes())?;
            f.sync_all()?;
        }
        // The config keeps its owner's permissions.
        if let Ok(m) = std::fs::metadata(file) {
            let _ = std::fs::set_permissions(&staged, m.permissions());
        }
        s.sha256 = sha256_file(&staged)?;
        let prev = d.join("edgecore.yaml.prev");
        std::fs::copy(file, &prev)
            .with_context(|| format!("cannot keep {} as {}", file.display(), prev.display()))?;
        sync_dir(&d);
        s.act(
            "BackUp",
            true,
            "the old config kept as upgrade/edgecore.yaml.prev",
        );
        s.step = Step::Swapping;
        save(&self.data_dir, s)?;
        step_pause();
        std::fs::rename(&staged, file)
            .with_context(|| format!("cannot put the new config at {}", file.display()))?;
        if let Some(parent) = file.parent() {
            sync_dir(parent);
        }
        step_pause();
        s.step = Step::Restarting;
        s.reason = "restarting on the new config".into();
        save(&self.data_dir, s)?;
        tracing::info!(job = %s.job, fields = ?fields, "config update: config replaced; restarting");
        Ok(())
    }
}

/// `fields` set in the YAML `text` (each by its dotted path, its value read as YAML: `20` a
/// number, `true` a boolean, `[a, b]` a list, anything else a string), written back as YAML.
/// Mappings along a path are made where missing; a path through something that is not one is
/// refused, naming it. (Comments are not kept.)
pub fn apply_fields(
    text: &str,
    fields: &std::collections::BTreeMap<String, String>,
) -> std::result::Result<String, String> {
    use serde_yaml_ng::{Mapping, Value};
    let mut doc: Value = if text.trim().is_empty() {
        Value::Mapping(Mapping::new())
    } else {
        serde_yaml_ng::from_str(text).map_err(|e| format!("the config is not YAML: {e}"))?
    };
    for (path, value) in fields {
        let parts: Vec<&str> = path.split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(format!(
                "{path:?} is not a field path (names joined by dots)"
            ));
        }
        let v: Value =
            serde_yaml_ng::from_str(value).unwrap_or_else(|_| Value::String(value.clone()));
        let mut at = &mut doc;
        for (i, part) in parts.iter().enumerate() {
            if at.is_null() {
                *at = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(m) = at else {
                return Err(format!(
                    "{path}: {} is not a mapping in the config",
                    parts[..i].join(".")
                ));
            };
            let key = Value::String((*part).to_string());
            if i + 1 == parts.len() {
                m.insert(key, v.clone());
                break;
            }
            at = m.entry(key).or_insert(Value::Null);
        }
    }
    serde_yaml_ng::to_string(&doc).map_err(|e| e.to_string())
}

/// For tests of a kill in the middle of the swap: `EDGECORE_UPGRADE_STEP_PAUSE_MS` pauses
/// before and after the rename.
fn step_pause() {
    if let Some(ms) = std::env::var("EDGECORE_UPGRADE_STEP_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(Duration::from_millis(ms.min(60_000)));
    }
}

fn failed(current: &str, reason: String) -> UpgradeResult {
    UpgradeResult {
        phase: NodePhase::Failure,
        reason,
        current_version: current.into(),
        historic_version: current.into(),
        action_flow: Vec::new(),
    }
}

/// The longest a download may go without a byte.
const DOWNLOAD_IDLE: Duration = Duration::from_secs(60);

/// `GET {base}{path}` with the node's certificate into `to` (private, executable); its SHA-256.
async fn download(
    base: &str,
    path: &str,
    tls: Arc<tokio_rustls::rustls::ClientConfig>,
    to: &Path,
) -> Result<String> {
    use http_body_util::BodyExt;
    use tokio::io::AsyncWriteExt;
    let (authority, host) = crate::edgehub::host_port(base)?;
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(&authority),
    )
    .await
    .with_context(|| format!("{base}: connect timed out"))?
    .with_context(|| format!("cannot connect to {base}"))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(crate::edgehub::server_name(&host)?, tcp)
        .await
        .with_context(|| format!("TLS with {base} failed"))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("Host", authority.as_str())
        .body(http_body_util::Empty::<bytes::Bytes>::new())?;
    let resp = tokio::time::timeout(Duration::from_secs(30), sender.send_request(req))
        .await
        .with_context(|| format!("{base}{path}: no answer within 30 s"))??;
    let status = resp.status();
    let mut body = resp.into_body();
    if !status.is_success() {
        let text = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        bail!(
            "{base}{path}: {status}: {}",
            String::from_utf8_lossy(&text).trim()
        );
    }
    let part = to.with_extension("part");
    let mut f = {
        let mut o = tokio::fs::OpenOptions::new();
        o.write(true).create(true).truncate(true).mode(0o700);
        o.open(&part)
            .await
            .with_context(|| format!("cannot write {}", part.display()))?
    };
    let written = async {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        loop {
            // A stalled download ends: a minute without a byte.
            let frame = tokio::time::timeout(DOWNLOAD_IDLE, body.frame())
                .await
                .map_err(|_| {
                    anyhow::anyhow!(
                        "{base}{path}: nothing received for {} s",
                        DOWNLOAD_IDLE.as_secs()
                    )
                })?;
            let Some(frame) = frame else { break };
            let frame = frame.with_context(|| format!("{base}{path}: the download broke off"))?;
            if let Some(data) = frame.data_ref() {
                ctx.update(data);
                f.write_all(data)
                    .await
                    .with_context(|| format!("cannot write {}", part.display()))?;
            }
        }
        f.sync_all()
            .await
            .with_context(|| format!("cannot write {}", part.display()))?;
        anyhow::Ok(ctx)
    }
    .await;
    drop(f);
    // A download cut, or a full disk: nothing of it stays.
    let ctx = match written {
        Ok(ctx) => ctx,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    std::fs::rename(&part, to)?;
    Ok(hex(ctx.finish().as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn fields(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
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
            apply_fields(text, &fields(&[("node.name.first", "x")])).expect_err("through"),
            "node.name.first: node.name is not a mapping in the config"
        );
        assert!(
            apply_fields(text, &fields(&[("cloud..x", "1")]))
                .expect_err("empty")
                .contains("not a field path")
        );
        assert!(
            apply_fields("a: [", &fields(&[]))
                .expect_err("bad")
                .contains("not YAML")
        );
    }
}
