//! Mapper pods through the whole stack, with the real binaries and a real containerd (as root):
//!
//! ```sh
//! cargo run --release -p hardware-tests --bin pods-bench   # [--rounds 30] [--pods 50]
//! ```
//!
//! `cloudcore` (embedded API, edge controller, cloudhub) and one `edgecore` joined by token with
//! edged on its own containerd (the test harness's). It measures:
//! - apply → Running: a `mapper-modbus` pod (its image present on the node, its config in a
//!   ConfigMap) created through the API until the API shows it Running and ready (read every
//!   10 ms), `--rounds` times, each pod deleted and gone from the node before the next;
//! - edged's added memory: the RSS of an idle edgecore with edged against one without;
//! - `--pods` busybox pods created at once on the node: until all are Running in the API, and
//!   edgecore's RSS with them running.

use anyhow::Result;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;
use sim::containerd::{Containerd, binary_image};
use std::path::Path;
use std::time::{Duration, Instant};

use hardware_tests::bench::{Kill, spawn, start_cloud};

fn rss_kib(pid: u32) -> u64 {
    sim::vm_rss_kb(&pid.to_string())
}

/// Polls `f` every 10 ms (the grain of the figures this bench prints) until it holds.
async fn wait_for(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) -> Result<()> {
    sim::poll::until_async(secs, Duration::from_millis(10), what, async || {
        f().await.then_some(())
    })
    .await
}

fn running(p: &Pod) -> bool {
    let st = p.status.as_ref();
    st.and_then(|s| s.phase.as_deref()) == Some("Running")
        && st
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
}

/// An edgecore on its own (no cloud), with `extra` config; its RSS after it settled.
async fn idle_rss(bins: &Path, extra: &str) -> Result<u64> {
    let dir = tempfile::tempdir()?;
    let free = sim::free_port;
    std::fs::write(
        dir.path().join("edgecore.yaml"),
        format!(
            "nodeName: idle\ndataDir: edge\nmodules: {{manifests: false}}\nmqtt: {{mode: embedded, address: \"127.0.0.1:{}\"}}\nhttp: {{address: \"127.0.0.1:{}\"}}\ndmi: {{socket: dmi.sock}}\n{extra}",
            free(),
            free()
        ),
    )?;
    let k = Kill(vec![spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        dir.path(),
        "edgecore.log",
    )?]);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let rss = rss_kib(k.0[0].id());
    // Killed here (clearing the list instead left every run's two edgecores running).
    drop(k);
    Ok(rss)
}

use hardware_tests::bench::{arg, percentiles};

fn main() -> Result<()> {
    tokio::runtime::Runtime::new()?.block_on(run())
}

