//! `make bench-verdict`: how long after a verification Job completes does its AnalysisRun change
//! phase? Ours (plugin → server → Job on cluster a) against Argo Rollouts' built-in `job`
//! provider (Job on the control-plane cluster), with the same Job durations (5 s, 60 s, 300 s),
//! the same controller and the same observer (one list of Jobs per cluster and one of
//! AnalysisRuns every 100 ms), all started together.
//!
//! Why the durations matter: the built-in provider's `Resume` waits √(2·elapsed) before it looks
//! again (argo-rollouts `metricproviders/job/job.go:243-246`), and the controller skips a
//! measurement whose `resumeAt` is ahead even when the Job's completion enqueued the run
//! (`analysis/analysis.go:189`): after 300 s it looks every ~24 s. Ours looks at most every
//! `--max-resume-interval` (3 s). The price of looking often is one status patch of the
//! AnalysisRun per look: a watch counts them (`patches_per_min`, per running measurement).
//!
//! Last line: `verdict_ratio_5s=X verdict_ratio_60s=Y verdict_ratio_300s=Z patches_per_min=P`
//! (ours over built-in, p50 of each).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use dispatch_tests::analysis::{is_finished, phase};
use dispatch_tests::block::Block;
use dispatch_tests::kargo::{Verification, PROJECT};
use dispatch_tests::objects::{ARGO_RUN_UID_LABEL, RUN_UID_LABEL};
use dispatch_tests::summary;
use dispatch_tests::world::World;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

/// Verifications of each kind and duration, all started together.
const RUNS: usize = 5;
/// The Job durations compared: (Go duration, label in the last line).
const DURATIONS: [(&str, &str); 3] = [("5s", "5s"), ("60s", "60s"), ("300s", "300s")];
/// How long the whole bench may take: the longest Job, plus the built-in provider's last wait
/// (√600 ≈ 25 s), plus scheduling on a loaded machine.
const BENCH_TIMEOUT: Duration = Duration::from_secs(300 + 240);

/// What the bench knows of one AnalysisRun.
struct Run {
    ours: bool,
    uid: String,
    duration: &'static str,
}

