//! KubeEdge's `$hw` MQTT API, used by a plain MQTT client as a KubeEdge app would, against the
//! embedded broker and against a real Mosquitto.

mod common;
use common::*;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::Value;
use std::time::Duration;

struct App {
    client: AsyncClient,
    events: EventLoop,
    /// Messages received but not yet expected: results and events arrive in either order.
    pending: Vec<(String, Value)>,
}

impl App {
    async fn connect(port: u16) -> Self {
        let mut o = MqttOptions::new(
            format!("app-{port}-{}", std::process::id()),
            "127.0.0.1",
            port,
        );
        o.set_keep_alive(Duration::from_secs(10));
        let (client, events) = AsyncClient::new(o, 100);
        let mut app = Self {
            client,
            events,
            pending: Vec::new(),
        };
        app.client
            .subscribe("$hw/events/device/default/oven-1/#", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        app.client
            .subscribe("$hw/events/node/test-node/#", QoS::AtLeastOnce)
            .await
            .expect("subscribe");
        // Wait for both SubAcks.
        let mut acks = 0;
        while acks < 2 {
            if let Ok(Event::Incoming(Packet::SubAck(_))) = app.next_event().await {
                acks += 1;
            }
        }
        app
    }

    async fn next_event(&mut self) -> Result<Event, rumqttc::ConnectionError> {
        tokio::time::timeout(Duration::from_secs(10), self.events.poll())
            .await
            .expect("MQTT event within 10 s")
    }

    async fn send(&self, topic: &str, payload: &[u8]) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload.to_vec())
            .await
            .expect("publish");
    }

    /// The oldest message on `topic` not yet expected, as JSON.
    async fn expect(&mut self, topic: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.pending.iter().position(|(t, _)| t == topic) {
                return self.pending.remove(i).1;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no message on {topic}; got {:?}",
                self.pending
            );
            if let Ok(Event::Incoming(Packet::Publish(p))) = self.next_event().await {
                let v = serde_json::from_slice(&p.payload).unwrap_or(Value::Null);
                self.pending.push((p.topic.clone(), v));
            }
        }
    }
}

const DEV: &str = "$hw/events/device/default/oven-1";

