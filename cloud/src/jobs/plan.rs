//! The decisions of a fleet job, pure: which nodes it is for, which start next, when it is
//! over and why. The job's task (`jobs::run_job`) acts on them.

use api::operations::NodePhase;
use serde_json::Value;
use std::collections::BTreeMap;

/// KubeEdge's defaults.
pub(crate) const DEFAULT_TIMEOUT_SECONDS: u32 = 300;
pub(crate) const DEFAULT_TOLERATE: f64 = 0.1;

/// A job's phase (KubeEdge's `JobPhase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobPhase {
    InProgress,
    Completed,
    Failure,
}

impl JobPhase {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::InProgress => "InProgress",
            Self::Completed => "Completed",
            Self::Failure => "Failure",
        }
    }

    pub(crate) fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failure)
    }
}

/// How a job goes through its nodes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Rules {
    /// Nodes working at once (at least 1).
    pub concurrency: usize,
    /// The share of nodes that may fail; more, and no further node starts.
    pub tolerate: f64,
    /// One node alone first, the others only once one has succeeded.
    pub canary: bool,
}

/// A job's template as the controller uses it, checked.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    pub node_names: Vec<String>,
    pub selector: Option<Value>,
    pub rules: Rules,
    pub timeout_seconds: u32,
    pub retry_times: u32,
    pub images: Vec<String>,
    pub image_secrets: Option<(String, String)>,
    pub check_items: Vec<String>,
    /// A `NodeUpgradeJob`'s release.
    pub version: String,
    /// A `ConfigUpdateJob`'s fields, by their dotted path in edgecore's config.
    pub update_fields: BTreeMap<String, String>,
}

/// Why a job's template cannot be used: the field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {why}")]
pub(crate) struct TemplateError {
    pub field: String,
    pub why: String,
}

fn bad(field: impl Into<String>, why: impl Into<String>) -> TemplateError {
    TemplateError {
        field: field.into(),
        why: why.into(),
    }
}

/// Why a label selector cannot be used: where in it, and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{at}: {why}")]
pub(crate) struct SelectorError {
    pub at: String,
    pub why: String,
}

fn bad_selector(at: impl Into<String>, why: impl Into<String>) -> SelectorError {
    SelectorError {
        at: at.into(),
        why: why.into(),
    }
}

/// Reads an `ImagePrePullJob`'s `spec.imagePrePullTemplate`; the error names the field.
pub(crate) fn prepull_template(spec: &Value) -> Result<Template, TemplateError> {
    let t = &spec["imagePrePullTemplate"];
    let f = "spec.imagePrePullTemplate";
    let images = strings(t, f, "images")?;
    if images.is_empty() {
        return Err(bad(format!("{f}.images"), "give at least one image"));
    }
    if let Some(b) = images.iter().find(|i| i.chars().any(char::is_whitespace)) {
        return Err(bad(
            format!("{f}.images"),
            format!("{b:?} is not an image reference"),
        ));
    }
    let mut out = common(t, f, "to pull on")?;
    out.images = images;
    out.retry_times = int(t, f, "retryTimes", 0)?;
    out.image_secrets = match t["imageSecrets"].as_str().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(
            s.split_once('/')
                .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
                .map(|(ns, n)| (ns.to_string(), n.to_string()))
                .ok_or_else(|| {
                    bad(
                        format!("{f}.imageSecrets"),
                        format!("{s:?} is not namespace/name"),
                    )
                })?,
        ),
    };
    Ok(out)
}

/// Reads a `NodeUpgradeJob`'s `spec`; the error names the field. One node goes first (the
/// canary); the others only once one has succeeded.
pub(crate) fn upgrade_template(spec: &Value) -> Result<Template, TemplateError> {
    let f = "spec";
    let mut out = common(spec, f, "to upgrade")?;
    out.rules.canary = true;
    out.version = spec["version"].as_str().unwrap_or_default().to_string();
    if !api::operations::valid_version(&out.version) {
        return Err(bad(
            format!("{f}.version"),
            format!(
                "{:?} is not a release name (letters, digits, . _ + -)",
                out.version
            ),
        ));
    }
    if spec["requireConfirmation"].as_bool() == Some(true) {
        return Err(bad(
            format!("{f}.requireConfirmation"),
            "confirmation on the node is not supported; a canary goes first instead",
        ));
    }
    Ok(out)
}

