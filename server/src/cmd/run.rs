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
use dispatch_api::block::{JobConfig, PLUGIN_NAME};
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

fn parse_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
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
) -> Result<Resolved, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read template {}: {e}", file.display()))?;
    resolve(&text, &file.display().to_string(), metric, overrides)
}

/// Resolves the metric of template `text` (YAML); `shown` names the file in messages.
pub fn resolve(
    text: &str,
    shown: &str,
    metric: Option<&str>,
    overrides: &[(String, String)],
) -> Result<Resolved, String> {
    let doc: Value =
        serde_saphyr::from_str(text).map_err(|e| format!("{shown} is not a YAML document: {e}"))?;
    if !doc.is_object() {
        return Err(format!(
            "{shown} is not an AnalysisTemplate: expected a YAML mapping with `spec.metrics`"
        ));
    }
    let kind = doc.get("kind").and_then(Value::as_str).unwrap_or("");
    if !kind.is_empty() && kind != "AnalysisTemplate" && kind != "ClusterAnalysisTemplate" {
        return Err(format!(
            "{shown} is a {kind}, not an AnalysisTemplate or ClusterAnalysisTemplate"
        ));
    }
    let spec = doc.get("spec").unwrap_or(&Value::Null);
    let metrics = spec
        .get("metrics")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or_else(|| format!("{shown} has no `spec.metrics`: is it an AnalysisTemplate?"))?;
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
                .ok_or_else(|| {
                    format!(
                        "metric {wanted:?} not found in {shown}; its metrics: {}",
                        names.join(", ")
                    )
                })?;
            let block = block_of(m).ok_or_else(|| {
                let provider = m
                    .get("provider")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().cloned().collect::<Vec<_>>().join(", "))
                    .unwrap_or_default();
                format!(
                    "metric {wanted:?} has no provider.plugin.{PLUGIN_NAME} block (provider: {}); \
                     only {PLUGIN_NAME} metrics can be run",
                    if provider.is_empty() {
                        "none".into()
                    } else {
                        provider
                    }
                )
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
                    return Err(format!(
                        "no metric of {shown} uses provider.plugin.{PLUGIN_NAME} (metrics: {})",
                        names.join(", ")
                    ))
                }
                1 => ours.into_iter().next().unwrap_or_default(),
                _ => {
                    return Err(format!(
                    "several metrics of {shown} use {PLUGIN_NAME}: {}; choose one with --metric",
                    ours.iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                }
            }
        }
    };

    let (values, secrets) = arg_values(spec, overrides)?;
    let json = serde_json::to_string(&block)
        .map_err(|e| format!("metric {metric:?}: cannot serialize the block: {e}"))?;
    let json = substitute(&json, &values).map_err(|e| format!("metric {metric:?}: {e}"))?;
    let config = JobConfig::parse(json.as_bytes())
        .map_err(|e| format!("invalid {PLUGIN_NAME} block in metric {metric:?}: {e}"))?;
    Ok(Resolved {
        metric,
        config,
        secrets,
    })
}

/// The value of every template arg: `spec.args` defaults, overridden by `--arg`. Errors name
/// an unknown `--arg` and every arg left without a value.
fn arg_values(
    spec: &Value,
    overrides: &[(String, String)],
) -> Result<(BTreeMap<String, String>, Vec<String>), String> {
    let mut declared: BTreeMap<String, (Option<String>, bool)> = BTreeMap::new();
    for a in spec
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(name) = a.get("name").and_then(Value::as_str) else {
            return Err("an entry of `spec.args` has no name".into());
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
                return Err(format!(
                    "--arg {name}: the template has no arg {name:?} (its args: {})",
                    if declared.is_empty() {
                        "none".to_string()
                    } else {
                        declared.keys().cloned().collect::<Vec<_>>().join(", ")
                    }
                ))
            }
        }
    }
    let missing: Vec<&str> = declared
        .iter()
        .filter(|(_, (v, _))| v.is_none())
        .map(|(n, _)| n.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "arg{} without a value: {}; give {} (valueFrom is not resolved by `run`)",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            missing
                .iter()
                .map(|n| format!("--arg {n}=VALUE"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
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
    Ok((values, secrets))
}

/// Replaces `{{args.NAME}}` and `{{ args.NAME }}` in `json` (a serialized block, so every
/// placeholder sits inside a JSON string) with the JSON-escaped value.
pub fn substitute(json: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
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
                let value = values.get(name).ok_or_else(|| {
                    format!("{{{{args.{name}}}}} is used but the template declares no arg {name:?} in spec.args")
                })?;
                let quoted = serde_json::to_string(value).map_err(|e| e.to_string())?;
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

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("rollouts-dispatch run: {msg}");
    ExitCode::from(2)
}

/// Runs `rollouts-dispatch run`; returns the exit code.
pub async fn run(args: RunArgs) -> ExitCode {
    let resolved = match resolve_file(&args.file, args.metric.as_deref(), &args.args) {
        Ok(r) => r,
        Err(e) => return usage_error(&e),
    };
    let config = match args.config.load() {
        Ok(c) => c,
        Err(e) => return usage_error(&e.to_string()),
    };
    let engine = match Engine::start(config).await {
        Ok(e) => e,
        Err(e) => return usage_error(&e.to_string()),
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
        Err(e) => return usage_error(&redactor.redact(&e.to_string())),
    };
    let job = ensured.job;
    for ((dest, outcome), p) in ensured.outcomes.iter().zip(&job.placements) {
        let what = match outcome {
            Outcome::Created => "created".to_string(),
            Outcome::Adopted => "adopted (already there)".to_string(),
            Outcome::NotCreated(s) => format!("not created: {}", redactor.redact(&s.summary())),
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
        let ann = &r.config.spec["template"]["metadata"]["annotations"]["code"];
        assert_eq!(ann, "3");
    }

    #[test]
    fn errors_name_the_problem() {
        let e = resolve(TEMPLATE, "t.yaml", None, &[]).unwrap_err();
        assert!(e.contains("destination"), "{e}");
        let e = resolve(
            TEMPLATE,
            "t.yaml",
            Some("nope"),
            &over(&[("destination", "a")]),
        )
        .unwrap_err();
        assert!(e.contains("web, check"), "{e}");
        let e = resolve(
            TEMPLATE,
            "t.yaml",
            Some("web"),
            &over(&[("destination", "a")]),
        )
        .unwrap_err();
        assert!(e.contains("no provider.plugin"), "{e}");
        let e = resolve(TEMPLATE, "t.yaml", None, &over(&[("nope", "a")])).unwrap_err();
        assert!(e.contains("no arg \"nope\""), "{e}");
        let e = resolve("a: [", "t.yaml", None, &[]).unwrap_err();
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
