//! `Engine::status`: verdicts read from the watch caches (no API call at steady state),
//! `require: all|any`, the redacted log tail of a failed container (termination message, else
//! `pods/log`, asked once), image pull errors, deadlines, pending Pods, and the API fallback.

use anyhow::Result;
use dispatch_api::Require;
use dispatch_server::engine::JobRef;
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{finish_job, pod_for, terminated, waiting};
use crate::world::{block, request, run, World, NS};

/// Starts a measurement of `routing` for run `n` and returns where its Jobs are.
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
async fn verdicts_come_from_the_watch_cache_without_api_calls() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 1, json!({"destination": "a,b"})).await?;
    let none = Redactor::default();
    let running = w.engine.status(&job, &none).await;
    assert_eq!(running.phase, Phase::Running, "{}", running.message);
    let before: Vec<usize> = ["a", "b"]
        .iter()
        .map(|d| w.api(d).requests().len())
        .collect();

    finish_job(w.api("a"), &job.name, "Complete", "CompletionsReached", "");
    let half = w
        .verdict(&job, &none, |v| v.metadata["state.a"] == "Successful")
        .await?;
    assert_eq!(half.phase, Phase::Running, "require all waits for b");
    finish_job(w.api("b"), &job.name, "Complete", "CompletionsReached", "");
    let done = w.verdict(&job, &none, |v| v.phase.is_terminal()).await?;
    assert_eq!(done.phase, Phase::Successful, "{}", done.message);
    assert_eq!(done.message, "a: Successful\nb: Successful");
    let after: Vec<usize> = ["a", "b"]
        .iter()
        .map(|d| w.api(d).requests().len())
        .collect();
    assert_eq!(after, before, "status must be served by the caches");

    // The uncached variant asks each API server: GET the Job, list its Pods.
    let uncached = w.engine.status_uncached(&job, &none).await;
    assert_eq!(uncached.phase, Phase::Successful);
    for d in ["a", "b"] {
        assert_eq!(
            w.api(d)
                .calls("GET", &format!("/namespaces/{NS}/jobs/{}", job.name)),
            1
        );
        assert_eq!(w.api(d).calls("GET", &format!("/namespaces/{NS}/pods")), 1);
    }
    Ok(())
}

#[tokio::test]
async fn a_failure_carries_the_redacted_log_tail_read_once() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 2, json!({"destination": "a", "logTail": 2})).await?;
    let api = w.api("a");
    let pod = pod_for(api, &job.name, terminated(1, None), true)?;
    api.set_log(NS, &pod, "check", "one\ntwo token=s3cr3t\nthree\n");
    finish_job(
        api,
        &job.name,
        "Failed",
        "BackoffLimitExceeded",
        "Job has reached the specified backoff limit",
    );

    let secrets = Redactor::new(["s3cr3t"]);
    let v = w.verdict(&job, &secrets, |v| v.phase.is_terminal()).await?;
    assert_eq!(v.phase, Phase::Failed);
    let m = &v.message;
    assert!(
        m.starts_with("a: Failed: BackoffLimitExceeded: Job has reached"),
        "{m}"
    );
    assert!(
        m.contains("container \"check\" exited with code 1 (Error)"),
        "{m}"
    );
    assert!(m.contains("last 2 log lines of container \"check\""), "{m}");
    assert!(m.contains("pods/log"), "{m}");
    assert!(m.contains("two token=*****\nthree"), "{m}");
    assert!(!m.contains("one") && !m.contains("s3cr3t"), "{m}");
    let log_path = format!("/pods/{pod}/log");
    assert_eq!(api.calls("GET", &log_path), 1);
    let again = w.engine.status(&job, &secrets).await;
    assert_eq!(again.message, v.message);
    assert_eq!(api.calls("GET", &log_path), 1, "a log tail is fetched once");
    Ok(())
}

#[tokio::test]
async fn a_termination_message_is_the_log_tail_without_a_log_call() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 3, json!({"destination": "a", "logTail": 5})).await?;
    let api = w.api("a");
    pod_for(
        api,
        &job.name,
        terminated(2, Some("curl: (7) refused\n")),
        true,
    )?;
    finish_job(api, &job.name, "Failed", "BackoffLimitExceeded", "");
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Failed);
    assert!(v.message.contains("termination message"), "{}", v.message);
    assert!(v.message.contains("curl: (7) refused"), "{}", v.message);
    assert_eq!(api.calls("GET", "/log"), 0);
    Ok(())
}

