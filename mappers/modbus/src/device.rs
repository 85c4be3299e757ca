//! One Modbus device: its configuration from KubeEdge's `configData`, and reads and writes over
//! tokio-modbus.
//!
//! Keys are matched without regard to case, so both spellings the KubeEdge examples use work
//! (`slaveID`/`SlaveID`, `dataType`/`DataType`, ...), and numbers may be given as strings.
//!
//! Protocol `configData`: `ip` and `port` (TCP), or `serialPort`, `baudRate` (9600),
//! `dataBits` (8), `parity` (`none`|`even`|`odd`), `stopBits` (1) for RTU; `slaveID` (1);
//! `timeout` (or `collectTimeout`) in milliseconds (1000); `retries` (or `collectRetryTimes`, 0):
//! how many times a request that timed out or lost its connection is sent again, on a new
//! connection, before it fails; `maxGap` (10) and `maxRegisters` (125) for the planner.
//!
//! Visitor `configData`: `register` (`CoilRegister`, `DiscreteInputRegister`, `InputRegister`,
//! `HoldingRegister`), `offset` (the address), `limit` (registers, for strings), `dataType`
//! (else from the model's type: INT int16, FLOAT float32, DOUBLE float64, BOOLEAN bool, STRING
//! string), `byteOrder` (`ABCD`...) or `isSwap`/`isRegisterSwap`, `bit`, `scale`, and
//! `valueOffset` (added after scaling; `offset` is the address in KubeEdge's schema).

use crate::Table;
use crate::codec::{ByteOrder, Codec, CodecError, DataType};
use crate::planner::{self, Limits, PlanError, Read, Refused};
use serde_json::{Map, Value};
use std::time::Duration;
use tokio_modbus::client::{Context, Reader, Writer};
use tokio_modbus::slave::SlaveContext;
use tokio_modbus::{ExceptionCode, Slave};

pub use mapper_sdk::configdata::ConfigError;
use mapper_sdk::configdata::{SerialSettings, bad, flag, integer, number, text};
use mapper_sdk::{ReadValue, Text};

/// How the mapper reaches the device.
#[derive(Clone, Debug, PartialEq)]
pub enum Transport {
    Tcp {
        /// `host:port`.
        address: String,
    },
    Rtu(SerialSettings),
}

/// The device-level settings from the protocol `configData`.
#[derive(Clone, Debug, PartialEq)]
pub struct Connection {
    pub transport: Transport,
    pub slave: u8,
    pub timeout: Duration,
    /// Sends again after a timeout or a lost connection.
    pub retries: u8,
    pub limits: Limits,
}

impl Connection {
    /// `host:port`, or the serial port's path.
    pub fn address(&self) -> String {
        match &self.transport {
            Transport::Tcp { address } => address.clone(),
            Transport::Rtu(serial) => serial.path.clone(),
        }
    }

    pub fn from_config(c: &Map<String, Value>) -> Result<Self, ConfigError> {
        let transport = if let Some(serial) = SerialSettings::from_config(c)? {
            Transport::Rtu(serial)
        } else {
            let ip = text(c, "ip").ok_or_else(|| bad("ip", "missing (or serialPort for RTU)"))?;
            let port: u16 = integer(c, "port")?.unwrap_or(502);
            Transport::Tcp {
                address: format!("{ip}:{port}"),
            }
        };
        let slave = integer(c, "slaveID")?.unwrap_or(1);
        let timeout = match integer(c, "timeout")? {
            Some(t) => t,
            None => integer(c, "collectTimeout")?.unwrap_or(1000),
        };
        if timeout == 0 {
            return Err(bad("timeout", "0 ms would fail every request"));
        }
        let timeout = Duration::from_millis(timeout);
        let retries = match integer(c, "retries")? {
            Some(r) => r,
            None => integer(c, "collectRetryTimes")?.unwrap_or(0),
        };
        let defaults = Limits::default();
        let limits = Limits {
            max_gap: integer(c, "maxGap")?.unwrap_or(defaults.max_gap),
            max_registers: integer(c, "maxRegisters")?.unwrap_or(defaults.max_registers),
            max_bits: integer(c, "maxBits")?.unwrap_or(defaults.max_bits),
        };
        Ok(Self {
            transport,
            slave,
            timeout,
            retries,
            limits,
        })
    }
}

