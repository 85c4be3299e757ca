//! The streaming tunnel between cloudhub and a node: what carries `kubectl logs` (and the other
//! streams of a kubelet) to an edge node that never listens. The node opens it, with its own
//! certificate, beside its session (`wss://{cloudhub}/{projectID}/{node}/stream`), so the
//! session's messages never wait behind a stream's bytes; the cloud opens streams on it.
//!
//! Each websocket binary message is one [`Frame`]: the stream's id (4 bytes, big-endian), its
//! [`Kind`] (1 byte), its payload. Flow control is by credit: the side that sends `Data` may
//! have at most [`WINDOW`] bytes of a stream not yet credited back by the other, so a slow
//! reader slows its own stream down and nothing else.

use serde::{Deserialize, Serialize};

/// Bytes of a stream's data one side may send before the other credits some back.
pub const WINDOW: u32 = 256 * 1024;
/// The most credit one side holds for a stream: a peer that credits back more than it was
/// sent cannot make the other side's allowance grow past a few windows.
pub const MAX_CREDIT: usize = 4 * WINDOW as usize;

/// How much of a `Credit` frame's `credited` bytes to add to an allowance that has `available`
/// now: all of it, up to [`MAX_CREDIT`] in all.
pub fn creditable(credited: u32, available: usize) -> usize {
    (credited as usize).min(MAX_CREDIT.saturating_sub(available))
}

/// The largest data payload of one frame.
pub const MAX_DATA: usize = 32 * 1024;
/// The largest payload of a frame that is not data (an `Open`, a `Close`'s outcome).
pub const MAX_CONTROL: usize = 16 * 1024;

/// What a frame does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// cloud to node: a new stream, its [`Open`] request as JSON.
    Open = 1,
    /// Either way: the stream's bytes.
    Data = 2,
    /// Either way: this many more bytes (u32, big-endian) may be sent.
    Credit = 3,
    /// Either way: the stream is over. From the node, an [`Outcome`] as JSON; from the cloud,
    /// empty (its client went away or asked it to stop).
    Close = 4,
    /// node to cloud: the stream was accepted; data follows.
    Ready = 5,
}

impl Kind {
    fn of(b: u8) -> Option<Self> {
        Some(match b {
            1 => Self::Open,
            2 => Self::Data,
            3 => Self::Credit,
            4 => Self::Close,
            5 => Self::Ready,
            _ => return None,
        })
    }
}

/// One message of the tunnel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub stream: u32,
    pub kind: Kind,
    pub payload: Vec<u8>,
}

/// Why bytes are not a frame.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("a tunnel frame of {0} bytes is shorter than its 5-byte header")]
    Short(usize),
    #[error("unknown tunnel frame kind {0}")]
    Kind(u8),
    #[error("a tunnel {kind:?} frame of {len} bytes is larger than {max}")]
    TooLarge { kind: Kind, len: usize, max: usize },
}

impl Frame {
    pub fn new(stream: u32, kind: Kind, payload: Vec<u8>) -> Self {
        Self {
            stream,
            kind,
            payload,
        }
    }

    pub fn credit(stream: u32, bytes: u32) -> Self {
        Self::new(stream, Kind::Credit, bytes.to_be_bytes().to_vec())
    }

    pub fn close(stream: u32, outcome: Option<&Outcome>) -> Self {
        let payload = outcome
            .and_then(|o| serde_json::to_vec(o).ok())
            .unwrap_or_default();
        Self::new(stream, Kind::Close, payload)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(5 + self.payload.len());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        if bytes.len() < 5 {
            return Err(FrameError::Short(bytes.len()));
        }
        let stream = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let kind = Kind::of(bytes[4]).ok_or(FrameError::Kind(bytes[4]))?;
        let payload = &bytes[5..];
        let max = match kind {
            Kind::Data => MAX_DATA,
            Kind::Credit => 4,
            _ => MAX_CONTROL,
        };
        if payload.len() > max {
            return Err(FrameError::TooLarge {
                kind,
                len: payload.len(),
                max,
            });
        }
        Ok(Self::new(stream, kind, payload.to_vec()))
    }

    /// A `Credit` frame's bytes (0 for anything else or a short payload).
    pub fn credited(&self) -> u32 {
        match (self.kind, self.payload.as_slice()) {
            (Kind::Credit, [a, b, c, d]) => u32::from_be_bytes([*a, *b, *c, *d]),
            _ => 0,
        }
    }
}

/// What the cloud asks a node to stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Open {
    /// A container's log, as `GET /api/v1/namespaces/{ns}/pods/{name}/log` asks it.
    Log(LogRequest),
    /// A command in a container, as `pods/exec` asks it: the stream's data either way is the
    /// Kubernetes channel protocol's messages (`v4.channel.k8s.io`: a channel byte, 0 stdin,
    /// 1 stdout, 2 stderr, 3 the outcome as a `Status`, 4 a terminal's size), one per frame.
    Exec(ExecRequest),
    /// The container's own process, as `pods/attach` asks it (the request's command is
    /// empty); the data as for [`Open::Exec`].
    Attach(ExecRequest),
    /// A TCP connection to a port of the pod, as `pods/portforward` asks it (one per
    /// connection kubectl accepts): the stream's data either way is the connection's bytes.
    /// The node's runtime cannot pass on a half-close, so the connection ends when either side
    /// ends it.
    PortForward(PortForwardRequest),
}

