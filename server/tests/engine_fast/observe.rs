//! The `rollout:` and `application:` checks against fake clusters: the test plays the Argo
//! Rollouts controller (a Rollout and the AnalysisRuns of its revision) and Argo CD (an
//! Application's status) on destination `a`; the engine creates nothing there, reads (get and
//! list only) on each status call, and judges. An agent destination gives the same verdicts
//! through the agent's own pass ([`Worker`]) over its record.

use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use dispatch_api::agent::WorkItem;
use dispatch_api::JobConfig;
use dispatch_server::agent::{Guard, Worker};
use dispatch_server::engine::{Ensured, JobRef, Outcome};
use dispatch_server::logs::Redactor;
use dispatch_server::podsecurity::{Origin, Profile};
use dispatch_server::store::{self, DispatchJobStatus};
use dispatch_server::verdict::Verdict;
use dispatch_server::Phase;
use serde_json::{json, Value};

use crate::deadline::{overdue, seconds_now};
use crate::fake_api::{FakeApi, Res};
use crate::world::{request, run, World, NS};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";

fn rollouts() -> Res {
    Res::new("argoproj.io/v1alpha1", "rollouts")
}

fn analysis_runs() -> Res {
    Res::new("argoproj.io/v1alpha1", "analysisruns")
}

fn applications() -> Res {
    Res::new("argoproj.io/v1alpha1", "applications")
}

fn observe_block(b: Value) -> Result<JobConfig> {
    JobConfig::parse(b.to_string().as_bytes()).map_err(|e| anyhow::anyhow!("plugin block: {e}"))
}

/// A canary Rollout `NS/web` on `image` at pod-template hash `hash`, as the controller wrote
/// its status (observedGeneration is a string: argo-rollouts types.go:980).
fn put_rollout(api: &FakeApi, image: &str, hash: &str, stable: &str, phase: &str) {
    api.put(
        &rollouts(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web", "namespace": NS, "uid": "rollout-uid"},
            "spec": {"strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {}}]}},
                     "template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
            "status": {"currentPodHash": hash, "stableRS": stable, "phase": phase}
        }),
    );
    // The controller has seen the generation the API server gave this spec.
    api.update(&rollouts(), NS, "web", |r| {
        r["status"]["observedGeneration"] = json!(r["metadata"]["generation"].to_string());
    });
}

/// The Rollout's AnalysisRun `name` of revision `hash` in `phase`, with `metrics` results.
fn put_run(api: &FakeApi, name: &str, hash: &str, phase: &str, metrics: Value) {
    api.put(
        &analysis_runs(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": NS,
                         "labels": {"rollouts-pod-template-hash": hash, "rollout-type": "Step"},
                         "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                                              "name": "web", "uid": "rollout-uid", "controller": true}]},
            "spec": {"metrics": []},
            "status": {"phase": phase, "metricResults": metrics}
        }),
    );
}

fn put_application(api: &FakeApi, sync: &str, revision: &str, health: &str, resources: Value) {
    api.put(
        &applications(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "shop", "namespace": "argocd"},
            "spec": {"project": "default"},
            "status": {"sync": {"status": sync, "revision": revision},
                       "health": {"status": health},
                       "resources": resources}
        }),
    );
}

