//! Serving simulated devices: each on its address with the Modbus TCP server of the `sim` crate,
//! and a tick that plays its scenario (values and faults) on the scenario's clock.

use crate::layout::{SimDevice, SimPoint};
use crate::scenario::{DeviceScenario, Fault, FaultKind, Player, Scenario, Writes};
use mapper_modbus::Table;
use mapper_modbus::codec::{Codec, DataType};
use sim::modbus_sim::{Sim, State};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_modbus::ExceptionCode;

/// How devices are served.
#[derive(Clone, Debug)]
pub struct Options {
    /// Scenario seconds per real second.
    pub speed: f64,
    /// Serve every device on this host instead of its `ip` (its port kept), e.g. `127.0.0.1`;
    /// with `port0`, on a free port of it.
    pub bind: Option<String>,
    pub port0: bool,
    /// How often values and faults are brought up to date.
    pub tick: Duration,
    /// Where serial lines (Modbus RTU) are made: each line a pty pair, `DIR/NAME` for the
    /// mapper (NAME: the last part of the device's `serialPort`) and `DIR/NAME.device`.
    pub pty_dir: std::path::PathBuf,
    /// Each device's scenario clock starts at its first request rather than at the start, so
    /// that a scenario plays the same however long the gateway takes to come up.
    pub clock_from_first_request: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            speed: 1.0,
            bind: None,
            port0: false,
            tick: Duration::from_millis(100),
            clock_from_first_request: false,
            pty_dir: std::path::PathBuf::from("devsim-pty"),
        }
    }
}

/// A device being served.
#[derive(Clone, Debug)]
pub struct Served {
    pub id: String,
    /// Where it is served: `host:port`, or (on a serial line) unspecified.
    pub address: SocketAddr,
    /// On a serial line: the pty the mapper opens instead of the device's `serialPort`.
    pub line: Option<std::path::PathBuf>,
    pub sim: Sim,
    pub device: SimDevice,
    /// Its clock and the faults injected into it.
    pub live: Live,
    /// Keeps the line's pty pair while any of its devices is served.
    _pty: Option<Arc<sim::PtyPair>>,
}

/// The devices of one serial line, answering by slave id (others are not answered, as on a
/// bus).
struct Line(HashMap<u8, Sim>);

impl tokio_modbus::server::Service for Line {
    type Request = tokio_modbus::SlaveRequest<'static>;
    type Response = Option<tokio_modbus::Response>;
    type Exception = ExceptionCode;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = sim::modbus_sim::Answer> + Send>>;

    fn call(&self, req: Self::Request) -> Self::Future {
        match self.0.get(&req.slave) {
            Some(sim) => sim.respond(req.request),
            None => Box::pin(async { Ok(None) }),
        }
    }
}

/// A serial line being set up: its pty pair, its devices by slave id, its baud rate.
struct LineSetup {
    /// The devices' `serialPort`.
    port: String,
    /// `a`: devsim's end; `b`: the mapper's.
    pty: Arc<sim::PtyPair>,
    slaves: HashMap<u8, Sim>,
    baud_rate: u32,
}

/// Makes the pty pair of a line: the mapper's end `dir/NAME` (NAME: the last part of the
/// device's `serialPort`) and devsim's `dir/NAME.device`.
fn pty_pair(dir: &std::path::Path, port: &str) -> Result<sim::PtyPair, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    let name: String = port
        .rsplit('/')
        .next()
        .unwrap_or("line")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    sim::PtyPair::link(dir.join(format!("{name}.device")), dir.join(&name))
}

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{id}: cannot listen on {address}: {source}")]
    Bind {
        id: String,
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("serial line {port}: {message}")]
    Line { port: String, message: String },
    #[error("{id}: property {property}: {value:?} cannot be held: {message}")]
    Value {
        id: String,
        property: String,
        value: String,
        message: String,
    },
}

/// The codec without the model's limits: a simulated device may well hold what the mapper
/// would refuse to write.
fn unlimited(p: &SimPoint) -> Codec {
    let mut c = p.point.codec.clone();
    c.minimum = None;
    c.maximum = None;
    c
}

