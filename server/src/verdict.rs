//! Per-destination Job state → measurement phase, message and metadata (pure).
//!
//! [`observe`] reads one Job and its Pods; [`combine`] applies `require: all|any` across
//! destinations and writes the one-line-per-destination message.

use std::collections::BTreeMap;
use std::sync::Arc;

use dispatch_api::Require;
pub use dispatch_api::{DestState, Phase};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

/// Container waiting reasons that mean the image cannot be pulled (Argo's built-in provider
/// treats the same three as Inconclusive).
pub const IMAGE_PULL_REASONS: [&str; 3] = ["ErrImagePull", "ImagePullBackOff", "InvalidImageName"];

/// The state of one destination's Job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationStatus {
    /// the destination name
    pub destination: String,
    /// the namespace of the Job there
    pub namespace: String,
    /// its state
    pub state: DestState,
    /// facts of an observe check for the metadata, as `<note>.<destination>` (e.g.
    /// `analysisruns`: the observed Rollout's own AnalysisRuns); empty for Jobs
    pub notes: BTreeMap<String, String>,
}

/// The measurement outcome across all destinations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// the phase
    pub phase: Phase,
    /// one line per destination, then the log tails of failed containers
    pub message: String,
    /// measurement metadata (`destinations`, `require`, `state.<destination>`, and the Job
    /// reference added by the engine)
    pub metadata: BTreeMap<String, String>,
    /// per destination
    pub destinations: Vec<DestinationStatus>,
    /// `phase` is `Error` only because a destination was unavailable: the caller may keep the
    /// measurement running and retry until its own deadline
    pub retryable: bool,
}

/// Applies `require` to the per-destination states.
///
/// * `all`: any Failed → Failed; else any Error → Error; else any unavailable → Error
///   (retryable); else any image pull error → Inconclusive; else any Running → Running; else
///   Successful.
/// * `any`: any Successful → Successful; else any Running → Running; else any unavailable →
///   Error (retryable); else any Failed → Failed; else any Inconclusive → Inconclusive; else Error.
pub fn combine(require: Require, statuses: Vec<DestinationStatus>) -> Verdict {
    let has = |f: &dyn Fn(&DestState) -> bool| statuses.iter().any(|s| f(&s.state));
    let failed = has(&|s| matches!(s, DestState::Failed { .. }));
    let error = has(&|s| matches!(s, DestState::Error(_)));
    let unavailable = has(&|s| matches!(s, DestState::Unavailable(_)));
    let pull = has(&|s| matches!(s, DestState::ImagePull { .. }));
    let running = has(&|s| matches!(s, DestState::Running(_)));
    let succeeded = has(&|s| matches!(s, DestState::Succeeded));
    let (phase, retryable) = if statuses.is_empty() {
        (Phase::Error, false)
    } else {
        match require {
            Require::All if failed => (Phase::Failed, false),
            Require::All if error => (Phase::Error, false),
            Require::All if unavailable => (Phase::Error, true),
            Require::All if pull => (Phase::Inconclusive, false),
            Require::All if running => (Phase::Running, false),
            Require::All => (Phase::Successful, false),
            Require::Any if succeeded => (Phase::Successful, false),
            Require::Any if running => (Phase::Running, false),
            Require::Any if unavailable => (Phase::Error, true),
            Require::Any if failed => (Phase::Failed, false),
            Require::Any if pull => (Phase::Inconclusive, false),
            Require::Any => (Phase::Error, false),
        }
    };

    let mut lines: Vec<String> = statuses
        .iter()
        .map(|s| format!("{}: {}", s.destination, s.state.summary()))
        .collect();
    if statuses.is_empty() {
        lines.push("no destination".into());
    }
    for s in &statuses {
        if let DestState::Failed { log: Some(log), .. } = &s.state {
            lines.push(format!("--- {}: {log}", s.destination));
        }
    }

    let mut metadata = BTreeMap::new();
    metadata.insert(
        "destinations".to_string(),
        statuses
            .iter()
            .map(|s| s.destination.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    metadata.insert(
        "require".to_string(),
        match require {
            Require::All => "all",
            Require::Any => "any",
        }
        .to_string(),
    );
    for s in &statuses {
        metadata.insert(format!("state.{}", s.destination), s.state.short());
        for (note, value) in &s.notes {
            metadata.insert(format!("{note}.{}", s.destination), value.clone());
        }
    }
    Verdict {
        phase,
        message: lines.join("\n"),
        metadata,
        destinations: statuses,
        retryable,
    }
}

/// What one Job and its Pods say, before the log tail is added.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// not finished
    Running(Option<String>),
    /// condition Complete
    Succeeded,
    /// condition Failed
    Failed {
        /// the condition's reason
        reason: String,
        /// the condition's message
        message: String,
    },
    /// a container cannot pull its image
    ImagePull {
        /// the container
        container: String,
        /// the waiting reason
        reason: String,
        /// the waiting message
        message: String,
    },
}

/// Reads the Job's conditions and, while it runs, its Pods' container waiting reasons.
pub fn observe(job: &Job, pods: &[Arc<Pod>]) -> Observed {
    let conditions = job
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    for c in conditions {
        if c.status != "True" {
            continue;
        }
        match c.type_.as_str() {
            "Complete" => return Observed::Succeeded,
            "Failed" => {
                return Observed::Failed {
                    reason: c.reason.clone().unwrap_or_else(|| "Failed".into()),
                    message: c.message.clone().unwrap_or_default(),
                }
            }
            _ => {}
        }
    }
    for pod in pods {
        let Some(status) = &pod.status else { continue };
        let all = status
            .init_container_statuses
            .iter()
            .flatten()
            .chain(status.container_statuses.iter().flatten());
        for cs in all {
            let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                continue;
            };
            let reason = waiting.reason.as_deref().unwrap_or_default();
            if IMAGE_PULL_REASONS.contains(&reason) {
                return Observed::ImagePull {
                    container: cs.name.clone(),
                    reason: reason.to_string(),
                    message: waiting.message.clone().unwrap_or_default(),
                };
            }
        }
    }
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    if suspended {
        return Observed::Running(Some("suspended".into()));
    }
    let pending = pods.iter().find_map(|p| {
        let s = p.status.as_ref()?;
        if s.phase.as_deref() != Some("Pending") {
            return None;
        }
        let why = s
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .and_then(|c| c.reason.clone())
            .unwrap_or_else(|| "Pending".into());
        Some(format!(
            "pod {} {why}",
            p.metadata.name.as_deref().unwrap_or("?")
        ))
    });
    Observed::Running(pending)
}

