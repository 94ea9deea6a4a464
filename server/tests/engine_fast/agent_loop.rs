//! The agent's pass over its work ([`Worker`]) on a fake cluster: a record whose final state the
//! server accepted is not read again until its record changes, and a delete request on such a
//! settled record still deletes the Job and reports it; a pod that cannot start is reported
//! like the server reads one of a direct destination.

use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use dispatch_api::agent::{DispatchJobSpec, Report, WorkItem};
use dispatch_server::agent::{Guard, Worker};
use dispatch_server::podsecurity::{Origin, Profile};
use dispatch_server::verdict::DestState;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{
    crash_looping, edge_record, finish_job, job_names, pod_for, relabel_for_a, waiting_since,
};
use crate::world::{block, request, run, World, NS, WAIT};

/// The one-off calls (not watches) the fake cluster `a` has received so far.
fn calls(w: &World) -> usize {
    w.api("a")
        .requests()
        .iter()
        .filter(|r| !r.is_watch())
        .count()
}

/// The record of `job_name` as the server of `w` writes it (signed).
fn item(w: &World, job_name: &str, run_uid: &str, delete: bool) -> WorkItem {
    let mut item = WorkItem {
        name: format!("{job_name}.a"),
        spec: DispatchJobSpec {
            destination: "a".into(),
            namespace: NS.into(),
            job_name: job_name.into(),
            run_uid: run_uid.into(),
            run: "team-a/uat.verify.1".into(),
            metric: "smoke".into(),
            measurement: 1,
            log_tail: 0,
            job: None,
            delete,
            observe: None,
            sync: None,
            ..DispatchJobSpec::default()
        },
        reported: true,
    };
    w.engine.sign_work(&mut item.spec);
    item
}

