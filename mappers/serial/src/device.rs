//! One serial device: its settings from `configData`, its points, and the exchanges on its
//! (shared) line.

use crate::checksum::Checksum;
use crate::field::{Field, Scale, hex, parse_hex};
use mapper_sdk::configdata::{ConfigError, SerialSettings, bad, integer, number, text};
use mapper_sdk::line::{SharedLine, wait_silence};
use regex::Regex;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_serial::{SerialPort, SerialStream};

/// How the device talks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Ascii,
    Binary,
}

/// The device-level settings.
#[derive(Clone, Debug)]
pub struct Port {
    pub serial: SerialSettings,
    pub mode: Mode,
    pub timeout: Duration,
    /// Ends reply lines (ASCII).
    pub terminator: Vec<u8>,
    /// Appended to requests (ASCII).
    pub request_terminator: Vec<u8>,
    /// Appended to requests and checked on replies (binary).
    pub checksum: Checksum,
    /// Silence kept between frames on the line.
    pub frame_gap: Duration,
}

impl Port {
    pub fn from_config(c: &Map<String, Value>) -> Result<Self, ConfigError> {
        let serial = SerialSettings::from_config(c)?.ok_or_else(|| bad("serialPort", "missing"))?;
        let mode = match text(c, "mode")
            .unwrap_or_else(|| "ascii".into())
            .to_ascii_lowercase()
            .as_str()
        {
            "ascii" | "text" | "line" => Mode::Ascii,
            "binary" | "hex" => Mode::Binary,
            other => return Err(bad("mode", format!("{other:?} is not ascii or binary"))),
        };
        let timeout = integer::<u64>(c, "timeout")?.unwrap_or(1000);
        if timeout == 0 {
            return Err(bad("timeout", "0 ms would fail every request"));
        }
        let checksum = match text(c, "checksum") {
            None => Checksum::None,
            Some(s) => Checksum::parse(&s).ok_or_else(|| {
                bad(
                    "checksum",
                    format!("{s:?} is not none, sum8, xor8, crc16-modbus or crc16-ccitt"),
                )
            })?,
        };
        if checksum != Checksum::None && mode == Mode::Ascii {
            return Err(bad("checksum", "only binary frames carry a checksum"));
        }
        let terminator = text(c, "terminator").unwrap_or_else(|| "\n".into());
        if terminator.is_empty() {
            return Err(bad("terminator", "empty"));
        }
        // 3.5 characters by default, as on an RS-485 Modbus line.
        let frame_gap = match number(c, "frameGap")? {
            Some(ms) if ms >= 0.0 => Duration::from_secs_f64(ms / 1000.0),
            Some(ms) => return Err(bad("frameGap", format!("{ms} is negative"))),
            None => serial.char_time() * 7 / 2,
        };
        Ok(Self {
            serial,
            mode,
            timeout: Duration::from_millis(timeout),
            terminator: terminator.into_bytes(),
            request_terminator: text(c, "requestTerminator")
                .unwrap_or_else(|| "\r\n".into())
                .into_bytes(),
            checksum,
            frame_gap,
        })
    }
}

/// How a text value is typed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TextType {
    String,
    Int,
    Float,
    Boolean,
}

/// How a property is read.
#[derive(Clone, Debug)]
pub enum Reading {
    /// A reply line matched by `pattern`; the value is capture `capture`.
    Ascii {
        pattern: Regex,
        capture: String,
        text_type: TextType,
        scale: Scale,
    },
    /// A reply of `length` bytes that starts with `prefix`; the value is `field`.
    Binary {
        length: usize,
        prefix: Vec<u8>,
        field: Field,
    },
}

/// How a property is written: the request with `{value}` in it, and the reply expected.
#[derive(Clone, Debug)]
pub struct Writing {
    /// Text (ASCII) or hex (binary) around the value.
    pub before: String,
    pub after: String,
    /// ASCII: a reply line must match this. Binary: the reply's length (0: none awaited).
    pub ascii_reply: Option<Regex>,
    pub binary_reply: usize,
}

/// One property of a device.
#[derive(Clone, Debug)]
pub struct Point {
    pub name: String,
    /// The request's bytes, ready to send (terminator or checksum included).
    pub request: Vec<u8>,
    pub reading: Reading,
    pub writing: Option<Writing>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
}

