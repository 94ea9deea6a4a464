//! The agent's side of the `/v1` API (pure types): the agent long-polls its destination's work
//! and reports what it observed. Both calls need an agent token for that destination.

use serde::{Deserialize, Serialize};

use crate::store::DispatchJobSpec;
use crate::verdict::DestState;

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
    /// the Job's state; `None`: deleted as asked
    #[serde(default)]
    pub state: Option<DestState>,
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
