//! `make bench-verdict`: how long after a verification Job completes does its AnalysisRun change
//! phase? Ours (plugin → server → Job on cluster a) against Argo Rollouts' built-in `job`
//! provider (Job on the control-plane cluster), with the same Job duration, the same controller
//! and the same observer (one list of Jobs per cluster and one of AnalysisRuns every 100 ms).
//!
//! Last line: `verdict_p50_ms=X builtin_job_p50_ms=Y`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use dispatch_tests::analysis::{is_finished, phase};
use dispatch_tests::block::Block;
use dispatch_tests::kargo::{Verification, PROJECT};
use dispatch_tests::objects::{ARGO_RUN_UID_LABEL, RUN_UID_LABEL};
use dispatch_tests::summary;
use dispatch_tests::world::World;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

/// Verifications of each kind, started together.
const RUNS: usize = 6;
/// How long each verification Job runs.
const JOB_DURATION: &str = "6s";

fn builtin_run(i: usize) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": format!("builtin-{i}"), "namespace": PROJECT},
        "spec": {"metrics": [{"name": "smoke", "provider": {"job": {
            "spec": Block::default().runs_for(JOB_DURATION).job_spec()
        }}}]}
    }))?)
}

fn completed(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
}

fn p50(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make bench-verdict`"]
async fn verdict_latency_against_the_builtin_job_provider() -> Result<()> {
    // Keep the whole world alive to the end: its clusters stop when it is dropped.
    let world = World::start().await?;
    let (a, client) = (&world.a, world.client.clone());
    let runs = world.runs();
    let post = PostParams::default();
    // run name → (ours?, uid)
    let mut kinds: HashMap<String, (bool, String)> = HashMap::new();
    for i in 0..RUNS {
        let ulid = format!("01jbench{i:018}");
        let ours = world
            .submit(&Verification::new(&format!("v{i}"), &ulid, "cluster-a").runs_for(JOB_DURATION))
            .await?;
        let builtin = runs.create(&post, &builtin_run(i)?).await?;
        for (o, is_ours) in [(ours, true), (builtin, false)] {
            kinds.insert(
                o.metadata.name.clone().unwrap_or_default(),
                (is_ours, o.metadata.uid.clone().unwrap_or_default()),
            );
        }
    }
    let jobs_a: Api<Job> = Api::all(a.client().await?);
    let jobs_control: Api<Job> = Api::all(client.clone());
    // Ours on `a`, the built-in provider's (Argo's label) on the control plane.
    let by_uid = ListParams::default().labels(RUN_UID_LABEL);
    let by_argo_uid = ListParams::default().labels(ARGO_RUN_UID_LABEL);
    let mut job_done: HashMap<String, Instant> = HashMap::new(); // run uid → first seen Complete
    let mut run_done: HashMap<String, (Instant, String)> = HashMap::new(); // run name → when, phase
    let deadline = Instant::now() + Duration::from_secs(240);
    while run_done.len() < kinds.len() {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} runs finished in 240s",
                run_done.len(),
                kinds.len()
            );
        }
        let now = Instant::now();
        for (api, params) in [(&jobs_a, &by_uid), (&jobs_control, &by_argo_uid)] {
            for j in api
                .list(params)
                .await?
                .items
                .iter()
                .filter(|j| completed(j))
            {
                if let Some(uid) = j
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(RUN_UID_LABEL).or_else(|| l.get(ARGO_RUN_UID_LABEL)))
                {
                    job_done.entry(uid.clone()).or_insert(now);
                }
            }
        }
        for r in runs.list(&ListParams::default()).await?.items {
            if is_finished(&r) {
                run_done
                    .entry(r.metadata.name.clone().unwrap_or_default())
                    .or_insert((now, phase(&r)));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (mut ours, mut builtin) = (Vec::new(), Vec::new());
    for (name, (is_ours, uid)) in &kinds {
        let (at, phase) = &run_done[name];
        let Some(job_at) = job_done.get(uid) else {
            bail!("run {name} finished {phase} but its Job was never seen Complete");
        };
        if phase != "Successful" {
            bail!("run {name} finished {phase}, want Successful");
        }
        let ms = at.saturating_duration_since(*job_at).as_secs_f64() * 1000.0;
        println!(
            "{name:<40} {:<8} job complete → run {phase}: {ms:>7.0} ms",
            if *is_ours { "plugin" } else { "builtin" }
        );
        if *is_ours {
            ours.push(ms)
        } else {
            builtin.push(ms)
        }
    }
    summary::report(&format!(
        "verdict_p50_ms={:.0} builtin_job_p50_ms={:.0}",
        p50(ours),
        p50(builtin)
    ))
}
