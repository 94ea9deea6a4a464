//! Where tests find what the build made and what the repository ships: the plugin binary, the
//! `rollouts-dispatch` binary and files under the workspace root (e.g. `config/`).
//!
//! The make targets build the binaries first; a test run by hand that misses one fails with the
//! command that builds it.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// The name the plugin is registered under in `argo-rollouts-config` (and the key of its block
/// in a metric's `provider.plugin`).
pub const PLUGIN_NAME: &str = "rollouts-dispatch/job";

/// A path under the workspace root, e.g. `repo_path("config/agent-rbac.yaml")`.
pub fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// The static release plugin binary that Argo Rollouts loads: `$PLUGIN_BINARY`, else what
/// `make plugin-release` builds; absolute (it goes into a `file://` URL).
pub fn plugin_binary() -> Result<PathBuf> {
    let path = std::env::var_os("PLUGIN_BINARY").map_or_else(
        || repo_path("target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin"),
        PathBuf::from,
    );
    if !path.is_file() {
        bail!(
            "plugin binary {} is missing: run `make plugin-release` or set PLUGIN_BINARY",
            path.display()
        );
    }
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

/// The `rollouts-dispatch` binary the process-level tests run: `$ROLLOUTS_DISPATCH_BINARY`, else
/// `<workspace>/target/debug/rollouts-dispatch`.
pub fn rollouts_dispatch_binary() -> Result<PathBuf> {
    let path = std::env::var_os("ROLLOUTS_DISPATCH_BINARY").map_or_else(
        || repo_path("target/debug/rollouts-dispatch"),
        PathBuf::from,
    );
    if !path.is_file() {
        bail!(
            "{} is missing: build it with `cargo build -p dispatch-server --bin rollouts-dispatch` \
             (the make targets that need it do)",
            path.display()
        );
    }
    Ok(path)
}

/// The example AnalysisTemplates of `config/analysis-templates`, parsed, by file.
pub fn example_analysis_templates() -> Result<Vec<(PathBuf, Value)>> {
    let dir = repo_path("config/analysis-templates");
    let mut templates = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let template =
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        templates.push((path, template));
    }
    templates.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(templates)
}
