//! Which replica runs the controllers that must run once (the DaemonSet controller, the API's
//! garbage collection and namespace cleanup, the device controller's DeviceStatus creation and
//! profile ConfigMaps): the holder of a `coordination.k8s.io/v1` Lease, as client-go's leader
//! election elects one (`kubeedge/cloudcore` by default; `modules.leaderElection`).
//!
//! - The holder renews the Lease every `renewSeconds`; it stops leading when it could not
//!   renew for two thirds of `leaseDurationSeconds` (before another replica may take over).
//! - Another replica takes the Lease over once it has seen the same renewal for a whole
//!   `leaseDurationSeconds` by its own clock (no clock is compared with another's). Every write
//!   names the resourceVersion it was decided on, so two replicas cannot both take it.
//! - A replica that stops (SIGTERM) gives the Lease up at once, for the next to take over
//!   without waiting.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where the Lease is and how it is held.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub name: String,
    /// This replica's name in `holderIdentity`.
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

/// Starts the election: `leading` says whether this replica leads now. The task ends after
/// `stop`, once it gave the Lease up.
pub fn start(
    client: kube::Client,
    settings: Settings,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(client, settings, leading, stop))
}

/// Runs `work` while this replica leads: started when it becomes leader, cancelled when it
/// stops leading (or at `stop`).
pub fn while_leading<F, Fut>(mut leader: watch::Receiver<bool>, stop: CancellationToken, work: F)
where
    F: Fn(CancellationToken) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let became = leader.wait_for(|l| *l).await.is_ok();
            if !became {
                return;
            }
            let token = stop.child_token();
            let task = tokio::spawn(work(token.clone()));
            tokio::select! {
                _ = stop.cancelled() => return,
                open = async { leader.wait_for(|l| !*l).await.is_ok() } => {
                    if !open {
                        // Nobody elects (one cloudcore alone): it leads until it stops.
                        stop.cancelled().await;
                        return;
                    }
                    token.cancel();
                    let _ = task.await;
                }
            }
        }
    });
}

