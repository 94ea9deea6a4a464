//! One scene per test binary, shared by its tests: started by the first test that needs it, on
//! one tokio runtime that outlives every test (the scene's kube clients, watches and in-process
//! servers live on that runtime, so a per-test runtime would strand them).
//!
//! Tests are plain `#[test]` functions that call [`block_on`]; they run in parallel on libtest's
//! threads. A scene is never dropped: its clusters' processes die with the test process (see
//! [`crate::cluster::process`]) and the next run removes their directories.

use std::future::Future;
use std::sync::{LazyLock, OnceLock};

use anyhow::{anyhow, Result};

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build the shared tokio runtime: {e}"))
});

/// Runs `future` to completion on the runtime shared by every test of this binary.
pub fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.block_on(future)
}

/// A scene started once per test binary, by the first test that asks for it. When the start
/// fails, every test that needs the scene fails with the same error.
pub struct Shared<T> {
    cell: OnceLock<Result<T, String>>,
}

impl<T> Shared<T> {
    /// An empty slot, for a `static`.
    pub const fn new() -> Self {
        Self {
            cell: OnceLock::new(),
        }
    }

    /// The scene, started with `start` on the shared runtime if this is the first call. Call it
    /// outside [`block_on`].
    pub fn get_or_start<F, Fut>(&'static self, start: F) -> Result<&'static T>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.cell
            .get_or_init(|| block_on(start()).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow!("the shared scene did not start: {e}"))
    }
}

impl<T> Default for Shared<T> {
    fn default() -> Self {
        Self::new()
    }
}
