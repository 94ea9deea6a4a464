//! A YAML block (or file) validated as what it is: Kubernetes objects (core, batch, apps, RBAC
//! and CRDs through k8s-openapi with unknown fields refused; Argo and Kargo kinds by their key
//! fields), a plugin registration (its args through the plugin's own parser), a server config
//! (`ServerConfig::parse`), chart values (`values.schema.json`, and the `config:` value as a
//! server config), a plugin block (`JobConfig::parse`). Inside any of them, a
//! `rollouts-dispatch/job` block and a `metricProviderPlugins` list are checked too.
//!
//! A block that is deliberately partial says so: the info string ```` ```yaml fragment ```` or
//! a first line `# docs-check: fragment`; it must still parse, and its nested blocks validate.

use k8s_openapi::serde::de::DeserializeOwned;
use k8s_openapi::serde::Serialize;
use serde_json::Value;

use super::known::Known;

/// The marker of a deliberately partial block.
pub(crate) const FRAGMENT_MARKER: &str = "# docs-check: fragment";

/// What a block was validated as, and what is wrong with it.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    /// `server config`, `chart values`, `Kubernetes objects`, `fragment`, …
    pub(crate) kind: String,
    /// one message per problem
    pub(crate) errors: Vec<String>,
}

/// Validates `text`; `fragment`: marked partial; `chart_doc`: in the chart's docs, where the
/// keys both the chart and the server config have are chart values.
pub(crate) fn validate(text: &str, fragment: bool, chart_doc: bool, known: &Known) -> Outcome {
    let fragment = fragment || text.trim_start().starts_with(FRAGMENT_MARKER);
    let mut out = Outcome::default();
    let mut kinds = Vec::new();
    for doc in documents(text) {
        let value: Value = match serde_saphyr::from_str(&doc) {
            Ok(v) => v,
            Err(e) => {
                out.errors
                    .push(format!("not YAML: {}", one_line(&e.to_string())));
                continue;
            }
        };
        if value.is_null() {
            continue;
        }
        let mut found = Nested::default();
        nested(&value, &mut found, &mut out.errors);
        let kind = if fragment {
            "fragment"
        } else {
            classify(
                &value,
                &doc,
                found.registration,
                chart_doc,
                known,
                &mut out.errors,
            )
        };
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    out.kind = kinds.join(" + ");
    out
}

/// The documents of a YAML stream (`---` lines).
fn documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line.trim_end() == "---" {
            docs.push(String::new());
        } else if let Some(d) = docs.last_mut() {
            d.push_str(line);
            d.push('\n');
        }
    }
    docs
}

/// `s` on one line, at most 300 characters (a schema error quotes the whole value).
fn one_line(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(300) {
        Some((i, _)) => format!("{}…", &line[..i]),
        None => line,
    }
}

/// What kind of document `value` is, with its problems added to `errors`.
fn classify(
    value: &Value,
    doc: &str,
    registration: bool,
    chart_doc: bool,
    known: &Known,
    errors: &mut Vec<String>,
) -> &'static str {
    let Some(map) = value.as_object() else {
        errors.push("a YAML block that is not a map: mark it a fragment".into());
        return "unknown";
    };
    if map.contains_key("apiVersion") || map.contains_key("kind") {
        if let Err(e) = kubernetes(value) {
            errors.push(e);
        }
        return "Kubernetes objects";
    }
    let keys: Vec<&str> = map.keys().map(String::as_str).collect();
    if keys == [dispatch_api::PLUGIN_NAME] {
        return "plugin block";
    }
    if registration && keys.len() == 1 {
        return "plugin registration";
    }
    let top = |set: &std::collections::BTreeSet<String>| keys.iter().all(|k| set.contains(*k));
    let config = top(&known.config_keys);
    let chart = top(&known.chart_values);
    if config && !(chart && chart_doc) {
        match dispatch_server::config::ServerConfig::parse(doc, "the block") {
            Err(e) => errors.push(format!("server config: {}", one_line(&e.to_string()))),
            // What the server accepts, the chart's `config:` takes (the docs say so).
            Ok(_) => {
                let values = serde_json::json!({ "config": value });
                errors.extend(
                    schema_errors(&values, known)
                        .into_iter()
                        .map(|e| format!("as the chart's config: {e}")),
                );
            }
        }
        return "server config";
    }
    if chart {
        errors.extend(chart_values(value, known));
        return "chart values";
    }
    errors.push(format!(
        "a YAML block of no known kind (top-level keys {keys:?}): complete it (a server config, chart values, a Kubernetes object, a plugin block) or mark it `{FRAGMENT_MARKER}`"
    ));
    "unknown"
}

