//! The end-to-end tests (`tests/`) and benches (`src/bin/`) of the real binaries; [`bench`]
//! holds what the cloud benches share.

pub mod bench;