#[tokio::test]
async fn a_job_that_fails_before_its_pod_is_cached_asks_the_api_once() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 4, json!({"destination": "a", "logTail": 0})).await?;
    let api = w.api("a");
    // The Pod is only visible to a list by controller UID, as when the Pod watch lags.
    pod_for(api, &job.name, terminated(3, None), false)?;
    finish_job(api, &job.name, "Failed", "BackoffLimitExceeded", "backoff");
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert!(v.message.contains("exited with code 3"), "{}", v.message);
    assert!(!v.message.contains("log line"), "logTail 0: {}", v.message);
    assert_eq!(api.calls("GET", &format!("/namespaces/{NS}/pods")), 1);
    Ok(())
}

#[tokio::test]
async fn image_pull_errors_are_inconclusive_and_pending_pods_are_explained() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 5, json!({"destination": "a"})).await?;
    let api = w.api("a");
    let pod = pod_for(
        api,
        &job.name,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                   "reason": "Unschedulable"}]}),
        true,
    )?;
    let pending = w
        .verdict(&job, &Redactor::default(), |v| {
            v.message.contains("Unschedulable")
        })
        .await?;
    assert_eq!(pending.phase, Phase::Running);
    assert!(
        pending
            .message
            .contains(&format!("pod {pod} Unschedulable")),
        "{}",
        pending.message
    );

    pod_for(
        api,
        &job.name,
        waiting("ErrImagePull", "manifest unknown"),
        true,
    )?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Inconclusive);
    assert!(
        v.message
            .contains("cannot pull its image: ErrImagePull: manifest unknown"),
        "{}",
        v.message
    );
    Ok(())
}

#[tokio::test]
async fn a_deadline_names_the_active_deadline() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 6, json!({"destination": "a", "activeDeadline": "90s"})).await?;
    finish_job(
        w.api("a"),
        &job.name,
        "Failed",
        "DeadlineExceeded",
        "Job was active longer than specified deadline",
    );
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Failed);
    assert!(v.message.contains("DeadlineExceeded"), "{}", v.message);
    assert!(v.message.contains("(activeDeadline 90s)"), "{}", v.message);
    Ok(())
}

#[tokio::test]
async fn require_any_succeeds_where_require_all_fails() -> Result<()> {
    let w = World::start("").await?;
    let all = started(&w, 7, json!({"destination": "a,b"})).await?;
    finish_job(w.api("a"), &all.name, "Failed", "BackoffLimitExceeded", "");
    let any = JobRef {
        require: Require::Any,
        ..all.clone()
    };
    let none = Redactor::default();
    let running = w
        .verdict(&any, &none, |v| v.metadata["state.a"].starts_with("Failed"))
        .await?;
    assert_eq!(running.phase, Phase::Running, "any: b may still succeed");
    let failed = w.verdict(&all, &none, |v| v.phase.is_terminal()).await?;
    assert_eq!(failed.phase, Phase::Failed, "all: one failure decides");
    finish_job(w.api("b"), &all.name, "Complete", "CompletionsReached", "");
    let ok = w.verdict(&any, &none, |v| v.phase.is_terminal()).await?;
    assert_eq!(ok.phase, Phase::Successful, "{}", ok.message);
    Ok(())
}

#[tokio::test]
async fn a_job_deleted_by_someone_else_is_an_error_and_an_unknown_destination_too() -> Result<()> {
    let w = World::start("").await?;
    let job = started(&w, 8, json!({"destination": "a"})).await?;
    w.api("a")
        .remove(&crate::cluster_side::jobs(), NS, &job.name);
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Error);
    assert!(v.message.contains("does not exist"), "{}", v.message);

    let mut gone = job.clone();
    gone.placements[0].destination = "c".into();
    let v = w.engine.status(&gone, &Redactor::default()).await;
    assert!(
        v.message.contains("\"c\" is no longer known"),
        "{}",
        v.message
    );
    Ok(())
}
