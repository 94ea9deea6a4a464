//! Agent mode end to end, nothing mocked: the server has no credentials for cluster B; only B's
//! agent (`rollouts-dispatch agent`, a real process with B's kubeconfig) reaches it, by dialing
//! out to the server. Two server replicas (real processes) share the Kubernetes store
//! (`DispatchJob` resources on the control plane) behind a TCP front that, like a Service,
//! sends each connection to the first replica that accepts it. The real Argo Rollouts controller
//! runs the plugin against the same front.
//!
//! Covered: a verification on B goes Successful, a failing one Failed; the agent killed (-9)
//! mid-Job and restarted → the verdict arrives and there is one Job; the replica serving the
//! agent killed (-9) → the verdict arrives via the other replica; B's token asking for C's work
//! → 403; an expired token → 401; a clear log line on both sides; `rollouts-dispatch
//! destinations` shows B as an agent destination, connected. The API is TLS end to end: agents,
//! the plugin and the CLI trust the server through `--ca-file`.
//!
//! `#[ignore]`d for plain `cargo test`; `make e2e-agent` runs it.

mod e2e_support;

use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Result};
use dispatch_tests::cluster::argo;
use e2e_support::agents::*;
use e2e_support::*;
use kube::api::{Api, DynamicObject, ListParams, PostParams};

