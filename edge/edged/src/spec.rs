//! The pods edged runs: a static pod file or a pod the cloud sent, checked and named.

use api::validate::names::NameError;
use k8s_openapi::api::core::v1::Pod;
use std::path::{Path, PathBuf};

/// A static pod file that is refused; the pod it declared before (if any) keeps running.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ManifestError {
    #[error("{}: at {at}: {message}", file.display())]
    Yaml {
        file: PathBuf,
        at: String,
        message: String,
    },
    #[error("{}: {source}", file.display())]
    Pod { file: PathBuf, source: PodError },
}

/// A pod that cannot run here: its status says why (`InvalidPodSpec`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PodError {
    #[error("metadata.name is missing")]
    NoName,
    #[error("metadata.name: {0}")]
    Name(NameError),
    #[error("metadata.uid is missing")]
    NoUid,
    #[error("spec is missing")]
    NoSpec,
    #[error("spec.containers is empty")]
    NoContainers,
    #[error("spec.containers[{container}].image is missing")]
    NoImage { container: String },
    #[error("bound to node {bound:?}, not to this node {node:?}")]
    OtherNode { bound: String, node: String },
    #[error("{0}; this node does not give pods from the cloud such access to the host")]
    HostAccess(String),
}

/// What of the host a pod from the cloud may take (`edged.hostPathPrefixes`,
/// `edged.hostNetwork`).
#[derive(Clone, Debug)]
pub(crate) struct HostAccess {
    pub(crate) path_prefixes: Vec<String>,
    pub(crate) network: bool,
}

impl HostAccess {
    /// The first thing `pod` asks of the host that is not given, in the pod's own terms.
    fn refused(&self, pod: &Pod) -> Option<String> {
        let spec = pod.spec.as_ref()?;
        if spec.host_pid == Some(true) {
            return Some("spec.hostPID: true".into());
        }
        if spec.host_ipc == Some(true) {
            return Some("spec.hostIPC: true".into());
        }
        if spec.host_network == Some(true) && !self.network {
            return Some("spec.hostNetwork: true (edged.hostNetwork is false)".into());
        }
        let contexts = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .map(|c| (&c.name, &c.security_context))
            .chain(
                spec.ephemeral_containers
                    .iter()
                    .flatten()
                    .map(|c| (&c.name, &c.security_context)),
            );
        for (name, context) in contexts {
            if context.as_ref().and_then(|s| s.privileged) == Some(true) {
                return Some(format!(
                    "container {name}: securityContext.privileged: true"
                ));
            }
        }
        for v in spec.volumes.iter().flatten() {
            let Some(h) = &v.host_path else { continue };
            let path = std::path::Path::new(&h.path);
            let clean = path.is_absolute()
                && !path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            let under = |prefix: &String| {
                let prefix = std::path::Path::new(prefix);
                prefix.is_absolute() && path.starts_with(prefix)
            };
            if !clean || !self.path_prefixes.iter().any(under) {
                return Some(format!(
                    "volume {}: hostPath {:?} is outside edged.hostPathPrefixes {:?}",
                    v.name, h.path, self.path_prefixes
                ));
            }
        }
        None
    }
}

/// A pod declared in the directory, or sent by the cloud.
#[derive(Clone, Debug)]
pub(crate) struct Desired {
    /// Its manifest; empty for a pod from the cloud.
    pub(crate) file: PathBuf,
    pub(crate) cloud: bool,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) pod: Pod,
}

impl Desired {
    pub(crate) fn source(&self) -> String {
        if self.cloud {
            "cloud".into()
        } else {
            self.file.display().to_string()
        }
    }

    pub(crate) fn host_network(&self) -> bool {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
    }

    pub(crate) fn grace(&self) -> i64 {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(30)
    }
}

/// Parses a static pod file. The uid is the manifest's own, or a hash of its content (as the
/// kubelet does for static pods): a changed manifest is a new pod.
pub(crate) fn parse_pod(file: &Path, text: &str) -> Result<Desired, ManifestError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let pod: Pod = serde_path_to_error::deserialize(de).map_err(|e| ManifestError::Yaml {
        file: file.to_path_buf(),
        at: e.path().to_string(),
        message: e.inner().to_string(),
    })?;
    let (namespace, name) = check_pod(&pod).map_err(|source| ManifestError::Pod {
        file: file.to_path_buf(),
        source,
    })?;
    let uid = match &pod.metadata.uid {
        Some(u) => u.clone(),
        None => {
            let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
            digest.as_ref()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
    };
    Ok(Desired {
        file: file.to_path_buf(),
        cloud: false,
        namespace,
        name,
        uid,
        pod,
    })
}

