//! Devices with their own serial protocols (`mapper-serial`): ASCII lines matched by a
//! visitor's `pattern`, binary frames with fields and checksums. Each property is read by the
//! mapper's own parser of visitors; the simulator answers each request the visitors make with
//! a reply built from them (a line the patterns match, a frame with each field where it is)
//! and checks, with the mapper's own decoder, that the reply reads back as the value held.

use mapper_serial::device::{Mode, Point, Port, Reading, Reply, TextType};
use mapper_serial::field::parse_hex;
use regex_syntax::hir::{Class, Hir, HirKind};
use sim::modbus_sim::Sim;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A text that `hir` matches, with `value` as the text of group `capture` (a name or an
/// index); none when the pattern has no such group.
fn sample(hir: &Hir, capture: &str, value: &str, out: &mut String) -> bool {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => false,
        HirKind::Literal(l) => {
            out.push_str(&String::from_utf8_lossy(&l.0));
            false
        }
        HirKind::Class(c) => {
            out.push(pick(c));
            false
        }
        HirKind::Repetition(r) => {
            let mut found = false;
            for _ in 0..r.min {
                found |= sample(&r.sub, capture, value, out);
            }
            found
        }
        HirKind::Capture(c) => {
            let this = c.name.as_deref() == Some(capture) || c.index.to_string() == capture;
            if this {
                out.push_str(value);
                true
            } else {
                sample(&c.sub, capture, value, out)
            }
        }
        HirKind::Concat(hs) => hs
            .iter()
            .fold(false, |found, h| sample(h, capture, value, out) | found),
        HirKind::Alternation(hs) => hs.first().is_some_and(|h| sample(h, capture, value, out)),
    }
}

/// A character of a class, readable where it can be: a space, a letter, a digit.
fn pick(c: &Class) -> char {
    let chars: Vec<(char, char)> = match c {
        Class::Unicode(u) => u.ranges().iter().map(|r| (r.start(), r.end())).collect(),
        Class::Bytes(b) => b
            .ranges()
            .iter()
            .map(|r| (char::from(r.start()), char::from(r.end())))
            .collect(),
    };
    [' ', 'a', 'A', '0']
        .into_iter()
        .find(|x| chars.iter().any(|(s, e)| s <= x && x <= e))
        .or_else(|| chars.first().map(|(s, _)| *s))
        .unwrap_or(' ')
}

/// How `value` is written as the device would send it: the raw number before the visitor's
/// `scale`, a boolean as each of the words the mapper takes.
fn raw_texts(text_type: TextType, scale: &mapper_serial::field::Scale, value: &str) -> Vec<String> {
    let v = value.trim();
    match text_type {
        TextType::String => vec![v.to_string()],
        TextType::Boolean => {
            let on = matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes");
            if on {
                ["1", "ON", "true", "yes"]
            } else {
                ["0", "OFF", "false", "no"]
            }
            .map(String::from)
            .to_vec()
        }
        TextType::Int | TextType::Float => match v.parse::<f64>() {
            Ok(x) if !scale.is_identity() => {
                let raw = scale.invert(x);
                if text_type == TextType::Int {
                    vec![format!("{}", raw.round() as i64)]
                } else {
                    vec![raw.to_string()]
                }
            }
            Ok(x) if text_type == TextType::Int => vec![format!("{}", x.round() as i64)],
            _ => vec![v.to_string()],
        },
    }
}

/// How far what the mapper reads may be from the value held: half a step of an integer (a
/// ramp's 2.4 is held as 2), a float's rounding.
fn resolution(point: &Point) -> Resolution {
    use mapper_serial::field::Kind;
    match &point.reading {
        Reading::Ascii {
            text_type: TextType::Int,
            scale,
            ..
        } => Resolution::Absolute(0.5 * scale.scale.abs()),
        Reading::Binary { field, .. } => match field.kind {
            Kind::Int { .. } => Resolution::Absolute(0.5 * field.scale.scale.abs()),
            Kind::Float32 => Resolution::Relative(1e-6),
            _ => Resolution::Relative(1e-9),
        },
        Reading::Ascii { .. } => Resolution::Relative(1e-9),
    }
}

#[derive(Clone, Copy)]
enum Resolution {
    Absolute(f64),
    Relative(f64),
}

/// Whether the mapper reading `got` holds `want` (numbers within `r`).
fn same(got: &str, want: &str, r: Resolution) -> bool {
    if got == want.trim() {
        return true;
    }
    match (got.parse::<f64>(), want.trim().parse::<f64>()) {
        (Ok(a), Ok(b)) => {
            let d = (a - b).abs();
            match r {
                Resolution::Absolute(x) => d <= x + 1e-9,
                Resolution::Relative(x) => d <= x * a.abs().max(b.abs()).max(1.0),
            }
        }
        _ => matches!(
            (got, want.trim().to_ascii_lowercase().as_str()),
            ("true", "1" | "on" | "yes") | ("false", "0" | "off" | "no")
        ),
    }
}