fn builtin_run(name: &str, duration: &str) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": PROJECT},
        "spec": {"metrics": [{"name": "smoke", "provider": {"job": {
            "spec": Block::default().runs_for(duration).job_spec()
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

/// Counts the changes the controller writes to each AnalysisRun up to and including the one that
/// records its verdict (run name → (changes, decided)). Restarts the watch where it stopped (the
/// API server ends a watch after a few minutes).
async fn count_patches(runs: Api<DynamicObject>, counts: Arc<Mutex<HashMap<String, (u32, bool)>>>) {
    let mut version = "0".to_string();
    loop {
        let params = WatchParams::default().timeout(240);
        let Ok(stream) = runs.watch(&params, &version).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            match event {
                WatchEvent::Modified(run) => {
                    version = run.metadata.resource_version.clone().unwrap_or(version);
                    let name = run.metadata.name.clone().unwrap_or_default();
                    let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
                    let (changes, decided) = counts.entry(name).or_default();
                    if !*decided {
                        *changes += 1;
                        *decided = is_finished(&run);
                    }
                }
                WatchEvent::Added(run) | WatchEvent::Deleted(run) => {
                    version = run.metadata.resource_version.clone().unwrap_or(version);
                }
                WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                // Too old a version: start again from now (a few changes may go uncounted).
                WatchEvent::Error(_) => version = "0".into(),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make bench-verdict`"]
async fn verdict_latency_against_the_builtin_job_provider() -> Result<()> {
    // Keep the whole world alive to the end: its clusters stop when it is dropped.
    let world = World::start().await?;
    let (a, client) = (&world.a, world.client.clone());
    let runs = world.runs();
    let patches = Arc::new(Mutex::new(HashMap::new()));
    let watcher = tokio::spawn(count_patches(runs.clone(), patches.clone()));
    let post = PostParams::default();
    let mut kinds: HashMap<String, Run> = HashMap::new(); // run name → what it is
    let mut started: HashMap<String, Instant> = HashMap::new();
    for (d, (duration, label)) in DURATIONS.iter().enumerate() {
        for i in 0..RUNS {
            let ulid = format!("01jbench{d}{i:017}");
            let ours = world
                .submit(
                    &Verification::new(&format!("v{d}x{i}"), &ulid, "cluster-a").runs_for(duration),
                )
                .await?;
            let builtin = runs
                .create(&post, &builtin_run(&format!("builtin-{d}x{i}"), duration)?)
                .await?;
            for (o, ours) in [(ours, true), (builtin, false)] {
                let name = o.metadata.name.clone().unwrap_or_default();
                started.insert(name.clone(), Instant::now());
                let uid = o.metadata.uid.clone().unwrap_or_default();
                kinds.insert(
                    name,
                    Run {
                        ours,
                        uid,
                        duration: label,
                    },
                );
            }
        }
    }
    let jobs_a: Api<Job> = Api::all(a.client().await?);
    let jobs_control: Api<Job> = Api::all(client.clone());
    // Ours on `a`, the built-in provider's (Argo's label) on the control plane.
    let by_uid = ListParams::default().labels(RUN_UID_LABEL);
    let by_argo_uid = ListParams::default().labels(ARGO_RUN_UID_LABEL);
    let mut job_done: HashMap<String, Instant> = HashMap::new(); // run uid → first seen Complete
    let mut run_done: HashMap<String, (Instant, String)> = HashMap::new(); // run name → when, phase
    let deadline = Instant::now() + BENCH_TIMEOUT;
    while run_done.len() < kinds.len() {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} runs finished in {BENCH_TIMEOUT:?}",
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
    // Let the watch catch up with the last verdicts before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watcher.abort();
    let patches = patches.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // (duration, ours?) → latencies; (duration, ours?) → (patches, running minutes)
    let mut latency: HashMap<(&str, bool), Vec<f64>> = HashMap::new();
    let mut cost: HashMap<(&str, bool), (f64, f64)> = HashMap::new();
    let mut names: Vec<&String> = kinds.keys().collect();
    names.sort();
    for name in names {
        let run = &kinds[name];
        let (at, phase) = &run_done[name];
        let Some(job_at) = job_done.get(&run.uid) else {
            bail!("run {name} finished {phase} but its Job was never seen Complete");
        };
        if phase != "Successful" {
            bail!("run {name} finished {phase}, want Successful");
        }
        let ms = at.saturating_duration_since(*job_at).as_secs_f64() * 1000.0;
        let running_min = at.saturating_duration_since(started[name]).as_secs_f64() / 60.0;
        let changes = f64::from(patches.get(name).map_or(0, |(n, _)| *n));
        println!(
            "{name:<40} {:<8} {:>5} job complete → run {phase}: {ms:>7.0} ms, {changes:>4} status changes in {running_min:.1} min",
            if run.ours { "plugin" } else { "builtin" },
            run.duration,
        );
        latency
            .entry((run.duration, run.ours))
            .or_default()
            .push(ms);
        let c = cost.entry((run.duration, run.ours)).or_default();
        c.0 += changes;
        c.1 += running_min;
    }
    let mut line = Vec::new();
    for (_, label) in DURATIONS {
        let ours = p50(latency.remove(&(label, true)).unwrap_or_default());
        let builtin = p50(latency.remove(&(label, false)).unwrap_or_default());
        let rate = |ours| {
            let (n, min) = cost[&(label, ours)];
            n / min
        };
        println!(
            "{label:>5} Jobs: p50 ours {ours:.0} ms, built-in {builtin:.0} ms; status changes per running measurement per minute: ours {:.1}, built-in {:.1}",
            rate(true),
            rate(false)
        );
        line.push(format!("verdict_ratio_{label}={:.2}", ours / builtin));
    }
    // The steady-state cost: the longest Jobs, where the first seconds' faster looks weigh least.
    let (n, min) = cost[&("300s", true)];
    line.push(format!("patches_per_min={:.1}", n / min));
    summary::report(&line.join(" "))
}
