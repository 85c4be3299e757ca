//! One client's MQTT session, decided without IO: what a CONNECT is admitted as, and for each
//! packet the client sends, what the connection must do (the answers to write, the publishes to
//! route, the subscriptions to change, the end of the connection). The ACL is applied here, on
//! the packet as it was parsed, and only here: a publish the client may not make is
//! acknowledged and dropped (`Out::Denied`), a message it may not read is neither delivered to
//! it ([`delivery`]) nor sent as retained ([`Session::retained`]), and a last will it may not
//! publish refuses its CONNECT (`NotAuthorized`: Mosquitto 2's rule), so that no message gets
//! past the ACL through a will.
//!
//! `super` (the connection's pump) reads packets, calls [`Session::on_packet`], and carries out
//! each [`Out`] in order.

use super::super::auth::Auth;
use super::super::topics::{valid_filter, valid_topic};
use super::tree::Retained;
use rumqttc::{
    Connect, ConnectReturnCode, Packet, PubAck, PubComp, PubRec, Publish, QoS, SubAck,
    SubscribeReasonCode, UnsubAck,
};
use std::time::Duration;

/// Why the broker ended a client's connection (logged at debug level).
#[derive(Debug, thiserror::Error)]
pub(super) enum Disconnect {
    #[error("malformed MQTT packet: {0}")]
    Malformed(rumqttc::Error),
    #[error("read failed: {0}")]
    Read(std::io::Error),
    #[error("first packet is not CONNECT: {0}")]
    NotConnect(String),
    #[error("no CONNECT within 10 s")]
    NoConnect,
    #[error("its queue overflowed")]
    Overflow,
    #[error("closed without DISCONNECT")]
    Closed,
    #[error("the broker is stopping")]
    Shutdown,
    #[error("keep-alive timeout")]
    KeepAlive,
    #[error("invalid topic name {0:?}")]
    InvalidTopic(String),
    #[error("second CONNECT")]
    SecondConnect,
    #[error("another connection took over its client id")]
    TakenOver,
    /// Answered with a CONNACK that carries the code.
    #[error("CONNECT refused: {0:?}")]
    Refused(ConnectReturnCode),
}

/// Compared by what they say (the IO errors inside have no equality of their own).
impl PartialEq for Disconnect {
    fn eq(&self, other: &Self) -> bool {
        self.to_string() == other.to_string()
    }
}

/// What the connection does for a packet, in the order given.
#[derive(Debug, PartialEq)]
pub(super) enum Out {
    /// An answer to the client (acknowledgement, ping), written ahead of queued publishes.
    Reply(Packet),
    /// A publish the client may make: to its subscribers.
    Route(Publish),
    /// A publish the ACL does not grant (acknowledged all the same, as Mosquitto does).
    Denied(String),
    /// Filters to add (or whose QoS to replace), before the SUBACK goes out.
    Subscribe(Vec<(String, QoS)>),
    /// Filters to remove.
    Unsubscribe(Vec<String>),
    /// A QoS 1 publish sent to the client was acknowledged.
    Acked,
    /// The connection ends: cleanly (`Ok`, DISCONNECT: no will) or not.
    Close(Result<(), Disconnect>),
}

/// A connected client.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) client_id: String,
    /// The user it logged in as (`None`: anonymous).
    pub(super) user: Option<String>,
    /// Silence longer than this ends the connection (1.5 times the client's keep-alive; MQTT
    /// 3.1.1 section 3.1.2.10); `None` for a keep-alive of 0.
    pub(super) keep_alive: Option<Duration>,
    will: Option<Publish>,
}