/// The part of an ASCII reply that carries `value` for `point`, checked by reading it back
/// with the mapper's decoder; or why the pattern cannot carry it.
pub fn fragment(point: &Point, value: &str) -> Result<String, String> {
    let Reading::Ascii {
        pattern,
        capture,
        text_type,
        scale,
    } = &point.reading
    else {
        return Err("not an ASCII property".into());
    };
    let hir = regex_syntax::parse(pattern.as_str())
        .map_err(|e| format!("pattern {:?}: {e}", pattern.as_str()))?;
    let mut tried = Vec::new();
    for raw in raw_texts(*text_type, scale, value) {
        let mut line = String::new();
        if !sample(&hir, capture, &raw, &mut line) && capture != "0" {
            return Err(format!("pattern has no group {capture}"));
        }
        if capture == "0" {
            line = raw.clone();
        }
        match point.decode(&Reply::Line(line.clone())) {
            Ok(got) if same(&got, value, resolution(point)) => return Ok(line),
            Ok(got) => tried.push(format!("{line:?} reads as {got:?}")),
            Err(e) => tried.push(e.to_string()),
        }
    }
    Err(format!(
        "devsim cannot make a reply that pattern {:?} reads as {value:?} ({})",
        pattern.as_str(),
        tried.join("; ")
    ))
}

/// The reply line (without terminator) to the request that `points` share, each with its
/// value; checked by reading every value back from it.
pub fn line(points: &[(&Point, String)]) -> Result<String, String> {
    let parts = points
        .iter()
        .map(|(p, v)| fragment(p, v))
        .collect::<Result<Vec<_>, _>>()?;
    let line = parts.join(" ");
    for (p, v) in points {
        match p.decode(&Reply::Line(line.clone())) {
            Ok(got) if same(&got, v, resolution(p)) => {}
            other => {
                return Err(format!(
                    "in the reply {line:?} that {} shares, {} reads as {other:?}, not {v:?}",
                    points.len(),
                    p.name
                ));
            }
        }
    }
    Ok(line)
}

/// The reply frame (checksum included) to the binary request that `points` share.
pub fn frame(port: &Port, points: &[(&Point, String)]) -> Result<Vec<u8>, String> {
    let mut body: Option<Vec<u8>> = None;
    for (p, v) in points {
        let Reading::Binary {
            length,
            prefix,
            field,
        } = &p.reading
        else {
            return Err(format!("{} is not a binary property", p.name));
        };
        let b = body.get_or_insert_with(|| {
            let mut b = vec![0u8; length.saturating_sub(port.checksum.width())];
            let n = prefix.len().min(b.len());
            b[..n].copy_from_slice(&prefix[..n]);
            b
        });
        let bytes = field.encode(v).map_err(|e| format!("{}: {e}", p.name))?;
        let at = field.offset;
        if at + bytes.len() > b.len() {
            return Err(format!("{}: the field does not fit the reply", p.name));
        }
        if matches!(field.kind, mapper_serial::field::Kind::Bit(_)) {
            b[at] |= bytes.first().copied().unwrap_or(0);
        } else {
            b[at..at + bytes.len()].copy_from_slice(&bytes);
        }
    }
    let frame = port.checksum.append(body.unwrap_or_default());
    for (p, v) in points {
        match p.decode(&Reply::Frame(frame.clone())) {
            Ok(got) if same(&got, v, resolution(p)) => {}
            other => return Err(format!("{} reads back as {other:?}, not {v:?}", p.name)),
        }
    }
    Ok(frame)
}

/// What `point` holds at the start: zero, `false`, or for text the shortest the pattern
/// takes.
pub fn initial(port: &Port, point: &Point) -> String {
    let first = match &point.reading {
        Reading::Binary { field, .. } => match field.kind {
            mapper_serial::field::Kind::Bit(_) => "false",
            _ => "0",
        },
        Reading::Ascii { text_type, .. } => match text_type {
            TextType::Boolean => "false",
            TextType::Int | TextType::Float => "0",
            TextType::String => "",
        },
    };
    if check(port, point, first).is_ok() {
        return first.into();
    }
    // Text the pattern's own group takes, as the mapper reads it.
    if let Reading::Ascii { pattern, .. } = &point.reading
        && let Ok(h) = regex_syntax::parse(pattern.as_str())
    {
        let mut line = String::new();
        sample(&h, "", "", &mut line);
        if let Ok(v) = point.decode(&Reply::Line(line)) {
            return v;
        }
    }
    first.into()
}

