//! `make soak`: 500 Kargo-shaped verifications, one every 1.2 s (about 10 minutes), on a direct
//! destination (cluster-a) and an agent destination (cluster-b), with a short retention: does
//! anything pile up? The scene is the agent World (`World::start_with_agent_config`: two server
//! replicas on the Kubernetes store behind a TCP front, the real Argo Rollouts controller and
//! plugin), with `jobs.retention: 1m` (the smallest the config takes) and the sweep every 5 s.
//!
//! The mix, alternating destinations: pass (exit 0), fail (exit 1), abort (a long Job whose run
//! gets `spec.terminate: true` once its measurement runs, as Kargo aborts a verification) and
//! reverify (a new run for an earlier run's Stage, without the promotion annotation, as Kargo
//! v1.11 creates it). Jobs take 1-3 s. Every verdict must be the planned one.
//!
//! The runs are kept, as Kargo keeps them (they belong to the Freight and go with it; Argo's own
//! GC trims only the measurements of one run): so the Jobs of finished runs can only go through
//! the sweep's retention (`jobs.retention`). The Jobs' TTL stays at its default (1h), longer
//! than the test, so the sweep alone must clean up.
//!
//! Measured: the peak number of our Jobs on either destination (sampled every 3 s), the Jobs and
//! DispatchJob records left once the last run is older than the retention and a sweep has
//! passed, and, from after warm-up to the end, the growth of the replicas' resident memory, open
//! file descriptors (`/proc/<pid>/fd`) and async tasks (`rollouts_dispatch_runtime_tasks` on
//! their admin ports). Last line (also to `$SUMMARY_FILE`):
//! `soak: verifications=N peak_jobs_per_destination=P final_jobs=F store_records=R server_rss_growth_mib=G fds_growth=D tasks_growth=T`.
//!
//! `SOAK_RUNS=40` (any number) runs a shorter soak; `SOAK_HOURS=2` (a decimal number) a longer
//! one, one submission per 1.2 s for that long (3 000 verifications an hour).
//!
//! Faults on a schedule (issue #32): every [`FAULT_EVERY`] (`SOAK_FAULT_EVERY`, a duration in
//! seconds; `0`: none), in turn, cluster-a's API server goes down for 5 s (every watch of it
//! ends and lists again) and cluster-b's agent is killed (-9) and started again; every verdict
//! must still be the planned one. Every 20 minutes the plugin's and the agent's tokens, and the
//! agent's ServiceAccount token on cluster-b, are renewed (all follow their files), as an
//! operator (and the kubelet) renews tokens that last an hour. A red soak prints what the agent
//! and the replicas logged about the Jobs it left. Not here yet: the agent's own process (its
//! memory, descriptors and tasks are not sampled, only the replicas').

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::admin::get_body;
use dispatch_tests::analysis::{is_finished, last_measurement, measurement_message, name, phase};
use dispatch_tests::cluster::process::status_mib;
use dispatch_tests::kargo::Verification;
use dispatch_tests::objects::managed_jobs;
use dispatch_tests::summary;
use dispatch_tests::world::agents::Agents;
use dispatch_tests::world::World;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use rand::Rng;
use serde_json::{json, Value};

/// Verifications unless `SOAK_RUNS` says otherwise.
const DEFAULT_RUNS: usize = 500;
/// One submission per this long: 500 runs take 10 minutes.
const SUBMIT_EVERY: Duration = Duration::from_millis(1200);
/// At most this many runs undecided at once: the submitter waits for verdicts beyond it.
const MAX_IN_FLIGHT: usize = 30;
/// `jobs.retention`: the smallest the config accepts (server/src/config/mod.rs).
const RETENTION: Duration = Duration::from_secs(60);
/// `serve --sweep-orphans-every`.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// How often the plugin's and the agent's tokens (valid for an hour, as the World issues them)
/// are renewed, as an operator renews them: a soak longer than an hour stalled once the first
/// ones expired (every call `401 … token expired`), 62 minutes into the first 2-hour run.
const RENEW_TOKENS_EVERY: Duration = Duration::from_secs(20 * 60);
/// How often a fault is injected, unless `SOAK_FAULT_EVERY` (seconds) says otherwise.
const FAULT_EVERY: Duration = Duration::from_secs(300);

