//! The net/rpc `Plugin` service of a metric provider, as `MetricsRPCServer` in rpc.go.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use dispatch_plugin::gob::{self, GobDecode};
use dispatch_plugin::rpc::{ready, unknown_method, Body, EncodeBody, Reply, ReplyFuture, Service};

use super::names;
use super::types::{
    AnalysisRun, GarbageCollectArgs, GetMetadataArgs, Measurement, Metric, RpcError, RunArgs,
    TerminateAndResumeArgs,
};

/// What a metric provider does; one method per `Plugin.*` RPC.
pub trait MetricProvider: Send + Sync + 'static {
    /// `Plugin.InitPlugin`, once per process after Dispense.
    fn init_plugin(self: Arc<Self>) -> impl Future<Output = RpcError> + Send;
    /// `Plugin.Run`: start a measurement.
    fn run(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
    ) -> impl Future<Output = Measurement> + Send;
    /// `Plugin.Resume`: check a measurement in flight.
    fn resume(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        measurement: Measurement,
    ) -> impl Future<Output = Measurement> + Send;
    /// `Plugin.Terminate`: stop a measurement in flight.
    fn terminate(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        measurement: Measurement,
    ) -> impl Future<Output = Measurement> + Send;
    /// `Plugin.GarbageCollect`: keep at most `limit` measurements' resources.
    fn garbage_collect(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        limit: i64,
    ) -> impl Future<Output = RpcError> + Send;
    /// `Plugin.Type`
    fn provider_type(&self) -> String;
    /// `Plugin.GetMetadata`: stored in the metric result when it is created.
    fn get_metadata(
        self: Arc<Self>,
        metric: Metric,
    ) -> impl Future<Output = BTreeMap<String, String>> + Send;
}

/// Serves a [`MetricProvider`] as the net/rpc service `Plugin`.
pub struct PluginService<P> {
    provider: Arc<P>,
}

impl<P: MetricProvider> PluginService<P> {
    /// Wraps `provider`.
    pub fn new(provider: Arc<P>) -> Self {
        Self { provider }
    }
}

fn reply<T: EncodeBody>(f: impl Future<Output = T> + Send + 'static) -> ReplyFuture {
    Box::pin(async move { Reply::ok(f.await) })
}

/// Decodes an interface argument of the registered `name`, or answers like Go's `invalid args`.
fn args<T: GobDecode>(body: Body<'_>, name: &str) -> Result<Result<T, ReplyFuture>, gob::Error> {
    Ok(body.decode_interface::<T>(name)?.map_err(|got| {
        ready(Reply::error(format!(
            "invalid args: want {name}, got {got}"
        )))
    }))
}

impl<P: MetricProvider> Service for PluginService<P> {
    fn name(&self) -> &str {
        "Plugin"
    }

    fn call(&self, method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error> {
        let p = Arc::clone(&self.provider);
        Ok(match method {
            "InitPlugin" => {
                body.skip()?;
                reply(p.init_plugin())
            }
            "Type" => {
                body.skip()?;
                ready(Reply::ok(p.provider_type()))
            }
            "Run" => match args::<RunArgs>(body, names::RUN_ARGS)? {
                Ok(a) => reply(p.run(a.analysis_run.unwrap_or_default(), a.metric)),
                Err(e) => e,
            },
            "Resume" | "Terminate" => {
                match args::<TerminateAndResumeArgs>(body, names::TERMINATE_AND_RESUME_ARGS)? {
                    Ok(a) if method == "Resume" => {
                        reply(p.resume(a.analysis_run.unwrap_or_default(), a.metric, a.measurement))
                    }
                    Ok(a) => reply(p.terminate(
                        a.analysis_run.unwrap_or_default(),
                        a.metric,
                        a.measurement,
                    )),
                    Err(e) => e,
                }
            }
            "GarbageCollect" => {
                match args::<GarbageCollectArgs>(body, names::GARBAGE_COLLECT_ARGS)? {
                    Ok(a) => reply(p.garbage_collect(
                        a.analysis_run.unwrap_or_default(),
                        a.metric,
                        a.limit,
                    )),
                    Err(e) => e,
                }
            }
            "GetMetadata" => match args::<GetMetadataArgs>(body, names::GET_METADATA_ARGS)? {
                Ok(a) => reply(p.get_metadata(a.metric)),
                Err(e) => e,
            },
            _ => return unknown_method(&format!("Plugin.{method}"), body),
        })
    }
}
