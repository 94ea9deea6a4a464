//! What the pods of a Job without a verdict of its own say: the waiting reasons of their
//! containers (the kubelet's) and their PodScheduled condition (the scheduler's), each read as a
//! verdict at once, as one after a grace, or as the detail of `Running`.
//!
//! Each reason, where Kubernetes v1.37.2 sets it, and what may still change it:
//!
//! | reason | set by | read as |
//! |---|---|---|
//! | `ErrImagePull`, `ImagePullBackOff` | pkg/kubelet/images/types.go:28-35 (image_manager.go:356, 419) | Inconclusive at once: the kubelet keeps pulling with back-off; Argo's job provider says the same (argo-rollouts metricproviders/job/job.go:269-278, `terminalWaitingReasons`) |
//! | `ErrImageNeverPull`, `ImageInspectError`, `RegistryUnavailable`, `SignatureValidationFailed` | images/types.go:31-38 (image_manager.go:125, 165), cri-api pkg/errors/errors.go:28, 31 (image_manager.go:394-415) | Inconclusive at once: cases of the pull errors above, the kubelet keeps trying |
//! | `InvalidImageName` | image_manager.go:181-187 (the image reference does not parse) | Error at once: a pod's image cannot change, nothing fixes it (Argo says Inconclusive, which pauses a rollout for a person; here it is the template's mistake) |
//! | `CreateContainerConfigError` | kuberuntime/kuberuntime_container.go:251, 261, 267 (`generateContainerConfig`: runAsNonRoot against an image that runs as root or as a named user, a missing Secret or ConfigMap key, …) | Error after the start grace: the kubelet tries again at every pod sync (pkg/kubelet/kubelet.go:223, `backOffPeriod` 10 s), so a ConfigMap created a moment later still lets it start; an image running as root never does |
//! | `CreateContainerError`, `PreCreateHookError`, `PreStartHookError`, `PostStartHookError` | kuberuntime_container.go:68-77, 274-287, 335 | Error after the start grace (the runtime or a hook refused the container; tried again the same way) |
//! | `RunContainerError` | pkg/kubelet/container/sync_result.go:87 (kuberuntime_container.go:296) | Error after the start grace |
//! | `CrashLoopBackOff` | container/sync_result.go:77 (kuberuntime/kuberuntime_manager.go:2077-2104, `doBackOff`: the container exited and is restarted after a back-off) | Failed at once, with the last run's log: the check ran and failed |
//! | PodScheduled=False `Unschedulable` | pkg/scheduler/schedule_one.go:1165-1168 (k8s.io/api core/v1/types.go:3776) | Error after the scheduling grace: the scheduler tries again when the cluster changes (a node an autoscaler adds, a pod that goes) |
//! | PodScheduled=False `SchedulingGated`, `SchedulerError` | core/v1/types.go:3780, 3784 | Running: a controller holds the pod on purpose (scheduling gates), or the scheduler retries by itself |
//!
//! `CrashLoopBackOff` happens with `restartPolicy: OnFailure` only. There the Job controller
//! would fail the Job after `backoffLimit` restarts (pkg/controller/job/job_controller.go:1668-1690,
//! `pastBackoffLimitOnFailure`), each back-off doubling from 10 s to 5 min
//! (pkg/kubelet/kubelet.go:165-173): minutes in which the measurement learns nothing new. A check
//! worth retrying is retried by Argo (the metric's `failureLimit`), with a new Job.
//!
//! A grace is measured without state, from the pod: for a container, since the kubelet took the
//! pod (`status.startTime`, else the pod's creation); for scheduling, since the PodScheduled
//! condition turned False (its `lastTransitionTime`, kept while the pod stays unschedulable).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

use super::Observed;

/// How long the reasons that may pass by themselves are given before they end the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Graces {
    /// a container that cannot start (`engine.startGrace`, the agent's `--start-grace`)
    pub start: Duration,
    /// a pod that cannot be scheduled (`engine.schedulingGrace`, the agent's
    /// `--scheduling-grace`)
    pub scheduling: Duration,
}

