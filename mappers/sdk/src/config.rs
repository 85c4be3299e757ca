//! The mapper's configuration file, compatible in meaning with KubeEdge mapper-framework's
//! `config.yaml`:
//!
//! ```yaml
//! grpc_server:
//!   socket_path: /etc/kubeedge/modbus.sock   # this mapper's DeviceMapperService
//! common:
//!   name: modbus-mapper
//!   version: v1.13.0
//!   api_version: v1.0.0
//!   protocol: modbus                           # must equal spec.protocol.protocolName
//!   address: 127.0.0.1                         # the REST API's address
//!   edgecore_sock: /etc/kubeedge/dmi.sock
//!   http_port: 7777                            # 0 turns the REST API off
//!   http_token_file: /etc/kubeedge/mappers/modbus.token  # every request but ping carries it
//!   http_hosts: [gw-3.plant.example]           # without a token: Host names answered
//!   data_dir: /var/lib/kubeedge/modbus-mapper  # what the mapper keeps (certificates); the default
//! ```
//!
//! Unknown keys are refused with their path, so a typo does not silently fall back to a
//! default. Relative paths are taken from the file's directory.

use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub grpc_server: GrpcServer,
    pub common: Common,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcServer {
    #[serde(default = "default_socket")]
    pub socket_path: String,
}

impl Default for GrpcServer {
    fn default() -> Self {
        Self {
            socket_path: default_socket(),
        }
    }
}

fn default_socket() -> String {
    String::new()
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Common {
    pub name: String,
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default = "default_version")]
    pub api_version: String,
    pub protocol: String,
    /// The address the REST API listens on.
    #[serde(default = "default_address")]
    pub address: String,
    #[serde(default = "default_edgecore_sock")]
    pub edgecore_sock: String,
    #[serde(default = "default_http_port")]
    pub http_port: u16,
    /// A file whose first line is the token every REST request but `GET /api/v1/ping` must
    /// carry (`Authorization: Bearer TOKEN`). Empty: no token; then only requests whose `Host`
    /// is an IP address, `localhost`, this host's name or one of `http_hosts` are answered.
    /// Not a mapper-framework key.
    #[serde(default)]
    pub http_token_file: String,
    /// Without a token, the `Host` names the REST API answers besides IP addresses, `localhost`
    /// and this host's name. Not a mapper-framework key.
    #[serde(default)]
    pub http_hosts: Vec<String>,
    /// Where the mapper keeps what must survive a restart (OPC UA's application certificate).
    /// Default `/var/lib/kubeedge/{name}`. Not a mapper-framework key.
    #[serde(default)]
    pub data_dir: String,
}

fn default_version() -> String {
    "v1.0.0".into()
}
fn default_address() -> String {
    "127.0.0.1".into()
}
fn default_edgecore_sock() -> String {
    "/etc/kubeedge/dmi.sock".into()
}
/// mapper-framework's default.
fn default_http_port() -> u16 {
    7777
}

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path}: {key}: {reason}")]
    Invalid {
        path: PathBuf,
        key: &'static str,
        reason: String,
    },
}

impl Config {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        // Relative paths in the file are taken from its directory, made absolute here: the
        // socket paths a mapper registers are used by edgecore, which runs elsewhere.
        let dir = path.parent().unwrap_or(Path::new(""));
        let base = std::fs::canonicalize(if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        })
        .map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &base).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            ConfigError::Invalid { key, reason, .. } => ConfigError::Invalid {
                path: path.to_path_buf(),
                key,
                reason,
            },
            other => other,
        })
    }

    /// Parses YAML text; relative paths are taken from `base`.
    pub fn parse(text: &str, base: &Path) -> Result<Self, ConfigError> {
        let de = serde_yaml_ng::Deserializer::from_str(text);
        let mut c: Config =
            serde_path_to_error::deserialize(de).map_err(|e| ConfigError::Parse {
                path: PathBuf::new(),
                message: match e.path().to_string().as_str() {
                    "." => e.inner().to_string(),
                    p => format!("{p}: {}", e.inner()),
                },
            })?;
        let invalid = |key, reason: &str| ConfigError::Invalid {
            path: PathBuf::new(),
            key,
            reason: reason.to_string(),
        };
        if c.common.name.trim().is_empty() {
            return Err(invalid("common.name", "must not be empty"));
        }
        if c.common.protocol.trim().is_empty() {
            return Err(invalid("common.protocol", "must not be empty"));
        }
        if c.grpc_server.socket_path.is_empty() {
            c.grpc_server.socket_path = format!("/etc/kubeedge/{}.sock", c.common.name);
        }
        c.grpc_server.socket_path = resolve(base, &c.grpc_server.socket_path);
        c.common.edgecore_sock = resolve(base, &c.common.edgecore_sock);
        if c.common.data_dir.is_empty() {
            c.common.data_dir = format!("/var/lib/kubeedge/{}", c.common.name);
        }
        c.common.data_dir = resolve(base, &c.common.data_dir);
        if !c.common.http_token_file.is_empty() {
            c.common.http_token_file = resolve(base, &c.common.http_token_file);
        }
        Ok(c)
    }

    /// This mapper's socket, without a `unix://` prefix.
    pub fn socket(&self) -> PathBuf {
        PathBuf::from(strip_unix(&self.grpc_server.socket_path))
    }
}

