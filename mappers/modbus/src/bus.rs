//! The connections the devices share: the devices on one serial port share one [`SharedLine`]
//! of the SDK (one open port, requests that never overlap), with Modbus's inter-frame silence;
//! the devices at one Modbus TCP address (the units behind a gateway, several Devices of one
//! PLC) share one TCP connection the same way, as KubeEdge's Modbus mapper shares a client per
//! address. A gateway or PLC takes a few connections at most (often 4 to 16); one per device
//! would be refused past that, and cost ~16 KB of buffers each.

use mapper_sdk::line::SharedLine;
use std::sync::Arc;
use std::time::Duration;
use tokio_modbus::client::Context;

/// A Modbus RTU line, or a Modbus TCP connection.
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

/// The connection to the Modbus TCP address `address` (`host:port`), shared by every device
/// there. No silence between frames: TCP's transaction ids tell the answers apart.
pub fn for_address(address: &str) -> Arc<Bus> {
    SharedLine::for_path(&format!("modbus-tcp://{address}"), Duration::ZERO)
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

    #[test]
    fn devices_at_one_tcp_address_share_its_connection_and_no_other() {
        let a = for_address("192.0.2.7:502");
        let b = for_address("192.0.2.7:502");
        let c = for_address("192.0.2.7:503");
        let d = for_line("192.0.2.7:502", 9600);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(!Arc::ptr_eq(&a, &d));
        assert_eq!(a.silence, Duration::ZERO);
    }
}
