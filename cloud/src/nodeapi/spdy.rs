//! SPDY/3.1 framing, as much of it as `kubectl port-forward` speaks (the kubelet's streaming
//! protocol, carried either over an HTTP upgrade to `SPDY/3.1` or, since kubectl 1.31, inside
//! a websocket): frames parsed from and written to a byte stream, and the header blocks'
//! compression (zlib, one stream per direction for the whole connection, primed with SPDY/3's
//! dictionary).
//!
//! A frame starts with 8 bytes. A control frame: the control bit and the version (15 bits),
//! its type (16 bits), flags (8 bits), the payload's length (24 bits). A data frame: the
//! stream's id (31 bits, control bit 0), flags, the length. All numbers are big-endian.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use std::sync::OnceLock;

/// The only version spoken.
pub(super) const VERSION: u16 = 3;
/// The last frame of a stream from its sender.
pub(super) const FLAG_FIN: u8 = 0x01;
/// The largest frame accepted (a 24-bit length allows 16 MiB; kubectl writes 32 KiB).
pub(super) const MAX_FRAME: usize = 1 << 20;
/// The most bytes a header block may inflate to.
pub(super) const MAX_HEADERS: usize = 16 * 1024;

/// `RST_STREAM` and `GOAWAY` status codes.
pub(super) mod status {
    pub(crate) const PROTOCOL_ERROR: u32 = 1;
    pub(crate) const REFUSED_STREAM: u32 = 3;
    pub(crate) const STREAM_IN_USE: u32 = 8;
}

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// One frame; a header block stays compressed here (see [`Inflater`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    SynStream {
        stream: u32,
        fin: bool,
        block: Vec<u8>,
    },
    SynReply {
        stream: u32,
        fin: bool,
        block: Vec<u8>,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Ping(u32),
    GoAway {
        last: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        fin: bool,
        block: Vec<u8>,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    /// `SETTINGS` or a control type this side does not know (SPDY says: ignore it).
    Ignored(u16),
}

/// Why bytes are not a SPDY/3 frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Error {
    #[error("SPDY version {0} (only version 3 is spoken)")]
    Version(u16),
    #[error("a SPDY frame of {0} bytes (at most {MAX_FRAME} are taken)")]
    TooLarge(usize),
    #[error("a SPDY control frame of type {kind} with {len} bytes is too short")]
    Short { kind: u16, len: usize },
    #[error("a SPDY header block: {0}")]
    Headers(String),
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

impl Frame {
    /// One frame from the start of `buf` and the bytes it took; `None` while `buf` holds less
    /// than a whole frame.
    pub(super) fn parse(buf: &[u8]) -> Result<Option<(Frame, usize)>, Error> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let flags = buf[4];
        let len = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
        if len > MAX_FRAME {
            return Err(Error::TooLarge(len));
        }
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let p = &buf[8..8 + len];
        let fin = flags & FLAG_FIN != 0;
        if buf[0] & 0x80 == 0 {
            let stream = be32(buf) & 0x7fff_ffff;
            let data = p.to_vec();
            return Ok(Some((Frame::Data { stream, fin, data }, 8 + len)));
        }
        let version = u16::from_be_bytes([buf[0], buf[1]]) & 0x7fff;
        if version != VERSION {
            return Err(Error::Version(version));
        }
        let kind = u16::from_be_bytes([buf[2], buf[3]]);
        let need = match kind {
            SYN_STREAM => 10,
            SYN_REPLY | HEADERS | PING => 4,
            RST_STREAM | GOAWAY | WINDOW_UPDATE => 8,
            _ => 0,
        };
        if len < need {
            return Err(Error::Short { kind, len });
        }
        let id = || be32(p) & 0x7fff_ffff;
        let frame = match kind {
            SYN_STREAM => Frame::SynStream {
                stream: id(),
                fin,
                block: p[10..].to_vec(),
            },
            SYN_REPLY => Frame::SynReply {
                stream: id(),
                fin,
                block: p[4..].to_vec(),
            },
            RST_STREAM => Frame::RstStream {
                stream: id(),
                status: be32(&p[4..]),
            },
            PING => Frame::Ping(be32(p)),
            GOAWAY => Frame::GoAway {
                last: id(),
                status: be32(&p[4..]),
            },
            HEADERS => Frame::Headers {
                stream: id(),
                fin,
                block: p[4..].to_vec(),
            },
            WINDOW_UPDATE => Frame::WindowUpdate {
                stream: id(),
                delta: be32(&p[4..]) & 0x7fff_ffff,
            },
            other => Frame::Ignored(other),
        };
        Ok(Some((frame, 8 + len)))
    }

    /// The frame's bytes. Payloads longer than a 24-bit length are the caller's mistake: data
    /// is written in pieces of at most [`MAX_FRAME`].
    pub(super) fn encode(&self) -> Vec<u8> {
        let control = |kind: u16, flags: u8, payload: &[&[u8]]| {
            let len: usize = payload.iter().map(|p| p.len()).sum();
            let mut out = Vec::with_capacity(8 + len);
            out.extend_from_slice(&(0x8000 | VERSION).to_be_bytes());
            out.extend_from_slice(&kind.to_be_bytes());
            out.push(flags);
            out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
            for p in payload {
                out.extend_from_slice(p);
            }
            out
        };
        let fin = |f: bool| if f { FLAG_FIN } else { 0 };
        match self {
            Frame::Data {
                stream,
                fin: f,
                data,
            } => {
                let mut out = Vec::with_capacity(8 + data.len());
                out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                out.push(fin(*f));
                out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
                out.extend_from_slice(data);
                out
            }
            Frame::SynStream {
                stream,
                fin: f,
                block,
            } => control(
                SYN_STREAM,
                fin(*f),
                &[&stream.to_be_bytes(), &[0; 4], &[0, 0], block],
            ),
            Frame::SynReply {
                stream,
                fin: f,
                block,
            } => control(SYN_REPLY, fin(*f), &[&stream.to_be_bytes(), block]),
            Frame::RstStream { stream, status } => control(
                RST_STREAM,
                0,
                &[&stream.to_be_bytes(), &status.to_be_bytes()],
            ),
            Frame::Ping(id) => control(PING, 0, &[&id.to_be_bytes()]),
            Frame::GoAway { last, status } => {
                control(GOAWAY, 0, &[&last.to_be_bytes(), &status.to_be_bytes()])
            }
            Frame::Headers {
                stream,
                fin: f,
                block,
            } => control(HEADERS, fin(*f), &[&stream.to_be_bytes(), block]),
            Frame::WindowUpdate { stream, delta } => control(
                WINDOW_UPDATE,
                0,
                &[&stream.to_be_bytes(), &delta.to_be_bytes()],
            ),
            Frame::Ignored(kind) => control(*kind, 0, &[]),
        }
    }
}

