//! `rollouts-dispatch run`: the developer loop without Argo. Reads an AnalysisTemplate, fills in
//! its args, creates the metric's Job through the dispatch engine with a synthetic AnalysisRun,
//! follows it and prints the verdict.
//!
//! Exit codes: 0 Successful, 1 Failed / Inconclusive / Error / timed out, 2 usage or
//! configuration errors (nothing was created).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Args;
use dispatch_api::block::{BlockError, JobConfig, PLUGIN_NAME};
use serde_json::Value;

use crate::engine::{Engine, MeasureRequest, Outcome};
use crate::job::RunContext;
use crate::logs::Redactor;
use crate::verdict::{Phase, Verdict};

use super::{parse_duration, ConfigArgs};

/// `rollouts-dispatch run`
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The AnalysisTemplate or ClusterAnalysisTemplate YAML file.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// A template argument, `NAME=VALUE`; overrides the template's default. Repeatable.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = parse_arg)]
    pub args: Vec<(String, String)>,
    /// The metric to evaluate; needed when the template has several rollouts-dispatch/job metrics.
    #[arg(long)]
    pub metric: Option<String>,
    /// `--config`
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Namespace of the synthetic AnalysisRun (the Kargo project the policy checks).
    #[arg(long, default_value = "default")]
    pub namespace_of_run: String,
    /// Give up (and delete the Jobs) after this long (Go duration).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// An `--arg` that is not `NAME=VALUE` (clap prints it after the flag).
#[derive(Debug, thiserror::Error)]
#[error("expected NAME=VALUE, got {0:?}")]
struct ArgSyntaxError(String);

fn parse_arg(s: &str) -> Result<(String, String), ArgSyntaxError> {
    match s.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        _ => Err(ArgSyntaxError(s.to_string())),
    }
}

/// Why a template's metric cannot be run: a usage error, the message says what to change.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The template file cannot be read.
    #[error("cannot read template {file}: {source}")]
    Read {
        /// the file
        file: String,
        /// the I/O error
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("{file} is not a YAML document: {source}")]
    NotYaml {
        /// the file
        file: String,
        /// the YAML error (boxed: it is large, and this path is rare)
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// The YAML is not a mapping.
    #[error("{file} is not an AnalysisTemplate: expected a YAML mapping with `spec.metrics`")]
    NotAMapping {
        /// the file
        file: String,
    },
    /// The YAML is another kind of object.
    #[error("{file} is a {kind}, not an AnalysisTemplate or ClusterAnalysisTemplate")]
    WrongKind {
        /// the file
        file: String,
        /// its `kind`
        kind: String,
    },
    /// The template has no metrics.
    #[error("{file} has no `spec.metrics`: is it an AnalysisTemplate?")]
    NoMetrics {
        /// the file
        file: String,
    },
    /// `--metric` names no metric of the template.
    #[error("metric {metric:?} not found in {file}; its metrics: {}", .metrics.join(", "))]
    UnknownMetric {
        /// the `--metric`
        metric: String,
        /// the file
        file: String,
        /// the template's metrics
        metrics: Vec<String>,
    },
    /// `--metric` names a metric of another provider.
    #[error(
        "metric {metric:?} has no provider.plugin.{PLUGIN_NAME} block (provider: {}); only \
         {PLUGIN_NAME} metrics can be run",
        list_or_none(.providers)
    )]
    NotOurs {
        /// the `--metric`
        metric: String,
        /// the keys of its `provider`
        providers: Vec<String>,
    },
    /// No metric of the template uses this plugin.
    #[error(
        "no metric of {file} uses provider.plugin.{PLUGIN_NAME} (metrics: {})",
        .metrics.join(", ")
    )]
    NoneOurs {
        /// the file
        file: String,
        /// the template's metrics
        metrics: Vec<String>,
    },
    /// Several metrics use this plugin, and no `--metric` chooses one.
    #[error(
        "several metrics of {file} use {PLUGIN_NAME}: {}; choose one with --metric",
        .metrics.join(", ")
    )]
    SeveralOurs {
        /// the file
        file: String,
        /// the metrics that use this plugin
        metrics: Vec<String>,
    },
    /// An entry of `spec.args` has no name.
    #[error("an entry of `spec.args` has no name")]
    UnnamedArg,
    /// An `--arg` the template does not declare.
    #[error("--arg {name}: the template has no arg {name:?} (its args: {})", list_or_none(.declared))]
    UnknownArg {
        /// the `--arg` name
        name: String,
        /// the args the template declares
        declared: Vec<String>,
    },
    /// Args without a default and without an `--arg`.
    #[error(
        "arg{} without a value: {}; give {} (valueFrom is not resolved by `run`)",
        if .missing.len() == 1 { "" } else { "s" },
        .missing.join(", "),
        .missing.iter().map(|n| format!("--arg {n}=VALUE")).collect::<Vec<_>>().join(" ")
    )]
    MissingValues {
        /// the args
        missing: Vec<String>,
    },
    /// The plugin block cannot be serialized for substitution.
    #[error("metric {metric:?}: cannot serialize the block: {source}")]
    Serialize {
        /// the metric
        metric: String,
        /// the JSON error
        #[source]
        source: serde_json::Error,
    },
    /// A placeholder of the block cannot be substituted.
    #[error("metric {metric:?}: {source}")]
    Substitute {
        /// the metric
        metric: String,
        /// what is wrong with the placeholder
        #[source]
        source: SubstituteError,
    },
    /// The block, args substituted, is not a valid plugin block.
    #[error("invalid {PLUGIN_NAME} block in metric {metric:?}: {source}")]
    InvalidBlock {
        /// the metric
        metric: String,
        /// what the block parser rejects
        #[source]
        source: BlockError,
    },
}

