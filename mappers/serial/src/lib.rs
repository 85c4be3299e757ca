//! The serial mapper: devices that speak their own protocol over RS-232 or RS-485.
//!
//! Protocol `configData`: `serialPort`, `baudRate` (9600), `dataBits` (8), `parity`
//! (`none`|`even`|`odd`), `stopBits` (1), `flowControl` (`none`|`software`|`hardware`);
//! `mode` (`ascii` or `binary`); `timeout` in milliseconds (1000) for a whole reply;
//! `frameGap` in milliseconds (3.5 characters) kept between frames on the line; for ASCII,
//! `terminator` ending reply lines (`"\n"`, a trailing `"\r"` is dropped) and
//! `requestTerminator` appended to requests (`"\r\n"`); for binary, `checksum` (`none`, `sum8`,
//! `xor8`, `crc16-modbus`, `crc16-ccitt`) appended to requests and checked on replies.
//!
//! Visitor `configData`, ASCII: `request` (text sent), `pattern` (a regular expression for the
//! reply line), `capture` (the group with the value: by default the group named like the
//! property, else group 1), `dataType` (`string`, `int`, `float`, `boolean`; by default the
//! model's type), `scale`, `valueOffset`; `write` (a request with `{value}`) and `writeReply` (a
//! pattern the reply to a write must match; without it no reply is awaited).
//!
//! Visitor `configData`, binary: `request` (hex), `responseLength` (bytes, checksum included),
//! `responsePrefix` (hex the reply must start with), `offset` (byte), `dataType` (`int8` ...
//! `uint64`, `float32`, `float64`) or `length` (1, 2, 4, 8) with `signed`, `endianness`
//! (`big`|`little`), `bit` (0-7, a boolean), `scale`, `valueOffset`; `write` (hex with `{value}`,
//! encoded like the field) and `writeResponseLength` (0: no reply awaited).
//!
//! Properties due together that send the same request share one exchange. All devices on one
//! port share one line ([`mapper_sdk::line`]): requests never overlap, and a silent device
//! delays the others by its own timeout only.

pub mod checksum;
pub mod device;
pub use mapper_sdk::field;
pub mod mapper;
