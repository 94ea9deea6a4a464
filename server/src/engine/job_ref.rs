//! The reference to a measurement's Jobs that lives in the measurement's metadata: where
//! they are, so that any replica (or a restarted one) can answer without state of its own.

use std::collections::BTreeMap;

use dispatch_api::Require;
use serde::{Deserialize, Serialize};

/// The measurement's metadata holds no usable [`JobRef`].
#[derive(Debug, thiserror::Error)]
pub enum JobRefError {
    /// no `dispatch-ref` key
    #[error("the measurement has no {REF_KEY} metadata: it was not started by this server")]
    Missing,
    /// the key is there, its JSON is not a reference
    #[error("the measurement's {REF_KEY} metadata is unreadable: {0}")]
    Unreadable(#[from] serde_json::Error),
    /// more placements than any measurement of this server has
    #[error(
        "the measurement's {REF_KEY} metadata lists {0} destinations, more than the {max} this \
         server ever places; it was not written by this server",
        max = super::MAX_PLACEMENTS
    )]
    TooManyPlacements(usize),
}

/// Measurement metadata key holding the [`JobRef`] as JSON.
pub const REF_KEY: &str = "dispatch-ref";
/// Measurement metadata key with the Job name (as Argo's built-in provider).
pub const JOB_NAME_KEY: &str = "job-name";
/// Measurement metadata key with the Job namespace (of the first destination).
pub const JOB_NAMESPACE_KEY: &str = "job-namespace";

/// One destination of a measurement and the namespace of its Job there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// destination name
    pub destination: String,
    /// namespace there
    pub namespace: String,
}

/// Everything needed to find a measurement's Jobs again; round-trips through measurement
/// metadata ([`JobRef::metadata`], [`JobRef::from_metadata`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRef {
    /// the AnalysisRun's UID
    pub run_uid: String,
    /// the Job name (the same on every destination)
    pub name: String,
    /// `all` or `any`
    pub require: Require,
    /// log lines of a failed container in the message
    pub log_tail: u32,
    /// where the Jobs are
    pub placements: Vec<Placement>,
}

impl JobRef {
    /// The measurement metadata for this reference.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(JOB_NAME_KEY.to_string(), self.name.clone());
        if let Some(p) = self.placements.first() {
            m.insert(JOB_NAMESPACE_KEY.to_string(), p.namespace.clone());
        }
        // Serializing plain strings and numbers cannot fail.
        m.insert(
            REF_KEY.to_string(),
            serde_json::to_string(self).unwrap_or_default(),
        );
        m
    }

    /// Where the Jobs are, `destination/namespace` comma-separated (for spans and logs).
    pub fn destinations(&self) -> String {
        self.placements
            .iter()
            .map(|p| format!("{}/{}", p.destination, p.namespace))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The reference stored by [`JobRef::metadata`].
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, JobRefError> {
        let json = metadata.get(REF_KEY).ok_or(JobRefError::Missing)?;
        let job: Self = serde_json::from_str(json)?;
        if job.placements.len() > super::MAX_PLACEMENTS {
            return Err(JobRefError::TooManyPlacements(job.placements.len()));
        }
        Ok(job)
    }
}
