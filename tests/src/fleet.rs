//! Simulated agents: the agent wire protocol without a cluster, for benches that need a
//! thousand of them on a 2-core machine (`make bench-agents`, `make bench-scale`). An agent
//! long-polls for its work and reports on every Job it is given, so the server does all the
//! work it does for real agents (records, fingerprints, hints, verdicts); only the Kubernetes
//! API behind the agent is missing, and `make e2e-agent` covers that with the real agent.
//!
//! What it reports: at once `succeeded` ([`Hold::No`]), or, as kwok would run the Job's pod,
//! `running` until the pod template's [`DURATION_ANNOTATION`] has passed and then `succeeded`
//! or `failed` by its [`EXIT_CODE_ANNOTATION`] ([`Hold::AsKwok`]). A Job it is told to delete
//! (terminate, garbage collection) is reported deleted at once.
//!
//! [`BenchServer`]: the one `rollouts-dispatch serve` process the benches start by hand (a
//! release build, flags of their own), killed when dropped.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dispatch_api::agent::{
    self as api, Report, ReportReply, ReportRequest, WorkReply, WorkRequest,
};
use dispatch_api::client::{CallError, ServerClient};
use dispatch_api::DestState;

use crate::cluster::kwok::{DURATION_ANNOTATION, EXIT_CODE_ANNOTATION};

/// How long an agent holds a Job before its final report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Report `succeeded` on first sight.
    No,
    /// Run it as kwok runs its pod: the pod template's duration, then its exit code.
    AsKwok,
}

/// What every agent of a fleet saw, by Job name.
#[derive(Debug, Default)]
pub struct Seen {
    /// When its agent first held it in a poll reply.
    pub dispatched: HashMap<String, Instant>,
    /// By run uid: when its Job's agent sent the final report (and whether it was
    /// `succeeded`); one Job per run, as the benches make them.
    pub ended: HashMap<String, (Instant, bool)>,
    /// Polls refused for lack of a slot (a 503 of a budget used up).
    pub refused_polls: usize,
}

/// Shared by a fleet's agents.
pub type SeenBy = Arc<Mutex<Seen>>;

/// A 503 of a budget used up (`runtime::limits`: with `Retry-After`).
pub fn refused(e: &CallError) -> bool {
    matches!(e, CallError::Busy { .. }) || matches!(e, CallError::Transient(m) if m.contains("503"))
}

/// The name of simulated agent destination `i`.
pub fn destination(i: usize) -> String {
    format!("agent-{i:04}")
}

/// The server config's `agents:` section for `n` agents on the memory store.
pub fn agents_yaml(n: usize) -> String {
    let mut yaml = String::from("agents:\n  store: memory\n  destinations:\n");
    for i in 0..n {
        yaml.push_str(&format!("  - name: {}\n", destination(i)));
    }
    yaml
}

/// A Job the agent holds: when it ends, and how.
struct Held {
    run_uid: String,
    ends: Instant,
    succeeds: bool,
}

fn go_duration(text: &str) -> Option<Duration> {
    let (number, unit) = text.split_at(text.find(|c: char| c.is_ascii_alphabetic())?);
    let n: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}

fn hold_of(run_uid: &str, job: Option<&serde_json::Value>, hold: Hold, now: Instant) -> Held {
    let annotations = job.map(|j| &j["spec"]["template"]["metadata"]["annotations"]);
    let read = |key: &str| annotations.and_then(|a| a[key].as_str());
    match hold {
        Hold::No => Held {
            run_uid: run_uid.into(),
            ends: now,
            succeeds: true,
        },
        Hold::AsKwok => Held {
            run_uid: run_uid.into(),
            ends: now
                + read(DURATION_ANNOTATION)
                    .and_then(go_duration)
                    .unwrap_or(Duration::from_secs(1)),
            succeeds: read(EXIT_CODE_ANNOTATION).is_none_or(|c| c == "0"),
        },
    }
}

