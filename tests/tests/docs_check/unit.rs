//! The extractor and the checks against planted mistakes: for each kind, a reference that exists
//! passes and one that does not is reported, with its file and line.

use std::sync::OnceLock;

use dispatch_tests::artifacts::repo_path;

use super::check::Checker;
use super::known::Known;

fn known() -> &'static Known {
    static KNOWN: OnceLock<Known> = OnceLock::new();
    KNOWN.get_or_init(|| Known::from_repo(&repo_path("")))
}

/// The report lines of `text` read as the Markdown file `file` (or a YAML file of `config/`).
fn broken(file: &str, text: &str) -> Vec<String> {
    let root = repo_path("");
    let mut checker = Checker::new(&root, known());
    if file.ends_with(".yaml") {
        checker.config_file(file, text);
    } else {
        checker.doc(file, text);
    }
    checker.report.broken
}

/// `bad` is reported at line 1 with `needle`; `good` is not reported.
fn catches(file: &str, good: &str, bad: &str, needle: &str) {
    let ok = broken(file, good);
    assert!(ok.is_empty(), "{good:?} reported: {ok:?}");
    let b = broken(file, bad);
    assert!(
        b.iter()
            .any(|l| l.starts_with(&format!("{file}:")) && l.contains(needle)),
        "{bad:?} not reported with {needle:?}: {b:?}"
    );
}

#[test]
fn make_targets() {
    catches(
        "README.md",
        "Run `make docs` or `make test-fast`.",
        "Run `make docs-nope`.",
        "make target 'docs-nope' does not exist",
    );
    catches(
        "README.md",
        "```sh\nSOAK_RUNS=4 make soak\n```",
        "```sh\nmake lint docs-nope\n```",
        "'docs-nope'",
    );
    // Prose is not code: "make one" is English.
    assert!(broken("README.md", "tokens make one wonder").is_empty());
}

#[test]
fn flags_of_our_commands() {
    catches(
        "README.md",
        "```sh\nrollouts-dispatch serve --config x.yaml --jwt-key-file k\n```",
        "```sh\nrollouts-dispatch serve --config x.yaml --no-such-flag\n```",
        "flag '--no-such-flag'",
    );
    catches(
        "README.md",
        "`token issue --key-file`",
        "`token issue --no-such-flag`",
        "not a flag of `rollouts-dispatch token issue`",
    );
    catches(
        "README.md",
        "```sh\nrollouts-dispatch-plugin --server https://x --ca-file ca.crt\n```",
        "```sh\nrollouts-dispatch-plugin --serve https://x\n```",
        "flag '--serve'",
    );
    catches("README.md", "`--pod-ip`", "`--pod-ipp`", "flag '--pod-ipp'");
    catches(
        "charts/rollouts-dispatch/README.md",
        "```sh\nkubectl exec deploy/x -- \\\n  rollouts-dispatch token issue --key-file k >t\n```",
        "```sh\nkubectl exec deploy/x -- \\\n  rollouts-dispatch token issue --key-fil k >t\n```",
        "flag '--key-fil'",
    );
    // Another tool's flag in a paragraph that names it is not ours to check; without the
    // name, it is reported.
    assert!(broken(
        "README.md",
        "The repo-server runs with\n`--repo-server-plaintext`."
    )
    .is_empty());
    catches(
        "README.md",
        "`--pod-ip`",
        "The server runs with\n`--repo-server-plaintext`.",
        "flag '--repo-server-plaintext'",
    );
}

#[test]
fn config_keys() {
    catches(
        "README.md",
        "`engine.connectTimeout` and `policy.rules[].projects`",
        "`engine.connectTimeoutt`",
        "config key 'engine.connectTimeoutt'",
    );
    catches(
        "README.md",
        "`policy.rules[].resources.max.cpu`",
        "`agents.destinations[].namespacee: x`",
        "'agents.destinations[].namespacee'",
    );
}

#[test]
fn chart_values() {
    catches(
        "charts/rollouts-dispatch/README.md",
        "`server.replicas`, `config.engine.connectTimeout`",
        "`server.replicass`",
        "chart value 'server.replicass'",
    );
    catches(
        "README.md",
        "```sh\nhelm install x charts/rollouts-dispatch --set server.enabled=false\n```",
        "```sh\nhelm install x charts/rollouts-dispatch --set server.enabledd=false\n```",
        "chart value 'server.enabledd'",
    );
    catches(
        "docs/x.md",
        "`.Values.tls.enabled` and `--set config.engine.connectTimeout=5s`",
        "`--set config.engine.connectTimeoutt=5s`",
        "chart value 'config.engine.connectTimeoutt'",
    );
    catches(
        "docs/x.md",
        "`.Values.tls.enabled`",
        "`.Values.tls.enabledd`",
        "chart value 'tls.enabledd'",
    );
}

#[test]
fn metrics() {
    catches(
        "README.md",
        "`rollouts_dispatch_jobs_swept_total` and rollouts_dispatch_pending_deletions",
        "alert on `rollouts_dispatch_jobs_sweeped_total`",
        "metric 'rollouts_dispatch_jobs_sweeped_total'",
    );
}