/// The faults' period: `SOAK_FAULT_EVERY` seconds (`0`: no faults), else [`FAULT_EVERY`].
fn fault_every() -> Result<Option<Duration>> {
    match std::env::var("SOAK_FAULT_EVERY") {
        Ok(v) => {
            let seconds: u64 = v
                .trim()
                .parse()
                .with_context(|| format!("SOAK_FAULT_EVERY={v:?} is not a number of seconds"))?;
            Ok((seconds > 0).then(|| Duration::from_secs(seconds)))
        }
        Err(_) => Ok(Some(FAULT_EVERY)),
    }
}

/// Injects fault number `n` (in turn: cluster-a's API server down 5 s; the agent killed and
/// started again); names it.
async fn inject(w: &mut World<Agents>, n: usize) -> Result<&'static str> {
    if n.is_multiple_of(2) {
        w.a.restart_apiserver(Duration::from_secs(5)).await?;
        Ok("cluster-a's API server down 5 s")
    } else {
        w.b.kill_process("agent")?;
        let token = w.dispatch.agent_token.clone();
        w.spawn_agent("agent", &token)?;
        Ok("the agent killed (-9) and started again")
    }
}

/// How often the Jobs on the destinations are counted.
const SAMPLE_EVERY: Duration = Duration::from_secs(3);
/// Time for a deletion the sweep decided to land: on the agent destination the agent picks it
/// up on its next poll (`--poll-wait 10s`), deletes the Job and reports, which removes the
/// record; a sweep that must list the runs (one whose Job's run its watch lacks) takes a while on
/// a busy machine.
const DELETION_SLACK: Duration = Duration::from_secs(30);
/// The replicas' resident memory may grow this much from warm-up to the end: a leak check
/// (something kept per verification, 32 KiB each over 500 runs), not a measure of footprint.
/// Measured: 3 MiB; 28 MiB when the sweep parsed the runs in pages of 500 (`RUNS_PAGE` in
/// server/src/engine/sweep.rs), which this limit catches.
const RSS_GROWTH_LIMIT_MIB: f64 = 16.0;
/// A replica may hold this many more file descriptors at the end than after warm-up: a socket
/// or a watch kept per verification shows at once over hundreds of runs.
const FDS_GROWTH_LIMIT: i64 = 8;
/// A replica may run this many more async tasks at the end (idle) than after warm-up (30 runs
/// in flight): a task left behind per verification shows at once over hundreds of runs.
const TASKS_GROWTH_LIMIT: i64 = 16;
/// The test's time beyond its submissions: cluster start, the drain, the retention's wait.
const TEST_SLACK: Duration = Duration::from_secs(15 * 60);

/// What a verification does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The check exits 0.
    Pass,
    /// The check exits 1.
    Fail,
    /// Kargo aborts it while its Job runs.
    Abort,
    /// A re-verification of an earlier run's Stage, passing or failing.
    Reverify { exit: i32 },
}

/// The plan of one verification.
#[derive(Debug, Clone)]
struct Plan {
    destination: &'static str,
    stage: String,
    kind: Kind,
    duration: String,
}

impl Plan {
    fn exit(&self) -> i32 {
        match self.kind {
            Kind::Fail => 1,
            Kind::Reverify { exit } => exit,
            Kind::Pass | Kind::Abort => 0,
        }
    }

    /// The run's phase when the verdict is the planned one, and what else must hold.
    fn expected(&self) -> &'static str {
        match self.kind {
            // Argo ends a terminated run with the worst metric status
            // (argo-rollouts analysis/analysis.go:583-590 at 9f8d111), and our Terminate answers
            // Inconclusive (metric-provider/src/provider.rs `terminate`), as Argo's job provider.
            Kind::Abort => "Inconclusive",
            _ if self.exit() == 0 => "Successful",
            _ => "Failed",
        }
    }

    fn verification(&self, i: usize) -> Verification {
        let v = Verification::new(&self.stage, &format!("01jsoak{i:019}"), self.destination)
            .exits(self.exit())
            .runs_for(&self.duration);
        match self.kind {
            Kind::Reverify { .. } => v.reverification(),
            _ => v,
        }
    }
}

