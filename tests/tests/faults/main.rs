//! `make faults`: the faults production brings (issue #32), one scenario each, in turn, on one
//! agent World (`World::start_with_agent_front` with a [`Front::Balanced`] front: two server
//! replicas on the Kubernetes store taking connections in turn among the ready ones, as a
//! Service does; cluster-a direct, cluster-b behind its agent; the real Argo Rollouts controller
//! and our plugin). Nothing is mocked: the faults are made with the kernel (network namespaces,
//! veth pairs, `tc`: [`dispatch_tests::netfault`]), the API servers' own API Priority and
//! Fairness, etcd's compaction, and the files the processes read.
//!
//! The scene adds, once: a link from the agent to the front (the agent dials through it), a
//! destination `cluster-a-slow` that is cluster-a reached through a second link, and a third
//! link to the control plane (for the replica cut from it). The scenarios, by family:
//!
//! * [`network`]: the agent's link refused, the agent's link half-open, a replica cut from the
//!   control plane, a slow destination, a watch that stalls without closing;
//! * [`pushback`]: 429s from API Priority and Fairness on a destination and on the control plane,
//!   410 Gone after an etcd compaction, 10 000 Jobs of ours on a destination;
//! * [`upgrades`]: a policy narrowed while its runs are in flight, an agent of the previous
//!   release, the replicas rolled to the previous release and back with work in flight;
//! * [`rotations`]: the API's certificate and CA, the signing key, an agent's token, a
//!   destination's kubeconfig, the agent's ServiceAccount token on its own cluster.
//!
//! Each scenario returns its verifications' [`Outcome`]s; a scenario is correct when each of
//! them ended with its planned verdict and every check the scenario adds held. Then, as chaos:
//! every run terminal within its bound (else `stuck`), one Job per measurement on its run's
//! cluster only (`duplicate_jobs`, from a poll of every cluster's Jobs during the whole test),
//! nothing of ours left on a or b once the retention and a sweep passed (`leftover_jobs`), and
//! no verdict turned into another (`lost_verdicts`: a run terminal in a phase it was not planned
//! to end in). Last line (also to `$SUMMARY_FILE`):
//! `faults: scenarios=N correct=C stuck=S duplicate_jobs=D leftover_jobs=L lost_verdicts=V`.
//! `FAULTS_ONLY=a,b` runs only the scenarios named (for development).

mod network;
mod pushback;
mod rotations;
mod scene;
mod upgrades;

use std::time::{Duration, Instant};

use anyhow::Result;
use dispatch_tests::invariants::{duplicate_jobs, managed_jobs, Outcome};
use dispatch_tests::summary;

use scene::Scene;

/// `jobs.retention` of the servers (its minimum) and their sweep period.
pub(crate) const RETENTION: Duration = Duration::from_secs(60);
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(3);
/// The servers' deadline for a block without `activeDeadline`, and its grace.
pub(crate) const DEADLINE: Duration = Duration::from_secs(300);
pub(crate) const GRACE: Duration = Duration::from_secs(5);

/// What one scenario came to.
struct Scenario {
    name: &'static str,
    outcomes: Vec<Outcome>,
    /// The scenario's own error (its setup or a check failed to run), if any.
    error: Option<String>,
}

impl Scenario {
    fn correct(&self) -> bool {
        self.error.is_none()
            && !self.outcomes.is_empty()
            && self.outcomes.iter().all(|o| o.correct && !o.stuck)
    }
}

/// Whether the scenario `name` runs (`FAULTS_ONLY`).
fn wanted(name: &str) -> bool {
    std::env::var("FAULTS_ONLY").map_or(true, |only| only.split(',').any(|n| n.trim() == name))
}

