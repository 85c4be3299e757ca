//! Jobs over the fleet (`operations.kubeedge.io/v1alpha2`): `ImagePrePullJob`, images pulled
//! into chosen nodes' containerd ahead of time, and `NodeUpgradeJob`, a node's edgecore
//! replaced by a release kept in cloudcore's `{dataDir}/releases/{version}/edgecore` (served
//! to nodes by the certificate server, its SHA-256 in the question). Runs on the leader, with
//! the embedded API or a real cluster. Each job not over has a task: it reads the template
//! ([`plan::prepull_template`], [`plan::upgrade_template`]: a bad field ends the job as
//! `Failure` naming it), finds its nodes (by name and label selector; a named node that does
//! not exist fails at once), then asks `concurrency` nodes at a time over their sessions
//! (`CloudHub::ask`, `operations/{kind}/{job}`; an upgrade's canary alone first), writing each
//! node's phase, results and reason into `status.nodeStatus` as it goes, and stops starting
//! nodes once more than `failureTolerate` of them failed ([`plan::next`]). A node away waits
//! for its session until `timeoutSeconds`; an upgrading node answers `InProgress` and is asked
//! again until its new edgecore proved itself or was rolled back. A job whose cloudcore
//! restarts goes on where its status says (nodes that were in progress are asked again: both
//! questions are idempotent on the node).

pub(crate) mod plan;

use crate::cloudhub::{CloudHub, Unanswered};
use api::message::Message;
use api::operations::{
    self, ConfigUpdate, NodePhase, PrePull, PrePullResult, RegistryAuth, Upgrade,
};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use plan::JobPhase;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often a node away is looked for again.
const AWAY_RETRY: Duration = Duration::from_secs(3);

/// How often an upgrading node is asked how it is going.
const UPGRADE_POLL: Duration = Duration::from_secs(2);

/// The kinds of job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    PrePull,
    Upgrade,
    Config,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Self::PrePull => "ImagePrePullJob",
            Self::Upgrade => "NodeUpgradeJob",
            Self::Config => "ConfigUpdateJob",
        }
    }

    fn resource(self) -> ApiResource {
        let plural = match self {
            Self::PrePull => "imageprepulljobs",
            Self::Upgrade => "nodeupgradejobs",
            Self::Config => "configupdatejobs",
        };
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("operations.kubeedge.io", "v1alpha2", self.name()),
            plural,
        )
    }

    fn message_kind(self) -> &'static str {
        match self {
            Self::PrePull => operations::IMAGE_PREPULL,
            Self::Upgrade => operations::NODE_UPGRADE,
            Self::Config => operations::CONFIG_UPDATE,
        }
    }
}

/// A node's answer, whatever the kind: its phase and reason, the fields it adds to its
/// `nodeStatus` item, and its steps when it gives them.
#[derive(Debug, Clone)]
struct Report {
    phase: NodePhase,
    reason: String,
    fields: serde_json::Map<String, Value>,
    actions: Option<Vec<Value>>,
}

impl Report {
    fn refused(reason: String) -> Self {
        Self {
            phase: NodePhase::Failure,
            reason,
            fields: Default::default(),
            actions: None,
        }
    }

    /// A node's answer as its kind reads it.
    fn of(kind: Kind, content: Value) -> Self {
        match kind {
            Kind::PrePull => match serde_json::from_value::<PrePullResult>(content) {
                Ok(r) => {
                    let mut fields = serde_json::Map::new();
                    if !r.image_status.is_empty() {
                        fields.insert(
                            "imageStatus".into(),
                            serde_json::to_value(&r.image_status).unwrap_or_default(),
                        );
                    }
                    let actions = (!r.action_flow.is_empty()).then(|| {
                        r.action_flow
                            .iter()
                            .filter_map(|a| serde_json::to_value(a).ok())
                            .collect()
                    });
                    Self {
                        phase: r.phase,
                        reason: r.reason,
                        fields,
                        actions,
                    }
                }
                Err(e) => Self::refused(format!("the node's answer is not understood: {e}")),
            },
            Kind::Upgrade | Kind::Config => {
                match serde_json::from_value::<operations::UpgradeResult>(content) {
                    Ok(r) => {
                        let mut fields = serde_json::Map::new();
                        if kind == Kind::Upgrade {
                            fields.insert("currentVersion".into(), r.current_version.into());
                            if !r.historic_version.is_empty() {
                                fields.insert("historicVersion".into(), r.historic_version.into());
                            }
                        }
                        Self {
                            phase: r.phase,
                            reason: r.reason,
                            fields,
                            actions: Some(
                                r.action_flow
                                    .iter()
                                    .filter_map(|a| serde_json::to_value(a).ok())
                                    .collect(),
                            ),
                        }
                    }
                    Err(e) => Self::refused(format!("the node's answer is not understood: {e}")),
                }
            }
        }
    }
}