impl Point {
    /// A property from its visitor `configData` and the model's type and range.
    pub fn from_config(
        port: &Port,
        name: &str,
        v: &Map<String, Value>,
        model_type: Option<&str>,
        minimum: Option<f64>,
        maximum: Option<f64>,
    ) -> Result<Self, ConfigError> {
        let request = text(v, "request").ok_or_else(|| bad("request", "missing"))?;
        let scale = Scale::from_config(v)?;
        let (request, reading) = match port.mode {
            Mode::Ascii => {
                let pattern_text = text(v, "pattern").ok_or_else(|| bad("pattern", "missing"))?;
                let pattern = Regex::new(&pattern_text)
                    .map_err(|e| bad("pattern", format!("not a regular expression: {e}")))?;
                let named: Vec<&str> = pattern.capture_names().flatten().collect();
                let capture = match text(v, "capture") {
                    Some(c) => {
                        let known = named.contains(&c.as_str())
                            || c.parse::<usize>().is_ok_and(|i| i < pattern.captures_len());
                        if !known {
                            return Err(bad(
                                "capture",
                                format!("{c:?} is not a group of the pattern (named: {named:?})"),
                            ));
                        }
                        c
                    }
                    None if named.contains(&name) => name.to_string(),
                    None if pattern.captures_len() > 1 => "1".into(),
                    None => "0".into(),
                };
                let text_type = match text(v, "dataType")
                    .or_else(|| model_type.map(str::to_string))
                    .unwrap_or_else(|| "string".into())
                    .to_ascii_lowercase()
                    .as_str()
                {
                    "string" => TextType::String,
                    "int" | "integer" => TextType::Int,
                    "float" | "double" => TextType::Float,
                    "boolean" | "bool" => TextType::Boolean,
                    other => {
                        return Err(bad(
                            "dataType",
                            format!("{other:?} is not string, int, float or boolean"),
                        ));
                    }
                };
                let mut bytes = request.into_bytes();
                bytes.extend_from_slice(&port.request_terminator);
                (
                    bytes,
                    Reading::Ascii {
                        pattern,
                        capture,
                        text_type,
                        scale,
                    },
                )
            }
            Mode::Binary => {
                let bytes = parse_hex(&request).map_err(|e| bad("request", e))?;
                let length = integer::<usize>(v, "responseLength")?.ok_or_else(|| {
                    bad(
                        "responseLength",
                        "missing (the reply's bytes, checksum included)",
                    )
                })?;
                let prefix = match text(v, "responsePrefix") {
                    Some(p) => parse_hex(&p).map_err(|e| bad("responsePrefix", e))?,
                    None => Vec::new(),
                };
                let field = Field::from_config(v, None, false)?;
                let (offset, kind) = (field.offset, field.kind);
                let body = length.saturating_sub(port.checksum.width());
                if offset + kind.width() > body {
                    return Err(bad(
                        "offset",
                        format!(
                            "the field (bytes {offset} to {}) does not fit in a {length}-byte reply",
                            offset + kind.width() - 1
                        ),
                    ));
                }
                (
                    port.checksum.append(bytes),
                    Reading::Binary {
                        length,
                        prefix,
                        field,
                    },
                )
            }
        };
        let writing = match text(v, "write") {
            None => None,
            Some(t) => {
                let (before, after) = t
                    .split_once("{value}")
                    .ok_or_else(|| bad("write", format!("{t:?} has no {{value}}")))?;
                if port.mode == Mode::Binary {
                    parse_hex(before).map_err(|e| bad("write", e))?;
                    parse_hex(after).map_err(|e| bad("write", e))?;
                }
                let ascii_reply = match text(v, "writeReply") {
                    Some(r) => Some(Regex::new(&r).map_err(|e| {
                        bad("writeReply", format!("not a regular expression: {e}"))
                    })?),
                    None => None,
                };
                Some(Writing {
                    before: before.to_string(),
                    after: after.to_string(),
                    ascii_reply,
                    binary_reply: integer(v, "writeResponseLength")?.unwrap_or(0),
                })
            }
        };
        Ok(Self {
            name: name.to_string(),
            request,
            reading,
            writing,
            minimum,
            maximum,
        })
    }

    /// The value in a reply (a line or a frame).
    pub fn decode(&self, reply: &Reply) -> Result<String, SerialError> {
        match (&self.reading, reply) {
            (
                Reading::Ascii {
                    pattern,
                    capture,
                    text_type,
                    scale,
                },
                Reply::Line(line),
            ) => {
                let caps = pattern.captures(line).ok_or_else(|| {
                    SerialError::Reply(format!(
                        "reply {line:?} does not match {:?}",
                        pattern.as_str()
                    ))
                })?;
                let m = match capture.parse::<usize>() {
                    Ok(i) => caps.get(i),
                    Err(_) => caps.name(capture),
                }
                .ok_or_else(|| {
                    SerialError::Reply(format!("group {capture} did not match in {line:?}"))
                })?;
                typed(m.as_str().trim(), *text_type, scale)
            }
            (Reading::Binary { prefix, field, .. }, Reply::Frame(frame)) => {
                if !frame.starts_with(prefix) {
                    return Err(SerialError::Reply(format!(
                        "reply {} does not start with {}",
                        hex(frame),
                        hex(prefix)
                    )));
                }
                field
                    .decode(frame)
                    .map_err(|e| SerialError::Reply(e.to_string()))
            }
            _ => Err(SerialError::Reply("reply of the wrong kind".into())),
        }
    }