async fn run() -> Result<()> {
    let rounds = arg("--rounds", 30)?;
    let many = arg("--pods", 50)?;
    let bins = sim::built_binaries(!cfg!(debug_assertions))?;
    let dir = tempfile::tempdir()?;
    let rt = Containerd::start(&dir.path().join("containerd"));
    rt.import_busybox();
    let archive = binary_image(&bins, "mapper-modbus", "bench", dir.path());
    let image = "docker.io/kubeedge-rs/mapper-modbus:bench";
    rt.import(&archive, image);
    let edged = format!(
        "edged: {{runtimeEndpoint: \"unix://{}\", hostPathPrefixes: [{:?}]}}\n",
        rt.socket.display(),
        // The mappers' socket directory (a temporary one) stands for /etc/kubeedge.
        std::env::temp_dir().display().to_string()
    );

    let (http, mqtt) = (sim::free_port(), sim::free_port());
    let mut kill = Kill(Vec::new());
    let cloud = start_cloud(&bins, dir.path(), &mut kill).await?;
    let client = cloud.client.clone();
    std::fs::write(
        dir.path().join("edgecore.yaml"),
        cloud.edge_config(http, mqtt, "", &edged),
    )?;
    kill.0.push(spawn(
        &bins.join("edgecore"),
        &["--config", "edgecore.yaml"],
        dir.path(),
        "edgecore.log",
    )?);
    let edge_pid = kill.0[1].id();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    wait_for("the node in the API", 60, async || {
        nodes.get_opt("edge-node-1").await.ok().flatten().is_some()
    })
    .await?;

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let sock = dir.path().display();
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "mapper-config"},
            "data": {"config.yaml": format!("grpc_server:\n  socket_path: {sock}/modbus.sock\ncommon:\n  name: modbus-mapper\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: modbus\n  address: 127.0.0.1\n  edgecore_sock: {sock}/dmi.sock\n  http_port: {}\n  data_dir: /var/lib/mapper\n", sim::free_port())}}))?,
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let agent = sim::agent();
    let on_node = |name: String| {
        let (_, list) = sim::get(&agent, &format!("http://127.0.0.1:{http}/api/v1/pods"));
        list["pods"]
            .as_array()
            .is_some_and(|a| a.iter().any(|p| p["name"] == name.as_str()))
    };

    let mut apply = Vec::new();
    for i in 0..rounds {
        let name = format!("mapper-{i}");
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"nodeName": "edge-node-1", "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "mapper", "image": image, "imagePullPolicy": "Never",
                    "args": ["--config-file", "/etc/mapper/config.yaml"],
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/mapper"},
                        {"name": "kubeedge", "mountPath": sock.to_string()},
                        {"name": "data", "mountPath": "/var/lib/mapper"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "mapper-config"}},
                    {"name": "kubeedge", "hostPath": {"path": sock.to_string()}},
                    {"name": "data", "emptyDir": {}}]}}))?;
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        wait_for("a mapper pod Running", 120, async || {
            pods.get_opt(&name)
                .await
                .ok()
                .flatten()
                .is_some_and(|p| running(&p))
        })
        .await?;
        apply.push(t.elapsed().as_secs_f64() * 1000.0);
        pods.delete(&name, &DeleteParams::default()).await?;
        wait_for("the pod gone from the node", 120, async || {
            !on_node(name.clone())
        })
        .await?;
    }
    println!(
        "apply -> Running (mapper pod, image present): {}",
        percentiles(apply)
    );

    let with = idle_rss(&bins, &edged).await?;
    let without = idle_rss(&bins, "").await?;
    println!(
        "idle edgecore RSS: {:.1} MB with edged, {:.1} MB without: edged adds {:.1} MB",
        with as f64 / 1024.0,
        without as f64 / 1024.0,
        (with as f64 - without as f64) / 1024.0
    );

    let before = rss_kib(edge_pid);
    let t = Instant::now();
    for i in 0..many {
        let pod: Pod = serde_json::from_value(
            json!({"metadata": {"name": format!("sleeper-{i}")},
            "spec": {"nodeName": "edge-node-1", "hostNetwork": true, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": "edged-test/busybox:1", "imagePullPolicy": "Never",
                    "command": ["/bin/sleep", "3600"]}]}}),
        )?;
        pods.create(&PostParams::default(), &pod).await?;
    }
    wait_for("all pods Running", 600, async || {
        pods.list(&Default::default()).await.is_ok_and(|l| {
            l.items
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("sleeper-"))
                })
                .filter(|p| running(p))
                .count()
                == many
        })
    })
    .await?;
    let all = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(edge_pid);
    println!(
        "{many} pods created at once: all Running in the API after {:.1} s; edgecore RSS {:.1} MB before, {:.1} MB with them running",
        all.as_secs_f64(),
        before as f64 / 1024.0,
        after as f64 / 1024.0
    );
    for i in 0..many {
        let _ = pods
            .delete(&format!("sleeper-{i}"), &DeleteParams::default())
            .await;
    }
    wait_for("the pods stopped", 600, async || {
        let (_, list) = sim::get(&agent, &format!("http://127.0.0.1:{http}/api/v1/pods"));
        list["pods"].as_array().is_some_and(|a| a.is_empty())
    })
    .await?;
    drop(kill);
    drop(rt);
    Ok(())
}
