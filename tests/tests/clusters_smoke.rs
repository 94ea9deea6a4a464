//! Smoke tests on real clusters: Kubernetes control planes, kwok and the Argo Rollouts controller
//! built from their Go modules (`make k8s-bin`).
//!
//! One test starts clusters `a`, `b` and `control` in parallel and then checks, concurrently:
//! a Job on `a` whose container exits 0 gets `Complete` from the real Job controller; a Job on
//! `b` whose container exits 1 gets `Failed`; on `control`, the real Argo Rollouts controller
//! runs an AnalysisRun with a built-in `job` metric to `Successful` and another to `Failed`, and
//! loads the `rollouts-dispatch/job` metric plugin (go-plugin starts it and `InitPlugin`
//! succeeds) for an AnalysisRun that uses it.
//!
//! It is `#[ignore]`d so that a plain `cargo test` does not need the binaries; `make
//! clusters-smoke` runs it with `--ignored`, and then it fails (never skips) when something is
//! missing. The plugin binary is `$PLUGIN_BINARY`, by default
//! `target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin` of the workspace (what
//! `make plugin-release` builds).
//! The last line it prints (also written to `$SMOKE_SUMMARY_FILE` if set) is
//! `clusters_ready=N start_s_p50=X smoke=pass`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::kwok::lifecycle_annotations;
use dispatch_tests::cluster::{start_many, Cluster};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, PodTemplateSpec};
use kube::api::{Api, DynamicObject, ListParams, ObjectMeta, PostParams};
use serde_json::{json, Value};

/// Name under which the plugin is registered in `argo-rollouts-config`.
const PLUGIN_NAME: &str = "rollouts-dispatch/job";

fn plugin_binary() -> Result<PathBuf> {
    let path = match std::env::var_os("PLUGIN_BINARY") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin"),
    };
    if !path.is_file() {
        bail!(
            "plugin binary {} is missing: run `make plugin-release` or set PLUGIN_BINARY",
            path.display()
        );
    }
    std::fs::canonicalize(&path).with_context(|| format!("resolving {}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries: run `make clusters-smoke`"]
async fn clusters_smoke() -> Result<()> {
    let plugin = plugin_binary()?;
    let started = Instant::now();
    let clusters = start_many(&["a", "b", "control"]).await?;
    let mut start_s: Vec<f64> = clusters
        .iter()
        .map(|c| c.start_time.as_secs_f64())
        .collect();
    for c in &clusters {
        println!(
            "cluster {} ready in {:.1}s at {} ({})",
            c.name,
            c.start_time.as_secs_f64(),
            c.server,
            c.kubeconfig.display()
        );
    }
    println!(
        "{} clusters ready after {:.1}s (parallel)",
        clusters.len(),
        started.elapsed().as_secs_f64()
    );
    let [a, b, mut control]: [Cluster; 3] = clusters
        .try_into()
        .map_err(|_| anyhow::anyhow!("expected three clusters"))?;

    tokio::try_join!(
        job_reaches(&a, "smoke-succeeds", 0, "Complete"),
        job_reaches(&b, "smoke-fails", 1, "Failed"),
        argo_smoke(&mut control, &plugin),
    )?;

    start_s.sort_by(f64::total_cmp);
    let p50 = start_s[start_s.len() / 2];
    let summary = format!(
        "clusters_ready={} start_s_p50={p50:.1} smoke=pass",
        start_s.len()
    );
    drop((a, b, control));
    if let Some(path) = std::env::var_os("SMOKE_SUMMARY_FILE") {
        std::fs::write(&path, format!("{summary}\n")).context("writing SMOKE_SUMMARY_FILE")?;
    }
    println!("{summary}");
    Ok(())
}

fn test_job(name: &str, exit_code: i32) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    annotations: Some(lifecycle_annotations(exit_code, "1s")),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    restart_policy: Some("Never".to_owned()),
                    containers: vec![Container {
                        name: "check".to_owned(),
                        image: Some("example.invalid/check:1".to_owned()),
                        ..Container::default()
                    }],
                    ..PodSpec::default()
                }),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// Creates a Job whose container exits with `exit_code` and waits for condition `expected`.
async fn job_reaches(cluster: &Cluster, name: &str, exit_code: i32, expected: &str) -> Result<()> {
    let client = cluster.client().await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &test_job(name, exit_code))
        .await
        .with_context(|| format!("creating job {name} on {}", cluster.name))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let job = jobs
            .get(name)
            .await
            .with_context(|| format!("getting job {name}"))?;
        let conditions = job
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        let finished: Vec<_> = conditions
            .iter()
            .filter(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            .collect();
        if let Some(condition) = finished.first() {
            if condition.type_ != expected {
                bail!(
                    "job {name} on {}: condition {} ({}), expected {expected}",
                    cluster.name,
                    condition.type_,
                    condition.message.clone().unwrap_or_default()
                );
            }
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "job {name} on {}: no Complete/Failed condition after 60s; conditions {:?}",
                cluster.name,
                conditions
                    .iter()
                    .map(|c| format!("{}={}", c.type_, c.status))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The pod really ended with the chosen exit code.
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={name}")))
        .await
        .with_context(|| format!("listing pods of job {name}"))?;
    let codes: Vec<i32> = list
        .items
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .filter_map(|cs| cs.state.as_ref()?.terminated.as_ref().map(|t| t.exit_code))
        .collect();
    if codes.is_empty() || codes.iter().any(|c| *c != exit_code) {
        bail!("job {name}: container exit codes {codes:?}, expected {exit_code}");
    }
    println!(
        "cluster {}: job {name} exited {exit_code} -> {expected} (real Job controller)",
        cluster.name
    );
    Ok(())
}

fn job_metric(name: &str, exit_code: i32) -> Value {
    json!({
        "name": name,
        "provider": {"job": {"spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": lifecycle_annotations(exit_code, "1s")},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "check", "image": "example.invalid/check:1"}]
                }
            }
        }}}
    })
}

