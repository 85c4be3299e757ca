//! A mapper's liveness carried out: the probes started when due, their results, a mapper
//! marked unreachable with its devices `unknown` and moved to the live mappers of their
//! protocol (pinned ones wait), and a mapper that answers again given its devices back. The
//! rules are `super::super::liveness` and `super::super::placement`; this is the IO.

use super::*;

impl Manager {
    /// Starts the probes that are due, each in its own task so that a hung mapper holds
    /// nothing up.
    pub(super) fn start_probes(&mut self) {
        let now = Instant::now();
        let timeout = self.liveness.timeout;
        for e in self.mappers.values_mut() {
            if !e.probes.start(now, &self.liveness) {
                continue;
            }
            let tx = self.probe_tx.clone();
            let name = e.record.name.clone();
            let generation = e.generation;
            let address = e.record.address.clone();
            let Some(mut client) = e.client.clone() else {
                let _ = tx.try_send(ProbeResult {
                    name,
                    generation,
                    result: Err(ProbeFailure::NoAddress),
                });
                continue;
            };
            tokio::spawn(async move {
                let request = pb::GetDeviceRequest {
                    device_name: "edgecore-liveness-probe".into(),
                    device_namespace: String::new(),
                };
                let result = match tokio::time::timeout(timeout, client.get_device(request)).await {
                    Err(_) => Err(ProbeFailure::NoAnswer(timeout)),
                    Ok(Err(s)) if unreachable(&s) => Err(ProbeFailure::Unreachable(address, s)),
                    Ok(_) => Ok(()),
                };
                let _ = tx
                    .send(ProbeResult {
                        name,
                        generation,
                        result,
                    })
                    .await;
            });
        }
    }

    pub(super) async fn on_probe(&mut self, p: ProbeResult) {
        let Some(e) = self.mappers.get_mut(&p.name) else {
            return;
        };
        if e.generation != p.generation {
            return;
        }
        match e
            .probes
            .answered(p.result.map_err(|f| f.to_string()), &self.liveness)
        {
            Verdict::Same => {}
            Verdict::Revived => self.revive(&p.name).await,
            Verdict::Down(error) => self.mark_down(&p.name, error),
            Verdict::StillDown(error) => e.last_error = error,
        }
    }

    /// Records that a mapper is unreachable; [`Self::handle_down`] marks and moves its devices.
    pub(super) fn mark_down(&mut self, name: &str, error: String) {
        let Some(e) = self.mappers.get_mut(name) else {
            return;
        };
        if !e.probes.down() {
            return;
        }
        e.down_since = twin::now_millis();
        e.last_error = error;
        self.metrics.mapper_failures.fetch_add(1, Ordering::Relaxed);
        self.down.push(name.to_string());
        self.update_gauges();
    }

    /// For each mapper found unreachable: its devices become `unknown` with the reason, and those
    /// not pinned to it go to the other live mappers of its protocol.
    pub(super) async fn handle_down(&mut self) {
        while let Some(name) = self.down.pop() {
            let Some(e) = self.mappers.get(&name) else {
                continue;
            };
            if e.probes.alive() {
                continue;
            }
            let since = rfc3339(e.down_since);
            let error = e.last_error.clone();
            let ids: Vec<String> = e.record.devices.iter().cloned().collect();
            tracing::warn!(mapper = %name, %error, devices = ids.len(), "mapper unreachable; its devices are unknown and move to another live mapper of the protocol");
            for key in ids {
                let Some(id) = DeviceId::parse(&key) else {
                    continue;
                };
                let Some(device) = self.device(&id) else {
                    continue;
                };
                // Still its device? (A mapper found down meanwhile may have moved it.)
                if self.owner(&key) != Some(name.as_str()) {
                    continue;
                }
                let unreachable = format!("mapper {name} unreachable since {since}: {error}");
                // Decided on the mappers as the moves so far left them.
                let decision = self.placement().failover(&name, &facts(&device));
                let (reason, to) = match decision {
                    Failover::Pinned => (
                        format!(
                            "{unreachable}; the device is pinned to it ({MAPPER_ANNOTATION}) and waits for it"
                        ),
                        None,
                    ),
                    Failover::MoveTo(to) => {
                        (format!("{unreachable}; moved to mapper {to}"), Some(to))
                    }
                    Failover::Nowhere => (
                        format!(
                            "{unreachable}; no other live mapper of protocol {}",
                            device.protocol_name().unwrap_or_default()
                        ),
                        None,
                    ),
                };
                let _ = self
                    .twin
                    .apply(Op::State {
                        id: id.clone(),
                        state: "unknown".into(),
                        reason,
                    })
                    .await;
                if let Some(to) = to {
                    self.move_device(&device, Some(&name), &to, true).await;
                }
            }
        }
    }

    /// A mapper answers again: it first loses the devices that moved away meanwhile, is told its
    /// own again (with their desired values), and the protocol's devices are spread again.
    pub(super) async fn revive(&mut self, name: &str) {
        let retired = match self.mappers.get_mut(name) {
            Some(e) => {
                e.probes.up();
                e.down_since = 0;
                e.last_error.clear();
                e.record.retired.clone()
            }
            None => return,
        };
        tracing::info!(mapper = %name, retired = retired.len(), "mapper reachable again");
        self.update_gauges();
        // What left it and cannot come back (removed, pinned elsewhere, another protocol now)
        // is removed from it first.
        for key in &retired {
            let Some(id) = DeviceId::parse(key) else {
                continue;
            };
            let back = self
                .device(&id)
                .is_some_and(|d| self.placement().fits(&facts(&d), name));
            if back {
                continue;
            }
            if !self.call(name, Call::Remove(id)).await {
                return;
            }
            if let Some(e) = self.mappers.get_mut(name) {
                e.record.retired.remove(key);
            }
        }
        self.persist(name).await;
        self.resync(name).await;
        if self.alive(name) {
            self.join(name, retired, false).await;
        }
    }
}
