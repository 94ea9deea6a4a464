//! Per-destination Job state → measurement phase, message and metadata (pure).
//!
//! [`observe`] reads one Job and its Pods (the pods that do not run: `waiting`); [`combine`]
//! applies `require: all|any` across destinations and writes the one-line-per-destination
//! message.

use std::collections::BTreeMap;
use std::sync::Arc;

use dispatch_api::Require;
pub use dispatch_api::{DestState, Phase};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

mod waiting;

pub use waiting::{Graces, CRASH_LOOP, IMAGE_PULL_REASONS, INVALID_IMAGE, START_REASONS};

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
    /// an observe check's `state` is what a reading of the observed objects said: read now
    /// from a direct destination, or last reported by an agent that is still connected. False
    /// for Jobs and whenever nothing could be read; past the deadline it decides between
    /// `Failed` (what was seen is the answer) and `Error` ([`crate::engine::Engine::past_deadline`])
    pub seen: bool,
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
    /// a container cannot get its image (Inconclusive)
    ImagePull {
        /// the pod
        pod: String,
        /// the container
        container: String,
        /// the waiting reason
        reason: String,
        /// the waiting message
        message: String,
    },
    /// a pod cannot start a container or be scheduled, past its grace (or ever: an image name
    /// that does not parse): the measurement is an Error with this line, which names the pod,
    /// the container, the reason and the kubelet's (or scheduler's) message
    Error(String),
    /// a container ran, failed and waits for its restart (`CrashLoopBackOff`): Failed, with the
    /// log of its last run
    CrashLoop {
        /// the pod
        pod: String,
        /// the container
        container: String,
        /// the kubelet's message (`back-off 40s restarting failed container=…`)
        message: String,
        /// how often it was restarted
        restarts: i32,
    },
}

/// Reads the Job's conditions and, while it runs, what its Pods say (`waiting`: the container
/// waiting reasons, the PodScheduled condition), with `graces` for those that may pass, at `now`.
pub fn observe(job: &Job, pods: &[Arc<Pod>], graces: Graces, now: Timestamp) -> Observed {
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
    let pending = match waiting::read(pods, graces, now) {
        waiting::Reading::Decided(o) => return o,
        waiting::Reading::Pending(d) => d,
    };
    let suspended = job.spec.as_ref().and_then(|s| s.suspend).unwrap_or(false);
    if suspended {
        return Observed::Running(Some("suspended".into()));
    }
    Observed::Running(pending)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatch_api::state::{truncate, MAX_DETAIL};
    use k8s_openapi::api::batch::v1::{JobCondition, JobSpec, JobStatus};
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateWaiting, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn st(dest: &str, state: DestState) -> DestinationStatus {
        DestinationStatus {
            destination: dest.into(),
            namespace: "ns".into(),
            state,
            notes: BTreeMap::new(),
            seen: false,
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
            pod: "p-1".into(),
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
            "Inconclusive: pod p-1 container \"c\" cannot pull its image: ErrImagePull: not found"
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
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p-1".into()),
                ..Default::default()
            },
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                start_time: Some(Time(at(0))),
                container_statuses: Some(vec![ContainerStatus {
                    name: "check".into(),
                    restart_count: 2,
                    state: Some(ContainerState {
                        waiting: Some(ContainerStateWaiting {
                            reason: Some(reason.into()),
                            message: Some("the kubelet's message".into()),
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

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    const GRACES: Graces = Graces {
        start: std::time::Duration::from_secs(30),
        scheduling: std::time::Duration::from_secs(60),
    };

    /// `observe` at T0 + 1s.
    fn now(job: &Job, pods: &[Arc<Pod>]) -> Observed {
        observe(job, pods, GRACES, at(1))
    }

    #[test]
    fn observe_reads_conditions_and_pods() {
        assert_eq!(
            now(&job(&[("Complete", "True", "Done")]), &[]),
            Observed::Succeeded
        );
        assert_eq!(
            now(
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
            now(&job(&[("Failed", "False", "x")]), &[]),
            Observed::Running(_)
        ));
        // The Job's own verdict comes first, whatever its pods say.
        assert_eq!(
            now(
                &job(&[("Complete", "True", "Done")]),
                &[waiting_pod("CrashLoopBackOff")]
            ),
            Observed::Succeeded
        );
        assert!(matches!(
            now(&job(&[]), &[waiting_pod("ContainerCreating")]),
            Observed::Running(Some(d)) if d.contains("Pending")
        ));
        let mut suspended = job(&[]);
        suspended.spec.as_mut().unwrap().suspend = Some(true);
        assert_eq!(
            now(&suspended, &[]),
            Observed::Running(Some("suspended".into()))
        );
    }

    #[test]
    fn every_waiting_reason_is_read() {
        let msg = "the kubelet's message";
        for reason in IMAGE_PULL_REASONS {
            assert_eq!(
                now(&job(&[]), &[waiting_pod(reason)]),
                Observed::ImagePull {
                    pod: "p-1".into(),
                    container: "check".into(),
                    reason: reason.into(),
                    message: msg.into()
                }
            );
        }
        assert_eq!(
            now(&job(&[]), &[waiting_pod(INVALID_IMAGE)]),
            Observed::Error(format!(
                "pod p-1 container \"check\" cannot start: InvalidImageName: {msg}"
            ))
        );
        assert_eq!(
            now(&job(&[]), &[waiting_pod(CRASH_LOOP)]),
            Observed::CrashLoop {
                pod: "p-1".into(),
                container: "check".into(),
                message: msg.into(),
                restarts: 2
            }
        );
        for reason in START_REASONS {
            let pods = [waiting_pod(reason)];
            assert!(
                matches!(now(&job(&[]), &pods), Observed::Running(Some(d))
                         if d.starts_with(&format!("pod p-1 container \"check\" {reason}: {msg}; "))),
                "{reason}: within the start grace"
            );
            assert_eq!(
                observe(&job(&[]), &pods, GRACES, at(31)),
                Observed::Error(format!(
                    "pod p-1 container \"check\" cannot start: {reason}: {msg} (for 31s)"
                )),
                "{reason}: past it"
            );
        }
    }

    #[test]
    fn a_pod_that_cannot_start_ends_the_measurement_as_an_error() {
        // What the engine makes of Observed::Error, combined like any other destination's Error.
        let stuck = DestState::Error(
            "pod p-1 container \"check\" cannot start: CreateContainerConfigError: secret \"db\" \
             not found (for 31s)"
                .into(),
        );
        let v = combine(
            Require::All,
            vec![st("a", stuck.clone()), st("b", DestState::Running(None))],
        );
        assert_eq!((v.phase, v.retryable), (Phase::Error, false));
        assert!(
            v.message.starts_with(
                "a: Error: pod p-1 container \"check\" cannot start: \
                                   CreateContainerConfigError: secret \"db\" not found"
            ),
            "{}",
            v.message
        );
        let any = combine(
            Require::Any,
            vec![st("a", stuck), st("b", DestState::Running(None))],
        );
        assert_eq!(any.phase, Phase::Running, "any: b may still succeed");
    }
}