/// One connection of `pods/portforward`, with the pod the cloud stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PortForwardRequest {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub port: u16,
}

/// The query of `pods/exec`, with the pod the cloud stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ExecRequest {
    pub namespace: String,
    pub pod: String,
    pub uid: String,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Channel-protocol messages of `payload` (its first byte the channel) in frames of at most
/// [`MAX_DATA`] bytes, each with the channel byte in front.
pub fn channel_chunks(payload: &[u8]) -> Vec<Vec<u8>> {
    let Some((channel, rest)) = payload.split_first() else {
        return Vec::new();
    };
    if rest.is_empty() {
        return vec![vec![*channel]];
    }
    rest.chunks(MAX_DATA - 1)
        .map(|c| {
            let mut m = Vec::with_capacity(c.len() + 1);
            m.push(*channel);
            m.extend_from_slice(c);
            m
        })
        .collect()
}

/// The query of `pods/log`, as the Kubernetes API names it, with the pod the cloud stores.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LogRequest {
    pub namespace: String,
    pub pod: String,
    /// The stored pod's uid: its own log directory, not an older pod's of the same name.
    pub uid: String,
    pub container: Option<String>,
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    /// Only lines written at or after this time (Unix nanoseconds; the cloud turns
    /// `sinceSeconds` and `sinceTime` into it, so both sides agree on one instant).
    pub since_nanos: Option<i64>,
    pub limit_bytes: Option<u64>,
}

/// How a stream ended, or why it never started: an HTTP status and a message naming what was
/// wrong (the API's `Status`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub code: u16,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credit_given_back_never_grows_an_allowance_past_four_windows() {
        assert_eq!(creditable(1000, 0), 1000);
        assert_eq!(creditable(WINDOW, WINDOW as usize), WINDOW as usize);
        assert_eq!(creditable(u32::MAX, 0), MAX_CREDIT);
        assert_eq!(creditable(10, MAX_CREDIT - 4), 4);
        assert_eq!(creditable(10, MAX_CREDIT + 7), 0);
    }

    #[test]
    fn frames_round_trip_and_bad_bytes_are_named() {
        let f = Frame::new(7, Kind::Data, b"hello".to_vec());
        assert_eq!(Frame::decode(&f.encode()), Ok(f));
        let c = Frame::credit(9, 65536);
        let back = Frame::decode(&c.encode()).expect("credit");
        assert_eq!(back.credited(), 65536);
        assert_eq!(Frame::decode(&[0, 0, 0]), Err(FrameError::Short(3)));
        assert_eq!(Frame::decode(&[0, 0, 0, 1, 99]), Err(FrameError::Kind(99)));
        let big = Frame::new(1, Kind::Data, vec![0; MAX_DATA + 1]).encode();
        assert!(matches!(
            Frame::decode(&big),
            Err(FrameError::TooLarge {
                kind: Kind::Data,
                ..
            })
        ));
        let close = Frame::close(
            3,
            Some(&Outcome {
                code: 404,
                message: "no such pod".into(),
            }),
        );
        let o: Outcome =
            serde_json::from_slice(&Frame::decode(&close.encode()).expect("close").payload)
                .expect("outcome");
        assert_eq!(o.code, 404);
    }

    #[test]
    fn every_byte_string_decodes_or_is_refused_without_panicking() {
        // All short strings and a spread of longer ones.
        for len in 0..8usize {
            for seed in 0..=255u8 {
                let bytes: Vec<u8> = (0..len).map(|i| seed.wrapping_mul(i as u8 + 7)).collect();
                if let Ok(f) = Frame::decode(&bytes) {
                    assert_eq!(f.encode(), bytes);
                }
            }
        }
    }

    #[test]
    fn channel_messages_are_split_with_their_channel_in_front() {
        let mut big = vec![1u8];
        big.extend(std::iter::repeat_n(b'x', MAX_DATA * 2));
        let parts = channel_chunks(&big);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p[0] == 1 && p.len() <= MAX_DATA));
        let joined: usize = parts.iter().map(|p| p.len() - 1).sum();
        assert_eq!(joined, MAX_DATA * 2);
        assert_eq!(channel_chunks(&[3]), vec![vec![3]]);
        assert!(channel_chunks(&[]).is_empty());
    }

    #[test]
    fn an_open_is_tagged_json() {
        let open = Open::Log(LogRequest {
            namespace: "default".into(),
            pod: "p".into(),
            follow: true,
            tail_lines: Some(5),
            ..Default::default()
        });
        let text = serde_json::to_string(&open).expect("json");
        assert!(text.contains("\"kind\":\"log\""), "{text}");
        assert!(text.contains("\"tailLines\":5"), "{text}");
        assert_eq!(serde_json::from_str::<Open>(&text).expect("back"), open);
    }
}
