//! The network partitions, made with the scene's links ([`dispatch_tests::netfault`]): the
//! agent's link refused and half-open for longer than its long poll, a destination answering in
//! seconds per request, a watch that stalls without closing, and a replica cut from the control
//! plane but not from the plugin.

use std::time::{Duration, Instant};

use anyhow::Result;
use dispatch_api::block::PLUGIN_NAME;
use dispatch_api::v1::STATUS;
use dispatch_server::watch::STALLED_LOG;
use dispatch_tests::admin;
use dispatch_tests::invariants::Outcome;
use dispatch_tests::kargo::PROJECT;
use dispatch_tests::wait::eventually;
use dispatch_tests::world::agents::{post_as, ConfigVariant};

use super::scene::{kubeconfig_via, Scene, SLOW};

/// The agent's long poll in the scene (`--poll-wait 10s`): every cut lasts several of them.
const POLL_WAIT: Duration = Duration::from_secs(10);
/// Once a link is whole again, the verdict must follow within this long (a reconnect with the
/// agent's backoff, a Job of a few seconds, the report and the controller's next look).
const AFTER_RESTORE: Duration = Duration::from_secs(90);

/// A stalled watch must be noticed within the servers' bound (`STALL`, 180 s, in
/// `dispatch_server::watch`) plus the Job's 10 s and a minute for the
/// relist, the resume and the controller; kube-runtime alone noticed only at its watch timeout
/// (290 s + 5 s).
const NOTICED: Duration = Duration::from_secs(260);

/// Waits until a Job of run `uid` shows on `cluster` (the Job watch); whether it did.
async fn job_shows(s: &Scene, cluster: &str, uid: &str) -> bool {
    let watch = s.watch.clone();
    eventually(
        &format!("a Job of run {uid} on {cluster}"),
        Duration::from_secs(120),
        || {
            let n = watch.jobs_of(cluster, uid);
            async move { Ok(n > 0) }
        },
    )
    .await
    .is_ok()
}

/// The agent's link refuses connections (its server looks down) for three long polls while a
/// run for its destination waits; then it is back. Nothing may reach cluster-b while cut; the
/// agent keeps running and the verdict follows the link's return.
pub(crate) async fn agent_link_refused(s: &mut Scene) -> Result<Vec<Outcome>> {
    s.agent_link.refuse();
    let v = s.verification("cluster-b", 0, "3s");
    let run = s.submit(&v, "cluster-b").await?;
    tokio::time::sleep(3 * POLL_WAIT).await;
    let jobs_while_cut = s.watch.jobs_of("cluster-b", &run.uid);
    s.agent_link.pass();
    let back = Instant::now();
    let last = s.settle(&run, super::DEADLINE).await?;
    let after = back.elapsed();
    let alive = s.w.b.check_alive().is_ok();
    let held = jobs_while_cut == 0 && alive && after <= AFTER_RESTORE;
    Ok(vec![s.outcome(
        &run,
        &last,
        held,
        format!(
            "Jobs while refused: {jobs_while_cut}; agent alive: {alive}; verdict {}s after the \
             link came back (bound {}s)",
            after.as_secs(),
            AFTER_RESTORE.as_secs()
        ),
    )])
}

/// The agent's link drops every packet (no reset, no refusal: half-open) for 4.5 long polls
/// while its Job runs and ends; then delivers again. The agent must not hang on a connection
/// that will never answer: the verdict follows the link's return.
pub(crate) async fn agent_link_half_open(s: &mut Scene) -> Result<Vec<Outcome>> {
    let v = s.verification("cluster-b", 1, "15s");
    let run = s.submit(&v, "cluster-b").await?;
    let started = job_shows(s, "cluster-b", &run.uid).await;
    s.agent_link.drop_packets(true)?;
    tokio::time::sleep(POLL_WAIT * 9 / 2).await;
    s.agent_link.drop_packets(false)?;
    let back = Instant::now();
    let last = s.settle(&run, super::DEADLINE).await?;
    let after = back.elapsed();
    let alive = s.w.b.check_alive().is_ok();
    let held = started && alive && after <= AFTER_RESTORE;
    Ok(vec![s.outcome(
        &run,
        &last,
        held,
        format!(
            "Job before the cut: {started}; agent alive: {alive}; verdict {}s after packets \
             flowed again (bound {}s)",
            after.as_secs(),
            AFTER_RESTORE.as_secs()
        ),
    )])
}

/// cluster-a reached through a link limited to 32 kbit/s both ways (a TLS handshake or a Job
/// create takes about a second, a list several): a verification there still ends with its
/// verdict, within the deadline.
pub(crate) async fn slow_destination(s: &mut Scene) -> Result<Vec<Outcome>> {
    s.a_link.slow(Some(32))?;
    let v = s.verification(SLOW, 1, "5s");
    let run = s.submit(&v, "cluster-a").await?;
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await;
    s.a_link.slow(None)?;
    let last = last?;
    Ok(vec![s.outcome(
        &run,
        &last,
        true,
        "through a 32 kbit/s link".into(),
    )])
}

