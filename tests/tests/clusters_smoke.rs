//! Smoke tests on real clusters: Kubernetes control planes, kwok and the Argo Rollouts controller
//! built from their Go modules (`make k8s-bin`).
//!
//! One test starts clusters `a`, `b` and `control` in parallel and then checks, concurrently:
//! a Job on `a` whose container exits 0 gets `Complete` from the real Job controller; a Job on
//! `b` whose container exits 1 gets `Failed`; on `control`, the real Argo Rollouts controller
//! runs an AnalysisRun with a built-in `job` metric to `Successful` and another to `Failed`, and
//! loads the `rollouts-dispatch/job` metric plugin (go-plugin starts it and `InitPlugin`
//! succeeds) for an AnalysisRun that uses it; and on `a`, the kube-apiserver's `pods/log` of a
//! two-container Job returns the lines of the files the test named (kwok serves the kubelet
//! API, `dispatch_tests::cluster::pod_logs`), then follows one as the test appends lines; and
//! the plugin's resume patch against the real AnalysisRun CRD (`resume_races.rs`).
//!
//! It is `#[ignore]`d so that a plain `cargo test` does not need the binaries; `make
//! clusters-smoke` runs it with `--ignored`, and then it fails (never skips) when something is
//! missing. The plugin binary is `$PLUGIN_BINARY`, by default
//! `target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin` of the workspace (what
//! `make plugin-release` builds).
//! The last line it prints (also written to `$SUMMARY_FILE` if set) is
//! `clusters_ready=N start_s_p50=X smoke=pass`.

#[path = "clusters_smoke/resume_races.rs"]
mod resume_races;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::analysis::{is_finished, phase, wait_for};
use dispatch_tests::artifacts::{plugin_binary, PLUGIN_NAME};
use dispatch_tests::block::Block;
use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::pod_logs::{self, LogFile};
use dispatch_tests::cluster::{start_many, Cluster};
use dispatch_tests::summary;
use dispatch_tests::wait::{eventually, Progress};
use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, LogParams, PostParams};
use serde_json::{json, Value};

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
        pod_logs_served(&a),
    )?;

    start_s.sort_by(f64::total_cmp);
    let p50 = start_s[start_s.len() / 2];
    let summary = format!(
        "clusters_ready={} start_s_p50={p50:.1} smoke=pass",
        start_s.len()
    );
    drop((a, b, control));
    summary::report(&summary)
}

fn test_job(name: &str, exit_code: i32) -> Result<Job> {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": Block::default().exits(exit_code).job_spec()
    }))
    .with_context(|| format!("building job {name}"))
}

