//! `make bench-scale`: 10 000 concurrent Kargo-shaped verifications through one Argo Rollouts
//! controller, one plugin and one `rollouts-dispatch` server on one control plane; first with
//! the Jobs on a direct destination (`cluster-a`, whose pods kwok runs for 3 to 5 minutes),
//! then the same with the work held by 1 000 agents (simulated: [`dispatch_tests::fleet`],
//! holding each Job for its pod's duration). Everything else is real: the API servers, the
//! controller (built by `make k8s-bin`) with our release plugin over netrpc, the
//! release server as its own process with its watch caches, policy, run confirmation and resume
//! hints.
//!
//! Measured, per phase:
//! * every verdict: one in ten checks exits 1, and its run must end `Failed`, the others
//!   `Successful`;
//! * verdict latency: from the Job's end (a watch on cluster-a's Jobs sees its final condition;
//!   an agent's final report) to the run's phase (a watch on the AnalysisRuns), p50 and p99;
//! * the API servers' write rates by client, from their audit logs
//!   ([`dispatch_tests::cluster::audit`]): ours (the plugin's `resumeAt` patches, the server's
//!   Jobs) beside the controller's status writes, per second of the phase (`-` is the bench
//!   itself creating the runs, as Kargo would);
//! * peak RSS (`VmHWM`) of the server, the plugin and the controller.
//!
//! The controller runs with `--qps`/`--burst` raised (`BENCH_SCALE_CONTROLLER_ARGS`, default
//! `--qps=400 --burst=800`): at its defaults (40 and 80, argo-rollouts
//! utils/defaults/defaults.go:38-41) its own client-side limiter is what bounds 10 000
//! verifications, as a platform team running that many finds first. The controller-manager and
//! the scheduler of the test clusters are unthrottled too (`ClusterOptions::unthrottled`).
//!
//! Sizes from the environment: `BENCH_SCALE_MEASUREMENTS` (10000 per phase), `BENCH_SCALE_AGENTS`
//! (1000), `BENCH_SCALE_JOB_SECONDS` (180: the shortest Job; the longest two thirds more),
//! `BENCH_SCALE_CREATE_PER_S` (100: how fast "Kargo" creates the runs). `make test` runs it
//! small. Last line: `scale: measurements=N correct=C verdict_p99_ms=P api_writes_per_s=A
//! server_rss_mib=S plugin_rss_mib=R agents=G`, where C is the lower of the two phases' correct
//! counts, P and A the higher of their figures.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_tests::analysis::{self, is_finished, phase};
use dispatch_tests::block::RULE_ALLOWS;
use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::audit::{Mark, LOG_FILE};
use dispatch_tests::cluster::process::{status_mib, tail};
use dispatch_tests::cluster::{start_many_with, Cluster, ClusterOptions};
use dispatch_tests::fleet::{self, BenchServer, Hold};
use dispatch_tests::kargo::{Freight, Verification, PROJECT};
use dispatch_tests::objects::RUN_UID_LABEL;
use dispatch_tests::tls::ApiTls;
use dispatch_tests::world::{kube_args, plugin_args};
use dispatch_tests::{free_port, plugin_binary, rollouts_dispatch_binary, summary};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{Api, DynamicObject, PostParams, WatchEvent, WatchParams};
use kube::Resource;

const KEY: &str = "bench-scale-signing-key-0123456789abcdef0123456";
/// The plugin's name in `argo-rollouts-config` (what the runs' metrics name).
const PLUGIN: &str = dispatch_tests::artifacts::PLUGIN_NAME;

/// A size from the environment, else `default`.
fn knob(name: &str, default: u64) -> Result<u64> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a count")),
        Err(_) => Ok(default),
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// When each object was first seen in the state `pick` names: key → (when, state).
type FirstSeen = Arc<Mutex<HashMap<String, (Instant, String)>>>;

