//! Jobs over the fleet (`operations.kubeedge.io/v1alpha2`, KubeEdge's task manager): what the
//! cloud asks one node to do for a job and what the node answers. Types only; cloudcore's
//! `jobs` decides which nodes, when, and writes the job's status; edgehub does the work.
//!
//! The question goes over the node's session as a message on
//! `operations/{kind}/{job}` (operation [`OPERATION`]); the answer is its response.

use serde::{Deserialize, Serialize};

/// The operation of a job's question to a node.
pub const OPERATION: &str = "run";
/// The message resource kind of an `ImagePrePullJob`'s question.
pub const IMAGE_PREPULL: &str = "imageprepulljob";
/// The message resource kind of a `NodeUpgradeJob`'s question.
pub const NODE_UPGRADE: &str = "nodeupgradejob";
/// The message resource kind of a `ConfigUpdateJob`'s question.
pub const CONFIG_UPDATE: &str = "configupdatejob";
/// The namespace segment of a job question's resource (jobs are cluster-scoped).
pub const NAMESPACE: &str = "operations";

/// A node task's phase (KubeEdge's `NodeTaskPhase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum NodePhase {
    #[default]
    Pending,
    InProgress,
    Successful,
    Failure,
    Unknown,
}

/// What an `ImagePrePullJob` asks of one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PrePull {
    /// Image references, pulled in this order.
    pub images: Vec<String>,
    /// Pulls tried again after a failure, per image.
    #[serde(default)]
    pub retry_times: u32,
    /// The node answers within this many seconds, pulled or not.
    pub timeout_seconds: u32,
    /// Checks before anything is done (`cpu`, `mem`, `disk`: each used at most 80 %).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub check_items: Vec<String>,
    /// Registry credentials from the job's `imageSecrets`, by registry host (a docker config's
    /// `auths`: `auth` is base64 of `user:password`, or `username` and `password`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub auths: std::collections::BTreeMap<String, RegistryAuth>,
}

/// One registry's credentials (never logged: `Debug` shows the user only).
#[derive(Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct RegistryAuth {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub username: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub password: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub auth: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// The registry host of an image reference, as a docker config keys it: the first path
/// segment when it names a host (has a dot or a port, or is `localhost`), else Docker Hub's.
pub fn registry_of(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// One image's result (KubeEdge's `ImageStatus`: `status` is a condition status).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageStatus {
    pub image: String,
    /// `True` when it is in the node's runtime, `False` when not.
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// A node's answer to a [`PrePull`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrePullResult {
    pub phase: NodePhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default)]
    pub image_status: Vec<ImageStatus>,
    /// The node's steps (`Check`, `Pull`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub action_flow: Vec<Action>,
}

impl PrePullResult {
    /// The node's answer from each image's result: successful when every image is there.
    pub fn of(images: Vec<ImageStatus>) -> Self {
        let failed: Vec<&ImageStatus> = images.iter().filter(|i| i.status != "True").collect();
        let (phase, reason) = match failed.as_slice() {
            [] => (NodePhase::Successful, String::new()),
            [one, ..] => (
                NodePhase::Failure,
                format!(
                    "{} of {} images not pulled; {}: {}",
                    failed.len(),
                    images.len(),
                    one.image,
                    one.reason
                ),
            ),
        };
        Self {
            phase,
            reason,
            image_status: images,
            action_flow: Vec::new(),
        }
    }

    /// A refusal before any pull (edged off, too many jobs running).
    pub fn refused(reason: impl Into<String>) -> Self {
        Self {
            phase: NodePhase::Failure,
            reason: reason.into(),
            image_status: Vec::new(),
            action_flow: Vec::new(),
        }
    }
}

/// What a `NodeUpgradeJob` asks of one node: run the release `version`, whose edgecore binary
/// the node downloads from its certificate server at `path` (with its node certificate) and
/// checks against `sha256` before anything changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Upgrade {
    pub version: String,
    /// Lowercase hex SHA-256 of the binary.
    pub sha256: String,
    /// `/releases/{version}/edgecore`.
    pub path: String,
    /// How long the new edgecore has to prove itself (its session back) before it is rolled
    /// back.
    pub health_seconds: u32,
    /// Checks before anything is done (`cpu`, `mem`, `disk`: each used at most 80 %).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub check_items: Vec<String>,
}