/// `items` joined with `, `, or `none`.
fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(", ")
    }
}

/// Why `{{args.NAME}}` placeholders cannot be substituted.
#[derive(Debug, thiserror::Error)]
pub enum SubstituteError {
    /// A placeholder names an arg the template does not declare.
    #[error("{{{{args.{name}}}}} is used but the template declares no arg {name:?} in spec.args")]
    UndeclaredArg {
        /// the arg
        name: String,
    },
    /// The value cannot be escaped as JSON.
    #[error(transparent)]
    Escape(#[from] serde_json::Error),
}

/// The metric chosen from a template, its args filled in.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// the metric name
    pub metric: String,
    /// the validated plugin block
    pub config: JobConfig,
    /// values of args that come from Secrets in the template (redacted from output)
    pub secrets: Vec<String>,
}

/// Reads `file` and resolves the metric: a message for the user when it cannot.
pub fn resolve_file(
    file: &Path,
    metric: Option<&str>,
    overrides: &[(String, String)],
) -> Result<Resolved, ResolveError> {
    let text = std::fs::read_to_string(file).map_err(|source| ResolveError::Read {
        file: file.display().to_string(),
        source,
    })?;
    resolve(&text, &file.display().to_string(), metric, overrides)
}

/// Resolves the metric of template `text` (YAML); `shown` names the file in messages.
pub fn resolve(
    text: &str,
    shown: &str,
    metric: Option<&str>,
    overrides: &[(String, String)],
) -> Result<Resolved, ResolveError> {
    let file = || shown.to_string();
    let doc: Value = serde_saphyr::from_str(text).map_err(|source| ResolveError::NotYaml {
        file: file(),
        source: Box::new(source),
    })?;
    if !doc.is_object() {
        return Err(ResolveError::NotAMapping { file: file() });
    }
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != "AnalysisTemplate" && kind != "ClusterAnalysisTemplate" {
        return Err(ResolveError::WrongKind {
            file: file(),
            kind: kind.to_string(),
        });
    }
    let spec = doc.get("spec").unwrap_or(&Value::Null);
    let metrics = spec
        .get("metrics")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| ResolveError::NoMetrics { file: file() })?;
    let name_of = |m: &Value| {
        m.get("name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    let block_of = |m: &Value| {
        m.get("provider")
            .and_then(|p| p.get("plugin"))
            .and_then(|p| p.get(PLUGIN_NAME))
            .cloned()
    };
    let names: Vec<String> = metrics.iter().map(name_of).collect();
    let (metric, block) = match metric {
        Some(wanted) => {
            let m = metrics
                .iter()
                .find(|m| name_of(m) == wanted)
                .ok_or_else(|| ResolveError::UnknownMetric {
                    metric: wanted.to_string(),
                    file: file(),
                    metrics: names.clone(),
                })?;
            let block = block_of(m).ok_or_else(|| ResolveError::NotOurs {
                metric: wanted.to_string(),
                providers: m
                    .get("provider")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect())
                    .unwrap_or_default(),
            })?;
            (wanted.to_string(), block)
        }
        None => {
            let ours: Vec<(String, Value)> = metrics
                .iter()
                .filter_map(|m| block_of(m).map(|b| (name_of(m), b)))
                .collect();
            match ours.len() {
                0 => {
                    return Err(ResolveError::NoneOurs {
                        file: file(),
                        metrics: names,
                    })
                }
                1 => ours.into_iter().next().unwrap_or_default(),
                _ => {
                    return Err(ResolveError::SeveralOurs {
                        file: file(),
                        metrics: ours.into_iter().map(|(n, _)| n).collect(),
                    })
                }
            }
        }
    };

    let ArgValues { values, secrets } = arg_values(spec, overrides)?;
    let json = serde_json::to_string(&block).map_err(|source| ResolveError::Serialize {
        metric: metric.clone(),
        source,
    })?;
    let json = substitute(&json, &values).map_err(|source| ResolveError::Substitute {
        metric: metric.clone(),
        source,
    })?;
    let config =
        JobConfig::parse(json.as_bytes()).map_err(|source| ResolveError::InvalidBlock {
            metric: metric.clone(),
            source,
        })?;
    Ok(Resolved {
        metric,
        config,
        secrets,
    })
}

