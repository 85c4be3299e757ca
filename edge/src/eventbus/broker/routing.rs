//! Who gets a published message, and what is dropped: the clients, their subscriptions (a
//! tree of topic levels, [`super::tree`]) and the retained messages, and the rules of a
//! delivery ([`Routing::deliveries`]). The broker's IO ([`super`]) holds it under one mutex and
//! carries out each [`Delivery`].

use super::session::{self, Subscriber};
use super::tree::{Retained, Subscriptions};
use super::{BrokerStats, Limits};
use crate::eventbus::auth::Auth;
use rumqttc::{Packet, Publish, QoS};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// What becomes of a publish for one subscriber.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// Queued for it now.
    Send,
    /// edgecore's own link: the publisher waits for room (backpressure, never a loss).
    Wait,
    /// Its queue is full and the copy is QoS 0: dropped, counted.
    Drop,
    /// Its queue is full and the copy is QoS 1: the client is disconnected (it is not
    /// keeping up, and dropping QoS 1 silently would break its promise).
    Overflow,
}

/// One subscriber's copy of a publish, and its fate.
#[derive(Debug)]
pub(super) struct Delivery {
    pub id: u64,
    pub publish: Publish,
    /// Its bytes as the queue counts them (payload and topic).
    pub size: usize,
    pub fate: Fate,
}

/// A connected client, as routing sees it.
pub(super) struct Client {
    pub(super) client_id: String,
    /// The user it logged in as (`None`: anonymous).
    pub(super) user: Option<String>,
    pub(super) tx: mpsc::Sender<Packet>,
    /// Its subscriptions (also in the routing's tree): filter → QoS.
    pub(super) filters: HashMap<String, QoS>,
    /// Bytes of the publishes queued for it and not written yet.
    pub(super) queued_bytes: Arc<AtomicUsize>,
    /// Cancelled when its QoS 1 queue overflowed: the connection is closed.
    pub(super) overflow: CancellationToken,
    /// Cancelled when a newer connection takes its client id over: the connection is closed.
    pub(super) taken_over: CancellationToken,
    /// edgecore's own in-process client: publishers wait for room in its queue (TCP
    /// backpressure on the publishing app) instead of it being disconnected, so that a burst of
    /// requests is slowed down, never lost or turned into a stall. No connection takes it over.
    pub(super) link: bool,
}

/// Every client and subscription, and the retained messages: who gets what.
#[derive(Default)]
pub(super) struct Routing {
    pub(super) clients: HashMap<u64, Client>,
    /// Every client's filters, as a tree of topic levels (the lists in `clients` say what to
    /// take out of it when a client goes).
    pub(super) subscriptions: Subscriptions,
    pub(super) retained: Retained,
    /// The broker's counters: the number of subscriptions is kept there as it changes.
    pub(super) stats: Arc<BrokerStats>,
}

impl Routing {
    /// Takes a client out of the routing, with its subscriptions.
    pub(super) fn remove_client(&mut self, id: u64) -> Option<Client> {
        let c = self.clients.remove(&id)?;
        for f in c.filters.keys() {
            self.subscriptions.remove(f, id);
        }
        self.count_subscriptions();
        Some(c)
    }

    fn count_subscriptions(&self) {
        self.stats
            .subscriptions
            .store(self.subscriptions.len() as u64, Ordering::Relaxed);
    }