/// What a `ConfigUpdateJob` asks of one node: fields of its edgecore config set, by their
/// dotted path in the YAML (`modules.edgeHub.heartbeat` in KubeEdge's; `cloud.metricsSeconds`
/// in edgecore's), each value a YAML scalar as text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ConfigUpdate {
    pub update_fields: std::collections::BTreeMap<String, String>,
    /// How long edgecore on the new config has to get its session back before the old config
    /// is put back.
    pub health_seconds: u32,
    /// Checks before anything is done (`cpu`, `mem`, `disk`: each used at most 80 %).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub check_items: Vec<String>,
}

/// One step of a node's upgrade (KubeEdge's `actionFlow` item: `Check`, `BackUp`, `Upgrade`,
/// `RollBack`; `status` `True`/`False`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Action {
    pub action: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default)]
    pub time: String,
}

impl Action {
    /// The step `action` done (`ok`) or failed at `when`, its time in RFC 3339 (seconds).
    pub fn at(
        action: &str,
        ok: bool,
        reason: impl Into<String>,
        when: std::time::SystemTime,
    ) -> Self {
        let time = crate::rfc3339::of_system(when);
        Self {
            action: action.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            time,
        }
    }
}

/// A node's answer to an [`Upgrade`]: `InProgress` until the new edgecore proved itself or was
/// rolled back (the cloud asks again), then `Successful` or `Failure`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeResult {
    pub phase: NodePhase,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The version the node runs now.
    #[serde(default)]
    pub current_version: String,
    /// The version it ran before this job.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub historic_version: String,
    #[serde(default)]
    pub action_flow: Vec<Action>,
}

/// Whether `v` can name a release: it becomes a path segment on both sides, so letters,
/// digits, `.`, `_`, `+` and `-` only, not starting with `.`, at most 64 characters.
pub fn valid_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && !v.starts_with('.')
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '+' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_says_its_time_in_rfc3339() {
        let when = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_795_000_000_500);
        let a = Action::at("Pull", false, "not found", when);
        assert_eq!(a.time, "2026-11-18T11:06:40Z");
        assert_eq!(a.status, "False");
    }

    #[test]
    fn a_version_is_a_safe_path_segment() {
        for ok in ["v2", "v1.16.0", "2026.11-rc1+build_7"] {
            assert!(valid_version(ok), "{ok}");
        }
        for bad in ["", "..", ".hidden", "a/b", "v1 2", "a\\b", &"v".repeat(65)] {
            assert!(!valid_version(bad), "{bad}");
        }
    }

    #[test]
    fn registries_are_read_from_references_as_docker_does() {
        assert_eq!(registry_of("busybox"), "docker.io");
        assert_eq!(registry_of("library/busybox:1"), "docker.io");
        assert_eq!(registry_of("127.0.0.1:5000/a/b:1"), "127.0.0.1:5000");
        assert_eq!(registry_of("registry.local/a"), "registry.local");
        assert_eq!(registry_of("localhost/a"), "localhost");
        let a = RegistryAuth {
            username: "u".into(),
            password: "secret".into(),
            auth: String::new(),
        };
        assert!(!format!("{a:?}").contains("secret"));
    }

    #[test]
    fn a_node_succeeds_only_when_every_image_is_there() {
        let ok = |i: &str| ImageStatus {
            image: i.into(),
            status: "True".into(),
            reason: String::new(),
        };
        assert_eq!(
            PrePullResult::of(vec![ok("a"), ok("b")]).phase,
            NodePhase::Successful
        );
        let bad = ImageStatus {
            image: "b".into(),
            status: "False".into(),
            reason: "not found".into(),
        };
        let r = PrePullResult::of(vec![ok("a"), bad]);
        assert_eq!(r.phase, NodePhase::Failure);
        assert_eq!(r.reason, "1 of 2 images not pulled; b: not found");
        let wire = serde_json::to_value(&r).expect("json");
        assert_eq!(wire["imageStatus"][1]["status"], "False");
        assert_eq!(wire["phase"], "Failure");
    }
}
