//! `kectl`: the command-line tool for users of the device layer.

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "kectl",
    version,
    about = "Command-line tool for KubeEdge-compatible devices"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check Device and DeviceModel manifests (YAML, several documents per file).
    ///
    /// Prints each problem as `FILE: KIND NAME: PATH: message` and exits 0 only when every
    /// object is valid (warnings do not fail).
    Validate {
        /// Manifest files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
}

fn run_validate(files: &[PathBuf]) -> anyhow::Result<bool> {
    let mut inputs = Vec::new();
    let mut unreadable = 0;
    for path in files {
        let shown = path.display().to_string();
        match std::fs::read(path)
            .with_context(|| format!("cannot read {shown}"))
            .and_then(|bytes| {
                String::from_utf8(bytes).with_context(|| format!("{shown} is not UTF-8 text"))
            }) {
            Ok(text) => inputs.push((shown, text)),
            Err(e) => {
                println!("{shown}: {e:#}");
                unreadable += 1;
            }
        }
    }
    let report = kectl::validate::validate_texts(&inputs);
    for finding in &report.findings {
        println!("{finding}");
    }
    eprintln!(
        "{} object(s) in {} file(s): {} error(s), {} warning(s){}",
        report.objects,
        inputs.len(),
        report.errors(),
        report.warnings(),
        if unreadable > 0 {
            format!(", {unreadable} file(s) unreadable")
        } else {
            String::new()
        }
    );
    Ok(report.is_valid() && unreadable == 0)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Validate { files } => run_validate(files),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("kectl: {e:#}");
            ExitCode::from(2)
        }
    }
}
