//! Discovery of Modbus devices: from a device on the wire (TCP, or an RTU
//! line at settings not known) to a draft of its `DeviceModel` and `Device`, for a user to
//! review, test with `devsim` and apply. It only reads (functions 1-4): which line settings
//! anything answers at, which unit ids answer, which addresses of each table answer (a block
//! refused with "illegal data address" is split until the answering ranges are found), and
//! what the values look like (a float32 in either word order, text, a signed 16-bit value),
//! each guess written beside its property with the value seen. What it cannot decide is said
//! in YAML comments.

pub use super::Draft;
use mapper_sdk::configdata::{FlowControl, Parity, SerialSettings};
use std::fmt::Write as _;
use std::time::Duration;
use tokio_modbus::client::{Context, Reader};
use tokio_modbus::prelude::SlaveContext;
use tokio_modbus::{ExceptionCode, Slave};

mod guess;

use guess::*;

/// Where the devices are.
#[derive(Clone, Debug)]
pub enum Target {
    /// `host:port` of the device (or of a gateway in front of several).
    Tcp(String),
    /// A serial line: each of `lines` tried in turn until something answers (all of them with
    /// `all`).
    Rtu {
        path: String,
        lines: Vec<Line>,
        all: bool,
    },
}

impl Target {
    fn address(&self) -> &str {
        match self {
            Self::Tcp(a) => a,
            Self::Rtu { path, .. } => path,
        }
    }
}

/// The settings of a serial line (8 data bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    pub baud: u32,
    pub parity: Parity,
    pub stop_bits: u8,
}

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = match self.parity {
            Parity::None => 'N',
            Parity::Even => 'E',
            Parity::Odd => 'O',
        };
        write!(f, "{} 8{p}{}", self.baud, self.stop_bits)
    }
}

impl Line {
    /// The settings tried when none are given, the usual ones first: every baud rate of `bauds`
    /// at no parity, then even, then odd (one stop bit; two stop bits without parity last).
    pub fn common(bauds: &[u32], parities: &[Parity], two_stop_bits: bool) -> Vec<Line> {
        let mut out = Vec::new();
        for &parity in parities {
            for &baud in bauds {
                out.push(Line {
                    baud,
                    parity,
                    stop_bits: 1,
                });
            }
        }
        if two_stop_bits {
            for &baud in bauds {
                out.push(Line {
                    baud,
                    parity: Parity::None,
                    stop_bits: 2,
                });
            }
        }
        out
    }

    fn serial(&self, path: &str) -> SerialSettings {
        SerialSettings {
            path: path.to_string(),
            baud_rate: self.baud,
            data_bits: 8,
            parity: self.parity,
            stop_bits: self.stop_bits,
            flow_control: FlowControl::None,
        }
    }

    fn parity_word(&self) -> &'static str {
        match self.parity {
            Parity::None => "none",
            Parity::Even => "even",
            Parity::Odd => "odd",
        }
    }
}

/// What to scan.
#[derive(Clone, Debug)]
pub struct Options {
    pub target: Target,
    /// Unit ids to try.
    pub units: Vec<u8>,
    /// The highest address tried in each table.
    pub last_address: u16,
    /// How long an answer may take before the unit counts as absent.
    pub timeout: Duration,
    /// The name of the drafted objects (`NAME` and `NAME-model`; several units: `NAME-uN`).
    pub name: String,
    /// At most this many properties per device; the rest is said in a comment.
    pub max_properties: usize,
    /// At most this many requests to read one unit's tables (after the ones that find it).
    pub max_requests: usize,
    /// Every address asked, however far from any value.
    pub exhaustive: bool,
}

/// A Modbus table, as a visitor names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    Holding,
    Input,
    Coil,
    Discrete,
}

impl Table {
    const ALL: [Table; 4] = [Table::Holding, Table::Input, Table::Coil, Table::Discrete];

    fn register(self) -> &'static str {
        match self {
            Self::Holding => "HoldingRegister",
            Self::Input => "InputRegister",
            Self::Coil => "CoilRegister",
            Self::Discrete => "DiscreteInputRegister",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Holding => "hr",
            Self::Input => "ir",
            Self::Coil => "coil",
            Self::Discrete => "di",
        }
    }

    fn is_bits(self) -> bool {
        matches!(self, Self::Coil | Self::Discrete)
    }

    /// The most items one request may ask for.
    fn block(self) -> u16 {
        if self.is_bits() { 2000 } else { 125 }
    }
}

