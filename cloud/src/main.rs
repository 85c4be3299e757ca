//! `cloudcore [--config FILE]`: see `cloud::config` for the file.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc rather than glibc's malloc: under a fleet's load the runtime's threads allocate
/// and free per message and per write, and glibc's arenas cost a third of the CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The config file the Debian package installs, which its unit runs cloudcore with.
const PACKAGED_CONFIG: &str = "/etc/cloudcore/cloudcore.yaml";

#[derive(Parser)]
#[command(
    name = "cloudcore",
    about = "The cloud side: an embedded Kubernetes-compatible API (or a real cluster) for KubeEdge's device API"
)]
struct Args {
    /// The YAML config file; with none, every default applies (the commands `gettoken`, `token`
    /// and `node` read /etc/cloudcore/cloudcore.yaml, the package's, when it is there).
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Prints a token an edge node joins with: `{sha256 of the CA}.{JWT}`, valid for
    /// `modules.cloudHub.tokenTtlHours`, for any node name (`token create` makes narrower ones).
    Gettoken,
    /// Join tokens: made, listed and revoked.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Edge nodes' certificates.
    #[command(subcommand)]
    Node(NodeCommand),
}

#[derive(clap::Subcommand)]
enum NodeCommand {
    /// Revokes the certificate a node was last given: cloudhub and the certificate port refuse
    /// it from now on, and the name may be joined again with a token.
    Revoke { name: String },
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Prints a new join token.
    Create {
        /// The only node name it joins as.
        #[arg(long)]
        node: Option<String>,
        /// How many joins it allows.
        #[arg(long)]
        joins: Option<u32>,
        /// How long it is valid (default: modules.cloudHub.tokenTtlHours).
        #[arg(long)]
        ttl_hours: Option<u64>,
    },
    /// Lists the tokens given out (id, expiry, node, joins, revoked); never the tokens.
    List,
    /// Revokes a token by its id: it joins nothing more.
    Revoke { id: String },
}

fn token_command(config: &cloud::config::Config, c: TokenCommand) -> anyhow::Result<String> {
    let book = cloud::JoinBook::new(&config.data_dir);
    Ok(match c {
        TokenCommand::Create {
            node,
            joins,
            ttl_hours,
        } => cloud::create_token(config, ttl_hours, node, joins)?,
        TokenCommand::List => {
            let mut out = format!(
                "{:<12}  {:<20}  {:<20}  {:<10}  {}",
                "ID", "EXPIRES (UTC)", "NODE", "JOINS", "STATE"
            );
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0);
            for t in book.list()? {
                let expires = api::rfc3339::of_unix_seconds(t.expires as i64).unwrap_or_default();
                let joins = match t.max_joins {
                    Some(m) => format!("{}/{m}", t.joins),
                    None => t.joins.to_string(),
                };
                let state = if t.revoked {
                    "revoked"
                } else if t.expires <= now {
                    "expired"
                } else {
                    "valid"
                };
                out.push_str(&format!(
                    "\n{:<12}  {:<20}  {:<20}  {:<10}  {state}",
                    t.id,
                    expires,
                    t.node.as_deref().unwrap_or("(any)"),
                    joins
                ));
            }
            out
        }
        TokenCommand::Revoke { id } => {
            if !book.revoke(&id)? {
                anyhow::bail!("no token {id:?} (cloudcore token list)");
            }
            format!("token {id} revoked")
        }
    })
}

fn main() -> ExitCode {
    // One malloc arena for every thread, and freed memory handed back every few seconds, as
    // edgecore does: an IO-bound server's resident size otherwise stays at its peak.
    rt::sys::single_arena();
    api::manifest::parse_in_one_pass();
    rt::sys::release_freed_every(std::time::Duration::from_secs(5));
    let args = Args::parse();
    rt::bootstrap::init_tracing("info");
    use cloud::config::ConfigFile;
    // A command works on the files of the cloudcore that runs: the package's config when none is
    // given and it is there.
    let file = match (&args.command, args.config) {
        (Some(_), None) => Some(PathBuf::from(PACKAGED_CONFIG)).filter(|f| f.exists()),
        (_, given) => given,
    };
    let config = match cloud::config::Config::load_or_defaults(file.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cloudcore: {e}");
            return ExitCode::from(2);
        }
    };
    if args.command.is_some()
        && let Err(e) = cloud::started_here(&config)
    {
        eprintln!("cloudcore: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Some(Command::Node(NodeCommand::Revoke { name })) = &args.command {
        let book = cloud::JoinBook::new(&config.data_dir);
        return match book.revoke_node(name) {
            Ok(true) => {
                println!("the certificate of node {name} is revoked");
                ExitCode::SUCCESS
            }
            Ok(false) => {
                eprintln!("cloudcore node revoke: no certificate was given to node {name:?}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("cloudcore node revoke: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Token(c)) = args.command {
        return match token_command(&config, c) {
            Ok(t) => {
                println!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cloudcore token: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::Gettoken) = args.command {
        return match cloud::get_token(&config) {
            Ok(t) => {
                println!("{t}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("cloudcore gettoken: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    // Every edge session holds a socket.
    rt::bootstrap::raise_nofile_limit();
    rt::bootstrap::run("cloudcore", rt::bootstrap::Threads::PerCore, |cancel| {
        cloud::run(config, cancel)
    })
}
