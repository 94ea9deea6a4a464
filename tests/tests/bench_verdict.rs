//! `make bench-verdict`: how long after a verification Job completes does its AnalysisRun change
//! phase? Ours (plugin → server → Job on cluster a) against Argo Rollouts' built-in `job`
//! provider (Job on the control-plane cluster), with the same Job durations (5 s, 60 s, 300 s),
//! the same controller and the same observer (one list of Jobs per cluster and one of
//! AnalysisRuns every 100 ms), started in staggered rounds.
//!
//! Why the durations matter: the built-in provider's `Resume` waits √(2·elapsed) before it looks
//! again (argo-rollouts `metricproviders/job/job.go:243-246`), and the controller skips a
//! measurement whose `resumeAt` is ahead even when the Job's completion enqueued the run
//! (`analysis/analysis.go:189`): after 300 s it looks every ~24 s. Ours follows the server's
//! resume hints (#30, `metric-provider/src/resume.rs`): the server's watch sees the Job end, the
//! plugin moves the measurement's `resumeAt` to now, and between hints it looks every
//! `2·√(2·elapsed)` up to 60 s. Each look is one status patch of the AnalysisRun: a watch counts
//! them per running measurement per minute, on both sides.
//!
//! Last line: `verdict_ratio_5s=X verdict_ratio_60s=Y verdict_ratio_300s=Z writes_ratio=W`
//! (ours over built-in: p50 latencies, and status writes per running measurement per minute at
//! the longest duration run). The observer looks every 100 ms: a verdict within that reads 0.
//!
//! Sizes from the environment: `BENCH_VERDICT_RUNS` (7 rounds) and `BENCH_VERDICT_DURATIONS`
//! (`5,60,300`: which of the durations to run); `make test` runs one round of 5 s Jobs.

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

/// Verifications of each kind and duration, started in this many rounds (by default).
const RUNS: usize = 7;
/// Between two rounds.
const STAGGER: Duration = Duration::from_secs(2);
/// The Job durations compared: (seconds, label in the last line). Round `i` of `RUNS` adds
/// `i/RUNS` of the built-in provider's wait at that duration (√(2·d) s): its looks follow a fixed
/// schedule from each run's start, so a Job that always ends at the same second always lands at
/// the same point between two looks (a lucky or an unlucky one); real checks do not last a fixed
/// number of seconds, and the spread samples that point evenly. Ours and the built-in get the
/// same durations.
const DURATIONS: [(u64, &str); 3] = [(5, "5s"), (60, "60s"), (300, "300s")];
/// How long the whole bench may take: the longest Job, plus the built-in provider's last wait
/// (√600 ≈ 25 s), plus scheduling on a loaded machine.
const BENCH_TIMEOUT: Duration = Duration::from_secs(15 + 325 + 240);

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

