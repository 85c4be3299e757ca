//! One serial line (RS-485) shared by the RTU devices on it: one open port, requests that never
//! overlap (devices take turns through a fair lock, so a silent device delays the others by its
//! own timeout only), and the line's inter-frame silence kept between frames.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tokio::time::Instant;
use tokio_modbus::client::Context;

/// The open port and when its last frame ended.
#[derive(Default)]
pub struct Line {
    pub ctx: Option<Context>,
    pub last_frame: Option<Instant>,
}

/// A serial line.
pub struct Bus {
    pub silence: Duration,
    pub line: tokio::sync::Mutex<Line>,
}

/// The silence between RTU frames: 3.5 character times of 11 bits (start, 8 data, parity or a
/// second stop bit, stop), and the fixed 1.75 ms the Modbus serial line specification sets above
/// 19200 baud.
pub fn silence(baud_rate: u32) -> Duration {
    if baud_rate == 0 || baud_rate > 19_200 {
        Duration::from_micros(1750)
    } else {
        Duration::from_micros(38_500_000 / u64::from(baud_rate))
    }
}

/// Waits until `silence` has passed since `last_frame`.
pub async fn wait_silence(last_frame: Option<Instant>, silence: Duration) {
    if let Some(t) = last_frame {
        tokio::time::sleep_until(t + silence).await;
    }
}

fn lines() -> &'static Mutex<HashMap<String, Weak<Bus>>> {
    static LINES: OnceLock<Mutex<HashMap<String, Weak<Bus>>>> = OnceLock::new();
    LINES.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Bus {
    /// The bus of the serial port `path`, shared by every device on it while any of them lives.
    pub fn for_line(path: &str, baud_rate: u32) -> Arc<Bus> {
        let mut lines = lines().lock().unwrap_or_else(|e| e.into_inner());
        lines.retain(|_, w| w.strong_count() > 0);
        if let Some(bus) = lines.get(path).and_then(Weak::upgrade) {
            return bus;
        }
        let bus = Arc::new(Bus {
            silence: silence(baud_rate),
            line: tokio::sync::Mutex::new(Line::default()),
        });
        lines.insert(path.to_string(), Arc::downgrade(&bus));
        bus
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The resolution of tokio's timer.
    const TICK: Duration = Duration::from_millis(1);

    #[test]
    fn silence_is_three_and_a_half_characters_up_to_19200_baud() {
        // 9600 baud: 11 bits per character, 3.5 characters = 4.01 ms.
        assert_eq!(silence(9600), Duration::from_micros(4010));
        assert_eq!(silence(19_200), Duration::from_micros(2005));
        assert_eq!(silence(115_200), Duration::from_micros(1750));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_waits_out_the_silence_after_the_last_frame() {
        let s = silence(9600);
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

    #[tokio::test(start_paused = true)]
    async fn devices_on_one_line_take_turns_with_the_silence_between_frames() {
        let bus = Bus::for_line("/dev/test-line-turns", 9600);
        assert!(Arc::ptr_eq(
            &bus,
            &Bus::for_line("/dev/test-line-turns", 9600)
        ));
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
        let s = bus.silence;
        let frame = Duration::from_millis(10);
        assert_eq!(starts[0], Duration::ZERO);
        for k in 1..3u32 {
            let gap = starts[k as usize] - starts[k as usize - 1];
            assert!(gap >= frame + s && gap <= frame + s + TICK, "{starts:?}");
        }
    }
}
