//! A serial line shared by the devices on it: one open port, requests that never overlap
//! (devices take turns through tokio's fair lock, so a silent device delays the others by its
//! own timeout only), and a silence kept between frames. Every serial protocol uses it, each
//! with its own port type `T` (a Modbus RTU context, a raw serial stream).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::time::Instant;

/// The open port (none until the first request, or after a link error) and when its last frame
/// ended.
pub struct Line<T> {
    pub port: Option<T>,
    pub last_frame: Option<Instant>,
}

/// A serial line: the silence its frames need between them, and the line itself behind a fair
/// lock that a device holds for a whole request and answer.
pub struct SharedLine<T> {
    pub silence: Duration,
    pub line: tokio::sync::Mutex<Line<T>>,
}

type Registry = HashMap<(TypeId, String), Weak<dyn Any + Send + Sync>>;

fn registry() -> &'static Mutex<Registry> {
    static LINES: OnceLock<Mutex<Registry>> = OnceLock::new();
    LINES.get_or_init(|| Mutex::new(HashMap::new()))
}

impl<T: Send + 'static> SharedLine<T> {
    /// The line of the serial port `path` for port type `T`, shared by every device on it while
    /// any of them lives. `silence` is taken from the first device that opens it.
    pub fn for_path(path: &str, silence: Duration) -> Arc<Self> {
        let mut lines = registry().lock().unwrap_or_else(|e| e.into_inner());
        lines.retain(|_, w| w.strong_count() > 0);
        let key = (TypeId::of::<T>(), path.to_string());
        if let Some(line) = lines
            .get(&key)
            .and_then(Weak::upgrade)
            .and_then(|a| a.downcast::<Self>().ok())
        {
            return line;
        }
        let line = Arc::new(Self {
            silence,
            line: tokio::sync::Mutex::new(Line {
                port: None,
                last_frame: None,
            }),
        });
        let any: Arc<dyn Any + Send + Sync> = line.clone();
        lines.insert(key, Arc::downgrade(&any));
        line
    }
}

/// Waits until `silence` has passed since `last_frame`. Without a wait to do it does not touch
/// the timer, whose resolution (1 ms) would cost a fast line most of its throughput.
pub async fn wait_silence(last_frame: Option<Instant>, silence: Duration) {
    if let Some(t) = last_frame {
        let until = t + silence;
        if Instant::now() < until {
            tokio::time::sleep_until(until).await;
        }
    }
}

/// Reads and drops what arrives on a serial line until it has been silent for `quiet` (at
/// most four times that in all). Call it when a line is (re)opened, at start and after a timeout
/// or a garbled answer: an answer still on its way then must not be taken for the answer to the
/// next request. Nothing in a Modbus RTU frame (nor in most serial protocols' replies) says
/// which request it answers, and two requests of the same shape get answers that look alike: a
/// late answer to a read of `b` would become the value of `a`.
pub async fn drain(port: &mut (impl tokio::io::AsyncRead + Unpin), quiet: Duration, address: &str) {
    use tokio::io::AsyncReadExt;
    let start = tokio::time::Instant::now();
    let mut dropped = 0usize;
    let mut buf = [0u8; 256];
    while start.elapsed() < quiet * 4 {
        match tokio::time::timeout(quiet, port.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => dropped += n,
            _ => break,
        }
    }
    if dropped > 0 {
        tracing::warn!(line = %address, bytes = dropped, "dropped a late or stray answer before the next request");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resolution of tokio's timer.
    const TICK: Duration = Duration::from_millis(1);

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_out_the_silence_after_the_last_frame() {
        let s = Duration::from_micros(4010);
        let t0 = Instant::now();
        // No frame yet: no wait.
        wait_silence(None, s).await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        // A frame just ended: the next one waits the whole silence.
        wait_silence(Some(Instant::now()), s).await;
        // tokio's timer counts whole milliseconds: the wait is the silence, rounded up.
        let waited = t0.elapsed();
        assert!(waited >= s && waited <= s + TICK, "{waited:?}");
        // A frame that ended long ago: no wait.
        let old = Instant::now();
        tokio::time::advance(Duration::from_millis(50)).await;
        let t1 = Instant::now();
        wait_silence(Some(old), s).await;
        assert_eq!(t1.elapsed(), Duration::ZERO);
    }

    #[test]
    fn one_line_per_path_and_port_type() {
        let a = SharedLine::<u8>::for_path("/dev/test-line-same", Duration::ZERO);
        let b = SharedLine::<u8>::for_path("/dev/test-line-same", Duration::from_secs(1));
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.silence, Duration::ZERO, "the first opener's silence");
        // Another protocol on the same path gets its own line (its own port type).
        let c = SharedLine::<u16>::for_path("/dev/test-line-same", Duration::ZERO);
        assert_eq!(c.silence, Duration::ZERO);
        drop((a, b));
        // Once nobody holds it, the line is closed and made anew.
        let d = SharedLine::<u8>::for_path("/dev/test-line-same", Duration::from_secs(1));
        assert_eq!(d.silence, Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn devices_on_one_line_take_turns_with_the_silence_between_frames() {
        let silence = Duration::from_micros(4010);
        let bus = SharedLine::<()>::for_path("/dev/test-line-turns", silence);
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        // Three devices each send one 10 ms frame at the same moment.
        for _ in 0..3 {
            let bus = bus.clone();
            tasks.push(tokio::spawn(async move {
                let mut line = bus.line.lock().await;
                wait_silence(line.last_frame, bus.silence).await;
                let start = t0.elapsed();
                tokio::time::sleep(Duration::from_millis(10)).await;
                line.last_frame = Some(Instant::now());
                start
            }));
        }
        let mut starts = Vec::new();
        for t in tasks {
            starts.push(t.await.expect("task"));
        }
        starts.sort();
        let frame = Duration::from_millis(10);
        assert_eq!(starts[0], Duration::ZERO);
        for k in 1..3usize {
            let gap = starts[k] - starts[k - 1];
            assert!(
                gap >= frame + silence && gap <= frame + silence + TICK,
                "{starts:?}"
            );
        }
    }
}
