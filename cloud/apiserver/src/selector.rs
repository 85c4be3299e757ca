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

/// A parsed field selector: `path=value`, `path==value` and `path!=value` terms, all of which an
/// object must match.
///
/// The grammar is kube-apiserver's (`fields.ParseSelector`): terms are split on commas not
/// escaped by a backslash; a term's operator is the first `!=`, `==` or `=` in it; nothing is
/// trimmed; a value escapes `\\`, `\,` and `\=`, and any other escape or a bare `,` or `=` in
/// it is refused. There are no sets, parentheses or existence terms: `a in (x,y)` is refused.
///
/// The same parsed selector is what the authorizer decides on ([`Fields::pins`]) and what the
/// list or watch then filters with ([`Fields::matches`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct Fields(Vec<Term>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    path: String,
    equal: bool,
    value: String,
}

/// The terms of a field selector: split on commas no backslash escapes.
fn field_terms(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// A value with its escapes removed; `None` for one kube-apiserver refuses.
fn unescape(v: &str) -> Option<String> {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next()? {
                e @ ('\\' | ',' | '=') => out.push(e),
                _ => return None,
            },
            ',' | '=' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

impl Fields {
    /// Parses `s`, refusing paths not in `allowed` with kube-apiserver's message.
    pub(crate) fn parse(s: &str, allowed: &[String]) -> Result<Self, SelectorError> {
        let f = Self::parse_any(s)?;
        if let Some(t) = f.0.iter().find(|t| !allowed.contains(&t.path)) {
            let list: Vec<String> = allowed.iter().map(|a| format!("\"{a}\"")).collect();
            return Err(SelectorError::FieldLabel {
                label: Excerpt::plain(&t.path),
                supported: list.join(", "),
            });
        }
        Ok(f)
    }

    /// Parses `s` whatever paths it names (an access review's selector).
    pub(crate) fn parse_any(s: &str) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for term in field_terms(s).into_iter().filter(|t| !t.is_empty()) {
            let refused = || SelectorError::Field(Excerpt::plain(term));
            let (at, op) = term
                .char_indices()
                .find_map(|(i, _)| {
                    ["!=", "==", "="]
                        .into_iter()
                        .find(|op| term[i..].starts_with(op))
                        .map(|op| (i, op))
                })
                .ok_or_else(refused)?;
            let value = unescape(&term[at + op.len()..]).ok_or_else(refused)?;
            terms.push(Term {
                path: term[..at].to_string(),
                equal: op != "!=",
                value,
            });
        }
        Ok(Self(terms))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The values an equality term requires at `path`: every object the selector matches has
    /// each of them there (several differing ones: no object matches).
    pub(crate) fn pinned<'a>(&'a self, path: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        (self.0.iter())
            .filter(move |t| t.equal && t.path == path)
            .map(|t| t.value.as_str())
    }

    /// Whether every object this selector matches has `value` at `path`.
    pub(crate) fn pins(&self, path: &str, value: &str) -> bool {
        self.pinned(path).any(|v| v == value)
    }

    pub(crate) fn matches(&self, v: &Value) -> bool {
        self.0.iter().all(|t| {
            let got = t
                .path
                .split('.')
                .try_fold(v, |cur, k| cur.get(k))
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                })
                .unwrap_or_default();
            (got == t.value) == t.equal
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

    /// kube-apiserver's grammar, case by case: what it refuses is refused, and the terms it
    /// reads are the terms that are then matched.
    #[test]
    fn field_selectors_parse_as_kube_apiserver_parses_them() {
        let allowed = vec!["metadata.name".to_string(), "spec.nodeName".to_string()];
        let terms = |s: &str| {
            Fields::parse(s, &allowed).map(|f| {
                (f.0.into_iter())
                    .map(|t| format!("{}{}{}", t.path, if t.equal { "=" } else { "!=" }, t.value))
                    .collect::<Vec<_>>()
            })
        };
        let ok = |s: &str, want: &[&str]| {
            let want: Vec<String> = want.iter().map(|w| w.to_string()).collect();
            assert_eq!(terms(s).map_err(|e| e.to_string()), Ok(want), "{s}")
        };
        ok("spec.nodeName=n1", &["spec.nodeName=n1"]);
        ok(
            "spec.nodeName==n1,metadata.name!=a",
            &["spec.nodeName=n1", "metadata.name!=a"],
        );
        ok("", &[]);
        ok(",spec.nodeName=n1,", &["spec.nodeName=n1"]);
        ok("metadata.name=a\\,b", &["metadata.name=a,b"]);
        ok("metadata.name=a\\=b\\\\", &["metadata.name=a=b\\"]);
        // Parentheses are no syntax: part of a value, which no object name has.
        ok("metadata.name=(a)", &["metadata.name=(a)"]);
        ok(
            "spec.nodeName=n2,spec.nodeName=n1",
            &["spec.nodeName=n2", "spec.nodeName=n1"],
        );
        let refused = |s: &str, want: &str| {
            assert_eq!(
                terms(s).map_err(|e| e.to_string()),
                Err(want.to_string()),
                "{s}"
            )
        };
        refused(
            "metadata.name in (a,b)",
            "invalid selector: 'metadata.name in (a'; can't understand 'metadata.name in (a'",
        );
        refused(
            "!metadata.name",
            "invalid selector: '!metadata.name'; can't understand '!metadata.name'",
        );
        refused(
            "metadata.name=a=b",
            "invalid selector: 'metadata.name=a=b'; can't understand 'metadata.name=a=b'",
        );
        refused(
            "metadata.name=a\\b",
            "invalid selector: 'metadata.name=a\\b'; can't understand 'metadata.name=a\\b'",
        );
        refused(
            "metadata.name=a\\",
            "invalid selector: 'metadata.name=a\\'; can't understand 'metadata.name=a\\'",
        );
        // Nothing is trimmed: a spaced path is another path.
        refused(
            " spec.nodeName=n1",
            "field label not supported:  spec.nodeName (supported: \"metadata.name\", \"spec.nodeName\")",
        );
    }

    #[test]
    fn a_selector_pins_a_field_only_through_an_equality_term() {
        let f = |s: &str| Fields::parse_any(s).expect("parses");
        assert!(f("spec.nodeName=n1").pins("spec.nodeName", "n1"));
        assert!(f("metadata.name!=x,spec.nodeName==n1").pins("spec.nodeName", "n1"));
        assert!(f("spec.nodeName=n2,spec.nodeName=n1").pins("spec.nodeName", "n1"));
        assert!(!f("spec.nodeName!=n1").pins("spec.nodeName", "n1"));
        assert!(!f("spec.nodeName=n1x").pins("spec.nodeName", "n1"));
        assert!(!f("metadata.name=n1").pins("spec.nodeName", "n1"));
        assert!(!f("").pins("spec.nodeName", "n1"));
    }
}
