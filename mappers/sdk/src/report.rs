//! Reports to edgecore over DMI: one long-lived gRPC channel on edgecore's Unix socket, and one
//! reporter task that all devices hand their reports to, so that a slow or restarting edgecore
//! never holds up a read. Reports that could not be delivered are kept (the newest value of each
//! property and the newest state of each device) and sent again with backoff.

use crate::metrics::Metrics;
use api::dmi::v1beta1 as pb;
use api::dmi::v1beta1::device_manager_service_client::DeviceManagerServiceClient;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// One property value to report.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinReport {
    pub property: String,
    pub value: String,
    pub value_type: Option<String>,
    /// Milliseconds since the epoch.
    pub timestamp: u64,
    /// The desired value the device has (written by the mapper).
    pub observed_desired: Option<String>,
    /// The property could not be read, and why (`value` is then empty and not sent): edgecore
    /// keeps it on the property until a value comes.
    pub error: Option<String>,
}

/// What a device task hands to the reporter.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    Twins {
        namespace: String,
        name: String,
        twins: Vec<TwinReport>,
    },
    /// A desired value the device (or the mapper's codec) refused for good, and why.
    WriteRefused {
        namespace: String,
        name: String,
        property: String,
        desired: String,
        error: String,
    },
    State {
        namespace: String,
        name: String,
        state: &'static str,
        /// Why (the link error when offline, what failed when unhealthy); empty when online.
        reason: String,
    },
}

/// A call to edgecore's DMI server takes at most this long.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MAX_RETRY: Duration = Duration::from_secs(10);
/// Reports taken from the queue per round; the devices among them are sent concurrently.
const ROUND: usize = 256;

/// The client side of edgecore's `DeviceManagerService`.
pub fn client(edgecore_sock: &str) -> DeviceManagerServiceClient<Channel> {
    DeviceManagerServiceClient::new(rt::transport::uds_channel(edgecore_sock, CALL_TIMEOUT))
}

#[derive(Default)]
struct Pending {
    twins: BTreeMap<String, TwinReport>,
    /// Refused desired values by property.
    refused: BTreeMap<String, api::dmi::WriteRefusal>,
    state: Option<(&'static str, String)>,
}

/// Sends reports until `cancel` (and then what is queued, once).
pub async fn run(
    client: DeviceManagerServiceClient<Channel>,
    mut rx: mpsc::Receiver<Report>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let mut pending: HashMap<(String, String), Pending> = HashMap::new();
    // What edgecore last said it refused, per device: logged when it changes.
    let mut refused: HashMap<(String, String), String> = HashMap::new();
    // After a failed round: the delay before the next, and when that is. Reports arriving
    // meanwhile are merged into what waits (newest value per property) and go with it then, so
    // that a failing edgecore is called at the announced pace, not at every new reading.
    let mut backoff = rt::Backoff::new(FIRST_RETRY, MAX_RETRY);
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut open = true;
    loop {
        // Wait for a report, or for the retry of what failed.
        let first = if pending.is_empty() {
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = rx.recv() => match r { Some(r) => Some(r), None => return },
            }
        } else {
            let at = retry_at.unwrap_or_else(tokio::time::Instant::now);
            tokio::select! {
                _ = cancel.cancelled() => return,
                r = rx.recv(), if open => {
                    open = r.is_some();
                    r
                }
                _ = tokio::time::sleep_until(at) => None,
            }
        };
        for r in first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()).take(ROUND))
        {
            merge(&mut pending, r);
        }
        if retry_at.is_some_and(|at| tokio::time::Instant::now() < at) {
            continue;
        }
        let mut calls = JoinSet::new();
        for ((namespace, name), p) in pending.drain() {
            let mut client = client.clone();
            calls.spawn(async move {
                let result = send(&mut client, &namespace, &name, &p).await;
                ((namespace, name), p, result)
            });
        }
        let mut failed = false;
        let next_retry = backoff.peek();
        while let Some(done) = calls.join_next().await {
            let Ok((key, p, result)) = done else {
                continue;
            };
            metrics.reports.fetch_add(1, Ordering::Relaxed);
            match result {
                Ok(text) => {
                    let last = refused.get(&key).map(String::as_str).unwrap_or_default();
                    if text != last {
                        if text.is_empty() {
                            refused.remove(&key);
                        } else {
                            // A value edgecore will never take (not of its property's type):
                            // retrying it would not help.
                            tracing::warn!(device = %format!("{}/{}", key.0, key.1), refused = %text, "edgecore refused reported twins");
                            refused.insert(key, text);
                        }
                    }
                }
                Err(status) if status.code() == tonic::Code::NotFound => {
                    // edgecore does not know the device (removed meanwhile): nothing to retry.
                    tracing::debug!(device = %format!("{}/{}", key.0, key.1), error = %status.message(), "report refused");
                    metrics.report_errors.fetch_add(1, Ordering::Relaxed);
                }
                Err(status) => {
                    metrics.report_errors.fetch_add(1, Ordering::Relaxed);
                    if !failed {
                        tracing::warn!(device = %format!("{}/{}", key.0, key.1), error = %status.message(), retry_in = ?next_retry, "report to edgecore failed; keeping it");
                    }
                    failed = true;
                    // Newer reports that arrived meanwhile win over the failed one.
                    let slot = pending.entry(key).or_default();
                    for (k, t) in p.twins {
                        slot.twins.entry(k).or_insert(t);
                    }
                    for (k, r) in p.refused {
                        slot.refused.entry(k).or_insert(r);
                    }
                    if slot.state.is_none() {
                        slot.state = p.state;
                    }
                }
            }
        }
        if failed {
            retry_at = Some(tokio::time::Instant::now() + backoff.next_delay());
        } else {
            backoff.reset();
            retry_at = None;
        }
    }
}