    /// What a read of this point waits for.
    pub fn expect(&self) -> Expect {
        match &self.reading {
            Reading::Ascii { .. } => Expect::Line,
            Reading::Binary { length, .. } => Expect::Bytes(*length),
        }
    }
}

/// A text value as the property's type.
fn typed(s: &str, t: TextType, scale: &Scale) -> Result<String, SerialError> {
    let bad = |what: &str| SerialError::Reply(format!("{s:?} is not {what}"));
    match t {
        TextType::String => Ok(s.to_string()),
        TextType::Boolean => match s.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok("true".into()),
            "0" | "false" | "off" | "no" => Ok("false".into()),
            _ => Err(bad("a boolean")),
        },
        TextType::Int => {
            let v: i64 = s.parse().map_err(|_| bad("an integer"))?;
            Ok(scale.integer(i128::from(v)))
        }
        TextType::Float => {
            let v: f64 = s.parse().map_err(|_| bad("a number"))?;
            Ok(scale.float(v, || s.to_string()))
        }
    }
}

/// What a request waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    Nothing,
    Line,
    Bytes(usize),
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    None,
    Line(String),
    Frame(Vec<u8>),
}

/// What went wrong, by what it means for the device.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SerialError {
    /// The port cannot be opened or broke, or the device did not answer in time: the device
    /// is offline.
    #[error("{0}")]
    Link(String),
    /// The device answered, but not as configured (no match, bad checksum, wrong prefix).
    #[error("{0}")]
    Reply(String),
    /// A value that cannot be written.
    #[error("{0}")]
    Value(String),
}

impl SerialError {
    pub fn is_link(&self) -> bool {
        matches!(self, Self::Link(_))
    }
}

/// A device: its port settings and points, on a line it may share.
pub struct Device {
    pub port: Port,
    pub points: Vec<Point>,
    line: Arc<SharedLine<SerialStream>>,
    requests: u64,
}

impl Device {
    pub fn new(port: Port, points: Vec<Point>) -> Self {
        let line = SharedLine::for_path(&port.serial.path, port.frame_gap);
        Self {
            port,
            points,
            line,
            requests: 0,
        }
    }

    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Opens the line if it is not open.
    pub async fn connect(&mut self) -> Result<(), SerialError> {
        let mut line = self.line.line.lock().await;
        if line.port.is_none() {
            line.port = Some(self.open()?);
        }
        Ok(())
    }

    fn open(&self) -> Result<SerialStream, SerialError> {
        self.port
            .serial
            .open()
            .map_err(|e| SerialError::Link(format!("cannot open {}: {e}", self.port.serial.path)))
    }

    /// Sends `request` and waits for what `expect` says, holding the line throughout.
    pub async fn exchange(&mut self, request: &[u8], expect: Expect) -> Result<Reply, SerialError> {
        self.requests += 1;
        let mut line = self.line.line.lock().await;
        let mut stream = match line.port.take() {
            Some(s) => s,
            None => {
                // Opened at start, or again after a timeout or a garbled reply: whatever is
                // still on its way (a late reply) is read and dropped until the line is silent.
                let mut s = self.open()?;
                mapper_sdk::line::drain(&mut s, self.port.timeout, &self.port.serial.path).await;
                s
            }
        };
        wait_silence(line.last_frame, self.line.silence).await;
        // What arrived unasked since (a duplicate reply) must not be taken for this one's.
        let _ = stream.clear(tokio_serial::ClearBuffer::Input);
        let result = self.talk(&mut stream, request, expect).await;
        line.last_frame = Some(tokio::time::Instant::now());
        match result {
            Ok(reply) => {
                line.port = Some(stream);
                Ok(reply)
            }
            // A silent or garbling device: its reply may still come, and would be taken for the
            // answer to the next request on the line. The line is opened again (and drained)
            // for the next request.
            Err(Failure::Device(e)) => Err(e),
            // A broken port is closed, to be opened again.
            Err(Failure::Port(e)) => Err(SerialError::Link(format!(
                "serial port {}: {e}",
                self.port.serial.path
            ))),
        }
    }

