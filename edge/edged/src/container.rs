//! What a pod's container is given: its CRI config (command, env, mounts, resources, labels)
//! and the files of its `configMap` and `secret` volumes.

use crate::spec::Desired;
use crate::{CONTAINER_NAME, CloudPods, MANAGED, POD_NAME, POD_NAMESPACE, POD_UID};
use crate::{cri, probe};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Which object a pod refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    ConfigMap,
    Secret,
}

impl Source {
    fn of(secret: bool) -> Self {
        if secret {
            Self::Secret
        } else {
            Self::ConfigMap
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ConfigMap => "configmap",
            Self::Secret => "secret",
        })
    }
}

/// Why a container cannot be created as declared (`CreateContainerConfigError`); each names
/// the volume, env or container it is about.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("volume {volume}: {kind} {namespace}/{name} not found")]
    VolumeSource {
        volume: String,
        kind: Source,
        namespace: String,
        name: String,
    },
    #[error("volume {volume}: key {key} not in {kind} {name}")]
    VolumeKey {
        volume: String,
        key: String,
        kind: Source,
        name: String,
    },
    #[error("volume {volume}: path {path:?} is not allowed")]
    VolumePath { volume: String, path: String },
    #[error("volume {volume}: only hostPath, emptyDir, configMap and secret are supported")]
    VolumeType { volume: String },
    #[error("volume {volume}: hostPath.path {path:?} is not an absolute path")]
    RelativeHostPath { volume: String, path: String },
    #[error("volumeMount {mount}: no volume of that name")]
    NoVolume { mount: String },
    #[error("{what} {volume}: {}: {source}", path.display())]
    Io {
        what: &'static str,
        volume: String,
        path: PathBuf,
        source: Arc<std::io::Error>,
    },
    #[error("envFrom of container {container}: {kind} {name} not found")]
    EnvFrom {
        container: String,
        kind: Source,
        name: String,
    },
    #[error("env {env} of container {container}: key {key} of {kind} {name} not found")]
    EnvKey {
        env: String,
        container: String,
        key: String,
        kind: Source,
        name: String,
    },
    #[error("env {env} of container {container}: fieldRef {field} is not supported")]
    FieldRef {
        env: String,
        container: String,
        field: String,
    },
    #[error(
        "env {env} of container {container}: only configMapKeyRef, secretKeyRef and fieldRef are supported in valueFrom"
    )]
    ValueFrom { env: String, container: String },
    #[error(transparent)]
    Resources(#[from] probe::ResourcesError),
}

pub(crate) fn labels(d: &Desired, container: Option<&str>) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = [
        (MANAGED.to_string(), "true".to_string()),
        (POD_NAME.to_string(), d.name.clone()),
        (POD_NAMESPACE.to_string(), d.namespace.clone()),
        (POD_UID.to_string(), d.uid.clone()),
    ]
    .into();
    if let Some(c) = container {
        l.insert(CONTAINER_NAME.to_string(), c.to_string());
    }
    l
}

/// What a container's environment may refer to.
pub(crate) struct Env<'a> {
    pub(crate) cloud: Option<&'a CloudPods>,
    pub(crate) node: &'a str,
    pub(crate) host_ip: &'a str,
    /// The sandbox's IP on the runtime's network (not used with hostNetwork).
    pub(crate) pod_ip: &'a str,
}

impl Env<'_> {
    /// `data` of a ConfigMap (`secret`: false) or a Secret (decoded), if it exists.
    fn data(&self, ns: &str, name: &str, secret: bool) -> Option<BTreeMap<String, Vec<u8>>> {
        let cloud = self.cloud?;
        let obj = if secret {
            cloud.secret(ns, name)?
        } else {
            cloud.config_map(ns, name)?
        };
        Some(object_data(&obj, secret))
    }
}

/// The files of a ConfigMap (`data`, `binaryData`) or a Secret (`data` decoded, `stringData`).
fn object_data(obj: &serde_json::Value, secret: bool) -> BTreeMap<String, Vec<u8>> {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = BTreeMap::new();
    let (plain, encoded) = if secret {
        ("stringData", "data")
    } else {
        ("data", "binaryData")
    };
    for (k, v) in obj[plain].as_object().into_iter().flatten() {
        out.insert(
            k.clone(),
            v.as_str().unwrap_or_default().as_bytes().to_vec(),
        );
    }
    for (k, v) in obj[encoded].as_object().into_iter().flatten() {
        match b64.decode(v.as_str().unwrap_or_default()) {
            Ok(b) => {
                out.insert(k.clone(), b);
            }
            Err(e) => {
                tracing::warn!(key = %k, error = %e, "a base64 value does not decode; left out")
            }
        }
    }
    out
}