/// The template's args, resolved.
struct ArgValues {
    /// every arg's value, by name
    values: BTreeMap<String, String>,
    /// the values of args that come from Secrets (redacted from output)
    secrets: Vec<String>,
}

/// The value of every template arg: `spec.args` defaults, overridden by `--arg`. Errors name
/// an unknown `--arg` and every arg left without a value.
fn arg_values(spec: &Value, overrides: &[(String, String)]) -> Result<ArgValues, ResolveError> {
    let mut declared: BTreeMap<String, (Option<String>, bool)> = BTreeMap::new();
    for a in spec
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = a.get("name").and_then(Value::as_str) else {
            return Err(ResolveError::UnnamedArg);
        };
        let value = a.get("value").and_then(|v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        });
        let secret = a
            .get("valueFrom")
            .and_then(|v| v.get("secretKeyRef"))
            .is_some();
        declared.insert(name.to_string(), (value, secret));
    }
    for (name, value) in overrides {
        match declared.get_mut(name) {
            Some(slot) => slot.0 = Some(value.clone()),
            None => {
                return Err(ResolveError::UnknownArg {
                    name: name.clone(),
                    declared: declared.keys().cloned().collect(),
                })
            }
        }
    }
    let missing: Vec<String> = declared
        .iter()
        .filter(|(_, (v, _))| v.is_none())
        .map(|(n, _)| n.clone())
        .collect();
    if !missing.is_empty() {
        return Err(ResolveError::MissingValues { missing });
    }
    let secrets = declared
        .values()
        .filter(|(_, s)| *s)
        .filter_map(|(v, _)| v.clone())
        .collect();
    let values = declared
        .into_iter()
        .filter_map(|(n, (v, _))| v.map(|v| (n, v)))
        .collect();
    Ok(ArgValues { values, secrets })
}

