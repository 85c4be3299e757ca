//! Accepting every `:authority` a conforming gRPC client sends over a Unix socket.
//!
//! gRPC clients put the socket path into the HTTP/2 `:authority` pseudo-header: grpc-go v1.67
//! (KubeEdge's mapper-framework) percent-encodes the whole path (`%2Fetc%2Fkubeedge%2Fdmi.sock`),
//! older grpc-go sends it raw (`/etc/kubeedge/dmi.sock`), grpc-python sends
//! `tmp%2Fdmi.sock`. None of these is an authority in the sense of RFC 3986, and the HTTP/2
//! layer under tonic (h2) answers such a request with `RST_STREAM(PROTOCOL_ERROR)` before any
//! service sees it. A Go gRPC server ignores the authority, so a KubeEdge mapper never notices.
//!
//! [`AuthorityFix`] sits between the socket and the HTTP/2 server. It reads the client's frames,
//! decodes every header block with an HPACK decoder that mirrors the client's encoder, and
//! passes frames through unchanged until a block carries an `:authority` that is not a valid
//! authority; from then on every header block of the connection is re-encoded with its own HPACK
//! encoder (after a dynamic table size update to 0 that empties the server's table), with such an
//! `:authority` replaced by `localhost`, the value grpc-go used to send. Everything else (DATA,
//! SETTINGS, PING, the server's writes) is untouched. A connection that does not start with the
//! HTTP/2 preface, or that breaks the framing rules, is passed through as it is, so the HTTP/2
//! server reports the error itself.

use bytes::{Buf, BufMut, BytesMut};
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// HTTP/2's default `SETTINGS_MAX_FRAME_SIZE`, which the server side keeps: frames we write
/// are no larger.
const MAX_FRAME: usize = 16_384;
/// HTTP/2's default `SETTINGS_HEADER_TABLE_SIZE`, the server's: the client's encoder and ours
/// stay within it.
const TABLE_SIZE: usize = 4_096;
/// A header block larger than this is not decoded; the connection is passed through as it is.
const MAX_BLOCK: usize = 1 << 20;
/// The authority put in place of one that is not valid.
const REPLACEMENT: &[u8] = b"localhost";

/// Whether `value` parses as an HTTP authority (what the HTTP/2 server accepts).
pub fn is_valid_authority(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

enum Mode {
    /// Waiting for the client's connection preface.
    Preface,
    /// Reading frames; `reencode` once a block had to be changed.
    Frames,
    /// Not HTTP/2 as expected: bytes go through unchanged.
    Passthrough,
}

/// The pure part: client bytes in, bytes for the HTTP/2 server out.
pub struct Rewriter {
    mode: Mode,
    decoder: loona_hpack::Decoder<'static>,
    encoder: Option<loona_hpack::Encoder<'static>>,
    /// A header block being collected: its stream, flags, priority bytes and fragments.
    pending: Option<PendingBlock>,
    rewritten: u64,
}

struct PendingBlock {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
    /// The frames as received, to pass on unchanged when nothing needs rewriting.
    raw: Vec<u8>,
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(TABLE_SIZE);
        Rewriter {
            mode: Mode::Preface,
            decoder,
            encoder: None,
            pending: None,
            rewritten: 0,
        }
    }
}

impl Rewriter {
    /// How many `:authority` values were replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Consumes what it can of `input` and appends the bytes for the server to `out`. What is
    /// left in `input` is an incomplete frame; at end of stream call [`Rewriter::finish`].
    pub fn feed(&mut self, input: &mut BytesMut, out: &mut BytesMut) {
        loop {
            match self.mode {
                Mode::Passthrough => {
                    out.extend_from_slice(&input.split());
                    return;
                }
                Mode::Preface => {
                    let n = input.len().min(PREFACE.len());
                    if input[..n] != PREFACE[..n] {
                        self.mode = Mode::Passthrough;
                        continue;
                    }
                    if n < PREFACE.len() {
                        return;
                    }
                    out.extend_from_slice(&input.split_to(PREFACE.len()));
                    self.mode = Mode::Frames;
                }
                Mode::Frames => {
                    if input.len() < FRAME_HEADER {
                        return;
                    }
                    let len = (usize::from(input[0]) << 16)
                        | (usize::from(input[1]) << 8)
                        | usize::from(input[2]);
                    if input.len() < FRAME_HEADER + len {
                        if len > MAX_BLOCK {
                            // Too large to hold: the server refuses it anyway.
                            self.give_up(out);
                        }
                        return;
                    }
                    let frame = input.split_to(FRAME_HEADER + len);
                    self.frame(&frame, out);
                }
            }
        }
    }

