//! Kubernetes label selectors (`env=prod,region in (eu,us),!canary`) over destination labels.
//!
//! Same grammar as `k8s.io/apimachinery/pkg/labels.Parse`, with one deliberate difference: an
//! empty value after `=`, `==` or `!=` is rejected, because in a plugin block it almost always
//! means an arg resolved to nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::names::{has_label_value_chars, is_loose_label_key};

/// A selector that does not parse; the message names the part that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn fail<T>(reason: impl Into<String>) -> Result<T, SelectorError> {
    Err(SelectorError(reason.into()))
}

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key` — the label exists
    Exists(String),
    /// `!key` — the label does not exist
    NotExists(String),
    /// `key in (a,b)`, `key=a`, `key==a`
    In(String, Vec<String>),
    /// `key notin (a,b)`, `key!=a`
    NotIn(String, Vec<String>),
}

/// A parsed selector: all requirements must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    /// Parses a selector string.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top_level(s)? {
            let part = part.trim();
            if part.is_empty() {
                return fail(format!("empty requirement in {s:?}"));
            }
            reqs.push(parse_requirement(part)?);
        }
        if reqs.is_empty() {
            return fail("the selector is empty (expected e.g. env=prod)");
        }
        Ok(Self(reqs))
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        })
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
                Requirement::In(k, vs) if vs.len() == 1 => write!(f, "{k}={}", vs[0])?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                Requirement::NotIn(k, vs) if vs.len() == 1 => write!(f, "{k}!={}", vs[0])?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
            }
        }
        Ok(())
    }
}

fn split_top_level(s: &str) -> Result<Vec<&str>, SelectorError> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return fail(format!("unbalanced ')' in {s:?}"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return fail(format!("unbalanced '(' in {s:?}"));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, SelectorError> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_of(key.trim())?));
    }
    for (op, negate) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((k, v)) = part.split_once(op) {
            let value = value_of(v.trim(), op)?;
            let key = key_of(k.trim())?;
            return Ok(if negate {
                Requirement::NotIn(key, vec![value])
            } else {
                Requirement::In(key, vec![value])
            });
        }
    }
    let words: Vec<&str> = part.splitn(2, char::is_whitespace).collect();
    if let [key, rest] = words[..] {
        let rest = rest.trim_start();
        for (op, negate) in [("notin", true), ("in", false)] {
            if let Some(list) = rest.strip_prefix(op) {
                let list = list.trim();
                let inner = list
                    .strip_prefix('(')
                    .and_then(|l| l.strip_suffix(')'))
                    .ok_or_else(|| {
                        SelectorError(format!(
                            "expected a parenthesised list after `{op}` in {part:?}"
                        ))
                    })?;
                let values = inner
                    .split(',')
                    .map(|v| value_of(v.trim(), op))
                    .collect::<Result<Vec<_>, _>>()?;
                let key = key_of(key)?;
                return Ok(if negate {
                    Requirement::NotIn(key, values)
                } else {
                    Requirement::In(key, values)
                });
            }
        }
        return fail(format!(
            "unknown operator in {part:?} (use =, ==, !=, in, notin)"
        ));
    }
    Ok(Requirement::Exists(key_of(part)?))
}

fn key_of(k: &str) -> Result<String, SelectorError> {
    // At most one `/` (prefix and name), which the config file's labels do not insist on.
    if is_loose_label_key(k) && k.matches('/').count() <= 1 {
        Ok(k.to_string())
    } else {
        fail(format!("invalid label key {k:?}"))
    }
}

fn value_of(v: &str, op: &str) -> Result<String, SelectorError> {
    if v.is_empty() {
        return fail(format!("missing value after `{op}`"));
    }
    if !has_label_value_chars(v) {
        return fail(format!("invalid label value {v:?}"));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_and_matches() {
        let s = Selector::parse("env=prod, region in (eu,us),!canary,tier").unwrap();
        assert!(s.matches(&labels(&[("env", "prod"), ("region", "eu"), ("tier", "1")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("region", "ap"), ("tier", "1")])));
        assert!(!s.matches(&labels(&[
            ("env", "prod"),
            ("region", "eu"),
            ("tier", "1"),
            ("canary", "y")
        ])));
        assert_eq!(s.to_string(), "env=prod,region in (eu,us),!canary,tier");
        let n = Selector::parse("env!=dev,zone notin (a)").unwrap();
        assert!(n.matches(&labels(&[("env", "prod")])));
        assert!(!n.matches(&labels(&[("env", "dev")])));
    }

    #[test]
    fn rejects_mistakes() {
        for bad in [
            "",
            "env==",
            "env=",
            "a b c",
            "env in eu",
            "x in (a",
            "a,,b",
            "bad key=1",
            "env=a b",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} should be rejected");
        }
    }
}
