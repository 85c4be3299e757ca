//! What the reconciler writes: each device's `DeviceStatus` created once and patched with what
//! its node reports (the newest value per property, a write in flight per object), the
//! nodes' acknowledgements, and the profile ConfigMaps; all of it on the leader only.

use super::*;

impl Reconciler {
    /// The leader makes every device's DeviceStatus that does not exist: it lists the names
    /// of those that do (once, at the first reconcile and when it becomes the leader), then
    /// queues the rest.
    pub(super) fn ensure_all_statuses(&mut self) {
        if !self.leading() || !self.down.is_synced() {
            return;
        }
        let (client, done) = (self.client.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            let api = Api::<DynamicObject>::all_with(client, &gvk("DeviceStatus"));
            let mut found = HashSet::new();
            let mut lp = kube::api::ListParams::default().limit(500);
            loop {
                match api.list_metadata(&lp).await {
                    Ok(list) => {
                        found.extend(
                            list.items
                                .into_iter()
                                .filter_map(|m| Some((m.metadata.namespace?, m.metadata.name?))),
                        );
                        match list.metadata.continue_ {
                            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                            _ => break,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot list DeviceStatus objects; the missing ones are made when their devices change or report");
                        return;
                    }
                }
            }
            let _ = done.send(WriteDone::ExistingStatuses(found)).await;
        });
    }