async fn exercise(port: u16, round: u32) {
    let mut app = App::connect(port).await;
    let temp = format!("2{round}.5");
    let set = format!("9{round}");

    // A reported value, as a mapper would send it.
    let body = format!(
        r#"{{"event_id":"r1","timestamp":1,"twin":{{"temperature":{{"actual":{{"value":"{temp}"}},"metadata":{{"type":"float"}}}}}}}}"#
    );
    app.send(&format!("{DEV}/twin/update"), body.as_bytes())
        .await;
    let r = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(r["event_id"], "r1");
    assert_eq!(r["twin"]["temperature"]["actual"]["value"], temp.as_str());
    assert!(r["twin"]["temperature"]["actual_version"]["edge"].as_u64() >= Some(1));
    let doc = app.expect(&format!("{DEV}/twin/update/document")).await;
    assert_eq!(
        doc["event_id"], "r1",
        "the document echoes the request's event_id"
    );
    assert_eq!(
        doc["twin"]["temperature"]["current"]["actual"]["value"],
        temp.as_str()
    );
    if round != 2 {
        // (Round 2 runs on the same edgecore after round 1 settled setpoint.)
        // The delta covers the whole twin: setpoint's desired value (80, from the manifest)
        // has not been reported yet, though this update did not touch it.
        let delta = app.expect(&format!("{DEV}/twin/update/delta")).await;
        assert_eq!(delta["delta"]["setpoint"], "80", "{delta}");
        assert!(delta["twin"]["setpoint"]["expected"].is_object(), "{delta}");
        assert_ne!(
            delta["event_id"], "r1",
            "a delta has an id of its own, as in KubeEdge"
        );
    }
    if round != 2 {
        assert!(
            doc["twin"]["temperature"]["last"]["actual"].is_null(),
            "{doc}"
        );
    }

    // A desired value set by an app at the edge, then a delta since the device has not caught up.
    let body = format!(
        r#"{{"event_id":"d1","timestamp":2,"twin":{{"setpoint":{{"expected":{{"value":"{set}"}}}}}}}}"#
    );
    app.send(&format!("{DEV}/twin/update"), body.as_bytes())
        .await;
    let r = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(r["twin"]["setpoint"]["expected"]["value"], set.as_str());
    let doc = app.expect(&format!("{DEV}/twin/update/document")).await;
    assert_eq!(doc["event_id"], "d1");
    let delta = app.expect(&format!("{DEV}/twin/update/delta")).await;
    assert_eq!(delta["delta"]["setpoint"], set.as_str());

    // An expected value beyond the model's range (maximum 300) is refused with the reason.
    app.send(
        &format!("{DEV}/twin/update"),
        br#"{"event_id":"r1","timestamp":2,"twin":{"setpoint":{"expected":{"value":"301"}}}}"#,
    )
    .await;
    let r = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(
        (r["event_id"].as_str(), r["code"].as_u64()),
        (Some("r1"), Some(400)),
        "{r}"
    );
    assert!(
        r["reason"]
            .as_str()
            .is_some_and(|m| m.contains("above the model maximum 300")),
        "{r}"
    );

    // expected and actual in one request: one document, and no delta left behind.
    let body = format!(
        r#"{{"event_id":"b1","timestamp":2,"twin":{{"setpoint":{{"expected":{{"value":"{set}"}},"actual":{{"value":"{set}"}}}}}}}}"#
    );
    app.send(&format!("{DEV}/twin/update"), body.as_bytes())
        .await;
    let r = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(r["twin"]["setpoint"]["actual"]["value"], set.as_str());
    let doc = app.expect(&format!("{DEV}/twin/update/document")).await;
    assert_eq!(doc["event_id"], "b1");
    assert_eq!(
        doc["twin"]["setpoint"]["current"]["actual"]["value"],
        set.as_str()
    );

    // get and get/result.
    app.send(
        &format!("{DEV}/twin/get"),
        br#"{"event_id":"g1","timestamp":3}"#,
    )
    .await;
    let g = app.expect(&format!("{DEV}/twin/get/result")).await;
    assert_eq!(g["event_id"], "g1");
    assert!(
        !app.pending
            .iter()
            .any(|(t, _)| t.ends_with("/document") || t.ends_with("/delta")),
        "one document for the combined update and no stale delta: {:?}",
        app.pending
    );
    assert_eq!(g["twin"]["temperature"]["actual"]["value"], temp.as_str());
    assert!(
        g["twin"]["temperature"].get("actual_version").is_none(),
        "get/result strips versions"
    );

    // State.
    app.send(
        &format!("{DEV}/state/update"),
        br#"{"event_id":"s1","timestamp":4,"state":"online"}"#,
    )
    .await;
    let s = app.expect(&format!("{DEV}/state/update/result")).await;
    assert_eq!(s["device"]["state"], "online");
    assert!(
        s["device"]["lastOnlineTime"]
            .as_str()
            .unwrap_or("")
            .ends_with('Z')
    );

    // Membership.
    app.send(
        "$hw/events/node/test-node/membership/get",
        br#"{"event_id":"m1"}"#,
    )
    .await;
    let m = app
        .expect("$hw/events/node/test-node/membership/get/result")
        .await;
    assert_eq!(m["devices"][0]["id"], "default/oven-1");
    assert_eq!(m["devices"][0]["state"], "online");

    // Garbage gets an error on the result topic and changes nothing.
    for bad in [
        &b"\x00\xffnot json"[..],
        b"{}",
        br#"{"twin":{"temperature":{"actual":{"value":"warm"}}}}"#,
    ] {
        app.send(&format!("{DEV}/twin/update"), bad).await;
        let r = app.expect(&format!("{DEV}/twin/update/result")).await;
        assert_eq!(r["code"], 400, "{r}");
        assert!(r["reason"].as_str().is_some_and(|s| !s.is_empty()));
    }
    app.send(&format!("{DEV}/state/update"), br#"{"state":"sleepy"}"#)
        .await;
    let r = app.expect(&format!("{DEV}/state/update/result")).await;
    assert_eq!(r["code"], 400);
    app.send("$hw/events/device/default/ghost/twin/get", b"{}")
        .await;
    app.send(&format!("{DEV}/twin/get"), b"{}").await;
    let g = app.expect(&format!("{DEV}/twin/get/result")).await;
    assert_eq!(
        g["twin"]["temperature"]["actual"]["value"],
        temp.as_str(),
        "still there after garbage"
    );
}

#[tokio::test]
async fn hw_api_on_the_embedded_broker() {
    let e = Edgecore::start(None);
    exercise(e.mqtt_port, 1).await;
    // A raw garbage connection does not take the broker down.
    {
        use tokio::io::AsyncWriteExt;
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", e.mqtt_port))
            .await
            .expect("connect");
        let _ = s.write_all(b"\x10\xff\xff\xff\xff\x7fGARBAGE").await;
    }
    exercise(e.mqtt_port, 2).await;
}

/// Mosquitto on a free port and edgecore connected to it with `mqtt_extra` in its `mqtt:`
/// settings; `None` (the test skipped, saying so) without Mosquitto.
fn on_mosquitto(mqtt_extra: &str) -> Option<(u16, Mosquitto, Edgecore)> {
    let port = free_port();
    let Some(broker) = mosquitto(port) else {
        sim::skip("mosquitto is not installed");
        return None;
    };
    let e = Edgecore::start_external_with(port, mqtt_extra);
    e.wait_mqtt_connected();
    Some((port, broker, e))
}

#[tokio::test]
async fn hw_api_on_an_external_mosquitto() {
    let Some((port, _broker, _e)) = on_mosquitto("") else {
        return;
    };
    exercise(port, 3).await;
}

/// An external broker that is not up yet: edgecore's log names it and says why (its client
/// goes through an in-process relay, which alone sees the refused connection), and edgecore
/// joins it once it is up.
#[tokio::test]
async fn an_external_broker_down_at_start_is_named_with_the_reason_then_joined() {
    if sim::missing("mosquitto", "mosquitto") {
        return;
    }
    let port = free_port();
    let e = Edgecore::with_dir(dir_with_manifest(), Some(port));
    let why = format!("cannot connect to the MQTT broker 127.0.0.1:{port}: Connection refused");
    e.eventually(
        "edgecore's log says why the broker cannot be reached",
        |e| e.log().contains(&why).then_some(()),
    );
    let _broker = mosquitto(port).expect("mosquitto starts");
    e.wait_mqtt_connected();
    exercise(port, 4).await;
}

/// The relay to an external broker listens on an abstract Unix socket, which any process of
/// the network namespace can reach: it serves edgecore's own client only.
#[tokio::test]
async fn the_relay_to_an_external_broker_refuses_other_processes() {
    use tokio::io::AsyncReadExt;
    let Some((port, _broker, e)) = on_mosquitto("") else {
        return;
    };
    let address = relay_of(&e).expect("edgecore's relay is in /proc/net/unix");
    let mut other = tokio::net::UnixStream::connect(format!("\0{}", &address[1..]))
        .await
        .expect("the abstract socket takes the connection");
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), other.read(&mut buf))
        .await
        .expect("the relay closes the connection")
        .unwrap_or(0);
    assert_eq!(n, 0, "another process got bytes from the relay");
    e.eventually("edgecore's log says it refused another process", |e| {
        e.log()
            .contains("MQTT relay refused a connection from another process")
            .then_some(())
    });
    // Its own client is still connected and served.
    exercise(port, 5).await;
}