/// The chart's schema over `value`, then its `config:` as a server config.
pub(crate) fn chart_values(value: &Value, known: &Known) -> Vec<String> {
    let mut errors = Vec::new();
    errors.extend(schema_errors(value, known));
    if let Some(config) = value.get("config").filter(|c| !c.is_null()) {
        let text = serde_json::to_string(config).expect("JSON");
        if let Err(e) = dispatch_server::config::ServerConfig::parse(&text, "config:") {
            errors.push(format!("server config: {}", one_line(&e.to_string())));
        }
    }
    errors
}

/// What [`nested`] found.
#[derive(Debug, Default)]
struct Nested {
    plugin_blocks: usize,
    registration: bool,
}

/// `values.schema.json`'s complaints about `value`.
fn schema_errors(value: &Value, known: &Known) -> Vec<String> {
    let mut errors = Vec::new();
    match jsonschema::JSONSchema::compile(&known.chart_schema) {
        Ok(schema) => {
            if let Err(found) = schema.validate(value) {
                errors.extend(found.map(|e| {
                    format!(
                        "values.schema.json at '{}': {}",
                        e.instance_path,
                        one_line(&e.to_string())
                    )
                }));
            }
        }
        Err(e) => errors.push(format!(
            "charts/rollouts-dispatch/values.schema.json is not a schema: {e}"
        )),
    }
    errors
}

/// Checks the plugin blocks and plugin registrations anywhere in `value`.
fn nested(value: &Value, found: &mut Nested, errors: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                if k == dispatch_api::PLUGIN_NAME && v.is_object() {
                    found.plugin_blocks += 1;
                    if let Err(e) = plugin_block(v) {
                        errors.push(e);
                    }
                } else if k == "metricProviderPlugins" {
                    found.registration = true;
                    if let Err(e) = registration(v) {
                        errors.push(e);
                    }
                } else {
                    nested(v, found, errors);
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                nested(v, found, errors);
            }
        }
        _ => {}
    }
}

/// A `rollouts-dispatch/job` block, its `{{args.X}}` replaced as the controller would.
pub(crate) fn plugin_block(block: &Value) -> Result<(), String> {
    let json = serde_json::to_string(block).expect("JSON");
    let json = substitute_args(&json);
    dispatch_api::JobConfig::parse(json.as_bytes())
        .map(|_| ())
        .map_err(|e| format!("plugin block: {}", one_line(&e.to_string())))
}

/// `{{args.X}}` / `{{ args.X }}` → `example-X`.
fn substitute_args(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let Some(j) = rest[i..].find("}}") else { break };
        let inner = rest[i + 2..i + j].trim();
        match inner.strip_prefix("args.") {
            Some(name) => out.push_str(&format!("example-{name}")),
            None => out.push_str(&rest[i..i + j + 2]),
        }
        rest = &rest[i + j + 2..];
    }
    out.push_str(rest);
    out
}

/// A `metricProviderPlugins` list (or its YAML text): our entry's args parse with the plugin's
/// own flags.
pub(crate) fn registration(value: &Value) -> Result<(), String> {
    let list: Value = match value {
        Value::String(s) => serde_saphyr::from_str(s)
            .map_err(|e| format!("metricProviderPlugins: not YAML: {e}"))?,
        v => v.clone(),
    };
    let items = list.as_array().ok_or("metricProviderPlugins: not a list")?;
    for item in items
        .iter()
        .filter(|i| i["name"] == dispatch_api::PLUGIN_NAME)
    {
        let mut argv = vec!["rollouts-dispatch-plugin".to_string()];
        for a in item["args"].as_array().into_iter().flatten() {
            argv.push(
                a.as_str()
                    .ok_or("metricProviderPlugins: an arg that is not a string")?
                    .to_string(),
            );
        }
        use clap::Parser;
        dispatch_metric_provider::Args::try_parse_from(&argv).map_err(|e| {
            format!(
                "metricProviderPlugins: the plugin refuses its args {:?}: {}",
                &argv[1..],
                one_line(&e.to_string())
            )
        })?;
    }
    Ok(())
}