/// One node's part of a job, as `status.nodeStatus` shows it.
#[derive(Debug, Clone)]
struct NodeTask {
    node: String,
    phase: NodePhase,
    reason: String,
    fields: serde_json::Map<String, Value>,
    actions: Vec<Value>,
}

impl NodeTask {
    fn new(node: &str) -> Self {
        Self {
            node: node.into(),
            phase: NodePhase::Pending,
            reason: String::new(),
            fields: Default::default(),
            actions: Vec::new(),
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"nodeName": self.node, "phase": self.phase});
        if !self.reason.is_empty() {
            v["reason"] = self.reason.clone().into();
        }
        for (k, f) in &self.fields {
            v[k] = f.clone();
        }
        if !self.actions.is_empty() {
            v["actionFlow"] = Value::Array(self.actions.clone());
        }
        v
    }

    /// Read back from a status written before (a restart of cloudcore).
    fn from_json(v: &Value) -> Option<Self> {
        let phase = serde_json::from_value(v["phase"].clone()).unwrap_or_default();
        Some(Self {
            node: v["nodeName"].as_str()?.to_string(),
            // Asked again: what was in progress may not have finished.
            phase: match phase {
                NodePhase::InProgress => NodePhase::Pending,
                p => p,
            },
            reason: v["reason"].as_str().unwrap_or_default().into(),
            fields: ["imageStatus", "currentVersion", "historicVersion"]
                .into_iter()
                .filter(|k| !v[*k].is_null())
                .map(|k| (k.to_string(), v[k].clone()))
                .collect(),
            actions: v["actionFlow"].as_array().cloned().unwrap_or_default(),
        })
    }

    /// What the node said: its last answer (`over`), or how it is going.
    fn update(&mut self, kind: Kind, r: Report, over: bool) {
        self.phase = r.phase;
        self.reason = r.reason;
        self.fields.extend(r.fields);
        match r.actions {
            // The node's own steps.
            Some(steps) => self.actions = steps,
            None if over && kind == Kind::PrePull => {
                let ok = self.phase == NodePhase::Successful;
                let step = operations::Action::at(
                    "Pull",
                    ok,
                    self.reason.clone(),
                    std::time::SystemTime::now(),
                );
                self.actions
                    .push(serde_json::to_value(step).unwrap_or_default());
            }
            None => {}
        }
    }
}