/// The plans of `runs` verifications: destinations alternate; per destination, of every 10 runs
/// 5 pass, 2 fail, 1 is aborted and 2 re-verify the Stage of the destination's previous run.
fn plans(runs: usize, rng: &mut impl Rng) -> Vec<Plan> {
    let mut plans: Vec<Plan> = Vec::with_capacity(runs);
    for i in 0..runs {
        let destination = if i.is_multiple_of(2) {
            "cluster-a"
        } else {
            "cluster-b"
        };
        let kind = match (i / 2) % 10 {
            4 | 5 => Kind::Fail,
            6 => Kind::Abort,
            7 => Kind::Reverify { exit: 0 },
            8 => Kind::Reverify { exit: 1 },
            _ => Kind::Pass,
        };
        let stage = match kind {
            Kind::Reverify { .. } => plans[i - 2].stage.clone(),
            _ => format!("stage-{i:03}"),
        };
        // An aborted Job must still run when Kargo's abort lands.
        let duration = match kind {
            Kind::Abort => "300s".to_string(),
            _ => format!("{}ms", rng.random_range(1000..3000)),
        };
        plans.push(Plan {
            destination,
            stage,
            kind,
            duration,
        });
    }
    plans
}

/// Whether the run's measurement is in progress: what Kargo's abort of a running verification
/// meets (an abort before the first measurement ends the run Successful, analysis.go:585-588).
fn measuring(run: &DynamicObject) -> bool {
    last_measurement(run)
        .and_then(|m| m.get("phase"))
        .and_then(Value::as_str)
        == Some("Running")
}

/// What a server replica holds at one moment.
#[derive(Debug, Clone, Copy)]
struct Held {
    rss_mib: f64,
    fds: i64,
    tasks: i64,
}

/// What each server replica holds now: resident memory, open descriptors, async tasks.
async fn replicas_held(w: &World<Agents>) -> Result<Vec<Held>> {
    let mut held = Vec::new();
    for r in &w.dispatch.replicas {
        let pid = w
            .control
            .pid(&r.name)
            .with_context(|| format!("{} is not running", r.name))?;
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .with_context(|| format!("listing the descriptors of {}", r.name))?
            .count();
        let metrics = get_body(r.admin, "/metrics")
            .await
            .with_context(|| format!("{}'s /metrics does not answer", r.name))?;
        let tasks = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("rollouts_dispatch_runtime_tasks ")?
                    .parse()
                    .ok()
            })
            .with_context(|| {
                format!(
                    "no rollouts_dispatch_runtime_tasks on {}'s /metrics",
                    r.name
                )
            })?;
        held.push(Held {
            rss_mib: status_mib(pid, "VmRSS")?,
            fds: i64::try_from(fds)?,
            tasks,
        });
    }
    Ok(held)
}

/// The largest growth of `what` over the replicas, from `warm` to `end`.
fn growth<T: std::ops::Sub<Output = T> + PartialOrd + Copy>(
    warm: &[Held],
    end: &[Held],
    what: impl Fn(&Held) -> T,
) -> Option<T> {
    warm.iter()
        .zip(end)
        .map(|(w, e)| what(e) - what(w))
        .reduce(|a, b| if b > a { b } else { a })
}

/// The number of verifications `SOAK_RUNS` or `SOAK_HOURS` asks for, else [`DEFAULT_RUNS`].
fn runs_wanted() -> Result<usize> {
    match (std::env::var("SOAK_RUNS"), std::env::var("SOAK_HOURS")) {
        (Ok(_), Ok(_)) => bail!("SOAK_RUNS and SOAK_HOURS: set one of them, not both"),
        (Ok(runs), _) => runs
            .parse()
            .context("SOAK_RUNS: want a number of verifications"),
        (_, Ok(hours)) => {
            let hours: f64 = hours
                .parse()
                .ok()
                .filter(|h: &f64| h.is_finite() && *h > 0.0)
                .context("SOAK_HOURS: want a positive number of hours, such as 2 or 0.5")?;
            Ok((hours * 3600.0 / SUBMIT_EVERY.as_secs_f64()).ceil() as usize)
        }
        _ => Ok(DEFAULT_RUNS),
    }
}

/// How long the soak keeps looking at what was left past the bound, to say when it went (the
/// verdict stays red): the first 2-hour run to end left 2 Jobs and 2 records at the bound, and
/// its filtered output could not say whose or why.
const LEFTOVER_WATCH: Duration = Duration::from_secs(180);

