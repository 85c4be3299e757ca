//! Recording a real device, and replaying the recording as a simulator, so that a problem seen
//! in the field becomes a test.
//!
//! [`tap`] does the same on a Modbus RTU line (frames written as Modbus/TCP, so that one
//! reader and one replayer serve both). [`proxy`] is a transparent Modbus TCP proxy (put it between a mapper and a device): every
//! byte each way is passed on at once and written, with its time, to a pcap file that Wireshark
//! reads (Ethernet, IPv4 and TCP headers are made up around the Modbus TCP bytes; the device's
//! side is written as port 502, so Wireshark decodes it as Modbus/TCP without being told).
//!
//! [`Recording::read`] takes such a file (or one captured with Wireshark or tcpdump on port 502)
//! and pairs each request with its answer; [`serve`] answers the same request (unit, function,
//! addresses, values) with the answers recorded for it in their order and after the delay they
//! took, then holds the last one or starts over.

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use pcap_file::pcap::{PcapPacket, PcapReader, PcapWriter};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The port the device's side is written as.
pub const MODBUS_PORT: u16 = 502;

/// Why a recording cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Unbuffered: every packet is in the file once written (a recording cut short keeps it all).
type Writer = Arc<Mutex<PcapWriter<std::fs::File>>>;

fn v4(ip: IpAddr) -> [u8; 4] {
    match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => a.to_ipv4_mapped().unwrap_or(Ipv4Addr::LOCALHOST).octets(),
    }
}

/// One proxied connection's two directions, as TCP sequence numbers.
struct Flow {
    client: SocketAddr,
    device: SocketAddr,
    /// Next sequence number from the client, and from the device.
    seq: Mutex<(u32, u32)>,
}