/// Watches `api` (restarting where it stopped, or afresh after a 410) and records, for every
/// object `pick` maps to `(key, state)`, the first moment it was seen so.
async fn first_seen<K>(
    api: Api<K>,
    params: WatchParams,
    pick: fn(&K) -> Option<(String, String)>,
    seen: FirstSeen,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let mut version = "0".to_string();
    loop {
        let Ok(stream) = api.watch(&params, &version).await else {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let mut stream = stream.boxed();
        while let Ok(Some(event)) = stream.try_next().await {
            let object = match event {
                WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
                WatchEvent::Deleted(o) => {
                    version = o.meta().resource_version.clone().unwrap_or(version);
                    continue;
                }
                WatchEvent::Bookmark(b) => {
                    version = b.metadata.resource_version;
                    continue;
                }
                // Too old a version: start again from a full list (first sightings are kept).
                WatchEvent::Error(_) => {
                    version = "0".into();
                    break;
                }
            };
            version = object.meta().resource_version.clone().unwrap_or(version);
            if let Some((key, state)) = pick(&object) {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(key)
                    .or_insert((Instant::now(), state));
            }
        }
    }
}

/// A Job that ended: (its run's uid, `Complete` or `Failed`).
fn job_end(job: &Job) -> Option<(String, String)> {
    let uid = job.metadata.labels.as_ref()?.get(RUN_UID_LABEL)?.clone();
    let end = job
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")?;
    Some((uid, end.type_.clone()))
}

/// A decided run: (its name, its phase).
fn run_end(run: &DynamicObject) -> Option<(String, String)> {
    is_finished(run).then(|| (analysis::name(run).to_string(), phase(run)))
}

/// The pid of the first process whose executable lies under `dir` (the plugin, copied by the
/// controller into its working directory) or is `exe` itself.
fn pid_of(matches: impl Fn(&Path) -> bool) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let exe = std::fs::read_link(e.path().join("exe")).ok()?;
        matches(&exe).then_some(pid)
    })
}

/// The control plane and its destination, the server process, the controller.
struct Scene {
    control: Cluster,
    a: Cluster,
    rollouts: ArgoRollouts,
    freight: Freight,
    server: BenchServer,
    server_log: PathBuf,
    dir: PathBuf,
    url: String,
    tls: ApiTls,
}

impl Scene {
    async fn start(agents: usize, controller_args: &[&str]) -> Result<Self> {
        let options = ["control", "a"].map(|name| ClusterOptions {
            audit_writes: true,
            unthrottled: true,
            ..ClusterOptions::new(name)
        });
        let [mut control, a]: [Cluster; 2] = start_many_with(options.to_vec())
            .await?
            .try_into()
            .map_err(|_| anyhow::anyhow!("want 2 clusters"))?;
        let dir = control.dir.join("dispatch");
        std::fs::create_dir_all(&dir)?;
        let key = dir.join("jwt.key");
        std::fs::write(&key, KEY)?;
        let config = format!(
            "controlPlane: {{kubeconfig: {}}}\n\
             destinations:\n- name: cluster-a\n  kubeconfig: {}\n\
             {}\
             policy:\n  rules:\n  - projects: [\"{PROJECT}\"]\n    destinations: [\"cluster-a\", \"agent-*\"]\n    namespaces: [\"*\"]\n    {RULE_ALLOWS}\n",
            control.kubeconfig.display(),
            a.kubeconfig.display(),
            fleet::agents_yaml(agents),
        );
        std::fs::write(dir.join("server.yaml"), config)?;
        let tls = ApiTls::write(&dir)?;
        let (port, admin) = (free_port()?, free_port()?);
        let binary = rollouts_dispatch_binary()?;
        let server_log = dir.join("server.log");
        let log = std::fs::File::create(&server_log)?;
        let server = BenchServer::spawn(
            &binary,
            &dir.join("server.yaml"),
            &key,
            (port, admin),
            &tls.serve_flags(),
            &dir,
            log.into(),
        )?;
        let url = format!("https://127.0.0.1:{port}");
        let key_bytes = dispatch_server::token::read_key(&key)?;
        let (token, _) = dispatch_server::token::issue_token_for(
            &key_bytes,
            "argo-rollouts-controller",
            None,
            Some(&["*".to_string()]),
            Duration::from_secs(6 * 3600),
        )?;
        let plugin_token = dir.join("plugin.token");
        std::fs::write(&plugin_token, token)?;
        let mut args = plugin_args(&url, &plugin_token, &tls.ca);
        args.extend(kube_args(&control)?);
        let plugin = MetricPlugin::file(PLUGIN, &plugin_binary()?)?.with_args(args);
        let rollouts = ArgoRollouts::install_with(&mut control, &[plugin], controller_args).await?;
        let client = control.client().await?;
        argo::apply_namespace(&client, PROJECT).await?;
        let freight = Freight::create(&client).await?;
        Ok(Self {
            control,
            a,
            rollouts,
            freight,
            server,
            server_log,
            dir,
            url,
            tls,
        })
    }