/// The names SPDY/3's dictionary lists first, each after its length (4 bytes).
const WORDS: &[&str] = &[
    "options",
    "head",
    "post",
    "put",
    "delete",
    "trace",
    "accept",
    "accept-charset",
    "accept-encoding",
    "accept-language",
    "accept-ranges",
    "age",
    "allow",
    "authorization",
    "cache-control",
    "connection",
    "content-base",
    "content-encoding",
    "content-language",
    "content-length",
    "content-location",
    "content-md5",
    "content-range",
    "content-type",
    "date",
    "etag",
    "expect",
    "expires",
    "from",
    "host",
    "if-match",
    "if-modified-since",
    "if-none-match",
    "if-range",
    "if-unmodified-since",
    "last-modified",
    "location",
    "max-forwards",
    "pragma",
    "proxy-authenticate",
    "proxy-authorization",
    "range",
    "referer",
    "retry-after",
    "server",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "user-agent",
    "vary",
    "via",
    "warning",
    "www-authenticate",
    "method",
    "get",
    "status",
    "200 OK",
    "version",
    "HTTP/1.1",
    "url",
    "public",
    "set-cookie",
    "keep-alive",
    "origin",
];

/// The dictionary's text after the words, as it is.
const TAIL: &str = concat!(
    "100101201202205206300302303304305306307",
    "402405406407408409410411412413414415416417",
    "502504505",
    "203 Non-Authoritative Information",
    "204 No Content",
    "301 Moved Permanently",
    "400 Bad Request",
    "401 Unauthorized",
    "403 Forbidden",
    "404 Not Found",
    "500 Internal Server Error",
    "501 Not Implemented",
    "503 Service Unavailable",
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec ",
    "00:00:00 ",
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
    "chunked,text/html,image/png,image/jpg,image/gif,",
    "application/xml,application/xhtml+xml,text/plain,text/javascript,",
    "publicprivatemax-age=gzip,deflate,sdch",
    "charset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
);