impl Session {
    /// Admits a CONNECT, or gives the code it is refused with. `identity` is the user its TLS
    /// certificate names, when certificates are users (no password is asked then); `serial`
    /// names a client that gave no client id.
    pub(super) fn connect(
        connect: &Connect,
        identity: Option<String>,
        auth: &Auth,
        serial: u64,
    ) -> Result<Self, ConnectReturnCode> {
        let user = match identity {
            Some(name) => Some(name),
            None => auth.login(connect.login.as_ref())?,
        };
        let client_id = if connect.client_id.is_empty() {
            format!("anonymous-{serial}")
        } else {
            connect.client_id.clone()
        };
        if !auth.admits(user.as_deref(), &client_id) {
            return Err(ConnectReturnCode::NotAuthorized);
        }
        let will = match &connect.last_will {
            None => None,
            Some(w) => {
                if !valid_topic(&w.topic)
                    || !auth.allows(user.as_deref(), &client_id, &w.topic, true)
                {
                    return Err(ConnectReturnCode::NotAuthorized);
                }
                let mut p = Publish::new(w.topic.clone(), w.qos, w.message.to_vec());
                p.retain = w.retain;
                Some(p)
            }
        };
        Ok(Self {
            client_id,
            user,
            keep_alive: (connect.keep_alive > 0)
                .then(|| Duration::from_millis(u64::from(connect.keep_alive) * 1500)),
            will,
        })
    }

    /// What to do for `packet`, sent by this client.
    pub(super) fn on_packet(&self, packet: Packet, auth: &Auth) -> Vec<Out> {
        match packet {
            Packet::Publish(p) => {
                if !valid_topic(&p.topic) {
                    let shown = p.topic.chars().take(80).collect();
                    return vec![Out::Close(Err(Disconnect::InvalidTopic(shown)))];
                }
                let mut out = Vec::with_capacity(2);
                match p.qos {
                    QoS::AtMostOnce => {}
                    QoS::AtLeastOnce => out.push(Out::Reply(Packet::PubAck(PubAck::new(p.pkid)))),
                    QoS::ExactlyOnce => out.push(Out::Reply(Packet::PubRec(PubRec::new(p.pkid)))),
                }
                if auth.allows(self.user.as_deref(), &self.client_id, &p.topic, true) {
                    out.push(Out::Route(p));
                } else {
                    out.push(Out::Denied(p.topic));
                }
                out
            }
            Packet::PubRel(r) => vec![Out::Reply(Packet::PubComp(PubComp::new(r.pkid)))],
            Packet::Subscribe(s) => {
                let mut granted = Vec::with_capacity(s.filters.len());
                let codes = s
                    .filters
                    .into_iter()
                    .map(|f| {
                        if !valid_filter(&f.path) {
                            return SubscribeReasonCode::Failure;
                        }
                        let q = min_qos(f.qos, QoS::AtLeastOnce);
                        granted.push((f.path, q));
                        SubscribeReasonCode::Success(q)
                    })
                    .collect();
                vec![
                    Out::Subscribe(granted),
                    Out::Reply(Packet::SubAck(SubAck::new(s.pkid, codes))),
                ]
            }
            Packet::Unsubscribe(u) => vec![
                Out::Unsubscribe(u.topics),
                Out::Reply(Packet::UnsubAck(UnsubAck::new(u.pkid))),
            ],
            Packet::PingReq => vec![Out::Reply(Packet::PingResp)],
            Packet::PubAck(_) => vec![Out::Acked],
            Packet::Disconnect => vec![Out::Close(Ok(()))],
            Packet::Connect(_) => vec![Out::Close(Err(Disconnect::SecondConnect))],
            _ => Vec::new(),
        }
    }

    /// The retained messages a new subscription to `filters` sends, each at most at its
    /// filter's QoS, and only those the client may read.
    pub(super) fn retained(
        &self,
        filters: &[(String, QoS)],
        retained: &Retained,
        auth: &Auth,
    ) -> Vec<Publish> {
        let mut out = Vec::new();
        for (filter, q) in filters {
            retained.matching(filter, &mut |r| {
                if auth.allows(self.user.as_deref(), &self.client_id, &r.topic, false) {
                    let mut r = r.clone();
                    r.qos = min_qos(r.qos, *q);
                    r.retain = true;
                    out.push(r);
                }
            });
        }
        out
    }