/// Runs the controller until `stop` (on the leader only: `leader::while_leading`). `data_dir`:
/// cloudcore's, whose `releases/` holds what `NodeUpgradeJob`s install.
pub(crate) async fn run(
    client: kube::Client,
    hub: Arc<CloudHub>,
    data_dir: PathBuf,
    stop: CancellationToken,
) {
    let watch = |kind: Kind| {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
        watcher(api, watcher::Config::default())
            .default_backoff()
            .map(move |ev| (kind, ev))
    };
    let events = futures_util::stream::select(
        futures_util::stream::select(watch(Kind::PrePull), watch(Kind::Upgrade)),
        watch(Kind::Config),
    );
    futures_util::pin_mut!(events);
    let mut jobs: HashMap<String, CancellationToken> = HashMap::new();
    loop {
        let (kind, ev) = tokio::select! {
            _ = stop.cancelled() => break,
            ev = events.next() => match ev {
                Some(e) => e,
                None => break,
            },
        };
        // A job's entry stays after its task ends (removed when the job is deleted): an event
        // older than its last status must not start it again.
        match ev {
            Err(e) => {
                tracing::warn!(kind = kind.name(), error = %e, "jobs: watching failed; watched again")
            }
            Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job)) => {
                let uid = job.uid().unwrap_or_default();
                let phase = job.data["status"]["phase"].as_str().unwrap_or_default();
                let over = matches!(phase, "Completed" | "Failure");
                if over || jobs.contains_key(&uid) || job.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let token = stop.child_token();
                tokio::spawn(run_job(
                    kind,
                    client.clone(),
                    hub.clone(),
                    data_dir.join("releases"),
                    job,
                    token.clone(),
                ));
                jobs.insert(uid, token);
            }
            Ok(watcher::Event::Delete(job)) => {
                if let Some(token) = jobs.remove(&job.uid().unwrap_or_default()) {
                    token.cancel();
                }
            }
            Ok(_) => {}
        }
    }
    for token in jobs.into_values() {
        token.cancel();
    }
}

/// Writes a job's status (its phase, reason and every node's part).
async fn write_status(
    kind: Kind,
    api: &Api<DynamicObject>,
    name: &str,
    phase: JobPhase,
    reason: &str,
    tasks: &[NodeTask],
) {
    let status = json!({"status": {
        "phase": phase.as_str(),
        "reason": reason,
        "nodeStatus": tasks.iter().map(NodeTask::to_json).collect::<Vec<_>>(),
    }});
    if let Err(e) = api
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
    {
        tracing::warn!(kind = kind.name(), job = name, error = %e, "jobs: cannot write the job's status");
    }
}

