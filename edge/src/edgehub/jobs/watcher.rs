//! Rule 5 of [`super::plan`]: the edgecore that swapped in a new binary (or config) starts the new
//! one as its child and watches its trial from outside it, so that a release that dies before its
//! own rules run (it exits at start, refuses the config, hangs) is still rolled back. The old one
//! stays the child's parent (the service's main process) after the trial: it passes SIGTERM and
//! SIGINT on and exits as the child does. The next start of the service runs the binary at
//! edgecore's path directly.

use super::Relaunch;
use super::plan::{self, Step, WATCH_GRACE_SECONDS, Watched};
use super::swap;
use rustix::process::{Pid, Signal, kill_process};
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

/// The variable that tells the child which process watches it: it asks to be stopped when its
/// watcher dies ([`stop_with_watcher`]), so that no edgecore outlives the one a supervisor
/// killed.
const WATCHED_BY: &str = "EDGECORE_WATCHED_BY";

/// In a new edgecore started by an old one: SIGTERM to this process when the old one dies (it
/// is the service's main process: killing it is stopping edgecore). Nothing otherwise.
pub fn stop_with_watcher() {
    let Some(watcher) = std::env::var(WATCHED_BY)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
        .and_then(Pid::from_raw)
    else {
        return;
    };
    if let Err(e) = rustix::process::set_parent_process_death_signal(Some(Signal::TERM)) {
        tracing::warn!(error = %e, "upgrade: cannot ask to stop with the old edgecore");
    }
    // Dead already, before the ask: this edgecore was handed to init.
    if rustix::process::getppid() != Some(watcher) {
        tracing::warn!("upgrade: the old edgecore that started this one is gone");
    }
}

/// How long a child told to stop (SIGTERM) has before it is killed.
const STOP_SECONDS: u64 = 15;

/// How many of its last lines on stderr are kept to say why a child died.
const LAST_LINES: usize = 3;

/// How edgecore's restart went, for `main`.
#[derive(Debug)]
pub enum Restart {
    /// No restart was asked: exit with the program's own code.
    NotAsked,
    /// The watched child ended after its trial was decided: exit with its code.
    Exited(u8),
    /// edgecore could not start again: why.
    Failed(std::io::Error),
}

impl Relaunch {
    /// After the program stopped: nothing when no restart was asked; after a swap, the new
    /// edgecore started as a watched child (rule 5); else (a rollback) the binary at edgecore's
    /// path `exec`ed in this process's place.
    pub fn restart(&self, data_dir: &Path) -> Restart {
        if !self.asked.load(std::sync::atomic::Ordering::SeqCst) {
            return Restart::NotAsked;
        }
        let swapped = swap::load(data_dir).is_some_and(|s| s.step == Step::Restarting);
        if swapped
            && let Some(exe) = &self.exe
            && let Some(code) = watch(exe, data_dir, self)
        {
            return Restart::Exited(code);
        }
        match self.exec_if_asked() {
            Some(e) => Restart::Failed(e),
            None => Restart::NotAsked,
        }
    }
}

/// Starts `exe` with this process's arguments and watches it. `Some(code)`: it ended after its
/// trial was decided, with `code`; `None`: start edgecore again (after a rollback, or when it
/// could not be watched).
fn watch(exe: &Path, data_dir: &Path, relaunch: &Relaunch) -> Option<u8> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| tracing::warn!(error = %e, "upgrade: cannot watch the new edgecore"))
        .ok()?;
    runtime.block_on(watch_child(exe, data_dir, relaunch))
}

