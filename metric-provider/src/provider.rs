//! The rollouts-dispatch metric provider: validates the plugin block and (in a later release)
//! forwards each call to the rollouts-dispatch server.

use std::collections::BTreeMap;
use std::sync::Arc;

use dispatch_plugin::gob::GoTime;
use tracing::{info, warn};

use crate::config::JobConfig;
use crate::rollouts::{
    phase, AnalysisRun, Measurement, Metric, MetricProvider, RpcError, PROVIDER_TYPE,
};

/// The message of every measurement while no server is configured.
pub const NO_SERVER: &str = "no server configured (set --server / ROLLOUTS_DISPATCH_SERVER)";

/// Provider settings from the plugin's `args` in `argo-rollouts-config` or its environment.
#[derive(Debug, Clone, Default)]
pub struct ProviderConfig {
    /// The rollouts-dispatch server URL.
    pub server: Option<String>,
}

/// The metric provider behind `rollouts-dispatch/job`.
#[derive(Debug)]
pub struct DispatchProvider {
    config: ProviderConfig,
}

impl DispatchProvider {
    /// A provider with `config`.
    pub fn new(config: ProviderConfig) -> Self {
        Self { config }
    }

    /// Validates the metric's block; the error is the measurement's message.
    fn job_config(metric: &Metric) -> Result<JobConfig, String> {
        JobConfig::from_plugin_map(
            &metric.name,
            metric
                .provider
                .plugin
                .iter()
                .map(|(k, v)| (k, v.0.as_slice())),
        )
        .map_err(|e| e.to_string())
    }

    /// What happens to a valid block: forwarding to the server is not in this release yet.
    fn unavailable(&self) -> String {
        match &self.config.server {
            None => NO_SERVER.to_string(),
            Some(url) => format!(
                "server {url} is configured, but this build of rollouts-dispatch-plugin cannot forward to it yet \
                 (upgrade the plugin)"
            ),
        }
    }

    fn measure(&self, run: &AnalysisRun, metric: &Metric, call: &'static str) -> Measurement {
        let run_ref = format!("{}/{}", run.object_meta.namespace, run.object_meta.name);
        match Self::job_config(metric) {
            Err(message) => {
                warn!(call, run = %run_ref, metric = %metric.name, %message, "invalid plugin block");
                Measurement::error(message)
            }
            Ok(cfg) => {
                let message = self.unavailable();
                warn!(call, run = %run_ref, metric = %metric.name, destination = %cfg.target_display(), %message,
                      "cannot dispatch the measurement");
                Measurement::error(message)
            }
        }
    }
}

impl MetricProvider for DispatchProvider {
    async fn init_plugin(self: Arc<Self>) -> RpcError {
        info!(
            server = self.config.server.as_deref().unwrap_or("none"),
            "InitPlugin"
        );
        RpcError::default()
    }

    async fn run(self: Arc<Self>, run: AnalysisRun, metric: Metric) -> Measurement {
        self.measure(&run, &metric, "Run")
    }

    async fn resume(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        _measurement: Measurement,
    ) -> Measurement {
        self.measure(&run, &metric, "Resume")
    }

    /// Nothing can be running without a server, so there is nothing to stop: the measurement ends.
    async fn terminate(
        self: Arc<Self>,
        _run: AnalysisRun,
        _metric: Metric,
        mut measurement: Measurement,
    ) -> Measurement {
        measurement.phase = phase::INCONCLUSIVE.into();
        measurement.message = "terminated before a Job was dispatched".into();
        measurement.finished_at = Some(GoTime::now());
        measurement.resume_at = None;
        measurement
    }

    async fn garbage_collect(
        self: Arc<Self>,
        _run: AnalysisRun,
        _metric: Metric,
        _limit: i64,
    ) -> RpcError {
        RpcError::default()
    }

    fn provider_type(&self) -> String {
        PROVIDER_TYPE.to_string()
    }

    async fn get_metadata(self: Arc<Self>, metric: Metric) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match Self::job_config(&metric) {
            Ok(cfg) => {
                out.insert("plugin-version".into(), crate::VERSION.into());
                out.insert("destination".into(), cfg.target_display());
            }
            Err(e) => {
                out.insert("error".into(), e);
            }
        }
        out
    }
}
