//! The one vocabulary of measurement phases, spelled as Argo Rollouts spells them
//! (`v1alpha1.AnalysisPhase` in `pkg/apis/rollouts/v1alpha1/analysis_types.go`).

use std::fmt;

use serde::{Deserialize, Serialize};

/// An Argo Rollouts measurement phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// not finished
    Running,
    /// the Job(s) completed
    Successful,
    /// a Job failed
    Failed,
    /// no verdict possible (image cannot be pulled)
    Inconclusive,
    /// the measurement could not be taken
    Error,
}

impl Phase {
    /// The Argo Rollouts spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Successful => "Successful",
            Self::Failed => "Failed",
            Self::Inconclusive => "Inconclusive",
            Self::Error => "Error",
        }
    }

    /// Whether the measurement is over.
    pub const fn is_terminal(self) -> bool {
        !matches!(self, Self::Running)
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Phase {
    type Err = UnknownPhase;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Self::Running,
            Self::Successful,
            Self::Failed,
            Self::Inconclusive,
            Self::Error,
        ]
        .into_iter()
        .find(|p| p.as_str() == s)
        .ok_or_else(|| UnknownPhase(s.to_string()))
    }
}

/// A string that is not one of Argo's measurement phases.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown measurement phase {0:?} (expected Running, Successful, Failed, Inconclusive or Error)"
)]
pub struct UnknownPhase(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_their_argo_spelling_and_json() {
        for p in ["Running", "Successful", "Failed", "Inconclusive", "Error"] {
            let phase: Phase = p.parse().unwrap();
            assert_eq!(phase.as_str(), p);
            assert_eq!(serde_json::to_string(&phase).unwrap(), format!("{p:?}"));
        }
        assert!("Pending".parse::<Phase>().is_err());
    }
}
