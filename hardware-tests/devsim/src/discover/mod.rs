//! `devsim discover` (and `kectl discover`): from devices on the wire to a draft of their
//! `DeviceModel` and `Device` manifests, for a user to review, test with `devsim` and apply,
//! never writing to a device.
//!
//! - [`modbus`]: a Modbus TCP address, or an RTU line at settings not known;
//! - [`opcua`]: an OPC UA server's address space, browsed from a node;
//! - [`ble`]: BLE peripherals in range, their GATT characteristics read through BlueZ.

pub mod ble;
pub mod modbus;
pub mod opcua;

use std::fmt::Write as _;

/// A drafted property: `(device, property, model type, value read)`.
pub type Seen = (String, String, &'static str, String);

/// A draft: its manifests, and each drafted property's value as read.
pub struct Draft {
    /// YAML, several documents, with comments on every guess.
    pub manifests: String,
    pub seen: Vec<Seen>,
}

impl Draft {
    /// A starting HIL file (`docs/hil.md`) for the draft at `manifests` (as the HIL file names
    /// it): the simulated devices hold the values read, and a step per property expects the
    /// twin to report that value.
    pub fn hil(&self, manifests: &str) -> String {
        let q = |v: &str| serde_json::Value::String(v.to_string()).to_string();
        let mut devices: Vec<&str> = self.seen.iter().map(|s| s.0.as_str()).collect();
        devices.dedup();
        let mut out = format!(
            "# Drafted by discover: the values it read, held by the simulated devices and\n# expected in the twin. Edit the behaviours and steps into the test you want.\nmanifests: [{}]\ndevices:\n",
            q(manifests)
        );
        for d in &devices {
            let _ = writeln!(out, "  {d}:\n    properties:");
            for (_, prop, _, value) in self.seen.iter().filter(|s| s.0 == *d) {
                let _ = writeln!(out, "      {prop}: {{value: {{constant: {}}}}}", q(value));
            }
        }
        out.push_str("steps:\n");
        for (d, prop, ty, value) in &self.seen {
            let tolerance = if *ty == "FLOAT" {
                ", tolerance: 0.001"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "  - expect: {{device: {d}, property: {prop}, reported: {}{tolerance}, within: 60}}",
                q(value)
            );
        }
        out
    }
}
