//! `cloudcore`: the embedded Kubernetes-compatible API (or a real cluster through kube-rs) and,
//! as they are built, the cloud controllers that reach it through kube-rs only.

pub mod config;

use anyhow::{Context, Result};
use serde_json::Value;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const OBJECTSYNC_CRD: &str = include_str!("../crds/reliablesyncs_v1alpha1_objectsync.yaml");
const CLUSTER_OBJECTSYNC_CRD: &str =
    include_str!("../crds/reliablesyncs_v1alpha1_clusterobjectsync.yaml");

/// The CRDs cloudcore installs: Device, DeviceModel, DeviceStatus, ObjectSync and
/// ClusterObjectSync.
pub fn crds() -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for (file, yaml) in devicecontroller::crd_files()?.into_iter().chain([
        ("objectsync".to_string(), OBJECTSYNC_CRD.to_string()),
        (
            "clusterobjectsync".to_string(),
            CLUSTER_OBJECTSYNC_CRD.to_string(),
        ),
    ]) {
        for doc in serde_yaml_ng::Deserializer::from_str(&yaml) {
            use serde::Deserialize;
            let v =
                Value::deserialize(doc).with_context(|| format!("CRD {file} does not parse"))?;
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    Ok(out)
}

/// Runs until `cancel`.
pub async fn run(config: config::Config, cancel: CancellationToken) -> Result<()> {
    let crds = crds()?;
    match &config.kubeconfig {
        Some(path) => {
            let client = cluster_client(path).await?;
            install_on_cluster(&client, &crds).await?;
            tracing::info!(kubeconfig = %path.display(), "using the cluster of the kubeconfig; the embedded API is off");
            cancel.cancelled().await;
            Ok(())
        }
        None => {
            let running = apiserver::start(config.apiserver(crds)).await?;
            eprintln!(
                "cloudcore: API at {}; use it with: kubectl --kubeconfig {} get devices -A",
                running.url,
                running.kubeconfig.display()
            );
            cancel.cancelled().await;
            tracing::info!("stopping");
            running.shutdown(Duration::from_secs(5)).await;
            Ok(())
        }
    }
}

/// A kube-rs client of the cluster a kubeconfig names.
pub async fn cluster_client(path: &std::path::Path) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {} is not usable", path.display()))?;
    kube::Client::try_from(cfg).context("cannot make a client of the kubeconfig")
}

/// Installs (server-side apply) the CRDs on a real cluster.
async fn install_on_cluster(client: &kube::Client, crds: &[Value]) -> Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Api, Patch, PatchParams};
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        api.patch(
            name,
            &PatchParams::apply("cloudcore").force(),
            &Patch::Apply(crd),
        )
        .await
        .with_context(|| format!("cannot install CRD {name} on the cluster"))?;
    }
    Ok(())
}