    /// Unsubscribes client `id` from `filters`.
    pub(super) fn unsubscribe(&mut self, id: u64, filters: &[String]) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        for f in filters {
            if c.filters.remove(f).is_some() {
                self.subscriptions.remove(f, id);
            }
        }
        self.count_subscriptions();
    }

    /// Subscribes client `id` to `filters` (a filter again: its QoS replaced).
    pub(super) fn subscribe(&mut self, id: u64, filters: &[(String, QoS)]) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        for (f, q) in filters {
            c.filters.insert(f.clone(), *q);
            self.subscriptions.insert(f, id, *q);
        }
        self.count_subscriptions();
    }

    /// The clients whose filters match `topic`, each once with the highest QoS of its
    /// matching filters.
    pub(super) fn subscribers(&self, topic: &str) -> Vec<(u64, QoS)> {
        let mut out: Vec<(u64, QoS)> = Vec::new();
        self.subscriptions.matches(
            topic,
            &mut |id, q| match out.iter_mut().find(|(c, _)| *c == id) {
                Some(s) if (q as u8) > (s.1 as u8) => s.1 = q,
                Some(_) => {}
                None => out.push((id, q)),
            },
        );
        out
    }

    /// Takes `client` in as `id`. A client id already connected is taken over (MQTT 3.1.1
    /// section 3.1.4): the older connections are taken out, and returned for closing.
    /// edgecore's own link is never taken over.
    pub(super) fn admit(&mut self, id: u64, client: Client) -> Vec<Client> {
        let older: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| !c.link && !client.link && c.client_id == client.client_id)
            .map(|(id, _)| *id)
            .collect();
        let out = older
            .into_iter()
            .filter_map(|old| self.remove_client(old))
            .collect();
        self.clients.insert(id, client);
        out
    }

    /// Keeps `publish` as its topic's retained message when it asks to be (an empty payload
    /// clears it).
    pub(super) fn retain(&mut self, publish: &Publish) {
        if !publish.retain {
            return;
        }
        self.retained.set(publish);
    }

    /// What becomes of `publish` for each subscriber that may read it: its copy (at the QoS
    /// its matching filters grant, never above the publish's nor 1; not retained, not a
    /// duplicate) is sent when its queue has room (`max_queued_messages` and
    /// `max_queued_bytes`); edgecore's own link is waited for; otherwise a QoS 0 copy is
    /// dropped and a QoS 1 subscriber overflows (it is disconnected).
    pub(super) fn deliveries(
        &self,
        publish: &Publish,
        auth: &Auth,
        limits: &Limits,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        for (id, granted) in self.subscribers(&publish.topic) {
            let Some(client) = self.clients.get(&id) else {
                continue;
            };
            let to = Subscriber {
                client_id: &client.client_id,
                user: client.user.as_deref(),
                link: client.link,
            };
            let Some(qos) = session::delivery(publish, granted, &to, auth) else {
                continue;
            };
            let mut copy = publish.clone();
            copy.qos = qos;
            copy.retain = false;
            copy.dup = false;
            let size = copy.payload.len() + copy.topic.len();
            let room = client.tx.capacity() > 0
                && client.queued_bytes.load(Ordering::Relaxed) + size <= limits.max_queued_bytes;
            let fate = match (client.link, room, qos) {
                (true, _, _) => Fate::Wait,
                (false, true, _) => Fate::Send,
                (false, false, QoS::AtMostOnce) => Fate::Drop,
                (false, false, _) => Fate::Overflow,
            };
            out.push(Delivery {
                id,
                publish: copy,
                size,
                fate,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OVEN_1: &str = "$hw/events/device/default/oven-1/twin/update";

    /// A client `name` (logged in as `user`) with a queue of `room` messages; the receiver
    /// keeps the queue open.
    fn client(
        name: &str,
        user: Option<&str>,
        room: usize,
        link: bool,
    ) -> (Client, mpsc::Receiver<Packet>) {
        let (tx, rx) = mpsc::channel(room);
        let c = Client {
            client_id: name.into(),
            user: user.map(str::to_string),
            tx,
            filters: HashMap::new(),
            queued_bytes: Arc::new(AtomicUsize::new(0)),
            overflow: CancellationToken::new(),
            taken_over: CancellationToken::new(),
            link,
        };
        (c, rx)
    }

    fn publish(topic: &str, qos: QoS) -> Publish {
        let mut p = Publish::new(topic, qos, "{\"v\":1}");
        p.retain = true;
        p.dup = true;
        p
    }

    fn fates(r: &Routing, p: &Publish, auth: &Auth, limits: &Limits) -> Vec<(u64, Fate, QoS)> {
        let mut v: Vec<_> = r
            .deliveries(p, auth, limits)
            .into_iter()
            .map(|d| (d.id, d.fate, d.publish.qos))
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }

    /// An ACL where `app` reads oven-1 only; anyone else nothing.
    fn acl() -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("acl");
        std::fs::write(
            &file,
            "user app\ntopic read $hw/events/device/default/oven-1/#\n",
        )
        .expect("written");
        let auth = Auth::load(None, Some(&file), None).expect("loaded");
        (dir, auth)
    }

    #[test]
    fn a_subscriber_gets_one_copy_at_the_highest_qos_its_filters_grant_never_above_the_publish() {
        let mut r = Routing::default();
        let (c, _rx) = client("app", None, 10, false);
        r.admit(1, c);
        r.subscribe(
            1,
            &[
                ("$hw/events/device/+/+/twin/update".into(), QoS::AtMostOnce),
                ("$hw/events/device/default/#".into(), QoS::AtLeastOnce),
            ],
        );
        let open = Auth::open();
        let limits = Limits::default();
        assert_eq!(
            fates(&r, &publish(OVEN_1, QoS::AtLeastOnce), &open, &limits),
            [(1, Fate::Send, QoS::AtLeastOnce)]
        );
        assert_eq!(
            fates(&r, &publish(OVEN_1, QoS::AtMostOnce), &open, &limits),
            [(1, Fate::Send, QoS::AtMostOnce)]
        );
        // QoS 2 is delivered at QoS 1.
        assert_eq!(
            fates(&r, &publish(OVEN_1, QoS::ExactlyOnce), &open, &limits),
            [(1, Fate::Send, QoS::AtLeastOnce)]
        );
    }

    #[test]
    fn a_copy_is_neither_retained_nor_a_duplicate() {
        let mut r = Routing::default();
        let (c, _rx) = client("app", None, 10, false);
        r.admit(1, c);
        r.subscribe(1, &[("#".into(), QoS::AtLeastOnce)]);
        let p = Publish::new("a/b", QoS::AtLeastOnce, "x");
        let mut p = p;
        p.retain = true;
        p.dup = true;
        let d = r.deliveries(&p, &Auth::open(), &Limits::default());
        assert_eq!(d.len(), 1);
        assert!(!d[0].publish.retain && !d[0].publish.dup);
        assert_eq!(d[0].size, "a/b".len() + 1);
    }

    #[test]
    fn a_subscriber_the_acl_does_not_let_read_the_topic_gets_nothing_but_the_link_does() {
        let (_d, auth) = acl();
        let mut r = Routing::default();
        for (id, user, link) in [
            (1, Some("app"), false),
            (2, Some("other"), false),
            (3, None, true),
        ] {
            let (c, rx) = client(&format!("c{id}"), user, 10, link);
            std::mem::forget(rx);
            r.admit(id, c);
            r.subscribe(id, &[("$hw/events/device/#".into(), QoS::AtLeastOnce)]);
        }
        let limits = Limits::default();
        assert_eq!(
            fates(&r, &publish(OVEN_1, QoS::AtLeastOnce), &auth, &limits),
            [
                (1, Fate::Send, QoS::AtLeastOnce),
                (3, Fate::Wait, QoS::AtLeastOnce)
            ]
        );
        let oven_2 = "$hw/events/device/default/oven-2/twin/update";
        assert_eq!(
            fates(&r, &publish(oven_2, QoS::AtLeastOnce), &auth, &limits),
            [(3, Fate::Wait, QoS::AtLeastOnce)]
        );
    }

    #[test]
    fn a_full_queue_drops_a_qos_0_copy_and_overflows_a_qos_1_subscriber() {
        let mut r = Routing::default();
        let (c, _rx) = client("slow", None, 1, false);
        c.tx.try_send(Packet::PingResp).expect("filled");
        r.admit(1, c);
        r.subscribe(1, &[("#".into(), QoS::AtLeastOnce)]);
        let (open, limits) = (Auth::open(), Limits::default());
        assert_eq!(
            fates(&r, &publish("t", QoS::AtMostOnce), &open, &limits),
            [(1, Fate::Drop, QoS::AtMostOnce)]
        );
        assert_eq!(
            fates(&r, &publish("t", QoS::AtLeastOnce), &open, &limits),
            [(1, Fate::Overflow, QoS::AtLeastOnce)]
        );
    }

    #[test]
    fn a_queue_over_its_bytes_is_full_too() {
        let mut r = Routing::default();
        let (c, _rx) = client("slow", None, 100, false);
        c.queued_bytes.store(90, Ordering::Relaxed);
        r.admit(1, c);
        r.subscribe(1, &[("#".into(), QoS::AtLeastOnce)]);
        let limits = Limits {
            max_queued_bytes: 100,
            ..Limits::default()
        };
        let p = Publish::new("t", QoS::AtMostOnce, vec![0u8; 9]);
        // 90 + 9 + 1 (the topic) is the limit: still room.
        assert_eq!(fates(&r, &p, &Auth::open(), &limits)[0].1, Fate::Send);
        let p = Publish::new("t", QoS::AtMostOnce, vec![0u8; 10]);
        assert_eq!(fates(&r, &p, &Auth::open(), &limits)[0].1, Fate::Drop);
    }

    #[test]
    fn edgecore_s_link_is_waited_for_never_dropped() {
        let mut r = Routing::default();
        let (c, _rx) = client("link", None, 1, true);
        c.tx.try_send(Packet::PingResp).expect("filled");
        r.admit(1, c);
        r.subscribe(1, &[("#".into(), QoS::AtLeastOnce)]);
        assert_eq!(
            fates(
                &r,
                &publish("t", QoS::AtMostOnce),
                &Auth::open(),
                &Limits::default()
            ),
            [(1, Fate::Wait, QoS::AtMostOnce)]
        );
    }

    #[test]
    fn a_second_connection_with_a_client_id_takes_it_over_and_its_subscriptions_go() {
        let mut r = Routing::default();
        let (old, _rx1) = client("app", None, 10, false);
        r.admit(1, old);
        r.subscribe(1, &[("a/#".into(), QoS::AtLeastOnce)]);
        let (other, _rx2) = client("other", None, 10, false);
        assert!(r.admit(2, other).is_empty());
        let (new, _rx3) = client("app", None, 10, false);
        let gone = r.admit(3, new);
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].client_id, "app");
        assert!(
            r.subscribers("a/b").is_empty(),
            "the old one's filters went with it"
        );
        assert_eq!(r.clients.len(), 2);
        // edgecore's link is never taken over, nor takes over.
        let (link, _rx4) = client("app", None, 10, true);
        assert!(r.admit(4, link).is_empty());
        assert_eq!(r.clients.len(), 3);
    }

    #[test]
    fn a_retained_message_is_kept_per_topic_and_an_empty_one_clears_it() {
        let mut r = Routing::default();
        r.retain(&Publish::new("a", QoS::AtMostOnce, "not retained"));
        assert_eq!(r.retained.len(), 0);
        let mut p = Publish::new("a", QoS::AtLeastOnce, "1");
        p.retain = true;
        r.retain(&p);
        p.payload = "2".into();
        r.retain(&p);
        let mut kept = Vec::new();
        r.retained
            .matching("a", &mut |p| kept.push(p.payload.clone()));
        assert_eq!(kept, ["2"]);
        p.payload = bytes::Bytes::new();
        r.retain(&p);
        assert_eq!(r.retained.len(), 0);
    }
}
