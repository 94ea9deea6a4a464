//! Helpers shared by the dispatch-engine tests (`engine/`) and benchmark (`engine_bench.rs`):
//! run UIDs, plugin blocks as the engine takes them, engine configs and verdict waits. The
//! runtime, the block builder and `eventually` are the scene library's (`dispatch_tests`).

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_api::JobConfig;
use dispatch_server::config::ServerConfig;
use dispatch_server::engine::{Engine, JobRef, MeasureRequest};
use dispatch_server::job::RunContext;
use dispatch_server::logs::Redactor;
use dispatch_server::signing::Signer;
use dispatch_server::verdict::Verdict;
use dispatch_tests::block::{Block, RULE_ALLOWS};
use dispatch_tests::cluster::Cluster;
pub use dispatch_tests::eventually;
use dispatch_tests::kargo::{promotion_name, FREIGHT_COLLECTION_ID, FREIGHT_NAME};
use dispatch_tests::wait::Progress;
use rand::Rng;
use serde_json::{json, Value};

/// Runs `f` on the runtime shared by every test of the binary (clusters, kube clients and
/// engine watch tasks outlive a single test).
pub fn run<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    dispatch_tests::shared::block_on(f)
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

/// A run in `namespace` (when `stage` is set, Kargo's labels and annotation of a first
/// verification, as `dispatch_tests::kargo` shapes them).
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
            FREIGHT_COLLECTION_ID.into(),
        );
        run.annotations.insert(
            "kargo.akuity.io/promotion".into(),
            promotion_name(s, FREIGHT_NAME),
        );
    }
    run
}

/// A plugin block: `routing` fields (destination, require, …) plus a Job whose container exits
/// `exit_code` after `duration` (kwok), and the fields of `pod_spec` set in the pod spec.
pub fn block(routing: Value, exit_code: i32, duration: &str, pod_spec: Value) -> Result<JobConfig> {
    let mut block = Block::routed(routing)
        .exits(exit_code)
        .runs_for(duration)
        .container(
            "env",
            json!([{"name": "ANALYSIS_METRIC", "value": "set-by-user"}]),
        );
    for (key, value) in pod_spec.as_object().into_iter().flatten() {
        block = block.pod(key, value.clone());
    }
    JobConfig::parse(block.json().to_string().as_bytes())
        .map_err(|e| anyhow::anyhow!("plugin block: {e}"))
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

/// Starts an engine from YAML. The policy denies by default: YAML without a `policy:` gets a
/// rule for every project everywhere that lets the blocks' kwok annotations and `nodeSelector`
/// through (`allowAll` allows neither: #27); the tests about the policy bring their own.
pub async fn engine(yaml: &str) -> Result<Engine> {
    let yaml = if yaml.contains("policy:") {
        yaml.to_string()
    } else {
        format!(
            "{yaml}\npolicy: {{rules: [{{projects: ['*'], destinations: ['*'], namespaces: ['*'], \
             scheduling: [nodeSelector], {RULE_ALLOWS}}}]}}\n"
        )
    };
    let config = ServerConfig::parse(&yaml, "config file engine-test.yaml")
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let engine = Engine::start(config).await.context("starting the engine")?;
    // Every engine of a test shares one mark key, as replicas do: each adopts the others' Jobs.
    engine.mark_jobs_with(Arc::new(Signer::new(&[MARK_KEY.to_vec()])?));
    Ok(engine)
}

/// The Job mark key of every test engine.
pub const MARK_KEY: &[u8] = b"engine-test-mark-key-0123456789abcdef";

/// Polls `engine.status(job)` until `done` holds.
pub async fn wait_verdict(
    engine: &Engine,
    job: &JobRef,
    secrets: &Redactor,
    timeout: Duration,
    done: impl Fn(&Verdict) -> bool,
) -> Result<Verdict> {
    eventually(
        &format!("the verdict of job {}", job.name),
        timeout,
        || async {
            let verdict = engine.status(job, secrets).await;
            Ok(if done(&verdict) {
                Progress::Done(verdict)
            } else {
                Progress::Waiting(format!("{} {:?}", verdict.phase, verdict.message))
            })
        },
    )
    .await
}