fn merge(pending: &mut HashMap<(String, String), Pending>, r: Report) {
    match r {
        Report::Twins {
            namespace,
            name,
            twins,
        } => {
            let slot = pending.entry((namespace, name)).or_default();
            for t in twins {
                slot.twins.insert(t.property.clone(), t);
            }
        }
        Report::WriteRefused {
            namespace,
            name,
            property,
            desired,
            error,
        } => {
            pending
                .entry((namespace, name))
                .or_default()
                .refused
                .insert(property, api::dmi::WriteRefusal { desired, error });
        }
        Report::State {
            namespace,
            name,
            state,
            reason,
        } => {
            pending.entry((namespace, name)).or_default().state = Some((state, reason));
        }
    }
}

/// The twins of a report as DMI sends them (those with an error go in a header instead).
fn dmi_twins(p: &Pending) -> Vec<pb::Twin> {
    p.twins
        .values()
        .filter(|t| t.error.is_none())
        .map(|t| {
            // As KubeEdge's mapper-framework sends them: `type` and `timestamp` always, and
            // always an `observedDesired` (empty until a desired value is applied): KubeEdge's
            // edgecore reads it without a nil check and stops on a report without one.
            let metadata = HashMap::from([
                ("timestamp".to_string(), t.timestamp.to_string()),
                ("type".to_string(), t.value_type.clone().unwrap_or_default()),
            ]);
            pb::Twin {
                property_name: t.property.clone(),
                observed_desired: Some(pb::TwinProperty {
                    value: t.observed_desired.clone().unwrap_or_default(),
                    metadata: metadata.clone(),
                }),
                reported: Some(pb::TwinProperty {
                    value: t.value.clone(),
                    metadata,
                }),
            }
        })
        .collect()
}

