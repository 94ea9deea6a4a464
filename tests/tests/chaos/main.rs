//! `make chaos`: 50 Kargo-shaped verifications across a direct destination (cluster-a) and an
//! agent destination (cluster-b) on the agent World (`World::start_with_agent_config`: two
//! server replicas on the Kubernetes store behind a TCP front, the real Argo Rollouts
//! controller); nothing is mocked.
//!
//! * **Kill phase** (46 runs): a killer sends SIGKILL, at random moments, to a server replica,
//!   the agent, the plugin process, the controller or cluster-a's API server (and starts them
//!   again; Argo starts a new plugin itself); midway one replica stays down for good, so the
//!   server goes from 2 replicas to 1. Correct: exit code 0 → Successful, else Failed.
//! * **Faults** ([`faults`], one run each, in turn): cluster-a's API server down during an abort;
//!   an agent silent past the deadline; transient 5xx on the agent's Job create; a memory-store
//!   server restarted before the agent polls.
//!
//! Then: every run is terminal within its deadline + grace (else it is `stuck`); each Job name
//! (one per measurement) existed once, on its run's destination only (`duplicate_jobs`, from
//! a watch of every cluster's Jobs during the whole test, since Jobs do not outlive the
//! retention); once every run finished, no Job of ours is left on a or b after `jobs.retention`
//! and a sweep period (`leftover_jobs`, counted before the runs are deleted); and after the
//! runs are deleted, the servers' orphan sweep leaves no Job and no DispatchJob (`orphans`).
//! Last line (also to `$SUMMARY_FILE`):
//! `verifications=50 correct=N duplicate_jobs=D orphans=O stuck=S leftover_jobs=L`.

mod faults;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dispatch_tests::analysis::{is_finished, phase};
use dispatch_tests::invariants::{
    duplicate_jobs, fault_server_config, managed_jobs, wait_terminal, JobWatch, Outcome,
};
use dispatch_tests::kargo::Verification;
use dispatch_tests::summary;
use dispatch_tests::world::agents::Agents;
use dispatch_tests::world::World;
use kube::api::{DeleteParams, ListParams, PostParams};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;

/// Runs of the kill phase; the faults add one each.
const KILL_RUNS: usize = 46;
const RUNS: usize = KILL_RUNS + faults::COUNT;
/// `jobs.retention` of the servers (its minimum) and their sweep period.
const RETENTION: Duration = Duration::from_secs(60);
const SWEEP_EVERY: Duration = Duration::from_secs(3);
/// The servers' deadline for a block without `activeDeadline`, and the grace: short enough that
/// a run past them is counted `stuck` within the test, long enough for every kill-phase run.
const DEADLINE: Duration = Duration::from_secs(300);
const GRACE: Duration = Duration::from_secs(5);
/// Beyond deadline + grace: the controller measures a running metric only every few seconds,
/// and may itself be restarting.
const SLACK: Duration = Duration::from_secs(60);

/// Beyond retention + sweep: the agent's next poll and the deletions themselves.
const LEFTOVER_SLACK: Duration = Duration::from_secs(30);

/// The plan of run `i`: destination, exit code, Job duration.
fn plan(i: usize, rng: &mut impl Rng) -> (&'static str, i32, String) {
    let destination = if i.is_multiple_of(2) {
        "cluster-a"
    } else {
        "cluster-b"
    };
    let exit = if i % 4 == 3 { 1 } else { 0 };
    (
        destination,
        exit,
        format!("{}ms", rng.random_range(1000..6000)),
    )
}

/// PIDs of the plugin processes the controller started (their binary is in its `plugin-bin/`).
fn plugin_pids(work_dir: &std::path::Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let needle = work_dir.join("plugin-bin").display().to_string();
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).starts_with(&needle))
                .unwrap_or(false)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "kills and restarts components for minutes: run `make chaos`"]
