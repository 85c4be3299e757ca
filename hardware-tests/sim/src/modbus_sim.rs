//! The project's own Modbus TCP simulator, on tokio-modbus's server, scriptable for faults:
//! exceptions on chosen addresses, a delay before each answer, connections dropped after N
//! requests, garbage frames, and registers that change over time. Used by the tests beside
//! pymodbus, by the quickstart, and as the `modbus-sim` binary.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_modbus::server::tcp::Server;
use tokio_modbus::{ExceptionCode, Request, Response};

/// Registers, coils and faults, shared by every connection.
#[derive(Debug, Default)]
pub struct State {
    pub holding: BTreeMap<u16, u16>,
    pub input: BTreeMap<u16, u16>,
    pub coils: BTreeMap<u16, bool>,
    pub discrete: BTreeMap<u16, bool>,
    /// Register or coil addresses that answer with IllegalDataAddress (whatever the table).
    pub exceptions: BTreeSet<u16>,
    /// Waited before each answer.
    pub delay: Duration,
    /// Close each connection after this many requests.
    pub drop_after: Option<u32>,
    /// The holding register written last, and when.
    pub last_write: Option<(u16, std::time::Instant)>,
    /// Every request is answered with this exception while set.
    pub refuse_all: Option<ExceptionCode>,
    /// This share (0 to 1) of requests is answered with the exception, evenly spread.
    pub refuse_share: Option<(f64, ExceptionCode)>,
    /// While set, requests get no answer (one arriving meanwhile is answered late, once it
    /// clears, or never if the connection is gone by then).
    pub silent: bool,
    /// Bumped to drop every open connection at its next request.
    pub epoch: u32,
}

/// A simulator: its state, and the switch for garbage answers.
#[derive(Clone, Debug, Default)]
pub struct Sim {
    pub state: Arc<Mutex<State>>,
    /// While set, every answer's bytes are replaced by garbage of the same length.
    pub garbage: Arc<AtomicBool>,
    /// Requests answered, all connections together.
    pub requests: Arc<AtomicU32>,
}

impl Sim {
    pub fn with(f: impl FnOnce(&mut State)) -> Self {
        let sim = Self::default();
        sim.edit(f);
        sim
    }

    pub fn edit<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s)
    }

    pub fn holding(&self, address: u16) -> Option<u16> {
        self.edit(|s| s.holding.get(&address).copied())
    }

    /// Serves Modbus TCP on `addr` (`127.0.0.1:0` for a free port) from a runtime with one
    /// worker thread of its own, until that runtime is dropped. Returns the port and the runtime.
    pub fn start(&self, addr: &str) -> io::Result<(u16, tokio::runtime::Runtime)> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind(addr))?;
        let port = listener.local_addr()?.port();
        rt.spawn(self.clone().serve(listener));
        Ok((port, rt))
    }

    /// Serves Modbus TCP on `listener` until the task is dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> io::Result<()> {
        let server = Server::new(listener);
        let on_connected = |stream: tokio::net::TcpStream, _addr: SocketAddr| {
            let sim = self.clone();
            async move {
                let _ = stream.set_nodelay(true);
                let kill = Arc::new(AtomicBool::new(false));
                let conn = Connection {
                    sim: sim.clone(),
                    served: Arc::new(AtomicU32::new(0)),
                    kill: kill.clone(),
                    epoch: sim.edit(|s| s.epoch),
                };
                let transport = Garbling {
                    inner: stream,
                    garbage: sim.garbage.clone(),
                    kill,
                };
                Ok(Some((conn, transport)))
            }
        };
        server
            .serve(&on_connected, |e| {
                tracing::debug!(error = %e, "simulator connection ended");
            })
            .await
    }

    /// The quickstart's oven (`examples/modbus-tcp.yaml`): temperature in 0.1 degree steps at
    /// holding register 0, set point at 1, heater coil 0. The temperature moves towards the set
    /// point while the heater is on and cools off while it is not, once per `tick`.
    pub fn oven() -> Self {
        Self::with(|s| {
            s.holding.insert(0, 215);
            s.holding.insert(1, 80);
            s.coils.insert(0, true);
        })
    }

    /// Runs the oven's physics forever.
    pub async fn animate_oven(self, tick: Duration) {
        let mut t = tokio::time::interval(tick);
        loop {
            t.tick().await;
            self.edit(|s| {
                let temp = i32::from(s.holding.get(&0).copied().unwrap_or(0) as i16);
                let target = i32::from(s.holding.get(&1).copied().unwrap_or(0) as i16) * 10;
                let heater = s.coils.get(&0).copied().unwrap_or(false);
                let next = if heater && temp < target {
                    temp + ((target - temp) / 8).max(1)
                } else {
                    temp - ((temp - 200) / 20).max(if temp > 200 { 1 } else { 0 })
                };
                s.holding.insert(0, next as i16 as u16);
            });
        }
    }
}

struct Connection {
    sim: Sim,
    served: Arc<AtomicU32>,
    /// Set when the connection must be dropped instead of answering.
    kill: Arc<AtomicBool>,
    /// The state's `epoch` when the connection opened.
    epoch: u32,
}