/// A pod's name and namespace, and that it has containers with images.
fn check_pod(pod: &Pod) -> Result<(String, String), PodError> {
    let name = pod.metadata.name.clone().ok_or(PodError::NoName)?;
    api::validate::names::check_dns1123_subdomain(&name).map_err(PodError::Name)?;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let spec = pod.spec.as_ref().ok_or(PodError::NoSpec)?;
    if spec.containers.is_empty() {
        return Err(PodError::NoContainers);
    }
    for c in &spec.containers {
        if c.image.as_deref().unwrap_or("").is_empty() {
            return Err(PodError::NoImage {
                container: c.name.clone(),
            });
        }
    }
    Ok((namespace, name))
}

/// A pod the cloud sent: its uid is the API's.
pub(crate) fn cloud_pod(pod: &Pod, node: &str, host: &HostAccess) -> Result<Desired, PodError> {
    let (namespace, name) = check_pod(pod)?;
    if let Some(why) = host.refused(pod) {
        return Err(PodError::HostAccess(why));
    }
    let uid = pod
        .metadata
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or(PodError::NoUid)?;
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
    if bound != Some(node) {
        return Err(PodError::OtherNode {
            bound: bound.unwrap_or_default().into(),
            node: node.into(),
        });
    }
    Ok(Desired {
        file: PathBuf::new(),
        cloud: true,
        namespace,
        name,
        uid,
        pod: pod.clone(),
    })
}

#[cfg(test)]
impl Default for HostAccess {
    fn default() -> Self {
        let c = crate::Config::default();
        HostAccess {
            path_prefixes: c.host_path_prefixes,
            network: c.host_network,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_static_pod_gets_a_uid_from_its_content_and_clear_errors() {
        let f = Path::new("/p/a.yaml");
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  hostNetwork: true\n  containers:\n  - {name: c, image: 'x:1'}\n";
        let a = parse_pod(f, text).expect("valid");
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("default", "m"));
        assert_eq!(a.uid.len(), 32);
        let b = parse_pod(f, &text.replace("x:1", "x:2")).expect("valid");
        assert_ne!(a.uid, b.uid, "a changed manifest is a new pod");
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  containers:\n  - {name: c}\n",
        )
        .expect_err("no image");
        assert_eq!(
            e.to_string(),
            "/p/a.yaml: spec.containers[c].image is missing"
        );
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  containers: 3\n",
        )
        .expect_err("bad type");
        assert!(e.to_string().contains("at spec.containers"), "{e}");
        let e = parse_pod(
            f,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: M_}\nspec:\n  containers: []\n",
        )
        .expect_err("bad name");
        assert!(e.to_string().contains("metadata.name: \"M_\""), "{e}");
    }

    /// The pod that took a gateway's root, as the cloud sends it: refused, naming the first
    /// door; each door alone too; the mapper DaemonSet's /etc/kubeedge passes.
    #[test]
    fn a_pod_from_the_cloud_gets_only_the_host_access_the_node_gives() {
        let pod = |spec: &str| -> Pod {
            serde_yaml_ng::from_str(&format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, uid: u1}}\nspec:\n  nodeName: n\n{spec}"
            ))
            .expect("a pod")
        };
        let c = "  containers: [{name: c, image: 'x:1'}]\n";
        let host = HostAccess::default();
        let refused = |spec: String| {
            cloud_pod(&pod(&spec), "n", &host)
                .expect_err("refused")
                .to_string()
        };
        let root = "  hostNetwork: true\n  hostPID: true\n  volumes: [{name: root, hostPath: {path: /}}]\n  containers: [{name: c, image: 'x:1', securityContext: {privileged: true}}]\n".to_string();
        let e = refused(root);
        assert!(
            e.contains("spec.hostPID: true") && e.contains("does not give"),
            "{e}"
        );
        assert!(refused(format!("  hostIPC: true\n{c}")).contains("hostIPC"));
        let e = refused(
            "  containers: [{name: c, image: 'x:1', securityContext: {privileged: true}}]\n".into(),
        );
        assert!(
            e.contains("container c: securityContext.privileged: true"),
            "{e}"
        );
        for path in [
            "/",
            "/var/lib/edgecore",
            "/etc",
            "/etc/kubeedge/../shadow",
            "/etc/kubeedgex",
        ] {
            let e = refused(format!(
                "  volumes: [{{name: h, hostPath: {{path: '{path}'}}}}]\n{c}"
            ));
            assert!(e.contains("outside edged.hostPathPrefixes"), "{path}: {e}");
        }
        for path in ["/etc/kubeedge", "/etc/kubeedge/dmi"] {
            let spec = format!("  volumes: [{{name: h, hostPath: {{path: '{path}'}}}}]\n{c}");
            assert!(cloud_pod(&pod(&spec), "n", &host).is_ok(), "{path}");
        }
        assert!(cloud_pod(&pod(&format!("  hostNetwork: true\n{c}")), "n", &host).is_ok());
        let closed = HostAccess {
            path_prefixes: vec![],
            network: false,
        };
        let e = cloud_pod(&pod(&format!("  hostNetwork: true\n{c}")), "n", &closed)
            .expect_err("no host network")
            .to_string();
        assert!(e.contains("edged.hostNetwork is false"), "{e}");
    }
}