/// A broker that goes silent without closing the connection (stopped: its host still
/// acknowledges every byte, so no socket error comes): edgecore finds it by the ping it does not
/// answer, within twice `keepAliveSeconds`, says so, stops counting itself connected, and is
/// served again once the broker answers. With the default keep-alive (30 s) nothing is said
/// within the 10 s this test waits.
#[tokio::test]
async fn an_external_broker_gone_silent_is_found_by_its_ping_and_joined_again() {
    let Some((port, broker, e)) = on_mosquitto(", keepAliveSeconds: 1") else {
        return;
    };
    exercise(port, 7).await;
    broker.signal("STOP");
    e.eventually("edgecore's log says the broker went silent", |e| {
        e.log()
            .contains("the MQTT broker did not answer a ping within 1s")
            .then_some(())
    });
    let metrics = e.metrics();
    assert!(
        metrics.lines().any(|l| l == "edgecore_mqtt_connected 0"),
        "edgecore still counts itself connected to a silent broker"
    );
    broker.signal("CONT");
    e.wait_mqtt_connected();
    // (Round 2: the second round on one edgecore.)
    exercise(port, 2).await;
}

/// The abstract socket of edgecore's relay to its external broker (`@edgecore-mqtt-PID-…`).
fn relay_of(e: &Edgecore) -> Option<String> {
    let name = format!("@edgecore-mqtt-{}-", e.child.id());
    let table = std::fs::read_to_string("/proc/net/unix").expect("/proc/net/unix");
    table
        .lines()
        .filter_map(|l| l.split_whitespace().nth(7))
        .find(|a| a.starts_with(&name))
        .map(str::to_string)
}

