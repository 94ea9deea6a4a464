//! What exists, each from its source of truth: `make` targets from the Makefile and its
//! includes, flags from clap's command trees (the server's `Cli`, the plugin's `Args`), config
//! keys from `config::reference::reference()`, chart values from `values.yaml` and
//! `values.schema.json`, metric names from the server's metrics catalog, paths from git.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command as Process;

use clap::CommandFactory;
use serde_json::Value;

/// Everything a reference may name.
#[derive(Debug, Default, Clone)]
pub(crate) struct Known {
    /// `make` targets
    pub(crate) targets: BTreeSet<String>,
    /// subcommand path (`serve`, `token issue`, `` for the top level) → its flags (`--config`, `-f`)
    pub(crate) commands: BTreeMap<String, BTreeSet<String>>,
    /// the plugin's flags
    pub(crate) plugin_flags: BTreeSet<String>,
    /// server config keys, without `[]` (`policy.rules.projects`), with every parent
    pub(crate) config_keys: BTreeSet<String>,
    /// config keys whose value is a free map (anything under them is a key of the map)
    pub(crate) config_open: BTreeSet<String>,
    /// chart values, without `[]`, with every parent
    pub(crate) chart_values: BTreeSet<String>,
    /// chart values whose content is free (maps of any keys)
    pub(crate) chart_open: BTreeSet<String>,
    /// every series or family name the server exports
    pub(crate) metrics: BTreeSet<String>,
    /// files and directories of the repository, relative
    pub(crate) files: BTreeSet<String>,
    /// the chart's values schema
    pub(crate) chart_schema: Value,
}

impl Known {
    /// Everything, read from the repository at `root` and the linked code.
    pub(crate) fn from_repo(root: &Path) -> Self {
        let files = git_files(root);
        let schema: Value = read_json(&root.join("charts/rollouts-dispatch/values.schema.json"));
        let values: Value = read_yaml(&root.join("charts/rollouts-dispatch/values.yaml"));
        let mut known = Known {
            targets: make_targets(root, "Makefile"),
            commands: server_commands(),
            plugin_flags: flags_of(&dispatch_metric_provider::Args::command()),
            metrics: metric_names(),
            files,
            chart_schema: schema.clone(),
            ..Known::default()
        };
        for doc in dispatch_server::config::reference() {
            let key = doc.key.replace("[]", "");
            if doc.ty.contains("map") {
                known.config_open.insert(key.clone());
            }
            add_with_parents(&mut known.config_keys, &key);
        }
        schema_paths(&schema, "", &mut known.chart_values, &mut known.chart_open);
        value_paths(&values, "", &mut known.chart_values);
        known
    }

    /// Whether a dotted config key (`engine.connectTimeout`, `policy.rules[].projects`) exists.
    pub(crate) fn config_key(&self, key: &str) -> bool {
        let key = key.replace("[]", "");
        self.config_keys.contains(&key) || under(&self.config_open, &key)
    }

    /// Whether a dotted chart value exists; `config.…` is a server config key.
    pub(crate) fn chart_value(&self, key: &str) -> bool {
        let key = key.replace("[]", "");
        if let Some(rest) = key.strip_prefix("config.") {
            return self.config_key(rest);
        }
        self.chart_values.contains(&key) || under(&self.chart_open, &key)
    }

    /// Whether a repository path (file or directory) exists.
    pub(crate) fn path(&self, path: &str) -> bool {
        let p = path.trim_end_matches('/');
        p.is_empty() || self.files.contains(p)
    }
}

/// `key` lies strictly under one of `open`.
fn under(open: &BTreeSet<String>, key: &str) -> bool {
    open.iter().any(|o| key.starts_with(&format!("{o}.")))
}

fn add_with_parents(set: &mut BTreeSet<String>, key: &str) {
    let mut acc = String::new();
    for seg in key.split('.') {
        if !acc.is_empty() {
            acc.push('.');
        }
        acc.push_str(seg);
        set.insert(acc.clone());
    }
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn read_yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Files git tracks or would track (untracked but not ignored), and every directory of them.
fn git_files(root: &Path) -> BTreeSet<String> {
    let out = Process::new("git")
        .args([
            "ls-files",
            "--cached",
            "--others",
            "--exclude-standard",
            "-z",
        ])
        .current_dir(root)
        .output()
        .expect("git ls-files");
    assert!(
        out.status.success(),
        "git ls-files: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut files = BTreeSet::new();
    for f in String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|f| !f.is_empty())
    {
        // A file deleted in the work tree is still in the index: it no longer exists.
        if !root.join(f).exists() {
            continue;
        }
        let mut dir = Path::new(f).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            files.insert(d.to_string_lossy().into_owned());
            dir = d.parent();
        }
        files.insert(f.to_string());
    }
    files
}

