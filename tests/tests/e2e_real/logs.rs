//! `rollouts-dispatch logs -f` reading a real container's output while it runs: the CLI in the
//! server's pod (`kubectl exec`, the token on its standard input), authenticated as a person
//! (a ServiceAccount token from `kubectl create token`, reviewed by the API server; may `get`
//! AnalysisRuns in the project, the page's and the log API's rule), following a check that
//! prints a line every second through the server, which reads it from the real kubelet.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dispatch_tests::analysis::{self, wait_for};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::kargo::{Freight, PROJECT};
use kube::api::PostParams;
use serde_json::json;

use crate::examples::{project_runs, run_from, template};
use crate::install::{apply, exec_in_server, run, RELEASE_NAMESPACE};

/// How many lines the followed check prints, one a second.
const LINES: usize = 15;

/// The person: may get AnalysisRuns in the project, nothing else.
fn reader() -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "log-reader", "namespace": PROJECT}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "log-reader", "namespace": PROJECT},
         "rules": [{"apiGroups": ["argoproj.io"], "resources": ["analysisruns"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "log-reader", "namespace": PROJECT},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "log-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "log-reader", "namespace": PROJECT}]},
    ]})
}

/// `rollouts-dispatch logs RUN` (with `extra` flags) in the server's pod, as the person.
fn logs(cluster: &Cluster, token: &str, name: &str, extra: &[&str]) -> Result<String> {
    let server = format!("https://rollouts-dispatch.{RELEASE_NAMESPACE}.svc:8443");
    let mut args = vec![
        "logs",
        name,
        "-n",
        PROJECT,
        "--server",
        &server,
        "--ca-file",
        "/etc/rollouts-dispatch/tls/ca.crt",
        "--token-file",
        "/dev/stdin",
    ];
    args.extend_from_slice(extra);
    exec_in_server(cluster, token, &args)
}

/// Follows a running check's log to its end; returns the lines `logs -f` printed while the
/// container still ran (more than one: it followed, not read a finished log).
pub(crate) async fn follow(cluster: &Cluster, freight: &Freight) -> Result<usize> {
    apply(cluster, &reader(), "log-reader")?;
    let token = run(
        cluster,
        &cluster.binaries.kubectl,
        &["-n", PROJECT, "create", "token", "log-reader"],
    )?;
    let mut check = template("smoke.yaml")?;
    check["spec"]["metrics"][0]["provider"]["plugin"]["rollouts-dispatch/job"]["spec"]
        ["template"]["spec"]["containers"][0]["command"] = json!([
        "sh",
        "-c",
        format!("for i in $(seq 1 {LINES}); do echo follow-line-$i; sleep 1; done")
    ]);
    let run = run_from(
        &check,
        freight,
        "logs",
        "01jlogs0000000000000000001",
        &[("destination", "in-cluster")],
    )?;
    let name = analysis::name(&run).to_owned();
    let runs = project_runs(cluster).await?;
    runs.create(&PostParams::default(), &run).await?;

    // Until the container has printed its first line (the pull and the start come first).
    let started = Instant::now();
    loop {
        let seen = tokio::task::block_in_place(|| logs(cluster, &token, &name, &[]));
        if seen.as_deref().is_ok_and(|s| s.contains("follow-line-1")) {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "no line of the check's log after 2 minutes: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = Instant::now();
    let followed =
        tokio::task::block_in_place(|| logs(cluster, &token, &name, &["-f"])).context("logs -f")?;
    let took = before.elapsed();
    for i in 1..=LINES {
        ensure!(
            followed.contains(&format!("follow-line-{i}\n")),
            "logs -f did not print follow-line-{i}: {followed}"
        );
    }
    let done = wait_for(
        &runs,
        &name,
        Duration::from_secs(120),
        analysis::is_finished,
    )
    .await?;
    ensure!(
        analysis::phase(&done) == "Successful",
        "the followed check ended {}: {}",
        analysis::phase(&done),
        analysis::all_messages(&done)
    );
    // It followed: it ran for seconds, as long as the container still printed.
    println!(
        "real: logs -f printed {LINES} lines of a real container over {:.1}s",
        took.as_secs_f64()
    );
    ensure!(
        took > Duration::from_secs(3),
        "logs -f returned after {took:?}: it read a finished log, it did not follow"
    );
    Ok(LINES)
}