/// `quickAck: false` (for a broker with `set_tcp_nodelay true`): no relay, the client
/// connects straight to the broker, and the `$hw` API is served the same.
#[tokio::test]
async fn without_quick_ack_edgecore_connects_straight_to_the_broker() {
    let Some((port, _broker, e)) = on_mosquitto(", quickAck: false") else {
        return;
    };
    assert_eq!(relay_of(&e), None, "a relay is listening");
    exercise(port, 6).await;
}

/// The embedded broker with a password file written by Mosquitto's own `mosquitto_passwd` and
/// a Mosquitto ACL file: an anonymous client and a wrong password are refused, and the app
/// user reaches its device's `$hw` topics only (a publish elsewhere is acknowledged and
/// dropped, and counted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_broker_takes_mosquittos_password_and_acl_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let passwd = dir.path().join("mqtt.passwd");
    let made = std::process::Command::new("mosquitto_passwd")
        .args(["-c", "-b"])
        .arg(&passwd)
        .args(["app", "s3cret"])
        .output();
    if !made.as_ref().is_ok_and(|o| o.status.success()) {
        sim::skip(&format!(
            "mosquitto_passwd (Debian's mosquitto package) is not there: {made:?}"
        ));
        return;
    }
    let acl = dir.path().join("mqtt.acl");
    std::fs::write(
        &acl,
        "pattern readwrite clients/%c/#\nuser app\ntopic read $hw/events/device/default/oven-1/#\ntopic write $hw/events/device/default/oven-1/twin/update\n",
    )
    .expect("acl");
    let e = Edgecore::start_with(
        &format!(
            ", passwordFile: {}, aclFile: {}",
            passwd.display(),
            acl.display()
        ),
        "",
    );
    let connect = |user: Option<(&str, &str)>, n: u32| {
        let mut o = MqttOptions::new(format!("c{n}"), "127.0.0.1", e.mqtt_port);
        if let Some((u, p)) = user {
            o.set_credentials(u, p);
        }
        AsyncClient::new(o, 16)
    };
    for (user, code) in [
        (None, rumqttc::ConnectReturnCode::NotAuthorized),
        (
            Some(("app", "wrong")),
            rumqttc::ConnectReturnCode::BadUserNamePassword,
        ),
    ] {
        let (_c, mut ev) = connect(user, 1);
        let r = tokio::time::timeout(Duration::from_secs(10), ev.poll())
            .await
            .expect("an answer");
        assert!(
            matches!(r, Err(rumqttc::ConnectionError::ConnectionRefused(c)) if c == code),
            "{user:?}: {r:?}"
        );
    }
    let (client, events) = connect(Some(("app", "s3cret")), 2);
    let mut app = App {
        client,
        events,
        pending: Vec::new(),
    };
    app.client
        .subscribe("$hw/events/device/+/+/twin/update/result", QoS::AtLeastOnce)
        .await
        .expect("subscribe");
    app.send(
        &format!("{DEV}/twin/update"),
        br#"{"event_id":"e1","twin":{"setpoint":{"expected":{"value":"42"}}}}"#,
    )
    .await;
    let result = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(result["event_id"], "e1", "{result}");
    // Not granted: acknowledged (the client is not cut off) and dropped.
    app.send(&format!("{DEV}/twin/get"), br#"{"event_id":"e2"}"#)
        .await;
    // A granted request after it: once answered, the one before was handled (one connection
    // keeps its order).
    app.send(
        &format!("{DEV}/twin/update"),
        br#"{"event_id":"e3","twin":{"setpoint":{"expected":{"value":"43"}}}}"#,
    )
    .await;
    let result = app.expect(&format!("{DEV}/twin/update/result")).await;
    assert_eq!(result["event_id"], "e3", "{result}");
    let denied = e.eventually("the denied publish counted", |e| {
        let text = e.metrics();
        text.lines()
            .find(|l| l.starts_with("edgecore_broker_denied_total "))
            .filter(|l| !l.ends_with(" 0"))
            .map(str::to_string)
    });
    assert!(denied.ends_with(" 1"), "{denied}");
    assert!(e.metrics().contains("edgecore_broker_refused_total 2"));

    // Mosquitto's own clients, one step off: a last will on a topic the ACL does not grant
    // (another device's twin/update, retained or not) is refused at CONNECT, as Mosquitto
    // refuses it, so that dropping the connection cannot publish it.
    let port = e.mqtt_port.to_string();
    let mosquitto = |tool: &str, args: &[&str]| {
        let out = std::process::Command::new(tool)
            .args(["-h", "127.0.0.1", "-p", &port, "-u", "app", "-P", "s3cret"])
            .args(args)
            .output()
            .expect("a mosquitto client runs");
        (out.status.success(), common::text(&out))
    };
    let other = "$hw/events/device/default/oven-2/twin/update";
    for retain in [false, true] {
        let mut args = vec!["-i", "w1", "-t", &format!("{DEV}/twin/update")]
            .into_iter()
            .map(String::from)
            .collect::<Vec<_>>();
        args.extend(["-m", "{}", "--will-topic", other, "--will-payload", "{}"].map(String::from));
        if retain {
            args.push("--will-retain".into());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out) = mosquitto("mosquitto_pub", &args);
        assert!(
            !ok && out.contains("not authorised"),
            "will retained={retain}: {out}"
        );
    }
    // `pattern ... clients/%c/#`: a client id with `#` is refused; one with `/` is granted
    // nothing by the pattern (`a/b` would sit inside client `a`'s topics).
    let (ok, out) = mosquitto(
        "mosquitto_sub",
        &["-i", "#", "-t", "clients/a/#", "-W", "3"],
    );
    assert!(!ok && out.contains("not authorised"), "{out}");
    let (ok, out) = mosquitto(
        "mosquitto_pub",
        &[
            "-i",
            "a",
            "-t",
            "clients/a/b/x",
            "-m",
            "for a only",
            "-r",
            "-q",
            "1",
        ],
    );
    assert!(ok, "{out}");
    let (ok, out) = mosquitto(
        "mosquitto_sub",
        &["-i", "a", "-t", "clients/a/#", "-C", "1", "-W", "10"],
    );
    assert!(
        ok && out.contains("for a only"),
        "client a reads its own: {out}"
    );
    let (_, out) = mosquitto(
        "mosquitto_sub",
        &["-i", "a/b", "-t", "clients/a/b/#", "-C", "1", "-W", "3"],
    );
    assert!(
        !out.contains("for a only"),
        "a/b read client a's topic: {out}"
    );
    // A connection with another's client id takes it over: the older one is closed, as MQTT
    // says, not left open answering pings and receiving nothing.
    let (old, mut old_events) = connect(Some(("app", "s3cret")), 7);
    let first = tokio::time::timeout(Duration::from_secs(10), old_events.poll()).await;
    assert!(
        matches!(first, Ok(Ok(Event::Incoming(Packet::ConnAck(_))))),
        "{first:?}"
    );
    let (_new, mut new_events) = connect(Some(("app", "s3cret")), 7);
    let taken = tokio::time::timeout(Duration::from_secs(10), new_events.poll()).await;
    assert!(
        matches!(taken, Ok(Ok(Event::Incoming(Packet::ConnAck(_))))),
        "{taken:?}"
    );
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match old_events.poll().await {
                Err(e) => return e,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the older connection of c7 is still open");
    drop(old);
}

/// The embedded broker's TLS listener with client certificates as users (Mosquitto's
/// `require_certificate` and `use_identity_as_username`), tried with Mosquitto's own clients:
/// a client whose certificate names `app` reaches its device's topics and gets its answers; a
/// client without a certificate, or with one from another CA, is refused in the handshake; a
/// certificate of the right CA for a user the ACL does not know is connected and gets nothing
/// through (its publish counted as denied).
#[test]
fn the_embedded_broker_takes_client_certificates_as_users_over_tls() {
    if sim::missing("mosquitto_sub", "mosquitto-clients") {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    for sub in ["ca", "stranger"] {
        std::fs::create_dir(d.join(sub)).expect("mkdir");
    }
    let (ca, ca_key) = pki::load_or_make_ca(&d.join("ca")).expect("a CA");
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let leaf = |cn: &str, server: bool| {
        pki::sign_leaf(&ca, &ca_key, cn, None, &["127.0.0.1".into()], server, 1)
            .expect("a certificate")
    };
    let (server_crt, server_key) = leaf("broker", true);
    let (app_crt, app_key) = leaf("app", false);
    let (other_crt, other_key) = leaf("intruder", false);
    let (stranger_ca, stranger_ca_key) =
        pki::load_or_make_ca(&d.join("stranger")).expect("another CA");
    let (stranger_crt, stranger_key) =
        pki::sign_leaf(&stranger_ca, &stranger_ca_key, "app", None, &[], false, 1)
            .expect("a certificate of another CA");
    let files = |name: &str, crt: &str, key: &str| {
        (
            write(&format!("{name}.crt"), crt),
            write(&format!("{name}.key"), key),
        )
    };
    let (server_crt, server_key) = files("server", &server_crt, &server_key);
    let app = files("app", &app_crt, &app_key);
    let intruder = files("intruder", &other_crt, &other_key);
    let stranger = files("stranger", &stranger_crt, &stranger_key);
    let ca_file = write("clients-ca.crt", &ca);
    let acl = write(
        "mqtt.acl",
        "user app\ntopic read $hw/events/device/default/oven-1/#\ntopic write $hw/events/device/default/oven-1/twin/update\n",
    );
    let tls_port = free_port();
    let e = Edgecore::start_with(
        &format!(
            ", aclFile: {}, tls: {{address: \"127.0.0.1:{tls_port}\", certFile: {}, keyFile: {}, caFile: {}, requireCertificate: true, useIdentityAsUsername: true}}",
            acl.display(),
            server_crt.display(),
            server_key.display(),
            ca_file.display()
        ),
        "",
    );
    let tls_args = |who: &(std::path::PathBuf, std::path::PathBuf)| {
        vec![
            "-h".to_string(),
            "127.0.0.1".into(),
            "-p".into(),
            tls_port.to_string(),
            "--cafile".into(),
            ca_file.display().to_string(),
            "--cert".into(),
            who.0.display().to_string(),
            "--key".into(),
            who.1.display().to_string(),
        ]
    };
    let publish = |args: &[String], id: &str| {
        std::process::Command::new("mosquitto_pub")
            .args(args)
            .args(["-q", "1", "-t", &format!("{DEV}/twin/update"), "-m"])
            .arg(format!(
                r#"{{"event_id":"{id}","twin":{{"setpoint":{{"expected":{{"value":"44"}}}}}}}}"#
            ))
            .output()
            .expect("mosquitto_pub runs")
    };

    // The app: subscribed to its answers, it publishes until one comes back.
    let mut sub = std::process::Command::new("mosquitto_sub")
        .args(tls_args(&app))
        .args(["-q", "1", "-C", "1", "-W", "60", "-t"])
        .arg(format!("{DEV}/twin/update/result"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("mosquitto_sub runs");
    let answered = loop {
        let out = publish(&tls_args(&app), "tls-1");
        assert!(out.status.success(), "{out:?}");
        std::thread::sleep(Duration::from_millis(300));
        if let Some(status) = sub.try_wait().expect("mosquitto_sub") {
            break status;
        }
    };
    let out = sub.wait_with_output().expect("mosquitto_sub output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        answered.success(),
        "{answered}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_str(text.trim()).expect("a JSON result");
    assert_eq!(result["event_id"], "tls-1", "{result}");

    // No certificate, and a certificate of another CA: refused in the handshake.
    let mut bare = tls_args(&app);
    bare.truncate(6);
    for (what, args) in [
        ("no certificate", bare),
        ("another CA", tls_args(&stranger)),
    ] {
        let out = publish(&args, "refused");
        assert!(!out.status.success(), "{what}: {out:?}");
    }
    // A certificate of the right CA, for a user the ACL does not grant: its publish is dropped.
    let out = publish(&tls_args(&intruder), "intruder");
    assert!(out.status.success(), "{out:?}");
    let denied = e.eventually("the intruder's publish counted as denied", |e| {
        e.metrics()
            .lines()
            .find(|l| l.starts_with("edgecore_broker_denied_total "))
            .filter(|l| !l.ends_with(" 0"))
            .map(str::to_string)
    });
    assert!(denied.ends_with(" 1"), "{denied}");
    let refused = e.metrics();
    let refused = refused
        .lines()
        .find(|l| l.starts_with("edgecore_broker_refused_total "))
        .unwrap_or_default();
    assert_eq!(refused, "edgecore_broker_refused_total 2", "{refused}");
    // The twin kept the app's value.
    let twin = e.twin("default/oven-1").expect("the twin");
    assert_eq!(desired(&twin, "setpoint").as_deref(), Some("44"), "{twin}");
}

/// An app that subscribes once per device, as KubeEdge apps typically do (20,000 result topics
/// here, most of devices that do not exist): it gets its device's results, once each; the
/// broker counts every subscription, and forgets them when they are unsubscribed and when the
/// app goes.
#[tokio::test]
async fn an_app_subscribing_per_device_gets_its_results_once_and_the_broker_forgets_them() {
    let e = Edgecore::start(None);
    e.wait_mqtt_connected();
    let held = |e: &Edgecore| -> u64 {
        e.metrics()
            .lines()
            .find_map(|l| l.strip_prefix("edgecore_broker_subscriptions "))
            .and_then(|v| v.trim().parse().ok())
            .expect("the subscriptions gauge")
    };
    let before = held(&e);
    let mut o = MqttOptions::new("per-device-app", "127.0.0.1", e.mqtt_port);
    o.set_keep_alive(Duration::from_secs(30));
    let (client, mut events) = AsyncClient::new(o, 1000);
    let result = |d: &str| format!("$hw/events/device/default/{d}/twin/update/result");
    let mut topics: Vec<String> = (0..19_999).map(|k| result(&format!("dev-{k}"))).collect();
    topics.push(result("oven-1"));
    // The same filter twice holds one subscription.
    topics.push(result("oven-1"));
    let batches: Vec<Vec<String>> = topics.chunks(100).map(<[String]>::to_vec).collect();
    let sending = {
        let (client, batches) = (client.clone(), batches.clone());
        tokio::spawn(async move {
            for b in batches {
                let f = b
                    .into_iter()
                    .map(|t| rumqttc::SubscribeFilter::new(t, QoS::AtLeastOnce));
                client.subscribe_many(f).await.expect("subscribe");
            }
        })
    };
    let mut acks = 0;
    while acks < batches.len() {
        let ev = tokio::time::timeout(Duration::from_secs(60), events.poll())
            .await
            .expect("SUBACKs within 60 s")
            .expect("connected");
        if let Event::Incoming(Packet::SubAck(_)) = ev {
            acks += 1;
        }
    }
    sending.await.expect("subscribed");
    assert_eq!(held(&e), before + 20_000);

    client
        .publish(
            format!("{DEV}/twin/update"),
            QoS::AtLeastOnce,
            false,
            br#"{"event_id":"per-device-1","twin":{"temperature":{"actual":{"value":"21"}}}}"#
                .to_vec(),
        )
        .await
        .expect("publish");
    let mut results = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    // Everything that arrives for 3 s after the answer: one result, on oven-1's topic.
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let Ok(ev) = tokio::time::timeout(left, events.poll()).await else {
            break;
        };
        if let Ok(Event::Incoming(Packet::Publish(p))) = ev {
            assert_eq!(p.topic, result("oven-1"), "only oven-1's result");
            results += 1;
        }
    }
    assert_eq!(results, 1, "one result for one update, not one per filter");

    let polling = tokio::spawn(async move { while events.poll().await.is_ok() {} });
    for t in &topics[..10_000] {
        client.unsubscribe(t.clone()).await.expect("unsubscribe");
    }
    let e = tokio::task::spawn_blocking(move || {
        e.eventually("half the subscriptions forgotten", |e| {
            (held(e) == before + 10_000).then_some(())
        });
        e
    })
    .await
    .expect("checked");
    polling.abort();
    drop(client);
    tokio::task::spawn_blocking(move || {
        e.eventually("all of them forgotten with the app", |e| {
            (held(e) == before).then_some(())
        });
    })
    .await
    .expect("checked");
}