impl Flow {
    /// Writes `data` sent by the client (`to_device`) or by the device.
    fn write(&self, out: &Writer, to_device: bool, data: &[u8]) {
        let (from, to) = if to_device {
            (
                (self.client.ip(), self.client.port()),
                (self.device.ip(), MODBUS_PORT),
            )
        } else {
            (
                (self.device.ip(), MODBUS_PORT),
                (self.client.ip(), self.client.port()),
            )
        };
        let (seq, ack) = {
            let mut s = self.seq.lock().unwrap_or_else(|e| e.into_inner());
            let (client, device) = *s;
            let len = data.len() as u32;
            if to_device {
                s.0 = client.wrapping_add(len);
                (client, device)
            } else {
                s.1 = device.wrapping_add(len);
                (device, client)
            }
        };
        let builder = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(v4(from.0), v4(to.0), 64)
            .tcp(from.1, to.1, seq, 65535)
            .ack(ack)
            .psh();
        let mut frame = Vec::with_capacity(builder.size(data.len()));
        if builder.write(&mut frame, data).is_err() {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let packet = PcapPacket::new(ts, frame.len() as u32, &frame);
        let mut w = out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = w.write_packet(&packet) {
            tracing::warn!(error = %e, "cannot write to the recording");
        }
    }
}

/// A new pcap file.
fn create(out: &Path) -> Result<Writer, RecordError> {
    let bad = |e: String| RecordError::File {
        path: out.display().to_string(),
        message: e,
    };
    let file = std::fs::File::create(out).map_err(|e| bad(e.to_string()))?;
    let writer = PcapWriter::new(file).map_err(|e| bad(e.to_string()))?;
    Ok(Arc::new(Mutex::new(writer)))
}

/// A Modbus TCP frame (MBAP header, then the PDU).
fn mbap(txid: u16, unit: u8, pdu: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(7 + pdu.len());
    out.extend_from_slice(&txid.to_be_bytes());
    out.extend_from_slice(&[0, 0]);
    out.extend_from_slice(&((pdu.len() + 1) as u16).to_be_bytes());
    out.push(unit);
    out.extend_from_slice(pdu);
    out
}

/// Taps a Modbus RTU line: what the mapper writes on `mapper` (devsim's end of the pty pair
/// the mapper opens) goes on to `device` (the real line) and back, at once; each frame is
/// written to `out` as Modbus/TCP (the slave id as the unit id, the CRC checked and left out),
/// so that Wireshark and `devsim replay` read it as a TCP recording. A frame with a wrong CRC
/// (noise on the line) is passed on, logged and counted, not recorded. Runs until either side
/// closes, or until `stop` (Ctrl-C): what it saw is returned either way.
pub async fn tap<M, D, S>(
    mut mapper: M,
    mut device: D,
    out: &Path,
    stop: S,
) -> Result<TapCounts, RecordError>
where
    M: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    D: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    S: std::future::Future<Output = ()>,
{
    let mut stop = std::pin::pin!(stop);
    use crate::rtu::{Framer, answer_len, crc_ok, request_len};
    let writer = create(out)?;
    let flow = Flow {
        client: SocketAddr::from(([10, 0, 0, 1], 40000)),
        device: SocketAddr::from(([10, 0, 0, 2], MODBUS_PORT)),
        seq: Mutex::new((1, 1)),
    };
    let (mut requests, mut answers) = (Framer::default(), Framer::default());
    let mut counts = TapCounts::default();
    let mut txid: u16 = 0;
    let (mut a, mut b) = ([0u8; 512], [0u8; 512]);
    loop {
        tokio::select! {
            () = &mut stop => break,
            r = mapper.read(&mut a) => {
                let n = r?;
                if n == 0 { break; }
                device.write_all(&a[..n]).await?;
                requests.push(&a[..n]);
                while let Some(f) = requests.next(request_len) {
                    if crc_ok(&f) {
                        txid = txid.wrapping_add(1);
                        counts.requests += 1;
                        flow.write(&writer, true, &mbap(txid, f[0], &f[1..f.len() - 2]));
                    } else {
                        counts.bad_crc += 1;
                        tracing::warn!(frame = %mapper_serial::field::hex(&f), "a request with a wrong CRC");
                    }
                }
            }
            r = device.read(&mut b) => {
                let n = r?;
                if n == 0 { break; }
                mapper.write_all(&b[..n]).await?;
                answers.push(&b[..n]);
                while let Some(f) = answers.next(answer_len) {
                    if crc_ok(&f) {
                        counts.answers += 1;
                        flow.write(&writer, false, &mbap(txid, f[0], &f[1..f.len() - 2]));
                    } else {
                        counts.bad_crc += 1;
                        tracing::warn!(frame = %mapper_serial::field::hex(&f), "an answer with a wrong CRC");
                    }
                }
            }
            () = tokio::time::sleep(crate::rtu::NOISE_GAP) => {
                for (what, f) in [("request", &mut requests), ("answer", &mut answers)] {
                    if !f.is_empty() {
                        let bytes = f.clear();
                        counts.incomplete += 1;
                        tracing::warn!(what, bytes = %mapper_serial::field::hex(&bytes), "an incomplete frame on the line");
                    }
                }
            }
        }
    }
    Ok(counts)
}

/// What a tap saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TapCounts {
    pub requests: u64,
    pub answers: u64,
    pub bad_crc: u64,
    pub incomplete: u64,
}

/// Proxies every connection of `listener` to `device`, writing both directions to `out` (a new
/// pcap file), until the task is dropped.
pub async fn proxy(listener: TcpListener, device: String, out: &Path) -> Result<(), RecordError> {
    let writer = create(out)?;
    loop {
        let (client, peer) = listener.accept().await?;
        let (device, writer) = (device.clone(), writer.clone());
        tokio::spawn(async move {
            let upstream = match TcpStream::connect(&device).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(%device, error = %e, "the device cannot be reached; the client is dropped");
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let flow = Flow {
                client: peer,
                device: upstream
                    .peer_addr()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], MODBUS_PORT))),
                seq: Mutex::new((1, 1)),
            };
            let (cr, cw) = client.into_split();
            let (dr, dw) = upstream.into_split();
            tokio::join!(
                pump(cr, dw, &flow, &writer, true),
                pump(dr, cw, &flow, &writer, false)
            );
        });
    }
}