/// The job's task: from its template to its last status.
async fn run_job(
    kind: Kind,
    client: kube::Client,
    hub: Arc<CloudHub>,
    releases: PathBuf,
    job: DynamicObject,
    token: CancellationToken,
) {
    let name = job.name_any();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &kind.resource());
    let spec = &job.data["spec"];
    let template = match kind {
        Kind::PrePull => plan::prepull_template(spec),
        Kind::Upgrade => plan::upgrade_template(spec),
        Kind::Config => plan::config_template(spec),
    }
    .map_err(|e| e.to_string());
    let refuse = |e: String| {
        let api = api.clone();
        let name = name.clone();
        async move {
            tracing::warn!(kind = kind.name(), job = %name, reason = %e, "jobs: refused");
            write_status(kind, &api, &name, JobPhase::Failure, &e, &[]).await;
        }
    };
    let template = match template {
        Ok(t) => t,
        Err(e) => return refuse(e).await,
    };
    let content = match kind {
        Kind::PrePull => {
            let auths = match &template.image_secrets {
                None => BTreeMap::new(),
                Some((ns, secret)) => match registry_auths(&client, ns, secret).await {
                    Ok(a) => a,
                    Err(e) => return refuse(e.to_string()).await,
                },
            };
            serde_json::to_value(PrePull {
                images: template.images.clone(),
                retry_times: template.retry_times,
                // The node answers a little before the cloud stops waiting.
                timeout_seconds: template.timeout_seconds.saturating_sub(2).max(1),
                check_items: template.check_items.clone(),
                auths,
            })
        }
        Kind::Upgrade => match release(&releases, &template.version).await {
            Ok(sha256) => serde_json::to_value(Upgrade {
                path: format!("/releases/{}/edgecore", template.version),
                version: template.version.clone(),
                sha256,
                // Half the job's time to download and swap, half for the new one to connect.
                health_seconds: (template.timeout_seconds / 2).max(10),
                check_items: template.check_items.clone(),
            }),
            Err(e) => return refuse(e.to_string()).await,
        },
        Kind::Config => serde_json::to_value(ConfigUpdate {
            update_fields: template.update_fields.clone(),
            health_seconds: (template.timeout_seconds / 2).max(10),
            check_items: template.check_items.clone(),
        }),
    }
    .unwrap_or_default();
    let nodes = loop {
        match Api::<Node>::all(client.clone())
            .list(&Default::default())
            .await
        {
            Ok(l) => {
                break l
                    .items
                    .into_iter()
                    .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
                    .collect();
            }
            Err(e) => {
                // Not a verdict on the job: it waits for the API.
                tracing::warn!(job = %name, error = %e, "jobs: cannot list nodes; tried again in 5 s");
                tokio::select! {
                    _ = token.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    };
    let (targets, missing) = plan::targets(&template, &nodes);
    let before: HashMap<String, NodeTask> = job.data["status"]["nodeStatus"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(NodeTask::from_json)
        .map(|t| (t.node.clone(), t))
        .collect();
    let mut tasks: Vec<NodeTask> = targets
        .iter()
        .map(|n| before.get(n).cloned().unwrap_or_else(|| NodeTask::new(n)))
        .collect();
    for n in missing {
        let mut t = NodeTask::new(&n);
        t.phase = NodePhase::Failure;
        t.reason = format!("no node named {n}");
        tasks.push(t);
    }
    let mut working: JoinSet<(usize, Report)> = JoinSet::new();
    let (progress_tx, mut progress) = mpsc::channel::<(usize, Report)>(64);
    let mut written: Option<Value> = None;
    loop {
        let phases: Vec<NodePhase> = tasks.iter().map(|t| t.phase).collect();
        let mut next = plan::next(template.rules, &phases);
        for i in std::mem::take(&mut next.start) {
            tasks[i].phase = NodePhase::InProgress;
            tasks[i].reason.clear();
            let ask = Ask {
                kind,
                node: tasks[i].node.clone(),
                job: name.clone(),
                content: content.clone(),
                wait: Duration::from_secs(template.timeout_seconds.into()),
            };
            let (hub, progress) = (hub.clone(), progress_tx.clone());
            working.spawn(async move { (i, ask.run(&hub, i, &progress).await) });
        }
        if next.phase.is_final() {
            let failed: Vec<(&str, &str)> = tasks
                .iter()
                .filter(|t| t.phase == NodePhase::Failure)
                .map(|t| (t.node.as_str(), t.reason.as_str()))
                .collect();
            next.reason = plan::with_failures(&next.reason, &failed);
        }
        let shown = json!([
            next.phase.as_str(),
            next.reason,
            tasks.iter().map(NodeTask::to_json).collect::<Vec<_>>()
        ]);
        if written.as_ref() != Some(&shown) {
            write_status(kind, &api, &name, next.phase, &next.reason, &tasks).await;
            written = Some(shown);
        }
        if next.phase.is_final() {
            tracing::info!(kind = kind.name(), job = %name, phase = next.phase.as_str(), reason = %next.reason, "jobs: over");
            return;
        }
        tokio::select! {
            _ = token.cancelled() => return,
            Some((i, report)) = progress.recv() => {
                if tasks[i].phase == NodePhase::InProgress {
                    tasks[i].update(kind, report, false);
                    tasks[i].phase = NodePhase::InProgress;
                }
            }
            done = working.join_next() => match done {
                Some(Ok((i, report))) => tasks[i].update(kind, report, true),
                Some(Err(e)) => {
                    tracing::warn!(job = %name, error = %e, "jobs: a node's task failed");
                    return;
                }
                None => {}
            },
        }
    }
}

/// Why a job cannot be asked of its nodes.
#[derive(Debug, thiserror::Error)]
enum Unaskable {
    #[error("no release {version:?}: put its edgecore at {file} on cloudcore ({error})")]
    NoRelease {
        version: String,
        file: String,
        error: std::io::Error,
    },
    #[error("spec.imagePrePullTemplate.imageSecrets {ns}/{name}: {why}")]
    Secret {
        ns: String,
        name: String,
        why: String,
    },
}

/// The SHA-256 (lowercase hex) of the release `version`'s edgecore; the error says where it
/// was looked for.
async fn release(releases: &Path, version: &str) -> Result<String, Unaskable> {
    let file = releases.join(version).join("edgecore");
    let read = file.clone();
    let digest = tokio::task::spawn_blocking(move || pki::sha256_file(&read))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    digest.map_err(|error| Unaskable::NoRelease {
        version: version.to_string(),
        file: file.display().to_string(),
        error,
    })
}

/// One node's part of a job, asked over its session.
struct Ask {
    kind: Kind,
    node: String,
    job: String,
    content: Value,
    wait: Duration,
}

impl Ask {
    /// Asks until the node's part is over or `wait` is; waits for its session while it is away
    /// (an upgrading node is away while it restarts). How it is going goes to `progress`.
    async fn run(
        &self,
        hub: &CloudHub,
        i: usize,
        progress: &mpsc::Sender<(usize, Report)>,
    ) -> Report {
        let node = &self.node;
        let secs = self.wait.as_secs();
        let deadline = Instant::now() + self.wait;
        let mut answered = false;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Report::refused(if answered {
                    format!("node {node} was not done within timeoutSeconds ({secs}s)")
                } else {
                    format!(
                        "node {node} had no session with this cloudcore within timeoutSeconds ({secs}s)"
                    )
                });
            }
            let msg = Message::new(
                "cloudhub",
                "operations",
                operations::OPERATION,
                format!(
                    "{}/{}/{}",
                    operations::NAMESPACE,
                    self.kind.message_kind(),
                    self.job
                ),
                self.content.clone(),
            );
            // An upgrading node answers at once from its state, but may restart before it
            // does: asked again soon rather than waited for to the end.
            let wait = match self.kind {
                Kind::Upgrade | Kind::Config => left.min(Duration::from_secs(15)),
                Kind::PrePull => left,
            };
            match hub.ask(node, msg, wait).await {
                Ok(answer) if answer.route.operation == "response" => {
                    answered = true;
                    let report = Report::of(self.kind, answer.content);
                    if report.phase != NodePhase::InProgress {
                        return report;
                    }
                    let _ = progress.try_send((i, report));
                    tokio::time::sleep(UPGRADE_POLL.min(left)).await;
                }
                Ok(answer) => {
                    let said = answer.content["message"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| answer.content.to_string());
                    return Report::refused(format!("node {node} refused: {said}"));
                }
                Err(Unanswered::Late(..)) if !answered => {
                    return Report::refused(format!(
                        "node {node} did not answer within timeoutSeconds ({secs}s)"
                    ));
                }
                // Restarting: its session goes and comes back.
                Err(Unanswered::Late(..) | Unanswered::Away(_)) => {
                    tokio::time::sleep(AWAY_RETRY.min(left)).await;
                }
                Err(Unanswered::Busy(_)) => {
                    tokio::time::sleep(Duration::from_secs(1).min(left)).await;
                }
            }
        }
    }
}

/// The registries' credentials of a `kubernetes.io/dockerconfigjson` Secret; the error says
/// what is wrong with it.
async fn registry_auths(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Result<BTreeMap<String, RegistryAuth>, Unaskable> {
    let refused = |why: String| Unaskable::Secret {
        ns: ns.to_string(),
        name: name.to_string(),
        why,
    };
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| refused(format!("cannot read the Secret: {e}")))?;
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(".dockerconfigjson"))
        .ok_or_else(|| refused("the Secret has no .dockerconfigjson".into()))?;
    let config: Value = serde_json::from_slice(&raw.0)
        .map_err(|e| refused(format!(".dockerconfigjson is not JSON: {e}")))?;
    let auths: BTreeMap<String, RegistryAuth> = serde_json::from_value(config["auths"].clone())
        .map_err(|e| refused(format!(".dockerconfigjson has no auths map: {e}")))?;
    // Docker Hub's key is a URL in most configs.
    Ok(auths
        .into_iter()
        .map(|(host, a)| {
            let h = host
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            let h = if h == "index.docker.io" {
                "docker.io".into()
            } else {
                h
            };
            (h, a)
        })
        .collect())
}
