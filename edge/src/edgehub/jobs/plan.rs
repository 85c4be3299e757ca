//! The decisions of an upgrade or a config update on this node, pure: whether a question starts
//! one, what a start of edgecore does about one under way, and how its trial ends. The job's
//! work ([`super`]) and its files ([`super::swap`]) act on them. The rules:
//!
//! 1. **A question starts at most one job.** A node that already runs the release answers
//!    `Successful`; a name that is not a release, or another job under way, is refused.
//! 2. **Not swapped, not on trial.** At start, a job whose file (binary or config) is not the
//!    new one was stopped before its swap (`Failed`, the old one kept) or was rolled back by a
//!    rename (`RolledBack`). Nothing runs on trial.
//! 3. **One start on trial.** The new one's first start is its trial: it has `healthSeconds` to
//!    get its session with the cloud back. A second start during the trial means the first
//!    one stopped during it: roll back.
//! 4. **The session decides.** Back within the time: `Successful`; not: roll back, and restart
//!    into the old one. So does a new edgecore that ends with an error while on trial.
//! 5. **The old edgecore watches.** The edgecore that swapped does not hand its process over
//!    blind: it starts the new one as its child and stays its parent ([`super::watcher`]). A child
//!    that exits while the job is under way (it died at start, refused the config, crashed on
//!    trial), or is still under way a minute after its trial's time, is rolled back by the old
//!    one, which then starts again itself: a release that cannot reach rule 4 cannot brick the
//!    gateway. Once the trial is decided either way, the old one only waits for its child.

use api::operations::{Action, NodePhase, Upgrade, UpgradeResult};
use serde::{Deserialize, Serialize};

/// The least time a trial is given, seconds.
pub(crate) const MIN_HEALTH_SECONDS: u32 = 5;

/// Where a job's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Step {
    /// Checked and backed up; the file is being replaced.
    Swapping,
    /// Replaced; edgecore restarts into it.
    Restarting,
    /// The new one runs and waits for its session.
    Checking,
    Successful,
    RolledBack,
    Failed,
}

impl Step {
    /// Whether a job in this step is under way (between its swap and the end of its trial).
    pub(crate) fn under_way(self) -> bool {
        matches!(self, Self::Swapping | Self::Restarting | Self::Checking)
    }
}

/// What a job replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub(crate) enum What {
    /// edgecore's binary (`NodeUpgradeJob`).
    #[default]
    Binary,
    /// Its config file (`ConfigUpdateJob`).
    Config,
}

impl What {
    /// The name of the backup kept in `upgrade/`.
    pub(crate) fn backup(self) -> &'static str {
        match self {
            Self::Binary => "edgecore.prev",
            Self::Config => "edgecore.yaml.prev",
        }
    }
}

/// A job's state, kept in `upgrade/state.json` across the restarts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct JobState {
    #[serde(default)]
    pub what: What,
    pub job: String,
    pub version: String,
    pub sha256: String,
    pub from: String,
    pub step: Step,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub starts: u32,
    pub health_seconds: u32,
    #[serde(default)]
    pub actions: Vec<Action>,
}

impl JobState {
    /// A job about to be prepared.
    pub(crate) fn new(what: What, job: &str, version: &str, from: &str, health: u32) -> Self {
        Self {
            what,
            job: job.to_string(),
            version: version.to_string(),
            sha256: String::new(),
            from: from.to_string(),
            step: Step::Swapping,
            reason: String::new(),
            starts: 0,
            health_seconds: health.max(MIN_HEALTH_SECONDS),
            actions: Vec::new(),
        }
    }

