//! Signed work attacked (group `signed_work`): whoever can write DispatchJob records (the store is
//! a Kubernetes resource on the control plane) tries to make an agent run, or replay, a Job. The
//! agent acts only on records the server signed with a key of its `--work-keys`: a record written
//! into the store by someone else, one signed by another server's key, one edited after the
//! server signed it and one replayed past its signed deadline are each refused, reported as the
//! record's `Error` naming why, and cost no create in the agent's cluster. Control: the record as
//! the server signed it is created.

use std::sync::Arc;

use anyhow::{Context, Result};
use dispatch_api::agent::{DispatchJobSpec, WorkItem};
use dispatch_server::agent::{Guard, Worker};
use dispatch_server::podsecurity::{Origin, Profile};
use dispatch_server::signing::Signer;
use dispatch_server::verdict::DestState;
use serde_json::{json, Value};

use crate::cluster_side::{edge_record, relabel_for_a};
use crate::tally::{self, Outcome};
use crate::world::{run, World, NS};

/// The spec the server signed for a Job of run 7 on agent destination `edge`, its Job relabelled
/// for `a` (the fake cluster the agent under test runs in), signed again by the server as if
/// written for `a`.
async fn genuine(w: &World) -> Result<DispatchJobSpec> {
    let r = run(7);
    let record = edge_record(w, &r).await?;
    let mut spec = record.spec;
    assert!(
        spec.signature.is_some() && spec.deadline > 0 && spec.project == r.namespace,
        "the server signs its records with a deadline and the project: {spec:?}"
    );
    spec.destination = "a".into();
    relabel_for_a(spec.job.as_mut().context("the marked Job")?);
    w.engine.sign_work(&mut spec);
    Ok(spec)
}

fn creates(w: &World) -> usize {
    w.api("a")
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/jobs"))
        .count()
}

/// One pass of a fresh agent of `a` (pinning `w`'s server) over `spec`: its report's state.
async fn agent_pass(w: &World, spec: DispatchJobSpec) -> Result<Option<DestState>> {
    let guard = Guard {
        namespaces: vec![NS.into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: w.engine.work_keys(),
    };
    let mut worker = Worker::new(w.engine.clone(), "a", guard).context("destination a")?;
    let work = Arc::new(vec![WorkItem {
        name: format!("{}.a", spec.job_name),
        spec,
        reported: false,
    }]);
    let reports = worker.pass(&work).await;
    Ok(reports.first().and_then(|r| r.state.clone()))
}

#[tokio::test]
async fn the_agent_runs_only_work_the_server_signed_and_not_after_its_deadline() -> Result<()> {
    let w = World::start("agents: {destinations: [{name: edge, namespace: verify}]}").await?;
    let spec = genuine(&w).await?;

    let mut forgeries: Vec<(&str, DispatchJobSpec, &str)> = Vec::new();
    let mut unsigned = spec.clone();
    unsigned.signature = None;
    forgeries.push((
        "a record written into the store by someone else (no signature)",
        unsigned,
        "carries no signature",
    ));
    let mut foreign = spec.clone();
    Signer::new(&[b"another-servers-key-0123456789abcdef01".to_vec()])?.sign_work(&mut foreign);
    forgeries.push((
        "a record signed by another server's key",
        foreign,
        "which this agent does not pin",
    ));
    let mut edited = spec.clone();
    let c0: &mut Value = edited
        .job
        .as_mut()
        .and_then(|j| j.pointer_mut("/spec/template/spec/containers/0"))
        .context("the container")?;
    c0["image"] = json!("attacker.example/miner:1");
    forgeries.push((
        "a record whose image was edited after signing",
        edited,
        "does not match its content",
    ));
    let mut other_project = spec.clone();
    other_project.project = "team-b".into();
    forgeries.push((
        "a record moved to another project after signing",
        other_project,
        "does not match its content",
    ));
    let mut ended = spec.clone();
    ended.deadline = 1;
    w.engine.sign_work(&mut ended);
    forgeries.push((
        "a genuine record replayed past its deadline",
        ended,
        "deadline passed",
    ));

    for (what, forged, needle) in forgeries {
        let name = format!("signed_work: {what}");
        let before = creates(&w);
        let state = agent_pass(&w, forged).await?;
        let created = creates(&w) > before;
        let message = match &state {
            Some(DestState::Error(m)) => m.clone(),
            other => format!("{other:?}"),
        };
        let outcome = Outcome {
            refused: !created && message.contains(needle),
            foreign_mount: created,
            ..Outcome::default()
        };
        tally::record(&name, &outcome);
        assert!(!created, "{name}: the agent created the Job");
        assert!(
            message.contains("the agent refused it") && message.contains(needle),
            "{name}: {message}"
        );
    }

    // Control: the record as the server signed it is created.
    let before = creates(&w);
    let state = agent_pass(&w, spec).await?;
    assert!(
        creates(&w) > before,
        "the genuine record is created: {state:?}"
    );
    Ok(())
}

#[test]
fn a_log_is_uploaded_only_for_the_jobs_of_signed_work() {
    let server = Signer::new(&[b"the-servers-key-0123456789abcdef0123".to_vec()]).unwrap();
    let keys = dispatch_server::signing::WorkKeys::of(&server);
    let item = |job: &str, sign: bool| {
        let mut spec = DispatchJobSpec {
            destination: "edge".into(),
            namespace: NS.into(),
            job_name: job.into(),
            run_uid: "u".into(),
            ..DispatchJobSpec::default()
        };
        if sign {
            server.sign_work(&mut spec);
        }
        WorkItem {
            name: format!("{job}.edge"),
            spec,
            reported: true,
        }
    };
    let work = [item("ours", true), item("victims-job", false)];
    let served = dispatch_server::agent::signed_work(&keys, &work);
    let names: Vec<&str> = served.iter().map(|w| w.spec.job_name.as_str()).collect();
    let outcome = Outcome {
        refused: names == ["ours"],
        cross_tenant_read: names.contains(&"victims-job"),
        ..Outcome::default()
    };
    tally::record(
        "signed_work: a log request for the Job of a record someone else wrote",
        &outcome,
    );
    assert_eq!(names, ["ours"]);
}