    /// A Device was applied: a new one gets its DeviceStatus (made by the leader); one whose
    /// properties went loses their twins (written by the replica that holds its status).
    pub(super) fn ensure_status(&mut self, k: &Key, new: bool) {
        if !self.down.is_synced() || self.status_inflight.contains(k) {
            return;
        }
        let Some(props) = self.down.properties(&k.0, &k.1).map(<[String]>::to_vec) else {
            return;
        };
        match self.statuses.get(k) {
            None => {
                if new && self.leading() {
                    self.queue_create(k);
                }
            }
            Some(entry) => {
                let st = entry.value();
                let twins = st["status"]["twins"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let kept: Vec<Value> = twins
                    .iter()
                    .filter(|t| {
                        t["propertyName"]
                            .as_str()
                            .is_some_and(|n| props.iter().any(|p| p == n))
                    })
                    .cloned()
                    .collect();
                if kept.len() == twins.len() {
                    return;
                }
                // A property removed from the spec leaves the status.
                let body = json!({"metadata": {"resourceVersion": entry.rv.to_string()},
                    "status": {"twins": kept}});
                let api = Api::<DynamicObject>::namespaced_with(
                    self.client.clone(),
                    &k.0,
                    &gvk("DeviceStatus"),
                );
                self.spawn_patch(k.clone(), Plan::default(), body, api, None);
            }
        }
    }

    fn queue_create(&mut self, k: &Key) {
        if self.create_queued.insert(k.clone()) {
            self.create_queue.push_back(k.clone());
        }
        self.pump_creates();
    }

    /// Whether this controller writes the reports of `k`'s node (alone: every node's).
    fn writes_for(&self, k: &Key) -> bool {
        self.down
            .node_of(&k.0, &k.1)
            .is_some_and(|n| self.down.owns(n))
    }

    /// Reads `k`'s DeviceStatus before its first patch here (a write needs the twins it
    /// holds, and its version as the patch's precondition).
    fn read_status(&mut self, k: &Key, now: Instant) {
        if self.status_inflight.contains(k)
            || self.read_after.get(k).is_some_and(|t| *t > now)
            || self.writes_active >= self.config.max_in_flight.max(1)
        {
            return;
        }
        self.status_inflight.insert(k.clone());
        self.writes_active += 1;
        self.metrics.status_reads.fetch_add(1, Ordering::Relaxed);
        let api =
            Api::<DynamicObject>::namespaced_with(self.client.clone(), &k.0, &gvk("DeviceStatus"));
        let (key, done) = (k.clone(), self.done_tx.clone());
        tokio::spawn(async move {
            // Any version the server holds (resourceVersion 0: from its memory, without a
            // consistent read's round to etcd): one older than the latest is refused at the
            // patch (its precondition) and read again.
            let r = match api.get_with(&key.1, &kube::api::GetParams::any()).await {
                Ok(o) => Ok(serde_json::to_value(&o).ok()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(None),
                Err(e) => Err(e),
            };
            let _ = done.send(WriteDone::StatusRead(key, r)).await;
        });
    }

    /// Spawns DeviceStatus creates from the queue while fewer than `max_in_flight` writes run.
    pub(super) fn pump_creates(&mut self) {
        while self.writes_active < self.config.max_in_flight.max(1) {
            let Some(k) = self.create_queue.pop_front() else {
                return;
            };
            self.create_queued.remove(&k);
            if self.statuses.contains_key(&k) || self.status_inflight.contains(&k) {
                continue;
            }
            let Some(device) = self.down.device(&k.0, &k.1) else {
                continue;
            };
            let api = Api::<DynamicObject>::namespaced_with(
                self.client.clone(),
                &k.0,
                &gvk("DeviceStatus"),
            );
            let mut body = json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceStatus",
                "metadata": {"name": k.1, "namespace": k.0}, "spec": {}});
            // Owned by its device, so that it goes with it (an API without uids, as emulators
            // are, gets no owner).
            if let Some(uid) = device["metadata"]["uid"].as_str() {
                body["metadata"]["ownerReferences"] = json!([{
                    "apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device", "name": k.1,
                    "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
            }
            let Ok(obj) = serde_json::from_value::<DynamicObject>(body) else {
                continue;
            };
            self.status_inflight.insert(k.clone());
            self.writes_active += 1;
            let (key, done) = (k, self.done_tx.clone());
            tokio::spawn(async move {
                let r = match api.create(&PostParams::default(), &obj).await {
                    Ok(o) => serde_json::to_value(&o).map_err(|_| false),
                    Err(kube::Error::Api(e)) if e.code == 409 => Err(true),
                    Err(e) => {
                        tracing::warn!(device = %format!("{}/{}", key.0, key.1), error = %e, "cannot create DeviceStatus; retried on the next change");
                        Err(false)
                    }
                };
                let _ = done.send(WriteDone::StatusCreated(key, r)).await;
            });
        }
    }

    pub(super) fn spawn_patch(
        &mut self,
        key: Key,
        plan: Plan,
        body: Value,
        api: Api<DynamicObject>,
        events: Option<DeviceEvents>,
    ) {
        self.status_inflight.insert(key.clone());
        self.writes_active += 1;
        let done = self.done_tx.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            // Api::patch, but the answer read as `Answered` (its version and twins), not as a
            // whole object.
            let r = match kube::core::Request::new(api.resource_url()).patch(
                &key.1,
                &PatchParams::default(),
                &Patch::Merge(&body),
            ) {
                Ok(mut req) => {
                    req.extensions_mut().insert("patch");
                    api.into_client().request::<Answered>(req).await
                }
                Err(e) => Err(kube::Error::BuildRequest(e)),
            };
            metrics.status_patch.observe(started.elapsed());
            if r.is_ok()
                && let Some(events) = events
            {
                events.record(&key).await;
            }
            let _ = done.send(WriteDone::Patched(key, Box::new(plan), r)).await;
        });
    }

    /// Answers the nodes whose reports a plan took (written, or older than what is stored).
    pub(super) fn acknowledge(&self, acks: &[(String, String)]) {
        for (node, msg) in acks {
            self.hub.send(Outbound {
                node: node.clone(),
                message: upstream::ack(node, msg),
                ack: None,
                body: None,
            });
        }
    }

    pub(super) fn report(&mut self, node: &str, msg: Message) {
        self.metrics.reports.fetch_add(1, Ordering::Relaxed);
        let down = &self.down;
        let r = self.up.accept(node, &msg, |ns, name| {
            down.properties(ns, name).map(|p| DeviceFacts {
                node: down.node_of(ns, name),
                properties: p.iter().map(String::as_str).collect(),
            })
        });
        match r {
            Ok(Taken::Queued) => {}
            Ok(Taken::Nothing) => self.hub.send(Outbound {
                node: node.to_string(),
                message: upstream::ack(node, &msg.header.id),
                ack: None,
                body: None,
            }),
            Err(e) => {
                self.metrics
                    .upstream_refused
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%node, resource = %msg.route.resource, error = %e, "report refused");
                let mut answer = upstream::ack(node, &msg.header.id);
                answer.route.operation = api::message::operation::ERROR.into();
                answer.content = Value::String(e.to_string());
                self.hub.send(Outbound {
                    node: node.to_string(),
                    message: answer,
                    ack: None,
                    body: None,
                });
            }
        }
        self.metrics
            .upstream_pending
            .store(self.up.pending() as u64, Ordering::Relaxed);
    }

