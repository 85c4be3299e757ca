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
//!
//! These rules are [`Election`] (pure, on tokio's clock, tested rule by rule with the clock
//! paused); `run` reads and writes the Lease and does what it says.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
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
pub(crate) fn start(
    client: kube::Client,
    settings: Settings,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(client, settings, leading, stop))
}

/// Runs `work` while this replica leads: started when it becomes leader, cancelled when it
/// stops leading (or at `stop`).
pub(crate) fn while_leading<F, Fut>(
    mut leader: watch::Receiver<bool>,
    stop: CancellationToken,
    work: F,
) where
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

/// What a round does with the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// There is none: make it, held by this replica.
    Create,
    /// This replica holds it: renew it.
    Renew,
    /// Another replica's renewal lapsed (or nobody holds it): take it over.
    TakeOver,
    /// Another replica holds it and renews it: follow.
    StandBy,
}

/// The holder and renewal of a Lease, as one round read them.
#[derive(Clone, Debug, Default, PartialEq)]
struct Seen {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    /// Its `leaseDurationSeconds`, when it says.
    duration: Option<Duration>,
}

impl Seen {
    fn of(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
            renew_time: spec.renew_time.clone(),
            duration: spec
                .lease_duration_seconds
                .map(|d| Duration::from_secs(d.max(1) as u64)),
        }
    }
}

/// The election's memory between rounds, on this replica's own clock.
#[derive(Debug)]
struct Election {
    identity: String,
    lease_duration: Duration,
    /// The holder and renewal last seen, and when this replica first saw them.
    seen: Option<(Seen, Instant)>,
    /// When this replica last wrote the Lease as its holder.
    renewed: Option<Instant>,
}

impl Election {
    fn new(s: &Settings) -> Self {
        Self {
            identity: s.identity.clone(),
            lease_duration: s.lease_duration,
            seen: None,
            renewed: None,
        }
    }

    /// What to do with the Lease read at `now` (`None`: there is none).
    fn step(&mut self, lease: Option<Seen>, now: Instant) -> Step {
        let Some(lease) = lease else {
            return Step::Create;
        };
        if lease.holder.as_deref() == Some(self.identity.as_str()) {
            return Step::Renew;
        }
        if lease.holder.is_none() {
            return Step::TakeOver;
        }
        let duration = lease.duration.unwrap_or(self.lease_duration);
        let since = match &self.seen {
            Some((seen, at)) if *seen == lease => *at,
            // A renewal seen for the first time counts from now, by this replica's clock
            // (never the writer's).
            _ => {
                self.seen = Some((lease, now));
                now
            }
        };
        if now.duration_since(since) >= duration {
            Step::TakeOver
        } else {
            Step::StandBy
        }
    }

    /// This replica wrote the Lease as its holder at `now`.
    fn renewed(&mut self, now: Instant) {
        self.renewed = Some(now);
    }

    /// Whether a leader whose write failed at `now` still leads: until two thirds of the
    /// Lease's duration passed since its last renewal, before any other replica may take over.
    fn still_leads(&self, now: Instant) -> bool {
        self.renewed
            .is_some_and(|t| now.duration_since(t) < self.lease_duration.mul_f64(2.0 / 3.0))
    }
}