    /// End of the client's stream: whatever is held goes on as it is.
    pub fn finish(&mut self, input: &mut BytesMut, out: &mut BytesMut) {
        self.give_up(out);
        out.extend_from_slice(&input.split());
    }

    fn give_up(&mut self, out: &mut BytesMut) {
        if let Some(p) = self.pending.take() {
            out.extend_from_slice(&p.raw);
        }
        self.mode = Mode::Passthrough;
    }

    fn frame(&mut self, frame: &[u8], out: &mut BytesMut) {
        let kind = frame[3];
        let flags = frame[4];
        let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
        let payload = &frame[FRAME_HEADER..];
        match (&mut self.pending, kind) {
            (None, HEADERS) => {
                let Some((priority, fragment)) = split_headers_payload(flags, payload) else {
                    out.extend_from_slice(frame);
                    self.mode = Mode::Passthrough;
                    return;
                };
                self.pending = Some(PendingBlock {
                    stream,
                    flags,
                    priority,
                    block: fragment.to_vec(),
                    raw: frame.to_vec(),
                });
            }
            (Some(p), CONTINUATION) if p.stream == stream => {
                p.block.extend_from_slice(payload);
                p.raw.extend_from_slice(frame);
                if p.block.len() > MAX_BLOCK {
                    self.give_up(out);
                    return;
                }
            }
            (None, _) => {
                out.extend_from_slice(frame);
                return;
            }
            (Some(_), _) => {
                // A frame inside a header block: a protocol error the server will name.
                self.give_up(out);
                out.extend_from_slice(frame);
                return;
            }
        }
        let done = match (&self.pending, kind) {
            (Some(_), CONTINUATION) | (Some(_), HEADERS) => flags & END_HEADERS != 0,
            _ => false,
        };
        if done && let Some(p) = self.pending.take() {
            self.block(p, out);
        }
    }

    fn block(&mut self, p: PendingBlock, out: &mut BytesMut) {
        let mut headers: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let decoded = self.decoder.decode_with_cb(&p.block, |name, value| {
            headers.push((name.into_owned(), value.into_owned()))
        });
        if decoded.is_err() {
            // The server's own decoder will refuse it and close the connection.
            out.extend_from_slice(&p.raw);
            self.mode = Mode::Passthrough;
            return;
        }
        let mut changed = false;
        for (name, value) in &mut headers {
            if name.as_slice() == b":authority" && !is_valid_authority(value) {
                *value = REPLACEMENT.to_vec();
                changed = true;
            }
        }
        if changed {
            self.rewritten += 1;
        }
        let mut block = Vec::new();
        match &mut self.encoder {
            None if !changed => {
                out.extend_from_slice(&p.raw);
                return;
            }
            None => {
                // The server's table holds what the client indexed so far: empty it, then
                // encode from a fresh table of the same size.
                block.extend_from_slice(&size_update(0));
                block.extend_from_slice(&size_update(TABLE_SIZE));
                let mut encoder = loona_hpack::Encoder::new();
                encoder.set_max_table_size(TABLE_SIZE);
                self.encoder = Some(encoder);
            }
            Some(_) => {}
        }
        if let Some(encoder) = &mut self.encoder {
            let pairs = headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice()));
            // Writing into a Vec cannot fail.
            let _ = encoder.encode_into(pairs, &mut block);
        }
        write_header_block(&p, &block, out);
    }
}

/// The priority bytes and the block fragment of a HEADERS payload, or `None` when its padding
/// does not fit.
fn split_headers_payload(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut rest = payload;
    let mut pad = 0usize;
    if flags & PADDED != 0 {
        pad = usize::from(*rest.first()?);
        rest = &rest[1..];
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let bytes: [u8; 5] = rest.get(..5)?.try_into().ok()?;
        priority = Some(bytes);
        rest = &rest[5..];
    }
    let end = rest.len().checked_sub(pad)?;
    Some((priority, &rest[..end]))
}

fn size_update(size: usize) -> Vec<u8> {
    let mut bytes = loona_hpack::encoder::encode_integer(size, 5);
    if let Some(first) = bytes.first_mut() {
        *first |= 0x20;
    }
    bytes
}