/// Passes what `from` sends on to `to` as it comes, writing it to the recording; shuts `to`
/// down when `from` ends.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    flow: &Flow,
    out: &Writer,
    to_device: bool,
) {
    let mut buf = vec![0u8; 4096];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        flow.write(out, to_device, &buf[..n]);
    }
    let _ = to.shutdown().await;
}

/// A Modbus TCP frame: transaction id, unit, PDU (function code first).
struct Frame {
    txid: u16,
    unit: u8,
    pdu: Vec<u8>,
}

/// Takes the complete MBAP frames off the front of `buf`.
fn frames(buf: &mut Vec<u8>) -> Vec<Frame> {
    let mut out = Vec::new();
    while buf.len() >= 7 {
        let len = usize::from(u16::from_be_bytes([buf[4], buf[5]]));
        if !(2..=254).contains(&len) {
            // Not Modbus TCP (or out of step): drop what is there.
            buf.clear();
            break;
        }
        if buf.len() < 6 + len {
            break;
        }
        out.push(Frame {
            txid: u16::from_be_bytes([buf[0], buf[1]]),
            unit: buf[6],
            pdu: buf[7..6 + len].to_vec(),
        });
        buf.drain(..6 + len);
    }
    out
}

/// A request and what was answered to it each time, with the delay of each answer.
pub type Answers = Vec<(Vec<u8>, Duration)>;

/// A request as the recording knows it: the unit, then the request's PDU.
pub type Request = (u8, Vec<u8>);

/// The exchanges of a recording, by request (unit, then the request's PDU).
#[derive(Debug, Default)]
pub struct Recording {
    pub exchanges: BTreeMap<Request, Answers>,
    /// Units asked and never answering in the recording (a slave that was off the line): they
    /// stay silent when it is served.
    pub silent: std::collections::BTreeSet<u8>,
}

impl Recording {
    /// Reads a pcap file of Modbus TCP on port 502 (or on the port of the first packet's
    /// destination when none is 502).
    pub fn read(path: &Path) -> Result<Self, RecordError> {
        let bad = |m: String| RecordError::File {
            path: path.display().to_string(),
            message: m,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        let mut reader =
            PcapReader::new(io::BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
        // By connection (client address and port, device address): bytes each way not yet
        // framed, and the requests waiting for an answer by transaction id.
        type Conn = ([u8; 16], u16, [u8; 16]);
        let mut streams: HashMap<(Conn, bool), Vec<u8>> = HashMap::new();
        let mut waiting: HashMap<(Conn, u16), (u8, Vec<u8>, Duration)> = HashMap::new();
        let mut server_port: Option<u16> = None;
        let mut rec = Recording::default();
        let mut asked = std::collections::BTreeSet::new();
        while let Some(p) = reader.next_packet() {
            let p = p.map_err(|e| bad(e.to_string()))?;
            let Ok(s) = SlicedPacket::from_ethernet(&p.data) else {
                continue;
            };
            let (src, dst) = match &s.net {
                Some(NetSlice::Ipv4(ip)) => (
                    IpAddr::from(ip.header().source()),
                    IpAddr::from(ip.header().destination()),
                ),
                Some(NetSlice::Ipv6(ip)) => (
                    IpAddr::from(ip.header().source()),
                    IpAddr::from(ip.header().destination()),
                ),
                _ => continue,
            };
            let Some(TransportSlice::Tcp(tcp)) = &s.transport else {
                continue;
            };
            let payload = tcp.payload();
            if payload.is_empty() {
                continue;
            }
            let (sp, dp) = (tcp.source_port(), tcp.destination_port());
            let server = *server_port.get_or_insert(if sp == MODBUS_PORT { sp } else { dp });
            let request = dp == server;
            let ip16 = |a: IpAddr| match a {
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
                IpAddr::V6(a) => a.octets(),
            };
            let conn: Conn = if request {
                (ip16(src), sp, ip16(dst))
            } else {
                (ip16(dst), dp, ip16(src))
            };
            let buf = streams.entry((conn, request)).or_default();
            buf.extend_from_slice(payload);
            for f in frames(buf) {
                if request {
                    asked.insert(f.unit);
                    waiting.insert((conn, f.txid), (f.unit, f.pdu, p.timestamp));
                } else if let Some((unit, req, at)) = waiting.remove(&(conn, f.txid)) {
                    let delay = p.timestamp.saturating_sub(at);
                    rec.exchanges
                        .entry((unit, req))
                        .or_default()
                        .push((f.pdu, delay));
                }
            }
        }
        let answered: std::collections::BTreeSet<u8> =
            rec.exchanges.keys().map(|(unit, _)| *unit).collect();
        rec.silent = asked
            .into_iter()
            .filter(|u| !answered.contains(u))
            .collect();
        if rec.exchanges.is_empty() && rec.silent.is_empty() {
            return Err(bad("no Modbus TCP request in it".into()));
        }
        Ok(rec)
    }

    /// How many answers were recorded.
    pub fn answers(&self) -> usize {
        self.exchanges.values().map(Vec::len).sum()
    }
}

/// How a recording is served.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// After the last answer to a request, start over at its first (default: hold the last).
    pub looping: bool,
    /// Answer at once instead of after the recorded delay.
    pub no_timing: bool,
    /// The answer to a request the recording does not have.
    pub unknown: Unknown,
}

/// The answer to a request that was never recorded (`--unknown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// A Modbus exception with this code (default 2, illegal data address).
    Exception(u8),
    /// A write is answered as done (functions 5, 6, 15, 16 echo what a device echoes); a
    /// read still gets exception 2, there being no value to give.
    Accept,
    /// No answer, as from a device that ignores it.
    Silent,
}