/// Replaces `{{args.NAME}}` and `{{ args.NAME }}` in `json` (a serialized block, so every
/// placeholder sits inside a JSON string) with the JSON-escaped value.
pub fn substitute(
    json: &str,
    values: &BTreeMap<String, String>,
) -> Result<String, SubstituteError> {
    let mut out = String::with_capacity(json.len());
    let mut rest = json;
    while let Some(start) = rest.find("{{") {
        let Some(len) = rest[start..].find("}}") else {
            break;
        };
        let inner = rest[start + 2..start + len].trim();
        out.push_str(&rest[..start]);
        match inner.strip_prefix("args.") {
            Some(name) => {
                let value = values
                    .get(name)
                    .ok_or_else(|| SubstituteError::UndeclaredArg {
                        name: name.to_string(),
                    })?;
                let quoted = serde_json::to_string(value)?;
                out.push_str(&quoted[1..quoted.len() - 1]);
            }
            None => out.push_str(&rest[start..start + len + 2]),
        }
        rest = &rest[start + len + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// A UUID-shaped, random-looking run UID (no RNG dependency: std's randomly keyed hasher).
fn random_uid() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u32(std::process::id());
        h.write_usize(i);
        *w = h.finish();
    }
    let [a, b] = words;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0xfff,
        b & 0xffff_ffff_ffff
    )
}

fn usage_error(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("rollouts-dispatch run: {msg}");
    ExitCode::from(2)
}

