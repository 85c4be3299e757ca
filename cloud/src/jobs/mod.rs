//! Jobs over the fleet (`operations.kubeedge.io/v1alpha2`): `ImagePrePullJob`, images pulled
//! into chosen nodes' containerd ahead of time. Runs on the leader, with the embedded API or a
//! real cluster. Each job not over has a task: it reads the template ([`plan::prepull_template`]:
//! a bad field ends the job as `Failure` naming it), finds its nodes (by name and label
//! selector; a named node that does not exist fails at once), then asks `concurrency` nodes at
//! a time over their sessions (`CloudHub::ask`, `operations/imageprepulljob/{job}`), writing
//! each node's phase, images and reason into `status.nodeStatus` as it goes, and stops starting
//! nodes once more than `failureTolerate` of them failed ([`plan::next`]). A node away waits
//! for its session until `timeoutSeconds`. A job whose cloudcore restarts goes on where its
//! status says (nodes that were in progress are asked again: a pull is idempotent).

pub mod plan;

use crate::cloudhub::{CloudHub, Unanswered};
use api::message::Message;
use api::operations::{self, ImageStatus, NodePhase, PrePull, PrePullResult, RegistryAuth};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use plan::JobPhase;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How often a node away is looked for again.
const AWAY_RETRY: Duration = Duration::from_secs(3);

fn prepull_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operations.kubeedge.io", "v1alpha2", "ImagePrePullJob"),
        "imageprepulljobs",
    )
}

fn now() -> String {
    time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

/// One node's part of a job, as `status.nodeStatus` shows it.
#[derive(Debug, Clone)]
struct NodeTask {
    node: String,
    phase: NodePhase,
    reason: String,
    images: Vec<ImageStatus>,
    actions: Vec<Value>,
}

impl NodeTask {
    fn new(node: &str) -> Self {
        Self {
            node: node.into(),
            phase: NodePhase::Pending,
            reason: String::new(),
            images: Vec::new(),
            actions: Vec::new(),
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!({"nodeName": self.node, "phase": self.phase});
        if !self.reason.is_empty() {
            v["reason"] = self.reason.clone().into();
        }
        if !self.images.is_empty() {
            v["imageStatus"] = serde_json::to_value(&self.images).unwrap_or_default();
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
            images: serde_json::from_value(v["imageStatus"].clone()).unwrap_or_default(),
            actions: v["actionFlow"].as_array().cloned().unwrap_or_default(),
        })
    }

    fn finish(&mut self, r: PrePullResult) {
        self.phase = r.phase;
        self.reason = r.reason;
        self.images = r.image_status;
        let ok = self.phase == NodePhase::Successful;
        self.actions.push(
            json!({"action": "Pull", "status": if ok { "True" } else { "False" },
            "reason": self.reason, "time": now()}),
        );
    }
}

/// Runs the controller until `stop` (on the leader only: `leader::while_leading`).
pub async fn run(client: kube::Client, hub: Arc<CloudHub>, stop: CancellationToken) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &prepull_resource());
    let mut jobs: HashMap<String, (CancellationToken, tokio::task::JoinHandle<()>)> =
        HashMap::new();
    let events = watcher(api, watcher::Config::default()).default_backoff();
    futures_util::pin_mut!(events);
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => break,
            ev = events.next() => ev,
        };
        // A job's entry stays after its task ends (removed when the job is deleted): an event
        // older than its last status must not start it again.
        match ev {
            None => break,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "jobs: watching ImagePrePullJobs failed; watched again")
            }
            Some(Ok(watcher::Event::Apply(job) | watcher::Event::InitApply(job))) => {
                let uid = job.uid().unwrap_or_default();
                let phase = job.data["status"]["phase"].as_str().unwrap_or_default();
                let over = matches!(phase, "Completed" | "Failure");
                if over || jobs.contains_key(&uid) || job.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let token = stop.child_token();
                let task = tokio::spawn(run_job(client.clone(), hub.clone(), job, token.clone()));
                jobs.insert(uid, (token, task));
            }
            Some(Ok(watcher::Event::Delete(job))) => {
                if let Some((token, _)) = jobs.remove(&job.uid().unwrap_or_default()) {
                    token.cancel();
                }
            }
            Some(Ok(_)) => {}
        }
    }
    for (token, _) in jobs.into_values() {
        token.cancel();
    }
}

/// Writes a job's status (its phase, reason and every node's part).
async fn write_status(
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
        tracing::warn!(job = name, error = %e, "jobs: cannot write the ImagePrePullJob's status");
    }
}

