//! Pods that do not run (`verdict::waiting`), as a kubelet and a scheduler report them: a
//! container that cannot start is an Error once the start grace is over, a crash loop is Failed
//! with the last run's log, an unschedulable pod an Error once the scheduling grace is over; the
//! Job stays where it is, like one whose image cannot be pulled, and only the Jobs the verdict
//! no longer needs are stopped.

use anyhow::Result;
use dispatch_server::engine::JobRef;
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use crate::cluster_side::{crash_looping, job_names, pod_for, unschedulable, waiting_since};
use crate::world::{block, request, run, World};

/// Long before any grace ends.
const LONG_AGO: &str = "2020-01-01T00:00:00Z";

/// The kubelet's message for an image that runs as root under runAsNonRoot
/// (pkg/kubelet/kuberuntime/security_context_others.go:56).
const AS_ROOT: &str = "container has runAsNonRoot and image will run as root (pod: \"p_ns(uid)\", \
                       container: check)";

fn now() -> String {
    Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

async fn started(w: &World, n: u32, routing: serde_json::Value) -> Result<JobRef> {
    let ensured = w
        .engine
        .ensure(&request(&run(n), "smoke", 1, block(routing)?))
        .await?;
    for p in &ensured.job.placements {
        w.cached(&p.destination, &ensured.job.name, true).await?;
    }
    Ok(ensured.job)
}

#[tokio::test]
async fn a_container_that_cannot_start_is_an_error_after_the_start_grace() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 41, json!({"destination": "a,b"})).await?;
    let none = Redactor::default();
    // Just taken by the kubelet: still within `engine.startGrace` (30s), Running with the reason.
    let pod = pod_for(
        w.api("a"),
        &job.name,
        waiting_since("CreateContainerConfigError", AS_ROOT, &now()),
        true,
    )?;
    let pending = w
        .verdict(&job, &none, |v| {
            v.message.contains("CreateContainerConfigError")
        })
        .await?;
    assert_eq!(pending.phase, Phase::Running, "{}", pending.message);
    assert!(
        pending.message.contains("an Error unless it starts within"),
        "{}",
        pending.message
    );
    // Still so after the grace: an Error naming the pod, the container, the reason and the
    // kubelet's message.
    pod_for(
        w.api("a"),
        &job.name,
        waiting_since("CreateContainerConfigError", AS_ROOT, LONG_AGO),
        true,
    )?;
    let v = w.verdict(&job, &none, |v| v.phase.is_terminal()).await?;
    assert_eq!(
        (v.phase, v.retryable),
        (Phase::Error, false),
        "{}",
        v.message
    );
    let line = v.message.lines().next().unwrap_or_default();
    assert!(
        line.starts_with(&format!(
            "a: Error: pod {pod} container \"check\" cannot start: CreateContainerConfigError: \
             {AS_ROOT} (for "
        )),
        "{line}"
    );
    // As for an image that cannot be pulled: the Job stays (a repeated status gives the same
    // verdict), the Job the verdict no longer needs is stopped.
    assert_eq!(
        w.engine.stop_undecided(&job, &v).await,
        vec!["b".to_string()]
    );
    assert!(job_names(w.api("b")).is_empty(), "b's running Job goes");
    assert_eq!(job_names(w.api("a")), vec![job.name.clone()], "a's stays");
    let again = w.engine.status(&job, &none).await;
    assert_eq!(again.phase, Phase::Error, "{}", again.message);
    assert!(again.message.starts_with(line), "{}", again.message);
    Ok(())
}

#[tokio::test]
async fn a_crash_loop_fails_with_the_last_runs_log() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 42, json!({"destination": "a", "logTail": 5})).await?;
    let pod = pod_for(
        w.api("a"),
        &job.name,
        crash_looping(7, "curl: (7) Failed to connect to my-app port 80\n", 2),
        true,
    )?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Failed, "{}", v.message);
    assert_eq!(v.metadata["state.a"], "Failed: CrashLoopBackOff");
    let lines: Vec<&str> = v.message.lines().collect();
    assert_eq!(
        lines[0],
        format!(
            "a: Failed: CrashLoopBackOff: pod {pod} container \"check\" exited with code 7 \
             (Error) and is restarted with back-off (2 restarts): back-off 20s restarting \
             failed container=check"
        )
    );
    assert_eq!(
        lines[1..],
        [
            format!(
                "--- a: last 1 log line of container \"check\" (pod {pod}, termination message):"
            )
            .as_str(),
            "curl: (7) Failed to connect to my-app port 80"
        ]
    );
    Ok(())
}

#[tokio::test]
async fn an_unschedulable_pod_is_an_error_after_the_scheduling_grace() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 43, json!({"destination": "a"})).await?;
    let why = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
    let pod = pod_for(w.api("a"), &job.name, unschedulable(why, &now()), true)?;
    let pending = w
        .verdict(&job, &Redactor::default(), |v| {
            v.message.contains("Unschedulable")
        })
        .await?;
    assert_eq!(pending.phase, Phase::Running, "{}", pending.message);
    assert!(
        pending.message.contains(&format!(
            "pod {pod} Unschedulable: {why}; an Error unless it is scheduled within"
        )),
        "{}",
        pending.message
    );
    pod_for(w.api("a"), &job.name, unschedulable(why, LONG_AGO), true)?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Error, "{}", v.message);
    assert!(
        v.message.starts_with(&format!(
            "a: Error: pod {pod} cannot be scheduled: Unschedulable: {why} (for "
        )),
        "{}",
        v.message
    );
    Ok(())
}
