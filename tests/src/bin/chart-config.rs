//! `chart-config`: every documented server configuration installed through the Helm chart
//! (charts/chart-check.sh, `make chart`).
//!
//! `examples OUTDIR FILE...` finds the server configurations the files document: a `.yaml` file
//! whole (config/server.yaml), and each ```` ```yaml ```` block of a Markdown file whose top-level
//! keys are all top-level keys of the server configuration (`reference()`, docs/configuration.md).
//! Each becomes chart values in `OUTDIR/<name>-values.yaml`: `config:` the example as written, a
//! policy rule when it has none (the chart refuses to render without one), a signing key and no
//! TokenReview users (so that the example's own `policy.callers` need not bind the default one).
//! It prints one line `NAME NAMESPACE VALUES-FILE` per example: the namespace to install it in is
//! its `agents.namespace`, else `rollouts-dispatch`.
//!
//! `schema VALUES-SCHEMA` checks that the `config` property of the chart's values.schema.json is
//! `config_schema()`, generated from the config types (`make docs` writes it).
//!
//! `agent-rbac RENDERING SYNC-RENDERING VALUES-YAML` checks that values.yaml's text on the agent's
//! grants (`granting exactly: …`) says what the agent's Role or ClusterRole of RENDERING grants,
//! then what SYNC-RENDERING (with `agent.argocd.sync`) grants on top.
//!
//! `check VARIANT=RENDERING[=VALUES]...` reads the `server.yaml` of each rendering's ConfigMap and
//! parses it as `serve` does at start (`ServerConfig::parse`); with the values file, every key of
//! its `config` must be in the rendered file with the same value (the chart adds keys, never drops
//! or changes one).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, ensure, Context, Result};
use dispatch_server::config::{config_schema, reference, ServerConfig};
use serde_json::{json, Value};

const USAGE: &str = "usage: chart-config examples OUTDIR FILE... | chart-config schema \
                     VALUES-SCHEMA | chart-config agent-rbac RENDERING SYNC-RENDERING VALUES-YAML \
                     | chart-config check VARIANT=RENDERING[=VALUES]...";

/// The release namespace of `make chart`.
const NAMESPACE: &str = "rollouts-dispatch";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chart-config: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.split_first() {
        Some((mode, [out, files @ ..])) if mode == "examples" && !files.is_empty() => {
            examples(Path::new(out), files)
        }
        Some((mode, [file])) if mode == "schema" => schema(file),
        Some((mode, [base, sync, values])) if mode == "agent-rbac" => {
            agent_rbac(base, sync, values)
        }
        Some((mode, renderings)) if mode == "check" && !renderings.is_empty() => {
            renderings.iter().try_for_each(|r| check(r))
        }
        _ => bail!("{USAGE}"),
    }
}

fn schema(file: &str) -> Result<()> {
    let have: Value = serde_json::from_str(
        &std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?,
    )
    .with_context(|| format!("parsing {file}"))?;
    ensure!(
        have["properties"]["config"] == config_schema(),
        "the `config` schema of {file} is out of date: run `make docs` to regenerate it from \
         server/src/config/reference.rs"
    );
    println!(
        "chart: values.schema.json config schema up to date ({} documented keys)",
        reference().len()
    );
    Ok(())
}

/// The rules of the agent's Role or ClusterRole in `rendering`.
fn agent_rules(rendering: &str) -> Result<Vec<Value>> {
    let text =
        std::fs::read_to_string(rendering).with_context(|| format!("reading {rendering}"))?;
    let docs: Vec<Option<Value>> = serde_saphyr::from_multiple(&text)?;
    docs.into_iter()
        .flatten()
        .find(|d| {
            (d["kind"] == "Role" || d["kind"] == "ClusterRole")
                && d.pointer("/metadata/labels/app.kubernetes.io~1component")
                    == Some(&json!("agent"))
        })
        .and_then(|d| d["rules"].as_array().cloned())
        .with_context(|| format!("no Role or ClusterRole of the agent in {rendering}"))
}