/// What answered in one table: runs of consecutive addresses with their values (a bit is 0/1).
#[derive(Clone, Debug, Default)]
pub struct Found {
    pub runs: Vec<(u16, Vec<u16>)>,
    /// Why the table was left (not supported, an exception, no answer).
    pub note: Option<String>,
}

/// One unit that answered.
#[derive(Clone, Debug)]
pub struct Unit {
    pub id: u8,
    /// The line settings it answered at (RTU).
    pub line: Option<Line>,
    pub tables: Vec<(Table, Found)>,
}

/// What a scan found, and how many requests it sent.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    pub units: Vec<Unit>,
    pub requests: usize,
    /// Unit ids that did not answer (or answered that they are absent: exceptions 10, 11).
    pub silent: Vec<u8>,
    /// Unit ids that answered every first read with an exception that is no answer about the
    /// address (server device failure, busy...): a gateway's answer for a unit it does not
    /// have, or a device in trouble. Not drafted; said in a comment.
    pub odd: Vec<(u8, String)>,
    /// Line settings at which nothing answered (RTU), in the order tried.
    pub tried: Vec<Line>,
    /// Line settings at which bytes came back that were no Modbus answer: a device at other
    /// settings, or noise.
    pub garbled: Vec<Line>,
}

/// The outcome of one read.
enum Read {
    Items(Vec<u16>),
    Refused(ExceptionCode),
    Silent(String),
}

struct Scanner {
    ctx: Context,
    timeout: Duration,
    requests: usize,
    /// RTU: the line, opened again after a request that got no good answer (a late or broken
    /// answer must not be read as the next one's), and the silence kept between frames.
    serial: Option<SerialSettings>,
    slave: Slave,
    /// Bytes came back that were no Modbus answer.
    garbled: bool,
}

impl Scanner {
    fn open(serial: &SerialSettings, slave: Slave) -> Result<Context, String> {
        let port = serial
            .open()
            .map_err(|e| format!("cannot open {}: {e}", serial.path))?;
        Ok(tokio_modbus::client::rtu::attach_slave(port, slave))
    }

    fn set_slave(&mut self, slave: Slave) {
        self.slave = slave;
        self.ctx.set_slave(slave);
    }

    async fn read(&mut self, table: Table, address: u16, count: u16) -> Read {
        let read = self.read_once(table, address, count).await;
        if let Some(serial) = &self.serial {
            tokio::time::sleep(mapper_modbus::bus::silence(serial.baud_rate)).await;
            if let Read::Silent(why) = &read {
                if !why.starts_with("no answer") {
                    self.garbled = true;
                }
                if let Ok(ctx) = Self::open(serial, self.slave) {
                    self.ctx = ctx;
                }
            }
        }
        read
    }

    async fn read_once(&mut self, table: Table, address: u16, count: u16) -> Read {
        self.requests += 1;
        let bits = |r: Vec<bool>| r.into_iter().map(u16::from).collect::<Vec<_>>();
        let got = match table {
            Table::Holding => {
                tokio::time::timeout(
                    self.timeout,
                    self.ctx.read_holding_registers(address, count),
                )
                .await
            }
            Table::Input => {
                tokio::time::timeout(self.timeout, self.ctx.read_input_registers(address, count))
                    .await
            }
            Table::Coil => tokio::time::timeout(self.timeout, self.ctx.read_coils(address, count))
                .await
                .map(|r| r.map(|r| r.map(bits))),
            Table::Discrete => {
                tokio::time::timeout(self.timeout, self.ctx.read_discrete_inputs(address, count))
                    .await
                    .map(|r| r.map(|r| r.map(bits)))
            }
        };
        match got {
            Ok(Ok(Ok(mut items))) if items.len() >= usize::from(count) => {
                items.truncate(usize::from(count));
                Read::Items(items)
            }
            Ok(Ok(Ok(_))) => Read::Silent("an answer shorter than asked".into()),
            Ok(Ok(Err(code))) => Read::Refused(code),
            Ok(Err(e)) => Read::Silent(e.to_string()),
            Err(_) => Read::Silent(format!("no answer within {:?}", self.timeout)),
        }
    }

