//! The Redis sink (feature `redis`): as KubeEdge's mapper, `ZADD {device name} {timestamp} {JSON}`, pipelined.

use super::*;

pub(super) struct Sink {
    client: redis::Client,
    connection: Option<redis::aio::MultiplexedConnection>,
    addr: String,
}

impl Sink {
    pub(super) fn new(addr: &str, db: i64) -> Result<Self, PushError> {
        let failed = |e: &dyn std::fmt::Display| PushError::target(format_args!("redis {addr}"), e);
        let password = std::env::var("PASSWORD").ok().filter(|p| !p.is_empty());
        let hostport = addr
            .strip_prefix("redis://")
            .or_else(|| addr.strip_prefix("tcp://"))
            .unwrap_or(addr);
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (
                h.to_string(),
                p.parse::<u16>().map_err(|_| failed(&"bad port"))?,
            ),
            None => (hostport.to_string(), 6379),
        };
        let mut info = redis::RedisConnectionInfo::default().set_db(db);
        if let Some(p) = password {
            info = info.set_password(p);
        }
        let info =
            redis::IntoConnectionInfo::into_connection_info(redis::ConnectionAddr::Tcp(host, port))
                .map_err(|e| failed(&e))?
                .set_redis_settings(info);
        let client = redis::Client::open(info).map_err(|e| failed(&e))?;
        Ok(Self {
            client,
            connection: None,
            addr: addr.to_string(),
        })
    }
}

impl super::Sink for Sink {
    async fn write(&mut self, batch: &[Message]) -> Result<(), PushError> {
        let addr = self.addr.clone();
        let failed = |e: &dyn std::fmt::Display| PushError::target(format_args!("redis {addr}"), e);
        if self.connection.is_none() {
            let c = self
                .client
                .get_multiplexed_async_connection()
                .await
                .map_err(|e| failed(&e))?;
            self.connection = Some(c);
        }
        let Some(c) = self.connection.as_mut() else {
            return Err(failed(&"not connected"));
        };
        let mut pipe = redis::pipe();
        for m in batch {
            // As KubeEdge's mapper: the device name is the key, the time the score.
            pipe.zadd(&m.device, m.json(), m.timestamp).ignore();
        }
        let r: redis::RedisResult<()> = pipe.query_async(c).await;
        r.map_err(|e| {
            self.connection = None;
            failed(&e)
        })
    }
}
