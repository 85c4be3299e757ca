//! `cargo run -p quickstart`: the whole device layer on one machine with
//! nothing but Rust installed. Starts an in-process Modbus TCP simulator of an oven on
//! 127.0.0.1:5020 (its temperature follows the set point while the heater is on), `edgecore` on
//! `examples/config/edgecore.yaml` (embedded MQTT broker, the example manifests) and
//! `mapper-modbus` on `examples/config/mapper-modbus.yaml`, then prints the oven's twin as it
//! changes. In a second terminal: `cargo run -p kectl -- twin set default/oven-1 setpoint 95`.
//! Ctrl-C stops everything.
//!
//! `--cloud` runs the whole stack instead: `cloudcore` on `examples/config/cloudcore.yaml`
//! (embedded API on 127.0.0.1:6443, cloudhub on 127.0.0.1:10000 and :10002, data in
//! `target/quickstart/`), the examples applied through its API, and `edgecore` joined to it by
//! token (no local manifests: its devices come from the cloud). `kubectl` shows the values in
//! DeviceStatus and sets desired values there.

use sim::modbus_sim::Sim;
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
    let root = sim::workspace_root();
    eprintln!("quickstart: building edgecore, mapper-modbus and kectl ...");
    let bin_dir = match sim::built_binaries(false) {
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
    let cloud_mode = std::env::args().any(|a| a == "--cloud");
    let mut edgecore_config = config.join("edgecore.yaml");
    if cloud_mode {
        match start_cloud(&root, &bin_dir, &mut children) {
            Ok(c) => edgecore_config = c,
            Err(e) => {
                eprintln!("quickstart: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let spawn = |bin: &str, args: &[&str]| {
        Command::new(bin_dir.join(bin))
            .args(args)
            .current_dir(&root)
            .spawn()
            .map_err(|e| format!("cannot start {bin}: {e}"))
    };
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
        // Every module started: `/readyz` no longer says `starting`.
        sim::edgecore_started(&agent, "http://127.0.0.1:10360")
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
    if cloud_mode {
        let kc = root.join("target/quickstart/cloudcore-data/admin.kubeconfig");
        eprintln!(
            "quickstart: running, devices from the cloud. In another terminal:\n  kubectl --kubeconfig {kc} get devicestatus oven-1 -o yaml\n  kubectl --kubeconfig {kc} patch device oven-1 --type=json -p '[{{\"op\":\"replace\",\"path\":\"/spec/properties/1/desired/value\",\"value\":\"95\"}}]'\n  kubectl --kubeconfig {kc} get nodes\nCtrl-C stops.",
            kc = kc.display()
        );
    } else {
        eprintln!(
            "quickstart: running. In another terminal:\n  cargo run -p kectl -- twin get default/oven-1\n  cargo run -p kectl -- twin set default/oven-1 setpoint 95\n  curl http://127.0.0.1:7777/api/v1/device/default/oven-1/temperature\nCtrl-C stops."
        );
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let stop = stop.clone();
        let _ = ctrlc_like(move || stop.store(true, std::sync::atomic::Ordering::Relaxed));
    }
    let mut last = String::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        let (status, twin) = sim::get(&agent, twin_url);
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

/// Calls `f` on SIGINT or SIGTERM, from a thread with its own small runtime. The handlers are
/// registered before this returns, so a signal sent right after is not the default action.
fn ctrlc_like(f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (term, int) = {
        use tokio::signal::unix::{SignalKind, signal};
        let _inside = rt.enter();
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    std::thread::spawn(move || {
        rt.block_on(async {
            let (Ok(mut term), Ok(mut int)) = (term, int) else {
                return;
            };
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        });
        f();
    });
    Ok(())
}

/// Starts cloudcore on `examples/config/cloudcore.yaml` (fresh data in `target/quickstart/`),
/// applies the examples through its API, and writes an edgecore config that joins it by token;
/// returns that config's path.
fn start_cloud(
    root: &std::path::Path,
    bin_dir: &std::path::Path,
    children: &mut Kill,
) -> Result<std::path::PathBuf, String> {
    let work = root.join("target/quickstart");
    // Fresh each run: an edge keeps the certificate of the CA it joined.
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let cloud_config = root.join("examples/config/cloudcore.yaml");
    let child = Command::new(bin_dir.join("cloudcore"))
        .arg("--config")
        .arg(&cloud_config)
        .current_dir(root)
        .spawn()
        .map_err(|e| format!("cannot start cloudcore: {e}"))?;
    children.0.push(child);
    let kubeconfig = work.join("cloudcore-data/admin.kubeconfig");
    let up = (0..200).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        kubeconfig.exists() && std::net::TcpStream::connect("127.0.0.1:10002").is_ok()
    });
    if !up {
        return Err(
            "cloudcore did not start (is another one using 127.0.0.1:6443 or :10000?)".into(),
        );
    }
    let out = Command::new(bin_dir.join("cloudcore"))
        .arg("gettoken")
        .arg("--config")
        .arg(&cloud_config)
        .output()
        .map_err(|e| format!("cloudcore gettoken: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cloudcore gettoken: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let applied = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?
        .block_on(apply_examples(&kubeconfig, &root.join("examples")))?;
    eprintln!(
        "quickstart: cloudcore on https://127.0.0.1:6443; applied {applied} objects from examples/"
    );
    let edge = work.join("edgecore.yaml");
    std::fs::write(
        &edge,
        format!(
            "nodeName: edge-node-1\ndataDir: edgecore-data\nmodules: {{manifests: false}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:1883\"}}\nhttp: {{address: \"127.0.0.1:10360\"}}\ndmi: {{socket: ../edgecore-data/dmi.sock}}\ncloud: {{server: \"wss://127.0.0.1:10000\", certServer: \"https://127.0.0.1:10002\", token: \"{token}\"}}\n"
        ),
    )
    .map_err(|e| format!("cannot write {}: {e}", edge.display()))?;
    Ok(edge)
}

/// Server-side applies every Device and DeviceModel of `dir`'s YAML files.
async fn apply_examples(
    kubeconfig: &std::path::Path,
    dir: &std::path::Path,
) -> Result<usize, String> {
    use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
    use serde::Deserialize;
    let client = cloud::cluster_client(kubeconfig)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut applied = 0;
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v =
                serde_json::Value::deserialize(doc).map_err(|e| format!("{}: {e}", f.display()))?;
            let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str())
            else {
                continue;
            };
            let plural = match kind {
                "Device" => "devices",
                "DeviceModel" => "devicemodels",
                _ => continue,
            };
            let ns = v["metadata"]["namespace"].as_str().unwrap_or("default");
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("devices.kubeedge.io", "v1beta1", kind),
                plural,
            );
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
            api.patch(
                name,
                &PatchParams::apply("quickstart").force(),
                &Patch::Apply(&v),
            )
            .await
            .map_err(|e| format!("cannot apply {kind} {ns}/{name}: {e}"))?;
            applied += 1;
        }
    }
    Ok(applied)
}
