//! The BLE mapper: devices are Bluetooth Low Energy peripherals, properties are GATT
//! characteristics. It talks to BlueZ over D-Bus through btleplug.
//!
//! Protocol `configData`: `macAddress` (or `address`) and/or `localName` (or `name`, the name
//! the device advertises); `adapter` (`hci0`; the first adapter by default); `scanTimeout`
//! (10000 ms: how long to look for the device), `connectTimeout` (10000 ms, service discovery
//! included), `timeout` (5000 ms per GATT read or write).
//!
//! Visitor `configData`: `characteristicUUID` (128-bit, or the 16-bit short form like `2A6E`),
//! `serviceUUID` (when several services have the characteristic); the value at `offset` (0):
//! `dataType` (`int8` ... `uint64`, `float32`, `float64`, `bool`, `string`, `bytes`) or `length`
//! (1, 2, 4, 8) with `signed`, `bit` (0-7), `byteOrder` or `endianness` (`little`, GATT's order,
//! by default; `big`), `scale`, `valueOffset`; a model type of `STRING` reads UTF-8 text and
//! `BOOLEAN` a number that is not zero. `notify` (`false` polls a characteristic that could
//! notify; by default a characteristic that can notify or indicate is subscribed to instead of
//! polled); `writeWithoutResponse`; `dataWrite` (a map of values to hex bytes written for them,
//! as in KubeEdge's Bluetooth mapper).
//!
//! - [`config`]: the keys above.
//! - [`device`]: finding, connecting, reading (one read per characteristic per cycle),
//!   writing (read-modify-write when the property is part of a characteristic), notifications,
//!   and the BlueZ connection shared by all devices.
//! - [`mapper`]: the protocol on the mapper SDK.

pub mod config;
pub mod device;
pub mod mapper;