/// SPDY/3's header dictionary (its Adler-32 is `0xe3c6a7c2`, what a zlib stream primed with it
/// names in its header).
pub(super) fn dictionary() -> &'static [u8] {
    static DICTIONARY: OnceLock<Vec<u8>> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let mut d = Vec::with_capacity(1500);
        for w in WORDS {
            d.extend_from_slice(&(w.len() as u32).to_be_bytes());
            d.extend_from_slice(w.as_bytes());
        }
        d.extend_from_slice(TAIL.as_bytes());
        d
    })
}

/// The header blocks one side receives: one zlib stream across the whole connection.
pub(super) struct Inflater {
    z: Decompress,
}

impl Default for Inflater {
    fn default() -> Self {
        Self {
            z: Decompress::new(true),
        }
    }
}

impl Inflater {
    /// The name/value pairs of the next header block (names lower-case, as SPDY writes them;
    /// a value holding several, NUL-separated, as it is).
    pub(super) fn headers(&mut self, block: &[u8]) -> Result<Vec<(String, String)>, Error> {
        let bad = |m: String| Error::Headers(m);
        let mut out: Vec<u8> = Vec::with_capacity(512);
        let mut input = block;
        loop {
            if out.len() > MAX_HEADERS {
                return Err(bad(format!("inflates to more than {MAX_HEADERS} bytes")));
            }
            if out.len() == out.capacity() {
                out.reserve_exact(1024);
            }
            let (before_in, before_out) = (self.z.total_in(), out.len());
            let result = self
                .z
                .decompress_vec(input, &mut out, FlushDecompress::Sync);
            // What was taken, also when zlib stops to ask for the dictionary after its header.
            let used = usize::try_from(self.z.total_in() - before_in).unwrap_or(input.len());
            input = &input[used.min(input.len())..];
            match result {
                Ok(_) => {}
                Err(e) if e.needs_dictionary().is_some() => {
                    self.z
                        .set_dictionary(dictionary())
                        .map_err(|e| bad(format!("the dictionary: {e}")))?;
                    continue;
                }
                Err(e) => return Err(bad(e.to_string())),
            }
            let room_left = out.len() < out.capacity();
            if (input.is_empty() && room_left) || (used == 0 && out.len() == before_out) {
                break;
            }
        }
        if out.len() > MAX_HEADERS {
            return Err(bad(format!("inflates to more than {MAX_HEADERS} bytes")));
        }
        parse_block(&out).ok_or_else(|| bad("not a list of name/value pairs".into()))
    }
}