/// One property: where it lives and how its value is coded.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub name: String,
    pub read: Read,
    pub codec: Codec,
}

/// What the model says of a property (its `type`, `minimum`, `maximum`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelHints {
    pub value_type: Option<String>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
}

impl Point {
    pub fn from_config(
        name: &str,
        v: &Map<String, Value>,
        model: &ModelHints,
    ) -> Result<Self, ConfigError> {
        let table = text(v, "register")
            .ok_or_else(|| bad("register", "missing"))
            .and_then(|r| {
                Table::parse(&r).ok_or_else(|| {
                    bad(
                        "register",
                        format!("{r:?} is not CoilRegister, DiscreteInputRegister, InputRegister or HoldingRegister"),
                    )
                })
            })?;
        let address: u16 = integer(v, "offset")?.ok_or_else(|| bad("offset", "missing"))?;
        let limit: Option<u16> = integer(v, "limit")?;
        // Without a dataType, the model's type gives the kind of value and `limit` its width,
        // as in KubeEdge's examples (`type: FLOAT`, `limit: 1`, `scale: 0.1` is a scaled 16-bit
        // register). Integer registers are unsigned, as KubeEdge's Modbus mapper decodes them
        // (big-endian by length); `dataType: int16` (`int32`, `int64`) says signed.
        let data_type = match text(v, "dataType") {
            Some(t) => {
                DataType::parse(&t).ok_or_else(|| bad("dataType", format!("{t:?} is unknown")))?
            }
            None if table.is_bits() => DataType::Bool,
            None => {
                let kind = model.value_type.as_deref().map(str::to_ascii_uppercase);
                match (kind.as_deref(), limit.filter(|l| *l > 0)) {
                    (Some("BOOLEAN"), _) => DataType::Bool,
                    (Some("STRING"), _) => DataType::String,
                    (Some("FLOAT"), None | Some(2)) => DataType::Float32,
                    (Some("DOUBLE"), None | Some(4)) => DataType::Float64,
                    (Some("DOUBLE"), Some(2)) => DataType::Float32,
                    (_, Some(2)) => DataType::Uint32,
                    (_, Some(4)) => DataType::Uint64,
                    _ => DataType::Uint16,
                }
            }
        };
        if table.is_bits() && data_type != DataType::Bool {
            return Err(bad(
                "dataType",
                format!("{data_type} on a bit table; use bool"),
            ));
        }
        // A dataType whose values the model's type cannot hold: said against the type.
        let model_type = model.value_type.as_deref().map(str::to_ascii_uppercase);
        if let (Some(kind), true) = (model_type.as_deref(), text(v, "dataType").is_some()) {
            let clash = match (kind, data_type) {
                ("INT", DataType::Float32 | DataType::Float64) => Some(
                    "gives fractions, which an INT property cannot hold (use type FLOAT or DOUBLE, or an integer dataType)",
                ),
                ("INT" | "FLOAT" | "DOUBLE" | "BOOLEAN", DataType::String) => {
                    Some("is text, which the property's type cannot hold (use type STRING)")
                }
                _ => None,
            };
            if let Some(why) = clash {
                return Err(bad(
                    "dataType",
                    format!("{data_type} {why}; the model's type is {kind}"),
                ));
            }
        }
        let registers = match data_type.registers() {
            _ if table.is_bits() => 1,
            Some(n) => {
                if let Some(l) = limit
                    && l != n
                    && l != 0
                {
                    // Without a dataType, the width came from the model's type: the mismatch is
                    // between the two, and said so.
                    return Err(match (text(v, "dataType"), model_type.as_deref()) {
                        (None, Some(kind)) => bad(
                            "limit",
                            format!(
                                "{l} registers do not fit the model's type {kind} ({}); give dataType to say how {l} registers are read",
                                match kind {
                                    "FLOAT" => "a FLOAT is 2 registers, a float32",
                                    "DOUBLE" =>
                                        "a DOUBLE is 4 registers (a float64) or 2 (a float32)",
                                    "BOOLEAN" => "a BOOLEAN is 1 register",
                                    _ => "an INT is 1, 2 or 4 registers",
                                }
                            ),
                        ),
                        _ => bad(
                            "limit",
                            format!("{l} registers, but a {data_type} takes {n}"),
                        ),
                    });
                }
                n
            }
            None => limit
                .filter(|l| *l > 0)
                .ok_or_else(|| bad("limit", "a string needs its length in registers"))?,
        };
        if u32::from(address) + u32::from(registers) > 1 << 16 {
            return Err(bad(
                "offset",
                format!(
                    "{registers} registers from {address} go past 65535, the last Modbus address"
                ),
            ));
        }
        let order = match text(v, "byteOrder") {
            Some(o) => ByteOrder::parse(&o).ok_or_else(|| {
                bad(
                    "byteOrder",
                    format!("{o:?} is not ABCD, CDAB, BADC or DCBA"),
                )
            })?,
            None => ByteOrder::from_swaps(flag(v, "isSwap")?, flag(v, "isRegisterSwap")?),
        };
        let bit: Option<u8> = integer(v, "bit")?;
        if let Some(b) = bit
            && b > 15
        {
            return Err(bad("bit", format!("{b} is not 0 to 15")));
        }
        let scale = number(v, "scale")?.unwrap_or(1.0);
        if scale == 0.0 || !scale.is_finite() {
            return Err(bad("scale", "must be a non-zero number"));
        }
        Ok(Self {
            name: name.to_string(),
            read: Read {
                table,
                address,
                count: registers,
            },
            codec: Codec {
                data_type,
                order,
                registers,
                bit,
                scale,
                offset: number(v, "valueOffset")?.unwrap_or(0.0),
                minimum: model.minimum,
                maximum: model.maximum,
            },
        })
    }
}