/// Waiting reasons of a container that cannot get its image (Inconclusive at once).
pub const IMAGE_PULL_REASONS: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "ImageInspectError",
    "RegistryUnavailable",
    "SignatureValidationFailed",
];

/// Waiting reasons of a container that cannot start (Error after the start grace).
pub const START_REASONS: [&str; 6] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "PreCreateHookError",
    "PreStartHookError",
    "PostStartHookError",
    "RunContainerError",
];

/// The waiting reason of a container whose image reference does not parse (Error at once).
pub const INVALID_IMAGE: &str = "InvalidImageName";

/// The waiting reason of a container that ran, failed and waits for its restart (Failed at once).
pub const CRASH_LOOP: &str = "CrashLoopBackOff";

/// What the pods say: a verdict, or what `Running` should show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reading {
    /// a verdict (never `Observed::Running`)
    Decided(Observed),
    /// no verdict; the first pod that does not run, and why, when one does not
    Pending(Option<String>),
}

/// Reads the pods of a Job that has not ended: the first container whose waiting reason decides,
/// else the first pod unschedulable past its grace, else what is still pending.
pub(super) fn read(pods: &[Arc<Pod>], graces: Graces, now: Timestamp) -> Reading {
    // A pod being deleted is on its way out; its last state is no news.
    let live: Vec<&Pod> = pods
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let mut pending = None;
    for pod in &live {
        let Some(status) = &pod.status else { continue };
        let init = status.init_container_statuses.iter().flatten();
        let init = init.map(|c| (c, "init container"));
        let main = status.container_statuses.iter().flatten();
        let main = main.map(|c| (c, "container"));
        for (cs, kind) in init.chain(main) {
            match container(pod, cs, kind, graces.start, now) {
                Reading::Decided(o) => return Reading::Decided(o),
                Reading::Pending(d) => pending = pending.or(d),
            }
        }
    }
    for pod in &live {
        match scheduling(pod, graces.scheduling, now) {
            Reading::Decided(o) => return Reading::Decided(o),
            Reading::Pending(d) => pending = pending.or(d),
        }
    }
    Reading::Pending(pending)
}

fn name(pod: &Pod) -> &str {
    pod.metadata.name.as_deref().unwrap_or("?")
}

/// `: message`, or nothing for an empty one.
fn colon(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

/// How long ago `since` was (zero when unknown or in the future: clocks differ).
fn elapsed(since: Option<Timestamp>, now: Timestamp) -> Duration {
    since.map_or(Duration::ZERO, |s| {
        Duration::from_secs(u64::try_from(now.as_second() - s.as_second()).unwrap_or(0))
    })
}

/// One container's waiting reason.
fn container(
    pod: &Pod,
    cs: &ContainerStatus,
    kind: &str,
    grace: Duration,
    now: Timestamp,
) -> Reading {
    let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
        return Reading::Pending(None);
    };
    let reason = waiting.reason.as_deref().unwrap_or_default();
    let message = waiting.message.clone().unwrap_or_default();
    let (pod_name, c) = (name(pod), &cs.name);
    if IMAGE_PULL_REASONS.contains(&reason) {
        return Reading::Decided(Observed::ImagePull {
            pod: pod_name.to_string(),
            container: c.clone(),
            reason: reason.to_string(),
            message,
        });
    }
    if reason == INVALID_IMAGE {
        return Reading::Decided(Observed::Error(format!(
            "pod {pod_name} {kind} {c:?} cannot start: {reason}{}",
            colon(&message)
        )));
    }
    if reason == CRASH_LOOP {
        return Reading::Decided(Observed::CrashLoop {
            pod: pod_name.to_string(),
            container: c.clone(),
            message,
            restarts: cs.restart_count,
        });
    }
    if !START_REASONS.contains(&reason) {
        // ContainerCreating, PodInitializing: on its way.
        return Reading::Pending(None);
    }
    let since = pod
        .status
        .as_ref()
        .and_then(|s| s.start_time.as_ref())
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let waited = elapsed(since, now);
    if waited >= grace {
        return Reading::Decided(Observed::Error(format!(
            "pod {pod_name} {kind} {c:?} cannot start: {reason}{} (for {}s)",
            colon(&message),
            waited.as_secs()
        )));
    }
    Reading::Pending(Some(format!(
        "pod {pod_name} {kind} {c:?} {reason}{}; an Error unless it starts within {}s",
        colon(&message),
        (grace - waited).as_secs().max(1)
    )))
}

