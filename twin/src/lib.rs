//! The device twin: desired and reported state per property, versions, delta and conflicts, and
//! its SQLite store. Filled by the edge-twin issue; intentionally empty until then.
