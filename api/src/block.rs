//! The `rollouts-dispatch/job` plugin block of an AnalysisTemplate metric, parsed and validated once.
//!
//! Every error names the offending field and says how to fix it: the message ends up in the
//! AnalysisRun's measurement, where the person who wrote the template will read it.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::duration::parse_go_duration;
use crate::error::fail;
use crate::names::is_dns_label;
use crate::observe::{ApplicationCheck, Observe, RolloutCheck};
use crate::selector::Selector;

// Re-exported where it was first defined, so `dispatch_api::block::BlockError` keeps working.
pub use crate::error::BlockError;

/// The key under `provider.plugin` in AnalysisTemplates, also the name in `argo-rollouts-config`.
pub const PLUGIN_NAME: &str = "rollouts-dispatch/job";

/// How many log lines of a failed container go into the message when `logTail` is not set.
pub const DEFAULT_LOG_TAIL: u32 = 40;
/// The most log lines a message may carry.
pub const MAX_LOG_TAIL: u32 = 1000;

/// Where the Job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One or more destinations by name (`destination: a` or `destination: a,b`).
    Names(Vec<String>),
    /// The clusters the Kargo Stage promoted to (`destination: stage`).
    Stage,
    /// Every known destination whose labels match (`destinationSelector`).
    Selector(Selector),
}

/// How many destinations must succeed; `all` or `any` in blocks and in the Job reference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Require {
    /// every destination (the default)
    #[default]
    All,
    /// at least one
    Any,
}

/// A validated plugin block.
#[derive(Debug, Clone, PartialEq)]
pub struct JobConfig {
    /// where to run
    pub target: Target,
    /// the verdict rule across destinations
    pub require: Require,
    /// the namespace on the destination; `None` means the destination's default
    pub namespace: Option<String>,
    /// a Job running longer fails with that reason
    pub active_deadline: Option<Duration>,
    /// log lines of a failed container to quote in the message
    pub log_tail: u32,
    /// labels added to the Job
    pub labels: BTreeMap<String, String>,
    /// annotations added to the Job
    pub annotations: BTreeMap<String, String>,
    /// what to verify: run a Job, or observe what is deployed
    pub check: Check,
}

/// What a block verifies: exactly one of `spec`, `rollout` and `application`.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// `spec`: run this batch/v1 JobSpec, as written
    Job(Map<String, Value>),
    /// `rollout` or `application`: observe it on each destination, create nothing
    Observe(Observe),
}

impl JobConfig {
    /// The JobSpec of a `spec` block; `None` for observe checks.
    pub fn job_spec(&self) -> Option<&Map<String, Value>> {
        match &self.check {
            Check::Job(spec) => Some(spec),
            Check::Observe(_) => None,
        }
    }

    /// The JobSpec of a `spec` block, to change it (tests and tools); `None` for observe checks.
    pub fn job_spec_mut(&mut self) -> Option<&mut Map<String, Value>> {
        match &mut self.check {
            Check::Job(spec) => Some(spec),
            Check::Observe(_) => None,
        }
    }

    /// What an observe block follows; `None` for `spec` blocks.
    pub fn observe(&self) -> Option<&Observe> {
        match &self.check {
            Check::Job(_) => None,
            Check::Observe(o) => Some(o),
        }
    }
}