#[tokio::test]
async fn a_settled_record_is_not_read_again_until_it_changes() -> Result<()> {
    let w = World::start("").await?;
    let r = run(1);
    let job = w
        .engine
        .ensure(&request(
            &r,
            "smoke",
            1,
            block(json!({"destination": "a"}))?,
        ))
        .await?
        .job;
    w.cached("a", &job.name, true).await?;
    // Failed with no Pod in the cache: each read of this Job asks the API for its Pods once
    // more (the Job and Pod watches are separate streams), so every read shows as a call.
    finish_job(w.api("a"), &job.name, "Failed", "BackoffLimitExceeded", "");
    let guard = Guard {
        namespaces: vec![NS.into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: w.engine.work_keys(),
    };
    let mut worker = Worker::new(w.engine.clone(), "a", guard).context("destination a")?;
    let work = Arc::new(vec![item(&w, &job.name, &r.uid, false)]);

    let failed = passes_until(&mut worker, &work, "the agent sees the Job failed", |r| {
        matches!(r.state, Some(DestState::Failed { .. }))
    })
    .await?;
    assert_eq!(failed.len(), 1, "{failed:?}");

    // Not accepted yet (the report call failed): the next pass reads the Job again.
    let before = calls(&w);
    assert_eq!(worker.pass(&work).await.len(), 1);
    assert!(
        calls(&w) > before,
        "an unsettled record is read on every pass"
    );

    // Accepted: the record is settled and later passes make no call at all.
    worker.accepted(failed, &[]);
    assert_eq!(worker.settled(), 1);
    let before = calls(&w);
    for _ in 0..5 {
        assert!(worker.pass(&work).await.is_empty());
    }
    assert_eq!(calls(&w), before, "a settled record is not read again");
    // The same work sent again (a new list, unchanged record) keeps it settled.
    let resent = Arc::new(vec![item(&w, &job.name, &r.uid, false)]);
    assert!(worker.pass(&resent).await.is_empty());
    assert_eq!(calls(&w), before);
    // A changed record (here only `reported`, which the server flips on the first report) is
    // read once more and, unchanged and accepted, settled again.
    let flipped = Arc::new(vec![WorkItem {
        reported: false,
        ..item(&w, &job.name, &r.uid, false)
    }]);
    assert!(worker.pass(&flipped).await.is_empty());
    assert!(calls(&w) > before, "a changed record is read again");
    let before = calls(&w);
    assert!(worker.pass(&flipped).await.is_empty());
    assert_eq!(calls(&w), before, "and settled again without a report");

    // A delete request changes the record: the Job is deleted and `deleted` reported.
    let delete = Arc::new(vec![item(&w, &job.name, &r.uid, true)]);
    assert_eq!(worker.settled(), 1);
    let deleted = passes_until(&mut worker, &delete, "the agent deletes the Job", |r| {
        r.state.is_none()
    })
    .await?;
    assert!(
        !job_names(w.api("a")).contains(&job.name),
        "the Job is deleted"
    );
    assert!(w.api("a").calls("DELETE", &job.name) >= 1);
    worker.accepted(deleted, &[]);
    // The record leaves the work: nothing of it is kept.
    assert!(worker.pass(&Arc::new(Vec::new())).await.is_empty());
    assert_eq!(worker.settled(), 0);
    Ok(())
}

#[tokio::test]
async fn a_pod_that_cannot_start_is_reported_as_the_server_reads_it() -> Result<()> {
    let w = World::start("").await?;
    let r = run(3);
    let job = w
        .engine
        .ensure(&request(
            &r,
            "smoke",
            1,
            block(json!({"destination": "a"}))?,
        ))
        .await?
        .job;
    w.cached("a", &job.name, true).await?;
    let msg = "couldn't find key url in ConfigMap verify/smoke";
    let pod = pod_for(
        w.api("a"),
        &job.name,
        waiting_since("CreateContainerConfigError", msg, "2020-01-01T00:00:00Z"),
        true,
    )?;
    let guard = Guard {
        namespaces: vec![NS.into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: w.engine.work_keys(),
    };
    let mut worker = Worker::new(w.engine.clone(), "a", guard).context("destination a")?;
    let work = Arc::new(vec![item(&w, &job.name, &r.uid, false)]);
    let stuck = passes_until(&mut worker, &work, "the agent sees the pod stuck", |r| {
        matches!(r.state, Some(DestState::Error(_)))
    })
    .await?;
    let Some(DestState::Error(m)) = &stuck[0].state else {
        unreachable!()
    };
    assert!(
        m.starts_with(&format!(
            "pod {pod} container \"check\" cannot start: CreateContainerConfigError: {msg} (for "
        )),
        "{m}"
    );
    // A final state: once accepted, the record is settled like a failed Job's.
    worker.accepted(stuck, &[]);
    assert_eq!(worker.settled(), 1);

    // A crash loop is a failure, with the last run's log when the record asks for one.
    let mut tail = item(&w, &job.name, &r.uid, false);
    tail.spec.log_tail = 5;
    w.engine.sign_work(&mut tail.spec);
    pod_for(w.api("a"), &job.name, crash_looping(1, "boom\n", 1), true)?;
    let work = Arc::new(vec![tail]);
    // The changed record is read once: only after the Pod cache has the new status.
    w.verdict(&job, &Default::default(), |v| v.phase == Phase::Failed)
        .await?;
    let failed = passes_until(&mut worker, &work, "the agent sees the crash loop", |r| {
        matches!(r.state, Some(DestState::Failed { .. }))
    })
    .await?;
    let Some(DestState::Failed { reason, log, .. }) = &failed[0].state else {
        unreachable!()
    };
    assert_eq!(reason, "CrashLoopBackOff");
    assert!(
        log.as_deref().is_some_and(|l| l.ends_with(":\nboom")),
        "{log:?}"
    );
    Ok(())
}

/// Passes over `work` until one reports a single record whose report satisfies `done`.
async fn passes_until(
    worker: &mut Worker,
    work: &Arc<Vec<WorkItem>>,
    what: &str,
    done: impl Fn(&Report) -> bool,
) -> Result<Vec<Report>> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let reports = worker.pass(work).await;
        if reports.len() == 1 && done(&reports[0]) {
            return Ok(reports);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "{what}: not reached within {WAIT:?}; last reports {reports:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_refused_create_stays_the_records_state_after_the_record_changes() -> Result<()> {
    let w = World::start("agents: {destinations: [{name: edge, namespace: verify}]}").await?;
    let r = run(2);
    // The marked Job the server sends an agent, from the record of an agent destination.
    let record = edge_record(&w, &r).await?;
    // Sent to `a`'s agent instead: its destination label says so.
    let mut job = record.spec.job.clone().context("the marked Job")?;
    relabel_for_a(&mut job);
    let fresh = |reported: bool| {
        let mut work = item(&w, &record.spec.job_name, &r.uid, false);
        work.spec.job = Some(job.clone());
        w.engine.sign_work(&mut work.spec);
        work.reported = reported;
        Arc::new(vec![work])
    };
    // The cluster's admission refuses the create, once (a second create would succeed).
    let reason = "admission webhook \"policy.example\" denied the request: no latest images";
    w.api("a").refuse_with("POST", "/jobs", 422, reason);
    let guard = Guard {
        namespaces: vec![NS.into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: w.engine.work_keys(),
    };
    let mut worker = Worker::new(w.engine.clone(), "a", guard).context("destination a")?;
    let refused = worker.pass(&fresh(false)).await;
    let Some(DestState::Error(m)) = refused.first().and_then(|r| r.state.clone()) else {
        panic!("want the refusal: {refused:?}");
    };
    assert!(m.contains(reason), "{m}");
    worker.accepted(refused, &[]);
    // The server marks the record reported: it changes, leaves `settled`, and is looked at
    // again; its state is still the refusal, not "does not exist", and nothing is created.
    for _ in 0..3 {
        assert!(worker.pass(&fresh(true)).await.is_empty());
    }
    assert!(job_names(w.api("a")).is_empty(), "no Job was created");
    assert_eq!(
        w.api("a").calls("POST", "/jobs"),
        1,
        "the create is not tried again"
    );
    Ok(())
}