/// Why a read or write failed.
#[derive(Debug, thiserror::Error)]
pub enum ModbusError {
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the device did not answer within {0:?}")]
    Timeout(Duration),
    #[error("{}", transport_text(.0))]
    Transport(#[from] tokio_modbus::Error),
    #[error("the device answered with exception {0}")]
    Exception(ExceptionCode),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{0} is read-only")]
    ReadOnly(String),
    #[error("the answer has fewer items than requested")]
    Short,
}

/// A transport error in words: what failed, not only the system's text (`Resource temporarily
/// unavailable (os error 11)` is a serial port with nothing to read or already in use, `Operation
/// now in progress (os error 115)` a TCP connection not made yet).
fn transport_text(e: &tokio_modbus::Error) -> String {
    use std::io::ErrorKind as K;
    match e {
        tokio_modbus::Error::Transport(io) => {
            let what = match io.kind() {
                K::WouldBlock => {
                    "the port had nothing to read or write when it should have (is another program using it?)"
                }
                K::ConnectionReset | K::ConnectionAborted => {
                    "the connection was reset by the device or a gateway"
                }
                K::BrokenPipe => "the connection was closed by the device or a gateway",
                K::UnexpectedEof => "the device closed the connection",
                K::TimedOut => "the connection timed out",
                K::NotConnected => "the connection is not made yet",
                _ if io.raw_os_error() == Some(115) => "the connection is not made yet",
                _ => "the connection failed",
            };
            format!("{what}: {io}")
        }
        other => format!("the connection failed: {other}"),
    }
}

impl ModbusError {
    /// Whether the connection should be dropped and made again (as opposed to a fault of one
    /// property, such as an exception or a value that does not decode).
    pub fn is_link(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. } | Self::Timeout(_) | Self::Transport(_)
        )
    }
}

/// A device: its connection settings, its points, and the connection it shares.
pub struct Device {
    pub connection: Connection,
    pub points: Vec<Point>,
    refused: Refused,
    /// The connection to the device's address (TCP) or its serial line (RTU), shared with
    /// every other device there: the units behind one Modbus TCP gateway, the devices on one
    /// RS-485 line, or several Devices of one PLC.
    bus: std::sync::Arc<crate::bus::Bus>,
    requests: u64,
    /// The plan of the last read.
    planned: Option<Planned>,
    /// Each point's last value and the items it was decoded from.
    last: Vec<Last>,
    /// Where a value is decoded before it is kept.
    scratch: String,
}

