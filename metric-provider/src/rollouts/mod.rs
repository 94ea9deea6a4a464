//! Mirrors argo-rollouts `metricproviders/plugin/rpc/rpc.go`: names, argument and reply types,
//! the [`MetricProvider`] trait and the net/rpc `Plugin` service that calls it.

mod service;
mod types;

pub use service::{MetricProvider, PluginService};
pub use types::*;

/// The magic cookie key Argo Rollouts sets for every plugin kind.
pub const MAGIC_COOKIE_KEY: &str = "ARGO_ROLLOUTS_RPC_PLUGIN";
/// The magic cookie value for metric providers.
pub const MAGIC_COOKIE_VALUE: &str = "metricprovider";
/// The name the controller dispenses.
pub const DISPENSE_NAME: &str = "RpcMetricProviderPlugin";
/// The type Argo reports for every plugin metric.
pub const PROVIDER_TYPE: &str = "RPCPlugin";

/// Gob names of the interface-typed arguments (`gob.RegisterName` in rpc.go).
pub mod names {
    /// `Plugin.Run`
    pub const RUN_ARGS: &str = "RunArgs";
    /// `Plugin.Resume` and `Plugin.Terminate`
    pub const TERMINATE_AND_RESUME_ARGS: &str = "TerminateAndResumeArgs";
    /// `Plugin.GarbageCollect`
    pub const GARBAGE_COLLECT_ARGS: &str = "GarbageCollectArgs";
    /// `Plugin.GetMetadata`
    pub const GET_METADATA_ARGS: &str = "GetMetadataArgs";
}
