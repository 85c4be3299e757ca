//! Label and field selectors, in the syntax kubectl sends (`a=b,c!=d,e in (x,y),!f`).

use crate::store::Obj;
use api::validate::names::Excerpt;
use serde_json::Value;

/// A selector that does not parse, in kube-apiserver's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SelectorError {
    #[error("expected a parenthesised set, found {0}")]
    NotASet(Excerpt),
    #[error("unable to parse requirement: {0}")]
    Requirement(Excerpt),
    #[error("invalid selector: '{0}'; can't understand '{0}'")]
    Field(Excerpt),
    #[error("field label not supported: {label} (supported: {supported})")]
    FieldLabel { label: Excerpt, supported: String },
}

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    Absent(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Labels(Vec<Req>);

fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter()
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .collect()
}

fn set(s: &str) -> Result<Vec<String>, SelectorError> {
    let inner = s
        .trim()
        .strip_prefix('(')
        .and_then(|x| x.strip_suffix(')'))
        .ok_or_else(|| SelectorError::NotASet(Excerpt::of(s)))?;
    Ok(inner
        .split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect())
}

impl Labels {
    pub(crate) fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let r = if let Some(k) = part.strip_prefix('!') {
                Req::Absent(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(SelectorError::Requirement(Excerpt::of(part)));
            } else {
                Req::Exists(part.to_string())
            };
            reqs.push(r);
        }
        Ok(Self(reqs))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, o: &Obj) -> bool {
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => o.label(k) == Some(v.as_str()),
            Req::Ne(k, v) => o.label(k) != Some(v.as_str()),
            Req::In(k, vs) => o.label(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            Req::NotIn(k, vs) => o.label(k).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Req::Exists(k) => o.label(k).is_some(),
            Req::Absent(k) => o.label(k).is_none(),
        })
    }
}

/// A parsed field selector: `path=value` and `path!=value` terms.
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields(Vec<(String, bool, String)>);

impl Fields {
    /// Parses `s`, refusing paths not in `allowed` with kube-apiserver's message.
    pub(crate) fn parse(s: &str, allowed: &[String]) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(SelectorError::Field(Excerpt::plain(part)));
            };
            let k = k.trim();
            if !allowed.iter().any(|a| a == k) {
                let list: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
                return Err(SelectorError::FieldLabel {
                    label: Excerpt::plain(k),
                    supported: list.join(", "),
                });
            }
            terms.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(Self(terms))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn matches(&self, v: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let got = path
                .split('.')
                .try_fold(v, |cur, k| cur.get(k))
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors() {
        let o = Obj::from_value(
            &json!({"metadata": {"labels": {"env": "prod", "tier": "a"}}}),
            1,
        );
        for (s, want) in [
            ("env=prod", true),
            ("env==prod,tier!=b", true),
            ("env in (dev, prod)", true),
            ("env notin (prod)", false),
            ("!missing,tier", true),
            ("missing", false),
        ] {
            assert_eq!(
                Labels::parse(s).expect("must succeed").matches(&o),
                want,
                "{s}"
            );
        }
        assert!(Labels::parse("env in prod").is_err());
    }

    #[test]
    fn field_selectors_refuse_unknown_fields() {
        let allowed = vec!["metadata.name".to_string()];
        let f = Fields::parse("metadata.name=a", &allowed).expect("must succeed");
        assert!(f.matches(&json!({"metadata": {"name": "a"}})));
        let e = Fields::parse("spec.x=1", &allowed).expect_err("must fail");
        assert_eq!(
            e.to_string(),
            "field label not supported: spec.x (supported: \"metadata.name\")"
        );
    }
}
