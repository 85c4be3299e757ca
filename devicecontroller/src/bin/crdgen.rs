//! Writes the CRD YAMLs: `cargo run -p devicecontroller --bin crdgen [DIR]` (default
//! `devicecontroller/crds`).

use anyhow::Context;
use std::path::PathBuf;

fn main() -> anyhow::Result<()> {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("crds"));
    std::fs::create_dir_all(&dir).with_context(|| format!("failed to create {}", dir.display()))?;
    for (file, yaml) in devicecontroller::crd_files()? {
        let path = dir.join(file);
        std::fs::write(&path, yaml)
            .with_context(|| format!("failed to write {}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