/// Prints each Job and record left (state, age, the run's uid), then looks again until they
/// are gone or [`LEFTOVER_WATCH`] has passed, and prints when.
/// The last [`LOG_LINES_PER_JOB`] lines of the agent's and the replicas' logs that name each
/// of `jobs`: a red soak keeps what its components said about what they left (the scene and its
/// logs go with the test).
fn print_log_lines(w: &World<Agents>, jobs: &[String]) {
    let logs = [
        ("agent", w.b.log_path("agent")),
        ("server-1", w.control.log_path("server-1")),
        ("server-2", w.control.log_path("server-2")),
    ];
    for (component, path) in logs {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for job in jobs {
            let lines: Vec<&str> = text.lines().filter(|l| l.contains(job.as_str())).collect();
            for line in &lines[lines.len().saturating_sub(LOG_LINES_PER_JOB)..] {
                println!("soak: {component} log: {line}");
            }
        }
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        for line in &errors[errors.len().saturating_sub(LOG_LINES_PER_JOB)..] {
            println!("soak: {component} log: {line}");
        }
    }
}

/// How many log lines per leftover Job (and of warnings per component) a red soak prints.
const LOG_LINES_PER_JOB: usize = 8;

async fn describe_leftovers(w: &World<Agents>) -> Result<()> {
    let now = k8s_openapi::jiff::Timestamp::now();
    for (cluster, c) in [("cluster-a", &w.a), ("cluster-b", &w.b)] {
        for j in managed_jobs(c).await? {
            let status = j.status.unwrap_or_default();
            let age = j
                .metadata
                .creation_timestamp
                .map(|t| now.duration_since(t.0).as_secs());
            println!(
                "soak: left Job {cluster} {}/{} run_uid={:?} age_s={age:?} active={:?} succeeded={:?} failed={:?} deleting={}",
                j.metadata.namespace.unwrap_or_default(),
                j.metadata.name.unwrap_or_default(),
                j.metadata
                    .labels
                    .unwrap_or_default()
                    .get(dispatch_server::job::LABEL_RUN_UID),
                status.active,
                status.succeeded,
                status.failed,
                j.metadata.deletion_timestamp.is_some(),
            );
        }
    }
    let mut named = Vec::new();
    for r in w.records().list(&ListParams::default()).await?.items {
        named.extend(r.data["spec"]["jobName"].as_str().map(str::to_string));
        println!(
            "soak: left record {} spec={} status={}",
            r.metadata.name.unwrap_or_default(),
            r.data["spec"],
            r.data["status"]
        );
    }
    print_log_lines(w, &named);
    let since = Instant::now();
    while since.elapsed() < LEFTOVER_WATCH {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let (a, b, records) = leftovers(w).await?;
        if a + b + records == 0 {
            println!(
                "soak: the leftovers went {}s after the bound",
                since.elapsed().as_secs()
            );
            return Ok(());
        }
    }
    println!(
        "soak: leftovers still there {}s after the bound",
        LEFTOVER_WATCH.as_secs()
    );
    Ok(())
}