/// One Kubernetes object: a known built-in kind through its k8s-openapi type with no field left
/// over, an Argo or Kargo kind by its key fields.
pub(crate) fn kubernetes(v: &Value) -> Result<(), String> {
    use k8s_openapi::api::{apps, batch, core, networking, policy, rbac};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = v["apiVersion"]
        .as_str()
        .ok_or("a Kubernetes object without apiVersion")?;
    let kind = v["kind"]
        .as_str()
        .ok_or("a Kubernetes object without kind")?;
    if v["metadata"]["name"].as_str().is_none() {
        return Err(format!("{kind}: no metadata.name"));
    }
    match (api, kind) {
        ("v1", "Namespace") => typed::<core::v1::Namespace>(v),
        ("v1", "ServiceAccount") => typed::<core::v1::ServiceAccount>(v),
        ("v1", "ConfigMap") => typed::<core::v1::ConfigMap>(v),
        ("v1", "Secret") => typed::<core::v1::Secret>(v),
        ("v1", "Service") => typed::<core::v1::Service>(v),
        ("v1", "Pod") => typed::<core::v1::Pod>(v),
        ("batch/v1", "Job") => typed::<batch::v1::Job>(v),
        ("apps/v1", "Deployment") => typed::<apps::v1::Deployment>(v),
        ("rbac.authorization.k8s.io/v1", "Role") => typed::<rbac::v1::Role>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => typed::<rbac::v1::ClusterRole>(v),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => typed::<rbac::v1::RoleBinding>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => typed::<rbac::v1::ClusterRoleBinding>(v),
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => typed::<CustomResourceDefinition>(v),
        ("argoproj.io/v1alpha1", "AnalysisTemplate" | "ClusterAnalysisTemplate" | "AnalysisRun") => {
            let metrics = v["spec"]["metrics"].as_array().filter(|m| !m.is_empty()).ok_or(format!("{kind}: no spec.metrics"))?;
            for m in metrics {
                if m["name"].as_str().is_none() || !m["provider"].is_object() {
                    return Err(format!("{kind}: a metric without name or provider: {m}"));
                }
            }
            Ok(())
        }
        ("argoproj.io/v1alpha1", "Rollout") => fields(v, kind, &["/spec/template", "/spec/strategy"]),
        ("argoproj.io/v1alpha1", "Application") => fields(v, kind, &["/spec/destination", "/spec/project"]),
        ("kargo.akuity.io/v1alpha1", "Stage") => fields(v, kind, &["/spec"]),
        ("kargo.akuity.io/v1alpha1", "Project" | "Warehouse" | "PromotionTask" | "Freight") => Ok(()),
        ("argoproj.io/v1alpha1", "AppProject") => fields(v, kind, &["/spec"]),
        ("networking.k8s.io/v1", "NetworkPolicy") => typed::<networking::v1::NetworkPolicy>(v),
        ("policy/v1", "PodDisruptionBudget") => typed::<policy::v1::PodDisruptionBudget>(v),
        ("cert-manager.io/v1", "Certificate" | "Issuer" | "ClusterIssuer") => fields(v, kind, &["/spec"]),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => fields(v, kind, &["/spec/selector", "/spec/endpoints"]),
        ("monitoring.coreos.com/v1", "PrometheusRule") => prometheus_rule(v),
        _ => Err(format!("{api} {kind}: a kind this check does not know (add it to tests/tests/docs_check/yaml.rs)")),
    }
}

/// Every rule of a PrometheusRule has an `expr` and is an `alert` or a `record`.
fn prometheus_rule(v: &Value) -> Result<(), String> {
    let groups = v["spec"]["groups"]
        .as_array()
        .ok_or("PrometheusRule: no spec.groups")?;
    for g in groups {
        for r in g["rules"]
            .as_array()
            .ok_or("PrometheusRule: a group without rules")?
        {
            let named = r["alert"].is_string() || r["record"].is_string();
            if !named || r["expr"].is_null() {
                return Err(format!(
                    "PrometheusRule: a rule without alert/record or expr: {r}"
                ));
            }
        }
    }
    Ok(())
}

fn fields(v: &Value, kind: &str, pointers: &[&str]) -> Result<(), String> {
    match pointers.iter().find(|p| v.pointer(p).is_none()) {
        Some(p) => Err(format!(
            "{kind}: no {}",
            p.trim_start_matches('/').replace('/', ".")
        )),
        None => Ok(()),
    }
}

/// `v` through `T` and back: a field `T` does not have is lost on the way, and named.
fn typed<T: DeserializeOwned + Serialize>(v: &Value) -> Result<(), String> {
    let kind = v["kind"].as_str().unwrap_or("?");
    let t: T = serde_json::from_value(v.clone()).map_err(|e| format!("{kind}: {e}"))?;
    let back = serde_json::to_value(&t).expect("JSON");
    let mut unknown = Vec::new();
    lost_fields(v, &back, "", &mut unknown);
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(format!("{kind}: unknown field(s) {}", unknown.join(", ")))
    }
}

/// The paths of `orig` that `back` lacks (empty values aside: they are dropped on the way).
pub(crate) fn lost_fields(orig: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => lost_fields(v, w, &p, out),
                    None if is_empty(v) => {}
                    None => out.push(p.trim_start_matches('.').to_string()),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                lost_fields(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}
