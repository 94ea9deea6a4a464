//! Nothing left running: past the server's own deadline a measurement without a verdict — a
//! silent agent, a Job that never starts — ends in `Error` naming what did not answer, and its
//! Jobs are deleted; a verdict reached in time is left alone; once a verdict is decided, Jobs
//! that can no longer change it are deleted. The deadline is in the signed reference, so the
//! tests move it into the past instead of waiting for it.

use anyhow::Result;
use dispatch_server::engine::JobRef;
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{finish_job, job_names};
use crate::world::{block, eventually, request, run, World};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";

/// Now, in seconds since the Unix epoch (the unit of `JobRef::deadline`).
pub(crate) fn seconds_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `job` as if its deadline passed a minute ago.
pub(crate) fn overdue(job: &JobRef) -> JobRef {
    JobRef {
        deadline: seconds_now() - 60,
        ..job.clone()
    }
}

#[tokio::test]
async fn the_deadline_is_the_active_deadline_or_the_default_plus_the_grace() -> Result<()> {
    // The defaults: engine.measurementDeadline 30m, engine.deadlineGrace 2m.
    let w = World::start("").await?;
    let with_own = block(json!({"destination": "a", "activeDeadline": "5m"}))?;
    let before = seconds_now();
    let own = w
        .engine
        .ensure(&request(&run(1), "smoke", 1, with_own))
        .await?;
    let default = w
        .engine
        .ensure(&request(
            &run(2),
            "smoke",
            1,
            block(json!({"destination": "a"}))?,
        ))
        .await?;
    let after = seconds_now();
    for (job, budget) in [(&own.job, 7 * 60), (&default.job, 32 * 60)] {
        assert!(
            (before + budget..=after + budget).contains(&job.deadline),
            "{} not within {budget}s of now",
            job.deadline
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_job_that_never_finishes_ends_in_error_at_the_deadline_and_is_deleted() -> Result<()> {
    let w = World::start("").await?;
    let ensured = w
        .engine
        .ensure(&request(
            &run(3),
            "smoke",
            1,
            block(json!({"destination": "a,b"}))?,
        ))
        .await?;
    let job = ensured.job;
    let running = w.engine.status(&job, &Redactor::default()).await;
    assert_eq!(running.phase, Phase::Running);
    assert!(
        w.engine.past_deadline(&job, &running).await.is_none(),
        "within the deadline nothing changes"
    );
    let late = w
        .engine
        .past_deadline(&overdue(&job), &running)
        .await
        .expect("past the deadline");
    assert_eq!(late.phase, Phase::Error);
    assert!(!late.retryable);
    assert!(
        late.message.contains("no verdict by the server's deadline")
            && late.message.contains("a: ")
            && late.message.contains("were deleted"),
        "{}",
        late.message
    );
    for d in ["a", "b"] {
        eventually(&format!("the job on {d} deleted"), || async {
            Ok(job_names(w.api(d)).is_empty().then_some(()))
        })
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_verdict_reached_in_time_is_kept_past_the_deadline() -> Result<()> {
    let w = World::start("").await?;
    let ensured = w
        .engine
        .ensure(&request(
            &run(4),
            "smoke",
            1,
            block(json!({"destination": "a"}))?,
        ))
        .await?;
    finish_job(w.api("a"), &ensured.job.name, "Complete", "Completed", "");
    let job = overdue(&ensured.job);
    let done = eventually("the verdict", || async {
        let v = w.engine.status(&job, &Redactor::default()).await;
        Ok((v.phase == Phase::Successful).then_some(v))
    })
    .await?;
    assert!(w.engine.past_deadline(&job, &done).await.is_none());
    assert_eq!(job_names(w.api("a")).len(), 1, "nothing deleted");
    Ok(())
}

#[tokio::test]
async fn a_silent_agent_past_the_deadline_ends_in_error_naming_the_agent() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let ensured = w
        .engine
        .ensure(&request(
            &run(5),
            "smoke",
            1,
            block(json!({"destination": "edge"}))?,
        ))
        .await?;
    // The agent never polls: no report, never connected.
    let job = overdue(&ensured.job);
    let running = w.engine.status(&job, &Redactor::default()).await;
    let late = w
        .engine
        .past_deadline(&job, &running)
        .await
        .expect("past the deadline");
    assert_eq!(late.phase, Phase::Error);
    assert!(
        late.message.contains("edge") && late.message.contains("agent"),
        "names the agent: {}",
        late.message
    );
    Ok(())
}

#[tokio::test]
async fn a_decided_verdict_stops_the_jobs_that_can_no_longer_change_it() -> Result<()> {
    let w = World::start("").await?;
    let ensured = w
        .engine
        .ensure(&request(
            &run(6),
            "smoke",
            1,
            block(json!({"destination": "a,b", "require": "all"}))?,
        ))
        .await?;
    let job = ensured.job;
    finish_job(
        w.api("a"),
        &job.name,
        "Failed",
        "BackoffLimitExceeded",
        "exit 1",
    );
    let failed = eventually("a's failure decides require: all", || async {
        let v = w.engine.status(&job, &Redactor::default()).await;
        Ok((v.phase == Phase::Failed).then_some(v))
    })
    .await?;
    assert_eq!(
        w.engine.stop_undecided(&job, &failed).await,
        vec!["b".to_string()]
    );
    assert!(
        job_names(w.api("b")).is_empty(),
        "b's running Job is deleted"
    );
    assert_eq!(
        job_names(w.api("a")).len(),
        1,
        "a's failed Job (and its log) stays"
    );
    // Asked again (a reply lost on the way), the verdict is the same.
    let again = eventually("b's deletion seen", || async {
        let v = w.engine.status(&job, &Redactor::default()).await;
        Ok((!v.message.contains("b: running")).then_some(v))
    })
    .await?;
    assert_eq!(again.phase, Phase::Failed, "{}", again.message);
    // A running measurement stops nothing.
    let other = w
        .engine
        .ensure(&request(
            &run(7),
            "smoke",
            1,
            block(json!({"destination": "a,b"}))?,
        ))
        .await?;
    let running = w.engine.status(&other.job, &Redactor::default()).await;
    assert!(w
        .engine
        .stop_undecided(&other.job, &running)
        .await
        .is_empty());
    Ok(())
}