    /// The answer to the cloud's question about this job.
    pub(crate) fn result(&self) -> UpgradeResult {
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
    pub(crate) fn on_trial(&self) -> String {
        match self.what {
            What::Binary => format!("the new edgecore ({})", self.version),
            What::Config => "edgecore on its new config".into(),
        }
    }

    pub(crate) fn act(&mut self, action: &str, ok: bool, reason: impl Into<String>) {
        self.actions
            .push(Action::at(action, ok, reason, std::time::SystemTime::now()));
    }
}

/// A refusal, in the shape of the cloud's answer.
pub(crate) fn failed(current: &str, reason: String) -> UpgradeResult {
    UpgradeResult {
        phase: NodePhase::Failure,
        reason,
        current_version: current.into(),
        historic_version: current.into(),
        action_flow: Vec::new(),
    }
}

/// Rule 1 for a `NodeUpgradeJob`'s question, on a node that runs `current` and has another job
/// under way or not: `None` when the upgrade starts, else the answer.
pub(crate) fn refuse_upgrade(current: &str, q: &Upgrade, busy: bool) -> Option<UpgradeResult> {
    if current == q.version {
        return Some(UpgradeResult {
            phase: NodePhase::Successful,
            reason: format!("already runs {current}"),
            current_version: current.to_string(),
            historic_version: String::new(),
            action_flow: Vec::new(),
        });
    }
    if !api::operations::valid_version(&q.version) || q.path.contains("..") {
        return Some(failed(
            current,
            format!("{:?} is not a release name", q.version),
        ));
    }
    if busy {
        return Some(failed(
            current,
            "another upgrade is under way on this node".into(),
        ));
    }
    None
}

/// What a start of edgecore does about the job in its state file.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AtStart {
    /// No job under way.
    Nothing,
    /// Rule 2: the file is not the new one; the job ends with this step and reason.
    NotSwapped { step: Step, reason: String },
    /// Rule 3: a second start on trial; roll back for this reason, then restart.
    RollBack(String),
    /// Rule 3: the trial starts; the session must be back within these seconds.
    Trial(u32),
}

/// Rules 2 and 3: `running_new` when the file in place is the job's new one (its SHA-256).
pub(crate) fn at_start(s: &JobState, running_new: bool) -> AtStart {
    if !s.step.under_way() {
        return AtStart::Nothing;
    }
    if !running_new {
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
        return AtStart::NotSwapped { step, reason };
    }
    // `starts` counts this start too.
    if s.step == Step::Checking && s.starts >= 1 {
        return AtStart::RollBack(format!("{} stopped during its health check", s.on_trial()));
    }
    AtStart::Trial(s.health_seconds)
}

/// How a trial ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Trial {
    /// Rule 4: the session is back. The action to record, and the job's reason.
    Passed {
        action: &'static str,
        reason: String,
    },
    /// Rule 4: roll back, for this reason, and restart into the old one.
    RollBack(String),
}

/// Rule 4: the end of `s`'s trial, the session back within its time or not.
pub(crate) fn trial_ended(s: &JobState, session_back: bool) -> Trial {
    if !session_back {
        return Trial::RollBack(format!(
            "{} had no session with the cloud within {}s",
            s.on_trial(),
            s.health_seconds
        ));
    }
    match s.what {
        What::Binary => Trial::Passed {
            action: "Upgrade",
            reason: format!("{} runs; its session with the cloud is back", s.version),
        },
        What::Config => Trial::Passed {
            action: "Update",
            reason: "edgecore runs on its new config; its session with the cloud is back".into(),
        },
    }
}

/// Rule 4: edgecore ended with `error`; when it was on trial, the reason to roll back.
pub(crate) fn stopped_on_trial(s: &JobState, error: &str) -> Option<String> {
    (s.step == Step::Checking).then(|| format!("{} stopped: {error}", s.on_trial()))
}

/// What the old edgecore saw of the new one it watches (rule 5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Watched {
    /// The child exited, with this status in words and the last lines it wrote.
    Exited { status: String, said: String },
    /// The trial's time and the grace after it passed, this many seconds in all.
    TimeUp(u64),
}

/// The seconds a watched child has beyond its trial's `healthSeconds` to decide it: its start
/// (opening a large store) comes before the trial's clock starts.
pub(crate) const WATCH_GRACE_SECONDS: u64 = 60;