impl Default for Unknown {
    fn default() -> Self {
        Self::Exception(2)
    }
}

impl std::str::FromStr for Unknown {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "accept" => Ok(Self::Accept),
            "silent" => Ok(Self::Silent),
            _ => match s.strip_prefix("exception:").map(str::parse::<u8>) {
                Some(Ok(c)) if c > 0 => Ok(Self::Exception(c)),
                _ => Err(format!(
                    "{s:?}: give accept, silent or exception:CODE (1 to 255)"
                )),
            },
        }
    }
}

/// A device's answer to a write it did: 5 and 6 echo the request, 15 and 16 its address and
/// count. `None` for anything else.
fn write_done(pdu: &[u8]) -> Option<Vec<u8>> {
    match pdu.first()? {
        5 | 6 if pdu.len() == 5 => Some(pdu.to_vec()),
        15 | 16 if pdu.len() >= 5 => Some(pdu[..5].to_vec()),
        _ => None,
    }
}

/// A recording being served: the next answer of each request, shared by every connection.
struct Replayer {
    rec: Recording,
    cursors: Mutex<HashMap<Request, usize>>,
    options: ReplayOptions,
}

impl Replayer {
    /// The answer PDU to `pdu` from `unit`, and the delay to answer it after: the next one
    /// recorded; a unit that never answered in the recording gives none; a request not in the
    /// recording gets what [`Unknown`] says. `None`: no answer.
    fn answer(&self, unit: u8, pdu: &[u8]) -> Option<(Vec<u8>, Duration)> {
        if self.rec.silent.contains(&unit) {
            return None;
        }
        let key = (unit, pdu.to_vec());
        let answer = self.rec.exchanges.get(&key).map(|answers| {
            let mut c = self.cursors.lock().unwrap_or_else(|e| e.into_inner());
            let i = c.entry(key.clone()).or_insert(0);
            let a = answers[(*i).min(answers.len() - 1)].clone();
            *i = if *i + 1 < answers.len() {
                *i + 1
            } else if self.options.looping {
                0
            } else {
                *i
            };
            a
        });
        let (pdu, delay) = match answer {
            Some(a) => a,
            None => {
                tracing::debug!(unit, "a request not in the recording");
                let exception = |code: u8| vec![pdu.first().copied().unwrap_or(0) | 0x80, code];
                let made = match self.options.unknown {
                    Unknown::Silent => return None,
                    Unknown::Exception(code) => exception(code),
                    Unknown::Accept => write_done(pdu).unwrap_or_else(|| exception(2)),
                };
                (made, Duration::ZERO)
            }
        };
        if self.options.no_timing {
            Some((pdu, Duration::ZERO))
        } else {
            Some((pdu, delay))
        }
    }
}

