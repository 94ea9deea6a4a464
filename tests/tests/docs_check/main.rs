//! `make docs-check`: every Markdown file of the repository (README.md, docs/, tests/README.md,
//! the chart's README, CHANGELOG.md) and every YAML file of `config/` checked against the code,
//! so the docs cannot drift from it. A `make` target, a flag of `rollouts-dispatch` or the plugin,
//! a server config key, a chart value, a metric name or a repository path the docs name must
//! exist; every ```yaml block must validate as what it is (server config, chart values, plugin
//! block, plugin registration, Kubernetes objects). Nothing here needs a cluster.
//!
//! - [`markdown`] finds the files and splits them into prose, code spans, code blocks and links;
//! - [`extract`] turns those into references ([`extract::Ref`]), [`commands`] those of shell
//!   commands;
//! - [`known`] collects what exists, from the code itself (clap's command tree, the config
//!   reference, a fresh metrics registry, the Makefiles, the chart's values and schema, git);
//! - [`yaml`] classifies and validates the YAML blocks;
//! - [`check`] compares and prints the report, whose last line the make target shows.
//!
//! The whole check is `#[ignore]`d so that `cargo test` stays green while the docs are rewritten;
//! `make docs-check` runs it. The other tests here plant one broken reference of each kind.

mod check;
mod commands;
mod extract;
mod known;
mod markdown;
mod unit;
mod yaml;

use dispatch_tests::artifacts::repo_path;

/// The repository's docs against the code; writes the report to `$DOCS_REPORT` (the make target
/// prints it) and fails when anything is broken.
#[test]
#[ignore = "run by `make docs-check`"]
fn docs_name_only_what_exists() {
    let root = repo_path("");
    let known = known::Known::from_repo(&root);
    let report = check::run(&root, &known);
    let text = report.render();
    if let Some(path) = std::env::var_os("DOCS_REPORT") {
        std::fs::write(&path, &text).expect("writing $DOCS_REPORT");
    }
    print!("{text}");
    assert_eq!(
        report.broken.len(),
        0,
        "broken references in the docs, above"
    );
}
