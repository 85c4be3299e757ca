//! Serving simulated devices: each on its address with the Modbus TCP server of the `sim` crate,
//! and a tick that plays its scenario (values and faults) on the scenario's clock.

use crate::device::{SimDevice, SimPoint, Visit};
use crate::scenario::{DeviceScenario, Fault, FaultKind, Player, Scenario, Writes};
use mapper_modbus::Table;
use mapper_modbus::codec::{Codec, DataType};
use mapper_modbus::device::Point;
use sim::modbus_sim::{Mangle, Sim, State, Units, serve_units};
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
    /// A BLE device: the D-Bus bus of its BlueZ (the mapper's `DBUS_SYSTEM_BUS_ADDRESS`).
    pub bus: Option<String>,
    /// Keeps what serves it (a line's pty pair, BlueZ) while any of its devices is served.
    _keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

/// A serial line being set up: its pty pair, its devices by slave id, its baud rate.
struct LineSetup {
    /// The devices' `serialPort`.
    port: String,
    /// `a`: devsim's end; `b`: the mapper's.
    pty: Arc<sim::PtyPair>,
    slaves: HashMap<u8, Sim>,
    /// Devices with their own protocols (`mapper-serial`), in the order of the manifests.
    own: Vec<crate::serial::LineDevice>,
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
    #[error("{id}: a {kind:?} fault is Modbus's; {what}")]
    Fault {
        id: String,
        kind: FaultKind,
        what: &'static str,
    },
    #[error("serial line {port}: {message}")]
    Line { port: String, message: String },
    #[error(transparent)]
    Scenario(#[from] crate::scenario::ScenarioError),
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
fn unlimited(p: &Point) -> Codec {
    let mut c = p.codec.clone();
    c.minimum = None;
    c.maximum = None;
    c
}

/// Puts `value` into `p`'s registers or bit, or its part of a serial reply (`port`: its
/// line's settings).
pub fn hold(
    state: &mut State,
    p: &SimPoint,
    port: Option<&mapper_serial::device::Port>,
    value: &str,
) -> Result<(), String> {
    let mp = match (&p.point, port) {
        (Visit::Modbus(mp), _) => mp,
        (Visit::Serial(sp), Some(port)) => {
            let held = crate::serial::check(port, sp, value)?;
            state.text.insert(p.name.clone(), held);
            return Ok(());
        }
        (Visit::Serial(_), None) => return Err("a serial property off its line".into()),
        (Visit::Ble(bp), _) => {
            let held = crate::ble::check(bp, value)?;
            state.text.insert(p.name.clone(), held);
            return Ok(());
        }
        (Visit::OpcUa(op, t), _) => {
            let held = crate::opcua::check(op, *t, value)?;
            state.text.insert(p.name.clone(), held);
            return Ok(());
        }
    };
    let codec = unlimited(mp);
    let r = &mp.read;
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

/// The raw content of `p`'s registers or bit (a serial property's: its value's bytes).
fn raw(state: &State, p: &SimPoint) -> Vec<u16> {
    let r = match &p.point {
        Visit::Modbus(mp) => &mp.read,
        Visit::Serial(_) | Visit::OpcUa(..) | Visit::Ble(_) => {
            return state
                .text
                .get(&p.name)
                .map(|v| v.bytes().map(u16::from).collect())
                .unwrap_or_default();
        }
    };
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
    let mp = match &p.point {
        Visit::Modbus(mp) => mp,
        Visit::Serial(_) | Visit::OpcUa(..) | Visit::Ble(_) => {
            return state.text.get(&p.name).cloned();
        }
    };
    let codec = unlimited(mp);
    let w = raw(state, p);
    if mp.read.table.is_bits() {
        return Some(codec.decode_bit(w.first().copied().unwrap_or(0) != 0));
    }
    if let (DataType::Bool, Some(bit)) = (codec.data_type, codec.bit) {
        return Some(codec.decode_bit(w.first().copied().unwrap_or(0) & (1 << bit) != 0));
    }
    codec.decode_registers(&w).ok()
}

/// Where a device is served, and what serves it.
struct Place {
    address: SocketAddr,
    line: Option<std::path::PathBuf>,
    bus: Option<String>,
    keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Default for Place {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 0)),
            line: None,
            bus: None,
            keep: None,
        }
    }
}

impl Place {
    fn at(address: SocketAddr) -> Self {
        Self {
            address,
            ..Self::default()
        }
    }
}

/// Starts playing `d`'s scenario on `sim`: the device served at `place`.
fn launch(
    sim: Sim,
    d: SimDevice,
    plan: DeviceScenario,
    seed: u64,
    options: &Options,
    place: Place,
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
    Served {
        id: d.id.clone(),
        address: place.address,
        line: place.line,
        bus: place.bus,
        sim,
        device: d,
        live,
        _keep: place.keep,
    }
}