    pub(super) fn done(&mut self, d: WriteDone) {
        match d {
            WriteDone::StatusCreated(k, v) => {
                self.writes_active -= 1;
                self.status_inflight.remove(&k);
                // One that existed already is read when a report needs it.
                if let Ok(v) = v
                    && self.writes_for(&k)
                {
                    self.statuses.insert(k, StatusEntry::of(&v));
                }
                self.pump_creates();
            }
            WriteDone::StatusRead(k, r) => {
                self.writes_active -= 1;
                self.status_inflight.remove(&k);
                match r {
                    Ok(Some(v)) => {
                        self.read_after.remove(&k);
                        self.statuses.insert(k, StatusEntry::of(&v));
                    }
                    Ok(None) => {
                        self.read_after.remove(&k);
                        self.queue_create(&k);
                    }
                    Err(e) => {
                        tracing::warn!(device = %format!("{}/{}", k.0, k.1), error = %e, "cannot read DeviceStatus; its reports wait");
                        self.read_after
                            .insert(k, Instant::now() + Duration::from_secs(1));
                    }
                }
                self.pump_creates();
            }
            WriteDone::ExistingStatuses(found) => {
                let missing: Vec<Key> = self
                    .down
                    .device_keys()
                    .into_iter()
                    .filter(|k| !found.contains(k) && !self.statuses.contains_key(k))
                    .collect();
                tracing::info!(
                    existing = found.len(),
                    missing = missing.len(),
                    "DeviceStatus objects listed; the missing ones are made"
                );
                for k in missing {
                    self.queue_create(&k);
                }
            }
            WriteDone::Patched(k, plan, r) => {
                self.writes_active -= 1;
                self.status_inflight.remove(&k);
                match r {
                    Ok(v) => {
                        self.attempts.remove(&k);
                        self.up.stored(&k, &plan);
                        if let Some(t) = plan.last_report {
                            self.metrics.status_value_age.0.observe(t.elapsed());
                        }
                        if !plan.acks.is_empty() {
                            self.metrics.status_patches.fetch_add(1, Ordering::Relaxed);
                            self.metrics
                                .status_reports_coalesced
                                .fetch_add(plan.coalesced, Ordering::Relaxed);
                        }
                        self.acknowledge(&plan.acks);
                        if self.writes_for(&k) {
                            self.statuses.insert(k, StatusEntry::answered(&v));
                        } else {
                            // A node gone to another replica: its devices are written there.
                            self.statuses.remove(&k);
                        }
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        // Written through another replica since this one's version: read
                        // again, and the plan applied on what is stored. The state this
                        // replica decided for a node that left it is dropped: the node is
                        // served elsewhere now.
                        self.metrics
                            .status_conflicts
                            .fetch_add(1, Ordering::Relaxed);
                        self.statuses.remove(&k);
                        let decided_here = plan.lost.is_some() && plan.acks.is_empty();
                        let dropped = plan.is_empty() || (decided_here && self.config.shared);
                        if !dropped {
                            self.up.failed(k, *plan, Instant::now());
                        }
                    }
                    Err(e) => {
                        self.metrics
                            .status_patch_failures
                            .fetch_add(1, Ordering::Relaxed);
                        let n = self.attempts.entry(k.clone()).or_insert(0);
                        *n += 1;
                        let backoff = Duration::from_millis(100 * 2u64.pow((*n).min(7)));
                        tracing::warn!(device = %format!("{}/{}", k.0, k.1), error = %e, retry_in = ?backoff, "DeviceStatus patch failed; retried");
                        if matches!(&e, kube::Error::Api(s) if s.code == 404) {
                            // Deleted: made again by the replica that writes it.
                            self.statuses.remove(&k);
                            if self.writes_for(&k) {
                                self.queue_create(&k);
                            }
                        }
                        if !plan.acks.is_empty() || plan.lost.is_some() {
                            // A state the cloud decided (the node went away) is tried again too.
                            self.up.failed(k, *plan, Instant::now() + backoff);
                        }
                    }
                }
            }
            WriteDone::ExistingProfiles(found) => {
                for (ns, node) in found {
                    // An unknown hash: the next round rewrites it, or deletes it if its node has
                    // no devices in that namespace any more.
                    self.profiles.entry((ns, node.clone())).or_insert(0);
                    self.dirty_nodes.insert(node);
                }
            }
            WriteDone::Profile(k, text) => {
                self.profile_active -= 1;
                self.profile_inflight.remove(&k);
                match text {
                    Some(t) => {
                        self.profiles.insert(k, text_hash(&t));
                    }
                    None => {
                        self.profiles.remove(&k);
                    }
                }
                // The round goes on with the next dirty node as soon as a write is done.
                self.write_profiles();
            }
        }
    }

