//! An `ImagePrePullJob`'s part on this node: the cloud asks (`operations/imageprepulljob/{job}`,
//! [`api::operations::PrePull`]), edged's runtime pulls each image (tried again `retryTimes`
//! times, with the registry's credentials when the job has them), and the answer says each
//! image's result. The work runs beside the session, which answers when it is done; at most
//! [`AT_ONCE`] jobs pull at a time, a further one is refused, saying so.

use api::message::Message;
use api::operations::{Action, ImageStatus, PrePull, PrePullResult, registry_of};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Semaphore, mpsc};

/// Jobs pulling at once on a node.
pub(super) const AT_ONCE: usize = 2;

/// Starts the work of `question`; what to answer at once when it cannot start.
pub(super) fn start(
    runtime: Option<Arc<edged::Runtime>>,
    data_dir: std::path::PathBuf,
    slots: &Arc<Semaphore>,
    question: &Message,
    answers: mpsc::Sender<Message>,
) -> Option<Message> {
    let reply = |r: &PrePullResult| {
        let mut m = question.response(serde_json::to_value(r).unwrap_or_default());
        m.route.source = "edgehub".into();
        m
    };
    let ask: PrePull = match serde_json::from_value(question.content.clone()) {
        Ok(a) => a,
        Err(e) => {
            return Some(reply(&PrePullResult::refused(format!(
                "the job's question is not understood here: {e}"
            ))));
        }
    };
    let Some(runtime) = runtime else {
        return Some(reply(&PrePullResult::refused(
            "edged is off on this node: no container runtime to pull into",
        )));
    };
    let Ok(slot) = slots.clone().try_acquire_owned() else {
        return Some(reply(&PrePullResult::refused(format!(
            "{AT_ONCE} image pre-pull jobs are already running on this node"
        ))));
    };
    let question = question.clone();
    tokio::spawn(async move {
        let _slot = slot;
        let result = match super::checks::run(&ask.check_items, &data_dir).await {
            Err(why) => {
                let mut r = PrePullResult::refused(format!("checkItems: {why}"));
                r.action_flow.push(action("Check", false, why.to_string()));
                r
            }
            Ok(found) => {
                let mut r = pull_all(&runtime, &ask).await;
                let pulled = r.phase == api::operations::NodePhase::Successful;
                if !ask.check_items.is_empty() {
                    r.action_flow.push(action("Check", true, found));
                }
                let why = r.reason.clone();
                r.action_flow.push(action("Pull", pulled, why));
                r
            }
        };
        tracing::info!(resource = %question.route.resource, phase = ?result.phase, reason = %result.reason, "edgehub: image pre-pull done");
        let mut m = question.response(serde_json::to_value(&result).unwrap_or_default());
        m.route.source = "edgehub".into();
        // The session may have ended: the cloud asks again then.
        let _ = answers.send(m).await;
    });
    None
}

/// Pulls every image of `ask` within its time.
async fn pull_all(runtime: &edged::Runtime, ask: &PrePull) -> PrePullResult {
    let deadline = Instant::now() + Duration::from_secs(ask.timeout_seconds.into());
    let mut out = Vec::new();
    for image in &ask.images {
        let auth = ask
            .auths
            .get(registry_of(image))
            .map(|a| edged::AuthConfig {
                username: a.username.clone(),
                password: a.password.clone(),
                auth: a.auth.clone(),
                server_address: registry_of(image).to_string(),
                ..Default::default()
            });
        let mut reason = String::new();
        let mut pulled = false;
        for _ in 0..=ask.retry_times {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                reason = format!(
                    "not pulled within timeoutSeconds ({}s)",
                    ask.timeout_seconds
                );
                break;
            }
            match tokio::time::timeout(left, runtime.pull_image_with(image, auth.clone())).await {
                Ok(Ok(_)) => {
                    pulled = true;
                    break;
                }
                Ok(Err(e)) => reason = e.status.message().to_string(),
                Err(_) => {
                    reason = format!(
                        "not pulled within timeoutSeconds ({}s)",
                        ask.timeout_seconds
                    )
                }
            }
        }
        out.push(ImageStatus {
            image: image.clone(),
            status: if pulled { "True" } else { "False" }.into(),
            reason: if pulled { String::new() } else { reason },
        });
    }
    PrePullResult::of(out)
}

fn action(name: &str, ok: bool, reason: String) -> Action {
    Action::at(name, ok, reason, std::time::SystemTime::now())
}
