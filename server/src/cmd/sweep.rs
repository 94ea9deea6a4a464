//! The sweep loop of `serve`: every `--sweep-orphans-every` (default 5m whenever the control
//! plane or `agents` is configured), `Engine::sweep_orphans` (with a control plane),
//! `Engine::expire_records` and `Applications::expire_idle` (with agents), each deletion counted in
//! `rollouts_dispatch_jobs_swept_total{destination, reason}`.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, info_span, warn, Instrument};

use crate::applications::{Applications, APP_RECORD_IDLE};
use crate::engine::{CleanupError, Engine};
use crate::runs::Runs;
use crate::runtime::metrics::Metrics;

/// The interval when `--sweep-orphans-every` is not given and the control plane is configured.
pub const DEFAULT_EVERY: Duration = Duration::from_secs(300);

/// The sweep's interval: the flag's (`0`: off), else [`DEFAULT_EVERY`] when there is work for
/// it (`work`: the server has credentials for the control plane, or agent records to expire),
/// else off.
pub fn interval(flag: Option<Duration>, work: bool) -> Option<Duration> {
    match flag {
        Some(every) => (!every.is_zero()).then_some(every),
        None => work.then_some(DEFAULT_EVERY),
    }
}

/// Runs the sweep every `every` until the task is aborted, reading the runs from `runs`' watch
/// when it can (`Engine::sweep_orphans_with`).
pub fn spawn(
    engine: Engine,
    runs: Option<Runs>,
    applications: Arc<Applications>,
    metrics: Arc<Metrics>,
    every: Duration,
) -> tokio::task::JoinHandle<()> {
    info!(
        every_s = every.as_secs(),
        retention_s = engine.jobs_settings().retention.as_secs(),
        record_retention_s = engine.record_retention().as_secs(),
        "the sweep deletes Jobs of deleted AnalysisRuns and of runs completed before the retention \
         (with a control plane), and of agent records finished before theirs"
    );
    tokio::spawn(
        async move {
            loop {
                tokio::time::sleep(every).await;
                let idle = applications.expire_idle(APP_RECORD_IDLE).await;
                let expired = engine.expire_records().await;
                for (destination, _, reason) in idle.deleted.iter().chain(&expired.deleted) {
                    metrics.count_swept(destination, reason.as_str());
                }
                if !engine.has_control_plane() {
                    continue;
                }
                match engine.sweep_orphans_with(runs.as_ref()).await {
                    Ok(report) => {
                        for (destination, _, reason) in &report.deleted {
                            metrics.count_swept(destination, reason.as_str());
                        }
                    }
                    Err(e @ CleanupError::ListRuns(_)) => {
                        warn!(error = %e, "sweep failed; retrying at the next interval (or turn it off: --sweep-orphans-every 0)");
                    }
                    Err(e) => warn!(error = %e, "sweep failed; retrying at the next interval"),
                }
            }
        }
        .instrument(info_span!("orphan_sweep", every_s = every.as_secs())),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_by_default_with_a_control_plane_and_off_with_zero() {
        let five = Duration::from_secs(300);
        assert_eq!(interval(None, true), Some(DEFAULT_EVERY));
        assert_eq!(interval(None, false), None);
        assert_eq!(interval(Some(Duration::ZERO), true), None);
        assert_eq!(interval(Some(five * 2), false), Some(five * 2));
    }
}
