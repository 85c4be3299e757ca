//! `devsim discover` (and `kectl discover`): from a Modbus TCP device on the wire to a draft of
//! its `DeviceModel` and `Device`, for a user to review, test with `devsim` and apply. It only
//! reads (functions 1-4): which unit ids answer, which addresses of each table answer (a block
//! refused with "illegal data address" is split until the answering ranges are found), and
//! what the values look like (a float32 in either word order, text, a signed 16-bit value),
//! each guess written beside its property with the value seen. What it cannot decide is said
//! in YAML comments.

use std::fmt::Write as _;
use std::time::Duration;
use tokio_modbus::client::{Context, Reader};
use tokio_modbus::prelude::SlaveContext;
use tokio_modbus::{ExceptionCode, Slave};

/// What to scan.
#[derive(Clone, Debug)]
pub struct Options {
    /// `host:port` of the device (or of a gateway in front of several).
    pub address: String,
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
    pub tables: Vec<(Table, Found)>,
}

/// What a scan found, and how many requests it sent.
#[derive(Clone, Debug)]
pub struct Scan {
    pub units: Vec<Unit>,
    pub requests: usize,
    /// Unit ids that did not answer (or answered that they are absent: exceptions 10, 11).
    pub silent: Vec<u8>,
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
}

impl Scanner {
    async fn read(&mut self, table: Table, address: u16, count: u16) -> Read {
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

    /// The answering runs of `table` from `start` for `count` items: a refused block is split
    /// in halves down to single addresses. `Err`: the table is left, saying why.
    async fn table(&mut self, table: Table, last: u16) -> Found {
        let mut found = Found::default();
        let mut todo: Vec<(u16, u16)> = Vec::new();
        let mut a: u32 = 0;
        while a <= u32::from(last) {
            let n = (u32::from(last) + 1 - a).min(u32::from(table.block())) as u16;
            todo.push((a as u16, n));
            a += u32::from(n);
        }
        todo.reverse();
        let mut items: Vec<(u16, Vec<u16>)> = Vec::new();
        while let Some((start, count)) = todo.pop() {
            match self.read(table, start, count).await {
                Read::Items(v) => items.push((start, v)),
                Read::Refused(ExceptionCode::IllegalDataAddress) if count > 1 => {
                    let half = count / 2;
                    todo.push((start + half, count - half));
                    todo.push((start, half));
                }
                Read::Refused(ExceptionCode::IllegalDataAddress) => {}
                Read::Refused(ExceptionCode::IllegalFunction) => {
                    found.note =
                        Some("the device does not have this table (illegal function)".into());
                    break;
                }
                Read::Refused(code) => {
                    found.note = Some(format!("left at address {start}: exception {code:?}"));
                    break;
                }
                Read::Silent(why) => {
                    found.note = Some(format!("left at address {start}: {why}"));
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

/// Scans the device at `o.address`: each unit id of `o.units`, each table up to
/// `o.last_address`. Never writes.
pub async fn scan(o: &Options) -> Result<Scan, String> {
    let addr: std::net::SocketAddr = tokio::net::lookup_host(&o.address)
        .await
        .map_err(|e| format!("{}: {e}", o.address))?
        .next()
        .ok_or_else(|| format!("{}: no address", o.address))?;
    let ctx = tokio::time::timeout(o.timeout * 4, tokio_modbus::client::tcp::connect(addr))
        .await
        .map_err(|_| format!("cannot connect to {addr}: no answer"))?
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let mut s = Scanner {
        ctx,
        timeout: o.timeout,
        requests: 0,
    };
    let mut units = Vec::new();
    let mut silent = Vec::new();
    for &id in &o.units {
        s.ctx.set_slave(Slave(id));
        // Present when any table gives an answer other than "absent".
        let mut present = false;
        for t in Table::ALL {
            match s.read(t, 0, 1).await {
                Read::Items(_) => present = true,
                Read::Refused(
                    ExceptionCode::GatewayPathUnavailable | ExceptionCode::GatewayTargetDevice,
                ) => {}
                Read::Refused(_) => present = true,
                Read::Silent(_) => {}
            }
            if present {
                break;
            }
        }
        if !present {
            silent.push(id);
            continue;
        }
        let mut tables = Vec::new();
        for t in Table::ALL {
            let f = s.table(t, o.last_address).await;
            tables.push((t, f));
        }
        units.push(Unit { id, tables });
    }
    Ok(Scan {
        units,
        requests: s.requests,
        silent,
    })
}

/// A guess of what some registers hold: its visitor's keys, the model's type, and why.
struct Guess {
    offset: u16,
    count: u16,
    data_type: &'static str,
    byte_order: Option<&'static str>,
    model_type: &'static str,
    why: String,
    /// The value as the mapper reports it.
    seen: String,
}

fn float(hi: u16, lo: u16) -> Option<f32> {
    let f = f32::from_bits((u32::from(hi) << 16) | u32::from(lo));
    (f.is_normal() && (1e-3..=1e7).contains(&f.abs())).then_some(f)
}

fn printable(b: u8) -> bool {
    (0x20..0x7f).contains(&b)
}

/// Registers that read as text from `i`: each register two characters (a NUL ends it); at
/// least two registers. Their number.
fn text_at(words: &[u16], i: usize) -> Option<usize> {
    let mut n = 0;
    for w in &words[i..] {
        let [a, b] = w.to_be_bytes();
        if !printable(a) {
            break;
        }
        n += 1;
        if b == 0 {
            break;
        }
        if !printable(b) {
            n -= 1;
            break;
        }
    }
    (n >= 2).then_some(n)
}

/// Whether a float reads as a value someone set or measured to a few digits (123.456, 21.5),
/// rather than registers that only happen to make a float (123.00496).
fn round(f: f32) -> bool {
    let digits = f
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .skip_while(|c| *c == '0')
        .count();
    digits <= 6
}

/// How registers from `start` read best: each register an integer, or a float32 in either
/// word order, or text, chosen over the whole run (a round float and text weigh more than the
/// integers they would be, a float that is not round a little more).
fn guesses(start: u16, words: &[u16]) -> Vec<Guess> {
    let n = words.len();
    // best[i]: the best score of words[i..], and the guess at i that gives it.
    let mut best: Vec<(f64, usize, u8)> = vec![(0.0, 0, 0); n + 1];
    for i in (0..n).rev() {
        // Kinds: 0 integer, 1 float ABCD, 2 float CDAB, 3 text.
        let mut options: Vec<(f64, usize, u8)> = vec![(1.0, 1, 0)];
        if let Some(&next) = words.get(i + 1) {
            if let Some(f) = float(words[i], next) {
                options.push((if round(f) { 3.5 } else { 2.1 }, 2, 1));
            }
            if let Some(f) = float(next, words[i]) {
                options.push((if round(f) { 3.45 } else { 2.05 }, 2, 2));
            }
        }
        if let Some(k) = text_at(words, i) {
            options.push((1.5 * k as f64, k, 3));
        }
        best[i] = options
            .into_iter()
            .map(|(score, len, kind)| (score + best[i + len].0, len, kind))
            .fold((f64::MIN, 1, 0), |a, b| if b.0 > a.0 { b } else { a });
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let (_, len, kind) = best[i];
        let at = start + i as u16;
        let w = words[i];
        out.push(match kind {
            1 | 2 => {
                let (hi, lo) = if kind == 1 {
                    (w, words[i + 1])
                } else {
                    (words[i + 1], w)
                };
                let f = float(hi, lo).unwrap_or_default();
                Guess {
                    offset: at,
                    count: 2,
                    data_type: "float32",
                    byte_order: (kind == 2).then_some("CDAB"),
                    model_type: "FLOAT",
                    seen: f.to_string(),
                    why: if kind == 1 {
                        format!("two registers that read as a float32 (ABCD): {f}")
                    } else {
                        format!("two registers that read as a float32, low word first (CDAB): {f}")
                    },
                }
            }
            3 => {
                let text: String = words[i..i + len]
                    .iter()
                    .flat_map(|w| w.to_be_bytes())
                    .take_while(|b| *b != 0)
                    .map(char::from)
                    .collect();
                Guess {
                    offset: at,
                    count: len as u16,
                    data_type: "string",
                    byte_order: None,
                    model_type: "STRING",
                    why: format!("{len} registers that read as text: {text:?}"),
                    seen: text,
                }
            }
            _ if w >= 0xFF00 => Guess {
                offset: at,
                count: 1,
                data_type: "int16",
                byte_order: None,
                model_type: "INT",
                why: format!(
                    "{w} as unsigned: a small negative number? read {}",
                    w as i16
                ),
                seen: (w as i16).to_string(),
            },
            _ => Guess {
                offset: at,
                count: 1,
                data_type: "uint16",
                byte_order: None,
                model_type: "INT",
                why: format!("read {w}"),
                seen: w.to_string(),
            },
        });
        i += len;
    }
    out
}

fn same_answers(a: &Unit, b: &Unit) -> bool {
    a.tables.len() == b.tables.len()
        && a.tables
            .iter()
            .zip(&b.tables)
            .all(|((ta, fa), (tb, fb))| ta == tb && fa.runs == fb.runs)
}

/// A draft: its manifests, and each drafted property's value as read.
pub struct Draft {
    /// YAML, several documents, with comments on every guess.
    pub manifests: String,
    /// `(device, property, model type, value read)`.
    pub seen: Vec<(String, String, &'static str, String)>,
}

impl Draft {
    /// A starting HIL file (`docs/hil.md`) for the draft at `manifests` (as the HIL file names
    /// it): the simulated devices hold the values read, and a step per property expects the
    /// twin to report that value.
    pub fn hil(&self, manifests: &str) -> String {
        let q = |v: &str| serde_json::Value::String(v.to_string()).to_string();
        let mut devices: Vec<&str> = self.seen.iter().map(|s| s.0.as_str()).collect();
        devices.dedup();
        let mut out = format!(
            "# Drafted by discover: the values it read, held by the simulated devices and\n# expected in the twin. Edit the behaviours and steps into the test you want.\nmanifests: [{}]\ndevices:\n",
            q(manifests)
        );
        for d in &devices {
            let _ = writeln!(out, "  {d}:\n    properties:");
            for (_, prop, _, value) in self.seen.iter().filter(|s| s.0 == *d) {
                let _ = writeln!(out, "      {prop}: {{value: {{constant: {}}}}}", q(value));
            }
        }
        out.push_str("steps:\n");
        for (d, prop, ty, value) in &self.seen {
            let tolerance = if *ty == "FLOAT" {
                ", tolerance: 0.001"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  - expect: {{device: {d}, property: {prop}, reported: {}{tolerance}, within: 60}}",
                q(value)
            );
        }
        out
    }
}

/// The draft manifests of `scan` (YAML, several documents), with comments on every guess.
pub fn draft(scan: &Scan, o: &Options) -> Draft {
    let mut seen = Vec::new();
    let (host, port) = o
        .address
        .rsplit_once(':')
        .map_or((o.address.as_str(), "502"), |(h, p)| (h, p));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Drafted by `discover` from {} ({} requests, reads only: nothing was written).\n# Review every property: names, types and access modes are guesses, said beside each.",
        o.address, scan.requests
    );
    if !scan.silent.is_empty() {
        let _ = writeln!(out, "# Unit ids that did not answer: {:?}", scan.silent);
    }
    let distinct = scan
        .units
        .iter()
        .enumerate()
        .filter(|(k, u)| !scan.units[..*k].iter().any(|e| same_answers(e, u)))
        .count();
    for (k, u) in scan.units.iter().enumerate() {
        // A device alone at an address often answers every unit id: the same answers again are
        // the same device.
        if let Some(first) = scan.units[..k].iter().find(|e| same_answers(e, u)) {
            let _ = writeln!(
                out,
                "---\n# Unit {} answers exactly as unit {}: most likely one device that answers any unit id; not drafted again.",
                u.id, first.id
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
        let _ = writeln!(out, "---\n# Unit {} at {}.", u.id, o.address);
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
            "apiVersion: devices.kubeedge.io/v1beta1\nkind: DeviceModel\nmetadata:\n  name: {name}-model\n  namespace: default\nspec:\n  protocol: modbus\n  properties:\n{model_props}---\napiVersion: devices.kubeedge.io/v1beta1\nkind: Device\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  # nodeName: the edge node that reaches {host}\n  deviceModelRef:\n    name: {name}-model\n  protocol:\n    protocolName: modbus\n    configData: {{ip: {host}, port: {port}, slaveID: {}}}\n  properties:\n{device_props}",
            u.id
        );
    }
    Draft {
        manifests: out,
        seen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(f: f32) -> (u16, u16) {
        let b = f.to_bits();
        ((b >> 16) as u16, b as u16)
    }

    #[test]
    fn floats_in_both_word_orders_text_and_negatives_are_told_apart() {
        let (hi, lo) = words(123.456);
        let text = [0x504C, 0x432D, 0x3700]; // "PLC-7"
        let regs = [650, hi, lo, lo, hi, 0xFFFE, text[0], text[1], text[2], 0];
        let g = guesses(0, &regs);
        let seen: Vec<(u16, &str, Option<&str>)> = g
            .iter()
            .map(|g| (g.offset, g.data_type, g.byte_order))
            .collect();
        assert_eq!(
            seen,
            [
                (0, "uint16", None),
                (1, "float32", None),
                (3, "float32", Some("CDAB")),
                (5, "int16", None),
                (6, "string", None),
                (9, "uint16", None),
            ]
        );
        assert!(g[4].why.contains("\"PLC-7\""), "{}", g[4].why);
        assert_eq!(g[4].count, 3);
        // Small integers side by side are not a float.
        let g = guesses(10, &[1, 2, 0, 0]);
        assert!(g.iter().all(|g| g.data_type == "uint16"));
    }
}
