//! The pending-deletion loop of `serve`: every [`EVERY`], `Engine::retry_pending_deletions`
//! tries again the Job deletions a Terminate could not finish (`engine/pending.rs`) and
//! publishes `rollouts_dispatch_pending_deletions{destination}`.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info_span, Instrument};

use crate::engine::Engine;
use crate::runtime::metrics::Metrics;

/// How often pending deletions are tried again: a reachable-again destination loses its
/// terminated Jobs within this, and an unreachable one costs one failed call per Job per pass.
pub const EVERY: Duration = Duration::from_secs(10);

/// Retries the pending deletions every `every` until the task is aborted.
pub fn spawn(
    engine: Engine,
    metrics: Arc<Metrics>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(
        async move {
            loop {
                let report = engine.retry_pending_deletions().await;
                metrics.set_pending_deletions(&report.pending);
                tokio::time::sleep(every).await;
            }
        }
        .instrument(info_span!("pending_deletions", every_s = every.as_secs())),
    )
}
