//! The Modbus mapper.
//!
//! - [`codec`]: a property's value to and from Modbus registers or bits: data types, byte and
//!   word order, bit fields, scale and offset, range checks for writes.
//! - [`planner`]: the reads due together merged into the fewest requests within the protocol's
//!   limits, filling small gaps, and never bridging addresses the device refused.
//! - [`device`]: a device's settings from KubeEdge's `configData` (both key spellings), and its
//!   reads and writes over tokio-modbus (TCP, or RTU on a serial line).
//! - [`mapper`]: the protocol on the mapper SDK; the `mapper-modbus` binary runs it.

pub mod bus;
pub mod codec;
pub mod device;
pub mod mapper;
pub mod planner;

/// The four Modbus data tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// Read-write bits (function codes 1, 5, 15).
    Coil,
    /// Read-only bits (function code 2).
    DiscreteInput,
    /// Read-only 16-bit registers (function code 4).
    InputRegister,
    /// Read-write 16-bit registers (function codes 3, 6, 16).
    HoldingRegister,
}

impl Table {
    /// Whether the table holds bits rather than registers.
    pub fn is_bits(self) -> bool {
        matches!(self, Self::Coil | Self::DiscreteInput)
    }

    /// Whether a master may write it.
    pub fn is_writable(self) -> bool {
        matches!(self, Self::Coil | Self::HoldingRegister)
    }

    /// Parses KubeEdge's `register` value (`CoilRegister`, `DiscreteInputRegister`,
    /// `InputRegister`, `HoldingRegister`), case-insensitively and with or without the
    /// `Register` suffix.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.to_ascii_lowercase();
        let s = s.strip_suffix("register").unwrap_or(&s);
        match s {
            "coil" | "coils" => Some(Self::Coil),
            "discreteinput" | "discreteinputs" | "discrete" => Some(Self::DiscreteInput),
            "input" => Some(Self::InputRegister),
            "holding" => Some(Self::HoldingRegister),
            _ => None,
        }
    }

    /// The most items one read request may cover (Modbus application protocol 1.1b3: 2000
    /// bits for function codes 1 and 2, 125 registers for 3 and 4).
    pub fn max_read(self) -> u16 {
        if self.is_bits() { 2000 } else { 125 }
    }
}