/// Writes, deletes and log reads made on the fake cluster (a status read is a GET or LIST).
fn writes(api: &FakeApi) -> Vec<String> {
    api.requests()
        .iter()
        .filter(|r| !r.is_watch() && r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect()
}

async fn verdict(w: &World, job: &JobRef) -> Verdict {
    w.engine.status(job, &Redactor::default()).await
}

/// Ensures measurement 1 of run `n` with the observe `check` (`{"rollout": …}` or
/// `{"application": …}`) on `destination`.
async fn start_check(w: &World, n: u32, destination: &str, check: Value) -> Result<Ensured> {
    let mut block = check;
    block["destination"] = json!(destination);
    let config = observe_block(block)?;
    Ok(w.engine
        .ensure(&request(&run(n), "observe", 1, config))
        .await?)
}

async fn start_rollout_check(w: &World, n: u32, destination: &str) -> Result<JobRef> {
    let check = json!({"rollout": {"name": "web", "image": "shop/web:2"}});
    Ok(start_check(w, n, destination, check).await?.job)
}

async fn app_check(w: &World, n: u32, revision: &str) -> Result<JobRef> {
    let check = json!({"application": {"name": "shop", "revision": revision}});
    Ok(start_check(w, n, "a", check).await?.job)
}

#[tokio::test]
async fn a_rollout_on_the_old_image_runs_until_its_analysis_passes() -> Result<()> {
    let w = World::start("").await?;
    let a = w.api("a");
    put_rollout(a, "shop/web:1", "old111", "old111", "Healthy");
    let check = json!({"rollout": {"name": "web", "image": "shop/web:2"}});
    let ensured = start_check(&w, 1, "a", check).await?;
    assert_eq!(
        ensured.outcomes,
        vec![("a".into(), Outcome::Observed(format!("rollout {NS}/web")))]
    );
    assert_eq!(ensured.verdict.phase, Phase::Running);
    let job = ensured.job;
    assert_eq!(job.placements[0].namespace, NS);
    assert!(job.observe.is_some());

    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Running, "{}", v.message);
    assert!(
        v.message.contains("runs shop/web:1") && v.message.contains("not yet image shop/web:2"),
        "{}",
        v.message
    );

    // The controller moves to the new image and starts the step analysis.
    put_rollout(a, "shop/web:2", "abc123", "old111", "Paused");
    put_run(a, "web-abc123-2-1", "abc123", "Running", json!([]));
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Running, "{}", v.message);
    assert!(
        v.message.contains("web-abc123-2-1 Running"),
        "{}",
        v.message
    );

    // The analysis passes and the Rollout is fully promoted.
    a.update(&analysis_runs(), NS, "web-abc123-2-1", |r| {
        r["status"]["phase"] = json!("Successful")
    });
    put_rollout(a, "shop/web:2", "abc123", "abc123", "Healthy");
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Successful, "{}", v.message);
    assert_eq!(v.metadata["analysisruns.a"], "web-abc123-2-1");
    assert_eq!(v.metadata["revision.a"], "abc123");
    // Only reads, and nothing created for the check.
    assert!(writes(a).is_empty(), "{:?}", writes(a));
    ensure!(
        a.calls("GET", "/rollouts/web") >= 3,
        "the Rollout is read on each status call"
    );
    Ok(())
}

#[tokio::test]
async fn failing_analysis_fails_quoting_the_run_metric_and_message() -> Result<()> {
    let w = World::start("").await?;
    let a = w.api("a");
    put_rollout(a, "shop/web:2", "abc123", "old111", "Degraded");
    put_run(
        a,
        "web-abc123-2-1",
        "abc123",
        "Failed",
        json!([{"name": "error-rate", "phase": "Failed", "message": "Metric \"error-rate\" assessed Failed due to failed (1) > failureLimit (0)",
                "measurements": [{"phase": "Failed", "message": "5xx ratio 0.12 > 0.01"}]}]),
    );
    // A run of another revision does not count.
    put_run(a, "web-old111-1-1", "old111", "Failed", json!([]));
    let job = start_rollout_check(&w, 2, "a").await?;
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Failed, "{}", v.message);
    for part in [
        "web-abc123-2-1",
        "\"error-rate\"",
        "failureLimit (0)",
        "5xx ratio 0.12",
    ] {
        assert!(v.message.contains(part), "{part}: {}", v.message);
    }
    assert_eq!(v.metadata["analysisruns.a"], "web-abc123-2-1");
    Ok(())
}

#[tokio::test]
async fn an_aborted_rollout_fails_with_its_message() -> Result<()> {
    let w = World::start("").await?;
    let a = w.api("a");
    put_rollout(a, "shop/web:2", "abc123", "old111", "Degraded");
    a.update(&rollouts(), NS, "web", |r| {
        r["status"]["abort"] = json!(true);
        r["status"]["message"] = json!("RolloutAborted: Rollout aborted update to revision 2");
    });
    let job = start_rollout_check(&w, 3, "a").await?;
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Failed, "{}", v.message);
    assert!(
        v.message.contains("RolloutAborted") && v.message.contains("aborted update to revision 2"),
        "{}",
        v.message
    );
    Ok(())
}

#[tokio::test]
async fn past_the_deadline_a_missing_rollout_fails_naming_it_and_nothing_is_deleted() -> Result<()>
{
    let w = World::start("").await?;
    let job = start_rollout_check(&w, 4, "a").await?;
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Running);
    let late = w
        .engine
        .past_deadline(&overdue(&job), &v)
        .await
        .context("past the deadline without a verdict")?;
    // What it saw is the answer: Failed, not an Error that Argo would measure again.
    assert_eq!((late.phase, late.retryable), (Phase::Failed, false));
    assert!(
        late.message.starts_with("DeadlineExceeded")
            && late.message.contains("activeDeadline")
            && late
                .message
                .contains(&format!("rollout {NS}/web not found")),
        "{}",
        late.message
    );
    assert!(writes(w.api("a")).is_empty(), "{:?}", writes(w.api("a")));
    Ok(())
}

