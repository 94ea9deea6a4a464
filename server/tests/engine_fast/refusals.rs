//! A destination that refuses the Job (validation, an admission policy, a quota, a foreign Job
//! under our name) ends the measurement at `ensure`, quoting the destination's reason, and the
//! Jobs already created on the other destinations are deleted; a transient refusal is retried.
//! Garbage collection that cannot finish on a destination is logged and counted, never an
//! error that would stop Argo trimming the run's history. A record lost with a restarted
//! in-memory store is written again from the request's block, marked spec included.

use std::sync::Arc;

use anyhow::{bail, Result};
use dispatch_api::v1::{GcRequest, MeasurementRef, RunRef};
use dispatch_server::http::DispatchError;
use dispatch_server::measure::Measurements;
use dispatch_server::runtime::metrics::Metrics;
use dispatch_server::signing::Signer;
use serde_json::json;

use crate::cluster_side::job_names;
use crate::world::{eventually, World, PROJECT};

/// What a ValidatingAdmissionPolicy says when it denies (kube-apiserver's wording).
const DENIED: &str = "jobs.batch \"x\" is forbidden: ValidatingAdmissionPolicy 'no-latest' with \
                      binding 'no-latest' denied request: images must be pinned";

fn dispatcher(w: &World) -> Result<Measurements> {
    let signer = Signer::new(&[b"refusals-test-key-0123456789abcdef0123".to_vec()])?;
    Ok(Measurements::new(
        w.engine.clone(),
        Arc::new(Metrics::new()),
        Arc::new(signer),
    ))
}

pub(crate) fn measurement(uid: &str, destination: &str) -> MeasurementRef {
    MeasurementRef {
        run: RunRef {
            name: "uat.verify.refused".into(),
            namespace: PROJECT.into(),
            uid: uid.into(),
            ..Default::default()
        },
        metric: "smoke".into(),
        index: 1,
        block: json!({"destination": destination, "require": "all",
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "example.invalid/c:latest"}]}}}}),
        metadata: Default::default(),
    }
}

#[tokio::test]
async fn an_admission_denial_ends_the_measurement_at_once_with_its_reason() -> Result<()> {
    let w = World::start("").await?;
    let d = dispatcher(&w)?;
    w.api("a").refuse_with("POST", "/jobs", 403, DENIED);
    let uid = "0000aaaa-aaaa-4bbb-8ccc-000000000001";
    let refused = d.ensure(measurement(uid, "a,b")).await;
    let Err(DispatchError::Refused(message)) = &refused else {
        bail!("expected a refusal, got {refused:?}");
    };
    let message = message.message();
    assert!(
        message.contains("images must be pinned"),
        "the API's reason: {message}"
    );
    assert!(
        !message.contains("grant the server's credentials"),
        "an admission denial is not an RBAC problem: {message}"
    );
    // `b` created its Job before the verdict was known: it is deleted, not left behind.
    eventually("b's job deleted", || async {
        Ok(job_names(w.api("b")).is_empty().then_some(()))
    })
    .await?;
    assert!(job_names(w.api("a")).is_empty());
    Ok(())
}

#[tokio::test]
async fn a_transient_refusal_is_retried_not_a_verdict() -> Result<()> {
    let w = World::start("").await?;
    let d = dispatcher(&w)?;
    w.api("a").fail("POST", "/jobs", 500, 1);
    let uid = "0000aaaa-aaaa-4bbb-8ccc-000000000002";
    let first = d.ensure(measurement(uid, "a")).await;
    assert!(
        matches!(first, Err(DispatchError::Unavailable(_))),
        "{first:?}"
    );
    let second = d.ensure(measurement(uid, "a")).await?;
    assert_eq!(second.destinations, vec!["a".to_string()]);
    assert_eq!(job_names(w.api("a")).len(), 1);
    Ok(())
}

#[tokio::test]
async fn garbage_collection_is_best_effort_on_an_unreachable_destination() -> Result<()> {
    let w = World::start("").await?;
    let metrics = Arc::new(Metrics::new());
    let signer = Signer::new(&[b"refusals-test-key-0123456789abcdef0123".to_vec()])?;
    let d = Measurements::new(w.engine.clone(), metrics.clone(), Arc::new(signer));
    let mut m = measurement("0000aaaa-aaaa-4bbb-8ccc-000000000003", "a");
    for index in [1, 2] {
        m.index = index;
        let ensured = d.ensure(m.clone()).await?;
        w.cached("a", &ensured.job_name, true).await?;
    }
    // Keeping 1 deletes the older Job, and `a` answers the delete with a 500.
    w.api("a").fail("DELETE", "/jobs", 500, usize::MAX);
    let gc = GcRequest {
        run: m.run.clone(),
        metric: m.metric.clone(),
        limit: 1,
        block: m.block.clone(),
    };
    let deleted = d.gc(gc).await;
    assert!(matches!(deleted, Ok(0)), "not an RPC error: {deleted:?}");
    let text = metrics.encode();
    assert!(
        text.lines()
            .any(|l| l.starts_with("rollouts_dispatch_gc_failures_total{destination=\"a\"}")),
        "{text}"
    );
    Ok(())
}

#[tokio::test]
async fn a_lost_agent_record_is_written_again_with_its_spec_from_the_request() -> Result<()> {
    let w = World::start(
        "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}",
    )
    .await?;
    let d = dispatcher(&w)?;
    let mut m = measurement("0000aaaa-aaaa-4bbb-8ccc-000000000004", "edge");
    let ensured = d.ensure(m.clone()).await?;
    m.metadata = ensured.metadata;
    let store = w.engine.store().expect("an agent store").clone();
    let record = dispatch_server::store::record_name(&ensured.job_name, "edge");
    let spec = store
        .get(&record)
        .and_then(|r| r.spec.job)
        .expect("the spec");
    // What a restart of a server with the in-memory store loses.
    store.remove(&record).await?;
    let verdict = d.status(m).await?;
    assert_eq!(verdict.phase, "Running", "{verdict:?}");
    let again = store.get(&record).expect("the record is written again");
    assert_eq!(
        again.spec.job.as_ref(),
        Some(&spec),
        "with the same marked spec"
    );
    assert!(!again.spec.delete);
    Ok(())
}

#[tokio::test]
async fn with_ui_external_url_every_message_ends_with_the_run_page() -> Result<()> {
    let w = World::start("").await?;
    let d = dispatcher(&w)?.with_external_url(Some("https://dispatch.example.com".into()));
    let link =
        format!(" — logs: https://dispatch.example.com/ui/runs/{PROJECT}/uat.verify.refused");
    // A running measurement's status message.
    let mut m = measurement("0000aaaa-aaaa-4bbb-8ccc-000000000011", "a");
    let ensured = d.ensure(m.clone()).await?;
    m.metadata = ensured.metadata;
    let v = d.status(m).await?;
    assert!(v.message.ends_with(&link), "{v:?}");
    // A refusal at ensure, which the plugin turns into the measurement's Error message.
    w.api("b").refuse_with("POST", "/jobs", 403, DENIED);
    let refused = d
        .ensure(measurement("0000aaaa-aaaa-4bbb-8ccc-000000000012", "b"))
        .await;
    let Err(DispatchError::Refused(message)) = &refused else {
        bail!("expected a refusal, got {refused:?}");
    };
    let message = message.message();
    assert!(
        message.contains("images must be pinned") && message.ends_with(&link),
        "{message}"
    );
    Ok(())
}
