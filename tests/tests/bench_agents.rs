//! `make bench-agents`: one server replica (the release binary, a real process, default `serve`
//! flags) with 1 000 simulated agents long-polling it, and 2 000 Jobs dispatched across them
//! through the plugin API. An agent here is the wire protocol without a cluster: it polls, and
//! answers every new Job with a `succeeded` report, so the server does all the work it does for
//! real agents.
//!
//! Measured: dispatch latency (from the `ensure` call to the agent holding the Job in a poll
//! reply), and the server's peak RSS (`VmHWM`). Every measurement must then read Successful
//! through `status`, so a fast but wrong server fails; and no plugin call may be refused for lack
//! of a slot while the agents poll (their polls have a budget of their own,
//! `runtime::limits`): a refused call is retried, counted, and fails the bench. Sizes from the
//! environment: `BENCH_AGENTS` (1000), `BENCH_JOBS` (2000); `make test` runs it small. Last line
//! (also written to `$SUMMARY_FILE`): `agents=1000 dispatch_p99_ms=X server_rss_mib=Y`, after a
//! line `bench-agents: refused_plugin_calls=0 refused_polls=N`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_api::v1::{Ensured, MeasurementRef, RunRef, Verdict};
use dispatch_tests::cluster::process::status_mib;
use dispatch_tests::fleet::{self, destination, refused, BenchServer, Hold};
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::{free_port, summary};

const CONCURRENCY: usize = 64;
const KEY: &str = "bench-agents-signing-key-0123456789abcdef012345";

fn client(url: &str, token_file: &Path, timeout: Duration) -> Result<ServerClient> {
    Ok(ServerClient::new(&ClientConfig {
        server: url.to_string(),
        token_file: Some(token_file.to_path_buf()),
        ca_file: None,
        ca_only: false,
        insecure_plaintext: false,
        timeout,
    })?)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A size from the environment, else `default`.
fn knob(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .with_context(|| format!("{name}={v:?} is not a count")),
        Err(_) => Ok(default),
    }
}

/// A plugin call, retried while the server refuses it for lack of a slot; each refusal counted.
async fn plugin_call(
    plugin: &ServerClient,
    path: &str,
    m: &MeasurementRef,
    refusals: &AtomicUsize,
) -> Result<serde_json::Value> {
    loop {
        match plugin.post(path, m).await {
            Ok(v) => return Ok(v),
            Err(e) if refused(&e) => {
                refusals.fetch_add(1, Ordering::Relaxed);
                eprintln!("bench-agents: {path} {}: refused: {e}", m.run.name);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => anyhow::bail!("{path} {}: {e}", m.run.name),
        }
    }
}

fn measurement(i: usize, agents: usize) -> MeasurementRef {
    MeasurementRef {
        run: RunRef {
            name: format!("bench-{i}"),
            namespace: "bench".into(),
            uid: format!("bench-run-{i:05}"),
            ..RunRef::default()
        },
        metric: "smoke".into(),
        index: 1,
        block: serde_json::json!({
            "destination": destination(i % agents),
            "spec": {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
                "containers": [{"name": "check", "image": "example.invalid/check:1"}]}}}
        }),
        metadata: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "starts the release server with 1 000 simulated agents: run `make bench-agents`"]