async fn run(
    client: kube::Client,
    s: Settings,
    leading: watch::Sender<bool>,
    stop: CancellationToken,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    let mut election = Election::new(&s);
    let retry = s.renew_every.min(Duration::from_secs(2));
    loop {
        let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let outcome = match api.get_opt(&s.name).await {
            Err(e) => Err(e),
            Ok(current) => {
                let spec = current
                    .as_ref()
                    .and_then(|c| c.spec.clone())
                    .unwrap_or_default();
                let step = election.step(current.as_ref().map(|_| Seen::of(&spec)), Instant::now());
                match (step, current) {
                    (Step::StandBy, _) => Ok(false),
                    (Step::Create, _) | (_, None) => api
                        .create(&PostParams::default(), &lease(&s, None, now.clone(), 0))
                        .await
                        .map(|_| true),
                    (step, Some(current)) => {
                        let mine = step == Step::Renew;
                        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
                        let acquired = if mine {
                            spec.acquire_time.clone()
                        } else {
                            None
                        };
                        let mut next = lease(&s, acquired, now.clone(), transitions);
                        next.metadata.resource_version = current.metadata.resource_version.clone();
                        if !mine {
                            tracing::info!(previous = ?spec.holder_identity, "leader election: taking the Lease over");
                        }
                        api.replace(&s.name, &PostParams::default(), &next)
                            .await
                            .map(|_| true)
                    }
                }
            }
        };
        match outcome {
            Ok(true) => {
                election.renewed(Instant::now());
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
                if *leading.borrow() && !election.still_leads(Instant::now()) {
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
    let Some(spec) = given_up(current.spec.take().unwrap_or_default(), &s.identity) else {
        return;
    };
    current.spec = Some(spec);
    match api.replace(&s.name, &PostParams::default(), &current).await {
        Ok(_) => tracing::info!("leader election: Lease given up"),
        Err(e) => tracing::warn!(error = %e, "leader election: could not give the Lease up"),
    }
}

/// The Lease given up by `identity` (nobody holds it, and it lasts 1 s), or `None` when
/// `identity` does not hold it: a replica gives up only its own Lease.
fn given_up(mut spec: LeaseSpec, identity: &str) -> Option<LeaseSpec> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    spec.holder_identity = None;
    spec.lease_duration_seconds = Some(1);
    Some(spec)
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
        sim::poll::eventually_async(5, what, async || f().then_some(())).await
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

    /// What `e` does with `lease` read now.
    fn now(e: &mut Election, lease: Option<Seen>) -> Step {
        e.step(lease, Instant::now())
    }

    fn settings() -> Settings {
        Settings {
            namespace: "kubeedge".into(),
            name: "cloudcore".into(),
            identity: "me".into(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        }
    }

    fn held_by(holder: &str, renewed_second: i64) -> Option<Seen> {
        Some(Seen {
            holder: Some(holder.into()),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(renewed_second).expect("a time"),
            )),
            duration: Some(Duration::from_secs(15)),
        })
    }

    #[tokio::test(start_paused = true)]
    async fn no_lease_is_created_and_one_held_by_this_replica_is_renewed() {
        let mut e = Election::new(&settings());
        assert_eq!(now(&mut e, None), Step::Create);
        assert_eq!(now(&mut e, held_by("me", 1)), Step::Renew);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(now(&mut e, held_by("me", 1)), Step::Renew);
    }

    #[tokio::test(start_paused = true)]
    async fn another_takes_over_once_it_saw_the_same_renewal_for_a_whole_lease_duration() {
        let mut e = Election::new(&settings());
        assert_eq!(now(&mut e, held_by("other", 100)), Step::StandBy);
        tokio::time::advance(Duration::from_millis(14_999)).await;
        assert_eq!(now(&mut e, held_by("other", 100)), Step::StandBy);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(now(&mut e, held_by("other", 100)), Step::TakeOver);
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_renewal_restarts_the_count_whatever_time_it_names() {
        let mut e = Election::new(&settings());
        now(&mut e, held_by("other", 100));
        tokio::time::advance(Duration::from_secs(10)).await;
        // Renewed, with a renewTime far in the past (the writer's clock is not trusted):
        // a change is what counts, seen by this replica's clock.
        assert_eq!(now(&mut e, held_by("other", 5)), Step::StandBy);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(now(&mut e, held_by("other", 5)), Step::StandBy);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(now(&mut e, held_by("other", 5)), Step::TakeOver);
    }

    #[tokio::test(start_paused = true)]
    async fn the_lease_s_own_duration_counts_over_this_replica_s_setting() {
        let mut e = Election::new(&settings());
        let mut long = held_by("other", 1);
        if let Some(l) = long.as_mut() {
            l.duration = Some(Duration::from_secs(60));
        }
        now(&mut e, long.clone());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(now(&mut e, long.clone()), Step::StandBy);
        tokio::time::advance(Duration::from_secs(30)).await;
        assert_eq!(now(&mut e, long), Step::TakeOver);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_given_up_is_taken_over_at_once() {
        let mut e = Election::new(&settings());
        let given_up = Some(Seen {
            holder: None,
            ..held_by("x", 1).unwrap_or_default()
        });
        assert_eq!(now(&mut e, given_up), Step::TakeOver);
        let empty_name = Seen::of(&LeaseSpec {
            holder_identity: Some(String::new()),
            ..Default::default()
        });
        assert_eq!(now(&mut e, Some(empty_name)), Step::TakeOver);
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_cannot_renew_stops_leading_after_two_thirds_of_the_duration() {
        let mut e = Election::new(&settings());
        assert!(!e.still_leads(Instant::now()), "never renewed: not leading");
        e.renewed(Instant::now());
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(e.still_leads(Instant::now()), "within 10 s of a 15 s Lease");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(
            !e.still_leads(Instant::now()),
            "stops 5 s before another replica may take over"
        );
        e.renewed(Instant::now());
        assert!(e.still_leads(Instant::now()), "a renewal restores it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopping_replica_gives_up_only_its_own_lease_and_another_takes_it_at_once() {
        let mine = LeaseSpec {
            holder_identity: Some("me".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        let other = LeaseSpec {
            holder_identity: Some("other".into()),
            ..mine.clone()
        };
        assert_eq!(given_up(other, "me"), None);
        let released = given_up(mine, "me").expect("its own");
        assert_eq!(released.holder_identity, None);
        let mut next = Election::new(&Settings {
            identity: "next".into(),
            ..settings()
        });
        assert_eq!(now(&mut next, Some(Seen::of(&released))), Step::TakeOver);
    }
}