async fn send(
    client: &mut DeviceManagerServiceClient<Channel>,
    namespace: &str,
    name: &str,
    p: &Pending,
) -> Result<String, tonic::Status> {
    let mut refused = String::new();
    if !p.twins.is_empty() || !p.refused.is_empty() {
        // Errors go beside the values, in a header KubeEdge's edgecore ignores: an empty value
        // in the twin list would be taken as a value there.
        let errors: BTreeMap<&str, &str> = p
            .twins
            .values()
            .filter_map(|t| Some((t.property.as_str(), t.error.as_deref()?)))
            .collect();
        let twins = dmi_twins(p);
        let mut request = tonic::Request::new(pb::ReportDeviceStatusRequest {
            device_name: name.to_string(),
            device_namespace: namespace.to_string(),
            reported_device: Some(pb::DeviceStatus {
                twins,
                report_to_cloud: true,
                report_cycle: 0,
            }),
        });
        if !errors.is_empty()
            && let Ok(json) = serde_json::to_vec(&errors)
        {
            request.metadata_mut().insert_bin(
                api::dmi::PROPERTY_ERRORS_HEADER,
                tonic::metadata::MetadataValue::from_bytes(&json),
            );
        }
        if !p.refused.is_empty()
            && let Ok(json) = serde_json::to_vec(&p.refused)
        {
            request.metadata_mut().insert_bin(
                api::dmi::WRITE_ERRORS_HEADER,
                tonic::metadata::MetadataValue::from_bytes(&json),
            );
        }
        let response = client.report_device_status(request).await?;
        // edgecore names the twins it refused while storing the others.
        if let Some(v) = response.metadata().get("x-refused-twins") {
            refused = v.to_str().unwrap_or_default().to_string();
        }
    }
    if let Some((state, reason)) = &p.state {
        let mut request = tonic::Request::new(pb::ReportDeviceStatesRequest {
            device_name: name.to_string(),
            device_namespace: namespace.to_string(),
            state: state.to_string(),
        });
        if !reason.is_empty() {
            request.metadata_mut().insert_bin(
                api::dmi::STATE_REASON_HEADER,
                tonic::metadata::MetadataValue::from_bytes(reason.as_bytes()),
            );
        }
        client.report_device_states(request).await?;
    }
    Ok(refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(v: u32) -> Report {
        Report::Twins {
            namespace: "default".into(),
            name: "d".into(),
            twins: vec![TwinReport {
                property: "p".into(),
                value: v.to_string(),
                value_type: None,
                timestamp: 0,
                observed_desired: None,
                error: None,
            }],
        }
    }

    /// Every twin carries an `observedDesired` (empty until a desired value is applied) and
    /// `type` and `timestamp`, as KubeEdge's mapper-framework sends them: KubeEdge's edgecore
    /// dereferences `observedDesired` unchecked. A twin with an error is not among them.
    #[test]
    fn every_twin_has_an_observed_desired_as_kubeedges_framework_sends() {
        let mut p = Pending::default();
        let Report::Twins { twins, .. } = reading(5) else {
            unreachable!("reading() makes twins")
        };
        let mut applied = twins[0].clone();
        applied.property = "q".into();
        applied.value_type = Some("int".into());
        applied.observed_desired = Some("7".into());
        let mut failing = twins[0].clone();
        failing.property = "r".into();
        failing.error = Some("exception 2".into());
        for t in [twins[0].clone(), applied, failing] {
            p.twins.insert(t.property.clone(), t);
        }
        let mut out = dmi_twins(&p);
        out.sort_by(|a, b| a.property_name.cmp(&b.property_name));
        assert_eq!(out.len(), 2, "{out:?}");
        let od = |t: &pb::Twin| t.observed_desired.clone().expect("observedDesired is sent");
        assert_eq!(od(&out[0]).value, "");
        assert_eq!(od(&out[1]).value, "7");
        assert_eq!(od(&out[1]).metadata["type"], "int");
        for t in &out {
            let r = t.reported.as_ref().expect("reported");
            assert!(r.metadata.contains_key("type") && r.metadata.contains_key("timestamp"));
        }
    }

    /// An edgecore that cannot be reached is called at the backoff's pace, not once per new
    /// reading (it was about 8 calls a second with a 100 ms collect cycle, while the log said
    /// `retry_in=10s`).
    #[tokio::test]
    async fn a_failing_edgecore_is_retried_at_the_backoff_pace_whatever_the_readings() {
        let sock = std::env::temp_dir().join(format!("no-edgecore-{}.sock", std::process::id()));
        let metrics = Arc::new(Metrics::default());
        let cancel = CancellationToken::new();
        let (tx, rx) = mpsc::channel(64);
        let task = tokio::spawn(run(
            client(&sock.to_string_lossy()),
            rx,
            metrics.clone(),
            cancel.clone(),
        ));
        // 150 readings over about 1.5 s: backoff 200 ms, 400 ms, 800 ms allows 4 calls.
        for v in 0..150 {
            tx.send(reading(v)).await.expect("reporter runs");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
        let _ = task.await;
        let calls = metrics.report_errors.load(Ordering::Relaxed);
        assert!((1..=6).contains(&calls), "{calls} calls");
    }
}