/// A header block's pairs: a count, then each name and value after its length (4 bytes each).
fn parse_block(b: &[u8]) -> Option<Vec<(String, String)>> {
    let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
        let s = b.get(*at..at.checked_add(n)?)?;
        *at += n;
        Some(s)
    };
    let mut at = 0;
    let count = be32(take(&mut at, 4)?) as usize;
    // Each pair takes at least 8 bytes: a count beyond what is there is a lie.
    if count > (b.len() - 4) / 8 {
        return None;
    }
    let mut pairs = Vec::with_capacity(count);
    for _ in 0..count {
        let n = be32(take(&mut at, 4)?) as usize;
        let name = String::from_utf8(take(&mut at, n)?.to_vec()).ok()?;
        let n = be32(take(&mut at, 4)?) as usize;
        let value = String::from_utf8(take(&mut at, n)?.to_vec()).ok()?;
        pairs.push((name, value));
    }
    (at == b.len()).then_some(pairs)
}

/// The header blocks one side sends.
pub(super) struct Deflater {
    z: Compress,
    primed: bool,
}

impl Default for Deflater {
    fn default() -> Self {
        Self {
            z: Compress::new(Compression::default(), true),
            primed: false,
        }
    }
}

impl Deflater {
    /// The next header block holding `pairs` (names written lower-case).
    pub(super) fn block(&mut self, pairs: &[(&str, &str)]) -> Vec<u8> {
        let mut plain = Vec::new();
        plain.extend_from_slice(&(pairs.len() as u32).to_be_bytes());
        for (name, value) in pairs {
            let name = name.to_ascii_lowercase();
            plain.extend_from_slice(&(name.len() as u32).to_be_bytes());
            plain.extend_from_slice(name.as_bytes());
            plain.extend_from_slice(&(value.len() as u32).to_be_bytes());
            plain.extend_from_slice(value.as_bytes());
        }
        if !self.primed {
            // Setting the dictionary on a fresh stream cannot fail.
            let _ = self.z.set_dictionary(dictionary());
            self.primed = true;
        }
        let mut out = Vec::with_capacity(plain.len() + 64);
        let mut input = plain.as_slice();
        loop {
            if out.len() == out.capacity() {
                out.reserve(256);
            }
            let before = self.z.total_in();
            if self
                .z
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .is_err()
            {
                break;
            }
            let used = usize::try_from(self.z.total_in() - before).unwrap_or(input.len());
            input = &input[used.min(input.len())..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
        }
        out
    }
}

/// What a client's frames ask of a server's session, header blocks inflated.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Input {
    /// A new stream and its headers (names lower-case, as SPDY/3 writes them); the session
    /// answers it with `SYN_REPLY` or refuses it.
    Open {
        stream: u32,
        headers: Vec<(String, String)>,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
    Reset {
        stream: u32,
    },
    /// Answered with the same ping.
    Ping(u32),
    /// The client ends the session.
    GoAway,
    /// A stream to refuse with `RST_STREAM` and this status (its id not above the last one's:
    /// a client's ids only grow).
    Refuse {
        stream: u32,
        status: u32,
    },
}

impl Input {
    /// A header's value, of an [`Input::Open`].
    pub(super) fn header(&self, name: &str) -> Option<&str> {
        match self {
            Input::Open { headers, .. } => headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str()),
            _ => None,
        }
    }
}

/// A server's reading side of a session: the client's bytes in any pieces in, its frames out
/// as [`Input`]s, with the header stream kept in step.
#[derive(Default)]
pub(super) struct Reader {
    buf: Vec<u8>,
    inflater: Inflater,
    last: u32,
}

