//! How our Jobs end: the labels that say whose they are (ours, and Argo's on Jobs created
//! before ours), `ttlSecondsAfterFinished`, the owner reference to the AnalysisRun on the
//! control plane, and the sweep of Jobs of deleted runs and of runs completed long ago.

use anyhow::Result;
use dispatch_server::engine::SweepReason;
use dispatch_server::job::{LABEL_ARGO_RUN_UID, LABEL_RUN_UID};
use dispatch_server::logs::Redactor;
use dispatch_server::store::DispatchJobStatus;
use dispatch_server::verdict::DestState;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{analysis_run, analysis_runs, finish_job, job_names, jobs};
use crate::fake_api::FakeApi;
use crate::world::{block, eventually, request, run, Clusters, World, NS, PROJECT};

/// Rewrites Job `name`'s labels (and its pods') as a server before `LABEL_RUN_UID` wrote them:
/// the run UID under Argo's key only.
fn label_as_before_our_label(api: &FakeApi, name: &str) {
    let done = api.update(&jobs(), NS, name, |j| {
        for at in ["/metadata/labels", "/spec/template/metadata/labels"] {
            let labels = j
                .pointer_mut(at)
                .and_then(|l| l.as_object_mut())
                .expect("labels");
            let uid = labels.remove(LABEL_RUN_UID).expect("our run-uid label");
            labels.insert(LABEL_ARGO_RUN_UID.into(), uid);
        }
    });
    assert!(done.is_some(), "job {name} to relabel does not exist");
}

#[tokio::test]
async fn jobs_labelled_with_argos_key_before_our_label_stay_ours() -> Result<()> {
    let w = World::start("").await?;
    let (live, gone) = (run(30), run(31));
    analysis_run(&w.clusters.cp, PROJECT, &live.name, &live.uid);
    let config = block(json!({"destination": "a"}))?;
    let mut made = Vec::new();
    for (r, n) in [(&live, 1), (&live, 2), (&gone, 1)] {
        let job = w
            .engine
            .ensure(&request(r, "m", n, config.clone()))
            .await?
            .job;
        assert!(
            w.api("a").get(&jobs(), NS, &job.name).expect("created")["metadata"]["labels"]
                .get(LABEL_ARGO_RUN_UID)
                .is_none(),
            "new Jobs never carry Argo's key"
        );
        label_as_before_our_label(w.api("a"), &job.name);
        made.push(job);
    }
    // The cache groups them by Argo's key.
    let d = w.destination("a")?;
    eventually("the relabelled jobs grouped by run", || {
        let n = d.jobs().group(&live.uid).len();
        async move { Ok((n == 2).then_some(())) }
    })
    .await?;

    // Status adopts and reads it.
    finish_job(
        w.api("a"),
        &made[1].name,
        "Complete",
        "CompletionsReached",
        "",
    );
    let v = w
        .verdict(&made[1], &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Successful, "{}", v.message);

    // gc counts it as the run's.
    let report = w
        .engine
        .gc(&live.uid, Some("m"), &made[0].placements, 1)
        .await;
    assert_eq!(
        report.deleted,
        vec![("a".to_string(), format!("{NS}/{}", made[0].name))],
        "{report:?}"
    );
    // The sweep takes the deleted run's.
    let swept = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    assert_eq!(
        swept.deleted,
        vec![(
            "a".to_string(),
            format!("{NS}/{}", made[2].name),
            SweepReason::DeletedRun
        )],
        "{swept:?}"
    );
    // Terminate deletes it.
    let t = w.engine.terminate(&made[1]).await;
    assert_eq!(t.deleted, vec!["a"], "{t:?}");
    assert!(job_names(w.api("a")).is_empty());
    Ok(())
}