    pub(super) fn flush(&mut self) {
        let now = Instant::now();
        self.gauges(now);
        let room = self
            .config
            .max_in_flight
            .max(1)
            .saturating_sub(self.writes_active);
        for (k, plan) in self.up.due(now, self.config.patch_interval, room) {
            if plan.is_empty() {
                // Only reports older than what is stored: answered, nothing to write.
                self.acknowledge(&plan.acks);
                continue;
            }
            if self.status_inflight.contains(&k) || !self.statuses.contains_key(&k) {
                // Its DeviceStatus is being written, made or read: try again on a later tick.
                self.up
                    .failed(k.clone(), plan, now + Duration::from_millis(20));
                self.read_status(&k, now);
                continue;
            }
            let Some(props) = self.down.properties(&k.0, &k.1) else {
                continue;
            };
            let refs: Vec<&str> = props.iter().map(String::as_str).collect();
            let current = self
                .statuses
                .get(&k)
                .map(StatusEntry::value)
                .unwrap_or(Value::Null);
            let mut body = upstream::patch_body(&current, &plan, &refs);
            // Written on the version this controller holds, or refused (409) if another
            // replica wrote it since.
            if let Some(e) = self.statuses.get(&k).filter(|e| e.rv > 0) {
                body["metadata"] = json!({"resourceVersion": e.rv.to_string()});
            }
            let node = self
                .down
                .node_of(&k.0, &k.1)
                .unwrap_or_default()
                .to_string();
            let events = upstream::device_events(&current, &plan, &node);
            let api = Api::<DynamicObject>::namespaced_with(
                self.client.clone(),
                &k.0,
                &gvk("DeviceStatus"),
            );
            let events = (!events.is_empty()).then(|| DeviceEvents {
                client: self.client.clone(),
                node,
                events,
            });
            self.spawn_patch(k, plan, body, api, events);
        }
        self.pump_creates();
        self.metrics
            .upstream_pending
            .store(self.up.pending() as u64, Ordering::Relaxed);
        if self.config.profiles
            && self.down.is_synced()
            && now.duration_since(self.last_profiles) >= self.config.profile_interval
        {
            self.last_profiles = now;
            self.write_profiles();
        }
    }

