//! `kectl`, the command-line tool for users. The checks behind `kectl validate` live here so that
//! tests and other tools run the same code as the binary.

pub mod validate;