/// Creates a Job whose container exits with `exit_code` and waits for condition `expected`.
async fn job_reaches(cluster: &Cluster, name: &str, exit_code: i32, expected: &str) -> Result<()> {
    let client = cluster.client().await?;
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    jobs.create(&PostParams::default(), &test_job(name, exit_code)?)
        .await
        .with_context(|| format!("creating job {name} on {}", cluster.name))?;
    let finished = eventually(
        &format!("job {name} on {} Complete or Failed", cluster.name),
        Duration::from_secs(60),
        || async {
            let job = jobs
                .get(name)
                .await
                .with_context(|| format!("getting job {name}"))?;
            let conditions = job.status.and_then(|s| s.conditions).unwrap_or_default();
            let seen = format!(
                "conditions {:?}",
                conditions
                    .iter()
                    .map(|c| format!("{}={}", c.type_, c.status))
                    .collect::<Vec<_>>()
            );
            Ok(conditions
                .into_iter()
                .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
                .map_or(Progress::Waiting(seen), Progress::Done))
        },
    )
    .await?;
    if finished.type_ != expected {
        bail!(
            "job {name} on {}: condition {} ({}), expected {expected}",
            cluster.name,
            finished.type_,
            finished.message.clone().unwrap_or_default()
        );
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

/// A running Job with containers `main` and `side`: `pods/log` (the real kube-apiserver, kwok as
/// the kubelet) returns each container's own file, every line in order; a followed stream of
/// `side` delivers lines the test appends after it opened.
async fn pod_logs_served(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    let name = "smoke-logs";
    let mut spec = Block::default().runs_for("120s").job_spec();
    let main = spec["template"]["spec"]["containers"][0].clone();
    let mut side = main.clone();
    side["name"] = json!("side");
    spec["template"]["spec"]["containers"] = json!([main.clone(), side]);
    let main_name = main["name"]
        .as_str()
        .context("the Block's container has a name")?
        .to_owned();
    let job: Job = serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))?;
    Api::<Job>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &job)
        .await
        .context("creating the log Job")?;

    let dir = cluster.dir().join("pod-logs");
    let main_file = LogFile::create(dir.join("main.log"))?;
    let side_file = LogFile::create(dir.join("side.log"))?;
    let main_lines: Vec<String> = (1..=1000).map(|i| format!("main line {i}")).collect();
    main_file.append(&main_lines)?;
    side_file.append(["side line 1", "side line 2"])?;
    let files = [(main_name.as_str(), &main_file), ("side", &side_file)];
    let pods =
        pod_logs::serve_job(&client, "default", name, &files, Duration::from_secs(60)).await?;
    let pod = pods.first().context("the Job has a pod")?.clone();
    let api: Api<Pod> = Api::namespaced(client, "default");

    // kwok sees the Logs object through a watch, and the container must be running: retry.
    let params = LogParams {
        container: Some(main_name.clone()),
        ..LogParams::default()
    };
    let text = eventually(
        "pods/log of the main container",
        Duration::from_secs(60),
        || {
            let (api, pod, params) = (api.clone(), pod.clone(), params.clone());
            async move {
                Ok(match api.logs(&pod, &params).await {
                    Ok(text) if !text.is_empty() => Progress::Done(text),
                    Ok(_) => Progress::Waiting("empty log".into()),
                    Err(e) => Progress::Waiting(e.to_string()),
                })
            }
        },
    )
    .await?;
    let got: Vec<&str> = text.lines().collect();
    if got != main_lines {
        bail!(
            "pods/log of {pod}/{main_name}: {} lines, first {:?}, expected the file's {}",
            got.len(),
            got.first(),
            main_lines.len()
        );
    }

    let follow = LogParams {
        container: Some("side".into()),
        follow: true,
        ..LogParams::default()
    };
    let mut lines = api.log_stream(&pod, &follow).await?.lines();
    let mut seen = Vec::new();
    for i in 3..=5 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        side_file.append([format!("side line {i}")])?;
    }
    while seen.len() < 5 {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next())
            .await
            .with_context(|| format!("following {pod}/side: only {seen:?} after 20s"))?
            .context("the followed stream ended")??;
        seen.push(line);
    }
    let expected: Vec<String> = (1..=5).map(|i| format!("side line {i}")).collect();
    if seen != expected {
        bail!("following {pod}/side: {seen:?}, expected {expected:?}");
    }
    println!(
        "cluster {}: pods/log returned {} lines of main and followed side to line 5 (kwok as kubelet)",
        cluster.name,
        got.len()
    );
    Ok(())
}

fn job_metric(name: &str, exit_code: i32) -> Value {
    json!({
        "name": name,
        "provider": {"job": {"spec": Block::default().exits(exit_code).job_spec()}}
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

async fn argo_smoke(control: &mut Cluster, plugin: &std::path::Path) -> Result<()> {
    let rollouts = ArgoRollouts::install(control, &[MetricPlugin::file(PLUGIN_NAME, plugin)?])
        .await
        .context("installing argo rollouts on control")?;
    let client = control.client().await?;
    let races = resume_races::resume_patch_races(&client)
        .await
        .context("the resume patch against the real API server")?;
    println!("resume patch: moved resumeAt once, and {races} races (a controller write, a finished measurement, a recreated run, a deleted run) refused by the API server");
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
        "provider": {"plugin": {PLUGIN_NAME: Block::to("a").json()}}
    });
    runs.create(&post, &analysis_run("smoke-plugin", plugin_metric)?)
        .await
        .context("creating analysisrun smoke-plugin")?;

    let timeout = Duration::from_secs(90);
    let ok = wait_for(&runs, "smoke-job-ok", timeout, is_finished).await?;
    let fail = wait_for(&runs, "smoke-job-fail", timeout, is_finished).await?;
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
        is_finished(ar)
            || ar
                .data
                .pointer("/status/metricResults/0/measurements/0")
                .is_some()
    };
    let run = wait_for(&runs, "smoke-plugin", timeout, measured).await?;
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