    pub(super) fn write_profiles(&mut self) {
        if !self.leading() {
            return;
        }
        // Nodes whose profile is being written now: dirty again after this round.
        let mut later = Vec::new();
        let now = Instant::now();
        while self.profile_active < PROFILE_WRITES {
            let Some(node) = self.dirty_nodes.pop_first() else {
                break;
            };
            let every = profile_every(self.config.profile_interval, self.down.devices_on(&node));
            if self
                .profile_made
                .get(&node)
                .is_some_and(|t| now.duration_since(*t) < every)
            {
                later.push(node);
                continue;
            }
            self.profile_made.insert(node.clone(), now);
            let mut by_ns: BTreeMap<String, Vec<(Value, Option<Value>)>> = BTreeMap::new();
            for (d, m) in self.down.node_devices(&node) {
                let ns = d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default")
                    .to_string();
                by_ns.entry(ns).or_default().push((d, m));
            }
            let mut namespaces: BTreeSet<String> = by_ns.keys().cloned().collect();
            namespaces.extend(
                self.profiles
                    .keys()
                    .filter(|(_, n)| *n == node)
                    .map(|(ns, _)| ns.clone()),
            );
            let mut jobs = Vec::new();
            for ns in namespaces {
                let k = (ns.clone(), node.clone());
                if self.profile_inflight.contains(&k) {
                    // Written on a later round.
                    later.push(node.clone());
                    continue;
                }
                let text = by_ns.get(&ns).map(|ds| {
                    let refs: Vec<(&Value, Option<&Value>)> =
                        ds.iter().map(|(d, m)| (d, m.as_ref())).collect();
                    (profile::profile(&refs).to_string(), ds.len())
                });
                if text.as_ref().map(|(t, _)| text_hash(t)) == self.profiles.get(&k).copied() {
                    continue;
                }
                jobs.push((k, text));
            }
            for (k, text) in jobs {
                self.profile_inflight.insert(k.clone());
                self.profile_active += 1;
                let (done, client) = (self.done_tx.clone(), self.client.clone());
                let metrics = self.metrics.clone();
                let max = self.config.profile_max_bytes;
                tokio::spawn(async move {
                    let api: Api<ConfigMap> = Api::namespaced(client, &k.0);
                    let name = profile::name(&k.1);
                    let result = match &text {
                        Some((t, devices)) => {
                            // Too large for a ConfigMap: the API would refuse it at every
                            // change. Its ConfigMap says so instead (applied without the key,
                            // so an earlier profile there goes), until the devices change.
                            let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                                "metadata": {"name": name, "namespace": k.0,
                                    "labels": {PROFILE_LABEL: k.1}},
                                "data": {}});
                            if t.len() + profile::KEY.len() > max {
                                let why = profile::omitted(*devices, t.len(), max);
                                tracing::warn!(configmap = %name, namespace = %k.0, "{why}");
                                cm["metadata"]["annotations"] = json!({profile::OMITTED: why});
                            } else {
                                cm["data"] = json!({profile::KEY: t});
                            }
                            api.patch(
                                &name,
                                &PatchParams::apply("devicecontroller").force(),
                                &Patch::Apply(&cm),
                            )
                            .await
                            .map(|_| ())
                        }
                        None => match api.delete(&name, &DeleteParams::default()).await {
                            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                            r => r.map(|_| ()),
                        },
                    };
                    let outcome = match result {
                        Ok(()) => {
                            metrics.profiles_written.fetch_add(1, Ordering::Relaxed);
                            text.map(|(t, _)| t)
                        }
                        Err(e) => {
                            tracing::warn!(configmap = %name, namespace = %k.0, error = %e, "cannot write the device profile; retried on the next change");
                            None
                        }
                    };
                    let _ = done.send(WriteDone::Profile(k, outcome)).await;
                });
            }
        }
        self.dirty_nodes.extend(later);
    }
}