/// A HEADERS frame (and CONTINUATION frames as needed) carrying `block`, without padding.
fn write_header_block(p: &PendingBlock, block: &[u8], out: &mut BytesMut) {
    let prefix = if p.priority.is_some() { 5 } else { 0 };
    let first_len = block.len().min(MAX_FRAME - prefix);
    let (first, mut rest) = block.split_at(first_len);
    let mut flags = p.flags & (END_STREAM | PRIORITY);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    put_frame_header(out, prefix + first.len(), HEADERS, flags, p.stream);
    if let Some(priority) = p.priority {
        out.extend_from_slice(&priority);
    }
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let n = rest.len().min(MAX_FRAME);
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        put_frame_header(out, chunk.len(), CONTINUATION, flags, p.stream);
        out.extend_from_slice(chunk);
    }
}

fn put_frame_header(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    #[allow(clippy::cast_possible_truncation)]
    out.put_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags]);
    out.put_u32(stream);
}

/// A connection whose inbound HTTP/2 header blocks pass through a [`Rewriter`].
pub struct AuthorityFix<IO> {
    io: IO,
    rewriter: Rewriter,
    /// Bytes read from the client, not yet a whole frame.
    input: BytesMut,
    /// Bytes for the server, not yet read by it.
    output: BytesMut,
    eof: bool,
}

impl<IO> AuthorityFix<IO> {
    /// Wraps an accepted connection.
    pub fn new(io: IO) -> Self {
        AuthorityFix {
            io,
            rewriter: Rewriter::default(),
            input: BytesMut::new(),
            output: BytesMut::new(),
            eof: false,
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.output.is_empty() {
                let n = this.output.len().min(buf.remaining());
                buf.put_slice(&this.output[..n]);
                this.output.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.io).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.eof = true;
                this.rewriter.finish(&mut this.input, &mut this.output);
            } else {
                this.input.extend_from_slice(read.filled());
                this.rewriter.feed(&mut this.input, &mut this.output);
            }
        }
    }
}

