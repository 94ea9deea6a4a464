//! Agent destinations (in-memory store): the engine writes one record per Job for the agent,
//! reads the agent's reports as the verdict, and turns terminate, GC and the orphan sweep into
//! delete requests, without touching any cluster API.

use anyhow::{ensure, Context, Result};
use dispatch_server::destinations::Entry;
use dispatch_server::engine::{JobRef, Outcome};
use dispatch_server::logs::Redactor;
use dispatch_server::store::{self, DispatchJob, DispatchJobSpec, DispatchJobStatus, Store};
use dispatch_server::verdict::DestState;
use dispatch_server::Phase;
use serde_json::json;
use std::sync::Arc;

use crate::world::{block, request, run, World, NS};

const AGENTS: &str = "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify, labels: {env: edge}}]}";

fn records(w: &World) -> Result<&Arc<Store>> {
    w.engine.store().context("the engine has no agent store")
}

fn record_of(w: &World, job: &JobRef) -> Result<DispatchJob> {
    let name = store::record_name(&job.name, "edge");
    records(w)?
        .get(&name)
        .with_context(|| format!("no record {name}"))
}

async fn report(w: &World, job: &JobRef, state: Option<DestState>) -> Result<()> {
    let name = store::record_name(&job.name, "edge");
    let status = DispatchJobStatus::observed(state, "system:serviceaccount:edge:agent");
    records(w)?.set_status(&name, status).await?;
    Ok(())
}

async fn phase_message(w: &World, job: &JobRef) -> (Phase, String) {
    let v = w.engine.status(job, &Redactor::default()).await;
    (v.phase, v.message)
}

#[tokio::test]
async fn an_agent_destination_runs_the_job_through_its_record() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let run = run(1);
    let req = request(
        &run,
        "smoke",
        1,
        block(json!({"destinationSelector": "env=edge", "logTail": 3}))?,
    );
    let ensured = w.engine.ensure(&req).await?;
    assert_eq!(ensured.outcomes, vec![("edge".into(), Outcome::Created)]);
    let job = ensured.job;
    let r = record_of(&w, &job)?;
    assert_eq!(
        (r.spec.destination.as_str(), r.spec.namespace.as_str()),
        ("edge", NS)
    );
    assert_eq!(r.spec.run, format!("{}/{}", run.namespace, run.name));
    assert_eq!(
        (r.spec.metric.as_str(), r.spec.measurement, r.spec.log_tail),
        ("smoke", 1, 3)
    );
    let spec = r.spec.job.clone().context("the record carries the Job")?;
    assert_eq!(spec["metadata"]["name"], job.name.as_str());
    assert_eq!(
        spec["metadata"]["labels"]["rollouts-dispatch.io/destination"],
        "edge"
    );

    let (phase, m) = phase_message(&w, &job).await;
    assert_eq!(phase, Phase::Running);
    assert!(
        m.contains("waiting for the agent of edge to pick up"),
        "{m}"
    );
    assert!(
        m.contains("has not connected to this server replica yet"),
        "{m}"
    );
    let again = w.engine.ensure(&req).await?;
    assert_eq!(again.outcomes, vec![("edge".into(), Outcome::Adopted)]);

    // The agent calls in and reports.
    let Some(Entry::Agent(agent)) = w.engine.registry().get("edge") else {
        anyhow::bail!("edge is not an agent destination");
    };
    agent.contact("system:serviceaccount:edge:agent", 0);
    report(
        &w,
        &job,
        Some(DestState::Running(Some("1 active pod".into()))),
    )
    .await?;
    let (_, m) = phase_message(&w, &job).await;
    assert_eq!(m, "edge: Running (1 active pod)");
    report(&w, &job, Some(DestState::Succeeded)).await?;
    assert_eq!(phase_message(&w, &job).await.0, Phase::Successful);

    // Terminate asks the agent to delete; a new attempt waits until it did.
    let t = w.engine.terminate(&job).await;
    assert_eq!(t.deleted, vec!["edge"], "{t:?}");
    assert!(record_of(&w, &job)?.spec.delete);
    let waiting = w.engine.ensure(&req).await?;
    let Outcome::NotCreated(DestState::Unavailable(m)) = &waiting.outcomes[0].1 else {
        panic!("expected Unavailable, got {:?}", waiting.outcomes);
    };
    assert!(m.contains("is being deleted"), "{m}");
    report(&w, &job, None).await?;
    let (phase, m) = phase_message(&w, &job).await;
    assert_eq!(phase, Phase::Error);
    assert!(
        m.contains("was deleted (terminate or garbage collection)"),
        "{m}"
    );
    assert_eq!(w.engine.terminate(&job).await.absent, vec!["edge"]);
    Ok(())
}