/// Starts an 8 s verification on cluster-b and waits until its Job runs there.
async fn start_slow_run(
    runs: &Api<DynamicObject>,
    freight: &(String, String),
    b: &dispatch_tests::cluster::Cluster,
    stage: &str,
    ulid: &str,
) -> Result<(DynamicObject, String)> {
    let routing = serde_json::json!({"destination": "{{args.destination}}"});
    let run = kargo_run_with(stage, ulid, freight, "cluster-b", routing, 0, "8s")?;
    let slow = runs.create(&PostParams::default(), &run).await?;
    let uid = slow.metadata.uid.clone().unwrap_or_default();
    eventually("the slow Job on cluster-b", || async {
        Ok(jobs_of(b, &uid).await?.len() == 1)
    })
    .await?;
    Ok((slow, uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-agent`"]
async fn verifications_run_on_a_cluster_only_its_agent_reaches() -> Result<()> {
    let mut w = AgentWorld::start(&[]).await?;
    let (client, freight, binary, url) = (
        w.client.clone(),
        w.freight.clone(),
        w.binary.clone(),
        w.url.clone(),
    );
    let (plugin_token, agent_token, dir) =
        (w.plugin_token.clone(), w.agent_token.clone(), w.dir.clone());
    let runs = argo::analysis_runs(&client, PROJECT);
    let post_params = PostParams::default();

    // 1. Pass and fail on cluster-b, through its agent only.
    let ok = runs
        .create(
            &post_params,
            &kargo_run(
                "uat",
                "01jagent00000000000000000a",
                &freight,
                "cluster-b",
                0,
            )?,
        )
        .await?;
    let bad = runs
        .create(
            &post_params,
            &kargo_run(
                "prod",
                "01jagent00000000000000000b",
                &freight,
                "cluster-b",
                1,
            )?,
        )
        .await?;
    let ok = wait_done(&runs, ok.metadata.name.as_deref().unwrap_or_default()).await?;
    let bad = wait_done(&runs, bad.metadata.name.as_deref().unwrap_or_default()).await?;
    println!(
        "e2e-agent: pass={} {:?} | fail={} {:?}",
        phase(&ok),
        measurement_message(&ok),
        phase(&bad),
        measurement_message(&bad)
    );
    ensure!(
        phase(&ok) == "Successful",
        "pass on cluster-b: {}",
        ok.data["status"]
    );
    ensure!(
        phase(&bad) == "Failed",
        "fail on cluster-b: {}",
        bad.data["status"]
    );
    ensure!(
        measurement_message(&bad).contains("cluster-b"),
        "the failure names the destination: {}",
        measurement_message(&bad)
    );
    // The log tail travels from the agent: the failed container's last lines are in the
    // AnalysisRun's message and in the DispatchJob's status.
    ensure!(
        measurement_message(&bad).contains("check failed: svc is not healthy"),
        "the failure carries the log tail: {}",
        measurement_message(&bad)
    );
    let bad_uid = bad.metadata.uid.clone().unwrap_or_default();
    let stored_log = w
        .records()
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .find(|r| {
            r.data
                .pointer("/spec/runUid")
                .and_then(serde_json::Value::as_str)
                == Some(bad_uid.as_str())
        })
        .and_then(|r| {
            r.data
                .pointer("/status/state/detail/log")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default();
    ensure!(
        stored_log.contains("HTTP 503 Service Unavailable"),
        "the DispatchJob status holds the log tail: {stored_log:?}"
    );
    let uid = ok.metadata.uid.clone().unwrap_or_default();
    let on = (
        jobs_of(&w.a, &uid).await?.len(),
        jobs_of(&w.b, &uid).await?,
        jobs_of(&w.control, &uid).await?.len(),
    );
    ensure!(
        on.0 == 0 && on.1.len() == 1 && on.2 == 0,
        "jobs of the passing run: {} on a, {} on b, {} on control; want 0/1/0",
        on.0,
        on.1.len(),
        on.2
    );
    // The same identity and context as on a direct destination.
    let env = on.1[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    ensure!(
        env.iter()
            .any(|e| e.name == "KARGO_STAGE" && e.value.as_deref() == Some("uat")),
        "the agent's Job lacks KARGO_STAGE=uat: {env:?}"
    );

    // 2. The agent killed (-9) while its Job runs, then restarted: one Job, the verdict arrives.
    let (slow, slow_uid) =
        start_slow_run(&runs, &freight, &w.b, "edge", "01jagent00000000000000000c").await?;
    w.b.kill_process("agent")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent_admin = w.spawn_agent("agent", &agent_token)?;
    wait_ready("the restarted agent", agent_admin).await?;
    let slow = wait_done(&runs, slow.metadata.name.as_deref().unwrap_or_default()).await?;
    let jobs = jobs_of(&w.b, &slow_uid).await?.len();
    println!(
        "e2e-agent: agent killed mid-Job → {} with {jobs} Job",
        phase(&slow)
    );
    ensure!(
        phase(&slow) == "Successful" && jobs == 1,
        "after the agent restart: {} with {jobs} Jobs",
        slow.data["status"]
    );

    // 3. The replica serving the agent killed (-9): the other replica takes over from the store.
    let (slow, slow_uid) = start_slow_run(
        &runs,
        &freight,
        &w.b,
        "canary",
        "01jagent00000000000000000d",
    )
    .await?;
    w.control.kill_process("server-1")?;
    let slow = wait_done(&runs, slow.metadata.name.as_deref().unwrap_or_default()).await?;
    let jobs = jobs_of(&w.b, &slow_uid).await?.len();
    let stored = w.records().list(&ListParams::default()).await?.items.len();
    println!(
        "e2e-agent: replica killed mid-Job → {} with {jobs} Job; {stored} DispatchJobs stored",
        phase(&slow)
    );
    ensure!(
        phase(&slow) == "Successful" && jobs == 1,
        "after the replica kill: {} with {jobs} Jobs",
        slow.data["status"]
    );
    ensure!(
        stored >= 4,
        "every verification on cluster-b has its DispatchJob: {stored}"
    );

    // 4. Hostile and stale agents: B's token asking for C's work → 403; an expired token → 401;
    //    a log line on both sides.
    let replica_two = format!("https://127.0.0.1:{}", w.replicas[1].port);
    let answer = call_as(
        &replica_two,
        &agent_token,
        &w.ca,
        "/v1/agents/cluster-c/work",
    )
    .await?;
    ensure!(
        answer.starts_with("rejected forbidden: ")
            && answer.contains("is for destination \"cluster-b\""),
        "B's token for C's work: {answer}"
    );
    let server_log = w.control.log_path("server-2");
    log_shows(&server_log, "refused: agent token of another destination").await?;
    let expired = dir.join("agent-expired.token");
    std::fs::write(
        &expired,
        token(Some("cluster-b"), "agent:cluster-b", -3600)?,
    )?;
    let answer = call_as(&replica_two, &expired, &w.ca, "/v1/agents/cluster-b/work").await?;
    ensure!(
        answer.contains("token expired") && answer.contains("401"),
        "expired token: {answer}"
    );
    w.spawn_agent("agent-expired", &expired)?;
    log_shows(&w.b.log_path("agent-expired"), "token expired").await?;
    log_shows(&server_log, "token expired").await?;
    w.b.kill_process("agent-expired")?;
    println!("e2e-agent: B's token for C → 403, expired → 401, both logged by agent and server");

    // 5. `rollouts-dispatch destinations`: cluster-b is an agent destination, connected.
    let listed = Command::new(&binary)
        .args(["destinations", "--server", &url, "--token-file"])
        .arg(&plugin_token)
        .arg("--ca-file")
        .arg(&w.ca)
        .output()?;
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    println!("{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("cluster-b"))
        .unwrap_or_default();
    ensure!(
        listed.status.success() && row.contains(" agent ") && row.contains(" yes "),
        "destinations: {table} {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    ensure!(
        table
            .lines()
            .any(|l| l.starts_with("cluster-a") && l.contains(" config ")),
        "destinations: {table}"
    );
    println!("e2e-agent: OK");
    Ok(())
}
