//! The project's own Modbus TCP simulator, on tokio-modbus's server, scriptable for faults:
//! exceptions on chosen addresses, a delay before each answer, connections dropped after N
//! requests, garbage, duplicated or truncated frames, and registers that change over time. Used by the tests beside
//! pymodbus, by the quickstart, and as the `modbus-sim` binary.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, Ordering};
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
    /// Values of properties that are not in registers (devices with their own serial
    /// protocols), by property name.
    pub text: BTreeMap<String, String>,
    /// Every write request that reached the device, the last [`WIRE_KEPT`] of them.
    pub wire: std::collections::VecDeque<WireWrite>,
    /// Write requests no longer in `wire`.
    pub wire_dropped: u64,
}

/// How many write requests a simulator keeps.
pub const WIRE_KEPT: usize = 10_000;

/// A write request as it reached the device.
#[derive(Clone, Debug, PartialEq)]
pub struct WireWrite {
    pub at: std::time::Instant,
    /// The function code (5, 6, 15, 16, 22, 23).
    pub function: u8,
    pub address: u16,
    /// The words written (a coil: 1 or 0).
    pub values: Vec<u16>,
    /// The exception it was answered with, if it was refused.
    pub refused: Option<ExceptionCode>,
}

impl std::fmt::Display for WireWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "function {} at {} values {:?}",
            self.function, self.address, self.values
        )?;
        if let Some(code) = self.refused {
            write!(f, " (refused: {code:?})")?;
        }
        Ok(())
    }
}

/// The write `req` asks for: function code, address, values.
fn write_of(req: &Request<'_>) -> Option<(u8, u16, Vec<u16>)> {
    Some(match req {
        Request::WriteSingleCoil(a, v) => (5, *a, vec![u16::from(*v)]),
        Request::WriteSingleRegister(a, v) => (6, *a, vec![*v]),
        Request::WriteMultipleCoils(a, v) => (15, *a, v.iter().map(|b| u16::from(*b)).collect()),
        Request::WriteMultipleRegisters(a, v) => (16, *a, v.to_vec()),
        Request::MaskWriteRegister(a, and, or) => (22, *a, vec![*and, *or]),
        Request::ReadWriteMultipleRegisters(_, _, a, v) => (23, *a, v.to_vec()),
        _ => return None,
    })
}

/// What happens to each answer's bytes on their way out (a line's or a device's fault).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(u8)]
pub enum Mangle {
    #[default]
    None = 0,
    /// Nonsense of the same length.
    Garbage = 1,
    /// Sent twice.
    Duplicate = 2,
    /// Only its first half sent.
    Truncate = 3,
}

impl Mangle {
    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Garbage,
            2 => Self::Duplicate,
            3 => Self::Truncate,
            _ => Self::None,
        }
    }

    /// `frame` as this fault sends it.
    pub fn apply(self, frame: &[u8]) -> Vec<u8> {
        match self {
            Self::None => frame.to_vec(),
            // A wrong transaction id, protocol id and length (TCP); a wrong CRC (RTU).
            Self::Garbage => frame
                .iter()
                .enumerate()
                .map(|(i, b)| b ^ 0x5A ^ i as u8)
                .collect(),
            Self::Duplicate => [frame, frame].concat(),
            Self::Truncate => frame[..frame.len() / 2].to_vec(),
        }
    }
}

/// A simulator: its state, and the switch for mangled answers.
#[derive(Clone, Debug, Default)]
pub struct Sim {
    pub state: Arc<Mutex<State>>,
    /// What happens to every answer's bytes ([`Mangle`]).
    mangle: Arc<AtomicU8>,
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

    /// From now on, every answer is sent as `m` says.
    pub fn set_mangle(&self, m: Mangle) {
        self.mangle.store(m as u8, Ordering::Relaxed);
    }

