//! Changes a platform team makes with work in flight: a policy narrowed (the replicas rolled to
//! a config that no longer allows a destination), an agent of the previous release (0.1.0:
//! `make previous-release`, `$ROLLOUTS_DISPATCH_PREVIOUS_BINARY`), and the replicas rolled from
//! the previous release to this one and back, as `helm upgrade` and `helm rollback` roll the
//! Deployment (SIGTERM, the next replica once the previous is ready).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_tests::analysis::all_messages;
use dispatch_tests::invariants::Outcome;
use dispatch_tests::wait::eventually;
use dispatch_tests::world::agents::ConfigVariant;

use super::scene::{Scene, Submitted};

/// The previous release's binary, as `make faults` passes it.
fn previous_binary() -> Result<PathBuf> {
    let path = std::env::var_os("ROLLOUTS_DISPATCH_PREVIOUS_BINARY")
        .map(PathBuf::from)
        .context("ROLLOUTS_DISPATCH_PREVIOUS_BINARY is not set: run `make faults`")?;
    anyhow::ensure!(
        path.is_file(),
        "{} is missing: `make previous-release`",
        path.display()
    );
    Ok(path)
}

/// Waits until a Job of `run` shows on its cluster; whether it did.
async fn started(s: &Scene, run: &Submitted) -> bool {
    let watch = s.watch.clone();
    let (cluster, uid) = (run.cluster, run.uid.clone());
    eventually("the run's Job", Duration::from_secs(120), || {
        let n = watch.jobs_of(cluster, &uid);
        async move { Ok(n > 0) }
    })
    .await
    .is_ok()
}

/// A run on cluster-b is in flight (its Job runs) when the replicas are rolled to a policy that
/// allows only `cluster-a*`. The policy is applied to what is in flight too (fail-closed, as
/// `server/src/measure/mod.rs` says: a signed Job reference is used only while the policy still
/// allows its placements): the run in flight ends `Error` naming the policy, as does a run
/// submitted after the change, neither reading nor creating a Job there any more; the Job
/// already running is left to the retention sweep (the scene's `leftover_jobs`). Then the
/// policy is put back.
pub(crate) async fn policy_narrowed_in_flight(s: &mut Scene) -> Result<Vec<Outcome>> {
    let v = s.verification("cluster-b", 1, "30s");
    let mut in_flight = s.submit(&v, "cluster-b").await?;
    in_flight.want = "Error";
    let was_running = started(s, &in_flight).await;
    let narrowed = s.w.config_variant(
        "faults-narrowed.yaml",
        &ConfigVariant {
            destinations: s.slow_destination(),
            allowed: Some(vec!["cluster-a*".into()]),
            ..ConfigVariant::default()
        },
    )?;
    s.roll_replicas(&narrowed).await?;
    let v = s.verification("cluster-b", 0, "3s");
    let mut refused = s.submit(&v, "cluster-b").await?;
    refused.want = "Error";
    let refused_last = s.settle(&refused, super::DEADLINE).await?;
    let in_flight_last = s.settle(&in_flight, super::DEADLINE).await?;
    let base = s.base_config.clone();
    s.roll_replicas(&base).await?;
    let names_policy = |run| all_messages(run).contains("policy denies");
    let (in_flight_named, refused_named) =
        (names_policy(&in_flight_last), names_policy(&refused_last));
    let no_job = s.watch.jobs_of("cluster-b", &refused.uid) == 0;
    Ok(vec![
        s.outcome(
            &in_flight,
            &in_flight_last,
            was_running && in_flight_named,
            format!(
                "running when the policy narrowed: {was_running}; ended naming the policy: \
                 {in_flight_named}"
            ),
        ),
        s.outcome(
            &refused,
            &refused_last,
            refused_named && no_job,
            format!("refused naming the policy: {refused_named}; no Job: {no_job}"),
        ),
    ])
}

/// B's agent is the previous release's while this release's servers dispatch to it: one run
/// with a failing check; then this release's agent again.
pub(crate) async fn agent_of_previous_release(s: &mut Scene) -> Result<Vec<Outcome>> {
    let previous = previous_binary()?;
    s.respawn_agent(Some(&previous)).await?;
    let v = s.verification("cluster-b", 1, "3s");
    let run = s.submit(&v, "cluster-b").await?;
    let last = s.settle(&run, super::DEADLINE).await;
    s.respawn_agent(None).await?;
    let last = last?;
    Ok(vec![s.outcome(
        &run,
        &last,
        true,
        "agent of the previous release".into(),
    )])
}

/// The replicas run the previous release (this release's agent dials them: the agent one
/// release newer); two runs (cluster-a, cluster-b) start; the replicas roll to this release
/// while their Jobs run (the upgrade); two more start; the replicas roll back to the previous
/// release while those run (the rollback). Every run must end with its verdict and one Job;
/// the scene then returns to this release.
pub(crate) async fn rolling_upgrade_and_rollback(s: &mut Scene) -> Result<Vec<Outcome>> {
    let previous = previous_binary()?;
    let base = s.base_config.clone();
    s.roll_replicas_to(&base, Some(&previous)).await?;
    let mut runs = Vec::new();
    let mut held = Vec::new();
    for (step, binary) in [("upgrade", None), ("rollback", Some(previous.as_path()))] {
        let mut batch = Vec::new();
        for (destination, exit) in [("cluster-a", 0), ("cluster-b", 1)] {
            let v = s.verification(destination, exit, "25s");
            batch.push(s.submit(&v, destination).await?);
        }
        let mut all_started = true;
        for run in &batch {
            all_started &= started(s, run).await;
        }
        s.roll_replicas_to(&base, binary).await?;
        held.extend(batch.iter().map(|_| (step, all_started)));
        runs.extend(batch);
    }
    let mut lasts = Vec::new();
    for run in &runs {
        lasts.push(s.settle(run, super::DEADLINE + super::GRACE).await);
    }
    s.roll_replicas_to(&base, None).await?;
    let mut outcomes = Vec::new();
    for ((run, last), (step, all_started)) in runs.iter().zip(lasts).zip(held) {
        let last = last?;
        outcomes.push(s.outcome(
            run,
            &last,
            all_started,
            format!("in flight through the {step}: {all_started}"),
        ));
    }
    Ok(outcomes)
}