/// Puts `value` into `p`'s registers or bit.
pub fn hold(state: &mut State, p: &SimPoint, value: &str) -> Result<(), String> {
    let codec = unlimited(p);
    let r = &p.point.read;
    match r.table {
        Table::Coil | Table::DiscreteInput => {
            let b = codec.encode_bit(value).map_err(|e| e.to_string())?;
            let m = if r.table == Table::Coil {
                &mut state.coils
            } else {
                &mut state.discrete
            };
            m.insert(r.address, b);
        }
        Table::InputRegister | Table::HoldingRegister => {
            let m = if r.table == Table::HoldingRegister {
                &mut state.holding
            } else {
                &mut state.input
            };
            if let (DataType::Bool, Some(bit)) = (codec.data_type, codec.bit) {
                let on = codec.encode_bit(value).map_err(|e| e.to_string())?;
                let w = m.entry(r.address).or_insert(0);
                *w = if on {
                    *w | (1 << bit)
                } else {
                    *w & !(1 << bit)
                };
            } else {
                let words = codec.encode_registers(value).map_err(|e| e.to_string())?;
                for (i, w) in words.into_iter().enumerate() {
                    m.insert(r.address.wrapping_add(i as u16), w);
                }
            }
        }
    }
    Ok(())
}

/// The raw content of `p`'s registers or bit.
fn raw(state: &State, p: &SimPoint) -> Vec<u16> {
    let r = &p.point.read;
    let bit = |m: &std::collections::BTreeMap<u16, bool>| {
        vec![u16::from(m.get(&r.address).copied().unwrap_or(false))]
    };
    let words = |m: &std::collections::BTreeMap<u16, u16>| {
        (0..r.count)
            .map(|i| m.get(&r.address.wrapping_add(i)).copied().unwrap_or(0))
            .collect()
    };
    match r.table {
        Table::Coil => bit(&state.coils),
        Table::DiscreteInput => bit(&state.discrete),
        Table::InputRegister => words(&state.input),
        Table::HoldingRegister => words(&state.holding),
    }
}

/// `p`'s value as the mapper would read it.
pub fn value_of(state: &State, p: &SimPoint) -> Option<String> {
    let codec = unlimited(p);
    let w = raw(state, p);
    if p.point.read.table.is_bits() {
        return Some(codec.decode_bit(w.first().copied().unwrap_or(0) != 0));
    }
    if let (DataType::Bool, Some(bit)) = (codec.data_type, codec.bit) {
        return Some(codec.decode_bit(w.first().copied().unwrap_or(0) & (1 << bit) != 0));
    }
    codec.decode_registers(&w).ok()
}

/// Starts playing `d`'s scenario on `sim`: the device served at `place` (its TCP address, or
/// its line's pty and pair).
fn launch(
    sim: Sim,
    d: SimDevice,
    plan: DeviceScenario,
    seed: u64,
    options: &Options,
    place: (SocketAddr, Option<(std::path::PathBuf, Arc<sim::PtyPair>)>),
) -> Served {
    let live = Live::default();
    tokio::spawn(play(
        sim.clone(),
        d.clone(),
        plan,
        seed,
        options.clone(),
        live.clone(),
    ));
    let (address, line) = place;
    let (line, pty) = line.unzip();
    Served {
        id: d.id.clone(),
        address,
        line,
        sim,
        device: d,
        live,
        _pty: pty,
    }
}

