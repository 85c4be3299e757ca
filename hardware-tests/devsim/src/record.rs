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
/// closes.
pub async fn tap<M, D>(mut mapper: M, mut device: D, out: &Path) -> Result<TapCounts, RecordError>
where
    M: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    D: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
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
        if rec.exchanges.is_empty() {
            return Err(bad("no Modbus TCP request with its answer in it".into()));
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
}

/// A recording being served: the next answer of each request, shared by every connection.
struct Replayer {
    rec: Recording,
    cursors: Mutex<HashMap<Request, usize>>,
    options: ReplayOptions,
}

impl Replayer {
    /// The answer PDU to `pdu` from `unit`, and the delay to answer it after: the next one
    /// recorded; a request not in the recording gets exception 2 (illegal data address).
    fn answer(&self, unit: u8, pdu: &[u8]) -> (Vec<u8>, Duration) {
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
        let (pdu, delay) = answer.unwrap_or_else(|| {
            tracing::debug!(unit, "a request not in the recording");
            (
                vec![pdu.first().copied().unwrap_or(0) | 0x80, 2],
                Duration::ZERO,
            )
        });
        if self.options.no_timing {
            (pdu, Duration::ZERO)
        } else {
            (pdu, delay)
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
                    let (pdu, delay) = replayer.answer(f.unit, &f.pdu);
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
            let (pdu, delay) = replayer.answer(f[0], &f[1..f.len() - 2]);
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
