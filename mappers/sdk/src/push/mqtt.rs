//! The MQTT push target (feature `mqtt`): one persistent rumqttc connection per broker, values published to the property's topic.

use super::*;
use rumqttc::{AsyncClient, MqttOptions, QoS};

pub(super) async fn run(
    address: String,
    topic: Option<String>,
    qos: u8,
    retained: bool,
    mut rx: mpsc::Receiver<Message>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let (host, port) = match rt::address::split_host_port(&address, Some(1883)) {
        Ok(hp) => hp,
        Err(e) => {
            tracing::error!(error = %e, "MQTT push target unusable");
            return;
        }
    };
    let id = format!("mapper-push-{}", uuid_like());
    let mut options = MqttOptions::new(id, host, port);
    options.set_keep_alive(Duration::from_secs(30));
    let (client, mut eventloop) = AsyncClient::new(options, QUEUE);
    let qos = match qos {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    };
    let poll_cancel = cancel.clone();
    let poll_metrics = metrics.clone();
    tokio::spawn(async move {
        let mut backoff = retry_backoff();
        loop {
            let event = tokio::select! {
                _ = poll_cancel.cancelled() => return,
                e = eventloop.poll() => e,
            };
            match event {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(_))) => {
                    backoff.reset();
                    tracing::info!(broker = %address, "push target connected");
                }
                Ok(_) => {}
                Err(e) => {
                    poll_metrics.push_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(broker = %address, error = %e, retry_in = ?backoff.peek(), "MQTT push target unreachable");
                    tokio::select! {
                        _ = poll_cancel.cancelled() => return,
                        _ = tokio::time::sleep(backoff.next_delay()) => {}
                    }
                }
            }
        }
    });
    loop {
        let m = tokio::select! {
            _ = cancel.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        let (t, payload) = match &topic {
            Some(t) => (t.clone(), m.json()),
            None => (
                format!("$ke/events/device/{}/{}/data/update", m.namespace, m.device),
                m.ke_data(),
            ),
        };
        // rumqttc queues the publish; it goes out when the connection is up.
        match client.try_publish(t, qos, retained, payload) {
            Ok(()) => metrics.pushes.fetch_add(1, Ordering::Relaxed),
            Err(_) => metrics.push_errors.fetch_add(1, Ordering::Relaxed),
        };
    }
}

fn uuid_like() -> String {
    format!(
        "{:x}",
        crate::clock::now_ms() ^ u64::from(std::process::id())
    )
}
