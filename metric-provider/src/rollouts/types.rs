//! The Argo Rollouts types that cross the plugin boundary, mirrored by Go field name.
//!
//! Only the fields the provider reads are declared; gob skips the rest (the whole `batch/v1`
//! Job graph of other providers, `managedFields`, …) using the wire types. Source:
//! argo-rollouts `pkg/apis/rollouts/v1alpha1/analysis_types.go` and apimachinery `ObjectMeta`.

use std::collections::BTreeMap;

use dispatch_plugin::gob::{GoBytes, GoTime};
use dispatch_plugin::gob_struct;

/// `map[string]string`
pub type StringMap = BTreeMap<String, String>;

gob_struct! {
    /// `rpc.RunArgs`: the argument of `Plugin.Run`.
    pub struct RunArgs as "RunArgs" {
        /// the run, with every measurement so far
        pub analysis_run: Option<AnalysisRun> => "AnalysisRun",
        /// the metric with `{{args.*}}` resolved
        pub metric: Metric => "Metric",
    }
}

gob_struct! {
    /// `rpc.TerminateAndResumeArgs`: the argument of `Plugin.Resume` and `Plugin.Terminate`.
    pub struct TerminateAndResumeArgs as "TerminateAndResumeArgs" {
        /// the run
        pub analysis_run: Option<AnalysisRun> => "AnalysisRun",
        /// the metric
        pub metric: Metric => "Metric",
        /// the measurement in flight
        pub measurement: Measurement => "Measurement",
    }
}

gob_struct! {
    /// `rpc.GarbageCollectArgs`: the argument of `Plugin.GarbageCollect`.
    pub struct GarbageCollectArgs as "GarbageCollectArgs" {
        /// the run
        pub analysis_run: Option<AnalysisRun> => "AnalysisRun",
        /// the metric, args resolved without secrets
        pub metric: Metric => "Metric",
        /// how many measurements to keep
        pub limit: i64 => "Limit",
    }
}

gob_struct! {
    /// `rpc.GetMetadataArgs`: the argument of `Plugin.GetMetadata`.
    pub struct GetMetadataArgs as "GetMetadataArgs" {
        /// the metric
        pub metric: Metric => "Metric",
    }
}

gob_struct! {
    /// `types.RpcError`: the reply of `InitPlugin` and `GarbageCollect`; empty means success.
    pub struct RpcError as "RpcError" {
        /// the error text, empty on success
        pub error_string: String => "ErrorString",
    }
}

gob_struct! {
    /// `v1alpha1.Measurement`: the reply of `Run`, `Resume` and `Terminate`.
    pub struct Measurement as "Measurement" {
        /// `Pending`, `Running`, `Successful`, `Failed`, `Error` or `Inconclusive`
        pub phase: String => "Phase",
        /// shown in the AnalysisRun status
        pub message: String => "Message",
        /// when the measurement started
        pub started_at: Option<GoTime> => "StartedAt",
        /// when it finished; `None` while in flight
        pub finished_at: Option<GoTime> => "FinishedAt",
        /// the measured value
        pub value: String => "Value",
        /// provider state carried between calls
        pub metadata: StringMap => "Metadata",
        /// when the controller should call `Resume` again
        pub resume_at: Option<GoTime> => "ResumeAt",
    }
}

gob_struct! {
    /// `v1alpha1.AnalysisRun`
    pub struct AnalysisRun as "AnalysisRun" {
        /// metadata
        pub object_meta: ObjectMeta => "ObjectMeta",
        /// spec
        pub spec: AnalysisRunSpec => "Spec",
        /// status
        pub status: AnalysisRunStatus => "Status",
    }
}

gob_struct! {
    /// `metav1.ObjectMeta` (the fields we use)
    pub struct ObjectMeta as "ObjectMeta" {
        /// name
        pub name: String => "Name",
        /// namespace (the Kargo project)
        pub namespace: String => "Namespace",
        /// uid
        pub uid: String => "UID",
        /// resourceVersion
        pub resource_version: String => "ResourceVersion",
        /// generation
        pub generation: i64 => "Generation",
        /// creationTimestamp
        pub creation_timestamp: Option<GoTime> => "CreationTimestamp",
        /// labels
        pub labels: StringMap => "Labels",
        /// annotations
        pub annotations: StringMap => "Annotations",
        /// ownerReferences
        pub owner_references: Vec<OwnerReference> => "OwnerReferences",
    }
}

gob_struct! {
    /// `metav1.OwnerReference`
    pub struct OwnerReference as "OwnerReference" {
        /// apiVersion
        pub api_version: String => "APIVersion",
        /// kind
        pub kind: String => "Kind",
        /// name
        pub name: String => "Name",
        /// uid
        pub uid: String => "UID",
        /// controller
        pub controller: Option<bool> => "Controller",
        /// blockOwnerDeletion
        pub block_owner_deletion: Option<bool> => "BlockOwnerDeletion",
    }
}

gob_struct! {
    /// `v1alpha1.AnalysisRunSpec`
    pub struct AnalysisRunSpec as "AnalysisRunSpec" {
        /// metrics
        pub metrics: Vec<Metric> => "Metrics",
        /// args (values of secret args are resolved in place for Run/Resume/Terminate)
        pub args: Vec<Argument> => "Args",
        /// set by Kargo to abort verification
        pub terminate: bool => "Terminate",
        /// dryRun
        pub dry_run: Vec<DryRun> => "DryRun",
        /// measurementRetention
        pub measurement_retention: Vec<MeasurementRetention> => "MeasurementRetention",
    }
}

