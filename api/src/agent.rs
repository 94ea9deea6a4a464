//! The agent's side of the `/v1` API (wire types): the agent long-polls its destination's work
//! and reports what it observed. Both calls need an agent token for that destination.

use serde::{Deserialize, Serialize};

use std::collections::BTreeMap;

use crate::observe::{ApplicationState, Observe, StageRef};
use crate::state::DestState;

/// `POST`: the work of a destination ([`WorkRequest`] → [`WorkReply`]).
pub const WORK: &str = "/v1/agents/{destination}/work";
/// `POST`: the agent's observations ([`ReportRequest`] → [`ReportReply`]).
pub const REPORT: &str = "/v1/agents/{destination}/report";
/// The longest a long poll is held open, whatever the agent asks.
pub const MAX_WAIT_SECONDS: u32 = 55;

/// The path of `template` for `destination` (percent-encoded: names may hold `:` or `/`).
pub fn path(template: &str, destination: &str) -> String {
    let mut encoded = String::with_capacity(destination.len());
    for b in destination.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    template.replace("{destination}", &encoded)
}

/// Long poll: answer at once when the work differs from `fingerprint`, else when it changes,
/// else after `wait_seconds`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkRequest {
    /// the fingerprint of the work the agent has (empty: none yet)
    #[serde(default)]
    pub fingerprint: String,
    /// how long to wait for a change (capped at [`MAX_WAIT_SECONDS`])
    #[serde(default)]
    pub wait_seconds: u32,
}

/// Every record of the destination.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkReply {
    /// send it back in the next [`WorkRequest`]
    pub fingerprint: String,
    /// the records, by name
    pub jobs: Vec<WorkItem>,
    /// logs to stream now, each `POST`ed to [`crate::logs::AGENT_LOGS`] with its id (absent for
    /// older servers; older agents ignore it). A request stays listed until its upload starts,
    /// so the agent skips the ids it already serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<crate::logs::LogRequest>,
}

/// The longest line of an agent's log upload (one JSON [`crate::logs::LogEvent`]): the server
/// cuts a longer one (a note says so); the agent cuts each line's text to stay below it.
pub const MAX_LOG_UPLOAD_LINE: usize = 64 << 10;

/// The longest one log upload may last (a followed log lasts as long as its containers run),
/// from the agent, and from a server replica forwarding it to the replica holding the reader.
pub const LOG_UPLOAD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// The path of [`crate::logs::AGENT_LOGS`] for `destination` and request `id`.
pub fn logs_path(destination: &str, id: &str) -> String {
    path(crate::logs::AGENT_LOGS, destination).replace("{id}", id)
}

/// The server's answer to a log upload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogUploadReply {
    /// events handed to the reader
    pub delivered: u64,
    /// the reader went away before the end: stop streaming
    #[serde(default)]
    pub reader_gone: bool,
}

/// One record as the agent sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkItem {
    /// the record name (what reports refer to)
    pub name: String,
    /// the Job to run or delete
    pub spec: DispatchJobSpec,
    /// an agent already reported on it: the Job was created once and is never created again
    /// (missing now means deleted)
    #[serde(default)]
    pub reported: bool,
}

/// What the agent observed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportRequest {
    /// one per record whose state changed
    pub reports: Vec<Report>,
}

/// The state of one record's Job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// the record
    pub name: String,
    /// the Job's state (or the observed object's); `None`: deleted as asked
    #[serde(default)]
    pub state: Option<DestState>,
    /// facts for the measurement's metadata, e.g. `analysisruns`: the observed Rollout's own
    /// AnalysisRuns (observe records only; the server prefixes and bounds them)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// the observed Application as Argo CD reports it (`application` records only)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<ApplicationState>,
}

impl Report {
    /// A report of `state` alone (no notes, no Application).
    pub fn new(name: impl Into<String>, state: Option<DestState>) -> Self {
        Self {
            name: name.into(),
            state,
            notes: BTreeMap::new(),
            application: None,
        }
    }
}

/// What the server did with a report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportReply {
    /// reports stored
    pub accepted: u32,
    /// records that no longer exist (the agent forgets them)
    #[serde(default)]
    pub unknown: Vec<String>,
}

/// What the server asks an agent to do for one Job.
///
/// The server signs every spec it writes ([`DispatchJobSpec::signature`]); the agent acts only on
/// specs signed by a key it pins, so whoever can write the records (the store is a Kubernetes
/// resource) gets nothing run, synced or uploaded.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchJobSpec {
    /// the agent destination
    pub destination: String,
    /// namespace of the Job there
    pub namespace: String,
    /// name of the Job (the same on every destination of the measurement)
    pub job_name: String,
    /// UID of the AnalysisRun: the Job's `rollouts-dispatch.io/run-uid` label
    pub run_uid: String,
    /// `namespace/name` of the AnalysisRun, for people
    #[serde(default)]
    pub run: String,
    /// the metric
    #[serde(default)]
    pub metric: String,
    /// the measurement index (the `n` of the Job name); orders garbage collection
    #[serde(default)]
    pub measurement: u32,
    /// log lines of a failed container the agent puts into its report
    #[serde(default)]
    pub log_tail: u32,
    /// the Job to create; `None`: only adopt an existing Job (a record recreated after the
    /// in-memory store was lost) or delete it
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<serde_json::Value>,
    /// delete the Job (terminate, garbage collection), then report `deleted`
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delete: bool,
    /// observe this instead of running a Job (`rollout:` and `application:` checks; `job` is
    /// `None`): the agent reads it in its own cluster and reports its state
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observe: Option<Observe>,
    /// ask Argo CD to sync the observed Application (the sync trigger; `application` only)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncOrder>,
    /// the Kargo Stage a record of the Application routes reads or syncs for: the agent
    /// serves the record only when the live Application's `kargo.akuity.io/authorized-stage`
    /// lists it (a record without it is refused)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_stage: Option<StageRef>,
    /// the Kargo project (the AnalysisRun's namespace) the work is for
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub project: String,
    /// after this (seconds since the epoch) the agent creates no Job and carries out no sync for
    /// the record: the measurement's deadline; 0: none (a record that only adopts or deletes)
    #[serde(default, skip_serializing_if = "is_zero")]
    pub deadline: u64,
    /// `v1.<key id>.<base64url Ed25519 signature>` by the server over the rest of the spec,
    /// `delete` left out (a deletion of our own Job is always allowed)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A sync of an Application asked through the API, carried out once by the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncOrder {
    /// unique per request: the agent writes it on the Application with the sync operation
    /// (annotation `rollouts-dispatch.io/sync-id`) and never carries out the same id twice,
    /// across its restarts too
    pub id: String,
    /// the revision to sync to; `None`: the Application's target revision
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `normal` or `hard`: the refresh asked first
    pub refresh: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_names_are_encoded_into_one_path_segment() {
        assert_eq!(path(WORK, "edge-1"), "/v1/agents/edge-1/work");
        assert_eq!(
            path(REPORT, "arn:aws:eks:eu-west-1:1:cluster/x"),
            "/v1/agents/arn%3Aaws%3Aeks%3Aeu-west-1%3A1%3Acluster%2Fx/report"
        );
    }
}