async fn fifty_verifications_survive_kills_and_faults() -> Result<()> {
    let sweep = format!("{}s", SWEEP_EVERY.as_secs());
    let mut w = World::start_with_agent_config(
        &["--sweep-orphans-every", &sweep],
        &fault_server_config(DEADLINE, GRACE, RETENTION),
    )
    .await?;
    let watch = JobWatch::start(vec![
        ("cluster-a", w.a.client().await?),
        ("cluster-b", w.b.client().await?),
        ("control", w.control.client().await?),
    ]);
    let (mut outcomes, kills) = kill_phase(&mut w).await?;
    println!("chaos: kill phase over: kills {kills:?}");
    let done = faults::run_all(&mut w, &watch, &mut outcomes).await?;
    tally(&mut w, &watch, &outcomes, &done).await
}

/// The kill phase: [`KILL_RUNS`] runs submitted over ~40 s while the killer works, until every
/// run is terminal or past its bound. Returns their outcomes and the kills.
async fn kill_phase(w: &mut World<Agents>) -> Result<(Vec<Outcome>, BTreeMap<&'static str, u32>)> {
    let runs = w.runs();
    let mut rng = rand::rng();
    let plans: Vec<(&str, i32, String)> = (0..KILL_RUNS).map(|i| plan(i, &mut rng)).collect();
    let bound = DEADLINE + GRACE + SLACK;

    let mut submitter = Some({
        let (runs, freight, plans) = (runs.clone(), w.freight.clone(), plans.clone());
        tokio::spawn(async move {
            let mut names = Vec::new();
            for (i, (destination, exit, duration)) in plans.iter().enumerate() {
                let ar = Verification::new(
                    &format!("stage-{i:02}"),
                    &format!("01jchaos{i:018}"),
                    destination,
                )
                .exits(*exit)
                .runs_for(duration)
                .analysis_run(&freight)?;
                let created = runs.create(&PostParams::default(), &ar).await?;
                names.push((
                    created.metadata.name.unwrap_or_default(),
                    Instant::now(),
                    bound,
                ));
                tokio::time::sleep(Duration::from_millis(800)).await;
            }
            Ok::<_, anyhow::Error>(names)
        })
    });

    // Every victim in turn, in a shuffled order per round; after 4 kills server-2 stays down for
    // good (the server goes from 2 replicas to 1 mid-run: the phase sees 7 to 10 kills).
    let mut victims: Vec<&str> = Vec::new();
    let mut scaled_down = false;
    let mut kills: BTreeMap<&str, u32> = BTreeMap::new();
    let mut names: Option<Vec<(String, Instant, Duration)>> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(2000..5000))).await;
        if let Some(s) = submitter.take_if(|s| s.is_finished()) {
            names = Some(s.await.context("submitter")??);
            continue;
        }
        if let Some(names) = &names {
            let mut waiting = 0;
            for (n, created, bound) in names {
                if !is_finished(&runs.get(n).await?) && created.elapsed() < *bound {
                    waiting += 1;
                }
            }
            if waiting == 0 {
                break;
            }
        }
        if victims.is_empty() {
            victims = vec!["server-1", "agent", "plugin", "controller", "apiserver-a"];
            if !scaled_down {
                victims.push("server-2");
            }
            rand::seq::SliceRandom::shuffle(&mut victims[..], &mut rng);
        }
        let victim = victims.pop().unwrap_or("agent");
        let down = Duration::from_millis(rng.random_range(300..2000));
        if !scaled_down && kills.values().sum::<u32>() >= 4 {
            scaled_down = true;
            w.control.kill_process("server-2")?;
            victims.retain(|v| *v != "server-2");
            println!("chaos: server-2 stopped for good: 1 replica from now on");
            continue;
        }
        match victim {
            "server-1" | "server-2" => {
                let i = usize::from(victim == "server-2");
                w.control.kill_process(victim)?;
                tokio::time::sleep(down).await;
                w.restart_replica(i).await?;
            }
            "agent" => {
                w.b.kill_process("agent")?;
                tokio::time::sleep(down).await;
                let token = w.dispatch.agent_token.clone();
                w.spawn_agent("agent", &token)?;
            }
            "plugin" => {
                for pid in plugin_pids(&w.rollouts.work_dir) {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
            // cluster-a's API server goes away mid-Job and comes back.
            "apiserver-a" => w.a.restart_apiserver(down).await?,
            _ => w.rollouts.restart(&mut w.control).await?,
        }
        *kills.entry(victim).or_default() += 1;
        println!("chaos: killed {victim} ({kills:?})");
    }
    let names = names.unwrap_or_default();
    let last = wait_terminal(&runs, &names).await?;

    let outcomes = last
        .iter()
        .zip(&plans)
        .map(|(ar, (destination, exit, _))| {
            let want = if *exit == 0 { "Successful" } else { "Failed" };
            Outcome {
                name: ar.metadata.name.clone().unwrap_or_default(),
                uid: ar.metadata.uid.clone().unwrap_or_default(),
                destination,
                correct: phase(ar) == want,
                stuck: !is_finished(ar),
                detail: format!("{} (want {want}): {}", phase(ar), ar.data["status"]),
            }
        })
        .collect();
    Ok((outcomes, kills))
}