    async fn talk(
        &self,
        stream: &mut SerialStream,
        request: &[u8],
        expect: Expect,
    ) -> Result<Reply, Failure> {
        stream.write_all(request).await.map_err(Failure::Port)?;
        stream.flush().await.map_err(Failure::Port)?;
        if expect == Expect::Nothing {
            return Ok(Reply::None);
        }
        let mut buf = Vec::with_capacity(64);
        let deadline = tokio::time::Instant::now() + self.port.timeout;
        let mut chunk = [0u8; 256];
        loop {
            match expect {
                Expect::Line => {
                    let t = &self.port.terminator;
                    if let Some(at) = buf.windows(t.len()).position(|w| w == t.as_slice()) {
                        let text = String::from_utf8_lossy(&buf[..at]);
                        return Ok(Reply::Line(text.trim_end_matches('\r').to_string()));
                    }
                }
                Expect::Bytes(n) if buf.len() >= n => {
                    buf.truncate(n);
                    self.port.checksum.verify(&buf).map_err(|e| {
                        Failure::Device(SerialError::Reply(format!("{e} in reply {}", hex(&buf))))
                    })?;
                    return Ok(Reply::Frame(buf));
                }
                _ => {}
            }
            let read = tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await;
            match read {
                Err(_) => {
                    let got = if buf.is_empty() {
                        String::new()
                    } else {
                        format!(" (got {} byte(s): {})", buf.len(), hex(&buf))
                    };
                    return Err(Failure::Device(SerialError::Link(format!(
                        "no complete reply within {:?}{got}",
                        self.port.timeout
                    ))));
                }
                Ok(Ok(0)) => {
                    return Err(Failure::Port(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the port closed",
                    )));
                }
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
                Ok(Err(e)) => return Err(Failure::Port(e)),
            }
            if buf.len() > 64 * 1024 {
                return Err(Failure::Device(SerialError::Reply(
                    "more than 64 KiB without a terminator".into(),
                )));
            }
        }
    }

    /// Reads the points `due`: points with the same request share one exchange.
    pub async fn read(&mut self, due: &[usize]) -> Vec<(usize, Result<String, SerialError>)> {
        let mut groups: Vec<(Vec<u8>, Expect, Vec<usize>)> = Vec::new();
        for &i in due {
            let Some(p) = self.points.get(i) else {
                continue;
            };
            match groups
                .iter_mut()
                .find(|(r, e, _)| *r == p.request && *e == p.expect())
            {
                Some((_, _, members)) => members.push(i),
                None => groups.push((p.request.clone(), p.expect(), vec![i])),
            }
        }
        let mut out = Vec::with_capacity(due.len());
        for (request, expect, members) in groups {
            match self.exchange(&request, expect).await {
                Ok(reply) => {
                    for i in members {
                        out.push((i, self.points[i].decode(&reply)));
                    }
                }
                Err(e) => {
                    for i in members {
                        out.push((i, Err(e.clone())));
                    }
                }
            }
        }
        out
    }

    /// Writes `value` to point `index` with its write template.
    pub async fn write(&mut self, index: usize, value: &str) -> Result<(), SerialError> {
        let point = self
            .points
            .get(index)
            .ok_or_else(|| SerialError::Value(format!("no property {index}")))?
            .clone();
        let writing = point
            .writing
            .as_ref()
            .ok_or_else(|| SerialError::Value(format!("{} has no write template", point.name)))?;
        if let Ok(v) = value.trim().parse::<f64>()
            && (point.minimum.is_some_and(|m| v < m) || point.maximum.is_some_and(|m| v > m))
        {
            return Err(SerialError::Value(format!(
                "{value} is outside {}..{}",
                point.minimum.map_or("".into(), |m| m.to_string()),
                point.maximum.map_or("".into(), |m| m.to_string())
            )));
        }
        let (request, expect) = match self.port.mode {
            Mode::Ascii => {
                let mut r =
                    format!("{}{}{}", writing.before, value.trim(), writing.after).into_bytes();
                r.extend_from_slice(&self.port.request_terminator);
                let expect = if writing.ascii_reply.is_some() {
                    Expect::Line
                } else {
                    Expect::Nothing
                };
                (r, expect)
            }
            Mode::Binary => {
                let Reading::Binary { field, .. } = &point.reading else {
                    return Err(SerialError::Value("not a binary property".into()));
                };
                let mut r =
                    parse_hex(&writing.before).map_err(|e| SerialError::Value(e.to_string()))?;
                r.extend(
                    field
                        .encode(value)
                        .map_err(|e| SerialError::Value(e.to_string()))?,
                );
                r.extend(parse_hex(&writing.after).map_err(|e| SerialError::Value(e.to_string()))?);
                let expect = match writing.binary_reply {
                    0 => Expect::Nothing,
                    n => Expect::Bytes(n),
                };
                (self.port.checksum.append(r), expect)
            }
        };
        let reply = self.exchange(&request, expect).await?;
        if let (Some(re), Reply::Line(line)) = (&writing.ascii_reply, &reply)
            && !re.is_match(line)
        {
            return Err(SerialError::Reply(format!(
                "the device answered {line:?} to the write, not {:?}",
                re.as_str()
            )));
        }
        Ok(())
    }
}

/// How an exchange failed: the port itself, or the device on it.
enum Failure {
    Port(std::io::Error),
    Device(SerialError),
}