#[tokio::test]
async fn past_the_deadline_an_observe_check_of_a_silent_agent_is_an_error_naming_it() -> Result<()>
{
    let w = World::start(AGENTS).await?;
    let job = start_rollout_check(&w, 12, "edge").await?;
    // The agent never polls: nothing was read, so nothing was seen.
    let v = verdict(&w, &job).await;
    let late = w
        .engine
        .past_deadline(&overdue(&job), &v)
        .await
        .context("past the deadline without a verdict")?;
    assert_eq!(late.phase, Phase::Error, "{}", late.message);
    assert!(
        late.message.contains("no verdict by the server's deadline")
            && !late.message.contains("deadlineGrace")
            && late.message.contains("edge")
            && late.message.contains("agent"),
        "{}",
        late.message
    );
    Ok(())
}

#[tokio::test]
async fn an_observe_checks_deadline_is_its_active_deadline_without_the_grace() -> Result<()> {
    // A Job's deadline adds engine.deadlineGrace (2m) so that its own activeDeadlineSeconds
    // verdict comes first; an observe check has none to wait for.
    let w = World::start("").await?;
    let before = seconds_now();
    let check = json!({"rollout": {"name": "web", "image": "shop/web:2"}, "activeDeadline": "5m"});
    let job = start_check(&w, 13, "a", check).await?.job;
    let after = seconds_now();
    assert!(
        (before + 300..=after + 300).contains(&job.deadline),
        "{} is not 5m from now",
        job.deadline
    );
    Ok(())
}

#[tokio::test]
async fn terminate_makes_no_destination_call_and_never_deletes_the_rollout() -> Result<()> {
    let w = World::start("").await?;
    let a = w.api("a");
    put_rollout(a, "shop/web:2", "abc123", "abc123", "Healthy");
    let job = start_rollout_check(&w, 5, "a").await?;
    let before = a.requests().iter().filter(|r| !r.is_watch()).count();
    let report = w.engine.terminate(&job).await;
    assert_eq!(report.absent, vec!["a".to_string()], "{report:?}");
    assert!(
        report.failed.is_empty() && report.pending.is_empty(),
        "{report:?}"
    );
    let after = a.requests().iter().filter(|r| !r.is_watch()).count();
    assert_eq!(
        before,
        after,
        "terminate called the destination: {:?}",
        a.requests()
    );
    assert!(
        a.get(&rollouts(), NS, "web").is_some(),
        "the Rollout is never deleted"
    );
    Ok(())
}

#[tokio::test]
async fn applications_synced_and_healthy_degraded_or_at_another_revision() -> Result<()> {
    let w = World::start("").await?;
    let a = w.api("a");
    let sha = "4f2b9c1d0e8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c";
    put_application(a, "Synced", sha, "Healthy", json!([]));
    let job = app_check(&w, 6, "4f2b9c1").await?;
    assert_eq!(
        job.placements[0].namespace, "argocd",
        "the Application's namespace is the placement's"
    );
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Successful, "{}", v.message);
    assert_eq!(v.metadata["revision.a"], sha);

    let other = app_check(&w, 7, "0123456789abcdef").await?;
    let v = verdict(&w, &other).await;
    assert_eq!(v.phase, Phase::Running, "{}", v.message);
    assert!(
        v.message.contains("not yet 0123456789abcdef"),
        "{}",
        v.message
    );

    put_application(
        a,
        "Synced",
        sha,
        "Degraded",
        json!([{"kind": "Deployment", "namespace": "shop", "name": "web",
                "health": {"status": "Degraded", "message": "Deployment \"web\" exceeded its progress deadline"}}]),
    );
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Failed, "{}", v.message);
    assert!(
        v.message.contains("Deployment shop/web Degraded")
            && v.message.contains("progress deadline"),
        "{}",
        v.message
    );
    assert!(writes(a).is_empty(), "{:?}", writes(a));
    Ok(())
}