/// The rounds and durations to run: `BENCH_VERDICT_RUNS`, `BENCH_VERDICT_DURATIONS`.
fn sizes() -> Result<(usize, Vec<(u64, &'static str)>)> {
    let runs = match std::env::var("BENCH_VERDICT_RUNS") {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("BENCH_VERDICT_RUNS={v:?} is not a count"))?,
        Err(_) => RUNS,
    };
    let durations = match std::env::var("BENCH_VERDICT_DURATIONS") {
        Ok(v) => {
            let wanted: Vec<&str> = v.split(',').map(str::trim).collect();
            let chosen: Vec<_> = DURATIONS
                .into_iter()
                .filter(|(seconds, _)| wanted.contains(&seconds.to_string().as_str()))
                .collect();
            if chosen.len() != wanted.len() {
                bail!("BENCH_VERDICT_DURATIONS={v:?}: each must be one of 5, 60, 300");
            }
            chosen
        }
        Err(_) => DURATIONS.to_vec(),
    };
    if runs == 0 || durations.is_empty() {
        bail!("BENCH_VERDICT_RUNS and BENCH_VERDICT_DURATIONS must name at least one run");
    }
    Ok((runs, durations))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make bench-verdict`"]
async fn verdict_latency_against_the_builtin_job_provider() -> Result<()> {
    let (rounds_n, durations) = sizes()?;
    // Keep the whole world alive to the end: its clusters stop when it is dropped.
    let world = World::start().await?;
    let (a, client) = (&world.a, world.client.clone());
    let runs = world.runs();
    let patches = Arc::new(Mutex::new(HashMap::new()));
    let watcher = tokio::spawn(count_patches(runs.clone(), patches.clone()));
    // Started in rounds, STAGGER apart, while the observer below runs (so that not every Job
    // completes in the same instant; see DURATIONS for what makes the samples fair).
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    // Every round's AnalysisRuns, built up front (ours as Kargo creates them).
    let mut rounds = Vec::new();
    for i in 0..rounds_n {
        let mut round = Vec::new();
        for (d, (seconds, label)) in durations.iter().enumerate() {
            // `seconds` plus i/rounds of √(2·seconds), in milliseconds.
            let spread = (2.0 * *seconds as f64).sqrt() * i as f64 / rounds_n as f64;
            let duration = &format!("{}ms", *seconds * 1000 + (spread * 1000.0) as u64);
            let ulid = format!("01jbench{d}{i:017}");
            let ours = Verification::new(&format!("v{d}x{i}"), &ulid, "cluster-a")
                .runs_for(duration)
                .analysis_run(&world.freight)?;
            let builtin = builtin_run(&format!("builtin-{d}x{i}"), duration)?;
            round.push((ours, true, *label));
            round.push((builtin, false, *label));
        }
        rounds.push(round);
    }
    let mut creator = {
        let runs = runs.clone();
        tokio::spawn(async move {
            let post = PostParams::default();
            for round in rounds {
                for (object, ours, duration) in round {
                    let o = runs.create(&post, &object).await?;
                    let run = Run {
                        ours,
                        uid: o.metadata.uid.clone().unwrap_or_default(),
                        duration,
                    };
                    let name = o.metadata.name.clone().unwrap_or_default();
                    let _ = started_tx.send((name, run, Instant::now()));
                }
                tokio::time::sleep(STAGGER).await;
            }
            anyhow::Ok(())
        })
    };
    let mut kinds: HashMap<String, Run> = HashMap::new(); // run name → what it is
    let mut started: HashMap<String, Instant> = HashMap::new();
    let jobs_a: Api<Job> = Api::all(a.client().await?);
    let jobs_control: Api<Job> = Api::all(client.clone());
    // Ours on `a`, the built-in provider's (Argo's label) on the control plane.
    let by_uid = ListParams::default().labels(RUN_UID_LABEL);
    let by_argo_uid = ListParams::default().labels(ARGO_RUN_UID_LABEL);
    let mut job_done: HashMap<String, Instant> = HashMap::new(); // run uid → first seen Complete
    let mut run_done: HashMap<String, (Instant, String)> = HashMap::new(); // run name → when, phase
    let deadline = Instant::now() + BENCH_TIMEOUT;
    let mut creating = true;
    while creating || run_done.len() < kinds.len() {
        while let Ok((name, run, at)) = started_rx.try_recv() {
            started.insert(name.clone(), at);
            kinds.insert(name, run);
        }
        if creating && creator.is_finished() {
            creating = false;
            (&mut creator).await??;
            while let Ok((name, run, at)) = started_rx.try_recv() {
                started.insert(name.clone(), at);
                kinds.insert(name, run);
            }
        }
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
            if is_finished(&r) && kinds.contains_key(dispatch_tests::analysis::name(&r)) {
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
    for (_, label) in durations.iter().copied() {
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
    let longest = durations.last().map_or("300s", |(_, label)| label);
    let per_min = |ours| {
        let (n, min) = cost[&(longest, ours)];
        n / min
    };
    line.push(format!(
        "writes_ratio={:.2}",
        per_min(true) / per_min(false)
    ));
    summary::report(&line.join(" "))
}
