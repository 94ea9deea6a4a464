//! Helpers shared by the dispatch-engine tests (`engine.rs`) and benchmark (`engine_bench.rs`):
//! one tokio runtime per test binary, run UIDs, plugin blocks, engine configs and waits.

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_api::JobConfig;
use dispatch_server::config::ServerConfig;
use dispatch_server::engine::{Engine, JobRef, MeasureRequest};
use dispatch_server::job::RunContext;
use dispatch_server::logs::Redactor;
use dispatch_server::verdict::Verdict;
use dispatch_tests::cluster::kwok::lifecycle_annotations;
use dispatch_tests::cluster::Cluster;
use rand::Rng;
use serde_json::{json, Value};

/// One runtime for the whole test binary: clusters, kube clients and engine watch tasks outlive
/// a single test (tests share the clusters).
pub static RT: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("cannot build the tokio runtime: {e}"))
});

/// Runs `f` on [`RT`].
pub fn run<F: Future<Output = Result<()>>>(f: F) -> Result<()> {
    RT.block_on(f)
}

/// A fresh UUID-shaped run UID.
pub fn run_uid() -> String {
    let mut r = rand::rng();
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        r.random::<u32>(),
        r.random::<u16>(),
        r.random::<u16>() & 0xfff,
        r.random::<u16>() & 0xfff,
        r.random::<u64>() & 0xffff_ffff_ffff
    )
}

/// A run in `namespace` (Kargo labels when `stage` is set).
pub fn run_context(namespace: &str, stage: Option<&str>) -> RunContext {
    let uid = run_uid();
    let mut run = RunContext {
        name: format!("run-{}", &uid[..8]),
        namespace: namespace.to_string(),
        uid,
        ..RunContext::default()
    };
    if let Some(s) = stage {
        run.labels
            .insert("kargo.akuity.io/stage".into(), s.to_string());
        run.labels.insert(
            "kargo.akuity.io/freight-collection".into(),
            "55d4523".into(),
        );
        run.annotations
            .insert("kargo.akuity.io/promotion".into(), format!("{s}.promo.1"));
    }
    run
}

/// A plugin block: `routing` fields (destination, require, …) plus a Job whose container exits
/// `exit_code` after `duration` (kwok), and `pod_spec` merged into the pod spec.
pub fn block(routing: Value, exit_code: i32, duration: &str, pod_spec: Value) -> Result<JobConfig> {
    let mut spec = json!({
        "restartPolicy": "Never",
        "containers": [{
            "name": "check",
            "image": "example.invalid/check:1",
            "env": [{"name": "ANALYSIS_METRIC", "value": "set-by-user"}]
        }]
    });
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), pod_spec.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    let mut b = json!({
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": lifecycle_annotations(exit_code, duration)},
                "spec": spec
            }
        }
    });
    if let (Some(o), Some(r)) = (b.as_object_mut(), routing.as_object()) {
        for (k, v) in r {
            o.insert(k.clone(), v.clone());
        }
    }
    JobConfig::parse(b.to_string().as_bytes()).map_err(|e| anyhow::anyhow!("plugin block: {e}"))
}

/// A measurement request.
pub fn request(run: &RunContext, metric: &str, n: u32, config: JobConfig) -> MeasureRequest {
    MeasureRequest {
        run: run.clone(),
        metric: metric.to_string(),
        measurement: n,
        config,
        secrets: Vec::new(),
    }
}

/// YAML `destinations:` entries for `clusters` (name = cluster name) with `labels` each.
pub fn destinations_yaml(clusters: &[(&Cluster, &str)]) -> String {
    let mut s = String::from("destinations:\n");
    for (c, labels) in clusters {
        s.push_str(&format!(
            "- name: {}\n  kubeconfig: {}\n  labels: {labels}\n",
            c.name,
            c.kubeconfig.display()
        ));
    }
    s
}

/// Starts an engine from YAML.
pub async fn engine(yaml: &str) -> Result<Engine> {
    let config = ServerConfig::parse(yaml, "config file engine-test.yaml")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Engine::start(config).await.context("starting the engine")
}

/// Polls `engine.status(job)` until `done` holds.
pub async fn wait_verdict(
    engine: &Engine,
    job: &JobRef,
    secrets: &Redactor,
    timeout: Duration,
    done: impl Fn(&Verdict) -> bool,
) -> Result<Verdict> {
    let deadline = Instant::now() + timeout;
    loop {
        let v = engine.status(job, secrets).await;
        if done(&v) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!(
                "job {}: verdict not reached after {timeout:?}; last {} {:?}",
                job.name,
                v.phase,
                v.message
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Polls `check` until it returns `Ok(Some(_))`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not true after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