/// `value` as `point` holds it (what the mapper reads: an integer rounded), or why it cannot.
pub fn check(port: &Port, point: &Point, value: &str) -> Result<String, String> {
    let reply = match port.mode {
        Mode::Ascii => Reply::Line(fragment(point, value)?),
        Mode::Binary => Reply::Frame(frame(port, &[(point, value.to_string())])?),
    };
    point.decode(&reply).map_err(|e| e.to_string())
}

/// One device of a line: its settings, its properties and their simulator.
pub struct LineDevice {
    pub id: String,
    pub port: Port,
    pub points: Vec<Point>,
    pub sim: Sim,
}

impl LineDevice {
    fn value(&self, p: &Point) -> String {
        self.sim
            .edit(|s| s.text.get(&p.name).cloned())
            .unwrap_or_default()
    }

    /// The answer to a request that ends at the front of `buf`, with how many bytes it took;
    /// `Some((n, None))`: taken, no answer; `None`: not this device's.
    fn answer(&self, buf: &[u8]) -> Option<(usize, Option<Vec<u8>>)> {
        match self.port.mode {
            Mode::Ascii => self.answer_line(buf),
            Mode::Binary => self.answer_frame(buf),
        }
    }

    fn answer_line(&self, buf: &[u8]) -> Option<(usize, Option<Vec<u8>>)> {
        let t = &self.port.request_terminator;
        let end = buf.windows(t.len()).position(|w| w == t.as_slice())?;
        let text = String::from_utf8_lossy(&buf[..end]).to_string();
        let taken = end + t.len();
        let reads: Vec<(&Point, String)> = self
            .points
            .iter()
            .filter(|p| p.request.strip_suffix(t.as_slice()) == Some(&buf[..end]))
            .map(|p| (p, self.value(p)))
            .collect();
        if !reads.is_empty() {
            return Some(match line(&reads) {
                Ok(l) => (taken, Some(self.terminated(l))),
                Err(e) => {
                    tracing::warn!(device = %self.id, error = %e, "no reply");
                    (taken, None)
                }
            });
        }
        for p in &self.points {
            let Some(w) = &p.writing else { continue };
            let Some(v) = text
                .strip_prefix(w.before.as_str())
                .and_then(|r| r.strip_suffix(w.after.as_str()))
            else {
                continue;
            };
            self.hold(p, v);
            let reply = w.ascii_reply.as_ref().map(|re| {
                let mut s = String::new();
                if let Ok(h) = regex_syntax::parse(re.as_str()) {
                    sample(&h, "", "", &mut s);
                }
                self.terminated(s)
            });
            return Some((taken, reply));
        }
        None
    }

    fn terminated(&self, line: String) -> Vec<u8> {
        let mut b = line.into_bytes();
        b.extend_from_slice(&self.port.terminator);
        b
    }

    fn answer_frame(&self, buf: &[u8]) -> Option<(usize, Option<Vec<u8>>)> {
        if let Some(first) = self.points.iter().find(|p| buf.starts_with(&p.request)) {
            let reads: Vec<(&Point, String)> = self
                .points
                .iter()
                .filter(|p| p.request == first.request)
                .map(|p| (p, self.value(p)))
                .collect();
            return Some(match frame(&self.port, &reads) {
                Ok(f) => (first.request.len(), Some(f)),
                Err(e) => {
                    tracing::warn!(device = %self.id, error = %e, "no reply");
                    (first.request.len(), None)
                }
            });
        }
        for p in &self.points {
            let (Some(w), Reading::Binary { field, .. }) = (&p.writing, &p.reading) else {
                continue;
            };
            let (Ok(before), Ok(after)) = (parse_hex(&w.before), parse_hex(&w.after)) else {
                continue;
            };
            let len = before.len() + field.kind.width() + after.len() + self.port.checksum.width();
            if buf.len() < len || !buf.starts_with(&before) {
                continue;
            }
            let mut at = field.clone();
            at.offset = before.len();
            if let Ok(v) = at.decode(&buf[..len]) {
                self.hold(p, &v);
            }
            let reply = (w.binary_reply > 0).then(|| {
                let n = w.binary_reply.saturating_sub(self.port.checksum.width());
                let mut body: Vec<u8> = buf[..n.min(len)].to_vec();
                body.resize(n, 0);
                self.port.checksum.append(body)
            });
            return Some((len, reply));
        }
        None
    }

    fn hold(&self, p: &Point, v: &str) {
        match check(&self.port, p, v) {
            Ok(held) => {
                self.sim.edit(|s| s.text.insert(p.name.clone(), held));
            }
            Err(e) => {
                tracing::warn!(device = %self.id, property = %p.name, error = %e, "a write not held")
            }
        }
    }