#[tokio::test]
async fn an_agent_destination_gives_the_same_verdicts_through_the_agent_pass() -> Result<()> {
    let w = World::start(AGENTS).await?;
    // The agent's cluster is played by `a`: its engine reads there.
    let a = w.api("a");
    put_rollout(a, "shop/web:1", "old111", "old111", "Healthy");
    let job = start_rollout_check(&w, 8, "edge").await?;
    let store = w.engine.store().context("agent store")?.clone();
    let name = store::record_name(&job.name, "edge");
    let record = store.get(&name).context("the observe record")?;
    assert!(
        record.spec.job.is_none(),
        "an observe record carries no Job"
    );
    assert_eq!(record.spec.observe, job.observe);
    assert_eq!(verdict(&w, &job).await.phase, Phase::Running);

    let guard = Guard {
        namespaces: vec![NS.into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: w.engine.work_keys(),
    };
    let mut worker = Worker::new(w.engine.clone(), "a", guard).context("destination a")?;
    let mut item = WorkItem {
        name: name.clone(),
        spec: record.spec.clone(),
        reported: false,
    };
    // One pass of the agent, its report stored as the server's report route stores it.
    let deliver = |reports: Vec<dispatch_api::agent::Report>| {
        let store = store.clone();
        async move {
            for r in reports {
                let mut status =
                    DispatchJobStatus::observed(r.state, "system:serviceaccount:edge:agent");
                status.notes = r.notes;
                status.application = r.application;
                store.set_status(&r.name, status).await?;
            }
            anyhow::Ok(())
        }
    };
    let reports = worker.pass(&Arc::new(vec![item.clone()])).await;
    ensure!(reports.len() == 1, "{reports:?}");
    deliver(reports).await?;
    let v = verdict(&w, &job).await;
    assert_eq!(v.phase, Phase::Running, "{}", v.message);
    assert!(
        v.message.contains("not yet image shop/web:2"),
        "{}",
        v.message
    );
    // Past the deadline, what the agent reported is the answer only while the agent is heard
    // from: silent, it is an Error (asking again may help); connected, Failed.
    let overdue_job = overdue(&job);
    let silent = w.engine.past_deadline(&overdue_job, &v).await;
    assert_eq!(silent.map(|l| l.phase), Some(Phase::Error));
    match w.engine.registry().get("edge") {
        Some(dispatch_server::destinations::Entry::Agent(agent)) => {
            agent.contact("system:serviceaccount:edge:agent", 0)
        }
        _ => anyhow::bail!("edge is not an agent destination"),
    }
    let v = verdict(&w, &job).await;
    let heard = w
        .engine
        .past_deadline(&overdue_job, &v)
        .await
        .context("past the deadline")?;
    assert_eq!(heard.phase, Phase::Failed, "{}", heard.message);
    assert!(
        heard.message.starts_with("DeadlineExceeded")
            && heard.message.contains("not yet image shop/web:2"),
        "{}",
        heard.message
    );

    put_rollout(a, "shop/web:2", "abc123", "abc123", "Healthy");
    put_run(a, "web-abc123-2", "abc123", "Successful", json!([]));
    item.reported = true;
    let work = Arc::new(vec![item]);
    let deadline = std::time::Instant::now() + crate::world::WAIT;
    let v = loop {
        let reports = worker.pass(&work).await;
        deliver(reports).await?;
        let v = verdict(&w, &job).await;
        if v.phase != Phase::Running || std::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(v.phase, Phase::Successful, "{}", v.message);
    assert_eq!(v.metadata["analysisruns.edge"], "web-abc123-2");
    assert!(writes(a).is_empty(), "{:?}", writes(a));

    // Terminate asks the agent to drop the record; the agent acknowledges without a call.
    w.engine.terminate(&job).await;
    let record = store.get(&name).context("the record")?;
    assert!(record.spec.delete);
    let before = a.requests().iter().filter(|r| !r.is_watch()).count();
    let deleting = Arc::new(vec![WorkItem {
        name: name.clone(),
        spec: record.spec,
        reported: true,
    }]);
    let reports = worker.pass(&deleting).await;
    ensure!(
        reports.len() == 1 && reports[0].state.is_none(),
        "the deletion is acknowledged: {reports:?}"
    );
    assert_eq!(
        before,
        a.requests().iter().filter(|r| !r.is_watch()).count()
    );
    assert!(a.get(&rollouts(), NS, "web").is_some());
    Ok(())
}

#[tokio::test]
async fn sweep_and_expiry_drop_observe_records_and_never_touch_what_is_observed() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let a = w.api("a");
    put_rollout(a, "shop/web:2", "abc123", "abc123", "Healthy");
    let store = w.engine.store().context("agent store")?.clone();
    // An observe check on `a` (nothing created) and two on the agent destination.
    start_rollout_check(&w, 9, "a").await?;
    let expired = start_rollout_check(&w, 10, "edge").await?;
    let orphan = start_rollout_check(&w, 11, "edge").await?;
    let record = |job: &JobRef| store::record_name(&job.name, "edge");
    let at =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_hours(25);
    let status = DispatchJobStatus {
        observed_at: at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        ..DispatchJobStatus::observed(
            Some(dispatch_server::verdict::DestState::Succeeded),
            "agent",
        )
    };
    store.set_status(&record(&expired), status).await?;

    let report = w.engine.expire_records().await;
    assert_eq!(report.deleted.len(), 1, "{report:?}");
    assert!(store.get(&record(&expired)).context("expired")?.spec.delete);
    assert!(!store.get(&record(&orphan)).context("orphan")?.spec.delete);

    // The control plane has none of these runs: the sweep asks the agent to drop the record.
    let swept = w.engine.sweep_orphans().await?;
    assert!(swept.failed.is_empty(), "{swept:?}");
    assert!(
        store.get(&record(&orphan)).context("orphan")?.spec.delete,
        "{swept:?}"
    );
    assert!(writes(a).is_empty(), "{:?}", writes(a));
    assert!(a.get(&rollouts(), NS, "web").is_some());
    Ok(())
}