/// Cuts `s` to at most `max` bytes on a char boundary, marking the cut.
#[cfg(test)]
mod tests {
    use super::*;
    use dispatch_api::state::{truncate, MAX_DETAIL};
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };

    fn st(dest: &str, state: DestState) -> DestinationStatus {
        DestinationStatus {
            destination: dest.into(),
            namespace: "ns".into(),
            state,
            notes: BTreeMap::new(),
        }
    }

    #[test]
    fn notes_go_into_the_metadata_per_destination() {
        let mut a = st("cluster-a", DestState::Succeeded);
        a.notes
            .insert("analysisruns".into(), "web-abc-2,web-abc-2-1".into());
        let v = combine(Require::All, vec![a, st("cluster-b", DestState::Succeeded)]);
        assert_eq!(
            v.metadata["analysisruns.cluster-a"],
            "web-abc-2,web-abc-2-1"
        );
        assert!(!v.metadata.contains_key("analysisruns.cluster-b"));
        assert_eq!(v.message.lines().count(), 2, "{}", v.message);
    }

    fn failed() -> DestState {
        DestState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "Job has reached the specified backoff limit".into(),
            log: Some("last 2 log lines of container \"check\":\nboom\nexit 1".into()),
        }
    }

    fn pull() -> DestState {
        DestState::ImagePull {
            container: "c".into(),
            reason: "ErrImagePull".into(),
            message: "not found".into(),
        }
    }

    #[test]
    fn require_all() {
        let v = combine(
            Require::All,
            vec![st("a", DestState::Succeeded), st("b", failed())],
        );
        assert_eq!(v.phase, Phase::Failed);
        let lines: Vec<&str> = v.message.lines().collect();
        assert_eq!(lines[0], "a: Successful");
        assert!(
            lines[1].starts_with("b: Failed: BackoffLimitExceeded: Job has"),
            "{}",
            lines[1]
        );
        assert!(
            v.message.contains("--- b: last 2 log lines"),
            "{}",
            v.message
        );
        assert!(v.message.ends_with("exit 1"));
        assert_eq!(v.metadata["state.a"], "Successful");
        assert_eq!(v.metadata["state.b"], "Failed: BackoffLimitExceeded");
        assert_eq!(v.metadata["destinations"], "a,b");
        assert_eq!(v.metadata["require"], "all");

        let run = |states: Vec<DestState>| {
            let v = combine(
                Require::All,
                states
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| st(&format!("d{i}"), s))
                    .collect(),
            );
            (v.phase, v.retryable)
        };
        assert_eq!(
            run(vec![DestState::Succeeded, DestState::Succeeded]),
            (Phase::Successful, false)
        );
        assert_eq!(
            run(vec![DestState::Succeeded, DestState::Running(None)]),
            (Phase::Running, false)
        );
        assert_eq!(
            run(vec![pull(), DestState::Running(None)]),
            (Phase::Inconclusive, false)
        );
        assert_eq!(
            run(vec![
                DestState::Unavailable("x".into()),
                DestState::Running(None)
            ]),
            (Phase::Error, true)
        );
        assert_eq!(
            run(vec![
                DestState::Error("gone".into()),
                DestState::Unavailable("x".into())
            ]),
            (Phase::Error, false)
        );
        assert_eq!(
            run(vec![failed(), DestState::Error("gone".into())]),
            (Phase::Failed, false)
        );
        assert_eq!(run(vec![]), (Phase::Error, false));
    }

    #[test]
    fn require_any() {
        let run = |states: Vec<DestState>| {
            let v = combine(
                Require::Any,
                states
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| st(&format!("d{i}"), s))
                    .collect(),
            );
            (v.phase, v.retryable)
        };
        assert_eq!(
            run(vec![failed(), DestState::Succeeded]),
            (Phase::Successful, false)
        );
        assert_eq!(
            run(vec![failed(), DestState::Running(None)]),
            (Phase::Running, false)
        );
        assert_eq!(
            run(vec![failed(), DestState::Unavailable("x".into())]),
            (Phase::Error, true)
        );
        assert_eq!(run(vec![failed(), pull()]), (Phase::Failed, false));
        assert_eq!(
            run(vec![pull(), DestState::Error("e".into())]),
            (Phase::Inconclusive, false)
        );
        assert_eq!(
            run(vec![DestState::Error("e".into())]),
            (Phase::Error, false)
        );
    }

    #[test]
    fn summaries_are_one_line_and_bounded() {
        let s = DestState::Error(format!("line1\nline2 {}", "x".repeat(2000))).summary();
        assert!(
            !s.contains('\n') && s.len() <= MAX_DETAIL && s.ends_with("..."),
            "{s}"
        );
        assert_eq!(
            pull().summary(),
            "Inconclusive: container \"c\" cannot pull its image: ErrImagePull: not found"
        );
        assert_eq!(pull().short(), "Inconclusive: ErrImagePull");
        assert_eq!(
            DestState::Running(Some("pod p Unschedulable".into())).summary(),
            "Running (pod p Unschedulable)"
        );
        assert!(DestState::Unavailable("down".into())
            .summary()
            .contains("will retry"));
        assert_eq!(truncate("héllo", 4), "h...");
    }

    fn job(conditions: &[(&str, &str, &str)]) -> Job {
        Job {
            spec: Some(JobSpec::default()),
            status: Some(JobStatus {
                conditions: Some(
                    conditions
                        .iter()
                        .map(|(t, s, r)| JobCondition {
                            type_: (*t).into(),
                            status: (*s).into(),
                            reason: Some((*r).into()),
                            message: Some(format!("{r} happened")),
                            ..JobCondition::default()
                        })
                        .collect(),
                ),
                ..JobStatus::default()
            }),
            ..Job::default()
        }
    }

    fn waiting_pod(reason: &str) -> Arc<Pod> {
        Arc::new(Pod {
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "check".into(),
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            message: Some("pull access denied".into()),
                        }),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
    }

    #[test]
    fn observe_reads_conditions_and_pods() {
        assert_eq!(
            observe(&job(&[("Complete", "True", "Done")]), &[]),
            Observed::Succeeded
        );
        assert_eq!(
            observe(
                &job(&[
                    ("Suspended", "False", "x"),
                    ("Failed", "True", "DeadlineExceeded")
                ]),
                &[]
            ),
            Observed::Failed {
                reason: "DeadlineExceeded".into(),
                message: "DeadlineExceeded happened".into()
            }
        );
        assert!(matches!(
            observe(&job(&[("Failed", "False", "x")]), &[]),
            Observed::Running(_)
        ));
        for reason in IMAGE_PULL_REASONS {
            assert_eq!(
                observe(&job(&[]), &[waiting_pod(reason)]),
                Observed::ImagePull {
                    container: "check".into(),
                    reason: reason.into(),
                    message: "pull access denied".into()
                }
            );
        }
        assert!(matches!(
            observe(&job(&[]), &[waiting_pod("ContainerCreating")]),
            Observed::Running(Some(d)) if d.contains("Pending")
        ));
        let mut suspended = job(&[]);
        suspended.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(
            observe(&suspended, &[]),
            Observed::Running(Some("suspended".into()))
        );
    }
}