/// Rule 5: the reason to roll back after `event`, when the job is still under way (`None`: the
/// trial was decided, by the child's own rules).
pub(crate) fn watched(s: &JobState, event: &Watched) -> Option<String> {
    if !s.step.under_way() {
        return None;
    }
    Some(match event {
        Watched::Exited { status, said } if said.is_empty() => {
            format!("{} exited on trial ({status})", s.on_trial())
        }
        Watched::Exited { status, said } => {
            format!("{} exited on trial ({status}): {said}", s.on_trial())
        }
        Watched::TimeUp(secs) => {
            format!("{} had not finished its trial after {secs} s", s.on_trial())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(what: What, step: Step, starts: u32) -> JobState {
        let mut s = JobState::new(what, "up-1", "v2", "v1", 30);
        s.step = step;
        s.starts = starts;
        s
    }

    fn ask(version: &str, path: &str) -> Upgrade {
        serde_json::from_value(serde_json::json!({
            "version": version, "path": path, "sha256": "00", "healthSeconds": 1
        }))
        .expect("question")
    }

    #[test]
    fn a_node_that_runs_the_release_answers_successful_without_work() {
        let r = refuse_upgrade("v2", &ask("v2", "/releases/v2/edgecore"), true).expect("answer");
        assert_eq!(r.phase, NodePhase::Successful);
        assert_eq!(r.reason, "already runs v2");
    }

    #[test]
    fn a_name_that_is_not_a_release_is_refused_before_a_busy_node_is() {
        for (version, path) in [("v2/../../x", "/r"), ("v2", "/releases/../etc/passwd")] {
            let r = refuse_upgrade("v1", &ask(version, path), true).expect("refused");
            assert_eq!(r.phase, NodePhase::Failure);
            assert!(r.reason.contains("is not a release name"), "{}", r.reason);
        }
    }

    #[test]
    fn a_second_job_while_one_is_under_way_is_refused() {
        let r = refuse_upgrade("v1", &ask("v2", "/releases/v2/edgecore"), true).expect("refused");
        assert_eq!(r.reason, "another upgrade is under way on this node");
        assert_eq!(r.current_version, "v1");
        assert_eq!(
            refuse_upgrade("v1", &ask("v2", "/releases/v2/edgecore"), false),
            None
        );
    }

    #[test]
    fn a_trial_is_given_at_least_five_seconds() {
        assert_eq!(
            JobState::new(What::Binary, "j", "v2", "v1", 0).health_seconds,
            5
        );
        assert_eq!(
            JobState::new(What::Binary, "j", "v2", "v1", 60).health_seconds,
            60
        );
    }

    #[test]
    fn a_job_not_under_way_does_nothing_at_start() {
        for step in [Step::Successful, Step::RolledBack, Step::Failed] {
            assert_eq!(
                at_start(&job(What::Binary, step, 1), false),
                AtStart::Nothing
            );
            assert_eq!(
                at_start(&job(What::Binary, step, 1), true),
                AtStart::Nothing
            );
        }
    }

    #[test]
    fn stopped_before_the_swap_fails_and_keeps_the_old_one() {
        match at_start(&job(What::Binary, Step::Swapping, 0), false) {
            AtStart::NotSwapped { step, reason } => {
                assert_eq!(step, Step::Failed);
                assert_eq!(
                    reason,
                    "edgecore stopped before its binary was replaced; v1 kept"
                );
            }
            other => panic!("{other:?}"),
        }
        match at_start(&job(What::Config, Step::Swapping, 0), false) {
            AtStart::NotSwapped { step, .. } => assert_eq!(step, Step::Failed),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_old_file_in_place_after_the_swap_means_rolled_back() {
        for step in [Step::Restarting, Step::Checking] {
            match at_start(&job(What::Binary, step, 1), false) {
                AtStart::NotSwapped { step, reason } => {
                    assert_eq!(step, Step::RolledBack);
                    assert_eq!(reason, "the old edgecore (v1) runs again");
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn the_first_start_of_the_new_one_is_its_trial() {
        for step in [Step::Swapping, Step::Restarting] {
            assert_eq!(
                at_start(&job(What::Binary, step, 0), true),
                AtStart::Trial(30)
            );
        }
    }

    #[test]
    fn a_second_start_during_the_trial_rolls_back() {
        assert_eq!(
            at_start(&job(What::Binary, Step::Checking, 1), true),
            AtStart::RollBack("the new edgecore (v2) stopped during its health check".into())
        );
        assert_eq!(
            at_start(&job(What::Config, Step::Checking, 1), true),
            AtStart::RollBack("edgecore on its new config stopped during its health check".into())
        );
    }

    #[test]
    fn the_session_back_in_time_makes_the_job_successful() {
        let s = job(What::Binary, Step::Checking, 1);
        assert_eq!(
            trial_ended(&s, true),
            Trial::Passed {
                action: "Upgrade",
                reason: "v2 runs; its session with the cloud is back".into()
            }
        );
        let c = job(What::Config, Step::Checking, 1);
        assert!(matches!(
            trial_ended(&c, true),
            Trial::Passed {
                action: "Update",
                ..
            }
        ));
    }

    #[test]
    fn no_session_in_time_rolls_back() {
        assert_eq!(
            trial_ended(&job(What::Binary, Step::Checking, 1), false),
            Trial::RollBack(
                "the new edgecore (v2) had no session with the cloud within 30s".into()
            )
        );
    }

    #[test]
    fn an_error_on_trial_rolls_back_and_one_after_it_does_not() {
        assert_eq!(
            stopped_on_trial(&job(What::Config, Step::Checking, 1), "port 10350 taken"),
            Some("edgecore on its new config stopped: port 10350 taken".into())
        );
        for step in [Step::Successful, Step::Swapping, Step::RolledBack] {
            assert_eq!(stopped_on_trial(&job(What::Config, step, 1), "x"), None);
        }
    }

    #[test]
    fn the_answer_names_the_version_that_runs() {
        let mut s = job(What::Binary, Step::Checking, 1);
        assert_eq!(s.result().phase, NodePhase::InProgress);
        assert_eq!(s.result().current_version, "v1");
        s.step = Step::Successful;
        assert_eq!(s.result().current_version, "v2");
        s.step = Step::RolledBack;
        assert_eq!(
            (s.result().phase, s.result().current_version.as_str()),
            (NodePhase::Failure, "v1")
        );
    }

    fn exited(status: &str, said: &str) -> Watched {
        Watched::Exited {
            status: status.into(),
            said: said.into(),
        }
    }

    #[test]
    fn rule_5_a_child_that_dies_before_its_trial_is_rolled_back_naming_how() {
        let s = job(What::Binary, Step::Restarting, 0);
        let why = watched(&s, &exited("exit status: 1", "no such table")).expect("roll back");
        assert_eq!(
            why,
            "the new edgecore (v2) exited on trial (exit status: 1): no such table"
        );
    }

    #[test]
    fn rule_5_a_child_that_dies_on_trial_or_refuses_its_config_is_rolled_back() {
        let s = job(What::Config, Step::Checking, 1);
        let why = watched(&s, &exited("exit status: 2", "")).expect("roll back");
        assert_eq!(
            why,
            "edgecore on its new config exited on trial (exit status: 2)"
        );
    }

    #[test]
    fn rule_5_a_child_still_under_way_after_its_time_is_rolled_back() {
        for step in [Step::Swapping, Step::Restarting, Step::Checking] {
            let s = job(What::Binary, step, 1);
            let why = watched(&s, &Watched::TimeUp(90)).expect("roll back");
            assert!(
                why.ends_with("had not finished its trial after 90 s"),
                "{why}"
            );
        }
    }

    #[test]
    fn rule_5_a_decided_trial_leaves_the_child_alone() {
        for step in [Step::Successful, Step::RolledBack, Step::Failed] {
            let s = job(What::Binary, step, 1);
            assert_eq!(watched(&s, &exited("signal: 9", "")), None, "{step:?}");
            assert_eq!(watched(&s, &Watched::TimeUp(90)), None, "{step:?}");
        }
    }
}
