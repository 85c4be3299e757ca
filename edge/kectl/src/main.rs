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
    /// Read and set device twins on a running edgecore.
    Twin {
        /// edgecore's HTTP API (`http.address` in its config).
        #[arg(long, global = true, env = "KECTL_SERVER", default_value = kectl::twin::DEFAULT_SERVER)]
        server: String,
        /// Print the JSON document instead of a table.
        #[arg(long, short, global = true)]
        json: bool,
        #[command(subcommand)]
        command: TwinCommand,
    },
    /// List the pods edged runs on a running edgecore (phase, containers, restarts, reasons).
    Pods {
        #[arg(long, env = "KECTL_SERVER", default_value = kectl::twin::DEFAULT_SERVER)]
        server: String,
        /// Print the JSON document instead of a table.
        #[arg(long, short)]
        json: bool,
    },
    /// Print a pod's container log, as edgecore's container runtime wrote it.
    Logs {
        #[arg(long, env = "KECTL_SERVER", default_value = kectl::twin::DEFAULT_SERVER)]
        server: String,
        /// NAMESPACE/NAME (NAME alone means namespace default).
        pod: String,
        /// The container, when the pod has several.
        #[arg(long, short)]
        container: Option<String>,
        /// The run before the last restart.
        #[arg(long, short)]
        previous: bool,
        /// Only the last N lines.
        #[arg(long)]
        tail: Option<usize>,
    },
    /// Hardware-in-the-loop runs without the hardware (runs `devsim hil`).
    Hil {
        #[command(subcommand)]
        command: HilCommand,
    },
    /// Draft the DeviceModel and Device manifests of devices from what answers on the wire,
    /// never writing: `kectl discover HOST:PORT [--units 1-10] [-o draft.yaml]` (Modbus TCP),
    /// `kectl discover /dev/ttyUSB0 --units 1-247` (an RTU line, its settings found),
    /// `kectl discover opc.tcp://HOST:PORT` (an OPC UA server, browsed). Runs `devsim discover`.
    Discover {
        /// The device's address and `devsim discover`'s options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// `kectl debug collect [-o FILE] [--log FILE]`: a support bundle with no secret in it;
    /// `kectl debug check`: a line per prerequisite of this node. Runs `edgecore debug`
    /// (`--config FILE` for another config than /etc/kubeedge/edgecore.yaml).
    Debug {
        /// `collect` or `check` and their options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<std::ffi::OsString>,
    },
}

#[derive(Subcommand)]
enum HilCommand {
    /// Serve the devices of a HIL file's manifests, start edgecore and mapper-modbus on them,
    /// play its steps and check the twin: `kectl hil run FILE [--junit REPORT.xml] [--speed N]`.
    Run {
        /// The HIL file and `devsim hil`'s options.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// `devsim SUB ARGS`: `devsim` beside this binary, else on PATH; its exit code.
fn run_devsim(sub: &str, args: &[std::ffi::OsString]) -> ExitCode {
    run_beside("devsim", sub, args)
}

/// `PROGRAM SUB ARGS`: `PROGRAM` beside this binary, else on PATH; its exit code.
fn run_beside(program: &str, sub: &str, args: &[std::ffi::OsString]) -> ExitCode {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(program)))
        .filter(|p| p.exists());
    let path = beside.unwrap_or_else(|| PathBuf::from(program));
    match std::process::Command::new(&path)
        .arg(sub)
        .args(args)
        .status()
    {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(2)),
        Err(e) => {
            eprintln!(
                "kectl {sub}: cannot run {} ({e}); it is built with `cargo build -p {}` and found beside kectl or on PATH",
                path.display(),
                if program == "devsim" {
                    "devsim"
                } else {
                    "edge"
                }
            );
            ExitCode::from(2)
        }
    }
}

#[derive(Subcommand)]
enum TwinCommand {
    /// Show the twin of a device: per property the desired and the reported value.
    Get {
        /// NAMESPACE/NAME (NAME alone means namespace default).
        device: String,
    },
    /// Set the desired value of a property; the device's mapper writes it to the device.
    Set {
        /// NAMESPACE/NAME (NAME alone means namespace default).
        device: String,
        property: String,
        /// The value; a negative number needs no `--` (`kectl twin set d1 offset -321`).
        #[arg(allow_negative_numbers = true)]
        value: String,
        /// Apply only if the device's desired version is still this number.
        #[arg(long)]
        if_version: Option<u64>,
    },
    /// List the devices of the node.
    List,
    /// A property's reported values over time, from the gateway's history (`$state`: the
    /// device's state).
    History {
        /// NAMESPACE/NAME (NAME alone means namespace default).
        device: String,
        property: String,
        /// From: ms since the epoch, `now`, or back from now: `-24h`, `-7d`, `-30m` (default: an
        /// hour before --to).
        #[arg(long, allow_hyphen_values = true)]
        from: Option<String>,
        /// To (default now), as --from.
        #[arg(long, allow_hyphen_values = true)]
        to: Option<String>,
        /// A bucket per step (`30s`, `1m`, `1h`): min, max, mean, last, count; none: each point.
        #[arg(long)]
        step: Option<String>,
        /// CSV instead of a table.
        #[arg(long)]
        csv: bool,
    },
}

fn run_twin(server: &str, json: bool, command: &TwinCommand) -> anyhow::Result<bool> {
    let client = kectl::twin::Client::new(server);
    let (doc, table): (serde_json::Value, fn(&serde_json::Value) -> String) = match command {
        TwinCommand::Get { device } => {
            let (ns, name) = kectl::twin::split_id(device)?;
            (client.get(&ns, &name)?, kectl::twin::format_twin)
        }
        TwinCommand::Set {
            device,
            property,
            value,
            if_version,
        } => {
            let (ns, name) = kectl::twin::split_id(device)?;
            let values = [(property.clone(), value.clone())];
            (
                client.set(&ns, &name, &values, *if_version)?,
                kectl::twin::format_twin,
            )
        }
        TwinCommand::List => (client.list()?, kectl::twin::format_list),
        TwinCommand::History {
            device,
            property,
            from,
            to,
            step,
            csv,
        } => {
            let (ns, name) = kectl::twin::split_id(device)?;
            let q = kectl::twin::HistoryQuery {
                from: from.clone(),
                to: to.clone(),
                step: step.clone(),
                csv: *csv,
            };
            let doc = client.history(&ns, &name, property, &q)?;
            if *csv {
                print!("{}", doc.as_str().unwrap_or_default());
                return Ok(true);
            }
            (doc, kectl::twin::format_history)
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print!("{}", table(&doc));
    }
    Ok(true)
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
        Command::Hil {
            command: HilCommand::Run { args },
        } => return run_devsim("hil", args),
        Command::Discover { args } => return run_devsim("discover", args),
        Command::Debug { args } => return run_beside("edgecore", "debug", args),
        Command::Validate { files } => run_validate(files),
        Command::Twin {
            server,
            json,
            command,
        } => run_twin(server, *json, command),
        Command::Pods { server, json } => kectl::twin::Client::new(server).pods().and_then(|doc| {
            if *json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                print!("{}", kectl::twin::format_pods(&doc));
            }
            Ok(true)
        }),
        Command::Logs {
            server,
            pod,
            container,
            previous,
            tail,
        } => kectl::twin::split_id(pod).and_then(|(ns, name)| {
            let text = kectl::twin::Client::new(server).logs(
                &ns,
                &name,
                container.as_deref(),
                *previous,
                *tail,
            )?;
            print!("{text}");
            Ok(true)
        }),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("kectl: {e:#}");
            ExitCode::from(1)
        }
    }
}
