//! Sharded controllers (issue #18): with `ROLLOUTS_CONTROLLER_INSTANCE_ID=<id>` (chart value
//! `controller.rollouts.controllerInstanceID`) Kargo labels every verification run
//! `argo-rollouts.argoproj.io/controller-instance-id: <id>` (akuity/kargo v1.11.2
//! pkg/controller/stages/regular_stages.go:55,1490-1492, pkg/rollouts/analysis_run_builder.go:150-152).
//! An Argo Rollouts controller started with `--instance-id <id>` lists only the AnalysisRuns
//! with that label, and one started without lists only those without it (`InstanceIDRequirement`,
//! argo-rollouts utils/controller/controller.go:287-300, the informers' selector in
//! cmd/rollouts-controller/main.go:170-195; the same in v1.9.1). So the controller that loads
//! our plugin must be the one whose `--instance-id` matches the label; a run labelled for an
//! instance that no controller here has is nobody's to answer, and our server never hears of it.

use std::time::Duration;

use anyhow::{ensure, Result};
use dispatch_tests::analysis::{self, phase};
use dispatch_tests::cluster::argo::ArgoRollouts;
use dispatch_tests::kargo::Verification;
use dispatch_tests::objects::jobs_of;
use dispatch_tests::world::{Direct, World};
use kube::api::DeleteParams;

use crate::{alone, report};

/// The instance id of the second controller this scenario starts beside the scene's own (which
/// has none).
const SHARD: &str = "shard-a";
/// An instance id that no controller of the scene has.
const OTHER_SHARD: &str = "shard-b";
/// How long a run for another instance must stay untouched after ours was decided.
const UNTOUCHED_FOR: Duration = Duration::from_secs(5);

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn only_the_controller_with_the_runs_instance_id_verifies_it() -> Result<()> {
    // Alone: starting (and stopping) a controller needs the control cluster's process group.
    alone(async |w| {
        let shard = ArgoRollouts::start_instance(&mut w.control, SHARD).await?;
        let outcome = verify_by_instance(w, &shard).await;
        let stopped = shard.stop(&mut w.control);
        outcome?;
        stopped
    })
}

async fn verify_by_instance(w: &World<Direct>, shard: &ArgoRollouts) -> Result<()> {
    let ours = Verification::new("sharded", "01jshard00000000000000000a", "cluster-a")
        .for_controller_instance(SHARD);
    let theirs = Verification::new("elsewhere", "01jshard00000000000000000b", "cluster-a")
        .for_controller_instance(OTHER_SHARD);
    let ours = w.submit(&ours).await?;
    let theirs = w.submit(&theirs).await?;
    let (ours_name, theirs_name) = (
        analysis::name(&ours).to_string(),
        analysis::name(&theirs).to_string(),
    );
    let theirs_uid = analysis::uid(&theirs);

    let ours = w.finished(&ours).await?;
    let ours_jobs = jobs_of(&w.a, &analysis::uid(&ours)).await?.len();
    ensure!(
        phase(&ours) == "Successful" && ours_jobs == 1,
        "the run labelled for {SHARD}: {ours_jobs} Job(s) on cluster-a; want Successful and 1: {}",
        report(w, &ours)
    );
    // Argo Rollouts logs `Started syncing Analysis` with the run's name for every run it
    // reconciles (analysis/controller.go:178).
    let (shard_log, default_log) = (shard.log_text(), w.rollouts.log_text());
    ensure!(
        shard_log.contains(&ours_name) && !default_log.contains(&ours_name),
        "the run labelled for {SHARD} must be reconciled by the controller with --instance-id \
         {SHARD} only: in its log {}, in the default controller's log {}",
        shard_log.contains(&ours_name),
        default_log.contains(&ours_name)
    );

    // Ours was submitted with theirs and is decided: the controllers have listed both.
    tokio::time::sleep(UNTOUCHED_FOR).await;
    let theirs = w.runs().get(&theirs_name).await?;
    let status = &theirs.data["status"];
    ensure!(
        status.is_null() || status.get("phase").is_none(),
        "the run labelled for {OTHER_SHARD} got a status from a controller of another instance: \
         {status}"
    );
    for cluster in [&w.a, &w.b, &w.control] {
        let jobs = jobs_of(cluster, &theirs_uid).await?.len();
        ensure!(
            jobs == 0,
            "the run labelled for {OTHER_SHARD} has {jobs} Job(s) on {}: our server was asked \
             about a run no controller here may answer",
            cluster.name
        );
    }
    let (shard_log, default_log) = (shard.log_text(), w.rollouts.log_text());
    ensure!(
        !shard_log.contains(&theirs_name) && !default_log.contains(&theirs_name),
        "a controller reconciled the run labelled for {OTHER_SHARD}: in {SHARD}'s log {}, in \
         the default controller's log {}",
        shard_log.contains(&theirs_name),
        default_log.contains(&theirs_name)
    );
    // Nobody will ever decide it: take it away rather than leave it behind.
    w.runs()
        .delete(&theirs_name, &DeleteParams::default())
        .await?;
    println!(
        "e2e: sharded controllers: the run labelled {SHARD} verified by the --instance-id \
         {SHARD} controller only (Successful, 1 Job); the run labelled {OTHER_SHARD} untouched \
         (no status, no Job) {}s after",
        UNTOUCHED_FOR.as_secs()
    );
    Ok(())
}
