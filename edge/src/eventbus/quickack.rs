//! edgecore's connection to an external broker acknowledges every TCP segment it reads at once.
//!
//! A broker as it comes (Mosquitto leaves Nagle's algorithm on) holds each small write until
//! its last one is acknowledged, and Linux delays the acknowledgement of a segment that nothing
//! answers (up to 40 ms): the broker's acknowledgement of edgecore's answer is such a segment,
//! so the next request waited behind it and every request/answer exchange took 44 ms (even for
//! a bare echo responder). TCP_QUICKACK, set after each read, sends that acknowledgement at once.
//!
//! rumqttc owns its socket and gives no way to set an option after a read, so its client
//! connects to this relay instead (an abstract Unix socket that only this process may use),
//! which holds the TCP connection to the broker and copies both ways.

use socket2::SockRef;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;

/// How long a connection to the broker may take (rumqttc's own default).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long data sent to the broker may stay unacknowledged before the connection is given up
/// (twice the client's keep-alive of 30 s).
const UNACKNOWLEDGED: Duration = Duration::from_secs(60);

/// The relay's address for rumqttc, and why its last connection to the broker failed.
pub(super) struct Relay {
    /// An abstract socket name (leading NUL), as `tokio::net::UnixStream::connect` takes it.
    pub address: String,
    /// The error of the last failed connection to the broker, taken by the client's loop to
    /// say why its connection ended.
    pub last_error: Arc<Mutex<Option<String>>>,
}

impl Relay {
    /// Why the last connection to the broker failed, if it did since the last call.
    pub(super) fn take_error(&self) -> Option<String> {
        self.last_error.lock().ok()?.take()
    }
}

/// Starts the relay to `host:port` until `cancel`.
pub(super) fn start(host: String, port: u16, cancel: CancellationToken) -> std::io::Result<Relay> {
    let mut nonce = [0u8; 8];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce)
        .map_err(|_| std::io::Error::other("no randomness for the relay's name"))?;
    let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
    let address = format!("\0edgecore-mqtt-{}-{nonce}", std::process::id());
    let listener = UnixListener::bind(&address)?;
    let last_error = Arc::new(Mutex::new(None));
    let errors = last_error.clone();
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = cancel.cancelled() => return,
                a = listener.accept() => a,
            };
            let client = match accepted {
                Ok((c, _)) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "MQTT relay cannot accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // An abstract socket is reachable from the whole network namespace: only this
            // process's own client may use it.
            let own = client
                .peer_cred()
                .ok()
                .and_then(|c| c.pid())
                .is_some_and(|pid| u32::try_from(pid).ok() == Some(std::process::id()));
            if !own {
                tracing::warn!("MQTT relay refused a connection from another process");
                continue;
            }
            let (host, errors, cancel) = (host.clone(), errors.clone(), cancel.clone());
            tokio::spawn(async move {
                let broker = match connect(&host, port).await {
                    Ok(b) => b,
                    Err(e) => {
                        let e = format!("cannot connect to the MQTT broker {host}:{port}: {e}");
                        if let Ok(mut last) = errors.lock() {
                            *last = Some(e);
                        }
                        return;
                    }
                };
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = relay(client, broker) => {}
                }
            });
        }
    });
    Ok(Relay {
        address,
        last_error,
    })
}

async fn connect(host: &str, port: u16) -> std::io::Result<TcpStream> {
    let attempt = async {
        let mut last = None;
        for addr in tokio::net::lookup_host((host, port)).await? {
            match TcpStream::connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("the name resolves to no address")))
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))??;
    stream.set_nodelay(true)?;
    // A broker gone silent without closing: data it does not acknowledge within this time
    // ends the connection, so a relay blocked writing to it does not outlive its client.
    SockRef::from(&stream).set_tcp_user_timeout(Some(UNACKNOWLEDGED))?;
    Ok(stream)
}

/// Copies both ways until either side ends; every read from the broker is acknowledged at once.
async fn relay(client: UnixStream, broker: TcpStream) {
    let (mut from_broker, mut to_broker) = broker.into_split();
    let (mut from_client, mut to_client) = client.into_split();
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from_broker.read(&mut buf).await?;
            if n == 0 {
                return Ok::<(), std::io::Error>(());
            }
            let _ = SockRef::from(from_broker.as_ref()).set_tcp_quickack(true);
            to_client.write_all(&buf[..n]).await?;
        }
    };
    let up = async {
        tokio::io::copy(&mut from_client, &mut to_broker).await?;
        to_broker.shutdown().await
    };
    tokio::select! {
        r = down => if let Err(e) = r { tracing::debug!(error = %e, "MQTT relay: broker side ended") },
        r = up => if let Err(e) = r { tracing::debug!(error = %e, "MQTT relay: client side ended") },
    }
}
