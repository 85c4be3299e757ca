//! `edgecore --config FILE`: the edge gateway. See `edge::config` for the file.
//! `edgecore join --cloud HOST --token TOKEN`: a bare gateway joined (see `edge::join`).

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "edgecore",
    version,
    about = "Edge gateway: device twins, MQTT $hw API, DMI server, local manifests"
)]
struct Args {
    /// YAML config file; without one, every default applies (`join`: the file it writes,
    /// default /etc/kubeedge/edgecore.yaml).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Join a cloudcore: check its CA against the token, get this node's certificate, write
    /// the config, start edgecore.service where systemd has it.
    Join(JoinArgs),
    /// A support bundle, or a check of this node's prerequisites.
    Debug {
        #[command(subcommand)]
        command: DebugCommand,
    },
    /// Undo a join: the cloud told to revoke this node's certificates, the certificates and
    /// the config removed; the twins kept unless --all.
    Reset {
        /// Remove the whole data directory too (twins, history, pods' logs).
        #[arg(long)]
        all: bool,
        /// Leave edgecore.service and the mappers' units as they are.
        #[arg(long)]
        no_stop: bool,
    },
    /// Parses a manifests directory and writes what it gave to standard output: a first
    /// start's parse, run by edgecore in a process of its own (`edge::manifests::helper`).
    #[command(name = "parse-manifests", hide = true)]
    ParseManifests {
        /// This node's name (devices bound to another node are skipped).
        #[arg(long)]
        node: String,
        /// The manifests directory.
        dir: PathBuf,
    },
}

#[derive(Subcommand)]
enum DebugCommand {
    /// Write one tar.gz for a support request (versions, the config with its secrets redacted,
    /// the running edgecore's health, mappers, devices, pods and metrics, the data directory,
    /// the certificate's validity, the last log lines, the checks); no secret is in it.
    Collect {
        /// The archive to write (default: edgecore-debug-NODE.tar.gz here).
        #[arg(long, short)]
        output: Option<PathBuf>,
        /// edgecore's log file, when it does not log to the journal.
        #[arg(long)]
        log: Option<PathBuf>,
    },
    /// A line per prerequisite (time sync, disk, serial ports, containerd, the cloud, the
    /// certificate's expiry); exit 1 when one fails.
    Check,
}

#[derive(clap::Args)]
struct JoinArgs {
    /// The cloud's host name or address (cloudhub and its certificate port).
    #[arg(long)]
    cloud: String,
    /// The join token (`cloudcore gettoken`); or --token-file.
    #[arg(
        long,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file whose first line is the token (keeps it out of the process list).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    #[arg(long, default_value_t = 10000)]
    hub_port: u16,
    #[arg(long, default_value_t = 10002)]
    cert_port: u16,
    #[arg(long, default_value = "/var/lib/edgecore")]
    data_dir: PathBuf,
    /// Replace the identity of a node already joined.
    #[arg(long)]
    force: bool,
    /// Write everything but do not start edgecore.service.
    #[arg(long)]
    no_start: bool,
    /// A label of this node's Node, KEY=VALUE (again for more).
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// A mapper to start beside it: modbus, serial, opcua, ble (again for more).
    #[arg(long = "mapper", value_name = "NAME")]
    mappers: Vec<String>,
    /// An external MQTT broker, HOST:PORT, instead of the embedded one.
    #[arg(long)]
    mqtt_broker: Option<String>,
    /// The group whose mappers reach the DMI socket (dmi.socketGroup); default
    /// `kubeedge-mappers` when that group exists (the mapper packages make it), else none.
    #[arg(long, value_name = "GROUP")]
    dmi_group: Option<String>,
    /// The DMI socket when it has a group (dmi.socket); default /run/edgecore/dmi.sock.
    #[arg(long, value_name = "PATH", default_value = "/run/edgecore/dmi.sock")]
    dmi_socket: PathBuf,
}

/// `edgecore join`.
fn join(a: JoinArgs, config: Option<PathBuf>) -> ExitCode {
    let token = match (&a.token, &a.token_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => match std::fs::read_to_string(f) {
            Ok(t) => t.lines().next().unwrap_or_default().trim().to_string(),
            Err(e) => {
                eprintln!(
                    "edgecore join: cannot read --token-file {}: {e}",
                    f.display()
                );
                return ExitCode::from(2);
            }
        },
        (None, None) => String::new(),
    };
    let Some(node_name) = a.node_name.or_else(rt::host::name) else {
        eprintln!("edgecore join: no host name to name the node by: give --node-name");
        return ExitCode::from(2);
    };
    let mut labels = Vec::new();
    for l in &a.labels {
        let Some((k, v)) = l.split_once('=') else {
            eprintln!("edgecore join: --label {l:?} is not KEY=VALUE");
            return ExitCode::from(2);
        };
        labels.push((k.to_string(), v.to_string()));
    }
    let args = edge::join::Join {
        cloud: a.cloud,
        hub_port: a.hub_port,
        cert_port: a.cert_port,
        token,
        node_name,
        config: config.unwrap_or_else(|| PathBuf::from("/etc/kubeedge/edgecore.yaml")),
        data_dir: a.data_dir,
        force: a.force,
        start: !a.no_start,
        labels,
        mappers: a.mappers,
        mqtt_broker: a.mqtt_broker,
        dmi: a
            .dmi_group
            .or_else(|| {
                rt::host::group_id(edge::join::MAPPERS_GROUP)
                    .map(|_| edge::join::MAPPERS_GROUP.to_string())
            })
            .map(|g| (a.dmi_socket, g)),
    };
    run_once("join", edge::join::join(&args))
}