/// Writes the files of the pod's `configMap` and `secret` volumes under `volumes_dir/{name}`
/// (only what changed; keys no longer there are removed). A missing object is an error that
/// names it, unless the volume is `optional`.
pub(crate) fn project_volumes(
    d: &Desired,
    volumes_dir: &Path,
    cloud: Option<&CloudPods>,
) -> Result<(), ConfigError> {
    let env = Env {
        cloud,
        node: "",
        host_ip: "",
        pod_ip: "",
    };
    for v in d.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let (source, secret, items, optional) = if let Some(c) = &v.config_map {
            (c.name.clone(), false, c.items.clone(), c.optional)
        } else if let Some(s) = &v.secret {
            (
                s.secret_name.clone().unwrap_or_default(),
                true,
                s.items.clone(),
                s.optional,
            )
        } else {
            continue;
        };
        let kind = Source::of(secret);
        let dir = volumes_dir.join(&v.name);
        let data = match env.data(&d.namespace, &source, secret) {
            Some(data) => data,
            None if optional == Some(true) => BTreeMap::new(),
            None => {
                return Err(ConfigError::VolumeSource {
                    volume: v.name.clone(),
                    kind,
                    namespace: d.namespace.clone(),
                    name: source,
                });
            }
        };
        let files: Vec<(String, Vec<u8>)> = match items {
            Some(items) => {
                let mut out = Vec::new();
                for i in items {
                    match data.get(&i.key) {
                        Some(b) => out.push((i.path.clone(), b.clone())),
                        None if optional == Some(true) => {}
                        None => {
                            return Err(ConfigError::VolumeKey {
                                volume: v.name.clone(),
                                key: i.key.clone(),
                                kind,
                                name: source,
                            });
                        }
                    }
                }
                out
            }
            None => data.into_iter().collect(),
        };
        std::fs::create_dir_all(&dir).map_err(|source| ConfigError::Io {
            what: "volume",
            volume: v.name.clone(),
            path: dir.clone(),
            source: Arc::new(source),
        })?;
        for (path, bytes) in &files {
            if path.split('/').any(|p| p == ".." || p.is_empty()) {
                return Err(ConfigError::VolumePath {
                    volume: v.name.clone(),
                    path: path.clone(),
                });
            }
            let file = dir.join(path);
            if std::fs::read(&file).ok().as_deref() == Some(bytes.as_slice()) {
                continue;
            }
            if let Some(parent) = file.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            // Written beside, then renamed: a reader never sees half a file.
            let tmp = file.with_extension("edged-tmp");
            std::fs::write(&tmp, bytes)
                .and_then(|_| std::fs::rename(&tmp, &file))
                .map_err(|source| ConfigError::Io {
                    what: "volume",
                    volume: v.name.clone(),
                    path: file.clone(),
                    source: Arc::new(source),
                })?;
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.path().is_file() && !files.iter().any(|(p, _)| *p == name) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(())
}

/// The CRI container of a Pod's container: command, args, env (values, and from ConfigMaps,
/// Secrets and the pod's fields), working directory and the mounts of its `hostPath`,
/// `emptyDir`, `configMap` and `secret` volumes.
pub(crate) fn container_config(
    d: &Desired,
    c: &k8s_openapi::api::core::v1::Container,
    attempt: u32,
    volumes_dir: &Path,
    env: &Env,
) -> Result<cri::ContainerConfig, ConfigError> {
    let mut envs: Vec<cri::KeyValue> = Vec::new();
    let mut set = |key: String, value: String| {
        envs.retain(|e| e.key != key);
        envs.push(cri::KeyValue { key, value });
    };
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (name, secret, optional) = match (&from.config_map_ref, &from.secret_ref) {
            (Some(r), _) => (r.name.clone(), false, r.optional),
            (None, Some(r)) => (r.name.clone(), true, r.optional),
            (None, None) => continue,
        };
        match env.data(&d.namespace, &name, secret) {
            Some(data) => {
                for (k, v) in data {
                    set(
                        format!("{prefix}{k}"),
                        String::from_utf8_lossy(&v).into_owned(),
                    );
                }
            }
            None if optional == Some(true) => {}
            None => {
                return Err(ConfigError::EnvFrom {
                    container: c.name.clone(),
                    kind: Source::of(secret),
                    name,
                });
            }
        }
    }
    for e in c.env.iter().flatten() {
        let Some(from) = &e.value_from else {
            set(e.name.clone(), e.value.clone().unwrap_or_default());
            continue;
        };
        let keyref = match (&from.config_map_key_ref, &from.secret_key_ref) {
            (Some(r), _) => Some((r.name.clone(), r.key.clone(), false, r.optional)),
            (None, Some(r)) => Some((r.name.clone(), r.key.clone(), true, r.optional)),
            _ => None,
        };
        if let Some((name, key, secret, optional)) = keyref {
            match env
                .data(&d.namespace, &name, secret)
                .and_then(|m| m.get(&key).cloned())
            {
                Some(v) => set(e.name.clone(), String::from_utf8_lossy(&v).into_owned()),
                None if optional == Some(true) => {}
                None => {
                    return Err(ConfigError::EnvKey {
                        env: e.name.clone(),
                        container: c.name.clone(),
                        key,
                        kind: Source::of(secret),
                        name,
                    });
                }
            }
            continue;
        }
        if let Some(f) = &from.field_ref {
            let value = match f.field_path.as_str() {
                "metadata.name" => d.name.clone(),
                "metadata.namespace" => d.namespace.clone(),
                "metadata.uid" => d.uid.clone(),
                "spec.nodeName" => env.node.to_string(),
                "status.hostIP" => env.host_ip.to_string(),
                "status.podIP" | "status.podIPs" if d.host_network() => env.host_ip.to_string(),
                "status.podIP" | "status.podIPs" if !env.pod_ip.is_empty() => {
                    env.pod_ip.to_string()
                }
                other => {
                    return Err(ConfigError::FieldRef {
                        env: e.name.clone(),
                        container: c.name.clone(),
                        field: other.into(),
                    });
                }
            };
            set(e.name.clone(), value);
            continue;
        }
        return Err(ConfigError::ValueFrom {
            env: e.name.clone(),
            container: c.name.clone(),
        });
    }
    let volumes = d
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(|| ConfigError::NoVolume {
                mount: m.name.clone(),
            })?;
        let host = if let Some(h) = &v.host_path {
            if !h.path.starts_with('/') {
                return Err(ConfigError::RelativeHostPath {
                    volume: v.name.clone(),
                    path: h.path.clone(),
                });
            }
            PathBuf::from(&h.path)
        } else if v.empty_dir.is_some() {
            let dir = volumes_dir.join(&v.name);
            std::fs::create_dir_all(&dir).map_err(|source| ConfigError::Io {
                what: "emptyDir",
                volume: v.name.clone(),
                path: dir.clone(),
                source: Arc::new(source),
            })?;
            dir
        } else if v.config_map.is_some() || v.secret.is_some() {
            // Written by project_volumes.
            volumes_dir.join(&v.name)
        } else {
            return Err(ConfigError::VolumeType {
                volume: v.name.clone(),
            });
        };
        mounts.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly: m.read_only.unwrap_or(false) || v.config_map.is_some() || v.secret.is_some(),
        });
    }
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: c.image.clone().unwrap_or_default(),
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs,
        mounts,
        labels: labels(d, Some(&c.name)),
        annotations: HashMap::new(),
        log_path: format!("{}/{attempt}.log", c.name),
        linux: probe::resources(c)?.map(|r| cri::LinuxContainerConfig { resources: Some(r) }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{cloud_pod, parse_pod};
    use k8s_openapi::api::core::v1::Pod;

    fn no_env() -> Env<'static> {
        Env {
            cloud: None,
            node: "n",
            host_ip: "10.1.1.1",
            pod_ip: "",
        }
    }

    #[test]
    fn unsupported_volumes_and_env_sources_are_named() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m}\nspec:\n  volumes:\n  - {name: s, nfs: {server: x, path: /}}\n  - {name: h, hostPath: {path: /etc}}\n  containers:\n  - name: c\n    image: 'x:1'\n    volumeMounts: [{name: h, mountPath: /h, readOnly: true}]\n    env: [{name: A, value: b}]\n  - name: d\n    image: 'x:1'\n    volumeMounts: [{name: s, mountPath: /s}]\n";
        let d = parse_pod(Path::new("/p/a.yaml"), text).expect("valid");
        let spec = d.pod.spec.clone().expect("spec");
        let cfg = container_config(&d, &spec.containers[0], 2, Path::new("/tmp/v"), &no_env())
            .expect("ok");
        assert_eq!(cfg.mounts[0].host_path, "/etc");
        assert!(cfg.mounts[0].readonly);
        assert_eq!(cfg.envs[0].key, "A");
        assert_eq!(cfg.log_path, "c/2.log");
        assert_eq!(cfg.labels.get(POD_UID), Some(&d.uid));
        let e = container_config(&d, &spec.containers[1], 0, Path::new("/tmp/v"), &no_env())
            .expect_err("nfs volume");
        assert_eq!(
            e.to_string(),
            "volume s: only hostPath, emptyDir, configMap and secret are supported"
        );
        let rel = parse_pod(
            Path::new("/p/a.yaml"),
            &text.replace("path: /etc", "path: etc"),
        )
        .expect("valid");
        let spec = rel.pod.spec.clone().expect("spec");
        let e = container_config(&rel, &spec.containers[0], 0, Path::new("/tmp/v"), &no_env())
            .expect_err("relative hostPath");
        assert!(e.to_string().contains("is not an absolute path"), "{e}");
    }

    #[test]
    fn config_maps_and_secrets_become_files_and_environment() {
        let cloud = CloudPods::default();
        let key = |n: &str| ("default".to_string(), n.to_string());
        cloud
            .put(
                "configmap",
                key("cfg"),
                serde_json::json!({"data": {"config.yaml": "a: 1", "LEVEL": "debug"}}),
            )
            .expect("stored");
        cloud
            .put(
                "secret",
                key("pw"),
                serde_json::json!({"data": {"password": "czNjcjN0"}}),
            )
            .expect("stored");
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: m, uid: u1}\nspec:\n  nodeName: n\n  volumes:\n  - {name: c, configMap: {name: cfg, items: [{key: config.yaml, path: config.yaml}]}}\n  - {name: s, secret: {secretName: pw}}\n  containers:\n  - name: c\n    image: 'x:1'\n    volumeMounts: [{name: c, mountPath: /etc/mapper}, {name: s, mountPath: /s}]\n    envFrom: [{configMapRef: {name: cfg}, prefix: CFG_}]\n    env:\n    - {name: PW, valueFrom: {secretKeyRef: {name: pw, key: password}}}\n    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}\n    - {name: GONE, valueFrom: {configMapKeyRef: {name: nope, key: k, optional: true}}}\n";
        let pod: Pod = serde_yaml_ng::from_str(text).expect("a pod");
        let d = cloud_pod(&pod, "n", &Default::default()).expect("bound here");
        assert!(
            cloud_pod(&pod, "other", &Default::default())
                .expect_err("not here")
                .to_string()
                .contains("not to this node")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        project_volumes(&d, dir.path(), Some(&cloud)).expect("projected");
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).expect("a file");
        assert_eq!(read("c/config.yaml"), "a: 1");
        assert!(
            !dir.path().join("c/LEVEL").exists(),
            "items select the keys"
        );
        assert_eq!(read("s/password"), "s3cr3t");
        let env = Env {
            cloud: Some(&cloud),
            node: "n",
            host_ip: "10.1.1.1",
            pod_ip: "",
        };
        let spec = d.pod.spec.clone().expect("spec");
        let cfg = container_config(&d, &spec.containers[0], 0, dir.path(), &env).expect("ok");
        let envs: Vec<String> = cfg
            .envs
            .iter()
            .map(|e| format!("{}={}", e.key, e.value))
            .collect();
        assert_eq!(
            envs,
            [
                "CFG_LEVEL=debug",
                "CFG_config.yaml=a: 1",
                "PW=s3cr3t",
                "NODE=n"
            ]
        );
        assert!(cfg.mounts.iter().all(|m| m.readonly));

        // The ConfigMap changes: the file follows; it goes: a clear error.
        cloud
            .put(
                "configmap",
                key("cfg"),
                serde_json::json!({"data": {"config.yaml": "a: 2"}}),
            )
            .expect("stored");
        project_volumes(&d, dir.path(), Some(&cloud)).expect("projected");
        assert_eq!(read("c/config.yaml"), "a: 2");
        cloud.remove("configmap", &key("cfg"));
        let e = project_volumes(&d, dir.path(), Some(&cloud)).expect_err("missing");
        assert_eq!(e.to_string(), "volume c: configmap default/cfg not found");
        let e =
            container_config(&d, &spec.containers[0], 0, dir.path(), &env).expect_err("missing");
        assert_eq!(
            e.to_string(),
            "envFrom of container c: configmap cfg not found"
        );
    }
}