/// Runs agent `destination` with `client` (its token) until aborted.
pub async fn agent(client: ServerClient, destination: String, hold: Hold, seen: SeenBy) {
    let work = api::path(api::WORK, &destination);
    let report = api::path(api::REPORT, &destination);
    let mut fingerprint = String::new();
    let mut held: HashMap<String, Held> = HashMap::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut deleted: HashSet<String> = HashSet::new();
    loop {
        // Long-poll, but come back in time for the next Job that ends.
        let now = Instant::now();
        let next_end = held.values().map(|h| h.ends).min();
        let wait = next_end.map_or(25, |e| e.saturating_duration_since(now).as_secs().min(25));
        let req = WorkRequest {
            fingerprint: fingerprint.clone(),
            wait_seconds: wait as u32,
        };
        let reply: Option<WorkReply> = match client.post(&work, &req).await {
            Ok(r) => Some(r),
            Err(e) => {
                if refused(&e) {
                    seen.lock().unwrap_or_else(|e| e.into_inner()).refused_polls += 1;
                }
                eprintln!("fleet: {destination}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                None
            }
        };
        let now = Instant::now();
        let mut reports = Vec::new();
        if let Some(reply) = reply {
            fingerprint = reply.fingerprint;
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for item in reply.jobs {
                if item.spec.delete {
                    // Terminated or collected: gone at once (there is no Job to wait for).
                    if deleted.insert(item.name.clone()) {
                        held.remove(&item.name);
                        reports.push(Report::new(item.name, None));
                    }
                    continue;
                }
                if done.contains(&item.name) || held.contains_key(&item.name) {
                    continue;
                }
                seen.dispatched
                    .entry(item.spec.job_name.clone())
                    .or_insert(now);
                let h = hold_of(&item.spec.run_uid, item.spec.job.as_ref(), hold, now);
                if h.ends > now {
                    reports.push(Report::new(
                        item.name.clone(),
                        Some(DestState::Running(None)),
                    ));
                }
                held.insert(item.name, h);
            }
        }
        // Every held Job whose time has come: its final report.
        let ended: Vec<String> = held
            .iter()
            .filter(|(_, h)| h.ends <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for name in ended {
            let Some(h) = held.remove(&name) else {
                continue;
            };
            let state = if h.succeeds {
                DestState::Succeeded
            } else {
                DestState::Failed {
                    reason: "BackoffLimitExceeded".into(),
                    detail: "the check exited 1".into(),
                    log: None,
                }
            };
            reports.push(Report::new(name.clone(), Some(state)));
            done.insert(name);
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .ended
                .insert(h.run_uid, (now, h.succeeds));
        }
        if !reports.is_empty() {
            let r: Result<ReportReply, _> = client.post(&report, &ReportRequest { reports }).await;
            if let Err(e) = r {
                eprintln!("fleet: {destination}: report: {e}");
            }
        }
    }
}

/// A `rollouts-dispatch serve` process a bench starts: `binary` with the config at `config`,
/// HS256 key file `key`, listening on loopback `port` (API) and `admin`, `extra` flags, its
/// standard error to `stderr`; killed and reaped when dropped.
pub struct BenchServer(std::process::Child);

impl BenchServer {
    /// Spawns it (`HOME` is `home`, `KUBECONFIG` unset, log level `warn`).
    pub fn spawn(
        binary: &std::path::Path,
        config: &std::path::Path,
        key: &std::path::Path,
        (port, admin): (u16, u16),
        extra: &[String],
        home: &std::path::Path,
        stderr: std::process::Stdio,
    ) -> anyhow::Result<Self> {
        use anyhow::Context;
        let child = std::process::Command::new(binary)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .arg("--jwt-key-file")
            .arg(key)
            .args(extra)
            .env_remove("KUBECONFIG")
            .env("HOME", home)
            .env("ROLLOUTS_DISPATCH_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        Ok(Self(child))
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for BenchServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_go_writes_them() {
        assert_eq!(go_duration("185s"), Some(Duration::from_secs(185)));
        assert_eq!(go_duration("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(go_duration("3m"), Some(Duration::from_secs(180)));
        assert_eq!(go_duration("soon"), None);
    }

    #[test]
    fn a_job_is_held_for_its_duration_and_ends_by_its_exit_code() {
        let now = Instant::now();
        let job = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
            DURATION_ANNOTATION: "2s", EXIT_CODE_ANNOTATION: "1"}}}}});
        let h = hold_of("j", Some(&job), Hold::AsKwok, now);
        assert_eq!(h.ends, now + Duration::from_secs(2));
        assert!(!h.succeeds);
        let at_once = hold_of("j", Some(&job), Hold::No, now);
        assert!(at_once.ends == now && at_once.succeeds);
    }
}
