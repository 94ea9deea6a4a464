//! The state of one destination's Job: what the engine reads from a cluster and what an agent
//! reports for its own, so both are combined by the same rules.

use serde::{Deserialize, Serialize};

use crate::phase::Phase;

/// The most characters of one destination's detail in a message or metadata value.
pub const MAX_DETAIL: usize = 512;

/// What is known about the Job on one destination. Serializable: an agent reports it for its
/// destination and the server combines it like the state of a direct destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "camelCase")]
pub enum DestState {
    /// not finished; the detail says why, when useful (e.g. a pending pod)
    Running(Option<String>),
    /// the Job has condition Complete
    Succeeded,
    /// the Job has condition Failed
    Failed {
        /// the condition's reason (`BackoffLimitExceeded`, `DeadlineExceeded`, …)
        reason: String,
        /// the condition's message plus what is known of the failed container
        detail: String,
        /// the failed container's log tail, bounded and redacted
        log: Option<String>,
    },
    /// a container cannot get its image (the kubelet keeps trying: Inconclusive, like Argo's
    /// job provider)
    ImagePull {
        /// the pod (absent from the reports of agents older than this field)
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pod: String,
        /// the container
        container: String,
        /// `ErrImagePull`, `ImagePullBackOff`, `ErrImageNeverPull`, `ImageInspectError`,
        /// `RegistryUnavailable` or `SignatureValidationFailed`
        reason: String,
        /// the kubelet's message
        message: String,
    },
    /// the destination cannot be reached right now (connection, timeout, 5xx): worth retrying
    Unavailable(String),
    /// a permanent problem (forbidden, Job gone, destination unknown)
    Error(String),
}

impl DestState {
    /// Whether asking again may change it: the destination could not be reached.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_))
    }

    /// Whether the Job's verdict can no longer change: it succeeded, failed, or hit a permanent
    /// error. Running, an image pull error (the kubelet keeps pulling) and an unreachable API can
    /// still change.
    pub fn is_final(&self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed { .. } | Self::Error(_))
    }

    /// The measurement phase this state alone would give.
    pub fn phase(&self) -> Phase {
        match self {
            Self::Running(_) => Phase::Running,
            Self::Succeeded => Phase::Successful,
            Self::Failed { .. } => Phase::Failed,
            Self::ImagePull { .. } => Phase::Inconclusive,
            Self::Unavailable(_) | Self::Error(_) => Phase::Error,
        }
    }

    /// One line: the phase and the detail (no log tail).
    pub fn summary(&self) -> String {
        let line = match self {
            Self::Running(None) => "Running".to_string(),
            Self::Running(Some(d)) => format!("Running ({d})"),
            Self::Succeeded => "Successful".to_string(),
            Self::Failed { reason, detail, .. } if detail.is_empty() => format!("Failed: {reason}"),
            Self::Failed { reason, detail, .. } => format!("Failed: {reason}: {detail}"),
            Self::ImagePull {
                pod,
                container,
                reason,
                message,
            } => format!(
                "Inconclusive: {}container {container:?} cannot pull its image: {reason}{}",
                if pod.is_empty() {
                    String::new()
                } else {
                    format!("pod {pod} ")
                },
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ),
            Self::Unavailable(m) => format!("Error: {m} (will retry)"),
            Self::Error(m) => format!("Error: {m}"),
        };
        truncate(&line.replace('\n', " "), MAX_DETAIL)
    }

    /// The same state with every text cut to `max_detail` bytes and the log tail to `max_log`
    /// (with `...` where cut): what the server keeps of an agent's report, whatever its size.
    #[must_use]
    pub fn bounded(self, max_detail: usize, max_log: usize) -> Self {
        let cut = |s: String| {
            if s.len() <= max_detail {
                s
            } else {
                truncate(&s, max_detail)
            }
        };
        match self {
            Self::Running(d) => Self::Running(d.map(cut)),
            Self::Succeeded => Self::Succeeded,
            Self::Failed {
                reason,
                detail,
                log,
            } => Self::Failed {
                reason: cut(reason),
                detail: cut(detail),
                log: log.map(|l| {
                    if l.len() <= max_log {
                        l
                    } else {
                        truncate(&l, max_log)
                    }
                }),
            },
            Self::ImagePull {
                pod,
                container,
                reason,
                message,
            } => Self::ImagePull {
                pod: cut(pod),
                container: cut(container),
                reason: cut(reason),
                message: cut(message),
            },
            Self::Unavailable(m) => Self::Unavailable(cut(m)),
            Self::Error(m) => Self::Error(cut(m)),
        }
    }

    /// The short form for measurement metadata.
    pub fn short(&self) -> String {
        match self {
            Self::Failed { reason, .. } => format!("Failed: {reason}"),
            Self::ImagePull { reason, .. } => format!("Inconclusive: {reason}"),
            other => other.summary(),
        }
    }
}

/// `s` cut to at most `max` bytes on a character boundary, with `...` when cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_cuts_every_text_and_keeps_small_ones() {
        let big = "é".repeat(100_000);
        let failed = DestState::Failed {
            reason: big.clone(),
            detail: big.clone(),
            log: Some(big.clone()),
        }
        .bounded(MAX_DETAIL, 4096);
        let DestState::Failed {
            reason,
            detail,
            log,
        } = failed
        else {
            panic!("the variant changed")
        };
        assert!(reason.len() <= MAX_DETAIL && reason.ends_with("..."));
        assert!(detail.len() <= MAX_DETAIL);
        assert!(log.unwrap().len() <= 4096);
        for s in [
            DestState::Running(Some(big.clone())),
            DestState::Unavailable(big.clone()),
            DestState::Error(big.clone()),
            DestState::ImagePull {
                pod: big.clone(),
                container: big.clone(),
                reason: big.clone(),
                message: big.clone(),
            },
        ] {
            let json = serde_json::to_string(&s.bounded(MAX_DETAIL, 4096)).unwrap();
            assert!(json.len() < 5 * MAX_DETAIL, "{}", json.len());
        }
        let small = DestState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "exit 1".into(),
            log: Some("boom".into()),
        };
        assert_eq!(small.clone().bounded(MAX_DETAIL, 4096), small);
    }

    #[test]
    fn an_image_pull_report_without_its_pod_still_reads() {
        // What an agent from before `pod` reports, and what it reads of ours.
        let old = r#"{"kind":"imagePull","detail":{"container":"c","reason":"ErrImagePull","message":"m"}}"#;
        let s: DestState = serde_json::from_str(old).unwrap();
        assert_eq!(
            s.summary(),
            "Inconclusive: container \"c\" cannot pull its image: ErrImagePull: m"
        );
        assert_eq!(serde_json::to_string(&s).unwrap(), old);
        let with_pod = DestState::ImagePull {
            pod: "p-1".into(),
            container: "c".into(),
            reason: "ImagePullBackOff".into(),
            message: String::new(),
        };
        assert_eq!(
            with_pod.summary(),
            "Inconclusive: pod p-1 container \"c\" cannot pull its image: ImagePullBackOff"
        );
    }
}
