//! `kubectl logs` and `kubectl exec` through the streaming tunnel, against the same on the node,
//! with the real binaries, the real `kubectl` and a real containerd (as root):
//!
//! ```sh
//! cargo run --release -p hardware-tests --bin stream-bench   # [--lines 200000] [--rounds 20]
//!                                                            # [--bytes-per-second 2097152]
//! ```
//!
//! `cloudcore` and one `edgecore` joined by token (its tunnel's `cloud.streams.bytesPerSecond`
//! from `--bytes-per-second`), edged on the harness's containerd, `mapper-modbus` polling an
//! in-process Modbus simulator every 50 ms. It measures:
//! - a log of `--lines` lines of 100 bytes read whole: `kubectl logs` through the tunnel against
//!   `GET /api/v1/pods/{ns}/{name}/log` on the node (what `kectl logs` reads), lines per second;
//! - `kubectl exec POD -- echo` through the tunnel against `ctr tasks exec` on the node (the
//!   runtime's own client), `--rounds` times;
//! - `kubectl port-forward` to a web server in a pod (busybox `httpd`, host network): an 8 MiB
//!   download through the tunnel against the same from the node's own address, MB/s (best of
//!   3), and a small `GET` through the open forward against the same on the node, `--rounds`
//!   times;
//! - a register change until `DeviceStatus` shows it, `--rounds` times, first with no stream
//!   open, then while a pod writes 1 MB of log a second and `kubectl logs -f` reads it: what an
//!   open stream costs the session's twin reports.

use anyhow::Result;
use kube::api::{Api, DynamicObject};
use serde_json::json;
use sim::containerd::Containerd;
use sim::modbus_sim::Sim;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hardware_tests::bench::{
    Kill, ar, arg, create, devices_api, percentiles, start_cloud, until_reported,
};

/// `kubectl` on the bench's cloud: its exit status and stdout.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<(bool, Vec<u8>)> {
    let out = Command::new(sim::stack::kubectl_bin())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stderr(Stdio::null())
        .output()?;
    Ok((out.status.success(), out.stdout))
}

fn main() -> Result<()> {
    let sim = Sim::with(|s| {
        s.holding.insert(0, 1);
    });
    let (sim_port, _sim_rt) = sim.start("127.0.0.1:0")?;
    tokio::runtime::Runtime::new()?.block_on(run(sim, sim_port))
}