/// The faults a device that is not Modbus's can have, and how to say so; none for Modbus.
fn other_faults(d: &SimDevice) -> Option<(&'static [FaultKind], &'static str)> {
    use FaultKind::*;
    if d.ble.is_some() {
        Some((
            &[NoAnswer, Reboot, Disconnect],
            "a BLE device can go out of range (noAnswer), reboot or drop its connection",
        ))
    } else if d.opcua.is_some() {
        Some((
            &[NoAnswer, Reboot, Disconnect],
            "an OPC UA server can be silent (noAnswer), rebooted or disconnected",
        ))
    } else if d.serial.is_some() {
        Some((
            &[NoAnswer, Late, Garbage, Duplicate, Truncate, Reboot],
            "a device with its own protocol can be silent, late, garbled, duplicated, truncated or rebooted",
        ))
    } else {
        None
    }
}

/// Listens where the devices `group` at `address` are served.
async fn listen(
    options: &Options,
    address: &str,
    group: &[(SimDevice, Sim, DeviceScenario)],
) -> Result<(tokio::net::TcpListener, SocketAddr), RunError> {
    let address = listen_address(options, address);
    let bind_error = |source| RunError::Bind {
        id: group
            .first()
            .map(|(d, ..)| d.id.clone())
            .unwrap_or_default(),
        address: address.clone(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(&address)
        .await
        .map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Where a device of `address` (`host:port`) is served: on `--bind`'s host (and a free port
/// with `port0`), else on its own address.
fn listen_address(options: &Options, address: &str) -> String {
    match &options.bind {
        Some(host) => {
            let port = if options.port0 {
                0
            } else {
                address
                    .rsplit(':')
                    .next()
                    .unwrap_or("0")
                    .parse()
                    .unwrap_or(0)
            };
            format!("{host}:{port}")
        }
        None => address.to_string(),
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
    // By TCP address, in the order of the manifests: the devices there.
    type AtAddress = (String, Vec<(SimDevice, Sim, DeviceScenario)>);
    let mut tcp: Vec<AtAddress> = Vec::new();
    let mut opc: Vec<AtAddress> = Vec::new();
    let mut ble: Vec<(SimDevice, Sim, DeviceScenario)> = Vec::new();
    scenario.check_against(&devices)?;
    // Devices at one Modbus place are views of one unit: one register map.
    let mut units: HashMap<String, Sim> = HashMap::new();
    for d in devices {
        let sim = match d.modbus_place() {
            Some(place) => units.entry(place).or_default().clone(),
            None => Sim::default(),
        };
        sim.edit(|s| {
            for p in &d.points {
                hold(s, p, d.serial.as_ref(), &p.initial).map_err(|message| RunError::Value {
                    id: d.id.clone(),
                    property: p.name.clone(),
                    value: p.initial.clone(),
                    message,
                })?;
            }
            Ok::<(), RunError>(())
        })?;
        let plan = scenario.device(&d.id).cloned().unwrap_or_default();
        if let Some((ok, what)) = other_faults(&d)
            && let Some(f) = plan.faults.iter().find(|f| !ok.contains(&f.kind))
        {
            return Err(RunError::Fault {
                id: d.id.clone(),
                kind: f.kind,
                what,
            });
        }
        let on_line = match (&d.rtu, &d.serial) {
            (Some(rtu), _) => Some((rtu.port.clone(), rtu.baud_rate)),
            (None, Some(port)) => Some((port.serial.path.clone(), port.serial.baud_rate)),
            (None, None) => None,
        };
        if let Some((path, baud_rate)) = on_line {
            let at = match lines.iter().position(|l| l.port == path) {
                Some(at) => at,
                None => {
                    let pty =
                        pty_pair(&options.pty_dir, &path).map_err(|message| RunError::Line {
                            port: path.clone(),
                            message,
                        })?;
                    lines.push(LineSetup {
                        port: path.clone(),
                        pty: Arc::new(pty),
                        slaves: HashMap::new(),
                        own: Vec::new(),
                        baud_rate,
                    });
                    lines.len() - 1
                }
            };
            let line = &mut lines[at];
            match (&d.rtu, &d.serial) {
                (Some(rtu), _) => {
                    line.slaves.insert(rtu.slave, sim.clone());
                }
                (None, Some(port)) => {
                    line.own.push(crate::serial::LineDevice {
                        id: d.id.clone(),
                        port: port.clone(),
                        points: d
                            .points
                            .iter()
                            .filter_map(|p| match &p.point {
                                Visit::Serial(sp) => Some(sp.clone()),
                                _ => None,
                            })
                            .collect(),
                        sim: sim.clone(),
                    });
                }
                (None, None) => {}
            }
            if !line.slaves.is_empty() && !line.own.is_empty() {
                return Err(RunError::Line {
                    port: path,
                    message: format!(
                        "{} speaks its own protocol on a line with Modbus RTU devices",
                        d.id
                    ),
                });
            }
            let place = Place {
                line: Some(line.pty.b.clone()),
                keep: Some(line.pty.clone()),
                ..Place::default()
            };
            out.push(launch(sim, d, plan, scenario.seed, options, place));
            continue;
        }
        if d.ble.is_some() {
            ble.push((d, sim, plan));
            continue;
        }
        if d.opcua.is_some() {
            match opc.iter().position(|(a, _)| *a == d.address) {
                Some(at) => opc[at].1.push((d, sim, plan)),
                None => opc.push((d.address.clone(), vec![(d, sim, plan)])),
            }
            continue;
        }
        let at = match tcp.iter().position(|(a, _)| *a == d.address) {
            Some(at) => at,
            None => {
                tcp.push((d.address.clone(), Vec::new()));
                tcp.len() - 1
            }
        };
        tcp[at].1.push((d, sim, plan));
    }
    // Each TCP address once, with every device at it (by unit id when there are several).
    for (address, group) in tcp {
        let (listener, local) = listen(options, &address, &group).await?;
        // One unit (one device, or several views of it) answers every unit id.
        let ids: std::collections::BTreeMap<u8, Sim> = group
            .iter()
            .map(|(d, sim, _)| (d.unit, sim.clone()))
            .collect();
        let units = match ids.len() {
            1 => Units::Any(group[0].1.clone()),
            _ => Units::ById(ids),
        };
        tokio::spawn(serve_units(listener, units));
        out.extend(
            group.into_iter().map(|(d, sim, plan)| {
                launch(sim, d, plan, scenario.seed, options, Place::at(local))
            }),
        );
    }
    // Every BLE device behind one BlueZ.
    if !ble.is_empty() {
        let (bus, running) =
            crate::ble::start(ble.iter().map(|(d, s, _)| (d.clone(), s.clone())).collect())
                .map_err(|message| RunError::Line {
                    port: "BlueZ".into(),
                    message,
                })?;
        let keep: Arc<dyn std::any::Any + Send + Sync> = Arc::new(running);
        for (d, sim, plan) in ble {
            let place = Place {
                bus: Some(bus.clone()),
                keep: Some(keep.clone()),
                ..Place::default()
            };
            out.push(launch(sim, d, plan, scenario.seed, options, place));
        }
    }
    // Each OPC UA server once, with the nodes of every device on it.
    for (address, group) in opc {
        // Bound here so that a port taken is an error of the start; the server binds it
        // again after each stop.
        let (listener, local) = listen(options, &address, &group).await?;
        let pki = options.pty_dir.join(format!("opcua-pki-{}", local.port()));
        let server = crate::opcua::Server {
            devices: group
                .iter()
                .map(|(d, sim, _)| (d.clone(), sim.clone()))
                .collect(),
            pki,
        };
        tokio::spawn(crate::opcua::serve(listener, server));
        out.extend(
            group.into_iter().map(|(d, sim, plan)| {
                launch(sim, d, plan, scenario.seed, options, Place::at(local))
            }),
        );
    }
    for LineSetup {
        port,
        pty,
        slaves: sims,
        own,
        baud_rate: baud,
    } in lines
    {
        let own = Arc::new(own);
        let device = pty.a.clone();
        let open = move || {
            tokio_serial::SerialStream::open(&tokio_serial::new(device.to_string_lossy(), baud))
                .map_err(|e| format!("cannot open {}: {e}", device.display()))
        };
        // Opened once here, so that a line that cannot be opened is an error of the start.
        let mut first = Some(open().map_err(|message| RunError::Line {
            port: port.clone(),
            message,
        })?);
        tokio::spawn(async move {
            loop {
                let stream = match first.take().map_or_else(&open, Ok) {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(%port, error = %e, "cannot open the serial line again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                let served = if own.is_empty() {
                    crate::rtu::serve_line(stream, sims.clone()).await
                } else {
                    crate::serial::serve(stream, own.clone()).await
                };
                if let Err(e) = served {
                    tracing::debug!(%port, error = %e, "serial line failed; opened again");
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
    // Why each point's scenario value last did not fit, once said: a warning per tick would
    // flood the log (ten lines a second).
    let mut misfit: Vec<Option<String>> = vec![None; device.points.len()];
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
        let mangle = [
            (FaultKind::Garbage, Mangle::Garbage),
            (FaultKind::Duplicate, Mangle::Duplicate),
            (FaultKind::Truncate, Mangle::Truncate),
        ]
        .into_iter()
        .find(|(k, _)| faults().any(|f| f.kind == *k && active(f.at, f.seconds)))
        .map_or(Mangle::None, |(_, m)| m);
        sim.set_mangle(mangle);
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
                    let _ = hold(s, p, device.serial.as_ref(), &p.initial);
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
                if let Some(v) = player.value(t, dt, now, look) {
                    match hold(s, p, device.serial.as_ref(), &v) {
                        Ok(_) => misfit[i] = None,
                        Err(e) => {
                            let why = e.to_string();
                            if misfit[i].is_none() {
                                tracing::warn!(device = %device.id, property = %p.name, value = %v, error = %why, "a scenario value does not fit its register (said once until one fits again)");
                                misfit[i] = Some(why);
                            }
                        }
                    }
                }
                last[i] = raw(s, p);
            }
        });
        prev_t = t;
    }
}