/// Serves `rec` on `listener` (Modbus TCP) until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    rec: Recording,
    options: ReplayOptions,
) -> io::Result<()> {
    let replayer = Arc::new(Replayer {
        rec,
        cursors: Mutex::default(),
        options,
    });
    loop {
        let (mut stream, _) = listener.accept().await?;
        let replayer = replayer.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 1024];
            loop {
                let n = match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                for f in frames(&mut buf) {
                    let Some((pdu, delay)) = replayer.answer(f.unit, &f.pdu) else {
                        continue;
                    };
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    if stream.write_all(&mbap(f.txid, f.unit, &pdu)).await.is_err() {
                        return;
                    }
                }
            }
        });
    }
}

/// Serves `rec` as Modbus RTU on `line` (devsim's end of a pty pair, or a real serial port)
/// until it closes: each request with a right CRC answered by its slave id as recorded.
pub async fn serve_line<L>(mut line: L, rec: Recording, options: ReplayOptions) -> io::Result<()>
where
    L: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use crate::rtu::{Framer, crc_ok, request_len, with_crc};
    let replayer = Replayer {
        rec,
        cursors: Mutex::default(),
        options,
    };
    let mut framer = Framer::default();
    while framer.fill(&mut line).await? {
        while let Some(f) = framer.next(request_len) {
            if !crc_ok(&f) {
                continue;
            }
            let Some((pdu, delay)) = replayer.answer(f[0], &f[1..f.len() - 2]) else {
                continue;
            };
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            line.write_all(&with_crc([&[f[0]], &pdu[..]].concat()))
                .await?;
            line.flush().await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replayer(unknown: Unknown) -> Replayer {
        let mut rec = Recording::default();
        // Unit 1 answered a read of holding register 0; unit 7 was asked and never answered.
        rec.exchanges.insert(
            (1, vec![3, 0, 0, 0, 1]),
            vec![(vec![3, 2, 0, 42], Duration::from_millis(5))],
        );
        rec.silent.insert(7);
        Replayer {
            rec,
            cursors: Mutex::default(),
            options: ReplayOptions {
                no_timing: true,
                unknown,
                ..ReplayOptions::default()
            },
        }
    }

    #[test]
    fn a_slave_that_never_answered_stays_silent_and_unknown_requests_get_the_chosen_answer() {
        let write = [6, 0, 1, 0, 9];
        let read = [3, 0, 5, 0, 1];
        let r = replayer(Unknown::default());
        assert_eq!(
            r.answer(1, &[3, 0, 0, 0, 1]),
            Some((vec![3, 2, 0, 42], Duration::ZERO))
        );
        assert_eq!(r.answer(7, &[3, 0, 0, 0, 1]), None, "silent as recorded");
        assert_eq!(r.answer(1, &write).map(|a| a.0), Some(vec![0x86, 2]));
        let r = replayer(Unknown::Exception(4));
        assert_eq!(r.answer(1, &write).map(|a| a.0), Some(vec![0x86, 4]));
        let r = replayer(Unknown::Accept);
        assert_eq!(r.answer(1, &write).map(|a| a.0), Some(write.to_vec()));
        assert_eq!(
            r.answer(1, &[16, 0, 2, 0, 2, 4, 0, 1, 0, 2]).map(|a| a.0),
            Some(vec![16, 0, 2, 0, 2])
        );
        assert_eq!(r.answer(1, &read).map(|a| a.0), Some(vec![0x83, 2]));
        let r = replayer(Unknown::Silent);
        assert_eq!(r.answer(1, &write), None);
        for (text, want) in [
            ("accept", Ok(Unknown::Accept)),
            ("silent", Ok(Unknown::Silent)),
            ("exception:11", Ok(Unknown::Exception(11))),
        ] {
            assert_eq!(text.parse::<Unknown>(), want);
        }
        for bad in ["exception:0", "exception:256", "refuse", ""] {
            let e = bad.parse::<Unknown>().expect_err(bad);
            assert!(e.contains("accept, silent or exception:CODE"), "{e}");
        }
    }
}
