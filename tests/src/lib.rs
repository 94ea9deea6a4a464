//! `dispatch-tests`: helpers for cross-crate, cross-language and real-cluster tests.

pub mod cluster;

use std::path::{Path, PathBuf};

/// The `rollouts-dispatch` binary the process-level tests run:
/// `<workspace>/target/debug/rollouts-dispatch`, or `$ROLLOUTS_DISPATCH_BINARY`.
pub fn rollouts_dispatch_binary() -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("ROLLOUTS_DISPATCH_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/debug/rollouts-dispatch")
        });
    if !path.is_file() {
        anyhow::bail!(
            "{} is missing: build it with `cargo build -p dispatch-server --bin rollouts-dispatch` \
             (the make targets that need it do)",
            path.display()
        );
    }
    Ok(path)
}
