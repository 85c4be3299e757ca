//! Modbus RTU on a serial line, byte by byte: frames cut by their function code's length, the
//! devices of a line answering by slave id (with the line's faults: garbage, duplicated and
//! truncated frames), and the tap that records a real line.
//!
//! tokio-modbus's RTU server writes its answers straight to the port, so a fault could not
//! touch them, and it does not expose its encoder: the answers are encoded here (the function
//! codes `mapper-modbus` uses), the requests decoded by tokio-modbus.

use mapper_serial::checksum::Checksum;
use sim::modbus_sim::{Answer, Sim};
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_modbus::{ExceptionCode, Request, Response};

/// Bytes of a line with no new byte for this long are dropped as noise (a frame half sent).
pub const NOISE_GAP: Duration = Duration::from_millis(100);

/// The length of the request frame at the front of `buf` (CRC included), when it can be told.
pub fn request_len(buf: &[u8]) -> Option<usize> {
    match *buf.get(1)? {
        1..=6 => Some(8),
        15 | 16 => buf.get(6).map(|n| 9 + usize::from(*n)),
        _ => None,
    }
}

/// The length of the answer frame at the front of `buf` (CRC included), when it can be told.
pub fn answer_len(buf: &[u8]) -> Option<usize> {
    let fc = *buf.get(1)?;
    match fc {
        _ if fc & 0x80 != 0 => Some(5),
        1..=4 => buf.get(2).map(|n| 5 + usize::from(*n)),
        5 | 6 | 15 | 16 => Some(8),
        _ => None,
    }
}

/// `frame` with its CRC-16/MODBUS.
pub fn with_crc(frame: Vec<u8>) -> Vec<u8> {
    Checksum::Crc16Modbus.append(frame)
}

/// Whether `frame` ends with its right CRC.
pub fn crc_ok(frame: &[u8]) -> bool {
    Checksum::Crc16Modbus.verify(frame).is_ok()
}

/// Cuts frames off the front of a line's bytes.
#[derive(Debug, Default)]
pub struct Framer {
    buf: Vec<u8>,
}

impl Framer {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, its length told by `len` (`request_len` or `answer_len`); bytes
    /// that cannot start a frame are dropped one at a time.
    pub fn next(&mut self, len: fn(&[u8]) -> Option<usize>) -> Option<Vec<u8>> {
        loop {
            if self.buf.len() < 2 {
                return None;
            }
            match len(&self.buf) {
                Some(n) if self.buf.len() >= n => return Some(self.buf.drain(..n).collect()),
                Some(_) => return None,
                // Not a function code this knows (or a length byte still to come).
                None if self.buf.len() >= 7 || !matches!(self.buf[1], 15 | 16) => {
                    self.buf.remove(0);
                }
                None => return None,
            }
        }
    }

    /// Drops what is left (noise, or a frame cut short), returning it.
    pub fn clear(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Reads what `port` sends next into the framer: `false` once it closed. Bytes left with
    /// no new byte for [`NOISE_GAP`] are dropped as noise first.
    pub async fn fill<P: AsyncRead + Unpin>(&mut self, port: &mut P) -> std::io::Result<bool> {
        let mut chunk = [0u8; 512];
        loop {
            match tokio::time::timeout(NOISE_GAP, port.read(&mut chunk)).await {
                Err(_) => {
                    if !self.is_empty() {
                        let noise = self.clear();
                        tracing::debug!(
                            bytes = noise.len(),
                            "serial line: an incomplete frame dropped"
                        );
                    }
                }
                Ok(Ok(0)) => return Ok(false),
                Ok(Ok(n)) => {
                    self.push(&chunk[..n]);
                    return Ok(true);
                }
                Ok(Err(e)) => return Err(e),
            }
        }
    }
}

fn words(out: &mut Vec<u8>, ws: &[u16]) {
    out.push((ws.len() * 2) as u8);
    for w in ws {
        out.extend_from_slice(&w.to_be_bytes());
    }
}

fn bits(out: &mut Vec<u8>, bs: &[bool]) {
    let packed: Vec<u8> = bs
        .chunks(8)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |b, (i, on)| b | (u8::from(*on) << i))
        })
        .collect();
    out.push(packed.len() as u8);
    out.extend_from_slice(&packed);
}

/// The answer PDU (function code first) of `answer` to a request of function code `fc`; none
/// for silence.
pub fn encode(fc: u8, answer: Answer) -> Option<Vec<u8>> {
    let r = match answer {
        Err(code) => return Some(vec![fc | 0x80, u8::from(code)]),
        Ok(None) => return None,
        Ok(Some(r)) => r,
    };
    let mut out = vec![fc];
    match r {
        Response::ReadCoils(bs) | Response::ReadDiscreteInputs(bs) => bits(&mut out, &bs),
        Response::ReadHoldingRegisters(ws) | Response::ReadInputRegisters(ws) => {
            words(&mut out, &ws)
        }
        Response::WriteSingleCoil(a, on) => {
            out.extend_from_slice(&a.to_be_bytes());
            out.extend_from_slice(if on { &[0xFF, 0] } else { &[0, 0] });
        }
        Response::WriteSingleRegister(a, v) => {
            out.extend_from_slice(&a.to_be_bytes());
            out.extend_from_slice(&v.to_be_bytes());
        }
        Response::WriteMultipleRegisters(a, n) | Response::WriteMultipleCoils(a, n) => {
            out.extend_from_slice(&a.to_be_bytes());
            out.extend_from_slice(&n.to_be_bytes());
        }
        _ => return Some(vec![fc | 0x80, u8::from(ExceptionCode::IllegalFunction)]),
    }
    Some(out)
}

/// Serves the devices `slaves` of one line on `port` (devsim's end of its pty pair) until the
/// port fails. A frame with a wrong CRC or for a slave id nobody has is not answered, as on a
/// bus; a request that reaches a device while it is silent is never answered (it is not
/// answered late, when the master may have moved on to another request).
pub async fn serve_line<P>(mut port: P, slaves: HashMap<u8, Sim>) -> std::io::Result<()>
where
    P: AsyncRead + AsyncWrite + Unpin,
{
    let mut framer = Framer::default();
    while framer.fill(&mut port).await? {
        while let Some(frame) = framer.next(request_len) {
            if !crc_ok(&frame) {
                tracing::debug!("serial line: a request with a wrong CRC ignored");
                continue;
            }
            let Some(sim) = slaves.get(&frame[0]) else {
                continue;
            };
            if sim.edit(|s| s.silent) {
                continue;
            }
            let pdu = &frame[1..frame.len() - 2];
            let answer = match Request::try_from(tokio_modbus::bytes::Bytes::copy_from_slice(pdu)) {
                Ok(req) => sim.respond(req).await,
                Err(_) => Err(ExceptionCode::IllegalFunction),
            };
            let Some(pdu) = encode(frame[1], answer) else {
                continue;
            };
            let out = sim
                .mangle()
                .apply(&with_crc([&[frame[0]], &pdu[..]].concat()));
            port.write_all(&out).await?;
            port.flush().await?;
        }
    }
    Ok(())
}
