//! The OPC UA mapper: devices are OPC UA servers (PLCs, gateways, SCADA), properties are nodes.
//!
//! - [`config`]: the connection (`url`, `securityPolicy`, `securityMode`, identity, trust) and
//!   each property's node (`nodeID` in every OPC UA form, `dataType`, `indexRange`,
//!   `subscribe` with sampling, queue and deadband).
//! - [`value`]: variants to the twin's strings and back, typed.
//! - [`device`]: the session, batched Reads bounded by `MaxNodesPerRead`, Writes, and the
//!   subscription.
//! - [`mapper`]: the protocol on the mapper SDK.

pub mod config;
pub mod device;
pub mod mapper;
pub mod value;
