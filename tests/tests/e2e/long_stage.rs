//! A Stage with the longest name Kubernetes allows (253 characters) whose templates have two
//! metrics: the real API server takes the run as Kargo names and labels it (the name's Stage
//! part cut to 218, the label shortened to 63 with Kargo's hash, the whole name in the
//! `kargo.akuity.io/stage` annotation: `dispatch_tests::kargo::naming`), and our server runs a
//! Job per metric carrying the whole Stage name, read from that annotation.

use anyhow::{ensure, Result};
use dispatch_tests::analysis::{self, phase};
use dispatch_tests::kargo::Verification;
use dispatch_tests::objects::{job_env, jobs_of};

use crate::{report, side_by_side};

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_stage_of_the_longest_name_with_two_metrics_runs_a_job_per_metric_with_its_whole_name(
) -> Result<()> {
    side_by_side(async |w| {
        let stage = format!("long-{}", "s".repeat(248));
        let one = Verification::new(&stage, "01jlong0000000000000000000", "cluster-a");
        let two_metrics = one.clone().with_metric("second", one.block_json());
        let run = w.finished(&w.submit(&two_metrics).await?).await?;
        ensure!(
            phase(&run) == "Successful" && analysis::name(&run).len() == 253,
            "want Successful, named in 253 characters: {}",
            report(w, &run)
        );
        let jobs = jobs_of(&w.a, &analysis::uid(&run)).await?;
        let staged = jobs
            .iter()
            .filter(|job| job_env(job).contains(&("KARGO_STAGE".into(), stage.clone())))
            .count();
        ensure!(
            jobs.len() == 2 && staged == 2,
            "want 2 Jobs on cluster-a with KARGO_STAGE the whole Stage name: {} Jobs, {staged} \
             with it",
            jobs.len()
        );
        println!("e2e: a 253-character Stage with 2 metrics: Successful, 2 Jobs with its name");
        Ok(())
    })
}
