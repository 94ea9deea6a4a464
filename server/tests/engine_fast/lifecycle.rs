//! How our Jobs end: the labels that say whose they are (ours, and Argo's on Jobs created
//! before ours), `ttlSecondsAfterFinished`, the owner reference to the AnalysisRun on the
//! control plane, and the sweep of Jobs of deleted runs and of runs completed long ago.

use anyhow::Result;
use dispatch_server::job::{LABEL_ARGO_RUN_UID, LABEL_RUN_UID};
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{analysis_run, finish_job, job_names, jobs};
use crate::fake_api::FakeApi;
use crate::world::{block, eventually, request, run, World, NS, PROJECT};

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
        vec![("a".to_string(), format!("{NS}/{}", made[2].name))],
        "{swept:?}"
    );
    // Terminate deletes it.
    let t = w.engine.terminate(&made[1]).await;
    assert_eq!(t.deleted, vec!["a"], "{t:?}");
    assert!(job_names(w.api("a")).is_empty());
    Ok(())
}