    fn client(&self, token_file: &Path) -> Result<ServerClient> {
        Ok(ServerClient::new(&ClientConfig {
            server: self.url.clone(),
            token_file: Some(token_file.to_path_buf()),
            ca_file: Some(self.tls.ca.clone()),
            ca_only: true,
            insecure_plaintext: false,
            timeout: Duration::from_secs(60),
        })?)
    }

    /// Starts `n` simulated agents holding their Jobs as kwok would.
    fn start_agents(
        &self,
        n: usize,
        seen: &fleet::SeenBy,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>> {
        let key = dispatch_server::token::read_key(&self.dir.join("jwt.key"))?;
        (0..n)
            .map(|i| {
                let destination = fleet::destination(i);
                let (token, _) = dispatch_server::token::issue_token(
                    &key,
                    &format!("agent:{destination}"),
                    Some(&destination),
                    Duration::from_secs(6 * 3600),
                )?;
                let file = self.dir.join(format!("{destination}.token"));
                std::fs::write(&file, token)?;
                let c = self.client(&file)?;
                Ok(tokio::spawn(fleet::agent(
                    c,
                    destination,
                    Hold::AsKwok,
                    seen.clone(),
                )))
            })
            .collect()
    }

    /// `field` (`VmHWM`: the peak, `VmRSS`: now) of the server, the plugin and the controller.
    fn rss(&self, field: &str) -> Result<[f64; 3]> {
        let server = status_mib(self.server.pid(), field)?;
        let work_dir = self.rollouts.work_dir.clone();
        let plugin = pid_of(|exe| exe.starts_with(&work_dir))
            .context("no plugin process under the controller's working directory")?;
        let controller_exe = std::fs::canonicalize(&self.control.binaries.rollouts_controller)?;
        let controller = pid_of(|exe| exe == controller_exe).context("no controller process")?;
        Ok([
            server,
            status_mib(plugin, field)?,
            status_mib(controller, field)?,
        ])
    }

    fn why(&self) -> String {
        format!(
            "server log tail:\n{}\ncontroller log tail:\n{}",
            tail(&self.server_log, 20),
            tail(&self.rollouts.log, 30)
        )
    }
}

/// The sizes of one phase.
#[derive(Clone, Copy)]
struct Sizes {
    measurements: u64,
    agents: usize,
    job_seconds: u64,
    create_per_s: u64,
}

/// What a phase measured.
struct Figures {
    correct: u64,
    p50_ms: f64,
    p99_ms: f64,
    ours_per_s: f64,
    controller_per_s: f64,
}

/// Runs one phase: `sizes.measurements` runs, on `cluster-a` or across the agents.
async fn phase_run(scene: &Scene, sizes: Sizes, on_agents: bool, tag: &str) -> Result<Figures> {
    let label = if on_agents { "agents" } else { "direct" };
    let control = scene.control.client().await?;
    let runs = argo::analysis_runs(&control, PROJECT);
    let seen_runs: FirstSeen = Arc::default();
    let seen_jobs: FirstSeen = Arc::default();
    let fleet_seen: fleet::SeenBy = Arc::default();
    let mut tasks = vec![tokio::spawn(first_seen(
        runs.clone(),
        WatchParams::default().timeout(240),
        run_end,
        seen_runs.clone(),
    ))];
    if on_agents {
        tasks.extend(scene.start_agents(sizes.agents, &fleet_seen)?);
    } else {
        let jobs: Api<Job> = Api::all(scene.a.client().await?);
        tasks.push(tokio::spawn(first_seen(
            jobs,
            WatchParams::default().labels(RUN_UID_LABEL).timeout(240),
            job_end,
            seen_jobs.clone(),
        )));
    }
    let marks = [&scene.control, &scene.a].map(|c| Mark::now(&c.dir.join(LOG_FILE)));
    let started = Instant::now();
    // The runs, created at `create_per_s` as Kargo would create them on promotions, 32 in
    // flight at most.
    let planned: Arc<Mutex<HashMap<String, (String, bool)>>> = Arc::default(); // name → (uid, fails)
    let mut tick = tokio::time::interval(Duration::from_secs_f64(
        1.0 / sizes.create_per_s.max(1) as f64,
    ));
    let mut creating = tokio::task::JoinSet::new();
    for i in 0..sizes.measurements {
        tick.tick().await;
        while creating.len() >= 32 {
            if let Some(r) = creating.join_next().await {
                r??;
            }
        }
        let destination = if on_agents {
            fleet::destination(i as usize % sizes.agents)
        } else {
            "cluster-a".to_string()
        };
        let fails = i % 10 == 7;
        // 3 to 5 minutes at full size (two thirds more than the shortest), spread so that
        // Jobs do not all end in one second.
        let seconds = sizes.job_seconds + (i * 7919) % (sizes.job_seconds * 2 / 3 + 1);
        let object = Verification::new(
            &format!("s{tag}{i}"),
            &format!("01jscale{tag}{i:017}"),
            &destination,
        )
        .runs_for(&format!("{seconds}s"))
        .exits(i32::from(fails))
        .analysis_run(&scene.freight)?;
        let (runs, planned) = (runs.clone(), planned.clone());
        creating.spawn(async move {
            let created = loop {
                match runs.create(&PostParams::default(), &object).await {
                    Ok(o) => break o,
                    // The API server pushing back: as Kargo's client would, again.
                    Err(kube::Error::Api(s)) if s.code == 429 || s.code >= 500 => {
                        tokio::time::sleep(Duration::from_millis(500)).await
                    }
                    Err(e) => return Err(anyhow::Error::from(e)),
                }
            };
            let name = analysis::name(&created).to_string();
            let uid = created.metadata.uid.clone().unwrap_or_default();
            planned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name, (uid, fails));
            anyhow::Ok(())
        });
    }
    while let Some(r) = creating.join_next().await {
        r??;
    }
    let created_s = started.elapsed().as_secs_f64();
    let n = sizes.measurements as usize;
    println!(
        "scale {label}: {n} runs created in {created_s:.0}s ({:.0}/s)",
        n as f64 / created_s
    );
    let timeout = Duration::from_secs(sizes.job_seconds * 5 / 3 + 900);
    let mut peak_in_flight = 0;
    let mut last_print = Instant::now();
    // The watch lists the earlier phase's runs too: count only this phase's.
    let names: Vec<String> = planned
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keys()
        .cloned()
        .collect();
    loop {
        let decided = {
            let seen = seen_runs.lock().unwrap_or_else(|e| e.into_inner());
            names.iter().filter(|n| seen.contains_key(*n)).count()
        };
        peak_in_flight = peak_in_flight.max(n.saturating_sub(decided));
        if decided >= n {
            break;
        }
        if started.elapsed() > timeout {
            bail!(
                "scale {label}: only {decided} of {n} runs decided in {timeout:?}\n{}",
                scene.why()
            );
        }
        if last_print.elapsed() > Duration::from_secs(30) {
            last_print = Instant::now();
            println!(
                "scale {label}: {decided}/{n} decided after {:.0}s",
                started.elapsed().as_secs_f64()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut writes: BTreeMap<String, u64> = BTreeMap::new();
    for (cluster, mark) in ["control", "a"].iter().zip(marks) {
        let (counts, _) = mark.writes_since()?;
        for (client, count) in counts {
            *writes.entry(format!("{cluster}:{client}")).or_default() += count;
        }
    }
    for t in tasks {
        t.abort();
    }
    let table: Vec<String> = writes
        .iter()
        .map(|(k, v)| format!("{k}={:.1}/s", *v as f64 / seconds))
        .collect();
    println!(
        "scale {label}: writes by client over {seconds:.0}s: {}",
        table.join(" ")
    );
    let sum = |pred: &dyn Fn(&str) -> bool| -> f64 {
        writes
            .iter()
            .filter(|(k, _)| pred(k.split_once(':').map_or("", |(_, c)| c)))
            .map(|(_, v)| *v as f64)
            .sum::<f64>()
            / seconds
    };
    let ours_per_s = sum(&|c| c.starts_with("rollouts-dispatch"));
    let controller_per_s = sum(&|c| c.contains("rollouts-controller") || c == "argo-rollouts");

    let planned = planned.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let decided = seen_runs.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let ends: HashMap<String, Instant> = if on_agents {
        let seen = fleet_seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.ended
            .iter()
            .map(|(uid, (at, _))| (uid.clone(), *at))
            .collect()
    } else {
        let jobs = seen_jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.iter()
            .map(|(uid, (at, _))| (uid.clone(), *at))
            .collect()
    };
    let (mut correct, mut wrong) = (0u64, Vec::new());
    let mut latencies = Vec::new();
    for (name, (uid, fails)) in &planned {
        let Some((at, phase)) = decided.get(name) else {
            wrong.push(format!("{name}: never decided"));
            continue;
        };
        let want = if *fails { "Failed" } else { "Successful" };
        if phase == want {
            correct += 1;
        } else {
            wrong.push(format!("{name}: {phase}, want {want}"));
        }
        if let Some(end) = ends.get(uid) {
            latencies.push(at.saturating_duration_since(*end).as_secs_f64() * 1000.0);
        }
    }
    latencies.sort_by(f64::total_cmp);
    let figures = Figures {
        correct,
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        ours_per_s,
        controller_per_s,
    };
    let [server_now, plugin_now, controller_now] = scene.rss("VmRSS")?;
    println!(
        "scale {label}: RSS MiB at the end server={server_now:.0} plugin={plugin_now:.0} \
         controller={controller_now:.0}"
    );
    println!(
        "scale {label}: measurements={n} correct={correct} peak_in_flight={peak_in_flight} \
         verdict_ms p50={:.0} p99={:.0} (of {} with a seen end) writes_per_s ours={ours_per_s:.1} \
         controller={controller_per_s:.1}",
        figures.p50_ms,
        figures.p99_ms,
        latencies.len()
    );
    ensure!(
        wrong.is_empty(),
        "scale {label}: {} wrong verdicts, e.g. {:?}\n{}",
        wrong.len(),
        &wrong[..wrong.len().min(5)],
        scene.why()
    );
    ensure!(
        latencies.len() == n,
        "scale {label}: only {} of {n} Job ends were seen",
        latencies.len()
    );
    Ok(figures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Go-built clusters and controller, the release plugin and server: run `make bench-scale`"]
async fn ten_thousand_measurements_on_one_control_plane() -> Result<()> {
    let sizes = Sizes {
        measurements: knob("BENCH_SCALE_MEASUREMENTS", 10_000)?,
        agents: knob("BENCH_SCALE_AGENTS", 1000)? as usize,
        job_seconds: knob("BENCH_SCALE_JOB_SECONDS", 180)?,
        create_per_s: knob("BENCH_SCALE_CREATE_PER_S", 100)?,
    };
    ensure!(
        sizes.measurements > 0 && sizes.agents > 0,
        "BENCH_SCALE_MEASUREMENTS and BENCH_SCALE_AGENTS must be positive"
    );
    let controller_args = std::env::var("BENCH_SCALE_CONTROLLER_ARGS")
        .unwrap_or_else(|_| "--qps=400 --burst=800".into());
    let mut args: Vec<&str> = vec!["--loglevel=info"];
    args.extend(controller_args.split_whitespace());
    println!("scale: controller flags {args:?}");
    let scene = Scene::start(sizes.agents, &args).await?;
    let direct = phase_run(&scene, sizes, false, "d").await?;
    let agents = phase_run(&scene, sizes, true, "g").await?;
    let [server_rss, plugin_rss, controller_rss] = scene.rss("VmHWM")?;
    println!(
        "scale: peak RSS MiB server={server_rss:.0} plugin={plugin_rss:.0} controller={controller_rss:.0}; \
         writes per second ours/controller direct={:.2} agents={:.2}",
        direct.ours_per_s / direct.controller_per_s,
        agents.ours_per_s / agents.controller_per_s
    );
    println!(
        "scale: verdict p50 ms direct={:.0} agents={:.0}",
        direct.p50_ms, agents.p50_ms
    );
    let line = format!(
        "scale: measurements={} correct={} verdict_p99_ms={:.0} api_writes_per_s={:.1} server_rss_mib={server_rss:.0} plugin_rss_mib={plugin_rss:.0} agents={}",
        sizes.measurements,
        direct.correct.min(agents.correct),
        direct.p99_ms.max(agents.p99_ms),
        direct.ours_per_s.max(agents.ours_per_s),
        sizes.agents
    );
    summary::report(&line)
}