async fn watch_child(exe: &Path, data_dir: &Path, relaunch: &Relaunch) -> Option<u8> {
    let health = swap::load(data_dir).map_or(0, |s| u64::from(s.health_seconds));
    let allowed = health + grace();
    let spawned = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(WATCHED_BY, std::process::id().to_string())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            let said = format!("cannot be started: {e}");
            roll_back(
                data_dir,
                relaunch,
                &Watched::Exited {
                    status: said,
                    said: String::new(),
                },
            );
            return None;
        }
    };
    tracing::info!(pid = ?child.id(), seconds = allowed, "upgrade: the new edgecore starts, watched by the old one");
    let last = Arc::new(Mutex::new(VecDeque::new()));
    let tee = child
        .stderr
        .take()
        .map(|e| tokio::spawn(tee(e, last.clone())));
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return child.wait().await.ok().map(code);
    };
    let deadline = Instant::now() + Duration::from_secs(allowed);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut decided = false;
    let mut stopping = false;
    loop {
        tokio::select! {
            status = child.wait() => {
                let (status, exit) = match status {
                    Ok(s) => (s.to_string(), code(s)),
                    Err(e) => (e.to_string(), 1),
                };
                if let Some(t) = tee {
                    // What it wrote last, to its end (bounded: the pipe closed with it).
                    let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
                }
                if stopping || decided {
                    return Some(exit);
                }
                let said = last.lock().map(|l| Vec::from(l.clone()).join(" | ")).unwrap_or_default();
                let rolled = roll_back(data_dir, relaunch, &Watched::Exited { status, said });
                return (!rolled).then_some(exit);
            }
            _ = term.recv() => { stopping = true; pass_on(&child, Signal::TERM); }
            _ = int.recv() => { stopping = true; pass_on(&child, Signal::INT); }
            _ = tick.tick(), if !decided && !stopping => {
                decided = swap::load(data_dir).is_none_or(|s| !s.step.under_way());
                if !decided && Instant::now() >= deadline {
                    stop(&mut child).await;
                    roll_back(data_dir, relaunch, &Watched::TimeUp(allowed));
                    return None;
                }
            }
        }
    }
}

/// The seconds a child has beyond its trial: [`WATCH_GRACE_SECONDS`], or for tests of a release
/// that hangs, `EDGECORE_WATCH_GRACE_SECONDS`.
fn grace() -> u64 {
    std::env::var("EDGECORE_WATCH_GRACE_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(WATCH_GRACE_SECONDS)
}

/// Rolls back when the job is still under way after `event`; true when it did.
fn roll_back(data_dir: &Path, relaunch: &Relaunch, event: &Watched) -> bool {
    relaunch.roll_back_if(data_dir, |s| {
        let why = plan::watched(s, event)?;
        tracing::warn!(job = %s.job, %why, "upgrade: the old edgecore rolls back the new one");
        Some(why)
    })
}

/// Copies the child's stderr to ours line by line, keeping its last lines.
async fn tee(from: ChildStderr, last: Arc<Mutex<VecDeque<String>>>) {
    let mut lines = BufReader::new(from).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        // A line at a time to our own stderr (the journal's pipe: a short blocking write).
        let _ = writeln!(std::io::stderr(), "{line}");
        if let Ok(mut l) = last.lock() {
            if l.len() == LAST_LINES {
                l.pop_front();
            }
            l.push_back(line.chars().take(300).collect());
        }
    }
}

/// Sends `sig` to the child, while it runs (it has an id until it is reaped, so the id is not
/// another process's).
fn pass_on(child: &Child, sig: Signal) {
    let pid = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .and_then(Pid::from_raw);
    if let Some(pid) = pid
        && let Err(e) = kill_process(pid, sig)
    {
        tracing::warn!(error = %e, "upgrade: cannot signal the new edgecore");
    }
}

/// Tells the child to stop, and kills it when it has not within [`STOP_SECONDS`].
async fn stop(child: &mut Child) {
    pass_on(child, Signal::TERM);
    if tokio::time::timeout(Duration::from_secs(STOP_SECONDS), child.wait())
        .await
        .is_err()
    {
        let _ = child.kill().await;
    }
}

/// The code to exit with as the child did (a signal: 128+N, as a shell says).
fn code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let n = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    u8::try_from(n).unwrap_or(1)
}