/// A read's plan, kept for the next cycle.
struct Planned {
    /// The points asked for, as given.
    due: Vec<usize>,
    /// How many addresses were refused when it was made.
    refused: usize,
    /// The points planned (those of `due` that exist), and their reads.
    idx: Vec<usize>,
    reads: Vec<Read>,
    plan: Vec<planner::Request>,
    /// The last answer to each request, when every point in it took its value from it: the
    /// same answer again is the same values again, with nothing sliced or compared per point.
    answers: Vec<Option<ItemsOwned>>,
}

/// A point's last value and what it was decoded from.
#[derive(Clone, Debug, Default)]
enum Last {
    #[default]
    None,
    Words(Vec<u16>, Text),
    Bit(bool, Text),
}

impl Last {
    fn text(&self) -> Option<Text> {
        match self {
            Self::None => None,
            Self::Words(_, t) | Self::Bit(_, t) => Some(t.clone()),
        }
    }
}

impl Device {
    pub fn new(connection: Connection, points: Vec<Point>) -> Self {
        let bus = match &connection.transport {
            Transport::Rtu(serial) => crate::bus::for_line(&serial.path, serial.baud_rate),
            Transport::Tcp { address } => crate::bus::for_address(address),
        };
        Self {
            connection,
            refused: Refused::new(),
            bus,
            requests: 0,
            planned: None,
            last: vec![Last::None; points.len()],
            scratch: String::new(),
            points,
        }
    }

    /// Requests sent to the device so far (reads and writes).
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Connects if not connected (the connection or line shared with the other devices there).
    pub async fn connect(&mut self) -> Result<(), ModbusError> {
        let mut line = self.bus.line.lock().await;
        if line.port.is_none() {
            line.port = Some(open(&self.connection).await?);
        }
        Ok(())
    }

    /// Reads the points `due` (indices into [`Device::points`]) in as few requests as the
    /// planner allows. Each point gets its own result: an exception or a bad value fails that
    /// point only. A request refused with `IllegalDataAddress` that bridged unrequested
    /// addresses is split, and those addresses are never bridged again.
    pub async fn read(&mut self, due: &[usize]) -> Vec<(usize, Result<Text, ModbusError>)> {
        let results = self.read_with(due, |e| e).await;
        results
            .into_iter()
            .map(|(i, r)| {
                let r = r.and_then(|v| match v {
                    ReadValue::New(t) => Ok(t),
                    ReadValue::Same => self.last[i].text().ok_or(ModbusError::Short),
                });
                (i, r)
            })
            .collect()
    }

