//! Terminate that finishes: a Job a destination cannot delete now is kept as a pending deletion
//! (in the agent store when there is one) and retried until it is gone
//! (`Engine::retry_pending_deletions`); the sweep stops at once the Jobs still running under a
//! completed run (a Terminate that never reached the server).

use anyhow::Result;
use dispatch_server::engine::SweepReason;
use dispatch_server::logs::Redactor;
use dispatch_server::store::record_name;
use serde_json::json;

use crate::cluster_side::{analysis_run, finish_job, foreign_job, job_names, jobs};
use crate::lifecycle::completed_run;
use crate::world::{block, request, run, World, NS, PROJECT};

#[tokio::test]
async fn a_deletion_that_fails_is_kept_and_retried_until_the_job_is_gone() -> Result<()> {
    let w = World::start("").await?;
    let req = request(&run(61), "smoke", 1, block(json!({"destination": "a,b"}))?);
    let job = w.engine.ensure(&req).await?.job;
    for d in ["a", "b"] {
        w.cached(d, &job.name, true).await?;
    }
    // a's API server fails the delete (an internal error: 503s are retried by the client), twice.
    w.api("a").fail("DELETE", "/jobs/", 500, 2);
    let t = w.engine.terminate(&job).await;
    assert_eq!(t.deleted, vec!["b"], "{t:?}");
    assert_eq!(
        t.pending
            .iter()
            .map(|(d, _)| d.as_str())
            .collect::<Vec<_>>(),
        vec!["a"],
        "{t:?}"
    );
    assert!(t.failed.is_empty(), "{t:?}");
    assert_eq!(job_names(w.api("a")), vec![job.name.clone()]);

    // The first retry fails again: still pending, and counted per destination.
    let first = w.engine.retry_pending_deletions().await;
    assert!(first.done.is_empty(), "{first:?}");
    assert_eq!(first.pending.get("a"), Some(&1), "{first:?}");
    assert_eq!(first.pending.get("b"), Some(&0), "{first:?}");
    // The destination is back: the Job goes, and nothing is pending any more.
    let second = w.engine.retry_pending_deletions().await;
    assert_eq!(second.done.len(), 1, "{second:?}");
    assert!(job_names(w.api("a")).is_empty());
    let third = w.engine.retry_pending_deletions().await;
    assert!(
        third.done.is_empty() && third.still_pending.is_empty(),
        "{third:?}"
    );
    assert_eq!(third.pending.get("a"), Some(&0), "{third:?}");
    assert_eq!(
        w.api("a").calls("DELETE", "/jobs/"),
        3,
        "no retry after it is gone"
    );
    Ok(())
}

#[tokio::test]
async fn pending_deletions_live_in_the_agent_store_and_agents_never_see_them() -> Result<()> {
    let w = World::start("agents: {destinations: [{name: edge, namespace: verify}]}").await?;
    let req = request(&run(62), "smoke", 1, block(json!({"destination": "a"}))?);
    let job = w.engine.ensure(&req).await?.job;
    w.cached("a", &job.name, true).await?;
    w.api("a").fail("DELETE", "/jobs/", 500, 1);
    let t = w.engine.terminate(&job).await;
    assert_eq!(t.pending.len(), 1, "{t:?}");
    let store = w.engine.store().expect("agents");
    let record = store
        .get(&record_name(&job.name, "a"))
        .expect("the pending deletion is a record of the store any replica reads");
    assert!(
        record.spec.delete && record.spec.job.is_none(),
        "{record:?}"
    );
    assert!(
        store.for_destination("edge").is_empty(),
        "the agent's work does not include another destination's deletion"
    );
    let done = w.engine.retry_pending_deletions().await;
    assert_eq!(done.done.len(), 1, "{done:?}");
    assert!(
        store.get(&record_name(&job.name, "a")).is_none(),
        "dropped once done"
    );
    assert!(job_names(w.api("a")).is_empty());
    Ok(())
}

#[tokio::test]
async fn a_pending_deletion_never_deletes_a_job_that_is_not_ours() -> Result<()> {
    let w = World::start("").await?;
    let req = request(&run(63), "smoke", 1, block(json!({"destination": "a"}))?);
    let job = w.engine.ensure(&req).await?.job;
    w.cached("a", &job.name, true).await?;
    w.api("a").fail("DELETE", "/jobs/", 500, 1);
    assert_eq!(w.engine.terminate(&job).await.pending.len(), 1);
    // Meanwhile someone replaces the Job under the same name with one of their own (a new
    // object: another UID). Whether the cache has seen it yet or not, it is never deleted: the
    // delete carries our Job's UID as a precondition, and a fresh read finds it foreign.
    let api = w.api("a");
    api.remove(&jobs(), NS, &job.name);
    foreign_job(api, &job.name, json!({"team": "other"}));
    let r = w.engine.retry_pending_deletions().await;
    assert_eq!(r.done.len(), 1, "nothing of ours is left: {r:?}");
    let theirs = api.get(&jobs(), NS, &job.name).expect("left alone");
    assert_eq!(theirs["metadata"]["labels"]["team"], "other");
    let again = w.engine.retry_pending_deletions().await;
    assert!(
        again.done.is_empty() && again.still_pending.is_empty(),
        "not retried forever: {again:?}"
    );
    Ok(())
}

#[tokio::test]
async fn the_sweep_stops_jobs_still_running_under_a_completed_run() -> Result<()> {
    const AGENTS: &str = "agents: {destinations: [{name: edge, namespace: verify}]}";
    let w = World::start(&format!("jobs: {{retention: 24h}}\n{AGENTS}")).await?;
    let (done, busy) = (run(64), run(65));
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    completed_run(&w.clusters.cp, &done.name, &done.uid, &now);
    analysis_run(&w.clusters.cp, PROJECT, &busy.name, &busy.uid);
    let config = block(json!({"destination": "a,edge"}))?;
    let mut made = Vec::new();
    for r in [&done, &busy] {
        let job = w
            .engine
            .ensure(&request(r, "m", 1, config.clone()))
            .await?
            .job;
        w.cached("a", &job.name, true).await?;
        made.push(job);
    }
    // A second Job of the completed run, finished: it stays for the retention.
    let finished = w
        .engine
        .ensure(&request(&done, "m", 2, config.clone()))
        .await?
        .job;
    w.cached("a", &finished.name, true).await?;
    finish_job(w.api("a"), &finished.name, "Complete", "", "");
    // Seen finished by a's cache (edge's agent never answers here).
    w.verdict(&finished, &Redactor::default(), |v| {
        v.message.contains("a: Successful")
    })
    .await?;

    let report = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let stopped = |d: &str| {
        (
            d.to_string(),
            format!("{}/{}", NS, made[0].name),
            SweepReason::RunCompleted,
        )
    };
    assert!(deleted.contains(&stopped("a")), "{report:?}");
    assert!(deleted.contains(&stopped("edge")), "{report:?}");
    let mut left = job_names(w.api("a"));
    left.sort();
    let mut want = vec![made[1].name.clone(), finished.name.clone()];
    want.sort();
    assert_eq!(
        left, want,
        "the running run's Job and the finished Job stay"
    );
    Ok(())
}