#[test]
fn paths_and_anchors() {
    catches(
        "README.md",
        "`config/server.yaml`, `server/src/cmd/mod.rs:12-20`, `tests/`",
        "`config/serverr.yaml`",
        "path 'config/serverr.yaml'",
    );
    catches(
        "docs/x.md",
        "[ref](configuration.md#top-level), [here](#a-title)\n\n## A title",
        "[ref](configuration.md#no-such-heading)",
        "no heading with anchor #no-such-heading",
    );
    catches(
        "README.md",
        "```sh\nkubectl apply -f config/crds/dispatchjobs.yaml\n```",
        "```sh\nkubectl apply -f config/crds/dispatchjob.yaml\n```",
        "path 'config/crds/dispatchjob.yaml'",
    );
    // A doc in a directory names paths from there too (tests/README.md: `src/` is tests/src/).
    catches(
        "tests/README.md",
        "`src/bin/test-cluster.rs`",
        "`src/bin/test-clusterr.rs`",
        "path 'src/bin/test-clusterr.rs'",
    );
    // An upstream project's path is cited with the project's name; a tool's name is not enough.
    assert!(broken("README.md", "Kargo's `api/v1alpha1/stage_types.go:216`").is_empty());
    catches(
        "README.md",
        "helm renders `charts/rollouts-dispatch/values.yaml`",
        "helm renders `charts/rollouts-dispatch/valuess.yaml`",
        "path 'charts/rollouts-dispatch/valuess.yaml'",
    );
    // The comments of a config/ file: every path word, in a code span or not.
    let yaml = |comment: &str| format!("# {comment}\nengine: {{connectTimeout: 5s}}\n");
    catches(
        "config/x.yaml",
        &yaml("see docs/configuration.md."),
        &yaml("see docs/configuratio.md."),
        "path 'docs/configuratio.md'",
    );
}

#[test]
fn yaml_blocks() {
    let block = |s: &str| format!("```yaml\n{s}\n```");
    catches(
        "README.md",
        &block("engine:\n  connectTimeout: 5s"),
        &block("engine:\n  connectTimeoutt: 5s"),
        "yaml block 'server config' does not validate",
    );
    catches(
        "charts/rollouts-dispatch/README.md",
        &block("server:\n  replicas: 2"),
        &block("server:\n  replicas: two"),
        "yaml block 'chart values' does not validate",
    );
    catches(
        "charts/rollouts-dispatch/README.md",
        &block("config:\n  engine: {connectTimeout: 5s}"),
        &block("config:\n  engine: {connectTimeoutt: 5s}"),
        "server config",
    );
    catches(
        "README.md",
        &block("rollouts-dispatch/job:\n  destination: \"{{args.destination}}\"\n  rollout: {name: web, image: x}"),
        &block("rollouts-dispatch/job:\n  destination: a\n  nonsense: 1"),
        "yaml block 'plugin block' does not validate",
    );
    catches(
        "README.md",
        &block("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\nrules: [{apiGroups: [batch], resources: [jobs], verbs: [get]}]"),
        &block("apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: x}\nrules: [{apiGroup: [batch], resources: [jobs], verbs: [get]}]"),
        "unknown field(s) rules[0].apiGroup",
    );
    catches(
        "README.md",
        &block("metricProviderPlugins: |\n  - name: rollouts-dispatch/job\n    location: file:///x\n    args: [--server, https://x]"),
        &block("metricProviderPlugins: |\n  - name: rollouts-dispatch/job\n    location: file:///x\n    args: [--serverr, https://x]"),
        "the plugin refuses its args",
    );
    // A block of no known kind fails unless marked partial; its plugin block is checked anyway.
    catches(
        "README.md",
        &block("# docs-check: fragment\nspec: {metrics: []}"),
        &block("spec: {metrics: []}"),
        "no known kind",
    );
    catches(
        "README.md",
        "```yaml fragment\nspec: {}\n```",
        "```yaml fragment\nm:\n  rollouts-dispatch/job: {nonsense: 1}\n```",
        "plugin block",
    );
    // An alert names metrics that exist, and is an alert.
    let rule = |body: &str| {
        block(&format!(
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nmetadata: {{name: r}}\nspec:\n  groups:\n  - name: g\n    rules:\n    - {body}"
        ))
    };
    catches(
        "README.md",
        &rule("{alert: A, expr: 'rate(rollouts_dispatch_gc_failures_total[5m]) > 0'}"),
        &rule("{alert: A, expr: 'rate(rollouts_dispatch_gc_failure_total[5m]) > 0'}"),
        "metric 'rollouts_dispatch_gc_failure_total'",
    );
    catches(
        "README.md",
        &rule("{record: r, expr: up}"),
        &rule("{alert: A}"),
        "a rule without alert/record or expr",
    );
}

/// A server config the server takes must also be one the chart's `config:` takes.
#[test]
fn server_config_blocks_fit_the_charts_config_value() {
    let mut known = known().clone();
    known.chart_schema = serde_json::json!({
        "type": "object",
        "properties": {"config": {"type": "object", "additionalProperties": false, "properties": {"engine": {}}}}
    });
    let ok = super::yaml::validate("engine: {connectTimeout: 5s}\n", false, false, &known);
    assert_eq!(
        (ok.kind.as_str(), ok.errors.len()),
        ("server config", 0),
        "{ok:?}"
    );
    let bad = super::yaml::validate("jobs: {retention: 24h}\n", false, false, &known);
    assert!(
        bad.errors
            .iter()
            .any(|e| e.starts_with("as the chart's config:") && e.contains("jobs")),
        "{bad:?}"
    );
}