    /// [`Device::read`] as the SDK takes it: a value whose items did not change since the last
    /// read is [`ReadValue::Same`], and each error is made into the caller's by `err` as it is
    /// met.
    pub async fn read_with<E>(
        &mut self,
        due: &[usize],
        mut err: impl FnMut(ModbusError) -> E,
    ) -> Vec<(usize, Result<ReadValue, E>)> {
        let mut out = Vec::with_capacity(due.len());
        // The plan of the last cycle, kept while the same points are due and no address was
        // refused since (a device's points are polled the same way cycle after cycle).
        let mut planned = match self.planned.take() {
            Some(p) if p.due == due && p.refused == self.refused.len() => p,
            _ => {
                let idx: Vec<usize> = due
                    .iter()
                    .copied()
                    .filter(|&i| i < self.points.len())
                    .collect();
                let reads: Vec<Read> = idx.iter().map(|&i| self.points[i].read).collect();
                match planner::plan(&reads, &self.connection.limits, &self.refused) {
                    Ok(plan) => Planned {
                        due: due.to_vec(),
                        refused: self.refused.len(),
                        idx,
                        reads,
                        answers: plan.iter().map(|_| None).collect(),
                        plan,
                    },
                    Err(e) => {
                        out.extend(
                            idx.iter()
                                .map(|&i| (i, Err(err(ModbusError::Plan(e.clone()))))),
                        );
                        return out;
                    }
                }
            }
        };
        let mut retry: Vec<usize> = Vec::new();
        for (r, req) in planned.plan.iter().enumerate() {
            let answer = self.request(req.table, req.address, req.count).await;
            if answer.is_err() {
                planned.answers[r] = None;
            }
            match answer {
                Ok(items) if planned.answers[r].as_ref() == Some(&items) => {
                    out.extend(
                        req.reads
                            .iter()
                            .map(|&k| (planned.idx[k], Ok(ReadValue::Same))),
                    );
                }
                Ok(items) => {
                    let mut every = true;
                    for &k in &req.reads {
                        let i = planned.idx[k];
                        let value = self.value(i, req, &planned.reads[k], &items);
                        every &= value.is_ok();
                        out.push((i, value.map_err(&mut err)));
                    }
                    planned.answers[r] = every.then_some(items);
                }
                Err(ModbusError::Exception(ExceptionCode::IllegalDataAddress))
                    if req.reads.len() > 1 && !req.holes(&planned.reads).is_empty() =>
                {
                    for a in req.holes(&planned.reads) {
                        self.refused.insert((req.table, a));
                    }
                    tracing::debug!(table = ?req.table, address = req.address, count = req.count, "merged request refused; splitting around the gap");
                    retry.extend(req.reads.iter().copied());
                }
                Err(e) => {
                    for &k in &req.reads {
                        out.push((planned.idx[k], Err(err(e.for_each_point()))));
                    }
                }
            }
        }
        if !retry.is_empty() {
            // Once more, split around the addresses refused (each point then stands alone).
            let batch: Vec<Read> = retry.iter().map(|&k| planned.reads[k]).collect();
            match planner::plan(&batch, &self.connection.limits, &self.refused) {
                Ok(plan) => {
                    for req in plan {
                        match self.request(req.table, req.address, req.count).await {
                            Ok(items) => {
                                for &b in &req.reads {
                                    let i = planned.idx[retry[b]];
                                    let value =
                                        self.value(i, &req, &batch[b], &items).map_err(&mut err);
                                    out.push((i, value));
                                }
                            }
                            Err(e) => {
                                for &b in &req.reads {
                                    out.push((planned.idx[retry[b]], Err(err(e.for_each_point()))));
                                }
                            }
                        }
                    }
                }
                Err(e) => {
                    for &k in &retry {
                        out.push((planned.idx[k], Err(err(ModbusError::Plan(e.clone())))));
                    }
                }
            }
            // Planned again next cycle, with the refused addresses.
            planned.refused = usize::MAX;
        }
        self.planned = Some(planned);
        out
    }

    /// Point `i`'s value in the answer to `req`: [`ReadValue::Same`] while its items are those
    /// of its last value (nothing decoded, nothing allocated), else decoded and kept.
    #[inline]
    fn value(
        &mut self,
        i: usize,
        req: &planner::Request,
        read: &Read,
        items: &ItemsOwned,
    ) -> Result<ReadValue, ModbusError> {
        let codec = &self.points[i].codec;
        let last = &mut self.last[i];
        match slice_items(req, read, items) {
            None => Err(ModbusError::Short),
            Some(Items::Words(w)) => {
                if let Last::Words(raw, _) = last
                    && raw.as_slice() == w
                {
                    return Ok(ReadValue::Same);
                }
                self.scratch.clear();
                codec.decode_into(w, &mut self.scratch)?;
                let text = Text::from(self.scratch.as_str());
                match last {
                    Last::Words(raw, t) => {
                        raw.clear();
                        raw.extend_from_slice(w);
                        *t = text.clone();
                    }
                    _ => *last = Last::Words(w.to_vec(), text.clone()),
                }
                Ok(ReadValue::New(text))
            }
            Some(Items::Bits(bits)) => {
                let bit = *bits.first().ok_or(ModbusError::Short)?;
                if let Last::Bit(b, _) = last
                    && *b == bit
                {
                    return Ok(ReadValue::Same);
                }
                let text: Text = codec.decode_bit(bit).into();
                *last = Last::Bit(bit, text.clone());
                Ok(ReadValue::New(text))
            }
        }
    }

    async fn request(
        &mut self,
        table: Table,
        address: u16,
        count: u16,
    ) -> Result<ItemsOwned, ModbusError> {
        match self.exchange(Op::Read(table, address, count)).await? {
            Answer::Items(items) if items.len() >= usize::from(count) => Ok(items),
            _ => Err(ModbusError::Short),
        }
    }