async fn a_thousand_agents_two_thousand_jobs() -> Result<()> {
    let (agents_n, jobs) = (knob("BENCH_AGENTS", 1000)?, knob("BENCH_JOBS", 2000)?);
    ensure!(
        agents_n > 0 && jobs > 0,
        "BENCH_AGENTS and BENCH_JOBS must be positive"
    );
    let binary = dispatch_tests::rollouts_dispatch_binary()?;
    let dir: PathBuf = std::env::temp_dir().join(format!("bench-agents-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let key = dir.join("jwt.key");
    std::fs::write(&key, KEY)?;
    let config = format!(
        "policy: {{rules: [{{projects: ['*'], destinations: ['agent-*'], namespaces: ['*']}}]}}\n{}",
        fleet::agents_yaml(agents_n)
    );
    std::fs::write(dir.join("server.yaml"), &config)?;
    let (port, admin) = (free_port()?, free_port()?);
    let server = BenchServer::spawn(
        &binary,
        &dir.join("server.yaml"),
        &key,
        (port, admin),
        &[],
        &dir,
        Stdio::inherit(),
    )?;
    let pid = server.pid();
    let url = format!("http://127.0.0.1:{port}");
    let key_bytes = dispatch_server::token::read_key(&key)?;
    let every = ["*".to_string()];
    let (plugin_token, _) = dispatch_server::token::issue_token_for(
        &key_bytes,
        "plugin",
        None,
        Some(&every),
        Duration::from_secs(3600),
    )?;
    std::fs::write(dir.join("plugin.token"), plugin_token)?;
    let plugin = client(&url, &dir.join("plugin.token"), Duration::from_secs(30))?;
    eventually("the server answering", Duration::from_secs(30), || async {
        Ok(plugin
            .get::<serde_json::Value>("/v1/destinations")
            .await
            .is_ok())
    })
    .await?;

    let seen: fleet::SeenBy = Arc::default();
    let refused_plugin_calls = Arc::new(AtomicUsize::new(0));
    let mut agents = Vec::new();
    for i in 0..agents_n {
        let destination = destination(i);
        let (token, _) = dispatch_server::token::issue_token(
            &key_bytes,
            &format!("agent:{destination}"),
            Some(&destination),
            Duration::from_secs(3600),
        )?;
        let file = dir.join(format!("{destination}.token"));
        std::fs::write(&file, token)?;
        let c = client(&url, &file, Duration::from_secs(60))?;
        agents.push(tokio::spawn(fleet::agent(
            c,
            destination,
            Hold::No,
            seen.clone(),
        )));
    }
    // Let every agent open its first long poll.
    tokio::time::sleep(Duration::from_secs(3 + agents_n as u64 / 250)).await;
    let rss_idle = status_mib(pid, "VmHWM")?;

    let started = Instant::now();
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let next = Arc::new(AtomicUsize::new(0));
    let mut senders = Vec::new();
    for _ in 0..CONCURRENCY {
        let (plugin, sent, next) = (plugin.clone(), sent.clone(), next.clone());
        let refusals = refused_plugin_calls.clone();
        senders.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    return Ok::<(), anyhow::Error>(());
                }
                let at = Instant::now();
                let ensured: Ensured = serde_json::from_value(
                    plugin_call(
                        &plugin,
                        dispatch_api::v1::ENSURE,
                        &measurement(i, agents_n),
                        &refusals,
                    )
                    .await?,
                )?;
                sent.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(ensured.job_name, at);
            }
        }));
    }
    for s in senders {
        s.await??;
    }
    let ensure_secs = started.elapsed().as_secs_f64();
    let reached = || {
        seen.lock()
            .unwrap_or_else(|e| e.into_inner())
            .dispatched
            .len()
    };
    eventually(
        "every Job at its agent",
        Duration::from_secs(60),
        || async {
            Ok(if reached() >= jobs {
                Progress::Done(())
            } else {
                Progress::Waiting(format!("{} of {jobs} Jobs reached their agent", reached()))
            })
        },
    )
    .await?;

    // Every verdict must be the agent's: Successful.
    let mut successful = 0;
    for i in 0..jobs {
        let m = measurement(i, agents_n);
        let v: Verdict = eventually(
            &format!("a verdict for measurement {i}"),
            Duration::from_secs(60),
            || async {
                let v: Verdict = serde_json::from_value(
                    plugin_call(&plugin, dispatch_api::v1::STATUS, &m, &refused_plugin_calls)
                        .await?,
                )?;
                Ok((v.phase != "Running").then_some(v))
            },
        )
        .await?;
        ensure!(v.phase == "Successful", "measurement {i}: {v:?}");
        successful += 1;
    }
    let rss_peak = status_mib(pid, "VmHWM")?;
    for a in &agents {
        a.abort();
    }

    let sent = sent.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let (seen, refused_polls) = {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        (s.dispatched.clone(), s.refused_polls)
    };
    let mut latencies: Vec<f64> = sent
        .iter()
        .filter_map(|(job, at)| {
            seen.get(job)
                .map(|s| s.saturating_duration_since(*at).as_secs_f64() * 1000.0)
        })
        .collect();
    ensure!(latencies.len() == jobs, "{} latencies", latencies.len());
    latencies.sort_by(f64::total_cmp);
    println!(
        "bench-agents: {jobs} ensures in {ensure_secs:.2}s ({:.0}/s, {CONCURRENCY} in flight); {successful}/{jobs} Successful",
        jobs as f64 / ensure_secs
    );
    println!(
        "bench-agents: dispatch latency ms p50={:.1} p90={:.1} p99={:.1} max={:.1}",
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.9),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
    println!(
        "bench-agents: server RSS MiB idle-with-{agents_n}-polls={rss_idle:.1} peak={rss_peak:.1}"
    );
    let refused_plugin_calls = refused_plugin_calls.load(Ordering::Relaxed);
    println!(
        "bench-agents: refused_plugin_calls={refused_plugin_calls} refused_polls={refused_polls}"
    );
    ensure!(
        refused_plugin_calls == 0,
        "{refused_plugin_calls} plugin calls were refused for lack of a slot while {agents_n} agents polled"
    );
    let line = format!(
        "agents={agents_n} dispatch_p99_ms={:.0} server_rss_mib={:.0}",
        percentile(&latencies, 0.99),
        rss_peak
    );
    std::fs::remove_dir_all(&dir).ok();
    summary::report(&line)
}