    /// The answering runs of `table` up to address `last`, within `budget` requests (spent
    /// here; the unit's whole scan shares it). Address by address while values are near: an
    /// address that answers is grown into its run by doubling reads (its end found by halving:
    /// a run of n costs about 2 log2 n requests, a missing address one). After [`GAP`]
    /// addresses in a row that are not there, one address in [`STRIDE`] is probed; a probe
    /// that answers sends the scan back over the addresses before it, one by one again. So a
    /// run of `STRIDE` or more is always found, and every value within `GAP` of another; an
    /// empty table of 1,000 addresses costs about 90 requests. `exhaustive`: every address.
    /// `note` says why the table was left, or where the budget ran out.
    async fn table(
        &mut self,
        table: Table,
        last: u16,
        budget: &mut usize,
        exhaustive: bool,
    ) -> Found {
        let mut found = Found::default();
        let mut items: Vec<(u16, Vec<u16>)> = Vec::new();
        let end = u32::from(last) + 1;
        let mut a: u32 = 0;
        // Addresses in a row that were not there, since the table's start or the last value.
        let mut missing: u32 = 0;
        while a < end {
            let room = (end - a).min(u32::from(table.block())) as u16;
            let near = exhaustive || missing < GAP;
            // Far from any value: probe the last address of the next stride.
            let at = if near {
                a
            } else {
                (a + STRIDE - 1).min(end - 1)
            };
            match self
                .run_at(
                    table,
                    at as u16,
                    (end - at).min(u32::from(room)) as u16,
                    budget,
                )
                .await
            {
                Ok(Some(v)) if near => {
                    // The address after the run is not there, unless the run filled what one
                    // request may ask (then the next read starts there).
                    let full = v.len() == usize::from(room);
                    missing = u32::from(!full);
                    a += v.len() as u32 + u32::from(!full);
                    items.push((at as u16, v));
                }
                // A probe answered: back over the addresses before it, one by one.
                Ok(Some(_)) => missing = 0,
                Ok(None) if near => {
                    missing += 1;
                    a += 1;
                }
                Ok(None) => {
                    missing += at + 1 - a;
                    a = at + 1;
                }
                Err(Stop::Function) => {
                    found.note =
                        Some("the device does not have this table (illegal function)".into());
                    break;
                }
                Err(Stop::Why(note)) => {
                    found.note = Some(note);
                    break;
                }
            }
        }
        // Consecutive answers make one run.
        items.sort_by_key(|(s, _)| *s);
        for (start, v) in items {
            match found.runs.last_mut() {
                Some((s, run)) if usize::from(*s) + run.len() == usize::from(start) => {
                    run.extend(v);
                }
                _ => found.runs.push((start, v)),
            }
        }
        found
    }
}

impl Scanner {
    /// One read, if the budget allows it.
    async fn spend(
        &mut self,
        budget: &mut usize,
        table: Table,
        address: u16,
        count: u16,
    ) -> Option<Read> {
        *budget = budget.checked_sub(1)?;
        Some(self.read(table, address, count).await)
    }

    /// The run that starts at `a` (at most `room` items), if `a` answers: grown by doubling
    /// reads, its end found by halving. `Err`: why the table is left (an answer other than
    /// "not there", or the budget spent).
    async fn run_at(
        &mut self,
        table: Table,
        a: u16,
        room: u16,
        budget: &mut usize,
    ) -> Result<Option<Vec<u16>>, Stop> {
        let mut ask = async |s: &mut Self, count: u16| -> Result<Option<Vec<u16>>, Stop> {
            match s.spend(budget, table, a, count).await {
                None => Err(Stop::Why(budget_note(a))),
                Some(Read::Items(v)) => Ok(Some(v)),
                Some(Read::Refused(ExceptionCode::IllegalDataAddress)) => Ok(None),
                Some(Read::Refused(ExceptionCode::IllegalFunction)) => Err(Stop::Function),
                Some(Read::Refused(code)) => Err(Stop::Why(format!(
                    "left at address {a}: exception {code:?}"
                ))),
                Some(Read::Silent(why)) => Err(Stop::Why(format!("left at address {a}: {why}"))),
            }
        };
        let Some(mut got) = ask(self, 1).await? else {
            return Ok(None);
        };
        // Doubling while the run goes on; then halving between what answered and what did not.
        let mut bad = None;
        while got.len() < usize::from(room) {
            let try_len = (got.len() * 2).min(usize::from(room)) as u16;
            match ask(self, try_len).await? {
                Some(v) => got = v,
                None => {
                    bad = Some(try_len);
                    break;
                }
            }
        }
        if let Some(mut hi) = bad {
            while usize::from(hi) > got.len() + 1 {
                let mid = ((got.len() + usize::from(hi)) / 2) as u16;
                match ask(self, mid).await? {
                    Some(v) => got = v,
                    None => hi = mid,
                }
            }
        }
        Ok(Some(got))
    }
}