/// Reads a `ConfigUpdateJob`'s `spec`; the error names the field. One node goes first (the
/// canary), as for an upgrade: a config that keeps nodes from coming back stops at one.
pub(crate) fn config_template(spec: &Value) -> Result<Template, TemplateError> {
    let f = "spec";
    let mut out = common(spec, f, "to update")?;
    out.rules.canary = true;
    let Some(fields) = spec["updateFields"].as_object().filter(|m| !m.is_empty()) else {
        return Err(bad(
            format!("{f}.updateFields"),
            "give the fields to set, by their path in edgecore's config",
        ));
    };
    for (path, value) in fields {
        if path.is_empty() || path.split('.').any(|p| p.is_empty()) {
            return Err(bad(
                format!("{f}.updateFields"),
                format!("{path:?} is not a field path (names joined by dots)"),
            ));
        }
        if path == "dataDir" {
            return Err(bad(
                format!("{f}.updateFields"),
                "dataDir cannot be changed by a job (the node's twins are kept there)",
            ));
        }
        let Some(v) = value.as_str() else {
            return Err(bad(
                format!("{f}.updateFields.{path}"),
                format!("{value} is not a string"),
            ));
        };
        out.update_fields.insert(path.clone(), v.to_string());
    }
    Ok(out)
}

fn strings(t: &Value, f: &str, key: &str) -> Result<Vec<String>, TemplateError> {
    match &t[key] {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .filter(|s| !s.trim().is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| bad(format!("{f}.{key}"), "every item is a non-empty string"))
            })
            .collect(),
        _ => Err(bad(format!("{f}.{key}"), "a list of strings")),
    }
}

fn int(t: &Value, f: &str, key: &str, default: u32) -> Result<u32, TemplateError> {
    match &t[key] {
        Value::Null => Ok(default),
        v => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("{f}.{key}"), format!("{v} is not a count"))),
    }
}

