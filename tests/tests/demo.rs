//! `make demo`: the main job, start to finish, on this machine. Two destination clusters and a
//! control plane with the real Argo Rollouts controller; `rollouts-dispatch serve`; the plugin
//! registered in `argo-rollouts-config`; one Kargo-shaped verification per destination (the one
//! on cluster-b runs a check that fails). Prints the AnalysisRuns as a table and, last,
//! `demo: cluster-a=<phase> cluster-b=<phase>`. Everything is torn down at the end.
//!
//! With `DEMO_KEEP=1` (`make demo-up`) everything stays up after the verdicts, with the page's
//! URL, a token, the `logs` and `kubectl` commands to try printed, until Ctrl-C or `make
//! demo-down` (`dispatch_tests::kept`); then it is torn down and the same last line printed.

use std::time::Instant;

use anyhow::{bail, Result};
use dispatch_tests::analysis::{measurement_message, phase};
use dispatch_tests::kargo::Verification;
use dispatch_tests::kept::{self, StateDir, Stop};
use dispatch_tests::summary;
use dispatch_tests::world::{Direct, DirectOptions, World};
use kube::api::DynamicObject;

/// The first line of the last measurement's message: one row per run in the table.
fn last_message(ar: &DynamicObject) -> String {
    measurement_message(ar)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// What the demo showed: the World still up, the summary line, the failing run's name.
struct Shown {
    world: World<Direct>,
    summary: String,
    failing_run: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "starts real clusters: run `make demo`"]
async fn demo() -> Result<()> {
    let started = Instant::now();
    if !kept::requested() {
        let shown = show(DirectOptions::default()).await?;
        println!(
            "demo: done in {:.0}s; tearing everything down",
            started.elapsed().as_secs_f64()
        );
        drop(shown.world);
        return summary::report(&shown.summary);
    }
    // Ours from the start: Ctrl-C while the clusters start tears them down too.
    let mut stop = Stop::listen()?;
    let state = StateDir::claim()?;
    let mut shown = tokio::select! {
        shown = show(kept::options()) => shown?,
        signal = stop.signalled() => {
            // Said on stdout (the make target shows only `demo:` lines); the error fails the run.
            kept::say(&format!("demo: {signal} before the verdicts: tearing everything down"));
            bail!("stopped by {signal} before the verdicts");
        }
    };
    println!("demo: done in {:.0}s", started.elapsed().as_secs_f64());
    let waited = kept::keep(&mut shown.world, &shown.failing_run, &state, &mut stop).await;
    drop(shown.world);
    drop(state);
    waited?;
    kept::say("demo: everything torn down");
    summary::report(&shown.summary)
}

/// The demo up to its verdicts, with the server configured with `options`: starts the World,
/// submits the two verifications, prints their table and the failure's message.
async fn show(options: DirectOptions) -> Result<Shown> {
    println!("demo: starting clusters control, a, b, rollouts-dispatch serve (destinations cluster-a, cluster-b) and the Argo Rollouts controller with plugin rollouts-dispatch/job ...");
    // Keep the whole world alive to the end: its clusters stop when it is dropped.
    let world = World::start_with(options).await?;
    println!("demo: all up; the plugin talks to {}", world.url);
    println!(
        "demo: Kargo verifies Freight {} on Stage uat (cluster-a) and Stage prod (cluster-b) ...",
        &world.freight.name[..7]
    );
    let mut created = Vec::new();
    for (stage, ulid, dest, exit_code) in [
        ("uat", "01jdemo0000000000000000000", "cluster-a", 0),
        ("prod", "01jdemo0000000000000000001", "cluster-b", 1),
    ] {
        let verification = Verification::new(stage, ulid, dest).exits(exit_code);
        created.push((dest, world.submit(&verification).await?));
    }
    let mut rows = Vec::new();
    let mut tails = Vec::new();
    for (dest, run) in &created {
        let ar = world.finished(run).await?;
        let name = ar.metadata.name.clone().unwrap_or_default();
        let full = measurement_message(&ar);
        if full.lines().count() > 1 {
            tails.push((name.clone(), full));
        }
        rows.push((name, dest.to_string(), phase(&ar), last_message(&ar)));
    }
    println!();
    println!(
        "{:<42} {:<11} {:<11} MESSAGE",
        "ANALYSISRUN", "DESTINATION", "PHASE"
    );
    for (name, dest, phase, msg) in &rows {
        println!("{name:<42} {dest:<11} {phase:<11} {msg}");
    }
    // The rest of a failure's message: the failed container's log tail, from its cluster.
    for (name, message) in &tails {
        println!();
        println!("demo: {name}, the rest of its message:");
        for line in message.lines().skip(1) {
            println!("demo:   {line}");
        }
    }
    println!();
    Ok(Shown {
        summary: format!("demo: cluster-a={} cluster-b={}", rows[0].2, rows[1].2),
        failing_run: rows[1].0.clone(),
        world,
    })
}