/// A pending pod's PodScheduled condition.
fn scheduling(pod: &Pod, grace: Duration, now: Timestamp) -> Reading {
    let Some(status) = pod.status.as_ref() else {
        return Reading::Pending(None);
    };
    if status.phase.as_deref() != Some("Pending") {
        return Reading::Pending(None);
    }
    let pod_name = name(pod);
    let Some(c) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    else {
        return Reading::Pending(Some(format!("pod {pod_name} Pending")));
    };
    let reason = c.reason.as_deref().unwrap_or("Pending");
    let message = c.message.clone().unwrap_or_default();
    if reason != "Unschedulable" {
        return Reading::Pending(Some(format!("pod {pod_name} {reason}{}", colon(&message))));
    }
    let since = c
        .last_transition_time
        .as_ref()
        .or(pod.metadata.creation_timestamp.as_ref())
        .map(|t| t.0);
    let waited = elapsed(since, now);
    if waited >= grace {
        return Reading::Decided(Observed::Error(format!(
            "pod {pod_name} cannot be scheduled: {reason}{} (for {}s)",
            colon(&message),
            waited.as_secs()
        )));
    }
    Reading::Pending(Some(format!(
        "pod {pod_name} {reason}{}; an Error unless it is scheduled within {}s",
        colon(&message),
        (grace - waited).as_secs().max(1)
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStateWaiting, PodCondition, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const T0: i64 = 1_800_000_000;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).unwrap()
    }

    fn graces() -> Graces {
        Graces {
            start: Duration::from_secs(30),
            scheduling: Duration::from_secs(60),
        }
    }

    /// Pod `p` started by the kubelet at T0, container `check` waiting with `reason`.
    fn waiting(reason: &str, message: &str, init: bool) -> Arc<Pod> {
        let cs = ContainerStatus {
            name: "check".into(),
            restart_count: 3,
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.into()),
                    message: Some(message.into()),
                }),
                ..ContainerState::default()
            }),
            last_state: Some(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 1,
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            }),
            ..ContainerStatus::default()
        };
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                creation_timestamp: Some(Time(at(-5))),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                start_time: Some(Time(at(0))),
                init_container_statuses: init.then(|| vec![cs.clone()]),
                container_statuses: (!init).then(|| vec![cs]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
    }

    /// Pod `p`, not scheduled since T0 for `reason`.
    fn unscheduled(reason: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                creation_timestamp: Some(Time(at(-5))),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                phase: Some("Pending".into()),
                conditions: Some(vec![PodCondition {
                    type_: "PodScheduled".into(),
                    status: "False".into(),
                    reason: Some(reason.into()),
                    message: Some("0/3 nodes are available: 3 Insufficient cpu.".into()),
                    last_transition_time: Some(Time(at(0))),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
    }

    fn decided(pods: &[Arc<Pod>], secs: i64) -> Observed {
        match read(pods, graces(), at(secs)) {
            Reading::Decided(o) => o,
            other => panic!("no verdict after {secs}s: {other:?}"),
        }
    }

    fn pending(pods: &[Arc<Pod>], secs: i64) -> Option<String> {
        match read(pods, graces(), at(secs)) {
            Reading::Pending(d) => d,
            other => panic!("a verdict after {secs}s: {other:?}"),
        }
    }

    #[test]
    fn image_pull_reasons_are_inconclusive_at_once() {
        for reason in IMAGE_PULL_REASONS {
            assert_eq!(
                decided(&[waiting(reason, "pull access denied", false)], 0),
                Observed::ImagePull {
                    pod: "p".into(),
                    container: "check".into(),
                    reason: reason.into(),
                    message: "pull access denied".into(),
                },
                "{reason}"
            );
        }
    }

    #[test]
    fn an_invalid_image_name_is_an_error_at_once() {
        let msg = "Failed to apply default image tag \"Bad:Image\": couldn't parse image name";
        assert_eq!(
            decided(&[waiting(INVALID_IMAGE, msg, false)], 0),
            Observed::Error(format!(
                "pod p container \"check\" cannot start: InvalidImageName: {msg}"
            ))
        );
    }

    #[test]
    fn a_crash_loop_fails_at_once() {
        let msg = "back-off 40s restarting failed container=check pod=p_ns(uid)";
        assert_eq!(
            decided(&[waiting(CRASH_LOOP, msg, false)], 0),
            Observed::CrashLoop {
                pod: "p".into(),
                container: "check".into(),
                message: msg.into(),
                restarts: 3,
            }
        );
    }

    #[test]
    fn a_container_that_cannot_start_is_an_error_after_the_start_grace() {
        let msg = "container has runAsNonRoot and image will run as root (pod: \"p_ns(uid)\", \
                   container: check)";
        for reason in START_REASONS {
            for init in [false, true] {
                let pods = [waiting(reason, msg, init)];
                let kind = if init { "init container" } else { "container" };
                // Measured from status.startTime (T0), not the pod's creation (T0 - 5s).
                assert_eq!(
                    pending(&pods, 10),
                    Some(format!(
                        "pod p {kind} \"check\" {reason}: {msg}; an Error unless it starts \
                         within 20s"
                    )),
                    "{reason}"
                );
                assert_eq!(
                    decided(&pods, 30),
                    Observed::Error(format!(
                        "pod p {kind} \"check\" cannot start: {reason}: {msg} (for 30s)"
                    )),
                    "{reason}"
                );
            }
        }
        // No startTime yet: from the pod's creation.
        let mut p = (*waiting("CreateContainerConfigError", "", false)).clone();
        p.status.as_mut().unwrap().start_time = None;
        assert!(matches!(
            decided(&[Arc::new(p)], 25),
            Observed::Error(m) if m.ends_with("CreateContainerConfigError (for 30s)")
        ));
        // A clock behind the API server's: still within the grace.
        assert!(pending(&[waiting("CreateContainerError", "", false)], -100).is_some());
        // A zero grace ends at once.
        let now = read(
            &[waiting("RunContainerError", "", false)],
            Graces {
                start: Duration::ZERO,
                scheduling: Duration::ZERO,
            },
            at(0),
        );
        assert!(
            matches!(now, Reading::Decided(Observed::Error(_))),
            "{now:?}"
        );
    }

    #[test]
    fn an_unschedulable_pod_is_an_error_after_the_scheduling_grace() {
        let pods = [unscheduled("Unschedulable")];
        assert_eq!(
            pending(&pods, 15),
            Some(
                "pod p Unschedulable: 0/3 nodes are available: 3 Insufficient cpu.; an Error \
                 unless it is scheduled within 45s"
                    .into()
            )
        );
        assert_eq!(
            decided(&pods, 75),
            Observed::Error(
                "pod p cannot be scheduled: Unschedulable: 0/3 nodes are available: 3 \
                 Insufficient cpu. (for 75s)"
                    .into()
            )
        );
        // Gated on purpose, or the scheduler's own error: it stays pending, however long.
        for reason in ["SchedulingGated", "SchedulerError"] {
            let d = pending(&[unscheduled(reason)], 3600).unwrap();
            assert!(d.starts_with(&format!("pod p {reason}: ")), "{d}");
        }
    }

    #[test]
    fn what_is_on_its_way_stays_pending() {
        for reason in ["ContainerCreating", "PodInitializing"] {
            let pods = [waiting(reason, "", false)];
            assert_eq!(pending(&pods, 999).as_deref(), Some("pod p Pending"));
        }
        // A pod being deleted says nothing.
        let mut gone = (*waiting(CRASH_LOOP, "", false)).clone();
        gone.metadata.deletion_timestamp = Some(Time(at(0)));
        assert_eq!(pending(&[Arc::new(gone)], 0), None);
        // A container's verdict comes before another pod's scheduling, whatever the order.
        let pods = [
            unscheduled("Unschedulable"),
            waiting("ErrImagePull", "", false),
        ];
        assert!(matches!(decided(&pods, 999), Observed::ImagePull { .. }));
    }
}