/// Our Jobs on cluster-a and cluster-b, and the DispatchJob records.
async fn leftovers(w: &World<Agents>) -> Result<(usize, usize, usize)> {
    Ok((
        managed_jobs(&w.a).await?.len(),
        managed_jobs(&w.b).await?.len(),
        w.records().list(&ListParams::default()).await?.items.len(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "runs for about 12 minutes (SOAK_HOURS: longer) on 3 real clusters: run `make soak`"]
async fn verifications_leave_nothing_behind() -> Result<()> {
    let runs_wanted = runs_wanted()?;
    let timeout = SUBMIT_EVERY * u32::try_from(runs_wanted)? + TEST_SLACK;
    tokio::time::timeout(timeout, soak(runs_wanted))
        .await
        .with_context(|| format!("the soak did not end within {}s", timeout.as_secs()))?
}

async fn soak(runs_wanted: usize) -> Result<()> {
    let sweep = format!("{}s", SWEEP_EVERY.as_secs());
    let faults_every = fault_every()?;
    let mut w = World::start_with_agent_config(
        &["--sweep-orphans-every", &sweep],
        &format!("jobs: {{retention: {}s}}", RETENTION.as_secs()),
    )
    .await?;
    let runs = w.runs();
    let plans = plans(runs_wanted, &mut rand::rng());

    // The submitter: one run per SUBMIT_EVERY, at most MAX_IN_FLIGHT undecided.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let (tx, mut submitted) = tokio::sync::mpsc::unbounded_channel::<(usize, String, Instant)>();
    let submitter = {
        let (runs, freight, plans, in_flight) = (
            runs.clone(),
            w.freight.clone(),
            plans.clone(),
            in_flight.clone(),
        );
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SUBMIT_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for (i, plan) in plans.iter().enumerate() {
                tick.tick().await;
                while in_flight.load(Ordering::SeqCst) >= MAX_IN_FLIGHT {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                let ar = plan.verification(i).analysis_run(&freight)?;
                let created = runs.create(&PostParams::default(), &ar).await?;
                in_flight.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send((i, name(&created).to_string(), Instant::now()));
            }
            Ok::<_, anyhow::Error>(())
        })
    };

    // Watch the undecided runs; abort the planned ones once they measure; count Jobs.
    let started = Instant::now();
    let deadline = started + SUBMIT_EVERY * runs_wanted as u32 + Duration::from_secs(300);
    let warm_up = (runs_wanted / 5).clamp(1, 50);
    let mut pending: BTreeMap<usize, (String, Instant, bool)> = BTreeMap::new();
    let mut decided: BTreeMap<usize, (DynamicObject, Duration)> = BTreeMap::new();
    let mut peak = [0usize; 2];
    let mut warm: Option<Vec<Held>> = None;
    let (mut last_sample, mut last_log) = (Instant::now() - SAMPLE_EVERY, Instant::now());
    let mut submitter = Some(submitter);
    let (mut faults, mut last_fault) = (0usize, Instant::now());
    let mut last_renewal = Instant::now();
    while decided.len() < runs_wanted {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if last_renewal.elapsed() >= RENEW_TOKENS_EVERY {
            w.renew_tokens()?;
            last_renewal = Instant::now();
            println!("soak: the plugin's and the agent's tokens renewed (valid for an hour)");
        }
        if faults_every.is_some_and(|every| last_fault.elapsed() >= every) && submitter.is_some() {
            let what = inject(&mut w, faults).await?;
            faults += 1;
            last_fault = Instant::now();
            println!("soak: fault {faults}: {what}");
        }
        if Instant::now() > deadline {
            bail!(
                "{} of {runs_wanted} runs decided by the deadline; undecided: {:?}",
                decided.len(),
                pending.values().map(|p| &p.0).collect::<Vec<_>>()
            );
        }
        if let Some(s) = submitter.take_if(|s| s.is_finished()) {
            s.await.context("the submitter")??;
        }
        while let Ok((i, n, at)) = submitted.try_recv() {
            pending.insert(i, (n, at, false));
        }
        let mut done = Vec::new();
        for (i, (n, at, aborted)) in pending.iter_mut() {
            let run = runs.get(n).await.with_context(|| format!("getting {n}"))?;
            if is_finished(&run) {
                done.push((*i, run, at.elapsed()));
            } else if plans[*i].kind == Kind::Abort && !*aborted && measuring(&run) {
                // Kargo's abort: akuity/kargo v1.11.2 pkg/controller/stages/regular_stages.go:1722.
                let patch = Patch::Merge(json!({"spec": {"terminate": true}}));
                runs.patch(n, &PatchParams::default(), &patch).await?;
                *aborted = true;
            }
        }
        for (i, run, took) in done {
            pending.remove(&i);
            decided.insert(i, (run, took));
            in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        if last_sample.elapsed() >= SAMPLE_EVERY {
            last_sample = Instant::now();
            let (a, b, records) = leftovers(&w).await?;
            peak = [peak[0].max(a), peak[1].max(b)];
            if warm.is_none() && decided.len() >= warm_up {
                warm = Some(replicas_held(&w).await?);
            }
            if last_log.elapsed() >= Duration::from_secs(30) {
                last_log = Instant::now();
                println!(
                    "soak: t={}s decided={} in_flight={} jobs a={a} b={b} records={records} replicas={:?}",
                    started.elapsed().as_secs(),
                    decided.len(),
                    pending.len(),
                    replicas_held(&w).await?
                );
            }
        }
    }
    let drained = Instant::now();

    // Verdicts: each the planned one.
    let mut wrong = Vec::new();
    let mut slowest = Duration::ZERO;
    for (i, (run, took)) in &decided {
        let plan = &plans[*i];
        slowest = slowest.max(*took);
        let want = plan.expected();
        // A terminated measurement ends through the plugin's Terminate, which Argo marks
        // (argo-rollouts analysis/analysis.go:351-356 at 9f8d111).
        let terminated =
            plan.kind != Kind::Abort || measurement_message(run) == "Metric Terminated";
        if phase(run) != want || !terminated {
            wrong.push(format!(
                "{} ({:?} on {}): {} (want {want}): {}",
                name(run),
                plan.kind,
                plan.destination,
                phase(run),
                run.data["status"]
            ));
        }
    }

    // Every run completed at most now; once the retention and a sweep period have passed, and
    // the sweep's deletions have landed, nothing of theirs may be left: the bound is 0 Jobs and
    // 0 records (runs are kept, so this is the retention's doing, not the deleted-run sweep's).
    let bound_at = drained + RETENTION + SWEEP_EVERY + DELETION_SLACK;
    let (final_jobs, store_records) = loop {
        let (a, b, records) = leftovers(&w).await?;
        peak = [peak[0].max(a), peak[1].max(b)];
        if (a + b + records == 0) || Instant::now() >= bound_at {
            break (a + b, records);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    };
    let end = replicas_held(&w).await?;
    let warm = warm.context("no warm-up sample was taken")?;
    let rss_growth = growth(&warm, &end, |h| h.rss_mib).context("no replica")?;
    let fds_growth = growth(&warm, &end, |h| h.fds).context("no replica")?;
    let tasks_growth = growth(&warm, &end, |h| h.tasks).context("no replica")?;

    // What bounds P: a destination gets every second run, one per 2 × SUBMIT_EVERY; a run's Job
    // lives from its creation until the first sweep after its completion + the retention (an
    // aborted run's Job goes at once). So at most (slowest verdict + retention + sweep period +
    // deletion slack) / (2 × SUBMIT_EVERY) Jobs, plus one, exist at once on a destination.
    let lifetime = slowest + RETENTION + SWEEP_EVERY + DELETION_SLACK;
    let peak_bound =
        (lifetime.as_secs_f64() / (2.0 * SUBMIT_EVERY.as_secs_f64())).ceil() as usize + 1;
    let peak_jobs = peak[0].max(peak[1]);
    println!(
        "soak: {} runs in {}s, slowest verdict {}s; peak Jobs cluster-a={} cluster-b={} (bound {peak_bound}); \
         replicas warm={warm:?} end={end:?}",
        decided.len(),
        drained.duration_since(started).as_secs(),
        slowest.as_secs(),
        peak[0],
        peak[1],
    );
    for line in &wrong {
        println!("soak: wrong verdict: {line}");
    }
    let line = format!(
        "soak: verifications={} peak_jobs_per_destination={peak_jobs} final_jobs={final_jobs} \
         store_records={store_records} server_rss_growth_mib={rss_growth:.0} \
         fds_growth={fds_growth} tasks_growth={tasks_growth}",
        decided.len()
    );
    if !wrong.is_empty() {
        bail!("{line}: {} wrong verdicts", wrong.len());
    }
    if final_jobs != 0 || store_records != 0 {
        describe_leftovers(&w).await?;
        bail!("{line}: Jobs or records left after the retention and a sweep (bound: 0)");
    }
    if peak_jobs > peak_bound {
        bail!("{line}: more Jobs at once than the retention allows (bound {peak_bound})");
    }
    if rss_growth > RSS_GROWTH_LIMIT_MIB {
        bail!("{line}: a replica's memory grew beyond {RSS_GROWTH_LIMIT_MIB} MiB");
    }
    if fds_growth > FDS_GROWTH_LIMIT {
        bail!("{line}: a replica holds more than {FDS_GROWTH_LIMIT} more file descriptors");
    }
    if tasks_growth > TASKS_GROWTH_LIMIT {
        bail!("{line}: a replica runs more than {TASKS_GROWTH_LIMIT} more async tasks");
    }
    summary::report(&line)
}