#[tokio::test]
async fn a_lost_record_is_written_again_for_the_agent_to_adopt_or_delete() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let req = request(&run(2), "smoke", 1, block(json!({"destination": "edge"}))?);
    let job = w.engine.ensure(&req).await?.job;
    let name = store::record_name(&job.name, "edge");
    // A restarted server with the in-memory store has forgotten everything.
    records(&w)?.remove(&name).await?;
    let (phase, m) = phase_message(&w, &job).await;
    assert_eq!(phase, Phase::Running);
    assert!(m.contains("waiting for the agent of edge to report"), "{m}");
    let bare = record_of(&w, &job)?;
    ensure!(
        bare.spec.job.is_none() && !bare.spec.delete,
        "adopt only: {bare:?}"
    );

    records(&w)?.remove(&name).await?;
    assert_eq!(w.engine.terminate(&job).await.deleted, vec!["edge"]);
    let bare = record_of(&w, &job)?;
    ensure!(
        bare.spec.job.is_none() && bare.spec.delete,
        "delete only: {bare:?}"
    );
    Ok(())
}

#[tokio::test]
async fn gc_and_the_orphan_sweep_ask_agents_to_delete() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let (live, gone) = (run(3), run(4));
    crate::cluster_side::analysis_run(&w.clusters.cp, &live.namespace, &live.name, &live.uid);
    let config = block(json!({"destination": "edge"}))?;
    let mut jobs = Vec::new();
    for n in 1..=3 {
        jobs.push(
            w.engine
                .ensure(&request(&live, "m", n, config.clone()))
                .await?
                .job,
        );
    }
    let orphan = w.engine.ensure(&request(&gone, "m", 1, config)).await?.job;

    let gc = w
        .engine
        .gc(&live.uid, Some("m"), &jobs[0].placements, 1)
        .await;
    let at = |j: &JobRef| ("edge".to_string(), format!("{NS}/{}", j.name));
    assert_eq!(gc.deleted, vec![at(&jobs[0]), at(&jobs[1])], "{gc:?}");
    assert!(record_of(&w, &jobs[0])?.spec.delete && !record_of(&w, &jobs[2])?.spec.delete);

    let sweep = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    let (d, j) = at(&orphan);
    assert_eq!(
        sweep.deleted,
        vec![(d, j, dispatch_server::engine::SweepReason::DeletedRun)],
        "{sweep:?}"
    );
    assert!(record_of(&w, &orphan)?.spec.delete);
    assert!(!record_of(&w, &jobs[2])?.spec.delete, "its run exists");
    Ok(())
}

#[tokio::test]
async fn a_record_of_another_run_is_left_alone() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let req = request(&run(5), "smoke", 1, block(json!({"destination": "edge"}))?);
    let job = w.engine.locate(&req).await?;
    let theirs = DispatchJob {
        name: store::record_name(&job.name, "edge"),
        spec: DispatchJobSpec {
            destination: "edge".into(),
            namespace: NS.into(),
            job_name: job.name.clone(),
            run_uid: "another-run".into(),
            run: "team-b/other".into(),
            metric: "smoke".into(),
            measurement: 1,
            log_tail: 0,
            job: None,
            delete: false,
            observe: None,
            sync: None,
            for_stage: None,
        },
        status: None,
        resource_version: None,
    };
    records(&w)?.create(theirs.clone()).await?;
    let ensured = w.engine.ensure(&req).await?;
    let Outcome::NotCreated(DestState::Error(m)) = &ensured.outcomes[0].1 else {
        panic!("expected a refusal, got {:?}", ensured.outcomes);
    };
    assert!(
        m.contains("already exists for another AnalysisRun (team-b/other)"),
        "{m}"
    );
    assert_eq!(records(&w)?.get(&theirs.name), Some(theirs));
    Ok(())
}