fn strip_unix(p: &str) -> &str {
    p.strip_prefix("unix://").unwrap_or(p)
}

fn resolve(base: &Path, p: &str) -> String {
    let plain = Path::new(strip_unix(p));
    if plain.is_absolute() {
        plain.to_string_lossy().into_owned()
    } else {
        base.join(plain).to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mapper_framework_config() {
        let c = Config::parse(
            "grpc_server:\n  socket_path: /etc/kubeedge/modbus.sock\ncommon:\n  name: modbus-mapper\n  version: v1.13.0\n  api_version: v1.0.0\n  protocol: modbus\n  address: 127.0.0.1\n  edgecore_sock: unix:///etc/kubeedge/dmi.sock\n  http_port: 7777\n",
            Path::new("/x"),
        )
        .expect("valid");
        assert_eq!(c.socket(), Path::new("/etc/kubeedge/modbus.sock"));
        assert_eq!(c.common.edgecore_sock, "/etc/kubeedge/dmi.sock");
        assert_eq!(c.common.protocol, "modbus");
        assert_eq!(c.common.http_port, 7777);
    }

    /// A config file named by a relative path (`--config-file config.yaml`, run from its
    /// directory) gives absolute socket paths: edgecore, started elsewhere, reaches them.
    #[test]
    fn a_relative_config_path_gives_absolute_sockets() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join("config.yaml"),
            "grpc_server: {socket_path: m.sock}\ncommon: {name: m, protocol: modbus, edgecore_sock: dmi.sock}\n",
        )
        .expect("written");
        let here = std::env::current_dir().expect("cwd");
        let rel = pathdiff(dir.path(), &here).join("config.yaml");
        let c = Config::load(&rel).expect("valid");
        assert!(c.socket().is_absolute(), "{:?}", c.socket());
        let real = std::fs::canonicalize(dir.path()).expect("the directory");
        assert_eq!(c.socket(), real.join("m.sock"));
        assert_eq!(Path::new(&c.common.edgecore_sock), real.join("dmi.sock"));
    }

    /// `to` as a path relative to `from` (both absolute).
    fn pathdiff(to: &Path, from: &Path) -> PathBuf {
        let (t, f): (Vec<_>, Vec<_>) = (to.components().collect(), from.components().collect());
        let common = t.iter().zip(&f).take_while(|(a, b)| a == b).count();
        let mut out = PathBuf::new();
        for _ in common..f.len() {
            out.push("..");
        }
        for c in &t[common..] {
            out.push(c);
        }
        out
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = Config::parse(
            "common: {name: m, protocol: modbus, edgecore_sock: data/dmi.sock}",
            Path::new("/etc/m"),
        )
        .expect("valid");
        assert_eq!(c.socket(), Path::new("/etc/kubeedge/m.sock"));
        assert_eq!(c.common.edgecore_sock, "/etc/m/data/dmi.sock");
        assert_eq!(c.common.http_port, 7777);
        assert_eq!(c.common.data_dir, "/var/lib/kubeedge/m");
        let c = Config::parse(
            "common: {name: m, protocol: opcua, data_dir: state}",
            Path::new("/etc/m"),
        )
        .expect("valid");
        assert_eq!(c.common.data_dir, "/etc/m/state");
    }

    #[test]
    fn errors_name_the_key() {
        let e = Config::parse(
            "common: {name: m, protocol: modbus, htp_port: 1}",
            Path::new("/"),
        )
        .expect_err("unknown key");
        assert!(e.to_string().contains("htp_port"), "{e}");
        let e = Config::parse(
            "common: {name: m, protocol: modbus, http_port: x}",
            Path::new("/"),
        )
        .expect_err("bad port");
        assert!(e.to_string().contains("common.http_port"), "{e}");
        let e = Config::parse("common: {name: '', protocol: modbus}", Path::new("/"))
            .expect_err("empty name");
        assert!(e.to_string().contains("common.name"), "{e}");
    }
}
