//! The HTTP push target (feature `http`): each value POSTed as JSON to the property's URL.

use super::*;

pub(super) async fn run(
    url: String,
    timeout: Duration,
    mut rx: mpsc::Receiver<Message>,
    metrics: Arc<Metrics>,
    cancel: CancellationToken,
) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(true)
        .build()
        .into();
    let mut backoff = retry_backoff();
    loop {
        let m = tokio::select! {
            _ = cancel.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        let body = m.json();
        // Retried with backoff until it goes through or newer values fill the queue.
        loop {
            let (agent2, url2, body2) = (agent.clone(), url.clone(), body.clone());
            let r = tokio::task::spawn_blocking(move || {
                agent2
                    .post(&url2)
                    .header("content-type", "application/json")
                    .send(&body2[..])
                    .map(|_| ())
            })
            .await;
            match r {
                Ok(Ok(())) => {
                    metrics.pushes.fetch_add(1, Ordering::Relaxed);
                    backoff.reset();
                    break;
                }
                Ok(Err(e)) => {
                    metrics.push_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(url = %url, error = %e, retry_in = ?backoff.peek(), "HTTP push failed");
                }
                Err(_) => return,
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff.next_delay()) => {}
            }
            if rx.capacity() == 0 {
                // The queue is full of newer values: this one is dropped.
                break;
            }
        }
    }
}
