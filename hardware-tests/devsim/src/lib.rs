//! `devsim`: simulated devices from the same `Device` and `DeviceModel` manifests the gateway
//! uses (`kubectl apply` takes the same files), for hardware-in-the-loop tests without the
//! hardware.
//!
//! - [`device`]: a simulated device and where each of its points is, as its mapper reads it.
//! - [`layout`]: each Modbus device (TCP, RTU) of the manifests, each property laid out in registers
//!   or bits as `mapper-modbus` reads it (its own parser of visitors: type, scale, offset, byte
//!   and word order, bits); a declaration that cannot work (overlapping registers, a type that
//!   does not fit its `limit`, an unknown register table) is named with its field path.
//! - [`scenario`]: what each device does over time (constants, ramps, sines, seeded random
//!   walks, steps, a value following another) and its faults (exception codes, no answer, late
//!   answers, garbage, duplicated and truncated answers, disconnects, reboots), on a clock that can run faster.
//! - [`serial`]: devices with their own serial protocols (`mapper-serial`), answered from
//!   their visitors and checked with the mapper's own decoder.
//! - [`rtu`]: Modbus RTU frames on a line, with the line's faults.
//! - [`opcua`]: OPC UA servers with a variable at every property's node.
//! - [`ble`]: BLE peripherals behind a scripted BlueZ.
//! - [`run`]: each device served on its address (or on a host of your choice), the scenario
//!   played every tick.
//! - [`record`]: a recording proxy between a mapper and a real device (pcap, for Wireshark
//!   too), an RTU tap on a serial line, and a recording served back as a device (TCP or RTU).
//! - [`hil`]: `devsim hil FILE` (and `kectl hil run FILE`): the devices served, edgecore and
//!   the mappers started on them, steps that set and check the twin, JUnit XML for CI.

pub mod ble;
pub mod device;
pub mod discover;
pub mod hil;
pub mod layout;
pub mod opcua;
pub mod record;
pub mod rtu;
pub mod run;
pub mod scenario;
pub mod serial;
