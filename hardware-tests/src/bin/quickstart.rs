//! `cargo run -p hardware-tests --bin quickstart`: the whole device layer on one machine with
//! nothing but Rust installed. Starts an in-process Modbus TCP simulator of an oven on
//! 127.0.0.1:5020 (its temperature follows the set point while the heater is on), `edgecore` on
//! `examples/config/edgecore.yaml` (embedded MQTT broker, the example manifests) and
//! `mapper-modbus` on `examples/config/mapper-modbus.yaml`, then prints the oven's twin as it
//! changes. In a second terminal: `cargo run -p kectl -- twin set default/oven-1 setpoint 95`.
//! Ctrl-C stops everything.

use hardware_tests::modbus_sim::Sim;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

struct Kill(Vec<Child>);

impl Drop for Kill {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
        for c in &mut self.0 {
            let _ = c.wait();
        }
    }
}

fn main() -> ExitCode {
    let root = hardware_tests::workspace_root();
    eprintln!("quickstart: building edgecore, mapper-modbus and kectl ...");
    let bin_dir = match hardware_tests::built_binaries(false) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("quickstart: {e}");
            return ExitCode::FAILURE;
        }
    };

    // The simulator runs in this process.
    let sim = Sim::oven();
    let _sim_runtime = match sim.start("127.0.0.1:5020") {
        Ok((_, rt)) => {
            rt.spawn(sim.clone().animate_oven(Duration::from_secs(1)));
            eprintln!("quickstart: Modbus TCP oven simulator on 127.0.0.1:5020");
            rt
        }
        Err(e) => {
            eprintln!("quickstart: cannot serve Modbus TCP on 127.0.0.1:5020: {e}");
            return ExitCode::FAILURE;
        }
    };

    let config = root.join("examples/config");
    let mut children = Kill(Vec::new());
    let spawn = |bin: &str, args: &[&str]| {
        Command::new(bin_dir.join(bin))
            .args(args)
            .current_dir(&root)
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))
    };
    let edgecore_config = config.join("edgecore.yaml");
    match spawn(
        "edgecore",
        &["--config", &edgecore_config.to_string_lossy()],
    ) {
        Ok(c) => children.0.push(c),
        Err(e) => {
            eprintln!("quickstart: {e}");
            return ExitCode::FAILURE;
        }
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(5)))
        .build()
        .into();
    let twin_url = "http://127.0.0.1:10360/api/v1/devices/default/oven-1";
    let up = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        hardware_tests::get(&agent, "http://127.0.0.1:10360/healthz").0 == 200
    });
    if !up {
        eprintln!(
            "quickstart: edgecore did not start (is another one running on 127.0.0.1:10360?)"
        );
        return ExitCode::FAILURE;
    }
    let mapper_config = config.join("mapper-modbus.yaml");
    match spawn(
        "mapper-modbus",
        &["--config-file", &mapper_config.to_string_lossy()],
    ) {
        Ok(c) => children.0.push(c),
        Err(e) => {
            eprintln!("quickstart: {e}");
            return ExitCode::FAILURE;
        }
    }
    eprintln!(
        "quickstart: running. In another terminal:\n  cargo run -p kectl -- twin get default/oven-1\n  cargo run -p kectl -- twin set default/oven-1 setpoint 95\n  curl http://127.0.0.1:7777/api/v1/device/default/oven-1/temperature\nCtrl-C stops."
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        let _ = ctrlc_like(move || stop.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    let mut last = String::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        let (status, twin) = hardware_tests::get(&agent, twin_url);
        if status != 200 {
            continue;
        }
        let field = |p: &str, k: &str| {
            twin["properties"][p][k]["value"]
                .as_str()
                .unwrap_or("-")
                .to_string()
        };
        let line = format!(
            "oven-1 [{}] temperature {} C | setpoint desired {} reported {} | heater {}",
            twin["state"].as_str().unwrap_or("?"),
            field("temperature", "reported"),
            field("setpoint", "desired"),
            field("setpoint", "reported"),
            field("heater-on", "reported"),
        );
        if line != last {
            println!("{line}");
            last = line;
        }
    }
    eprintln!("quickstart: stopping");
    drop(children);
    ExitCode::SUCCESS
}

/// Calls `f` on SIGINT or SIGTERM, from a thread with its own small runtime.
fn ctrlc_like(f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::spawn(move || {
        rt.block_on(async {
            use tokio::signal::unix::{SignalKind, signal};
            let Ok(mut term) = signal(SignalKind::terminate()) else {
                return;
            };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        });
        f();
    });
    Ok(())
}