#[tokio::test]
async fn every_job_gets_a_ttl_and_only_one_beside_its_run_an_owner() -> Result<()> {
    let clusters = Clusters::start().await?;
    // `home` is the control plane's own API server under another name.
    let home = format!(
        r#"- {{name: home, server: "{}", token: cp-token, namespace: {PROJECT}}}"#,
        clusters.cp.url()
    );
    let w = clusters
        .engine(
            &home,
            "jobs: {ttlAfterFinished: 2h}\nagents: {destinations: [{name: edge, namespace: verify}]}",
            true,
        )
        .await?;
    let r = run(32);
    let created = |destination: &str, name: &str| -> Result<serde_json::Value> {
        let api = if destination == "home" {
            &w.clusters.cp
        } else {
            w.api(destination)
        };
        let ns = if destination == "home" { PROJECT } else { NS };
        api.get(&jobs(), ns, name)
            .ok_or_else(|| anyhow::anyhow!("no job {ns}/{name} on {destination}"))
    };

    // On the control plane, in the run's namespace: owned by the run.
    let beside = w
        .engine
        .ensure(&request(
            &r,
            "m",
            1,
            block(json!({"destination": "home,a"}))?,
        ))
        .await?
        .job;
    let owned = created("home", &beside.name)?;
    assert_eq!(
        owned["metadata"]["ownerReferences"],
        json!([{"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
                 "name": r.name, "uid": r.uid, "controller": false, "blockOwnerDeletion": false}])
    );
    assert_eq!(owned["spec"]["ttlSecondsAfterFinished"], 7200);
    // Another cluster, the run's namespace name notwithstanding: no owner there.
    let on_a = created("a", &beside.name)?;
    assert!(on_a["metadata"].get("ownerReferences").is_none(), "{on_a}");
    assert_eq!(on_a["spec"]["ttlSecondsAfterFinished"], 7200);

    // On the control plane in another namespace: no owner (it must share the run's namespace).
    let elsewhere = w
        .engine
        .ensure(&request(
            &r,
            "m",
            2,
            block(json!({"destination": "home", "namespace": NS}))?,
        ))
        .await?
        .job;
    let job = w
        .clusters
        .cp
        .get(&jobs(), NS, &elsewhere.name)
        .expect("created in verify");
    assert!(job["metadata"].get("ownerReferences").is_none(), "{job}");

    // The template's own TTL wins; the agent gets the TTL in the spec it is sent, no owner.
    let mut config = block(json!({"destination": "a,edge"}))?;
    config
        .job_spec_mut()
        .expect("a spec block")
        .insert("ttlSecondsAfterFinished".into(), 60.into());
    let own_ttl = w.engine.ensure(&request(&r, "m", 3, config)).await?.job;
    assert_eq!(
        created("a", &own_ttl.name)?["spec"]["ttlSecondsAfterFinished"],
        60
    );
    let record = w
        .engine
        .store()
        .expect("agents")
        .get(&dispatch_server::store::record_name(&own_ttl.name, "edge"))
        .expect("a record for edge");
    let sent = record.spec.job.expect("the record carries the Job");
    assert_eq!(sent["spec"]["ttlSecondsAfterFinished"], 60);
    assert!(sent["metadata"].get("ownerReferences").is_none());
    let plain = w
        .engine
        .ensure(&request(&r, "m", 4, block(json!({"destination": "edge"}))?))
        .await?
        .job;
    let sent = w
        .engine
        .store()
        .expect("agents")
        .get(&dispatch_server::store::record_name(&plain.name, "edge"))
        .and_then(|r| r.spec.job)
        .expect("the record carries the Job");
    assert_eq!(sent["spec"]["ttlSecondsAfterFinished"], 7200);
    Ok(())
}

/// AnalysisRun `name` of [`PROJECT`] as Argo leaves it once finished: phase `Successful` and
/// `completedAt`.
pub(crate) fn completed_run(cp: &FakeApi, name: &str, uid: &str, completed_at: &str) {
    cp.put(
        &analysis_runs(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": PROJECT, "uid": uid},
            "spec": {"metrics": []},
            "status": {"phase": "Successful", "completedAt": completed_at}
        }),
    );
}

#[tokio::test]
async fn the_sweep_deletes_jobs_of_runs_completed_before_the_retention() -> Result<()> {
    const AGENTS: &str = "agents: {destinations: [{name: edge, namespace: verify}]}";
    let w = World::start(&format!("jobs: {{retention: 1h}}\n{AGENTS}")).await?;
    let (old, young, running) = (run(33), run(34), run(35));
    // Completed long before the retention; completed just now; not finished.
    completed_run(&w.clusters.cp, &old.name, &old.uid, "2020-01-01T00:00:00Z");
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    completed_run(&w.clusters.cp, &young.name, &young.uid, &now);
    analysis_run(&w.clusters.cp, PROJECT, &running.name, &running.uid);
    let config = block(json!({"destination": "a,edge"}))?;
    let store = w.engine.store().expect("agents").clone();
    let mut made = Vec::new();
    for r in [&old, &young, &running] {
        let job = w
            .engine
            .ensure(&request(r, "m", 1, config.clone()))
            .await?
            .job;
        w.cached("a", &job.name, true).await?;
        made.push(job);
    }
    // The completed runs' Jobs finished (a Job still running under a completed run goes at
    // once: `pending::the_sweep_stops_jobs_still_running_under_a_completed_run`).
    for j in &made[..2] {
        finish_job(w.api("a"), &j.name, "Complete", "", "");
        w.verdict(j, &Redactor::default(), |v| {
            v.message.contains("a: Successful")
        })
        .await?;
        let status = DispatchJobStatus::observed(Some(DestState::Succeeded), "agent");
        store
            .set_status(
                &dispatch_server::store::record_name(&j.name, "edge"),
                status,
            )
            .await?;
    }

    let report = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let at = |d: &str| {
        (
            d.to_string(),
            format!("{NS}/{}", made[0].name),
            SweepReason::Retention,
        )
    };
    assert_eq!(deleted, vec![at("a"), at("edge")], "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    let mut left = vec![made[1].name.clone(), made[2].name.clone()];
    left.sort();
    assert_eq!(
        job_names(w.api("a")),
        left,
        "the young and the running run's Jobs stay"
    );
    let record = |j: &dispatch_server::engine::JobRef| {
        store
            .get(&dispatch_server::store::record_name(&j.name, "edge"))
            .expect("a record")
    };
    assert!(
        record(&made[0]).spec.delete,
        "the agent is asked to delete it"
    );
    assert!(!record(&made[1]).spec.delete && !record(&made[2]).spec.delete);
    Ok(())
}