/// Serves `devices` and plays `scenario` until the runtime ends.
pub async fn start(
    devices: Vec<SimDevice>,
    scenario: &Scenario,
    options: &Options,
) -> Result<Vec<Served>, RunError> {
    let mut out = Vec::new();
    let mut lines: Vec<LineSetup> = Vec::new();
    for d in devices {
        let sim = Sim::default();
        sim.edit(|s| {
            for p in &d.points {
                hold(s, p, &p.initial).map_err(|message| RunError::Value {
                    id: d.id.clone(),
                    property: p.name.clone(),
                    value: p.initial.clone(),
                    message,
                })?;
            }
            Ok::<(), RunError>(())
        })?;
        let plan = scenario.device(&d.id).cloned().unwrap_or_default();
        if let Some(rtu) = &d.rtu {
            let at = match lines.iter().position(|l| l.port == rtu.port) {
                Some(at) => at,
                None => {
                    let pty = pty_pair(&options.pty_dir, &rtu.port).map_err(|message| {
                        RunError::Line {
                            port: rtu.port.clone(),
                            message,
                        }
                    })?;
                    lines.push(LineSetup {
                        port: rtu.port.clone(),
                        pty: Arc::new(pty),
                        slaves: HashMap::new(),
                        baud_rate: rtu.baud_rate,
                    });
                    lines.len() - 1
                }
            };
            lines[at].slaves.insert(rtu.slave, sim.clone());
            let place = (
                SocketAddr::from(([0, 0, 0, 0], 0)),
                Some((lines[at].pty.b.clone(), lines[at].pty.clone())),
            );
            out.push(launch(sim, d, plan, scenario.seed, options, place));
            continue;
        }
        let address = match &options.bind {
            Some(host) => {
                let port = if options.port0 {
                    0
                } else {
                    d.address
                        .rsplit(':')
                        .next()
                        .unwrap_or("0")
                        .parse()
                        .unwrap_or(0)
                };
                format!("{host}:{port}")
            }
            None => d.address.clone(),
        };
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .map_err(|source| RunError::Bind {
                id: d.id.clone(),
                address: address.clone(),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| RunError::Bind {
            id: d.id.clone(),
            address: address.clone(),
            source,
        })?;
        tokio::spawn(sim.clone().serve(listener));
        out.push(launch(sim, d, plan, scenario.seed, options, (local, None)));
    }
    for LineSetup {
        port,
        pty,
        slaves: sims,
        baud_rate: baud,
    } in lines
    {
        let device = pty.a.clone();
        // Opened once here, so that a line that cannot be opened is an error of the start.
        let mut server = Some(
            tokio_modbus::server::rtu::Server::new_from_path(&device, baud).map_err(|e| {
                RunError::Line {
                    port: port.clone(),
                    message: format!("cannot open {}: {e}", device.display()),
                }
            })?,
        );
        tokio::spawn(async move {
            loop {
                // A frame that does not decode (noise, a master's half-sent request) ends the
                // server: the line is opened again, as a device's UART recovers.
                let s = match server.take() {
                    Some(s) => s,
                    None => match tokio_modbus::server::rtu::Server::new_from_path(&device, baud) {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(%port, error = %e, "cannot open the serial line again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            continue;
                        }
                    },
                };
                if let Err(e) = s.serve_forever(Line(sims.clone())).await {
                    tracing::debug!(%port, error = %e, "serial line: a frame did not decode");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
    }
    Ok(out)
}

/// Plays one device's scenario, one tick at a time.
/// What a device's tick shares with the rest: the scenario time it is at, and faults injected
/// since the start.
#[derive(Clone, Debug, Default)]
pub struct Live {
    clock: Arc<std::sync::Mutex<f64>>,
    injected: Arc<std::sync::Mutex<Vec<Fault>>>,
}

impl Live {
    /// Starts `fault` now on the device's clock (its `at` is set), for its `seconds` (none: for
    /// good; `disconnect` and `reboot` happen once).
    pub fn inject(&self, mut fault: Fault) {
        let now = *self.clock.lock().unwrap_or_else(|e| e.into_inner());
        // On the next tick: `crossed` takes what lies after the previous one.
        fault.at = Some(now + 1e-6);
        fault.share = None;
        self.injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(fault);
    }
}

async fn play(
    sim: Sim,
    device: SimDevice,
    plan: DeviceScenario,
    seed: u64,
    options: Options,
    live: Live,
) {
    let Live { clock, injected } = live;
    let new_players = || -> Vec<Option<Player>> {
        device
            .points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                plan.properties
                    .get(&p.name)
                    .and_then(|ps| ps.value.clone())
                    .map(|b| Player::new(b, seed.wrapping_add(i as u64)))
            })
            .collect()
    };
    let mut players = new_players();
    let writes: Vec<Writes> = device
        .points
        .iter()
        .map(|p| {
            plan.properties
                .get(&p.name)
                .map(|ps| ps.writes)
                .unwrap_or_default()
        })
        .collect();
    let mut last: Vec<Vec<u16>> = sim.edit(|s| device.points.iter().map(|p| raw(s, p)).collect());
    let mut ticker = tokio::time::interval(options.tick);
    if options.clock_from_first_request {
        while sim.requests.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            ticker.tick().await;
        }
    }
    let started = Instant::now();
    let mut prev_t = -1.0f64;
    loop {
        ticker.tick().await;
        let t = started.elapsed().as_secs_f64() * options.speed;
        let dt = if prev_t < 0.0 { 0.0 } else { t - prev_t };
        let crossed = |at: f64| prev_t < at && at <= t;
        let active = |at: Option<f64>, secs: Option<f64>| {
            at.is_some_and(|a| a <= t && secs.is_none_or(|s| t < a + s))
        };
        *clock.lock().unwrap_or_else(|e| e.into_inner()) = t;
        // The scenario's faults and those injected since (a HIL step's; usually none, and then
        // nothing is copied).
        let extra: Vec<Fault> = injected.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let faults = || plan.faults.iter().chain(extra.iter());
        let rebooted = faults().any(|f| f.kind == FaultKind::Reboot && f.at.is_some_and(crossed));
        if rebooted {
            players = new_players();
        }
        let garbage = faults().any(|f| f.kind == FaultKind::Garbage && active(f.at, f.seconds));
        sim.garbage
            .store(garbage, std::sync::atomic::Ordering::Relaxed);
        sim.edit(|s| {
            s.refuse_all = faults()
                .find(|f| f.kind == FaultKind::Exception && active(f.at, f.seconds))
                .and_then(|f| f.code)
                .map(ExceptionCode::new);
            s.refuse_share = faults()
                .find(|f| f.kind == FaultKind::Exception && f.share.is_some())
                .and_then(|f| Some((f.share?, ExceptionCode::new(f.code?))));
            s.silent = faults().any(|f| {
                matches!(f.kind, FaultKind::NoAnswer | FaultKind::Reboot) && active(f.at, f.seconds)
            });
            s.delay = faults()
                .find(|f| f.kind == FaultKind::Late && active(f.at, f.seconds))
                .and_then(|f| f.delay_ms)
                .map(Duration::from_millis)
                .unwrap_or_default();
            if faults().any(|f| {
                matches!(f.kind, FaultKind::Disconnect | FaultKind::Reboot) && f.at.is_some_and(crossed)
            }) {
                s.epoch = s.epoch.wrapping_add(1);
            }
            for (i, p) in device.points.iter().enumerate() {
                if rebooted {
                    let _ = hold(s, p, &p.initial);
                    last[i] = raw(s, p);
                    continue;
                }
                // A write by the mapper: it holds (and ends the behaviour), or is undone.
                let now = raw(s, p);
                if now != last[i] && writes[i] == Writes::Keep {
                    players[i] = None;
                }
                last[i] = now;
            }
            let values: Vec<Option<String>> =
                device.points.iter().map(|p| value_of(s, p)).collect();
            let look = |name: &str| {
                device
                    .points
                    .iter()
                    .position(|p| p.name == name)
                    .and_then(|i| values[i].clone())
            };
            for (i, p) in device.points.iter().enumerate() {
                let Some(player) = players[i].as_mut() else {
                    continue;
                };
                let now = values[i].as_deref().and_then(|v| v.parse::<f64>().ok());
                if let Some(v) = player.value(t, dt, now, look)
                    && let Err(e) = hold(s, p, &v)
                {
                    tracing::warn!(device = %device.id, property = %p.name, value = %v, error = %e, "a scenario value does not fit its register");
                }
                last[i] = raw(s, p);
            }
        });
        prev_t = t;
    }
}