/// Why a table's scan stops.
enum Stop {
    /// The device does not have the table.
    Function,
    Why(String),
}

/// Addresses in a row not there after which the scan probes one in [`STRIDE`].
const GAP: u32 = 32;
/// How far apart the probes are, far from any value.
const STRIDE: u32 = 16;

/// Where a scan stopped for want of requests.
fn budget_note(at: u16) -> String {
    format!("stopped at address {at}: --max-requests spent (the rest of the unit was not asked)")
}

/// Scans `o.target`: each unit id of `o.units`, each table up to `o.last_address`; on a
/// serial line, at each of its settings in turn until something answers. Never writes.
pub async fn scan(o: &Options) -> Result<Scan, String> {
    let mut out = Scan::default();
    match &o.target {
        Target::Tcp(address) => {
            let addr: std::net::SocketAddr = tokio::net::lookup_host(address)
                .await
                .map_err(|e| format!("{address}: {e}"))?
                .next()
                .ok_or_else(|| format!("{address}: no address"))?;
            let ctx = tokio::time::timeout(o.timeout * 4, tokio_modbus::client::tcp::connect(addr))
                .await
                .map_err(|_| format!("cannot connect to {addr}: no answer"))?
                .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
            let mut s = Scanner {
                ctx,
                timeout: o.timeout,
                requests: 0,
                serial: None,
                slave: Slave(1),
                garbled: false,
            };
            scan_units(&mut s, &o.units, None, o, &mut out).await;
            out.requests = s.requests;
        }
        Target::Rtu { path, lines, all } => {
            // The ids most slaves are set to first, at every setting: the setting is found in
            // a few requests per setting, then every other id is tried at that setting only.
            let likely = |id: &u8| *id <= 10 || *id == 247;
            let (first, rest): (Vec<u8>, Vec<u8>) = match all {
                true => (o.units.clone(), Vec::new()),
                false => o.units.iter().partition(|id| likely(id)),
            };
            let mut answered = None;
            for line in lines {
                if scan_line(o, path, *line, &first, &mut out).await? > 0 {
                    answered.get_or_insert(*line);
                    if !all {
                        break;
                    }
                } else {
                    out.tried.push(*line);
                }
            }
            match answered {
                Some(line) => {
                    scan_line(o, path, line, &rest, &mut out).await?;
                }
                None if !rest.is_empty() => {
                    out.tried.clear();
                    for line in lines {
                        if scan_line(o, path, *line, &rest, &mut out).await? > 0 {
                            break;
                        }
                        out.tried.push(*line);
                    }
                }
                None => {}
            }
            out.silent.sort_unstable();
            out.silent.dedup();
            out.silent
                .retain(|id| !out.units.iter().any(|u| u.id == *id));
        }
    }
    Ok(out)
}

/// Scans the unit ids `ids` not found yet on the serial line `path` at `line`, adding to `out`:
/// how many answered.
async fn scan_line(
    o: &Options,
    path: &str,
    line: Line,
    ids: &[u8],
    out: &mut Scan,
) -> Result<usize, String> {
    let serial = line.serial(path);
    let mut s = Scanner {
        ctx: Scanner::open(&serial, Slave(1))?,
        timeout: o.timeout,
        requests: 0,
        serial: Some(serial),
        slave: Slave(1),
        garbled: false,
    };
    let ids: Vec<u8> = ids
        .iter()
        .copied()
        .filter(|id| !out.units.iter().any(|u| u.id == *id))
        .collect();
    let before = out.units.len();
    scan_units(&mut s, &ids, Some(line), o, out).await;
    out.requests += s.requests;
    if s.garbled && !out.garbled.contains(&line) {
        out.garbled.push(line);
    }
    Ok(out.units.len() - before)
}