/// An answer to one request: a response (none: silence) or an exception.
pub type Answer = Result<Option<Response>, ExceptionCode>;

impl Sim {
    fn answer(&self, req: Request<'static>) -> Answer {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let refused =
            |s: &State, a: u16, n: u16| (a..a.saturating_add(n)).any(|x| s.exceptions.contains(&x));
        let words = |m: &BTreeMap<u16, u16>, a: u16, n: u16| -> Result<Vec<u16>, ExceptionCode> {
            (a..a.saturating_add(n))
                .map(|x| m.get(&x).copied().ok_or(ExceptionCode::IllegalDataAddress))
                .collect()
        };
        let bits = |m: &BTreeMap<u16, bool>, a: u16, n: u16| -> Result<Vec<bool>, ExceptionCode> {
            (a..a.saturating_add(n))
                .map(|x| m.get(&x).copied().ok_or(ExceptionCode::IllegalDataAddress))
                .collect()
        };
        let r = match req {
            Request::ReadHoldingRegisters(a, n) if !refused(&s, a, n) => {
                Response::ReadHoldingRegisters(words(&s.holding, a, n)?)
            }
            Request::ReadInputRegisters(a, n) if !refused(&s, a, n) => {
                Response::ReadInputRegisters(words(&s.input, a, n)?)
            }
            Request::ReadCoils(a, n) if !refused(&s, a, n) => {
                Response::ReadCoils(bits(&s.coils, a, n)?)
            }
            Request::ReadDiscreteInputs(a, n) if !refused(&s, a, n) => {
                Response::ReadDiscreteInputs(bits(&s.discrete, a, n)?)
            }
            Request::WriteSingleRegister(a, v) if !refused(&s, a, 1) => {
                if !s.holding.contains_key(&a) {
                    return Err(ExceptionCode::IllegalDataAddress);
                }
                s.holding.insert(a, v);
                s.last_write = Some((a, std::time::Instant::now()));
                Response::WriteSingleRegister(a, v)
            }
            Request::WriteMultipleRegisters(a, ws) if !refused(&s, a, ws.len() as u16) => {
                for (i, w) in ws.iter().enumerate() {
                    s.holding.insert(a + i as u16, *w);
                }
                s.last_write = Some((a, std::time::Instant::now()));
                Response::WriteMultipleRegisters(a, ws.len() as u16)
            }
            Request::WriteSingleCoil(a, v) if !refused(&s, a, 1) => {
                if !s.coils.contains_key(&a) {
                    return Err(ExceptionCode::IllegalDataAddress);
                }
                s.coils.insert(a, v);
                Response::WriteSingleCoil(a, v)
            }
            Request::ReadHoldingRegisters(..)
            | Request::ReadInputRegisters(..)
            | Request::ReadCoils(..)
            | Request::ReadDiscreteInputs(..)
            | Request::WriteSingleRegister(..)
            | Request::WriteMultipleRegisters(..)
            | Request::WriteSingleCoil(..) => return Err(ExceptionCode::IllegalDataAddress),
            _ => return Err(ExceptionCode::IllegalFunction),
        };
        Ok(Some(r))
    }
}

impl tokio_modbus::server::Service for Connection {
    type Request = Request<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let n = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        let (drop_after, epoch) = self.sim.edit(|s| (s.drop_after, s.epoch));
        if drop_after.is_some_and(|d| n > d) || epoch != self.epoch {
            // The answer's write fails, which closes the connection.
            self.kill.store(true, Ordering::Relaxed);
        }
        self.sim.respond(req)
    }
}

impl Sim {
    /// Answers `req` as this device does at the moment, over any transport: the exceptions,
    /// the silence and the delay of its state applied (the faults of one connection are the
    /// transport's).
    pub fn respond(&self, req: Request<'static>) -> Pin<Box<dyn Future<Output = Answer> + Send>> {
        let total = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let (delay, refuse, share) = self.edit(|s| (s.delay, s.refuse_all, s.refuse_share));
        let shared_out = share.and_then(|(share, code)| {
            // Evenly spread and the same on every run: request k is refused when the count of
            // refusals due, k x share, steps up.
            let due = |k: u32| (f64::from(k) * share).floor();
            (due(total) > due(total - 1)).then_some(code)
        });
        let answer = match refuse.or(shared_out) {
            Some(code) => Err(code),
            None => self.answer(req),
        };
        let sim = self.clone();
        Box::pin(async move {
            let started = std::time::Instant::now();
            while sim.edit(|s| s.silent) && started.elapsed() < Duration::from_secs(120) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            answer
        })
    }
}

/// A transport that replaces what is written by garbage while the switch is on, and fails
/// once its connection is to be dropped.
struct Garbling {
    inner: tokio::net::TcpStream,
    garbage: Arc<AtomicBool>,
    kill: Arc<AtomicBool>,
}

impl AsyncRead for Garbling {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Garbling {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.kill.load(Ordering::Relaxed) {
            return Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()));
        }
        if self.garbage.load(Ordering::Relaxed) {
            // Same length, nonsense content: a wrong transaction id, protocol id and length.
            let junk: Vec<u8> = buf
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ 0x5A ^ i as u8)
                .collect();
            return Pin::new(&mut self.inner).poll_write(cx, &junk);
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
