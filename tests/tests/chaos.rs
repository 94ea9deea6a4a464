//! `make chaos`: 50 Kargo-shaped verifications across a direct destination (cluster-a) and an
//! agent destination (cluster-b) while a killer sends SIGKILL, at random moments, to a server
//! replica, the agent, the plugin process, the Argo Rollouts controller or cluster-a's API server
//! (and starts them again; Argo starts a new plugin itself); midway one replica stays down for
//! good, so the server goes from 2 replicas to 1. Nothing is mocked: the scene is the agent World
//! (`World::start_with_agent`: two server replicas on the Kubernetes store behind a TCP front,
//! the real controller).
//!
//! Then: every AnalysisRun has its correct verdict (exit code 0 → Successful, else Failed);
//! each measurement has exactly one Job, on its own destination only; and after the runs are
//! deleted, the servers' orphan sweep (`--sweep-orphans-every 3s`) leaves no Job and no
//! DispatchJob behind. Last line (also to `$SUMMARY_FILE`):
//! `verifications=50 correct=N duplicate_jobs=D orphans=O`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::analysis::{is_finished, phase};
use dispatch_tests::kargo::Verification;
use dispatch_tests::objects::{managed_jobs, RUN_UID_LABEL};
use dispatch_tests::summary;
use dispatch_tests::world::World;
use kube::api::{DeleteParams, ListParams, PostParams};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;

const RUNS: usize = 50;

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
async fn fifty_verifications_survive_kills() -> Result<()> {
    let mut w = World::start_with_agent(&["--sweep-orphans-every", "3s"]).await?;
    let runs = w.runs();
    let mut rng = rand::rng();
    let plans: Vec<(&str, i32, String)> = (0..RUNS).map(|i| plan(i, &mut rng)).collect();

    // Submit the runs over ~40 s while the killer works.
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
                names.push(created.metadata.name.unwrap_or_default());
                tokio::time::sleep(Duration::from_millis(800)).await;
            }
            Ok::<_, anyhow::Error>(names)
        })
    });

    // Every victim in turn, in a shuffled order per round; after 8 kills server-2 stays down for
    // good (the server goes from 2 replicas to 1 mid-run).
    let mut victims: Vec<&str> = Vec::new();
    let mut scaled_down = false;
    let mut kills: BTreeMap<&str, u32> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut names: Option<Vec<String>> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(rng.random_range(2000..5000))).await;
        if let Some(s) = submitter.take_if(|s| s.is_finished()) {
            names = Some(s.await.context("submitter")??);
            continue;
        }
        if let Some(names) = &names {
            let mut done = 0;
            for n in names {
                if is_finished(&runs.get(n).await?) {
                    done += 1;
                }
            }
            if done == names.len() {
                break;
            }
            if Instant::now() > deadline {
                bail!("only {done} of {RUNS} runs finished within 10 minutes");
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
        if !scaled_down && kills.values().sum::<u32>() >= 8 {
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

    // Verdicts.
    let mut correct = 0;
    let mut wrong = Vec::new();
    let mut uids = BTreeMap::new();
    for (n, (destination, exit, _)) in names.iter().zip(&plans) {
        let ar = runs.get(n).await?;
        let want = if *exit == 0 { "Successful" } else { "Failed" };
        if phase(&ar) == want {
            correct += 1;
        } else {
            wrong.push(format!(
                "{n} on {destination}: {} (want {want}): {}",
                phase(&ar),
                ar.data["status"]
            ));
        }
        uids.insert(
            ar.metadata.uid.clone().unwrap_or_default(),
            (*destination, n.clone()),
        );
    }
    // One Job per measurement, on its own destination only.
    let mut duplicates = 0;
    let mut per_name: BTreeMap<String, usize> = BTreeMap::new();
    for (cluster, name) in [
        (&w.a, "cluster-a"),
        (&w.b, "cluster-b"),
        (&w.control, "control"),
    ] {
        for j in managed_jobs(cluster).await? {
            let uid = j
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(RUN_UID_LABEL))
                .cloned()
                .unwrap_or_default();
            match uids.get(&uid) {
                Some((destination, _)) if *destination == name => {}
                other => {
                    duplicates += 1;
                    wrong.push(format!(
                        "job {:?} on {name} belongs to {other:?}",
                        j.metadata.name
                    ));
                }
            }
            *per_name
                .entry(j.metadata.name.clone().unwrap_or_default())
                .or_default() += 1;
        }
    }
    duplicates += per_name
        .values()
        .filter(|c| **c > 1)
        .map(|c| c - 1)
        .sum::<usize>();
    let jobs_total: usize = per_name.values().sum();

    // Delete the runs: the orphan sweep must remove every Job and DispatchJob.
    for n in &names {
        runs.delete(n, &DeleteParams::default()).await?;
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

    println!("chaos: kills {kills:?}; {jobs_total} Jobs for {RUNS} runs");
    for line in &wrong {
        println!("chaos: {line}");
    }
    let summary = format!(
        "verifications={RUNS} correct={correct} duplicate_jobs={duplicates} orphans={orphans}"
    );
    if correct != RUNS || duplicates != 0 || orphans != 0 {
        bail!("{summary}");
    }
    summary::report(&summary)
}