/// What every job's template has: its nodes, how many at once, what failure it tolerates,
/// its time.
fn common(t: &Value, f: &str, what: &str) -> Result<Template, TemplateError> {
    let node_names = strings(t, f, "nodeNames")?;
    let selector = t.get("labelSelector").filter(|v| !v.is_null()).cloned();
    if node_names.is_empty() && selector.is_none() {
        return Err(bad(
            f,
            format!("give nodeNames or labelSelector (the nodes {what})"),
        ));
    }
    if let Some(s) = &selector {
        selects(s, &BTreeMap::new())
            .map_err(|e| bad(format!("{f}.labelSelector"), e.to_string()))?;
    }
    let tolerate = match t["failureTolerate"].as_str().filter(|s| !s.is_empty()) {
        None => DEFAULT_TOLERATE,
        Some(s) => s
            .parse::<f64>()
            .ok()
            .filter(|x| (0.0..=1.0).contains(x))
            .ok_or_else(|| {
                bad(
                    format!("{f}.failureTolerate"),
                    format!("{s:?} is not a ratio from 0 to 1"),
                )
            })?,
    };
    let concurrency = int(t, f, "concurrency", 1)?.max(1) as usize;
    let timeout_seconds = match int(t, f, "timeoutSeconds", DEFAULT_TIMEOUT_SECONDS)? {
        0 => DEFAULT_TIMEOUT_SECONDS,
        n => n,
    };
    Ok(Template {
        node_names,
        selector,
        rules: Rules {
            concurrency,
            tolerate,
            canary: false,
        },
        timeout_seconds,
        retry_times: 0,
        images: Vec::new(),
        image_secrets: None,
        check_items: strings(t, f, "checkItems")?,
        version: String::new(),
        update_fields: BTreeMap::new(),
    })
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`; an error
/// names what in the selector is wrong.
pub(crate) fn selects(
    selector: &Value,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut all = true;
    match &selector["matchLabels"] {
        Value::Null => {}
        Value::Object(m) => {
            for (k, v) in m {
                let v = v
                    .as_str()
                    .ok_or_else(|| bad_selector(format!("matchLabels.{k}"), "not a string"))?;
                all &= labels.get(k).map(String::as_str) == Some(v);
            }
        }
        _ => return Err(bad_selector("matchLabels", "not a map")),
    }
    match &selector["matchExpressions"] {
        Value::Null => {}
        Value::Array(exprs) => {
            for (i, e) in exprs.iter().enumerate() {
                let key = e["key"]
                    .as_str()
                    .ok_or_else(|| bad_selector(format!("matchExpressions[{i}].key"), "missing"))?;
                let values: Vec<&str> = e["values"]
                    .as_array()
                    .map(|a| a.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                let have = labels.get(key).map(String::as_str);
                all &= match e["operator"].as_str() {
                    Some("In") if !values.is_empty() => have.is_some_and(|h| values.contains(&h)),
                    Some("NotIn") if !values.is_empty() => {
                        !have.is_some_and(|h| values.contains(&h))
                    }
                    Some("Exists") if values.is_empty() => have.is_some(),
                    Some("DoesNotExist") if values.is_empty() => have.is_none(),
                    Some(op @ ("In" | "NotIn")) => {
                        return Err(bad_selector(
                            format!("matchExpressions[{i}]"),
                            format!("{op} needs values"),
                        ));
                    }
                    Some(op @ ("Exists" | "DoesNotExist")) => {
                        return Err(bad_selector(
                            format!("matchExpressions[{i}]"),
                            format!("{op} takes no values"),
                        ));
                    }
                    other => {
                        return Err(bad_selector(
                            format!("matchExpressions[{i}].operator"),
                            format!("{other:?} is not In, NotIn, Exists or DoesNotExist"),
                        ));
                    }
                };
            }
        }
        _ => return Err(bad_selector("matchExpressions", "not a list")),
    }
    Ok(all)
}

/// The job's nodes: those named (in their order) then those the selector picks (by name),
/// each once; `nodes` are the cluster's nodes and their labels. Named nodes that do not exist
/// are in the second list.
pub(crate) fn targets(
    t: &Template,
    nodes: &BTreeMap<String, BTreeMap<String, String>>,
) -> (Vec<String>, Vec<String>) {
    let mut out: Vec<String> = Vec::new();
    let mut missing = Vec::new();
    for n in &t.node_names {
        if out.contains(n) || missing.contains(n) {
            continue;
        }
        if nodes.contains_key(n) {
            out.push(n.clone());
        } else {
            missing.push(n.clone());
        }
    }
    if let Some(s) = &t.selector {
        for (name, labels) in nodes {
            if !out.contains(name) && selects(s, labels).unwrap_or(false) {
                out.push(name.clone());
            }
        }
    }
    (out, missing)
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Next {
    /// Indexes of the tasks to start now.
    pub start: Vec<usize>,
    pub phase: JobPhase,
    pub reason: String,
}

/// The next step of a job whose node tasks are in `phases` (in the job's order).
pub(crate) fn next(rules: Rules, phases: &[NodePhase]) -> Next {
    let total = phases.len();
    let count = |p: NodePhase| phases.iter().filter(|x| **x == p).count();
    let (ok, failed, running) = (
        count(NodePhase::Successful),
        count(NodePhase::Failure),
        count(NodePhase::InProgress),
    );
    if total == 0 {
        return Next {
            start: Vec::new(),
            phase: JobPhase::Failure,
            reason: "no node matched nodeNames or labelSelector".into(),
        };
    }
    let stopped = failed as f64 / total as f64 > rules.tolerate;
    let pending: Vec<usize> = (0..total)
        .filter(|&i| matches!(phases[i], NodePhase::Pending | NodePhase::Unknown))
        .collect();
    let limit = if rules.canary && ok == 0 {
        1
    } else {
        rules.concurrency.max(1)
    };
    let start: Vec<usize> = if stopped {
        Vec::new()
    } else {
        pending
            .iter()
            .copied()
            .take(limit.saturating_sub(running))
            .collect()
    };
    let busy = running + start.len();
    let (phase, reason) = if busy > 0 {
        (JobPhase::InProgress, String::new())
    } else if stopped {
        (
            JobPhase::Failure,
            format!(
                "{failed} of {total} nodes failed, more than failureTolerate {}; {} not started",
                rules.tolerate,
                pending.len()
            ),
        )
    } else if failed > 0 {
        (
            JobPhase::Completed,
            format!(
                "{ok} of {total} nodes succeeded; {failed} failed, within failureTolerate {}",
                rules.tolerate
            ),
        )
    } else {
        (
            JobPhase::Completed,
            format!("{ok} of {total} nodes succeeded"),
        )
    };
    Next {
        start,
        phase,
        reason,
    }
}

/// The most of a node's own reason a job's reason quotes.
const QUOTED: usize = 240;

/// A finished job's reason with its first failed node's own reason after it (`failed`: each
/// failed node and its reason, in the job's order), so that `kubectl get` says why a node
/// failed, not only how many did; the others are counted, their reasons in `status.nodeStatus`.
pub(crate) fn with_failures(reason: &str, failed: &[(&str, &str)]) -> String {
    let Some((node, why)) = failed.first() else {
        return reason.to_string();
    };
    let mut why: String = why.chars().take(QUOTED).collect();
    if why.len() < failed[0].1.len() {
        why.push('…');
    }
    let mut out = format!("{reason}. {node}: {why}");
    if failed.len() > 1 {
        out.push_str(&format!(
            " (and {} more failed: status.nodeStatus)",
            failed.len() - 1
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_jobs_reason_quotes_its_first_failed_nodes_own() {
        let r = "1 of 3 nodes failed, more than failureTolerate 0; 2 not started";
        assert_eq!(with_failures(r, &[]), r);
        assert_eq!(
            with_failures(
                r,
                &[(
                    "gw-3",
                    "the new edgecore (v2) exited on trial (exit status: 2)"
                )]
            ),
            format!("{r}. gw-3: the new edgecore (v2) exited on trial (exit status: 2)")
        );
        let two = with_failures(r, &[("gw-1", "no node named gw-1"), ("gw-2", "x")]);
        assert!(
            two.ends_with("gw-1: no node named gw-1 (and 1 more failed: status.nodeStatus)"),
            "{two}"
        );
        // A long reason is cut, and says so.
        let long = "é".repeat(1000);
        let cut = with_failures(r, &[("gw-1", &long)]);
        assert!(
            cut.ends_with('…') && cut.chars().count() < r.len() + QUOTED + 10,
            "{cut}"
        );
    }
    use proptest::prelude::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|&(k, v)| (k.into(), v.into())).collect()
    }

    #[test]
    fn a_config_update_names_its_fields_and_refuses_what_cannot_be_one() {
        let t = config_template(
            &json!({"nodeNames": ["a"], "updateFields": {"cloud.metricsSeconds": "30"}}),
        )
        .expect("ok");
        assert!(t.rules.canary);
        assert_eq!(t.update_fields["cloud.metricsSeconds"], "30");
        for (spec, said) in [
            (
                json!({"nodeNames": ["a"]}),
                "spec.updateFields: give the fields",
            ),
            (
                json!({"nodeNames": ["a"], "updateFields": {}}),
                "spec.updateFields: give the fields",
            ),
            (
                json!({"nodeNames": ["a"], "updateFields": {"a..b": "1"}}),
                "not a field path",
            ),
            (
                json!({"nodeNames": ["a"], "updateFields": {"dataDir": "/x"}}),
                "dataDir cannot be changed",
            ),
            (
                json!({"nodeNames": ["a"], "updateFields": {"a": 1}}),
                "spec.updateFields.a: 1 is not a string",
            ),
            (
                json!({"updateFields": {"a": "1"}}),
                "give nodeNames or labelSelector",
            ),
        ] {
            let e = config_template(&spec).expect_err(said);
            assert!(e.to_string().contains(said), "{spec}: {e}");
        }
    }

    #[test]
    fn a_template_is_read_with_kubeedge_defaults_and_bad_fields_are_named() {
        let t = prepull_template(
            &json!({"imagePrePullTemplate": {"images": ["a:1"], "nodeNames": ["n1"]}}),
        )
        .expect("ok");
        assert_eq!(t.rules.concurrency, 1);
        assert_eq!(t.rules.tolerate, 0.1);
        assert_eq!(t.timeout_seconds, 300);
        for (bad, field) in [
            (json!({"images": []}), "images"),
            (json!({"images": ["a b"], "nodeNames": ["n"]}), "images"),
            (json!({"images": ["a"]}), "nodeNames or labelSelector"),
            (
                json!({"images": ["a"], "nodeNames": ["n"], "failureTolerate": "1.5"}),
                "failureTolerate",
            ),
            (
                json!({"images": ["a"], "nodeNames": ["n"], "concurrency": -1}),
                "concurrency",
            ),
            (
                json!({"images": ["a"], "nodeNames": ["n"], "imageSecrets": "creds"}),
                "imageSecrets",
            ),
            (
                json!({"images": ["a"], "labelSelector": {"matchExpressions": [{"key": "k", "operator": "Is"}]}}),
                "operator",
            ),
        ] {
            let e = prepull_template(&json!({ "imagePrePullTemplate": bad })).expect_err("refused");
            assert!(e.to_string().contains(field), "{e} (want {field})");
        }
    }

    #[test]
    fn an_upgrade_names_a_safe_release_and_goes_canary_first() {
        let t = upgrade_template(&json!({"version": "v2", "nodeNames": ["n"]})).expect("ok");
        assert!(t.rules.canary);
        assert_eq!(t.version, "v2");
        for (bad, field) in [
            (
                json!({"version": "../../etc", "nodeNames": ["n"]}),
                "spec.version",
            ),
            (json!({"nodeNames": ["n"]}), "spec.version"),
            (json!({"version": "v2"}), "nodeNames or labelSelector"),
            (
                json!({"version": "v2", "nodeNames": ["n"], "requireConfirmation": true}),
                "requireConfirmation",
            ),
        ] {
            let e = upgrade_template(&bad).expect_err("refused");
            assert!(e.to_string().contains(field), "{e} (want {field})");
        }
    }

    #[test]
    fn selectors_match_as_kubernetes_does() {
        let l = labels(&[("site", "a"), ("role", "gw")]);
        let yes = [
            json!({}),
            json!({"matchLabels": {"site": "a"}}),
            json!({"matchExpressions": [{"key": "site", "operator": "In", "values": ["a", "b"]}]}),
            json!({"matchExpressions": [{"key": "zone", "operator": "DoesNotExist"}]}),
            json!({"matchExpressions": [{"key": "site", "operator": "NotIn", "values": ["c"]}]}),
            json!({"matchExpressions": [{"key": "role", "operator": "Exists"}]}),
        ];
        for s in yes {
            assert_eq!(selects(&s, &l), Ok(true), "{s}");
        }
        let no = [
            json!({"matchLabels": {"site": "b"}}),
            json!({"matchLabels": {"site": "a", "zone": "1"}}),
            json!({"matchExpressions": [{"key": "site", "operator": "NotIn", "values": ["a"]}]}),
            json!({"matchExpressions": [{"key": "zone", "operator": "Exists"}]}),
        ];
        for s in no {
            assert_eq!(selects(&s, &l), Ok(false), "{s}");
        }
    }

    #[test]
    fn named_nodes_come_first_once_and_missing_ones_are_said() {
        let nodes: BTreeMap<_, _> = [
            ("a".to_string(), labels(&[("site", "x")])),
            ("b".to_string(), labels(&[])),
            ("c".to_string(), labels(&[("site", "x")])),
        ]
        .into();
        let mut t = prepull_template(&json!({"imagePrePullTemplate": {
            "images": ["i"], "nodeNames": ["c", "ghost", "c"],
            "labelSelector": {"matchLabels": {"site": "x"}}}}))
        .expect("ok");
        assert_eq!(
            targets(&t, &nodes),
            (vec!["c".into(), "a".into()], vec!["ghost".into()])
        );
        t.selector = None;
        assert_eq!(targets(&t, &nodes).0, vec!["c".to_string()]);
    }

    fn rules(concurrency: usize, tolerate: f64, canary: bool) -> Rules {
        Rules {
            concurrency,
            tolerate,
            canary,
        }
    }

    #[test]
    fn a_canary_goes_alone_then_concurrency_at_a_time() {
        use NodePhase::*;
        let r = rules(2, 0.0, true);
        assert_eq!(next(r, &[Pending, Pending, Pending]).start, [0]);
        assert!(next(r, &[InProgress, Pending, Pending]).start.is_empty());
        assert_eq!(next(r, &[Successful, Pending, Pending]).start, [1, 2]);
        let failed = next(r, &[Failure, Pending, Pending]);
        assert!(failed.start.is_empty());
        assert_eq!(failed.phase, JobPhase::Failure);
        assert_eq!(
            failed.reason,
            "1 of 3 nodes failed, more than failureTolerate 0; 2 not started"
        );
        let done = next(rules(1, 0.5, false), &[Successful, Failure]);
        assert_eq!(done.phase, JobPhase::Completed);
        assert!(done.reason.contains("1 failed, within"), "{}", done.reason);
        assert_eq!(next(r, &[]).phase, JobPhase::Failure);
    }

    fn phase() -> impl Strategy<Value = NodePhase> {
        prop_oneof![
            Just(NodePhase::Pending),
            Just(NodePhase::InProgress),
            Just(NodePhase::Successful),
            Just(NodePhase::Failure),
        ]
    }

    proptest! {
        /// Whatever the state: never more than `concurrency` at work (one before a success
        /// with a canary), nothing starts once failures pass the tolerance, only pending
        /// tasks start, and the job is over exactly when nothing is at work or can start.
        #[test]
        fn the_plan_keeps_its_bounds(
            phases in prop::collection::vec(phase(), 0..12),
            concurrency in 1usize..5,
            tolerate in 0.0f64..1.0,
            canary: bool,
        ) {
            let n = next(rules(concurrency, tolerate, canary), &phases);
            let running = phases.iter().filter(|p| **p == NodePhase::InProgress).count();
            let ok = phases.iter().filter(|p| **p == NodePhase::Successful).count();
            let failed = phases.iter().filter(|p| **p == NodePhase::Failure).count();
            let limit = if canary && ok == 0 { 1 } else { concurrency };
            prop_assert!(n.start.is_empty() || running + n.start.len() <= limit);
            prop_assert!(n.start.iter().all(|&i| phases[i] == NodePhase::Pending));
            let stopped = !phases.is_empty() && failed as f64 / phases.len() as f64 > tolerate;
            if stopped {
                prop_assert!(n.start.is_empty());
            }
            let pending = phases.contains(&NodePhase::Pending);
            prop_assert_eq!(n.phase.is_final(), running == 0 && n.start.is_empty());
            if n.phase.is_final() && !phases.is_empty() {
                prop_assert!(stopped || !pending);
                prop_assert_eq!(n.phase == JobPhase::Failure, stopped);
            }
            // Some pending task starts when the job may go on and there is room.
            if !stopped && pending && running < limit {
                prop_assert!(!n.start.is_empty());
            }
        }
    }
}