crate::write_through!(AuthorityFix);

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = tonic::transport::server::UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::Connected::connect_info(&self.io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        put_frame_header(&mut out, payload.len(), kind, flags, stream);
        out.extend_from_slice(payload);
        out.to_vec()
    }

    /// Runs client bytes through a rewriter in chunks of `chunk` bytes.
    fn run(bytes: &[u8], chunk: usize) -> (Vec<u8>, u64) {
        let mut r = Rewriter::default();
        let mut input = BytesMut::new();
        let mut out = BytesMut::new();
        for piece in bytes.chunks(chunk) {
            input.extend_from_slice(piece);
            r.feed(&mut input, &mut out);
        }
        r.finish(&mut input, &mut out);
        (out.to_vec(), r.rewritten())
    }

    /// Decodes the server-side bytes the way the server would, returning each block's headers.
    fn server_view(bytes: &[u8]) -> Vec<Vec<(String, String)>> {
        assert!(bytes.starts_with(PREFACE));
        let mut rest = &bytes[PREFACE.len()..];
        let mut decoder = loona_hpack::Decoder::new();
        let mut blocks = Vec::new();
        let mut block = Vec::new();
        while !rest.is_empty() {
            let len =
                (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            let (kind, flags) = (rest[3], rest[4]);
            let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
            assert!(len <= MAX_FRAME, "frame of {len} bytes");
            if kind == HEADERS || kind == CONTINUATION {
                let fragment = if kind == HEADERS {
                    split_headers_payload(flags, payload).expect("valid").1
                } else {
                    payload
                };
                block.extend_from_slice(fragment);
                if flags & END_HEADERS != 0 {
                    let headers = decoder.decode(&block).expect("server decodes");
                    blocks.push(
                        headers
                            .into_iter()
                            .map(|(n, v)| {
                                (
                                    String::from_utf8_lossy(&n).into_owned(),
                                    String::from_utf8_lossy(&v).into_owned(),
                                )
                            })
                            .collect(),
                    );
                    block.clear();
                }
            }
            rest = &rest[FRAME_HEADER + len..];
        }
        blocks
    }

    fn request(authority: &str, path: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", authority),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    fn client_bytes(requests: &[Vec<(Vec<u8>, Vec<u8>)>], max_fragment: usize) -> Vec<u8> {
        let mut encoder = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(0x4, 0, 0, &[]));
        for (i, headers) in requests.iter().enumerate() {
            let stream = 1 + 2 * i as u32;
            let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
            let mut chunks = block.chunks(max_fragment).peekable();
            let mut first = true;
            while let Some(chunk) = chunks.next() {
                let last = chunks.peek().is_none();
                let flags = if last { END_HEADERS } else { 0 };
                let kind = if first { HEADERS } else { CONTINUATION };
                bytes.extend(frame(kind, flags, stream, chunk));
                first = false;
            }
            bytes.extend(frame(0x0, END_STREAM, stream, b"\0\0\0\0\0"));
        }
        bytes
    }

    fn authorities(blocks: &[Vec<(String, String)>]) -> Vec<String> {
        blocks
            .iter()
            .map(|b| {
                b.iter()
                    .find(|(n, _)| n == ":authority")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn the_authority_forms_of_grpc_clients_over_unix_sockets() {
        assert!(!is_valid_authority(b"%2Fetc%2Fkubeedge%2Fdmi.sock"));
        assert!(!is_valid_authority(b"/etc/kubeedge/dmi.sock"));
        assert!(!is_valid_authority(b"tmp%2Fdmi.sock"));
        assert!(is_valid_authority(b"localhost"));
        assert!(is_valid_authority(b"dmi.local"));
    }

    #[test]
    fn valid_authorities_pass_through_byte_for_byte() {
        let bytes = client_bytes(
            &[
                request("localhost", "/v1beta1.DeviceManagerService/MapperRegister"),
                request(
                    "localhost",
                    "/v1beta1.DeviceManagerService/ReportDeviceStatus",
                ),
            ],
            MAX_FRAME,
        );
        for chunk in [1, 7, 4096] {
            let (out, rewritten) = run(&bytes, chunk);
            assert_eq!(out, bytes, "chunk {chunk}");
            assert_eq!(rewritten, 0);
        }
    }

    #[test]
    fn invalid_authorities_become_localhost_and_the_tables_stay_in_step() {
        let path = "/v1beta1.DeviceManagerService/ReportDeviceStatus";
        let requests = vec![
            // A valid one first: it fills the server's table with the client's entries.
            request("localhost", path),
            request("%2Fetc%2Fkubeedge%2Fdmi.sock", path),
            request("%2Fetc%2Fkubeedge%2Fdmi.sock", path),
            request("/etc/kubeedge/dmi.sock", path),
            request(
                "tmp%2Fdmi.sock",
                "/v1beta1.DeviceManagerService/MapperRegister",
            ),
        ];
        let bytes = client_bytes(&requests, 5);
        for chunk in [1, 3, 9, 100_000] {
            let (out, rewritten) = run(&bytes, chunk);
            assert_eq!(rewritten, 4, "chunk {chunk}");
            let blocks = server_view(&out);
            assert_eq!(authorities(&blocks), vec!["localhost"; 5]);
            // Every other header reaches the server as the client sent it.
            for (block, sent) in blocks.iter().zip(&requests) {
                for ((n, v), (sn, sv)) in block.iter().zip(sent) {
                    assert_eq!(n.as_bytes(), sn.as_slice());
                    if n != ":authority" {
                        assert_eq!(v.as_bytes(), sv.as_slice());
                    }
                }
            }
        }
    }

    #[test]
    fn padding_and_priority_are_handled() {
        let mut encoder = loona_hpack::Encoder::new();
        let headers = request("%2Ftmp%2Fa.sock", "/x");
        let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let mut payload = vec![3u8];
        payload.extend_from_slice(&[0, 0, 0, 0, 16]);
        payload.extend_from_slice(&block);
        payload.extend_from_slice(&[0, 0, 0]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(
            HEADERS,
            END_HEADERS | PADDED | PRIORITY | END_STREAM,
            1,
            &payload,
        ));
        let (out, _) = run(&bytes, 11);
        let blocks = server_view(&out);
        assert_eq!(authorities(&blocks), vec!["localhost"]);
        let first = &out[PREFACE.len()..];
        assert_eq!(first[4], END_HEADERS | PRIORITY | END_STREAM);
        assert_eq!(&first[FRAME_HEADER..FRAME_HEADER + 5], &[0, 0, 0, 0, 16]);
    }

    #[test]
    fn what_is_not_http2_as_expected_goes_through_unchanged() {
        let http1 = b"GET / HTTP/1.1\r\nHost: /tmp/x\r\n\r\n".to_vec();
        assert_eq!(run(&http1, 4).0, http1);
        // A header block that does not decode is left to the server to refuse.
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
        ));
        bytes.extend(frame(0x0, END_STREAM, 1, b"tail"));
        assert_eq!(run(&bytes, 5).0, bytes);
        // A truncated frame at the end is passed on as it is.
        let mut cut = client_bytes(&[request("%2Fa", "/x")], MAX_FRAME);
        cut.truncate(cut.len() - 3);
        let (out, _) = run(&cut, 1000);
        assert!(out.ends_with(&cut[cut.len() - 8..]));
    }
}
