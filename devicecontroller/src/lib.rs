//! The cloud device controller: sends each Device and DeviceModel to the node that runs it
//! ([`downstream`], pure), keeps per-node ConfigMaps of device profiles ([`profile`]), keeps a
//! DeviceStatus for every Device and writes what the nodes report into it ([`upstream`]). The
//! runtime ([`controller`]) reaches the API through kube-rs only. It also holds the generator of
//! the CRD YAMLs committed under `devicecontroller/crds/`.
#![warn(unreachable_pub)]

pub mod controller;
pub mod downstream;
pub mod profile;
pub mod upstream;

use anyhow::Context;

/// File name and YAML text of every CRD, as committed under `crds/`.
pub fn crd_files() -> anyhow::Result<Vec<(String, String)>> {
    api::crd::crds()
        .into_iter()
        .map(|crd| {
            let file = format!(
                "devices_v1beta1_{}.yaml",
                crd.spec.names.singular.clone().unwrap_or_default()
            );
            let yaml = serde_yaml_ng::to_string(&crd)
                .with_context(|| format!("failed to render {file}"))?;
            Ok((file, format!("---\n{yaml}")))
        })
        .collect()
}