/// Scans the unit ids `ids` with `s`, adding to `out`.
async fn scan_units(s: &mut Scanner, ids: &[u8], line: Option<Line>, o: &Options, out: &mut Scan) {
    for &id in ids {
        s.set_slave(Slave(id));
        // Present when a table gives its values, or says that an address or a function is not
        // there: answers only a device that is there gives.
        let mut present = false;
        let mut other = None;
        for t in Table::ALL {
            match s.read(t, 0, 1).await {
                Read::Items(_)
                | Read::Refused(
                    ExceptionCode::IllegalFunction
                    | ExceptionCode::IllegalDataAddress
                    | ExceptionCode::IllegalDataValue,
                ) => present = true,
                Read::Refused(
                    ExceptionCode::GatewayPathUnavailable | ExceptionCode::GatewayTargetDevice,
                ) => {}
                Read::Refused(code) => other = Some(format!("exception {code:?}")),
                // A device that is there answers any read, if only with an exception: no
                // answer to one is no answer to the others.
                Read::Silent(_) => break,
            }
            if present {
                break;
            }
        }
        if !present {
            match other {
                Some(why) => out.odd.push((id, why)),
                None => out.silent.push(id),
            }
            continue;
        }
        let mut tables = Vec::new();
        let mut budget = o.max_requests;
        for t in Table::ALL {
            let f = s.table(t, o.last_address, &mut budget, o.exhaustive).await;
            tables.push((t, f));
        }
        out.units.push(Unit { id, line, tables });
    }
}

fn same_answers(a: &Unit, b: &Unit) -> bool {
    a.tables.len() == b.tables.len()
        && a.tables
            .iter()
            .zip(&b.tables)
            .all(|((ta, fa), (tb, fb))| ta == tb && fa.runs == fb.runs)
}

/// The protocol `configData` of unit `u` of `target`, as mapper-modbus reads it.
fn protocol(target: &Target, u: &Unit) -> String {
    match (target, u.line) {
        (Target::Rtu { path, .. }, Some(line)) => format!(
            "{{serialPort: {}, baudRate: {}, dataBits: 8, parity: {}, stopBits: {}, slaveID: {}}}",
            serde_json::Value::String(path.clone()),
            line.baud,
            line.parity_word(),
            line.stop_bits,
            u.id
        ),
        _ => {
            let address = target.address();
            let (host, port) = address
                .rsplit_once(':')
                .map_or((address, "502"), |(h, p)| (h, p));
            format!("{{ip: {host}, port: {port}, slaveID: {}}}", u.id)
        }
    }
}