async fn run(
    client: kube::Client,
    s: Settings,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    // The other holder's last renewal as this replica saw it, and when it saw it change.
    let mut observed: Option<(Option<String>, Option<MicroTime>)> = None;
    let mut observed_at = Instant::now();
    let mut renewed_at: Option<Instant> = None;
    let retry = s.renew_every.min(Duration::from_secs(2));
    loop {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let outcome = match api.get_opt(&s.name).await {
            Ok(None) => api
                .create(&PostParams::default(), &lease(&s, None, now.clone(), 0))
                .await
                .map(|_| true),
            Ok(Some(current)) => {
                let spec = current.spec.clone().unwrap_or_default();
                let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
                let mine = holder.as_deref() == Some(s.identity.as_str());
                let seen = (holder.clone(), spec.renew_time.clone());
                if observed.as_ref() != Some(&seen) {
                    observed = Some(seen);
                    observed_at = Instant::now();
                }
                let duration = spec
                    .lease_duration_seconds
                    .map_or(s.lease_duration, |d| Duration::from_secs(d.max(1) as u64));
                let expired = holder.is_none() || observed_at.elapsed() >= duration;
                if mine || expired {
                    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
                    let acquired = if mine {
                        spec.acquire_time.clone()
                    } else {
                        None
                    };
                    let mut next = lease(&s, acquired, now.clone(), transitions);
                    next.metadata.resource_version = current.metadata.resource_version.clone();
                    if !mine {
                        tracing::info!(previous = ?holder, "leader election: taking the Lease over");
                    }
                    api.replace(&s.name, &PostParams::default(), &next)
                        .await
                        .map(|_| true)
                } else {
                    Ok(false)
                }
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(true) => {
                renewed_at = Some(Instant::now());
                if !*leading.borrow() {
                    tracing::info!(identity = %s.identity, lease = %format!("{}/{}", s.namespace, s.name), "leader election: leading; the controllers that run once start here");
                    leading.send_replace(true);
                }
            }
            Ok(false) => {
                if *leading.borrow() {
                    tracing::warn!(
                        "leader election: another replica holds the Lease; stopping the controllers that run once"
                    );
                    leading.send_replace(false);
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                // A cluster without the Lease's namespace: made, and tried again.
                let ns = k8s_openapi::api::core::v1::Namespace {
                    metadata: ObjectMeta {
                        name: Some(s.namespace.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                match Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
                    .create(&PostParams::default(), &ns)
                    .await
                {
                    Ok(_) => {
                        tracing::info!(namespace = %s.namespace, "leader election: made the Lease's namespace")
                    }
                    Err(e) => {
                        tracing::warn!(namespace = %s.namespace, error = %e, "leader election: the Lease's namespace is missing and cannot be made")
                    }
                }
            }
            Err(e) => {
                // 409: another replica wrote first; the next round reads who.
                let lapsed =
                    renewed_at.is_none_or(|t| t.elapsed() >= s.lease_duration.mul_f64(2.0 / 3.0));
                if *leading.borrow() && lapsed {
                    tracing::warn!(error = %e, "leader election: could not renew the Lease in time; stopping the controllers that run once");
                    leading.send_replace(false);
                } else {
                    tracing::debug!(error = %e, "leader election: a round failed");
                }
            }
        }
        let pause = if *leading.borrow() {
            s.renew_every
        } else {
            retry
        };
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    if *leading.borrow() {
        leading.send_replace(false);
        release(&api, &s).await;
    }
}

fn lease(s: &Settings, acquired: Option<MicroTime>, now: MicroTime, transitions: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.namespace.clone()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(s.identity.clone()),
            lease_duration_seconds: Some(s.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    }
}

/// Gives the Lease up (a stopping leader), for the next replica to take it at once.
async fn release(api: &Api<Lease>, s: &Settings) {
    let Ok(Some(mut current)) = api.get_opt(&s.name).await else {
        return;
    };
    let spec = current.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    match api.replace(&s.name, &PostParams::default(), &current).await {
        Ok(_) => tracing::info!("leader election: Lease given up"),
        Err(e) => tracing::warn!(error = %e, "leader election: could not give the Lease up"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicI32, Ordering};

    /// Counts running copies of the work: +1 at start, -1 when cancelled.
    fn counting(
        running: Arc<AtomicI32>,
    ) -> impl Fn(
        CancellationToken,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
    + Send
    + 'static {
        move |token| {
            let running = running.clone();
            Box::pin(async move {
                running.fetch_add(1, Ordering::SeqCst);
                token.cancelled().await;
                running.fetch_sub(1, Ordering::SeqCst);
            })
        }
    }

    async fn until(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out: {what}");
    }

    #[tokio::test]
    async fn work_runs_while_leading_and_alone_until_stopped() {
        // Elected: starts when leading, stops when not, starts again.
        let (tx, rx) = watch::channel(false);
        let stop = CancellationToken::new();
        let running = Arc::new(AtomicI32::new(0));
        while_leading(rx, stop.clone(), counting(running.clone()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(running.load(Ordering::SeqCst), 0, "not leading yet");
        tx.send_replace(true);
        until("started", || running.load(Ordering::SeqCst) == 1).await;
        tx.send_replace(false);
        until("stopped", || running.load(Ordering::SeqCst) == 0).await;
        tx.send_replace(true);
        until("started again", || running.load(Ordering::SeqCst) == 1).await;
        stop.cancel();
        until("stopped with the process", || {
            running.load(Ordering::SeqCst) == 0
        })
        .await;

        // Alone: leading from the start, and nobody ever says otherwise (the sender gone).
        let (tx, rx) = watch::channel(true);
        drop(tx);
        let stop = CancellationToken::new();
        let running = Arc::new(AtomicI32::new(0));
        while_leading(rx, stop.clone(), counting(running.clone()));
        until("started alone", || running.load(Ordering::SeqCst) == 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(running.load(Ordering::SeqCst), 1, "still running alone");
        stop.cancel();
        until("stopped alone", || running.load(Ordering::SeqCst) == 0).await;
    }
}