/// The rules' targets of `file` and of the files it includes (`include a.mk b.mk`), the
/// variables of their names left out (`$(CACHE_DIR)/x:` is a file, not a target to type).
pub(crate) fn make_targets(root: &Path, file: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut targets = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line
            .strip_prefix("include ")
            .or_else(|| line.strip_prefix("-include "))
        {
            for inc in rest.split_whitespace() {
                targets.extend(make_targets(root, inc));
            }
            continue;
        }
        targets.extend(rule_targets(line));
    }
    targets
}

/// The targets a line of a Makefile defines: `a b: deps`, not `x := y`, `x ?= y`, a recipe
/// line or `.PHONY`.
pub(crate) fn rule_targets(line: &str) -> Vec<String> {
    if line.starts_with(['\t', ' ', '#', '.']) {
        return Vec::new();
    }
    let Some(i) = line.find(':') else {
        return Vec::new();
    };
    if line[i + 1..].starts_with('=') || line[..i].contains('=') || line[..i].contains('$') {
        return Vec::new();
    }
    line[..i]
        .split_whitespace()
        .filter(|t| {
            t.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
        .map(str::to_string)
        .collect()
}

/// Every subcommand path of `rollouts-dispatch` and its flags, global ones included.
fn server_commands() -> BTreeMap<String, BTreeSet<String>> {
    let mut cli = dispatch_server::cmd::Cli::command();
    cli.build();
    let mut out = BTreeMap::new();
    walk(&cli, "", &mut out);
    out
}

fn walk(cmd: &clap::Command, path: &str, out: &mut BTreeMap<String, BTreeSet<String>>) {
    out.insert(path.to_string(), flags_of(cmd));
    for sub in cmd.get_subcommands() {
        let p = if path.is_empty() {
            sub.get_name().to_string()
        } else {
            format!("{path} {}", sub.get_name())
        };
        walk(sub, &p, out);
    }
}

/// `--long` and `-s` of every argument of `cmd`, aliases and the built-in help/version included.
pub(crate) fn flags_of(cmd: &clap::Command) -> BTreeSet<String> {
    let mut cmd = cmd.clone();
    cmd.build();
    let mut out = BTreeSet::from(["--help".to_string(), "-h".to_string()]);
    if cmd.get_version().is_some() {
        out.extend(["--version".to_string(), "-V".to_string()]);
    }
    for a in cmd.get_arguments() {
        out.extend(
            a.get_long_and_visible_aliases()
                .into_iter()
                .flatten()
                .map(|l| format!("--{l}")),
        );
        out.extend(
            a.get_short_and_visible_aliases()
                .into_iter()
                .flatten()
                .map(|s| format!("-{s}")),
        );
    }
    out
}

/// The metric names a scrape of the server shows: each family of the server's catalog
/// (`runtime::metrics::catalog`, which its own tests hold equal to what `Metrics::new`
/// registers) and the names of its series (a counter's `_total`, a histogram's `_bucket`,
/// `_sum` and `_count`).
fn metric_names() -> BTreeSet<String> {
    use dispatch_server::runtime::metrics::catalog::CATALOG;
    CATALOG
        .iter()
        .flat_map(|m| std::iter::once(m.full_name()).chain(m.series()))
        .collect()
}

/// The dotted paths of a JSON schema's `properties` (list items at the list's path); a map of
/// free keys (`additionalProperties` a schema or true, or an object without `properties`) is open.
pub(crate) fn schema_paths(
    schema: &Value,
    path: &str,
    out: &mut BTreeSet<String>,
    open: &mut BTreeSet<String>,
) {
    let join = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    if let Some(items) = schema.get("items") {
        schema_paths(items, path, out, open);
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        for s in schema
            .get(key)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            schema_paths(s, path, out, open);
        }
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let free = match schema.get("additionalProperties") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Object(_)) => true,
        _ => props.is_none() && schema.get("type").is_some_and(|t| t == "object"),
    };
    if free && !path.is_empty() {
        open.insert(path.to_string());
    }
    for (k, v) in props.into_iter().flatten() {
        out.insert(join(k));
        schema_paths(v, &join(k), out, open);
    }
}

/// The dotted paths of the maps in a values file.
fn value_paths(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    if let Value::Object(map) = v {
        for (k, v) in map {
            let p = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            out.insert(p.clone());
            value_paths(v, &p, out);
        }
    }
}