/// The draft manifests of `scan` (YAML, several documents), with comments on every guess.
pub fn draft(scan: &Scan, o: &Options) -> Draft {
    let mut seen = Vec::new();
    let address = o.target.address();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Drafted by `discover` from {address} ({} requests, reads only: nothing was written).\n# Review every property: names, types and access modes are guesses, said beside each.",
        scan.requests
    );
    if !scan.tried.is_empty() {
        let tried: Vec<String> = scan.tried.iter().map(Line::to_string).collect();
        let _ = writeln!(out, "# Nothing answered at: {}", tried.join(", "));
    }
    if !scan.garbled.is_empty() {
        let g: Vec<String> = scan.garbled.iter().map(Line::to_string).collect();
        let _ = writeln!(
            out,
            "# Bytes that were no Modbus answer came back at: {} (a device at other settings, or noise)",
            g.join(", ")
        );
    }
    if !scan.silent.is_empty() {
        let _ = writeln!(out, "# Unit ids that did not answer: {:?}", scan.silent);
    }
    let mut reasons: Vec<&str> = scan.odd.iter().map(|(_, why)| why.as_str()).collect();
    reasons.sort_unstable();
    reasons.dedup();
    for why in reasons {
        let ids: Vec<u8> = scan
            .odd
            .iter()
            .filter(|(_, w)| w == why)
            .map(|(id, _)| *id)
            .collect();
        let _ = writeln!(
            out,
            "# Unit ids {ids:?} answered every first read with {why}, nothing about an address: not drafted (a gateway's answer for a unit it does not have, or a device in trouble)."
        );
    }
    // A device alone at a TCP address often answers every unit id: the same answers again are
    // the same device. On a serial line only the addressed slave answers: the same answers
    // are another device of the same kind.
    let tcp = matches!(o.target, Target::Tcp(_));
    let dup = |k: usize, u: &Unit| {
        scan.units[..k]
            .iter()
            .find(|e| tcp && same_answers(e, u))
            .map(|e| e.id)
    };
    let distinct = scan
        .units
        .iter()
        .enumerate()
        .filter(|(k, u)| dup(*k, u).is_none())
        .count();
    for (k, u) in scan.units.iter().enumerate() {
        if let Some(first) = dup(k, u) {
            let _ = writeln!(
                out,
                "---\n# Unit {} answers exactly as unit {first}: most likely one device that answers any unit id; not drafted again.",
                u.id
            );
            continue;
        }
        let name = if distinct == 1 {
            o.name.clone()
        } else {
            format!("{}-u{}", o.name, u.id)
        };
        let mut model_props = String::new();
        let mut device_props = String::new();
        let mut notes = Vec::new();
        let mut n = 0;
        let mut left = 0;
        for (t, found) in &u.tables {
            if let Some(note) = &found.note {
                notes.push(format!("{}: {note}", t.register()));
            }
            for (start, words) in &found.runs {
                let items: Vec<Guess> = if t.is_bits() {
                    words
                        .iter()
                        .enumerate()
                        .map(|(i, v)| Guess {
                            offset: start + i as u16,
                            count: 1,
                            data_type: "bool",
                            byte_order: None,
                            model_type: "BOOLEAN",
                            why: format!("read {}", *v != 0),
                            seen: (*v != 0).to_string(),
                        })
                        .collect()
                } else {
                    guesses(*start, words)
                };
                for g in items {
                    if n == o.max_properties {
                        left += 1;
                        continue;
                    }
                    n += 1;
                    let prop = format!("{}-{}", t.prefix(), g.offset);
                    seen.push((name.clone(), prop.clone(), g.model_type, g.seen.clone()));
                    let writable = matches!(t, Table::Holding | Table::Coil);
                    let _ = writeln!(
                        model_props,
                        // Discovery never writes: whether a holding register or a coil takes
                        // writes is not known, so every property is drafted ReadOnly.
                        "    - name: {prop}   # {}\n      type: {}\n      accessMode: ReadOnly{}",
                        g.why,
                        g.model_type,
                        if writable {
                            "   # ReadWrite if the device takes writes (not tried)"
                        } else {
                            ""
                        }
                    );
                    let mut visitor = format!(
                        "register: {}, offset: {}, dataType: {}",
                        t.register(),
                        g.offset,
                        g.data_type
                    );
                    if g.data_type == "string" {
                        let _ = write!(visitor, ", limit: {}", g.count);
                    }
                    if let Some(b) = g.byte_order {
                        let _ = write!(visitor, ", byteOrder: {b}");
                    }
                    let _ = writeln!(
                        device_props,
                        "    - name: {prop}\n      collectCycle: 1000\n      reportCycle: 1000\n      visitors: {{protocolName: modbus, configData: {{{visitor}}}}}"
                    );
                }
            }
        }
        if left > 0 {
            notes.push(format!(
                "{left} more answering items not drafted (--max-properties {})",
                o.max_properties
            ));
        }
        let at = match u.line {
            Some(line) => format!("{address}, {line}"),
            None => address.to_string(),
        };
        let _ = writeln!(out, "---\n# Unit {} at {at}.", u.id);
        for note in &notes {
            let _ = writeln!(out, "# {note}");
        }
        if n == 0 {
            let _ = writeln!(
                out,
                "# It answered, but no address up to {} did: nothing to draft.",
                o.last_address
            );
            continue;
        }
        let _ = write!(
            out,
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: {name}-model\n  namespace: default\nspec:\n  protocol: modbus\n  properties:\n{model_props}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  # nodeName: the edge node that reaches {address}\n  deviceModelRef:\n    name: {name}-model\n  protocol:\n    protocolName: modbus\n    configData: {}\n  properties:\n{device_props}",
            protocol(&o.target, u)
        );
    }
    Draft {
        manifests: out,
        seen,
    }
}