/// A plugin block that cannot be used; the message is shown to the template's author.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {PLUGIN_NAME} block in metric {metric:?}: {reason}")]
pub struct ConfigError {
    /// the metric whose block is wrong
    pub metric: String,
    /// what is wrong and how to fix it
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawBlock {
    destination: Option<String>,
    destination_selector: Option<String>,
    require: Option<String>,
    namespace: Option<String>,
    active_deadline: Option<String>,
    log_tail: Option<u32>,
    metadata: Option<RawMetadata>,
    spec: Option<Value>,
    rollout: Option<Value>,
    application: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

impl JobConfig {
    /// Finds and validates the block of `metric` in its `provider.plugin` map.
    pub fn from_plugin_map<'a>(
        metric: &str,
        plugins: impl IntoIterator<Item = (&'a String, &'a [u8])>,
    ) -> Result<Self, ConfigError> {
        let err = |reason: String| ConfigError {
            metric: metric.to_string(),
            reason,
        };
        let mut others = Vec::new();
        for (name, json) in plugins {
            if name == PLUGIN_NAME {
                return Self::parse(json).map_err(|e| err(e.0));
            }
            others.push(name.as_str());
        }
        Err(err(if others.is_empty() {
            format!(
                "the metric has no provider.plugin.{PLUGIN_NAME} block; add one (docs/templates.md)"
            )
        } else {
            format!(
                "the metric has no provider.plugin.{PLUGIN_NAME} block (found {}); register this plugin in \
                 argo-rollouts-config under the name {PLUGIN_NAME} and use that key",
                others.join(", ")
            )
        }))
    }

    /// Parses one block (compact JSON, args already substituted by the controller).
    pub fn parse(json: &[u8]) -> Result<Self, BlockError> {
        let value: Value = serde_json::from_slice(json)
            .map_err(|e| BlockError(format!("the block is not valid JSON: {e}")))?;
        Self::from_value(value)
    }

    /// Validates one block already read as JSON (the server's requests carry it as a value).
    pub fn from_value(value: Value) -> Result<Self, BlockError> {
        if !value.is_object() {
            return fail(format!(
                "the block must be an object with `destination` and `spec`, got {}",
                json_kind(&value)
            ));
        }
        let raw: RawBlock = serde_json::from_value(value)
            .map_err(|e| BlockError(format!("{e}; fix the field in the AnalysisTemplate")))?;
        let target = match (raw.destination, raw.destination_selector) {
            (Some(_), Some(_)) => {
                return fail("fields `destination` and `destinationSelector` are mutually exclusive: keep one")
            }
            (None, None) => {
                return fail("field `destination` is missing: set it to a destination name, a comma-separated list \
                            or \"stage\", or set `destinationSelector`")
            }
            (Some(d), None) => parse_destination(&d)?,
            (None, Some(s)) => Target::Selector(
                Selector::parse(&s).map_err(|e| BlockError(format!("field `destinationSelector` is invalid: {e}")))?,
            ),
        };
        let require = match raw.require.as_deref() {
            None | Some("all") => Require::All,
            Some("any") => Require::Any,
            Some(other) => {
                return fail(format!(
                    "field `require` must be \"all\" or \"any\", got {other:?}"
                ))
            }
        };
        let namespace = match raw.namespace {
            None => None,
            Some(ns) if ns.is_empty() => None,
            Some(ns) if is_dns_label(&ns) => Some(ns),
            Some(ns) => {
                return fail(format!(
                    "field `namespace` is not a valid namespace name: {ns:?} (lowercase letters, digits and '-', at most 63)"
                ))
            }
        };
        let active_deadline = match raw.active_deadline {
            None => None,
            Some(d) => Some(parse_go_duration(&d).map_err(|e| {
                BlockError(format!("field `activeDeadline` is not a duration: {d:?} ({e}; use Go syntax such as 20m or 1h30m)"))
            })?),
        };
        let log_tail = raw.log_tail.unwrap_or(DEFAULT_LOG_TAIL);
        if log_tail > MAX_LOG_TAIL {
            return fail(format!(
                "field `logTail` must be at most {MAX_LOG_TAIL}, got {log_tail}"
            ));
        }
        let (labels, annotations) = raw
            .metadata
            .map(|m| (m.labels, m.annotations))
            .unwrap_or_default();
        let check = match (raw.spec, raw.rollout, raw.application) {
            (Some(spec), None, None) => Check::Job(job_spec(spec)?),
            (None, Some(rollout), None) => {
                Check::Observe(Observe::Rollout(RolloutCheck::parse(rollout)?))
            }
            (None, None, Some(app)) => {
                Check::Observe(Observe::Application(ApplicationCheck::parse(app)?))
            }
            (None, None, None) => {
                return fail(
                    "field `spec` is missing: add a batch/v1 JobSpec, as in provider.job.spec \
                     (or observe what is deployed with `rollout` or `application`)",
                )
            }
            (spec, rollout, app) => {
                let set: Vec<&str> = [
                    ("spec", spec.is_some()),
                    ("rollout", rollout.is_some()),
                    ("application", app.is_some()),
                ]
                .into_iter()
                .filter_map(|(f, set)| set.then_some(f))
                .collect();
                return fail(format!(
                    "fields `{}` are mutually exclusive: a block verifies exactly one of `spec`, `rollout` \
                     and `application`; keep one",
                    set.join("` and `")
                ));
            }
        };
        if matches!(check, Check::Observe(_)) && (!labels.is_empty() || !annotations.is_empty()) {
            return fail(
                "field `metadata` labels and annotations the Job, and `rollout`/`application` create no Job: remove it",
            );
        }
        Ok(Self {
            target,
            require,
            namespace,
            active_deadline,
            log_tail,
            labels,
            annotations,
            check,
        })
    }

    /// The destination as written, for metadata and messages.
    pub fn target_display(&self) -> String {
        match &self.target {
            Target::Names(names) => names.join(","),
            Target::Stage => "stage".into(),
            Target::Selector(s) => format!("selector:{s}"),
        }
    }
}

fn job_spec(spec: Value) -> Result<Map<String, Value>, BlockError> {
    let spec = match spec {
        Value::Object(spec) => spec,
        other => {
            return fail(format!(
                "field `spec` must be a batch/v1 JobSpec object, got {}",
                json_kind(&other)
            ))
        }
    };
    match spec.get("template") {
        Some(Value::Object(_)) => Ok(spec),
        _ => {
            fail("field `spec.template` is missing: a JobSpec needs a pod template with containers")
        }
    }
}

fn parse_destination(d: &str) -> Result<Target, BlockError> {
    if d.contains("{{") {
        return fail(format!(
            "field `destination` still contains {d:?}: the arg was not resolved; pass `destination` from the \
             Stage's verification.args or give the AnalysisTemplate arg a value"
        ));
    }
    let names: Vec<String> = d
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    if names.is_empty() {
        return fail("field `destination` is empty: set it to a destination name, a comma-separated list or \"stage\" \
                    (an empty value usually means the Stage passed an empty verification arg)");
    }
    if let Some(bad) = names.iter().find(|n| n.chars().any(char::is_whitespace)) {
        return fail(format!(
            "field `destination` has a name with white space: {bad:?}"
        ));
    }
    if names.len() == 1 && names[0] == "stage" {
        return Ok(Target::Stage);
    }
    if names.iter().any(|n| n == "stage") {
        return fail("field `destination`: \"stage\" cannot be combined with other destinations");
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(dup) = names.iter().find(|n| !seen.insert(n.as_str())) {
        return fail(format!("field `destination` names {dup:?} twice"));
    }
    Ok(Target::Names(names))
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#""spec":{"backoffLimit":0,"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}"#;

    fn parse(fields: &str) -> Result<JobConfig, BlockError> {
        let sep = if fields.is_empty() { "" } else { "," };
        JobConfig::parse(format!("{{{fields}{sep}{SPEC}}}").as_bytes())
    }

    #[test]
    fn a_full_block_parses() {
        let c = parse(
            r#""destination":"a, b","require":"any","namespace":"verify","activeDeadline":"1h30m","logTail":5,
               "metadata":{"labels":{"team":"x"},"annotations":{"a":"b"}}"#,
        )
        .unwrap();
        assert_eq!(c.target, Target::Names(vec!["a".into(), "b".into()]));
        assert_eq!(c.require, Require::Any);
        assert_eq!(c.namespace.as_deref(), Some("verify"));
        assert_eq!(c.active_deadline, Some(Duration::from_secs(5400)));
        assert_eq!(c.log_tail, 5);
        assert_eq!(c.labels["team"], "x");
        assert_eq!(c.target_display(), "a,b");
    }

    #[test]
    fn defaults_apply() {
        let c = parse(r#""destination":"stage""#).unwrap();
        assert_eq!(c.target, Target::Stage);
        assert_eq!(c.require, Require::All);
        assert_eq!(c.log_tail, DEFAULT_LOG_TAIL);
        assert_eq!(c.namespace, None);
    }

    #[test]
    fn each_mistake_names_its_field() {
        for (fields, needle) in [
            (r#""destinaton":"a""#, "destinaton"),
            (r#""destination":"""#, "`destination` is empty"),
            (
                r#""destination":"{{args.destination}}""#,
                "`destination` still contains",
            ),
            (
                r#""destination":"a","destinationSelector":"x=y""#,
                "destinationSelector",
            ),
            (r#""destinationSelector":"env==""#, "destinationSelector"),
            (r#""destination":"a","require":"some""#, "`require`"),
            (
                r#""destination":"a","activeDeadline":"soon""#,
                "activeDeadline",
            ),
            (r#""destination":"a","logTail":100000"#, "logTail"),
            (r#""destination":"a","namespace":"Bad_NS""#, "namespace"),
            (r#""destination":"a,a""#, "twice"),
            (r#""destination":"stage,a""#, "stage"),
            ("", "`destination` is missing"),
        ] {
            let e = parse(fields).unwrap_err().0;
            assert!(e.contains(needle), "{fields}: {e}");
        }
        let e = JobConfig::parse(br#"{"destination":"a"}"#).unwrap_err().0;
        assert!(e.contains("`spec` is missing"), "{e}");
        let e = JobConfig::parse(br#"{"destination":"a","spec":{}}"#)
            .unwrap_err()
            .0;
        assert!(e.contains("spec.template"), "{e}");
        let e = JobConfig::parse(br#""x""#).unwrap_err().0;
        assert!(e.contains("got a string"), "{e}");
    }

    #[test]
    fn a_block_verifies_exactly_one_of_spec_rollout_and_application() {
        let c =
            JobConfig::parse(br#"{"destination":"a","rollout":{"name":"web","image":"r/web:2"}}"#)
                .unwrap();
        assert_eq!(c.observe().map(Observe::kind), Some("rollout"));
        assert!(c.job_spec().is_none());
        let c = JobConfig::parse(br#"{"destination":"a","application":{"name":"web"}}"#).unwrap();
        assert_eq!(
            c.observe().map(Observe::object).as_deref(),
            Some("argocd/web")
        );
        for (block, needle) in [
            (
                r#"{"destination":"a","rollout":{"name":"w"},"application":{"name":"w"}}"#,
                "`rollout` and `application` are mutually exclusive",
            ),
            (
                &format!(r#"{{"destination":"a","rollout":{{"name":"w"}},{SPEC}}}"#),
                "`spec` and `rollout`",
            ),
            (
                r#"{"destination":"a","rollout":{"name":"w"},"metadata":{"labels":{"a":"b"}}}"#,
                "`metadata`",
            ),
            (
                r#"{"destination":"a","application":{"name":"W"}}"#,
                "application.name",
            ),
        ] {
            let e = JobConfig::parse(block.as_bytes()).unwrap_err().0;
            assert!(e.contains(needle), "{block}: {e}");
        }
    }

    #[test]
    fn require_is_spelled_as_in_blocks() {
        assert_eq!(serde_json::to_string(&Require::Any).unwrap(), r#""any""#);
        assert_eq!(
            serde_json::from_str::<Require>(r#""all""#).unwrap(),
            Require::All
        );
        assert!(serde_json::from_str::<Require>(r#""some""#).is_err());
    }

    #[test]
    fn the_block_is_found_by_plugin_name() {
        let other = "other/plugin".to_string();
        let e = JobConfig::from_plugin_map("m", [(&other, &b"{}"[..])]).unwrap_err();
        assert!(
            e.to_string().contains(PLUGIN_NAME) && e.to_string().contains("other/plugin"),
            "{e}"
        );
    }
}