/// Runs each scenario named, in turn, if [`wanted`]; records what it came to.
macro_rules! scenarios {
    ($scene:expr, $done:expr, $($family:ident :: $name:ident),+ $(,)?) => {
        $(
            if wanted(stringify!($name)) {
                println!("faults: scenario {} starts", stringify!($name));
                let result = $family::$name($scene).await;
                let scenario = match result {
                    Ok(outcomes) => Scenario { name: stringify!($name), outcomes, error: None },
                    Err(e) => Scenario {
                        name: stringify!($name),
                        outcomes: Vec::new(),
                        error: Some(format!("{e:#}")),
                    },
                };
                println!(
                    "faults: scenario {}: correct={} {}",
                    scenario.name,
                    scenario.correct(),
                    scenario
                        .error
                        .clone()
                        .unwrap_or_else(|| scenario
                            .outcomes
                            .iter()
                            .map(|o| format!("[{} on {}: {}]", o.name, o.destination, o.detail))
                            .collect::<Vec<_>>()
                            .join(" "))
                );
                $done.push(scenario);
                $scene.last_terminal = Instant::now();
            }
        )+
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "makes network, API server and rotation faults for many minutes: run `make faults`"]
async fn production_faults_lose_no_verdict() -> Result<()> {
    let mut s = Scene::start().await?;
    let mut done: Vec<Scenario> = Vec::new();
    scenarios!(
        &mut s,
        done,
        network::agent_link_refused,
        network::agent_link_half_open,
        network::slow_destination,
        network::stalled_watch,
        network::replica_cut_from_control_plane,
        pushback::throttled_destination,
        pushback::throttled_control_plane,
        pushback::watch_gone_after_compaction,
        pushback::ten_thousand_jobs,
        // Before the rotations: the previous release runs with the scene's first key and CA.
        upgrades::policy_narrowed_in_flight,
        upgrades::agent_of_previous_release,
        upgrades::rolling_upgrade_and_rollback,
        rotations::api_certificate_and_ca,
        rotations::signing_key,
        rotations::agent_token,
        rotations::destination_kubeconfig,
        rotations::agent_cluster_token,
    );
    tally(&mut s, &done).await
}

/// The checks after every scenario; prints and reports the last line.
async fn tally(s: &mut Scene, done: &[Scenario]) -> Result<()> {
    let outcomes: Vec<Outcome> = done.iter().flat_map(|d| d.outcomes.clone()).collect();
    let mut report = Vec::new();
    let stuck = outcomes.iter().filter(|o| o.stuck).count();
    let lost = s.lost_verdicts;
    for d in done.iter().filter(|d| !d.correct()) {
        report.push(format!(
            "scenario {} not correct: {}",
            d.name,
            d.error.clone().unwrap_or_default()
        ));
    }
    let scene_runs: Vec<&str> = s.scene_runs.iter().map(String::as_str).collect();
    let duplicates = duplicate_jobs(&outcomes, &s.watch.seen(), &scene_runs, &mut report);

    // Nothing of ours left once the retention and two sweeps passed since the last run ended.
    let leftover_at = s.last_terminal + RETENTION + 2 * SWEEP_EVERY + Duration::from_secs(60);
    let leftover = loop {
        let mut left = Vec::new();
        for (name, cluster) in [("cluster-a", &s.w.a), ("cluster-b", &s.w.b)] {
            for j in managed_jobs(cluster).await.unwrap_or_default() {
                left.push(format!("{name}/{}", j.metadata.name.unwrap_or_default()));
            }
        }
        if left.is_empty() || Instant::now() > leftover_at {
            for l in left.iter().take(20) {
                report.push(format!("job {l} left after the retention"));
            }
            break left.len();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    for line in &report {
        println!("faults: {line}");
    }
    let correct = done.iter().filter(|d| d.correct()).count();
    let summary = format!(
        "faults: scenarios={} correct={correct} stuck={stuck} duplicate_jobs={duplicates} \
         leftover_jobs={leftover} lost_verdicts={lost}",
        done.len()
    );
    if correct != done.len() || stuck + duplicates + leftover + lost != 0 {
        anyhow::bail!("{summary}");
    }
    summary::report(&summary)
}