    /// Writes `value` to point `index`: a coil with function 5, one register with function 6,
    /// several with function 16.
    pub async fn write(&mut self, index: usize, value: &str) -> Result<(), ModbusError> {
        let point = self.points.get(index).ok_or(ModbusError::Short)?.clone();
        if !point.read.table.is_writable() {
            return Err(ModbusError::ReadOnly(point.name));
        }
        // Encoded (and checked) before anything is sent.
        let addr = point.read.address;
        let op = if point.read.table == Table::Coil {
            Op::Coil(addr, point.codec.encode_bit(value)?)
        } else {
            Op::Registers(addr, point.codec.encode_registers(value)?)
        };
        self.exchange(op).await.map(|_| ())
    }

    /// One request and its answer, sent up to [`Connection::retries`] more times after a
    /// timeout or a lost connection (each time on a new connection).
    async fn exchange(&mut self, op: Op) -> Result<Answer, ModbusError> {
        let mut attempt = 0;
        loop {
            match self.exchange_once(&op).await {
                Err(e @ (ModbusError::Timeout(_) | ModbusError::Transport(_)))
                    if attempt < self.connection.retries =>
                {
                    attempt += 1;
                    tracing::debug!(device = %self.connection.address(), attempt, error = %e, "retrying a request");
                }
                r => return r,
            }
        }
    }

    /// One request and its answer on the connection or serial line the device shares, which
    /// the devices there take turns to use (with the line's silence between frames on RTU). A
    /// link error, a timeout among them, closes it for all of them (a late answer must not be
    /// read as the answer to the next request); the next request opens it again.
    async fn exchange_once(&mut self, op: &Op) -> Result<Answer, ModbusError> {
        let timeout = self.connection.timeout;
        self.requests += 1;
        let bus = self.bus.clone();
        let mut line = bus.line.lock().await;
        let mut ctx = match line.port.take() {
            Some(ctx) => ctx,
            None => open(&self.connection).await?,
        };
        ctx.set_slave(Slave(self.connection.slave));
        mapper_sdk::line::wait_silence(line.last_frame, bus.silence).await;
        let r = exec(&mut ctx, op, timeout).await;
        line.last_frame = Some(tokio::time::Instant::now());
        if !r.as_ref().is_err_and(ModbusError::is_link) {
            line.port = Some(ctx);
        }
        r
    }
}

/// A request.
enum Op {
    Read(Table, u16, u16),
    Coil(u16, bool),
    Registers(u16, Vec<u16>),
}

enum Answer {
    Items(ItemsOwned),
    Written,
}

/// Sends `op` on `ctx` and waits for the answer, at most `timeout`.
async fn exec(ctx: &mut Context, op: &Op, timeout: Duration) -> Result<Answer, ModbusError> {
    let call = async {
        Ok::<_, tokio_modbus::Error>(match op {
            Op::Read(Table::Coil, a, n) => ctx
                .read_coils(*a, *n)
                .await?
                .map(|b| Answer::Items(ItemsOwned::Bits(b))),
            Op::Read(Table::DiscreteInput, a, n) => ctx
                .read_discrete_inputs(*a, *n)
                .await?
                .map(|b| Answer::Items(ItemsOwned::Bits(b))),
            Op::Read(Table::InputRegister, a, n) => ctx
                .read_input_registers(*a, *n)
                .await?
                .map(|w| Answer::Items(ItemsOwned::Words(w))),
            Op::Read(Table::HoldingRegister, a, n) => ctx
                .read_holding_registers(*a, *n)
                .await?
                .map(|w| Answer::Items(ItemsOwned::Words(w))),
            Op::Coil(a, bit) => ctx
                .write_single_coil(*a, *bit)
                .await?
                .map(|()| Answer::Written),
            Op::Registers(a, words) => match words.as_slice() {
                [w] => ctx.write_single_register(*a, *w).await?,
                words => ctx.write_multiple_registers(*a, words).await?,
            }
            .map(|()| Answer::Written),
        })
    };
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Err(ModbusError::Timeout(timeout)),
        Ok(Err(e)) => Err(ModbusError::Transport(e)),
        Ok(Ok(Err(code))) => Err(ModbusError::Exception(code)),
        Ok(Ok(Ok(answer))) => Ok(answer),
    }
}

