//! `modbus-sim`: the project's Modbus TCP simulator, with faults on the command line.
//!
//! ```text
//! modbus-sim --port 5020 --oven                         # the quickstart's oven, values changing
//! modbus-sim --port 5020 --holding 0=650 --holding 1=80 --coil 0=true \
//!            --exception 25 --delay-ms 200 --drop-after 100 --garbage
//! ```

use clap::Parser;
use sim::modbus_sim::Sim;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "modbus-sim",
    about = "Modbus TCP simulator with scriptable faults"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1")]
    address: String,
    #[arg(long, default_value_t = 5020)]
    port: u16,
    /// The quickstart's oven: temperature (HR0, 0.1 degree), set point (HR1), heater (coil 0).
    #[arg(long)]
    oven: bool,
    /// A holding register, ADDRESS=VALUE (repeatable).
    #[arg(long = "holding", value_parser = pair::<u16>)]
    holding: Vec<(u16, u16)>,
    /// An input register, ADDRESS=VALUE (repeatable).
    #[arg(long = "input", value_parser = pair::<u16>)]
    input: Vec<(u16, u16)>,
    /// A coil, ADDRESS=true|false (repeatable).
    #[arg(long = "coil", value_parser = pair::<bool>)]
    coil: Vec<(u16, bool)>,
    /// An address that answers with IllegalDataAddress (repeatable).
    #[arg(long = "exception")]
    exceptions: Vec<u16>,
    /// Wait this long before each answer.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Drop each connection after this many requests.
    #[arg(long)]
    drop_after: Option<u32>,
    /// Answer with garbage frames.
    #[arg(long)]
    garbage: bool,
}

fn pair<T: std::str::FromStr>(s: &str) -> Result<(u16, T), String> {
    let (a, v) = s.split_once('=').ok_or("expected ADDRESS=VALUE")?;
    let a = a
        .trim()
        .parse()
        .map_err(|_| format!("{a:?} is not an address"))?;
    let v = v
        .trim()
        .parse()
        .map_err(|_| format!("{v:?} is not a value"))?;
    Ok((a, v))
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let sim = if args.oven {
        Sim::oven()
    } else {
        Sim::default()
    };
    sim.edit(|s| {
        s.holding.extend(args.holding.iter().copied());
        s.input.extend(args.input.iter().copied());
        s.coils.extend(args.coil.iter().copied());
        s.exceptions.extend(args.exceptions.iter().copied());
        s.delay = Duration::from_millis(args.delay_ms);
        s.drop_after = args.drop_after;
    });
    if args.garbage {
        sim.set_mangle(sim::modbus_sim::Mangle::Garbage);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("modbus-sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    let address = format!("{}:{}", args.address, args.port);
    let result = rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&address).await?;
        println!("ready {address}");
        if args.oven {
            tokio::spawn(sim.clone().animate_oven(Duration::from_secs(1)));
        }
        sim.serve(listener).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("modbus-sim: {address}: {e}");
            ExitCode::FAILURE
        }
    }
}
