//! The RTU line: the devices on one serial port share one [`SharedLine`] of the SDK (one open
//! port, requests that never overlap), with Modbus's inter-frame silence.

use mapper_sdk::line::SharedLine;
use std::sync::Arc;
use std::time::Duration;
use tokio_modbus::client::Context;

/// A Modbus RTU line.
pub type Bus = SharedLine<Context>;

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

/// The line of the serial port `path`, shared by every RTU device on it.
pub fn for_line(path: &str, baud_rate: u32) -> Arc<Bus> {
    SharedLine::for_path(path, silence(baud_rate))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_three_and_a_half_characters_up_to_19200_baud() {
        // 9600 baud: 11 bits per character, 3.5 characters = 4.01 ms.
        assert_eq!(silence(9600), Duration::from_micros(4010));
        assert_eq!(silence(19_200), Duration::from_micros(2005));
        assert_eq!(silence(115_200), Duration::from_micros(1750));
    }

    #[test]
    fn devices_on_one_port_share_its_line() {
        let a = for_line("/dev/test-rtu-shared", 9600);
        let b = for_line("/dev/test-rtu-shared", 9600);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(a.silence, silence(9600));
    }
}