/// Events of one kind a Device keeps (the API keeps Events until deleted: an alarm that flaps,
/// a set point moved by a script on the gateway, would add them without end).
const EVENTS_KEPT: usize = 100;

/// The Events the edge's report makes on its Device (alarms, desired values set on the
/// gateway), written once its DeviceStatus is.
pub(super) struct DeviceEvents {
    client: kube::Client,
    node: String,
    events: Vec<upstream::DeviceEvent>,
}

impl DeviceEvents {
    /// Writes each Event (`kubectl get events` lists them; `kubectl describe device` too), then
    /// keeps the Device's last [`EVENTS_KEPT`] of each kind written.
    async fn record(self, key: &Key) {
        use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
        let api: Api<Event> = Api::namespaced(self.client, &key.0);
        let kinds: std::collections::BTreeSet<bool> = self
            .events
            .iter()
            .map(|e| e.reason == upstream::DESIRED_VALUE_SET)
            .collect();
        for e in self.events {
            let at = k8s_openapi::jiff::Timestamp::from_millisecond(e.at).ok();
            let event = Event {
                metadata: ObjectMeta {
                    name: Some(format!("{}.{}", key.1, uuid::Uuid::new_v4().simple())),
                    namespace: Some(key.0.clone()),
                    ..ObjectMeta::default()
                },
                involved_object: ObjectReference {
                    api_version: Some("devices.kubeedge.io/v1beta1".into()),
                    kind: Some("Device".into()),
                    name: Some(key.1.clone()),
                    namespace: Some(key.0.clone()),
                    field_path: e.field,
                    ..ObjectReference::default()
                },
                reason: Some(e.reason.into()),
                message: Some(e.message),
                type_: Some(if e.warning { "Warning" } else { "Normal" }.into()),
                source: Some(EventSource {
                    component: Some("devicecontroller".into()),
                    host: Some(self.node.clone()),
                }),
                reporting_component: Some("devicecontroller".into()),
                reporting_instance: Some(self.node.clone()),
                first_timestamp: at.map(Time),
                last_timestamp: at.map(Time),
                count: Some(1),
                ..Event::default()
            };
            if let Err(err) = api.create(&PostParams::default(), &event).await {
                tracing::warn!(device = %format!("{}/{}", key.0, key.1), reason = e.reason, error = %err, "cannot record an Event of the device");
            }
        }
        for desired in kinds {
            prune(&api, key, desired).await;
        }
    }
}

/// Deletes the Device's oldest Events of a kind (desired values set, or alarms) beyond
/// [`EVENTS_KEPT`].
async fn prune(api: &Api<k8s_openapi::api::core::v1::Event>, key: &Key, desired: bool) {
    let fields = format!("involvedObject.kind=Device,involvedObject.name={}", key.1);
    let list = match api
        .list(&kube::api::ListParams::default().fields(&fields))
        .await
    {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(device = %key.1, error = %e, "cannot list the device's Events to bound them");
            return;
        }
    };
    let mut mine: Vec<_> = list
        .items
        .into_iter()
        .filter(|e| {
            let reason = e.reason.as_deref().unwrap_or_default();
            if desired {
                reason == upstream::DESIRED_VALUE_SET
            } else {
                reason.starts_with("Alarm")
            }
        })
        .map(|e| {
            let rv: u64 = e
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (
                e.last_timestamp.map(|t| t.0),
                rv,
                e.metadata.name.unwrap_or_default(),
            )
        })
        .collect();
    if mine.len() <= EVENTS_KEPT {
        return;
    }
    mine.sort();
    let excess = mine.len() - EVENTS_KEPT;
    for (_, _, name) in mine.into_iter().take(excess) {
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}