impl Reader {
    /// The inputs the bytes read so far complete; an error ends the session (see
    /// [`protocol_error`]).
    pub(super) fn feed(&mut self, chunk: &[u8]) -> Result<Vec<Input>, Error> {
        self.buf.extend_from_slice(chunk);
        let mut inputs = Vec::new();
        let mut at = 0;
        let result = loop {
            let (frame, n) = match Frame::parse(&self.buf[at..]) {
                Ok(Some(f)) => f,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            };
            at += n;
            match frame {
                Frame::SynStream { stream, block, .. } => {
                    let headers = match self.inflater.headers(&block) {
                        Ok(h) => h,
                        Err(e) => break Err(e),
                    };
                    if stream <= self.last {
                        inputs.push(Input::Refuse {
                            stream,
                            status: status::STREAM_IN_USE,
                        });
                        continue;
                    }
                    self.last = stream;
                    inputs.push(Input::Open { stream, headers });
                }
                Frame::Data { stream, fin, data } => inputs.push(Input::Data { stream, fin, data }),
                Frame::RstStream { stream, .. } => inputs.push(Input::Reset { stream }),
                Frame::Ping(id) => inputs.push(Input::Ping(id)),
                Frame::Headers { block, .. } => {
                    // Read to keep the header stream in step; nothing in it is used.
                    if let Err(e) = self.inflater.headers(&block) {
                        break Err(e);
                    }
                }
                Frame::GoAway { .. } => inputs.push(Input::GoAway),
                Frame::SynReply { .. } | Frame::WindowUpdate { .. } | Frame::Ignored(_) => {}
            }
        };
        self.buf.drain(..at);
        result.map(|()| inputs)
    }

    /// The last stream the client opened.
    pub(super) fn last(&self) -> u32 {
        self.last
    }
}

/// The end of a session whose client broke the protocol (`last`: [`Reader::last`]).
pub(super) fn protocol_error(last: u32) -> Vec<u8> {
    Frame::GoAway {
        last,
        status: status::PROTOCOL_ERROR,
    }
    .encode()
}

/// A stream's data frame, encoded.
pub(super) fn data(stream: u32, fin: bool, bytes: Vec<u8>) -> Vec<u8> {
    Frame::Data {
        stream,
        fin,
        data: bytes,
    }
    .encode()
}

/// Frames queued for the client, per session.
const OUT_QUEUE: usize = 64;

/// Runs `session` over an upgraded connection `io`: the client's bytes in (from a websocket's
/// binary messages when `websocket`, else as they come), whole frames out (a websocket message
/// each, else written as they are); the connection is closed once `session` ends.
pub(super) async fn carry<S, F, Fut>(io: S, websocket: bool, session: F)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Receiver<Vec<u8>>, tokio::sync::mpsc::Sender<Vec<u8>>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message as WsFrame;
    use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, frame::coding::CloseCode};
    let (in_tx, in_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(OUT_QUEUE);
    let (reading, writing) = if websocket {
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None).await;
        let (mut sink, mut from_client) = ws.split();
        let reading = tokio::spawn(async move {
            while let Some(Ok(m)) = from_client.next().await {
                match m {
                    WsFrame::Binary(b) if in_tx.send(b.to_vec()).await.is_err() => break,
                    WsFrame::Close(_) => break,
                    _ => {}
                }
            }
        });
        let writing = tokio::spawn(async move {
            while let Some(b) = out_rx.recv().await {
                if sink.send(WsFrame::binary(b)).await.is_err() {
                    return;
                }
            }
            let normal = CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            };
            let _ = sink.send(WsFrame::Close(Some(normal))).await;
            let _ = sink.close().await;
        });
        (reading, writing)
    } else {
        let (mut r, mut w) = tokio::io::split(io);
        let reading = tokio::spawn(async move {
            let mut buf = vec![0u8; 32 * 1024];
            while let Ok(n) = r.read(&mut buf).await {
                if n == 0 || in_tx.send(buf[..n].to_vec()).await.is_err() {
                    break;
                }
            }
        });
        let writing = tokio::spawn(async move {
            while let Some(b) = out_rx.recv().await {
                if w.write_all(&b).await.is_err() {
                    return;
                }
            }
            let _ = w.shutdown().await;
        });
        (reading, writing)
    };
    session(in_rx, out_tx).await;
    reading.abort();
    let _ = writing.await;
}

#[cfg(test)]
mod tests;