/// The checks after every run: duplicates from the watch, leftover Jobs after the retention,
/// then the runs deleted and the orphans.
async fn tally(
    w: &mut World<Agents>,
    watch: &JobWatch,
    outcomes: &[Outcome],
    done: &faults::Done,
) -> Result<()> {
    let mut report = Vec::new();
    let correct = outcomes.iter().filter(|o| o.correct).count();
    let stuck = outcomes.iter().filter(|o| o.stuck).count();
    for o in outcomes.iter().filter(|o| !o.correct || o.stuck) {
        report.push(format!(
            "{} on {}{}: {}",
            o.name,
            o.destination,
            if o.stuck { " (stuck)" } else { "" },
            o.detail
        ));
    }

    // One Job per measurement (a Job name), on its own destination only.
    let seen = watch.seen();
    let duplicates = duplicate_jobs(outcomes, &seen, &[], &mut report);

    // Nothing left once the retention (and a sweep) passed since the last run finished, and a
    // sweep since the Kubernetes-store replicas came back (the last fault ran without them):
    // the retention sweep, pending deletions and the agent's deletes (+ [`LEFTOVER_SLACK`]);
    // counted before any run is deleted, so the deleted-run sweep cannot hide a Job the
    // retention should have removed.
    let leftover_at =
        (done.last_terminal + RETENTION).max(done.servers_back) + 2 * SWEEP_EVERY + LEFTOVER_SLACK;
    let leftover = loop {
        let mut left = Vec::new();
        for (name, cluster) in [("cluster-a", &w.a), ("cluster-b", &w.b)] {
            for j in managed_jobs(cluster).await? {
                left.push(format!("{name}/{}", j.metadata.name.unwrap_or_default()));
            }
        }
        if left.is_empty() || Instant::now() > leftover_at {
            for l in &left {
                report.push(format!("job {l} left after the retention"));
            }
            break left.len();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };

    // Delete the runs: the orphan sweep must remove every Job and DispatchJob.
    let runs = w.runs();
    for o in outcomes {
        runs.delete(&o.name, &DeleteParams::default()).await?;
    }
    let records = w.records();
    let sweep_deadline = Instant::now() + Duration::from_secs(120);
    let orphans = loop {
        let left = managed_jobs(&w.a).await?.len()
            + managed_jobs(&w.b).await?.len()
            + records.list(&ListParams::default()).await?.items.len();
        if left == 0 || Instant::now() > sweep_deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };

    println!(
        "chaos: {} Jobs seen for {} runs",
        seen.len(),
        outcomes.len()
    );
    for line in &report {
        println!("chaos: {line}");
    }
    let summary = format!(
        "verifications={} correct={correct} duplicate_jobs={duplicates} orphans={orphans} \
         stuck={stuck} leftover_jobs={leftover}",
        outcomes.len()
    );
    if outcomes.len() != RUNS
        || correct != RUNS
        || duplicates != 0
        || orphans != 0
        || stuck != 0
        || leftover != 0
    {
        anyhow::bail!("{summary}");
    }
    summary::report(&summary)
}