/// The job's task: from its template to its last status.
async fn run_job(
    client: kube::Client,
    hub: Arc<CloudHub>,
    job: DynamicObject,
    token: CancellationToken,
) {
    let name = job.name_any();
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &prepull_resource());
    let template = match plan::prepull_template(&job.data["spec"]) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(job = %name, reason = %e, "jobs: ImagePrePullJob refused");
            write_status(&api, &name, JobPhase::Failure, &e, &[]).await;
            return;
        }
    };
    let auths = match &template.image_secrets {
        None => BTreeMap::new(),
        Some((ns, secret)) => match registry_auths(&client, ns, secret).await {
            Ok(a) => a,
            Err(e) => {
                write_status(&api, &name, JobPhase::Failure, &e, &[]).await;
                return;
            }
        },
    };
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
    if !template.check_items.is_empty() {
        for t in tasks.iter_mut().filter(|t| t.actions.is_empty()) {
            t.actions.push(json!({"action": "Check", "status": "Unknown", "time": now(),
                "reason": format!("checkItems {:?} are not checked by this cloudcore", template.check_items)}));
        }
    }
    let question = PrePull {
        images: template.images.clone(),
        retry_times: template.retry_times,
        // The node answers a little before the cloud stops waiting.
        timeout_seconds: template.timeout_seconds.saturating_sub(2).max(1),
        auths,
    };
    let mut working: JoinSet<(usize, PrePullResult)> = JoinSet::new();
    let mut written: Option<Value> = None;
    loop {
        let phases: Vec<NodePhase> = tasks.iter().map(|t| t.phase).collect();
        let next = plan::next(template.rules, &phases);
        for i in next.start {
            tasks[i].phase = NodePhase::InProgress;
            tasks[i].reason.clear();
            let (hub, node, q, job) = (
                hub.clone(),
                tasks[i].node.clone(),
                question.clone(),
                name.clone(),
            );
            let wait = Duration::from_secs(template.timeout_seconds.into());
            working.spawn(async move { (i, ask_node(&hub, &node, &job, q, wait).await) });
        }
        let shown = json!([
            next.phase.as_str(),
            next.reason,
            tasks.iter().map(NodeTask::to_json).collect::<Vec<_>>()
        ]);
        if written.as_ref() != Some(&shown) {
            write_status(&api, &name, next.phase, &next.reason, &tasks).await;
            written = Some(shown);
        }
        if next.phase.is_final() {
            tracing::info!(job = %name, phase = next.phase.as_str(), reason = %next.reason, "jobs: ImagePrePullJob over");
            return;
        }
        tokio::select! {
            _ = token.cancelled() => return,
            done = working.join_next() => match done {
                Some(Ok((i, result))) => tasks[i].finish(result),
                Some(Err(e)) => {
                    tracing::warn!(job = %name, error = %e, "jobs: a node's task failed");
                    return;
                }
                None => {}
            },
        }
    }
}

/// Asks `node` to pull; waits for its session while it is away, until `wait` is over.
async fn ask_node(
    hub: &CloudHub,
    node: &str,
    job: &str,
    question: PrePull,
    wait: Duration,
) -> PrePullResult {
    let deadline = Instant::now() + wait;
    let content = serde_json::to_value(&question).unwrap_or_default();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return PrePullResult::refused(format!(
                "node {node} had no session with this cloudcore within timeoutSeconds ({}s)",
                wait.as_secs()
            ));
        }
        let msg = Message::new(
            "cloudhub",
            "operations",
            operations::OPERATION,
            format!(
                "{}/{}/{job}",
                operations::NAMESPACE,
                operations::IMAGE_PREPULL
            ),
            content.clone(),
        );
        match hub.ask(node, msg, left).await {
            Ok(answer) if answer.route.operation == "response" => {
                return serde_json::from_value(answer.content.clone()).unwrap_or_else(|e| {
                    PrePullResult::refused(format!("node {node}'s answer is not understood: {e}"))
                });
            }
            Ok(answer) => {
                let said = answer.content["message"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| answer.content.to_string());
                return PrePullResult::refused(format!("node {node} refused: {said}"));
            }
            Err(Unanswered::Late(..)) => {
                return PrePullResult::refused(format!(
                    "node {node} did not answer within timeoutSeconds ({}s)",
                    wait.as_secs()
                ));
            }
            Err(Unanswered::Away(_)) => {
                tokio::time::sleep(AWAY_RETRY.min(left)).await;
            }
            Err(Unanswered::Busy(_)) => {
                tokio::time::sleep(Duration::from_secs(1).min(left)).await;
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
) -> Result<BTreeMap<String, RegistryAuth>, String> {
    let what = format!("spec.imagePrePullTemplate.imageSecrets {ns}/{name}");
    let secret = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| format!("{what}: cannot read the Secret: {e}"))?;
    let raw = secret
        .data
        .as_ref()
        .and_then(|d| d.get(".dockerconfigjson"))
        .ok_or_else(|| format!("{what}: the Secret has no .dockerconfigjson"))?;
    let config: Value = serde_json::from_slice(&raw.0)
        .map_err(|e| format!("{what}: .dockerconfigjson is not JSON: {e}"))?;
    let auths: BTreeMap<String, RegistryAuth> = serde_json::from_value(config["auths"].clone())
        .map_err(|e| format!("{what}: .dockerconfigjson has no auths map: {e}"))?;
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