/// The items of one answer.
#[derive(Debug, PartialEq)]
enum ItemsOwned {
    Words(Vec<u16>),
    Bits(Vec<bool>),
}

impl ItemsOwned {
    fn len(&self) -> usize {
        match self {
            Self::Words(w) => w.len(),
            Self::Bits(b) => b.len(),
        }
    }
}

enum Items<'a> {
    Words(&'a [u16]),
    Bits(&'a [bool]),
}

/// The items of `read` within the answer to `req`.
fn slice_items<'a>(
    req: &planner::Request,
    read: &Read,
    items: &'a ItemsOwned,
) -> Option<Items<'a>> {
    Some(match items {
        ItemsOwned::Words(w) => Items::Words(req.slice(read, w)?),
        ItemsOwned::Bits(b) => Items::Bits(req.slice(read, b)?),
    })
}

impl ModbusError {
    /// The error again, for each point of a failed request (IO errors do not clone; their
    /// message is kept).
    fn for_each_point(&self) -> Self {
        match self {
            Self::Exception(c) => Self::Exception(*c),
            Self::Timeout(t) => Self::Timeout(*t),
            Self::Short => Self::Short,
            Self::Codec(c) => Self::Codec(c.clone()),
            Self::Plan(p) => Self::Plan(p.clone()),
            Self::ReadOnly(n) => Self::ReadOnly(n.clone()),
            Self::Connect { address, source } => Self::Connect {
                address: address.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::Transport(e) => Self::Transport(tokio_modbus::Error::Transport(
                std::io::Error::other(e.to_string()),
            )),
        }
    }
}

/// A serial port that drops whatever has arrived unasked when a request starts (the first
/// write after reading): a duplicate answer, or one frame too many from a device, already in the
/// port's buffer would otherwise be read as the answer to the next request, which on RTU nothing
/// tells apart from the real one when the two requests have the same shape. What arrives after
/// the request has gone out cannot be told apart: that is RTU's limit (TCP has transaction ids).
pub struct DropStale<S> {
    inner: S,
    writing: bool,
    line: String,
}

impl<S> DropStale<S> {
    pub fn new(inner: S, line: String) -> Self {
        Self {
            inner,
            writing: false,
            line,
        }
    }
}

impl<S: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for DropStale<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.writing = false;
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite
    for DropStale<S>
{
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if !self.writing {
            self.writing = true;
            // Read what is there now, without waiting (and without this task's waker: the
            // client registers its own when it reads the answer).
            let mut quiet = std::task::Context::from_waker(std::task::Waker::noop());
            let mut dropped = 0usize;
            let mut chunk = [0u8; 256];
            loop {
                let mut rb = tokio::io::ReadBuf::new(&mut chunk);
                match std::pin::Pin::new(&mut self.inner).poll_read(&mut quiet, &mut rb) {
                    std::task::Poll::Ready(Ok(())) if !rb.filled().is_empty() => {
                        dropped += rb.filled().len();
                    }
                    _ => break,
                }
            }
            if dropped > 0 {
                tracing::warn!(line = %self.line, bytes = dropped, "dropped bytes that arrived unasked before a request (a duplicate or stray answer)");
            }
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A new connection to the device.
async fn open(connection: &Connection) -> Result<Context, ModbusError> {
    let slave = Slave(connection.slave);
    let address = connection.address();
    let connect_err = |source| ModbusError::Connect {
        address: address.clone(),
        source,
    };
    let ctx = match &connection.transport {
        Transport::Tcp { address } => {
            let stream = tokio::time::timeout(
                connection.timeout,
                tokio::net::TcpStream::connect(address.as_str()),
            )
            .await
            .map_err(|_| ModbusError::Timeout(connection.timeout))?
            .map_err(connect_err)?;
            let _ = stream.set_nodelay(true);
            tokio_modbus::client::tcp::attach_slave(stream, slave)
        }
        Transport::Rtu(serial) => {
            let mut port = serial.open().map_err(connect_err)?;
            mapper_sdk::line::drain(&mut port, connection.timeout, &address).await;
            tokio_modbus::client::rtu::attach_slave(DropStale::new(port, address.clone()), slave)
        }
    };
    Ok(ctx)
}

#[cfg(test)]
mod tests;