async fn run(sim: Sim, sim_port: u16) -> Result<()> {
    let lines = arg("--lines", 200_000)?;
    let rounds = arg("--rounds", 20)?;
    let rate = arg("--bytes-per-second", 2_097_152)?;
    let bins = sim::built_binaries(!cfg!(debug_assertions))?;
    let dir = tempfile::tempdir()?;
    let rt = Containerd::start(&dir.path().join("containerd"));
    rt.import_busybox();
    let (http, mqtt) = (sim::free_port(), sim::free_port());
    let mut kill = Kill(Vec::new());
    let cloud = start_cloud(&bins, dir.path(), &mut kill).await?;
    let client = cloud.client.clone();
    let kubeconfig = dir.path().join("cloud/admin.kubeconfig");

    let models = devices_api(&client, "DeviceModel");
    let devices = devices_api(&client, "Device");
    create(
        &models,
        json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "DeviceModel",
        "metadata": {"name": "probe"}, "spec": {"protocol": "modbus", "properties": [
            {"name": "value", "type": "INT", "accessMode": "ReadOnly"}]}}),
    )
    .await?;
    create(&devices, json!({"apiVersion": "devices.kubeedge.io/v1beta1", "kind": "Device",
        "metadata": {"name": "probe"},
        "spec": {"nodeName": "edge-node-1", "deviceModelRef": {"name": "probe"},
            "protocol": {"protocolName": "modbus", "configData": {"ip": "127.0.0.1", "port": sim_port}},
            "properties": [{"name": "value", "collectCycle": 50, "reportCycle": 50, "reportToCloud": true,
                "visitors": {"protocolName": "modbus", "configData": {"register": "HoldingRegister", "offset": 0}}}]}})).await?;

    std::fs::write(
        dir.path().join("edgecore.yaml"),
        cloud.edge_config(
            http,
            mqtt,
            &format!(", streams: {{bytesPerSecond: {rate}}}"),
            &format!(
                "edged: {{runtimeEndpoint: \"unix://{}\", syncPeriodMs: 500}}\n",
                rt.socket.display()
            ),
        ),
    )?;
    hardware_tests::bench::start_edge_and_modbus_mapper(&bins, dir.path(), &mut kill).await?;

    // The pods: one with a log of `lines` lines, one that writes 1 MB a second.
    let line = "x".repeat(99);
    let pods_yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: big}}\nspec:\n  nodeName: edge-node-1\n  hostNetwork: true\n  containers:\n  - {{name: main, image: edged-test/busybox:1, imagePullPolicy: Never, command: [sh, -c, 'busybox yes {line} | busybox head -n {lines}; echo done; sleep 36000']}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: spew}}\nspec:\n  nodeName: edge-node-1\n  hostNetwork: true\n  containers:\n  - {{name: main, image: edged-test/busybox:1, imagePullPolicy: Never, command: [sh, -c, 'while true; do busybox yes {line} | busybox head -n 10000; sleep 1; done']}}\n"
    );
    let web_port = sim::free_port();
    let pods_yaml = format!(
        "{pods_yaml}---\napiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  nodeName: edge-node-1\n  hostNetwork: true\n  containers:\n  - {{name: main, image: edged-test/busybox:1, imagePullPolicy: Never, command: [sh, -c, 'mkdir -p /tmp/www && head -c 8388608 /dev/zero > /tmp/www/big && echo ok > /tmp/www/small && exec httpd -f -p {web_port} -h /tmp/www']}}\n"
    );
    let applied = dir.path().join("pods.yaml");
    std::fs::write(&applied, pods_yaml)?;
    let (ok, _) = kubectl(
        &kubeconfig,
        &["apply", "-f", &applied.display().to_string()],
    )?;
    anyhow::ensure!(ok, "kubectl apply of the pods failed");
    // Only `big` runs for the first measures; `spew` is deleted until it is wanted.
    let (ok, _) = kubectl(&kubeconfig, &["delete", "pod", "spew", "--wait=false"])?;
    anyhow::ensure!(ok, "kubectl delete spew failed");
    let agent = sim::agent();
    let direct = format!("http://127.0.0.1:{http}/api/v1/pods/default/big/log");
    sim::poll::until_async(
        300,
        Duration::from_millis(500),
        "the big pod's whole log",
        async || {
            let (ok, tail) = kubectl(&kubeconfig, &["logs", "big", "--tail=1"]).ok()?;
            (ok && tail == b"done\n").then_some(())
        },
    )
    .await?;

    println!(
        "streams: 1 edgecore (tunnel bytesPerSecond {rate}), busybox pods on containerd, the real kubectl"
    );
    let mut through = Vec::new();
    let mut on_node = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let (ok, out) = kubectl(&kubeconfig, &["logs", "big"])?;
        let s = t.elapsed().as_secs_f64();
        anyhow::ensure!(
            ok && out.len() >= lines * 100,
            "kubectl logs big gave {} bytes",
            out.len()
        );
        through.push(s);
        let t = Instant::now();
        let mut resp = agent.get(&direct).call()?;
        let body = resp
            .body_mut()
            .with_config()
            .limit(u64::MAX)
            .read_to_vec()?;
        on_node.push(t.elapsed().as_secs_f64());
        anyhow::ensure!(
            body.len() >= lines * 100,
            "the node's log gave {} bytes",
            body.len()
        );
    }
    let best = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    let (a, b) = (best(&through), best(&on_node));
    println!(
        "log of {lines} lines (100 B): kubectl logs through the tunnel {:.0} lines/s ({:.1} MB/s), on the node {:.0} lines/s ({:.1} MB/s): {:.2}x (best of 3)",
        lines as f64 / a,
        (lines * 100) as f64 / a / 1e6,
        lines as f64 / b,
        (lines * 100) as f64 / b / 1e6,
        b / a
    );

    // exec round trips.
    let id = {
        let (_, list) = sim::get(&agent, &format!("http://127.0.0.1:{http}/api/v1/pods"));
        list["pods"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == "big")
            .and_then(|p| {
                p["containers"][0]["containerId"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_default()
    };
    let mut tunnel = Vec::new();
    let mut ctr = Vec::new();
    for i in 0..rounds {
        let t = Instant::now();
        let (ok, _) = kubectl(&kubeconfig, &["exec", "big", "--", "echo"])?;
        anyhow::ensure!(ok, "kubectl exec failed");
        tunnel.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        rt.ctr(&[
            "tasks",
            "exec",
            "--exec-id",
            &format!("bench-{i}"),
            &id,
            "echo",
        ]);
        ctr.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    println!(
        "kubectl exec -- echo through the tunnel: {}",
        percentiles(tunnel)
    );
    println!(
        "ctr tasks exec ... echo on the node:     {}",
        percentiles(ctr)
    );

    // port-forward: bytes and round trips through the tunnel, against the node's own address.
    let forward = sim::stack::port_forward(
        &sim::stack::kubectl_bin(),
        &kubeconfig,
        "pod/web",
        web_port,
        &[],
        &[],
    );
    let direct = sim::stack::PortForward::to(web_port);
    sim::poll::until_async(
        120,
        Duration::from_millis(500),
        "the web pod answering through port-forward",
        async || {
            forward
                .get("/small")
                .ok()
                .filter(|(s, _)| s.contains("200"))
        },
    )
    .await?;
    let download = |via: &sim::stack::PortForward| -> Result<f64> {
        let t = Instant::now();
        let (_, body) = via.get("/big")?;
        anyhow::ensure!(body.len() == 8 << 20, "GET /big gave {} bytes", body.len());
        Ok(t.elapsed().as_secs_f64())
    };
    let (mut through, mut on_node) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        through.push(download(&forward)?);
        on_node.push(download(&direct)?);
    }
    let (a, b) = (best(&through), best(&on_node));
    println!(
        "8 MiB over HTTP: kubectl port-forward through the tunnel {:.1} MB/s, on the node {:.1} MB/s: {:.2}x (best of 3)",
        8.0 * 1.048576 / a,
        8.0 * 1.048576 / b,
        b / a
    );
    let (mut through, mut on_node) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (via, into) in [(&forward, &mut through), (&direct, &mut on_node)] {
            let t = Instant::now();
            let (status, _) = via.get("/small")?;
            anyhow::ensure!(status.contains("200"), "GET /small: {status}");
            into.push(t.elapsed().as_secs_f64() * 1000.0);
        }
    }
    println!(
        "GET /small through kubectl port-forward: {}",
        percentiles(through)
    );
    println!(
        "GET /small on the node:                  {}",
        percentiles(on_node)
    );
    drop(forward);

    // Twin reports, without and with a 1 MB/s log stream open.
    let statuses: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &ar("DeviceStatus"));
    let measure = async |base: u16| -> Result<Vec<f64>> {
        let mut up = Vec::new();
        for i in 0..rounds {
            let v = base + i as u16;
            sim.edit(|s| s.holding.insert(0, v));
            let t = Instant::now();
            up.push(until_reported(&statuses, "probe", "value", &v.to_string(), t).await?);
        }
        Ok(up)
    };
    println!(
        "register -> DeviceStatus, no stream:       {}",
        percentiles(measure(1000).await?)
    );
    let (ok, _) = kubectl(
        &kubeconfig,
        &["apply", "-f", &applied.display().to_string()],
    )?;
    anyhow::ensure!(ok, "kubectl apply of spew failed");
    let t0 = Instant::now();
    let mut follower = loop {
        let mut f = Command::new(sim::stack::kubectl_bin())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["logs", "-f", "spew"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut out = f.stdout.take().ok_or_else(|| anyhow::anyhow!("stdout"))?;
        let mut first = [0u8; 100];
        if std::io::Read::read_exact(&mut out, &mut first).is_ok() {
            // Read on, counting, in a thread of its own.
            let counted = std::thread::spawn(move || {
                std::io::copy(&mut out, &mut std::io::sink()).unwrap_or(0)
            });
            break (f, counted, Instant::now());
        }
        let _ = f.kill();
        let _ = f.wait();
        anyhow::ensure!(t0.elapsed() < Duration::from_secs(120), "spew never logged");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let with = measure(2000).await?;
    let _ = follower.0.kill();
    let _ = follower.0.wait();
    let bytes = follower.1.join().unwrap_or(0);
    let secs = follower.2.elapsed().as_secs_f64();
    println!(
        "register -> DeviceStatus, while kubectl logs -f reads {:.2} MB/s: {}",
        bytes as f64 / secs / 1e6,
        percentiles(with)
    );
    Ok(())
}