    pub fn mangle(&self) -> Mangle {
        Mangle::from_u8(self.mangle.load(Ordering::Relaxed))
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

    /// Serves Modbus TCP on `listener` until the task is dropped, answering every unit id.
    pub async fn serve(self, listener: tokio::net::TcpListener) -> io::Result<()> {
        serve_units(listener, Units::Any(self)).await
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
    units: Arc<Units>,
    served: Arc<AtomicU32>,
    /// Set when the connection must be dropped instead of answering.
    kill: Arc<AtomicBool>,
    /// Each unit's `epoch` when it was first asked on this connection.
    epochs: Mutex<BTreeMap<u8, u32>>,
    /// How the answer being sent is mangled (the answering unit's [`Mangle`]).
    mangle: Arc<AtomicU8>,
}

/// The devices behind one Modbus TCP address.
#[derive(Debug)]
pub enum Units {
    /// One device answering every unit id.
    Any(Sim),
    /// A gateway: each device by its unit id; another id is answered with exception 11
    /// (gateway target device failed to respond).
    ById(BTreeMap<u8, Sim>),
}

/// Serves the devices `units` on `listener` until the task is dropped.
pub async fn serve_units(listener: tokio::net::TcpListener, units: Units) -> io::Result<()> {
    let server = Server::new(listener);
    let units = Arc::new(units);
    let on_connected = |stream: tokio::net::TcpStream, _addr: SocketAddr| {
        let units = units.clone();
        async move {
            let _ = stream.set_nodelay(true);
            let kill = Arc::new(AtomicBool::new(false));
            let mangle = Arc::new(AtomicU8::new(0));
            let conn = Connection {
                units,
                served: Arc::new(AtomicU32::new(0)),
                kill: kill.clone(),
                epochs: Mutex::default(),
                mangle: mangle.clone(),
            };
            let transport = Garbling {
                inner: stream,
                mangle,
                kill,
                pending: Vec::new(),
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
    type Request = tokio_modbus::SlaveRequest<'static>;
    type Response = Option<Response>;
    type Exception = ExceptionCode;
    type Future = Pin<Box<dyn Future<Output = Answer> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        let sim = match &*self.units {
            Units::Any(sim) => sim,
            Units::ById(m) => match m.get(&req.slave) {
                Some(sim) => sim,
                None => {
                    self.mangle.store(0, Ordering::Relaxed);
                    return Box::pin(async { Err(ExceptionCode::GatewayTargetDevice) });
                }
            },
        };
        let n = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        let (drop_after, epoch) = sim.edit(|s| (s.drop_after, s.epoch));
        let first = *self
            .epochs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(req.slave)
            .or_insert(epoch);
        if drop_after.is_some_and(|d| n > d) || epoch != first {
            // The answer's write fails, which closes the connection.
            self.kill.store(true, Ordering::Relaxed);
        }
        self.mangle.store(sim.mangle() as u8, Ordering::Relaxed);
        sim.respond(req.request)
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
        let write = write_of(&req);
        let answer = match refuse.or(shared_out) {
            Some(code) => Err(code),
            None => self.answer(req),
        };
        if let Some((function, address, values)) = write {
            let refused = answer.as_ref().err().copied();
            self.edit(|s| {
                if s.wire.len() == WIRE_KEPT {
                    s.wire.pop_front();
                    s.wire_dropped += 1;
                }
                s.wire.push_back(WireWrite {
                    at: std::time::Instant::now(),
                    function,
                    address,
                    values,
                    refused,
                });
            });
        }
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

/// A transport that sends what is written as the simulator's [`Mangle`] says, and fails once
/// its connection is to be dropped.
struct Garbling {
    inner: tokio::net::TcpStream,
    mangle: Arc<AtomicU8>,
    kill: Arc<AtomicBool>,
    /// The mangled bytes of the write under way, not yet all sent.
    pending: Vec<u8>,
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
        let mangle = Mangle::from_u8(self.mangle.load(Ordering::Relaxed));
        if mangle == Mangle::None && self.pending.is_empty() {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        // The whole of `buf` counts as written once its mangled form is (a retry after
        // `Pending` carries the same `buf`).
        if self.pending.is_empty() {
            self.pending = mangle.apply(buf);
        }
        let this = &mut *self;
        while !this.pending.is_empty() {
            match Pin::new(&mut this.inner).poll_write(cx, &this.pending) {
                Poll::Ready(Ok(n)) => {
                    this.pending.drain(..n);
                }
                Poll::Ready(Err(e)) => {
                    this.pending.clear();
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