/// Runs `rollouts-dispatch run`; returns the exit code.
pub async fn run(args: RunArgs) -> ExitCode {
    let resolved = match resolve_file(&args.file, args.metric.as_deref(), &args.args) {
        Ok(r) => r,
        Err(e) => return usage_error(e),
    };
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return usage_error(e),
    };
    let engine = match Engine::start(config).await {
        Ok(e) => e,
        Err(e) => return usage_error(e),
    };
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let run = RunContext {
        name: format!("rollouts-dispatch-run-{unix}"),
        namespace: args.namespace_of_run.clone(),
        uid: random_uid(),
        ..RunContext::default()
    };
    let redactor = Redactor::new(resolved.secrets.iter().cloned());
    let req = MeasureRequest {
        run: run.clone(),
        metric: resolved.metric.clone(),
        measurement: 1,
        config: resolved.config,
        secrets: resolved.secrets,
    };
    println!(
        "run {}/{} (uid {}), metric {:?}, destination {}",
        run.namespace,
        run.name,
        run.uid,
        req.metric,
        req.config.target_display()
    );
    let ensured = match engine.ensure(&req).await {
        Ok(e) => e,
        Err(e) => return usage_error(redactor.redact(&e.to_string())),
    };
    let job = ensured.job;
    for ((dest, outcome), p) in ensured.outcomes.iter().zip(&job.placements) {
        let what = match outcome {
            Outcome::Created => "created".to_string(),
            Outcome::Adopted => "adopted (already there)".to_string(),
            Outcome::NotCreated(s) => format!("not created: {}", redactor.redact(&s.summary())),
            Outcome::Observed(object) => {
                println!("{dest}: observing {object} (nothing is created)");
                continue;
            }
        };
        println!("{dest}: job {}/{} {what}", p.namespace, job.name);
    }

    let started = Instant::now();
    let deadline = started + args.timeout;
    let mut shown: BTreeMap<String, String> = BTreeMap::new();
    let mut verdict = ensured.verdict;
    let interrupted = loop {
        print_changes(&verdict, &mut shown, started, &redactor);
        if verdict.phase.is_terminal() && !verdict.retryable {
            break None;
        }
        if Instant::now() >= deadline {
            break Some(format!("timed out after {:?}", args.timeout));
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = tokio::signal::ctrl_c() => break Some("interrupted".to_string()),
        }
        verdict = engine.status(&job, &redactor).await;
    };

    if let Some(why) = interrupted {
        println!("{why}: deleting the Jobs");
        let report = engine.terminate(&job).await;
        for (dest, e) in &report.failed {
            println!(
                "{dest}: could not delete job {}: {}",
                job.name,
                redactor.redact(e)
            );
        }
        println!("verdict: {} ({why})", Phase::Error);
        println!("{}", verdict.message);
        return ExitCode::from(1);
    }
    println!("verdict: {}", verdict.phase);
    println!("{}", verdict.message);
    if verdict.phase == Phase::Successful {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Prints one line per destination whose state changed since the last call.
fn print_changes(
    verdict: &Verdict,
    shown: &mut BTreeMap<String, String>,
    started: Instant,
    redactor: &Redactor,
) {
    for d in &verdict.destinations {
        let line = redactor.redact(&d.state.summary());
        if shown.get(&d.destination) != Some(&line) {
            println!(
                "[{:>4}s] {}: {line}",
                started.elapsed().as_secs(),
                d.destination
            );
            shown.insert(d.destination.clone(), line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEMPLATE: &str = r#"
apiVersion: argoproj.io/v1alpha1
kind: AnalysisTemplate
metadata: {name: t}
spec:
  args:
  - name: destination
  - name: code
    value: "3"
  metrics:
  - name: web
    provider:
      web: {url: "http://x"}
  - name: check
    provider:
      plugin:
        rollouts-dispatch/job:
          destination: "{{args.destination}}"
          spec:
            template:
              metadata:
                annotations: {code: "{{ args.code }}"}
              spec:
                containers: [{name: c, image: i}]
"#;

    fn over(kv: &[(&str, &str)]) -> Vec<(String, String)> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn resolves_args_with_and_without_spaces() {
        let r = resolve(TEMPLATE, "t.yaml", None, &over(&[("destination", "a")])).unwrap();
        assert_eq!(r.metric, "check");
        assert_eq!(r.config.target_display(), "a");
        let ann = &r.config.job_spec().unwrap()["template"]["metadata"]["annotations"]["code"];
        assert_eq!(ann, "3");
    }

    #[test]
    fn the_observe_examples_resolve_to_rollout_and_application_checks() {
        use dispatch_api::observe::Observe;
        let rollout = include_str!("../../../config/analysis-templates/rollout.yaml");
        let args = over(&[("destination", "a"), ("image", "ghcr.io/example/web:1.2.3")]);
        let r = resolve(rollout, "rollout.yaml", None, &args).unwrap();
        let Some(Observe::Rollout(check)) = r.config.observe() else {
            panic!("{:?}", r.config.check)
        };
        assert_eq!(check.image.as_deref(), Some("ghcr.io/example/web:1.2.3"));
        let app = include_str!("../../../config/analysis-templates/application.yaml");
        let args = over(&[("destination", "a"), ("revision", "4f2b9c1")]);
        let r = resolve(app, "application.yaml", None, &args).unwrap();
        assert!(
            matches!(r.config.observe(), Some(Observe::Application(a)) if a.revision.as_deref() == Some("4f2b9c1")),
            "{:?}",
            r.config.check
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let err = |text: &str, metric: Option<&str>, overrides: &[(String, String)]| {
            resolve(text, "t.yaml", metric, overrides)
                .unwrap_err()
                .to_string()
        };
        let e = err(TEMPLATE, None, &[]);
        assert!(e.contains("destination"), "{e}");
        let e = err(TEMPLATE, Some("nope"), &over(&[("destination", "a")]));
        assert!(e.contains("web, check"), "{e}");
        let e = err(TEMPLATE, Some("web"), &over(&[("destination", "a")]));
        assert!(e.contains("no provider.plugin"), "{e}");
        let e = err(TEMPLATE, None, &over(&[("nope", "a")]));
        assert!(e.contains("no arg \"nope\""), "{e}");
        let e = err("a: [", None, &[]);
        assert!(e.contains("not a YAML"), "{e}");
    }

    #[test]
    fn substitution_escapes_json() {
        let values = BTreeMap::from([("x".to_string(), "a\"b".to_string())]);
        assert_eq!(
            substitute(r#"{"k":"{{args.x}}-{{ args.x }}"}"#, &values).unwrap(),
            r#"{"k":"a\"b-a\"b"}"#
        );
        assert!(substitute("{{args.y}}", &values).is_err());
        assert_eq!(substitute("{{metric.x}}", &values).unwrap(), "{{metric.x}}");
    }

    #[test]
    fn uids_differ() {
        assert_ne!(random_uid(), random_uid());
        assert_eq!(random_uid().len(), 36);
    }
}