/// Every connection open to cluster-a-slow (the servers' watches of its Jobs and Pods, pooled
/// connections) stops moving bytes and stays open, while new connections pass, once the run's
/// Job exists; the Job then ends. The server must notice the stalled watch and read the Job's
/// end anew: the verdict may come late, but before the deadline and right.
pub(crate) async fn stalled_watch(s: &mut Scene) -> Result<Vec<Outcome>> {
    let v = s.verification(SLOW, 0, "10s");
    let run = s.submit(&v, "cluster-a").await?;
    let started = job_shows(s, "cluster-a", &run.uid).await;
    s.a_link.stall();
    let stalled = Instant::now();
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await;
    let after = stalled.elapsed();
    s.a_link.pass();
    let last = last?;
    let logged = s.replica_logs().contains(STALLED_LOG);
    let held = started && after <= NOTICED && logged;
    Ok(vec![s.outcome(
        &run,
        &last,
        held,
        format!(
            "Job before the stall: {started}; verdict {}s after the stall began (bound {}s); \
             a replica logged {STALLED_LOG:?}: {logged}",
            after.as_secs(),
            NOTICED.as_secs()
        ),
    )])
}

/// server-2 reaches the control plane through a link that then drops every packet, while the
/// front (a Service) still sends it connections until its `/ready` says otherwise. Runs on a
/// direct and an agent destination submitted during the cut must end with their verdicts;
/// server-2's readiness is sampled and reported.
pub(crate) async fn replica_cut_from_control_plane(s: &mut Scene) -> Result<Vec<Outcome>> {
    let kubeconfig = kubeconfig_via(
        &s.w.control,
        &s.control_link.https_url(),
        s.w.dispatch.dir.join("control-via-link.kubeconfig"),
    )?;
    let config = s.w.config_variant(
        "faults-control-link.yaml",
        &ConfigVariant {
            control_kubeconfig: Some(kubeconfig),
            destinations: s.slow_destination(),
            ..ConfigVariant::default()
        },
    )?;
    let replica = s.w.dispatch.replicas[1].clone();
    s.w.control.kill_process(&replica.name)?;
    s.w.restart_replica_config(1, &config).await?;
    s.control_link.drop_packets(true)?;
    let cut = Instant::now();
    let mut runs = Vec::new();
    for (destination, exit) in [("cluster-a", 0), ("cluster-b", 1)] {
        let v = s.verification(destination, exit, "5s");
        runs.push(s.submit(&v, destination_cluster(destination)).await?);
    }
    // What the plugin asks about the first run, asked of server-2 itself: its watch of the
    // runs is silent and lacks it, so it must read the run, get no answer, and say "retry"
    // (503), not refuse it (403: an `Error` measurement), then go unready.
    let first = s.w.runs().get(&runs[0].name).await?;
    let probe = serde_json::json!({
        "run": {"name": runs[0].name, "namespace": PROJECT, "uid": runs[0].uid},
        "metric": "smoke",
        "index": 1,
        "block": first.data.pointer(&format!("/spec/metrics/0/provider/plugin/{}", PLUGIN_NAME.replace('/', "~1"))),
    });
    let server_2 = format!("https://127.0.0.1:{}", replica.port);
    let (token, ca) = (s.w.dispatch.plugin_token.clone(), s.w.dispatch.ca.clone());
    let answer = post_as(&server_2, &token, &ca, STATUS, &probe).await?;
    let retried = answer.starts_with("transient") && answer.contains("did not answer");
    // server-2's readiness while its control plane is gone.
    let mut unready_after = None;
    while cut.elapsed() < Duration::from_secs(90) {
        if !matches!(admin::get(replica.admin, "/ready").await, Some((200, _))) {
            unready_after = Some(cut.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut lasts = Vec::new();
    for run in &runs {
        lasts.push(s.settle(run, super::DEADLINE + super::GRACE).await);
    }
    s.control_link.drop_packets(false)?;
    s.w.control.kill_process(&replica.name)?;
    let base = s.base_config.clone();
    s.w.restart_replica_config(1, &base).await?;
    let unready = unready_after.map_or("stayed ready for 90 s".to_string(), |t| {
        format!("unready {}s after the cut", t.as_secs())
    });
    let held = retried && unready_after.is_some();
    let mut outcomes = Vec::new();
    for (run, last) in runs.iter().zip(lasts) {
        let last = last?;
        outcomes.push(s.outcome(
            run,
            &last,
            held,
            format!("server-2 asked directly: {answer:.160}; server-2 {unready}"),
        ));
    }
    Ok(outcomes)
}

/// The cluster a destination's Jobs land on.
fn destination_cluster(destination: &str) -> &'static str {
    if destination == "cluster-b" {
        "cluster-b"
    } else {
        "cluster-a"
    }
}