    /// The last will, published when the connection ended other than by DISCONNECT.
    pub(super) fn will(&self, ended: &Result<(), Disconnect>) -> Option<Publish> {
        if ended.is_ok() {
            return None;
        }
        self.will.clone()
    }
}

/// A subscriber, as routing sees it.
pub(super) struct Subscriber<'a> {
    pub(super) client_id: &'a str,
    pub(super) user: Option<&'a str>,
    /// edgecore's own in-process client, which the ACL does not restrict.
    pub(super) link: bool,
}

/// The QoS at which `publish` goes to `to`, whose filters matching its topic grant at most
/// `granted` (the highest of them), or `None` when the ACL does not let it read the topic.
/// Never above the publish's own QoS, nor above 1.
pub(super) fn delivery(
    publish: &Publish,
    granted: QoS,
    to: &Subscriber<'_>,
    auth: &Auth,
) -> Option<QoS> {
    if !to.link && !auth.allows(to.user, to.client_id, &publish.topic, false) {
        return None;
    }
    Some(min_qos(publish.qos, granted))
}

/// The lower of two QoS levels, and at most 1 (QoS 2 is delivered at QoS 1).
pub(super) fn min_qos(a: QoS, b: QoS) -> QoS {
    if (a as u8).min(b as u8).min(1) == 0 {
        QoS::AtMostOnce
    } else {
        QoS::AtLeastOnce
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::{LastWill, Login, Subscribe, SubscribeFilter, Unsubscribe};

    /// An ACL: `app` reads one device and writes its update topic; `%c` gets its own subtree.
    fn acl() -> (tempfile::TempDir, Auth) {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("acl");
        std::fs::write(
            &file,
            "user app\ntopic read $hw/events/device/default/oven-1/#\n\
             topic write $hw/events/device/default/oven-1/twin/update\n\
             pattern readwrite clients/%c/#\n",
        )
        .expect("written");
        let auth = Auth::load(None, Some(&file), None).expect("loaded");
        (dir, auth)
    }

    fn connect_as(client_id: &str, user: Option<&str>) -> Connect {
        let mut c = Connect::new(client_id);
        c.keep_alive = 10;
        if let Some(u) = user {
            c.login = Some(Login::new(u, "any"));
        }
        c
    }

    fn session(auth: &Auth, client_id: &str, user: Option<&str>) -> Session {
        Session::connect(&connect_as(client_id, user), None, auth, 1).expect("admitted")
    }

    const OVEN_1: &str = "$hw/events/device/default/oven-1/twin/update";
    const OVEN_2: &str = "$hw/events/device/default/oven-2/twin/update";

    #[test]
    fn a_publish_is_acknowledged_and_routed_only_where_the_acl_grants_it() {
        let (_d, auth) = acl();
        let s = session(&auth, "c1", Some("app"));
        for (topic, pkid, granted) in [(OVEN_1, 7, true), (OVEN_2, 8, false)] {
            let mut p = Publish::new(topic, QoS::AtLeastOnce, "{}");
            p.pkid = pkid;
            let then = if granted {
                Out::Route(p.clone())
            } else {
                Out::Denied(topic.into())
            };
            assert_eq!(
                s.on_packet(Packet::Publish(p), &auth),
                vec![Out::Reply(Packet::PubAck(PubAck::new(pkid))), then],
                "{topic}"
            );
        }
        let anonymous = session(&auth, "c2", None);
        let p = Publish::new(OVEN_1, QoS::AtMostOnce, "{}");
        assert_eq!(
            anonymous.on_packet(Packet::Publish(p), &auth),
            vec![Out::Denied(OVEN_1.into())],
            "anonymous clients get only what the ACL names for them"
        );
    }

    #[test]
    fn a_publish_to_a_wildcard_or_empty_topic_ends_the_connection() {
        let auth = Auth::open();
        let s = session(&auth, "c1", None);
        for topic in ["a/+", "a/#", ""] {
            let out = s.on_packet(
                Packet::Publish(Publish::new(topic, QoS::AtMostOnce, "x")),
                &auth,
            );
            assert!(
                matches!(
                    out.as_slice(),
                    [Out::Close(Err(Disconnect::InvalidTopic(_)))]
                ),
                "{topic:?}: {out:?}"
            );
        }
    }

    #[test]
    fn qos_2_publishes_get_pubrec_and_their_pubrel_gets_pubcomp() {
        let auth = Auth::open();
        let s = session(&auth, "c1", None);
        let mut p = Publish::new("a/b", QoS::ExactlyOnce, "x");
        p.pkid = 3;
        let out = s.on_packet(Packet::Publish(p), &auth);
        assert_eq!(out[0], Out::Reply(Packet::PubRec(PubRec::new(3))));
        assert_eq!(
            s.on_packet(Packet::PubRel(rumqttc::PubRel::new(3)), &auth),
            vec![Out::Reply(Packet::PubComp(PubComp::new(3)))]
        );
    }

    #[test]
    fn a_subscription_is_granted_at_most_qos_1_and_a_malformed_filter_fails_alone() {
        let auth = Auth::open();
        let s = session(&auth, "c1", None);
        let sub = Subscribe::new_many([
            SubscribeFilter::new("a/#".into(), QoS::ExactlyOnce),
            SubscribeFilter::new("a/#/b".into(), QoS::AtMostOnce),
            SubscribeFilter::new("b/+".into(), QoS::AtMostOnce),
        ]);
        let pkid = sub.pkid;
        assert_eq!(
            s.on_packet(Packet::Subscribe(sub), &auth),
            vec![
                Out::Subscribe(vec![
                    ("a/#".into(), QoS::AtLeastOnce),
                    ("b/+".into(), QoS::AtMostOnce)
                ]),
                Out::Reply(Packet::SubAck(SubAck::new(
                    pkid,
                    vec![
                        SubscribeReasonCode::Success(QoS::AtLeastOnce),
                        SubscribeReasonCode::Failure,
                        SubscribeReasonCode::Success(QoS::AtMostOnce)
                    ]
                )))
            ]
        );
        let out = s.on_packet(Packet::Unsubscribe(Unsubscribe::new("a/#")), &auth);
        assert_eq!(out[0], Out::Unsubscribe(vec!["a/#".into()]));
    }

    #[test]
    fn retained_messages_go_only_where_the_acl_lets_the_subscriber_read() {
        let (_d, auth) = acl();
        let s = session(&auth, "c1", Some("app"));
        let mut retained = Retained::default();
        for t in [OVEN_1, OVEN_2, "clients/c1/x", "clients/c2/x"] {
            retained.set(&Publish::new(t, QoS::AtLeastOnce, "v"));
        }
        let mut got: Vec<String> = s
            .retained(
                &[
                    ("$hw/events/device/#".into(), QoS::AtMostOnce),
                    ("clients/#".into(), QoS::AtLeastOnce),
                ],
                &retained,
                &auth,
            )
            .into_iter()
            .map(|p| {
                assert!(p.retain, "sent as retained");
                format!("{} {:?}", p.topic, p.qos)
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                format!("{OVEN_1} AtMostOnce"),
                "clients/c1/x AtLeastOnce".to_string()
            ]
        );
    }

    #[test]
    fn delivery_needs_the_acl_and_never_exceeds_the_publish_nor_qos_1() {
        let (_d, auth) = acl();
        let app = Subscriber {
            client_id: "c1",
            user: Some("app"),
            link: false,
        };
        let at = |topic: &str, qos| Publish::new(topic, qos, "v");
        let one = QoS::AtLeastOnce;
        assert_eq!(delivery(&at(OVEN_1, one), one, &app, &auth), Some(one));
        assert_eq!(
            delivery(&at(OVEN_1, QoS::AtMostOnce), one, &app, &auth),
            Some(QoS::AtMostOnce),
            "never above the publish's QoS"
        );
        assert_eq!(
            delivery(&at(OVEN_1, one), QoS::AtMostOnce, &app, &auth),
            Some(QoS::AtMostOnce),
            "never above the subscription's"
        );
        assert_eq!(
            delivery(&at(OVEN_2, one), one, &app, &auth),
            None,
            "the ACL does not let app read oven-2"
        );
        let link = Subscriber {
            client_id: "edgecore",
            user: None,
            link: true,
        };
        assert_eq!(
            delivery(
                &at(OVEN_2, QoS::ExactlyOnce),
                QoS::ExactlyOnce,
                &link,
                &auth
            ),
            Some(one),
            "edgecore's own link is not restricted, and QoS 2 goes as 1"
        );
    }

    #[test]
    fn a_will_the_client_may_not_publish_refuses_its_connect() {
        let (_d, auth) = acl();
        let mut c = connect_as("c1", Some("app"));
        c.last_will = Some(LastWill::new(OVEN_2, "gone", QoS::AtLeastOnce, false));
        assert_eq!(
            Session::connect(&c, None, &auth, 1).map(|_| ()),
            Err(ConnectReturnCode::NotAuthorized)
        );
        c.last_will = Some(LastWill::new("a/#", "gone", QoS::AtLeastOnce, false));
        assert_eq!(
            Session::connect(&c, None, &Auth::open(), 1).map(|_| ()),
            Err(ConnectReturnCode::NotAuthorized),
            "a will topic with a wildcard"
        );
        c.last_will = Some(LastWill::new(OVEN_1, "gone", QoS::AtLeastOnce, true));
        let s = Session::connect(&c, None, &auth, 1).expect("its will is granted");
        assert_eq!(s.will(&Ok(())), None, "DISCONNECT: no will");
        let will = s.will(&Err(Disconnect::KeepAlive)).expect("a will");
        assert_eq!((will.topic.as_str(), will.retain), (OVEN_1, true));
    }

    #[test]
    fn a_client_id_with_a_wildcard_is_refused_under_an_acl() {
        let (_d, auth) = acl();
        for id in ["#", "c+", "a/#"] {
            assert_eq!(
                Session::connect(&connect_as(id, Some("app")), None, &auth, 1).map(|_| ()),
                Err(ConnectReturnCode::NotAuthorized),
                "{id}"
            );
        }
        assert!(Session::connect(&connect_as("#", None), None, &Auth::open(), 1).is_ok());
    }

    #[test]
    fn a_certificate_identity_is_the_user_and_an_empty_client_id_gets_one() {
        let auth = Auth::open();
        let s = Session::connect(
            &connect_as("", Some("pw-user")),
            Some("cn".into()),
            &auth,
            42,
        )
        .expect("admitted");
        assert_eq!(s.user.as_deref(), Some("cn"));
        assert_eq!(s.client_id, "anonymous-42");
        assert_eq!(s.keep_alive, Some(Duration::from_secs(15)));
        let mut c = connect_as("c", None);
        c.keep_alive = 0;
        let s = Session::connect(&c, None, &auth, 1).expect("admitted");
        assert_eq!(
            s.keep_alive, None,
            "a keep-alive of 0 turns the timeout off"
        );
    }

    #[test]
    fn pings_acks_and_a_second_connect() {
        let auth = Auth::open();
        let s = session(&auth, "c1", None);
        assert_eq!(
            s.on_packet(Packet::PingReq, &auth),
            vec![Out::Reply(Packet::PingResp)]
        );
        assert_eq!(
            s.on_packet(Packet::PubAck(PubAck::new(1)), &auth),
            vec![Out::Acked]
        );
        assert_eq!(
            s.on_packet(Packet::Disconnect, &auth),
            vec![Out::Close(Ok(()))]
        );
        assert!(matches!(
            s.on_packet(Packet::Connect(connect_as("c1", None)), &auth)
                .as_slice(),
            [Out::Close(Err(Disconnect::SecondConnect))]
        ));
    }
}