gob_struct! {
    /// `v1alpha1.Argument`
    pub struct Argument as "Argument" {
        /// name
        pub name: String => "Name",
        /// value
        pub value: Option<String> => "Value",
        /// valueFrom
        pub value_from: Option<ValueFrom> => "ValueFrom",
    }
}

gob_struct! {
    /// `v1alpha1.ValueFrom`
    pub struct ValueFrom as "ValueFrom" {
        /// secretKeyRef
        pub secret_key_ref: Option<SecretKeyRef> => "SecretKeyRef",
        /// fieldRef
        pub field_ref: Option<FieldRef> => "FieldRef",
    }
}

gob_struct! {
    /// `v1alpha1.SecretKeyRef`
    pub struct SecretKeyRef as "SecretKeyRef" {
        /// secret name
        pub name: String => "Name",
        /// key
        pub key: String => "Key",
    }
}

gob_struct! {
    /// `v1alpha1.FieldRef`
    pub struct FieldRef as "FieldRef" {
        /// fieldPath
        pub field_path: String => "FieldPath",
    }
}

gob_struct! {
    /// `v1alpha1.DryRun`
    pub struct DryRun as "DryRun" {
        /// metricName
        pub metric_name: String => "MetricName",
    }
}

gob_struct! {
    /// `v1alpha1.MeasurementRetention`
    pub struct MeasurementRetention as "MeasurementRetention" {
        /// metricName
        pub metric_name: String => "MetricName",
        /// limit
        pub limit: i32 => "Limit",
    }
}

gob_struct! {
    /// `v1alpha1.AnalysisRunStatus`
    pub struct AnalysisRunStatus as "AnalysisRunStatus" {
        /// phase
        pub phase: String => "Phase",
        /// message
        pub message: String => "Message",
        /// metricResults
        pub metric_results: Vec<MetricResult> => "MetricResults",
        /// startedAt
        pub started_at: Option<GoTime> => "StartedAt",
        /// completedAt
        pub completed_at: Option<GoTime> => "CompletedAt",
    }
}

gob_struct! {
    /// `v1alpha1.MetricResult`
    pub struct MetricResult as "MetricResult" {
        /// metric name
        pub name: String => "Name",
        /// phase
        pub phase: String => "Phase",
        /// measurements, oldest first
        pub measurements: Vec<Measurement> => "Measurements",
        /// message
        pub message: String => "Message",
        /// count
        pub count: i32 => "Count",
        /// successful
        pub successful: i32 => "Successful",
        /// failed
        pub failed: i32 => "Failed",
        /// inconclusive
        pub inconclusive: i32 => "Inconclusive",
        /// error
        pub error: i32 => "Error",
        /// consecutiveError
        pub consecutive_error: i32 => "ConsecutiveError",
        /// dryRun
        pub dry_run: bool => "DryRun",
        /// metadata from GetMetadata
        pub metadata: StringMap => "Metadata",
        /// consecutiveSuccess
        pub consecutive_success: i32 => "ConsecutiveSuccess",
    }
}

gob_struct! {
    /// `v1alpha1.Metric`
    pub struct Metric as "Metric" {
        /// name
        pub name: String => "Name",
        /// interval
        pub interval: String => "Interval",
        /// initialDelay
        pub initial_delay: String => "InitialDelay",
        /// count
        pub count: Option<IntOrString> => "Count",
        /// successCondition (not evaluated by the controller for plugins)
        pub success_condition: String => "SuccessCondition",
        /// failureCondition
        pub failure_condition: String => "FailureCondition",
        /// failureLimit
        pub failure_limit: Option<IntOrString> => "FailureLimit",
        /// inconclusiveLimit
        pub inconclusive_limit: Option<IntOrString> => "InconclusiveLimit",
        /// consecutiveErrorLimit
        pub consecutive_error_limit: Option<IntOrString> => "ConsecutiveErrorLimit",
        /// provider
        pub provider: MetricProvider => "Provider",
    }
}

gob_struct! {
    /// `v1alpha1.MetricProvider`: only the plugin map; built-in providers are skipped.
    pub struct MetricProvider as "MetricProvider" {
        /// `"<namespace>/<name>"` → the plugin block as compact JSON
        pub plugin: BTreeMap<String, GoBytes> => "Plugin",
    }
}

gob_struct! {
    /// `intstr.IntOrString`
    pub struct IntOrString as "IntOrString" {
        /// 0 = int, 1 = string
        pub kind: i64 => "Type",
        /// the int value
        pub int_val: i32 => "IntVal",
        /// the string value
        pub str_val: String => "StrVal",
    }
}

/// Measurement phases (`v1alpha1.AnalysisPhase`) as the strings the gob wire carries, spelled
/// once in [`dispatch_api::Phase`].
pub mod phase {
    use dispatch_api::Phase;

    /// in flight
    pub const RUNNING: &str = Phase::Running.as_str();
    /// passed
    pub const SUCCESSFUL: &str = Phase::Successful.as_str();
    /// failed
    pub const FAILED: &str = Phase::Failed.as_str();
    /// could not be measured; counts toward `consecutiveErrorLimit`
    pub const ERROR: &str = Phase::Error.as_str();
    /// neither passed nor failed
    pub const INCONCLUSIVE: &str = Phase::Inconclusive.as_str();
}

impl Measurement {
    /// A finished `Error` measurement with `message`, as the controller shows it.
    pub fn error(message: impl Into<String>) -> Self {
        let now = GoTime::now();
        Self {
            phase: phase::ERROR.into(),
            message: message.into(),
            started_at: Some(now),
            finished_at: Some(now),
            ..Self::default()
        }
    }
}