/// `jobs (batch) create, get`: the resources of a rule, its group, its verbs.
fn describe(rule: &Value) -> String {
    let list = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect()
    };
    let group = list(&rule["apiGroups"]).join(", ");
    let group = if group.is_empty() {
        String::new()
    } else {
        format!(" ({group})")
    };
    format!(
        "{}{group} {}",
        list(&rule["resources"]).join(" and "),
        list(&rule["verbs"]).join(", ")
    )
}

fn agent_rbac(base: &str, sync: &str, values: &str) -> Result<()> {
    let base = agent_rules(base)?;
    let extra: Vec<Value> = agent_rules(sync)?
        .into_iter()
        .filter(|r| !base.contains(r))
        .collect();
    ensure!(
        !extra.is_empty(),
        "{sync} grants the agent nothing more than the first rendering"
    );
    let describe_all = |rules: &[Value]| rules.iter().map(describe).collect::<Vec<_>>().join("; ");
    let want = format!(
        "granting exactly: {}; with `agent.argocd.sync`, {}.",
        describe_all(&base),
        describe_all(&extra)
    );
    // The comments of values.yaml as one line of text.
    let text = std::fs::read_to_string(values).with_context(|| format!("reading {values}"))?;
    let comments: Vec<&str> = text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(|l| l.trim_start_matches('-').trim())
        .collect();
    ensure!(
        comments.join(" ").contains(&want),
        "{values} does not describe the agent's RBAC as templates/agent-rbac.yaml renders it; want: {want}"
    );
    println!(
        "chart: values.yaml describes the agent's {} grants as rendered",
        base.len() + extra.len()
    );
    Ok(())
}

/// The top-level keys of the server configuration.
fn top_level_keys() -> BTreeSet<String> {
    reference()
        .into_iter()
        .filter(|d| d.section().is_empty())
        .map(|d| d.key)
        .collect()
}

/// The ```` ```yaml ```` blocks of Markdown `text`: (line of the fence, body without the fence's
/// indentation).
fn yaml_blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if trimmed.starts_with("```yaml") || trimmed.starts_with("```yml") {
                    open = Some((i + 1, indent, String::new()));
                }
            }
            Some((_, _, _)) if trimmed.trim_end() == "```" => {
                let (at, _, body) = open.take().unwrap();
                out.push((at, body));
            }
            Some((_, ind, body)) => {
                body.push_str(line.get(*ind..).unwrap_or(trimmed));
                body.push('\n');
            }
        }
    }
    out
}

/// `docs/install.md` line 12 → `docs-install-md-12`.
fn example_name(file: &str, line: Option<usize>) -> String {
    let mut name: String = file
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if let Some(line) = line {
        name.push_str(&format!("-{line}"));
    }
    name
}

fn examples(out: &Path, files: &[String]) -> Result<()> {
    let keys = top_level_keys();
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let is_config = |v: &Value| {
        v.as_object()
            .is_some_and(|m| !m.is_empty() && m.keys().all(|k| keys.contains(k)))
    };
    for file in files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
        let found: Vec<(Option<usize>, Value)> =
            if file.ends_with(".md") || file.ends_with(".gotmpl") {
                yaml_blocks(&text)
                    .into_iter()
                    .filter_map(|(line, body)| {
                        let v = serde_saphyr::from_str::<Value>(&body).ok()?;
                        is_config(&v).then_some((Some(line), v))
                    })
                    .collect()
            } else {
                let v: Value =
                    serde_saphyr::from_str(&text).with_context(|| format!("parsing {file}"))?;
                ensure!(is_config(&v), "{file} is not a server configuration");
                vec![(None, v)]
            };
        for (line, config) in found {
            let name = example_name(file, line);
            let namespace = config
                .pointer("/agents/namespace")
                .and_then(Value::as_str)
                .unwrap_or(NAMESPACE)
                .to_owned();
            let path = out.join(format!("{name}-values.yaml"));
            std::fs::write(&path, values_for(config).to_string())
                .with_context(|| format!("writing {}", path.display()))?;
            println!("{name} {namespace} {}", path.display());
        }
    }
    Ok(())
}

