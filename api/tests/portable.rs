//! Gateways are mostly ARM (aarch64, armv7): the project's code stays free of what ties it to
//! x86_64 or to one byte order or word size, checked over every Rust source and script of the
//! workspace (this machine cannot build for another target; docs/cross-build.md says how).
//! What is refused, and why:
//!
//! - `target_arch`, `std::arch`/`core::arch`, `asm!`: code for one processor;
//! - `to_ne_bytes`/`from_ne_bytes`: the machine's byte order on a wire or in a file (Modbus,
//!   SPDY, the tunnel and the stores say big- or little-endian);
//! - `transmute`: layouts that differ between 32- and 64-bit targets;
//! - `x86_64-linux-gnu`, `/lib64/`: Debian's x86_64 library paths.

use std::path::{Path, PathBuf};

const REFUSED: [&str; 9] = [
    "target_arch",
    "std::arch::",
    "core::arch::",
    "asm!(",
    "_ne_bytes(",
    "transmute(",
    "x86_64-linux-gnu",
    "/lib64/",
    "global_asm!",
];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | ".venv" | "node_modules") {
                sources(&p, out);
            }
        } else if name.ends_with(".rs")
            || name.ends_with(".sh")
            || p.parent().is_some_and(|d| d.ends_with("scripts"))
        {
            out.push(p);
        }
    }
}

#[test]
fn no_source_ties_the_project_to_x86_64_or_to_the_machines_byte_order() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf();
    let this = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/portable.rs");
    let mut files = Vec::new();
    sources(&root, &mut files);
    assert!(
        files.len() > 100,
        "the workspace's sources: {}",
        files.len()
    );
    let mut found = Vec::new();
    for f in files.iter().filter(|f| **f != this) {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for r in REFUSED {
                if line.contains(r) {
                    found.push(format!("{}:{}: {r}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "x86_64-only or byte-order-bound code:\n{}",
        found.join("\n")
    );
}
