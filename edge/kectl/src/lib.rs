//! `kectl`, the command-line tool for users. The checks behind `kectl validate` live in
//! `api::validate::set`, so that tests, edgecore and the binary run the same code; the twin
//! commands talk to edgecore's local HTTP API.

pub use api::validate::set as validate;

pub mod twin;