/// Chart values installing `config` (JSON, which is YAML).
fn values_for(mut config: Value) -> Value {
    if config.get("policy").is_none() {
        config["policy"] = json!({"rules": [
            {"projects": ["team-a"], "destinations": ["in-cluster"], "namespaces": ["verification"]}
        ]});
    }
    json!({
        "config": config,
        "server": {"tokenReviewAllow": []},
        "signingKey": {"value": "make-chart-documented-examples-only-0123456789abcdef"},
    })
}

fn check(arg: &str) -> Result<()> {
    let mut parts = arg.splitn(3, '=');
    let (Some(variant), Some(rendering)) = (parts.next(), parts.next()) else {
        bail!("{arg:?}: {USAGE}");
    };
    let values = parts.next().map(PathBuf::from);
    let text =
        std::fs::read_to_string(rendering).with_context(|| format!("reading {rendering}"))?;
    let docs: Vec<Option<Value>> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("parsing {rendering}"))?;
    let server_yaml: Vec<&str> = docs
        .iter()
        .flatten()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| d.pointer("/data/server.yaml").and_then(Value::as_str))
        .collect();
    let [server_yaml] = server_yaml[..] else {
        bail!(
            "{variant}: {} ConfigMaps with a server.yaml in {rendering}, want 1",
            server_yaml.len()
        );
    };
    ServerConfig::parse(
        server_yaml,
        &format!("server.yaml of {variant} ({rendering})"),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut kept = 0;
    if let Some(values) = values {
        let values: Value = serde_saphyr::from_str(
            &std::fs::read_to_string(&values)
                .with_context(|| format!("reading {}", values.display()))?,
        )?;
        let rendered: Value = serde_saphyr::from_str(server_yaml)?;
        for (key, want) in values["config"].as_object().into_iter().flatten() {
            ensure!(
                contains(&rendered[key], want),
                "{variant}: config.{key} is {want} in the values, but {} in the rendered server.yaml",
                rendered[key]
            );
            kept += 1;
        }
    }
    println!("chart: config {variant}: server.yaml accepted by ServerConfig::parse ({kept} keys of the example kept as written)");
    Ok(())
}

/// Whether `have` holds `want`: the same scalars and lists, and every key of `want`'s maps.
fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| h.get(k).is_some_and(|hv| contains(hv, v))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(a, b)| contains(a, b))
        }
        (Value::Number(h), Value::Number(w)) => h.as_f64() == w.as_f64(),
        _ => have == want,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_found_with_their_line_and_indentation() {
        let md =
            "# t\n```yaml\na: 1\n```\n- item\n  ```yaml\n  b:\n    c: 2\n  ```\n```sh\nx\n```\n";
        assert_eq!(
            yaml_blocks(md),
            vec![(2, "a: 1\n".to_string()), (6, "b:\n  c: 2\n".to_string())]
        );
    }

    #[test]
    fn contains_allows_added_keys_only() {
        let have = json!({"agents": {"store": "kubernetes", "namespace": "n", "destinations": [{"name": "e"}]}});
        assert!(contains(
            &have,
            &json!({"agents": {"destinations": [{"name": "e"}]}})
        ));
        assert!(!contains(&have, &json!({"agents": {"store": "memory"}})));
        assert!(!contains(&have, &json!({"agents": {"destinations": []}})));
        assert!(contains(&json!(1e6), &json!(1_000_000)));
    }

    #[test]
    fn examples_without_a_policy_get_one() {
        let v = values_for(json!({"engine": {"cacheWait": "2s"}}));
        assert!(v["config"]["policy"]["rules"][0]["namespaces"].is_array());
        let v = values_for(json!({"policy": {"allowAll": true}}));
        assert_eq!(v["config"]["policy"], json!({"allowAll": true}));
    }
}
