//! `make bench-engine`: status lookups of 10 000 in-flight Jobs across 5 real clusters, through
//! the engine's watch caches and, side by side, through a naive engine that asks the API server
//! on every lookup (GET the Job, list its Pods: what the verdict needs without a cache).
//!
//! The Jobs are created through `Engine::ensure` and are suspended (`spec.suspend: true`):
//! in flight for as long as the benchmark runs, without 10 000 pods on a 2-core machine. Both
//! engines see the same objects; every lookup must say `Running`.
//!
//! Knobs (environment): `BENCH_JOBS` (10000), `BENCH_CLUSTERS` (5), `BENCH_ROUNDS` (3 rounds of
//! cached lookups over every Job), `BENCH_NAIVE_LOOKUPS` (2000), `BENCH_CREATE_CONCURRENCY` (48).
//! The last line is `api_requests_per_lookup=X naive_api_requests_per_lookup=Y lookup_p99_us=Z`
//! (also written to `$SUMMARY_FILE` if set).

mod engine_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dispatch_server::destinations::Entry;
use dispatch_server::engine::{JobRef, Outcome};
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use dispatch_tests::cluster::{start_many, Cluster};
use dispatch_tests::summary;
use engine_support::*;
use rand::Rng;
use serde_json::json;

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

#[test]
#[ignore = "needs clusters: make bench-engine"]
fn bench_engine() -> Result<()> {
    run(async {
        let jobs = knob("BENCH_JOBS", 10_000);
        let n_clusters = knob("BENCH_CLUSTERS", 5);
        let rounds = knob("BENCH_ROUNDS", 3);
        let naive_lookups = knob("BENCH_NAIVE_LOOKUPS", 2000).min(jobs);
        let concurrency = knob("BENCH_CREATE_CONCURRENCY", 48);

        let started = Instant::now();
        let names: Vec<String> = (1..=n_clusters).map(|i| format!("bench-{i}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let clusters: Vec<Cluster> = start_many(&refs).await?;
        println!(
            "bench: {n_clusters} clusters ready in {:.1}s",
            started.elapsed().as_secs_f64()
        );

        let yaml = destinations_yaml(
            &clusters
                .iter()
                .map(|c| (c, "{bench: \"true\"}"))
                .collect::<Vec<_>>(),
        );
        let engine = engine(&yaml).await?;
        let unsynced = engine.wait_synced(Duration::from_secs(60)).await;
        ensure!(unsynced.is_empty(), "caches not synced: {unsynced:?}");

        // Create the Jobs through the engine, round-robin over the clusters.
        let created_at = Instant::now();
        let next = Arc::new(AtomicUsize::new(0));
        let names = Arc::new(names);
        let mut workers = tokio::task::JoinSet::new();
        for _ in 0..concurrency {
            let (engine, next, names) = (engine.clone(), next.clone(), names.clone());
            workers.spawn(async move {
                let mut refs: Vec<JobRef> = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= jobs {
                        return Ok::<_, anyhow::Error>(refs);
                    }
                    let dest = &names[i % names.len()];
                    let config = block(json!({"destination": dest}), 0, "1h", json!({}))?;
                    let mut config = config;
                    if let Some(spec) = config.job_spec_mut() {
                        spec.insert("suspend".into(), true.into());
                    }
                    let run = run_context("bench", None);
                    let ensured = engine.ensure(&request(&run, "lookup", 1, config)).await?;
                    match &ensured.outcomes[0].1 {
                        Outcome::Created | Outcome::Adopted => refs.push(ensured.job),
                        Outcome::NotCreated(s) => bail!("job {i} on {dest}: {s:?}"),
                        Outcome::Observed(o) => {
                            bail!("job {i} on {dest}: observes {o}, a Job was asked")
                        }
                    }
                }
            });
        }
        let mut all: Vec<JobRef> = Vec::with_capacity(jobs);
        while let Some(r) = workers.join_next().await {
            all.extend(r.context("create worker")??);
        }
        let create_s = created_at.elapsed().as_secs_f64();
        println!(
            "bench: created {} Jobs through Engine::ensure in {create_s:.1}s ({:.0}/s)",
            all.len(),
            all.len() as f64 / create_s
        );

        // Warm-up: every Job is in its destination's cache.
        let cached = || {
            engine
                .registry()
                .entries()
                .iter()
                .map(|e| match e {
                    Entry::Ready(d) => d.jobs().len(),
                    Entry::Broken(_) | Entry::Agent(_) => 0,
                })
                .sum::<usize>()
        };
        eventually(
            "every Job in the watch caches",
            Duration::from_secs(120),
            || async { Ok((cached() >= jobs).then_some(())) },
        )
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;

        // Watch-cache lookups: every Job, `rounds` times, in random order.
        let secrets = Redactor::default();
        let mut order: Vec<usize> = (0..all.len()).collect();
        let mut latencies = Vec::with_capacity(all.len() * rounds);
        let before = engine.api_requests();
        let lookups_at = Instant::now();
        for _ in 0..rounds {
            shuffle(&mut order);
            for &i in &order {
                let t = Instant::now();
                let v = engine.status(&all[i], &secrets).await;
                latencies.push(t.elapsed());
                if v.phase != Phase::Running {
                    bail!("job {}: {} {}", all[i].name, v.phase, v.message);
                }
            }
        }
        let lookups_s = lookups_at.elapsed().as_secs_f64();
        let cached_requests = engine.api_requests() - before;
        let lookups = latencies.len();
        latencies.sort();

        // The naive engine: GET + list per lookup, same Jobs.
        shuffle(&mut order);
        let mut naive = Vec::with_capacity(naive_lookups);
        let before = engine.api_requests();
        for &i in order.iter().take(naive_lookups) {
            let t = Instant::now();
            let v = engine.status_uncached(&all[i], &secrets).await;
            naive.push(t.elapsed());
            if v.phase != Phase::Running {
                bail!("naive: job {}: {} {}", all[i].name, v.phase, v.message);
            }
        }
        let naive_requests = engine.api_requests() - before;
        naive.sort();

        let x = cached_requests as f64 / lookups as f64;
        let y = naive_requests as f64 / naive.len().max(1) as f64;
        let z = percentile(&latencies, 0.99);
        println!(
            "bench: watch cache: {lookups} lookups in {lookups_s:.2}s, {cached_requests} API requests, \
             latency p50={:.1}us p99={z:.1}us max={:.1}us",
            percentile(&latencies, 0.5),
            percentile(&latencies, 1.0)
        );
        println!(
            "bench: naive GET per lookup: {} lookups, {naive_requests} API requests, latency p50={:.1}us p99={:.1}us",
            naive.len(),
            percentile(&naive, 0.5),
            percentile(&naive, 0.99)
        );
        let line = format!(
            "api_requests_per_lookup={x:.4} naive_api_requests_per_lookup={y:.2} lookup_p99_us={z:.0}"
        );
        drop(engine);
        drop(clusters);
        summary::report(&line)
    })
}

fn shuffle(v: &mut [usize]) {
    let mut r = rand::rng();
    for i in (1..v.len()).rev() {
        let j = r.random_range(0..=i);
        v.swap(i, j);
    }
}
