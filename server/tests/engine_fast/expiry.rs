//! Finished agent records leave the store after their retention, with no control plane needed:
//! a record whose final state was observed longer ago than `Engine::record_retention` gets a
//! delete request (the agent deletes its Job and reports `deleted`, which removes the record).
//! A replayed status call never brings the Job of an expired record back: lost records are
//! written again only for a reference whose deadline has not passed.

use std::sync::Arc;

use anyhow::{Context, Result};
use dispatch_server::engine::{Expected, JobRef, SweepReason};
use dispatch_server::measure::Measurements;
use dispatch_server::runtime::metrics::Metrics;
use dispatch_server::signing::Signer;
use dispatch_server::store::{self, DispatchJobStatus, Store};
use dispatch_server::verdict::DestState;
use serde_json::json;

use crate::deadline::overdue;
use crate::refusals::measurement;
use crate::world::{block, request, run, World, NS};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";

/// `state` as the agent reported it `hours_ago`.
async fn reported(
    store: &Arc<Store>,
    record: &str,
    state: DestState,
    hours_ago: i64,
) -> Result<()> {
    let at = k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_hours(hours_ago);
    let status = DispatchJobStatus {
        observed_at: at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        ..DispatchJobStatus::observed(Some(state), "system:serviceaccount:edge:agent")
    };
    store.set_status(record, status).await?;
    Ok(())
}

#[tokio::test]
async fn records_finished_before_their_retention_are_deleted() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let store = w.engine.store().context("an agent store")?.clone();
    // Default jobs.retention 24h; at least engine.maxMeasurementDeadline 6h + grace 2m.
    assert_eq!(w.engine.record_retention().as_secs(), 24 * 3600);
    let config = block(json!({"destination": "edge"}))?;
    let mut records = Vec::new();
    for n in 1..=4 {
        let job = w
            .engine
            .ensure(&request(&run(n), "smoke", 1, config.clone()))
            .await?
            .job;
        records.push(store::record_name(&job.name, "edge"));
    }
    reported(&store, &records[0], DestState::Succeeded, 25).await?;
    let failed = DestState::Failed {
        reason: "BackoffLimitExceeded".into(),
        detail: String::new(),
        log: None,
    };
    reported(&store, &records[1], failed, 23).await?;
    reported(&store, &records[2], DestState::Running(None), 48).await?;
    // records[3]: never reported.

    let report = w.engine.expire_records().await;
    let job_of = |r: &str| {
        let rec = store.get(r).expect("the record");
        format!("{NS}/{}", rec.spec.job_name)
    };
    assert_eq!(
        report.deleted,
        vec![(
            "edge".to_string(),
            job_of(&records[0]),
            SweepReason::RecordRetention
        )],
        "{report:?}"
    );
    assert_eq!(SweepReason::RecordRetention.as_str(), "record_retention");
    assert!(
        store
            .get(&records[0])
            .context("kept until deleted")?
            .spec
            .delete
    );
    for r in &records[1..] {
        assert!(!store.get(r).context("kept")?.spec.delete, "{r}");
    }
    // Asked once: the next pass leaves the pending deletion alone.
    assert!(w.engine.expire_records().await.deleted.is_empty());
    Ok(())
}

#[tokio::test]
async fn a_replayed_status_never_writes_an_expired_record_again() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let store = w.engine.store().context("an agent store")?.clone();
    let signer = Arc::new(Signer::new(&[
        b"expiry-test-key-0123456789abcdef0123".to_vec()
    ])?);
    let d = Measurements::new(w.engine.clone(), Arc::new(Metrics::new()), signer.clone());
    let mut m = measurement("0000aaaa-aaaa-4bbb-8ccc-0000000000e1", "edge");
    let ensured = d.ensure(m.clone()).await?;
    let record = store::record_name(&ensured.job_name, "edge");
    reported(&store, &record, DestState::Succeeded, 25).await?;
    assert_eq!(w.engine.expire_records().await.deleted.len(), 1);
    // The agent deleted the Job and reported it: the record is removed.
    store.remove(&record).await?;

    // Argo replays the status call of that measurement, past its deadline.
    let job = JobRef::from_request(
        &ensured.metadata,
        &signer,
        Expected {
            run_uid: &m.run.uid,
            run_namespace: &m.run.namespace,
            run_name: &m.run.name,
            metric: &m.metric,
            measurement: m.index.max(1),
        },
    )?
    .context("the reference")?;
    // Then without a reference (no deadline known): likewise.
    for metadata in [overdue(&job).signed(&signer).metadata(), Default::default()] {
        store.remove(&record).await?;
        m.metadata = metadata;
        d.status(m.clone()).await?;
        let after = store.get(&record);
        assert!(
            after.as_ref().is_none_or(|r| r.spec.job.is_none()),
            "no Job to create: {after:?}"
        );
    }

    // Within the deadline the same call writes the lost record again with its Job (a
    // restarted in-memory store): the deadline is what tells the two apart.
    store.remove(&record).await?;
    m.metadata = ensured.metadata.clone();
    d.status(m).await?;
    assert!(store.get(&record).is_some_and(|r| r.spec.job.is_some()));
    Ok(())
}