    /// Whether the front of `buf` may still become one of this device's requests.
    fn may_grow(&self, buf: &[u8]) -> bool {
        match self.port.mode {
            // Until its line is complete.
            Mode::Ascii => {
                let t = &self.port.request_terminator;
                !buf.windows(t.len()).any(|w| w == t.as_slice())
            }
            Mode::Binary => self.points.iter().any(|p| {
                p.request.starts_with(buf)
                    || p.writing.as_ref().is_some_and(|w| {
                        parse_hex(&w.before)
                            .is_ok_and(|b| b.starts_with(&buf[..buf.len().min(b.len())]))
                    })
            }),
        }
    }
}

/// Serves the devices of one serial line on `stream` (devsim's end of its pty pair) until it
/// fails: each request answered by the first device that knows it; a device that is silent
/// takes its requests without answering; bytes nobody knows are dropped.
pub async fn serve<S>(
    mut stream: S,
    devices: std::sync::Arc<Vec<LineDevice>>,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        match tokio::time::timeout(crate::rtu::NOISE_GAP, stream.read(&mut chunk)).await {
            Err(_) => {
                buf.clear();
                continue;
            }
            Ok(Ok(0)) => return Ok(()),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(e)) => return Err(e),
        }
        while !buf.is_empty() {
            let found = devices.iter().find_map(|d| d.answer(&buf).map(|a| (d, a)));
            let Some((d, (taken, reply))) = found else {
                if devices.iter().any(|d| d.may_grow(&buf)) {
                    break;
                }
                buf.remove(0);
                continue;
            };
            buf.drain(..taken);
            let (silent, delay) = d.sim.edit(|s| (s.silent, s.delay));
            d.sim
                .requests
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(reply) = reply.filter(|_| !silent) else {
                continue;
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay.min(Duration::from_secs(120))).await;
            }
            stream.write_all(&d.sim.mangle().apply(&reply)).await?;
            stream.flush().await?;
        }
        if buf.len() > 64 * 1024 {
            buf.clear();
        }
    }
}

/// A `mapper-serial` device of the manifests (`device` with its model's defaults merged), its
/// properties read by the mapper's own parser; or every problem, with its field path.
/// Properties in `named` were already named by the gateway's validators.
pub fn layout(
    id: &str,
    device: &api::v1beta1::Device,
    model: &api::v1beta1::DeviceModel,
    config: &serde_json::Map<String, serde_json::Value>,
    named: &[String],
) -> Result<crate::device::SimDevice, Vec<(String, String)>> {
    use crate::device::{SimDevice, SimPoint, Visit};
    let port = Port::from_config(config)
        .map_err(|e| vec![(format!("spec.protocol.configData.{}", e.key), e.reason)])?;
    let mut errors = Vec::new();
    let mut points: Vec<SimPoint> = Vec::new();
    for (at, p, mp, visitor) in crate::device::properties(device, model, named, &mut errors) {
        let num = |s: Option<&String>| s.and_then(|v| v.trim().parse::<f64>().ok());
        let ty = mp
            .and_then(|m| m.type_)
            .map(|t| t.as_str().to_ascii_lowercase());
        let point = match Point::from_config(
            &port,
            &p.name,
            visitor,
            ty.as_deref(),
            num(mp.and_then(|m| m.minimum.as_ref())),
            num(mp.and_then(|m| m.maximum.as_ref())),
        ) {
            Ok(pt) => pt,
            Err(e) => {
                errors.push((format!("{at}.visitors.configData.{}", e.key), e.reason));
                continue;
            }
        };
        let initial = initial(&port, &point);
        if let Err(e) = check(&port, &point, &initial) {
            let key = if port.mode == Mode::Ascii {
                "pattern"
            } else {
                "offset"
            };
            errors.push((format!("{at}.visitors.configData.{key}"), e));
            continue;
        }
        points.push(SimPoint::of(p, mp, initial, Visit::Serial(point)));
    }
    // Properties read by one request must fit one reply together.
    let serial_points: Vec<(&Point, String)> = points
        .iter()
        .filter_map(|p| match &p.point {
            Visit::Serial(s) => Some((s, p.initial.clone())),
            _ => None,
        })
        .collect();
    for (k, (first, _)) in serial_points.iter().enumerate() {
        if serial_points[..k]
            .iter()
            .any(|(o, _)| o.request == first.request)
        {
            continue;
        }
        let shared: Vec<(&Point, String)> = serial_points
            .iter()
            .filter(|(o, _)| o.request == first.request)
            .map(|(o, v)| (*o, v.clone()))
            .collect();
        let made = match port.mode {
            Mode::Ascii => line(&shared).map(|_| ()),
            Mode::Binary => frame(&port, &shared).map(|_| ()),
        };
        if let Err(e) = made {
            let i = device
                .spec
                .properties
                .iter()
                .position(|p| p.name == first.name)
                .unwrap_or(0);
            errors.push((
                format!("spec.properties[{i}].visitors.configData.request"),
                e,
            ));
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok(SimDevice {
        serial: Some(port),
        ..SimDevice::bare(id, points)
    })
}