fn analysis_run(name: &str, metric: Value) -> Result<DynamicObject> {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"metrics": [metric]}
    }))
    .context("building an AnalysisRun")
}

fn phase(ar: &DynamicObject) -> String {
    ar.data
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned()
}

/// Polls AnalysisRun `name` until `done` returns true for it.
async fn wait_analysis_run(
    runs: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    let deadline = Instant::now() + timeout;
    loop {
        let ar = runs
            .get(name)
            .await
            .with_context(|| format!("getting analysisrun {name}"))?;
        if done(&ar) {
            return Ok(ar);
        }
        if Instant::now() > deadline {
            bail!(
                "analysisrun {name}: not done after {timeout:?}; status {}",
                ar.data.get("status").cloned().unwrap_or(Value::Null)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn argo_smoke(control: &mut Cluster, plugin: &std::path::Path) -> Result<()> {
    let rollouts = ArgoRollouts::install(control, &[MetricPlugin::file(PLUGIN_NAME, plugin)?])
        .await
        .context("installing argo rollouts on control")?;
    let client = control.client().await?;
    let runs = argo::analysis_runs(&client, "default");
    let post = PostParams::default();
    runs.create(
        &post,
        &analysis_run("smoke-job-ok", job_metric("job-ok", 0))?,
    )
    .await
    .context("creating analysisrun smoke-job-ok")?;
    runs.create(
        &post,
        &analysis_run("smoke-job-fail", job_metric("job-fail", 1))?,
    )
    .await
    .context("creating analysisrun smoke-job-fail")?;
    let plugin_metric = json!({
        "name": "dispatch",
        "provider": {"plugin": {PLUGIN_NAME: {
            "destination": "a",
            "spec": {"backoffLimit": 0, "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "check", "image": "example.invalid/check:1"}]
            }}}
        }}}
    });
    runs.create(&post, &analysis_run("smoke-plugin", plugin_metric)?)
        .await
        .context("creating analysisrun smoke-plugin")?;

    let terminal = |ar: &DynamicObject| {
        matches!(
            phase(ar).as_str(),
            "Successful" | "Failed" | "Error" | "Inconclusive"
        )
    };
    let timeout = Duration::from_secs(90);
    let ok = wait_analysis_run(&runs, "smoke-job-ok", timeout, terminal).await?;
    let fail = wait_analysis_run(&runs, "smoke-job-fail", timeout, terminal).await?;
    if phase(&ok) != "Successful" || phase(&fail) != "Failed" {
        bail!(
            "analysisruns: smoke-job-ok is {:?} (want Successful), smoke-job-fail is {:?} \
             (want Failed); statuses {} / {}",
            phase(&ok),
            phase(&fail),
            ok.data["status"],
            fail.data["status"]
        );
    }
    println!("cluster control: analysisrun job metric -> Successful, failing job -> Failed");

    // The plugin: go-plugin started it (and relays its log line "rollouts-dispatch-plugin
    // started"), and InitPlugin succeeded, so the controller took a measurement through the
    // plugin's Run (had InitPlugin failed, the measurement would carry "unable to initialize
    // plugin via rpc"). No server is configured, so the measurement itself may be an Error.
    let measured = |ar: &DynamicObject| {
        terminal(ar)
            || ar
                .data
                .pointer("/status/metricResults/0/measurements/0")
                .is_some()
    };
    let run = wait_analysis_run(&runs, "smoke-plugin", timeout, measured).await?;
    let log = rollouts.log_text();
    let status = run.data.get("status").cloned().unwrap_or(Value::Null);
    let status_text = status.to_string();
    // go-plugin's own lines (hclog: "[DEBUG] plugin: ...", "plugin.job: <plugin stderr>"), the
    // controller's copy of the file, and anything the plugin logs under its own name.
    let plugin_lines: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.contains(" plugin: ")
                || l.contains(" plugin.job: ")
                || l.contains("Copied plugin")
                || l.contains("rollouts-dispatch-plugin")
        })
        .filter(|l| !l.contains("AnalysisRun Patch"))
        .collect();
    let started = log
        .lines()
        .any(|l| l.contains("plugin started") && l.contains("plugin-bin/rollouts-dispatch/job"))
        && log
            .lines()
            .any(|l| l.contains(" plugin.job: ") && l.contains("rollouts-dispatch-plugin started"));
    let init_failed = status_text.contains("unable to initialize plugin")
        || status_text.contains("unable to start plugin system")
        || log.contains("unable to initialize plugin");
    if !started || init_failed {
        bail!(
            "plugin {PLUGIN_NAME} not loaded by rollouts-controller (started={started}, \
             init_failed={init_failed}); analysisrun status {status}; plugin log lines:\n{}",
            plugin_lines.join("\n")
        );
    }
    println!(
        "cluster control: rollouts-controller loaded {PLUGIN_NAME} ({}), InitPlugin ok; \
         analysisrun smoke-plugin phase {:?}, first measurement {}",
        plugin.display(),
        phase(&run),
        run.data
            .pointer("/status/metricResults/0/measurements/0")
            .cloned()
            .unwrap_or(Value::Null)
    );
    for line in &plugin_lines {
        println!("  controller log: {line}");
    }
    Ok(())
}
