//! The JSON API between the plugin and the rollouts-dispatch server (`/v1`), shared by both sides.
//!
//! The plugin is thin: it sends the run's identity and the plugin block as the controller resolved
//! it, and keeps what it needs to find the Jobs again in the measurement's metadata, so no state
//! lives in the plugin process (a restarted controller relaunches it and carries on).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The API version prefix.
pub const PREFIX: &str = "/v1";
/// `POST`: create (or adopt) the Jobs of one measurement on its destinations.
pub const ENSURE: &str = "/v1/measurements/ensure";
/// `POST`: the verdict of one measurement so far.
pub const STATUS: &str = "/v1/measurements/status";
/// `POST`: delete the Jobs of one measurement (foreground) on every destination.
pub const TERMINATE: &str = "/v1/measurements/terminate";
/// `POST`: keep only the newest Jobs of a run.
pub const GC: &str = "/v1/gc";
/// `GET`: the destinations this server knows ([`DestinationInfo`] rows).
pub const DESTINATIONS: &str = "/v1/destinations";
/// `GET ?epoch=&after=&waitSeconds=`: resume hints, a long poll ([`HintPage`]).
pub const HINTS: &str = "/v1/measurements/hints";
/// The longest `waitSeconds` of [`HINTS`] the server holds a request for.
pub const MAX_HINT_WAIT_SECONDS: u32 = 30;

/// Measurement metadata set by Terminate: comma-separated destinations whose Jobs were not
/// deleted yet (the server retries them; `unknown` when the plugin could not reach the server).
pub const PENDING_DELETIONS_KEY: &str = "pending-deletions";

/// Which AnalysisRun a request is about.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRef {
    /// name, e.g. `uat.01jabc….abc1234`
    pub name: String,
    /// namespace: the Kargo project
    pub namespace: String,
    /// uid: part of every Job name
    pub uid: String,
    /// labels (`kargo.akuity.io/stage`, …)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// annotations (`kargo.akuity.io/promotion`, …)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// Identifies one measurement's Jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MeasurementRef {
    /// the run
    pub run: RunRef,
    /// the metric name
    pub metric: String,
    /// 1-based index of the measurement (count + error + 1), as in Argo's built-in job provider
    pub index: u32,
    /// the plugin block as the controller resolved it (compact JSON object)
    pub block: serde_json::Value,
    /// the measurement's metadata so far (empty for `ensure`): where the server keeps the
    /// reference to the Jobs, so that any replica can answer
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
}

/// Reply to [`ENSURE`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ensured {
    /// the Job name (the same on every destination)
    pub job_name: String,
    /// the namespace on the destinations
    pub namespace: String,
    /// the destinations the Job was created on or adopted from
    pub destinations: Vec<String>,
    /// to store in the measurement's metadata and send back with every later call
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Reply to [`STATUS`] (and [`TERMINATE`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// `Running`, `Successful`, `Failed`, `Inconclusive` or `Error`
    pub phase: String,
    /// one line per destination; on failure the tail of the failed container's log
    #[serde(default)]
    pub message: String,
    /// per-destination states and facts for the measurement's metadata
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// Body of [`GC`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GcRequest {
    /// the run
    pub run: RunRef,
    /// the metric
    pub metric: String,
    /// how many measurements the controller keeps
    pub limit: u32,
    /// the plugin block, to find the destinations
    pub block: serde_json::Value,
}

/// One row of `GET /v1/destinations`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DestinationInfo {
    /// the name used in plugin blocks
    pub name: String,
    /// where it was defined: `config`, `kubeconfig`, `argocd-secret`, `argocd-instance` (the
    /// cluster an Argo CD instance with `kubeconfig` runs on) or `agent`
    pub source: String,
    /// labels for `destinationSelector`
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// the namespace Jobs go to when the block sets none
    pub default_namespace: String,
    /// whether the destination (or its agent) is reachable now
    pub connected: bool,
    /// RFC 3339 time of the last successful contact, if any
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_contact: Option<String>,
    /// what to know before trusting it, e.g. `insecure: TLS certificates are not verified …`
    /// (absent from older servers: empty)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Reply of `POST /v1/gc`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReply {
    /// how many Jobs were deleted
    pub deleted: u32,
}

/// Every error reply: a stable code and a message meant for the person reading the AnalysisRun.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// e.g. `unknown_destination`, `forbidden`, `invalid_block`, `unauthenticated`, `internal`
    pub code: String,
    /// what happened and what to do
    pub message: String,
}

/// A nudge: a Job of this measurement has finished on some destination, so its verdict may be
/// ready. Never a verdict itself (the plugin asks `status` for that); hints of measurements the
/// plugin has not in flight are dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeHint {
    /// the AnalysisRun's namespace (the Kargo project)
    pub namespace: String,
    /// the AnalysisRun's UID
    pub run_uid: String,
    /// the Job name (the same on every destination of the measurement)
    pub job: String,
}

/// One answer of [`HINTS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HintPage {
    /// the server process's epoch: send it back with `after`
    pub epoch: String,
    /// the number to send as `after` next time
    pub cursor: u64,
    /// the hints after the `after` asked, for the caller's projects
    pub hints: Vec<ResumeHint>,
    /// hints may have been missed (a first call, another server process, a reader too far
    /// behind): whatever is in flight may have finished unseen
    pub reset: bool,
}

/// The query of [`HINTS`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HintQuery {
    /// the epoch of the last page, if any
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<String>,
    /// the cursor of the last page, if any
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    /// how long to wait for a hint (at most [`MAX_HINT_WAIT_SECONDS`]); 0: answer at once
    #[serde(default)]
    pub wait_seconds: u32,
}