/// `edgecore debug check`: its lines on stdout; exit 1 when one failed.
fn debug_check(config: &std::path::Path) -> ExitCode {
    match block_on("debug check", edge::debug::check(config)) {
        Ok((lines, ok)) => {
            for l in lines {
                println!("{l}");
            }
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(code) => code,
    }
}

/// Runs `edgecore {what}` to its end: each line it did on stdout, or why it failed (exit 1).
fn run_once(
    what: &str,
    task: impl std::future::Future<Output = anyhow::Result<Vec<String>>>,
) -> ExitCode {
    match block_on(what, task) {
        Ok(did) => {
            for line in did {
                println!("edgecore {what}: {line}");
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// `task` run to its end on a runtime of its own; its failure said (exit 1).
fn block_on<T>(
    what: &str,
    task: impl std::future::Future<Output = anyhow::Result<T>>,
) -> Result<T, ExitCode> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("edgecore {what}: {e}");
            ExitCode::from(1)
        })?;
    runtime.block_on(task).map_err(|e| {
        eprintln!("edgecore {what}: {e:#}");
        ExitCode::from(1)
    })
}

fn main() -> ExitCode {
    // Before anything could replace it (an upgrade renames a new binary over it).
    let exe = std::env::current_exe();
    let args = Args::parse();
    if let Some(Command::ParseManifests { node, dir }) = &args.command {
        // glibc's arenas per thread, and the parse on every core: a process that lives for
        // one parse has nothing to keep small.
        use edge::manifests::{HELPER_CANNOT_LIST, HELPER_COMMAND, HelperError};
        return match edge::manifests::helper(dir, node) {
            Ok(()) => ExitCode::SUCCESS,
            // edgecore reads the directory itself and says why it cannot.
            Err(HelperError::List(_)) => ExitCode::from(HELPER_CANNOT_LIST),
            Err(e) => {
                eprintln!("edgecore {HELPER_COMMAND}: {e}");
                ExitCode::from(1)
            }
        };
    }
    // Before any thread starts.
    rt::sys::single_arena();
    api::manifest::parse_in_one_pass();
    rt::bootstrap::init_tracing("info,rumqttd=warn");
    match args.command {
        Some(Command::Join(j)) => return join(j, args.config),
        Some(Command::Reset { all, no_stop }) => {
            let r = edge::join::Reset {
                config: args
                    .config
                    .unwrap_or_else(|| PathBuf::from("/etc/kubeedge/edgecore.yaml")),
                all,
                stop: !no_stop,
            };
            return run_once("reset", edge::join::reset(&r));
        }
        Some(Command::Debug { command }) => {
            let config = args
                .config
                .unwrap_or_else(|| PathBuf::from("/etc/kubeedge/edgecore.yaml"));
            return match command {
                DebugCommand::Collect { output, log } => {
                    let out = output.unwrap_or_else(|| {
                        let node = rt::host::name().unwrap_or_else(|| "node".into());
                        PathBuf::from(format!("edgecore-debug-{node}.tar.gz"))
                    });
                    let c = edge::debug::Collect { config, out, log };
                    run_once("debug collect", edge::debug::collect(&c))
                }
                DebugCommand::Check => debug_check(&config),
            };
        }
        Some(Command::ParseManifests { .. }) | None => {}
    }
    // The first start's parse of the manifests runs in this very binary, whatever is renamed
    // over its path meanwhile.
    let self_exe = PathBuf::from("/proc/self/exe");
    if let Some(helper) =
        (self_exe.exists().then_some(self_exe)).or_else(|| exe.as_ref().ok().cloned())
    {
        edge::manifests::parse_in_helper(helper);
    }
    edge::upgrade::stop_with_watcher();
    let relaunch = std::sync::Arc::new(edge::upgrade::Relaunch::of_process(
        exe.ok(),
        args.config.as_deref(),
    ));
    use edge::config::ConfigFile;
    let config = match edge::config::Config::load_or_defaults(args.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("edgecore: {e}");
            return ExitCode::from(2);
        }
    };
    let data_dir = config.data_dir.clone();
    let restart_dir = data_dir.clone();
    let trial = relaunch.clone();
    let code = rt::bootstrap::run(
        "edgecore",
        rt::bootstrap::Threads::PerCore,
        |cancel| async move {
            let ran = edge::app::run(config, cancel, trial.clone()).await;
            // On trial after an upgrade or a config update, a failure puts the old one back.
            if let Err(e) = &ran
                && trial.roll_back_after_failure(&data_dir, &format!("{e:#}"))
            {
                eprintln!("edgecore: rolled back after: {e:#}");
            }
            ran
        },
    );
    // Upgraded: the new edgecore starts as this one's child, watched on trial; rolled back: the
    // binary at edgecore's path starts in this process's place.
    match relaunch.restart(&restart_dir) {
        edge::upgrade::Restart::NotAsked => code,
        edge::upgrade::Restart::Exited(c) => ExitCode::from(c),
        edge::upgrade::Restart::Failed(e) => {
            eprintln!("edgecore: cannot start again after an upgrade: {e}");
            ExitCode::from(1)
        }
    }
}
