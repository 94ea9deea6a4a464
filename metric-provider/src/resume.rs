//! Event-driven resumes (#30): the verdict follows a Job's end by a watch, not by a poll.
//!
//! The controller skips `Resume` while a measurement's `resumeAt` is in the future, whatever
//! wakes it (argo-rollouts `analysis/analysis.go:187-190` at 9f8d111d8, line 189 in v1.9.3),
//! and an update of the AnalysisRun enqueues it at once (`analysis/controller.go:136-140`,
//! 132-134 in v1.9.3). So the plugin follows the server's
//! resume hints (`GET /v1/measurements/hints`, emitted from the server's watch caches when a Job
//! ends) and, for a measurement it has in flight, moves that measurement's `resumeAt` to now in
//! the AnalysisRun with the controller's own credentials: the plugin runs in the controller's
//! pod, whose ServiceAccount already gets and patches AnalysisRuns (argo-rollouts
//! `manifests/role/argo-rollouts-clusterrole.yaml:22-36`); the server needs no new permission.
//!
//! The patch is a JSON patch guarded by `test`s of what it read a moment before — the run's
//! uid, the metric's name at that index, the measurement's Job name and its `resumeAt` — so a
//! controller write in between, a run deleted or recreated, a measurement already finished or
//! superseded makes it fail (`422`/`404`) and nothing changes: the controller's state wins, and
//! the measurement resumes at its own `resumeAt` as without hints. Only measurements this
//! process returned as `Running` are ever patched; a hint about anything else is dropped.
//!
//! With hints flowing, a running measurement's `resumeAt` grows like `2·√(2·elapsed)` up to the
//! safety interval (`--resume-safety-interval`, 60 s): what no hint announces (a container that
//! cannot start, or a pod that cannot be scheduled, past its grace) and anything a hint missed
//! are still seen within it. Without them
//! (no Kubernetes access, a server without the route, the feed down) the plugin falls back on
//! `--max-resume-interval`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::client::{CallError, ServerClient};
use dispatch_api::v1::{self as api, HintPage, ResumeHint};
use dispatch_plugin::gob::GoTime;
use serde_json::{json, Value};
use tracing::{debug, info, warn, Instrument};

use crate::rollouts::{phase, AnalysisRun, Measurement};

/// Where the pod's ServiceAccount credentials are mounted (the controller's).
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why the plugin has no client of the controller's Kubernetes API server (then no resume hints).
#[derive(Debug, thiserror::Error)]
pub enum KubeAccessError {
    /// Neither in a pod nor told where the API server is.
    #[error("not in a pod (no KUBERNETES_SERVICE_HOST) and no --kube-api-server")]
    NoServer,
    /// The token file is missing.
    #[error("no token for the Kubernetes API ({} does not exist; set --kube-token-file)", .0.display())]
    NoToken(std::path::PathBuf),
    /// The client could not be built from the flags.
    #[error("--kube-api-server: {0}")]
    Client(#[source] dispatch_api::client::ClientError),
}

/// How the plugin reaches the controller's Kubernetes API server: flags, else in cluster.
#[derive(Debug, Clone, Default)]
pub struct KubeAccess {
    /// `--kube-api-server`
    pub server: Option<String>,
    /// `--kube-token-file`
    pub token_file: Option<std::path::PathBuf>,
    /// `--kube-ca-file`
    pub ca_file: Option<std::path::PathBuf>,
}

impl KubeAccess {
    /// A client of the API server; `Err` says why there is none (not in a pod, no flags).
    pub fn client(&self, timeout: Duration) -> Result<ServerClient, KubeAccessError> {
        let sa = std::path::Path::new(SA_DIR);
        let server = match &self.server {
            Some(s) => s.clone(),
            None => {
                let host = std::env::var("KUBERNETES_SERVICE_HOST")
                    .map_err(|_| KubeAccessError::NoServer)?;
                let port =
                    std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
                if host.contains(':') {
                    format!("https://[{host}]:{port}")
                } else {
                    format!("https://{host}:{port}")
                }
            }
        };
        let token_file = self.token_file.clone().unwrap_or_else(|| sa.join("token"));
        if !token_file.exists() {
            return Err(KubeAccessError::NoToken(token_file));
        }
        let ca_file = self
            .ca_file
            .clone()
            .or_else(|| Some(sa.join("ca.crt")).filter(|p| p.exists()));
        ServerClient::new(&dispatch_api::client::ClientConfig {
            server,
            token_file: Some(token_file),
            ca_file,
            ca_only: true,
            insecure_plaintext: false,
            timeout,
        })
        .map_err(KubeAccessError::Client)
    }
}

/// How long the plugin waits before asking for hints again after a failure.
const RETRY: Duration = Duration::from_secs(5);

/// How many hints are acted on at once, each a GET and a JSON patch of an AnalysisRun: one
/// after the other, 10 000 measurements in flight had their resumes held to about 5 a second
/// and most verdicts waited for the safety interval instead (`make bench-scale`, #30).
const CONCURRENT_POKES: usize = 16;

/// How long a measurement stays in the table without a `Run`/`Resume` call about it: a run
/// deleted mid-measurement is never resumed again, and a running one is resumed at least every
/// safety interval.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// A measurement this process has in flight: where its AnalysisRun is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inflight {
    namespace: String,
    run: String,
    metric: String,
    /// the last `Run`/`Resume` that returned it `Running`
    seen: std::time::Instant,
}

/// What one poke did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Poke {
    /// `resumeAt` moved to now
    Resumed,
    /// nothing to do: the measurement finished, resumes by itself already, or is another one
    NotNeeded(&'static str),
    /// the controller wrote in between, or the run went: its state wins
    Lost(String),
}

/// The hints follower and the measurements in flight.
pub struct Resumer {
    server: ServerClient,
    kube: ServerClient,
    safety: Duration,
    /// how long one hints call waits (within the client's request timeout)
    wait: Duration,
    inflight: Mutex<HashMap<(String, String), Inflight>>,
    flowing: AtomicBool,
}

impl std::fmt::Debug for Resumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resumer")
            .field("kube", &self.kube.server())
            .field("safety", &self.safety)
            .field("flowing", &self.flowing.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Resumer {
    /// Follows `server`'s hints (each long poll shorter than `request_timeout`, the clients'
    /// timeout) and patches AnalysisRuns through `kube` (the controller's cluster, with its
    /// credentials); a running measurement resumes at most `safety` later.
    pub fn new(
        server: ServerClient,
        kube: ServerClient,
        safety: Duration,
        request_timeout: Duration,
    ) -> Self {
        let wait = request_timeout
            .saturating_sub(Duration::from_secs(2))
            .clamp(
                Duration::from_secs(1),
                Duration::from_secs(u64::from(api::MAX_HINT_WAIT_SECONDS)),
            );
        Self {
            server,
            kube,
            safety,
            wait,
            inflight: Mutex::default(),
            flowing: AtomicBool::new(false),
        }
    }

    /// Whether hints are flowing: the last call to the hints route answered.
    pub fn is_flowing(&self) -> bool {
        self.flowing.load(Ordering::Relaxed)
    }

    /// The delay before the next `Resume` of a measurement that has run for `elapsed`, while
    /// hints flow: `2·√(2·elapsed)`, at least 2 s and at most the safety interval.
    pub fn delay(&self, elapsed: Duration) -> Duration {
        let safety = self.safety.as_secs_f64().max(2.0);
        Duration::from_secs_f64((2.0 * (2.0 * elapsed.as_secs_f64()).sqrt()).clamp(2.0, safety))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Inflight>> {
        self.inflight.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `m` of `metric` in `run`, whose Jobs are called `job` (none: not dispatched yet),
    /// in the table while it is `Running`; drops it once it is anything else.
    pub fn track(&self, run: &AnalysisRun, metric: &str, job: Option<&String>, m: &Measurement) {
        let Some(job) = job else {
            return;
        };
        let key = (run.object_meta.uid.clone(), job.clone());
        if m.phase == phase::RUNNING && m.finished_at.is_none() {
            self.table().insert(
                key,
                Inflight {
                    namespace: run.object_meta.namespace.clone(),
                    run: run.object_meta.name.clone(),
                    metric: metric.to_string(),
                    seen: std::time::Instant::now(),
                },
            );
        } else {
            self.table().remove(&key);
        }
    }

    /// How many measurements are in flight (tests, logs).
    pub fn in_flight(&self) -> usize {
        self.table().len()
    }

    /// Follows the hints until the process ends.
    pub async fn follow(self: Arc<Self>) {
        let wait = self.wait.as_secs();
        let (mut epoch, mut after): (Option<String>, Option<u64>) = (None, None);
        let mut failing = false;
        let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_POKES));
        loop {
            self.table().retain(|_, e| e.seen.elapsed() < FORGET_AFTER);
            let mut path = format!("{}?waitSeconds={wait}", api::HINTS);
            if let (Some(e), Some(a)) = (&epoch, after) {
                path.push_str(&format!("&epoch={e}&after={a}"));
            }
            match self.server.get::<HintPage>(&path).await {
                Ok(page) => {
                    if failing || epoch.is_none() {
                        info!(epoch = %page.epoch, "following the server's resume hints");
                    }
                    failing = false;
                    self.flowing.store(true, Ordering::Relaxed);
                    epoch = Some(page.epoch);
                    after = Some(page.cursor);
                    self.act_on(page.hints, &permits).await;
                }
                Err(CallError::Rejected(e)) if e.code == "not_found" || e.code == "http_404" => {
                    warn!("the server has no resume hints (an older server): measurements resume by --max-resume-interval");
                    self.flowing.store(false, Ordering::Relaxed);
                    return;
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, "cannot read the server's resume hints; measurements resume by --max-resume-interval until they flow again");
                    }
                    failing = true;
                    self.flowing.store(false, Ordering::Relaxed);
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    /// Acts on each hint in a task of its own, [`CONCURRENT_POKES`] at most at once: waits for
    /// a slot, not for the pokes, so the next page is asked for while the last ones patch.
    async fn act_on(
        self: &Arc<Self>,
        hints: Vec<ResumeHint>,
        permits: &Arc<tokio::sync::Semaphore>,
    ) {
        for hint in hints {
            let Ok(permit) = permits.clone().acquire_owned().await else {
                return;
            };
            let this = self.clone();
            let span =
                tracing::debug_span!("resume_hint", job = %hint.job, run_uid = %hint.run_uid);
            tokio::spawn(
                async move {
                    this.on_hint(&hint).await;
                    drop(permit);
                }
                .instrument(span),
            );
        }
    }

    async fn on_hint(&self, hint: &ResumeHint) {
        let key = (hint.run_uid.clone(), hint.job.clone());
        let Some(entry) = self.table().get(&key).cloned() else {
            debug!(job = %hint.job, "hint about a measurement not in flight here: dropped");
            return;
        };
        match self.poke(hint, &entry).await {
            Ok(Poke::Resumed) => {
                info!(run = %format!("{}/{}", entry.namespace, entry.run), metric = %entry.metric,
                      job = %hint.job, "a Job finished: the measurement resumes now")
            }
            Ok(other) => debug!(job = %hint.job, outcome = ?other, "hint not acted on"),
            Err(e) => {
                warn!(run = %format!("{}/{}", entry.namespace, entry.run), job = %hint.job, error = %e,
                      "cannot move the measurement's resumeAt; it resumes at its own")
            }
        }
    }

    /// Moves the `resumeAt` of the measurement of `hint` to now, if it is still the one in
    /// flight and waiting (see the module docs).
    async fn poke(&self, hint: &ResumeHint, entry: &Inflight) -> Result<Poke, CallError> {
        let path = format!(
            "/apis/argoproj.io/v1alpha1/namespaces/{}/analysisruns/{}",
            entry.namespace, entry.run
        );
        let run: Value = self.kube.get(&path).await?;
        let now = GoTime::now();
        let patch = match resume_patch(&run, hint, &entry.metric, now) {
            Ok(patch) => patch,
            Err(why) => return Ok(Poke::NotNeeded(why)),
        };
        let body = serde_json::to_vec(&patch).unwrap_or_default();
        match self
            .kube
            .patch::<Value>(&path, "application/json-patch+json", body)
            .await
        {
            Ok(_) => Ok(Poke::Resumed),
            Err(CallError::Rejected(e)) => Ok(Poke::Lost(format!("{}: {}", e.code, e.message))),
            Err(e) => Err(e),
        }
    }
}

/// The JSON patch that moves the `resumeAt` of `hint`'s measurement of `metric` in `run` (the
/// AnalysisRun as the API server gave it) to `now`, guarded by tests of everything it relies on;
/// `Err` says why there is nothing to patch.
pub fn resume_patch(
    run: &Value,
    hint: &ResumeHint,
    metric: &str,
    now: GoTime,
) -> Result<Value, &'static str> {
    if run.pointer("/metadata/uid").and_then(Value::as_str) != Some(hint.run_uid.as_str()) {
        return Err("another run under that name");
    }
    let results = run
        .pointer("/status/metricResults")
        .and_then(Value::as_array)
        .ok_or("no metric results yet")?;
    let i = results
        .iter()
        .position(|r| r["name"] == metric)
        .ok_or("no result of the metric yet")?;
    let measurements = results[i]["measurements"]
        .as_array()
        .filter(|m| !m.is_empty())
        .ok_or("no measurement yet")?;
    let j = measurements.len() - 1;
    let last = &measurements[j];
    if !last["finishedAt"].is_null() {
        return Err("the measurement has finished");
    }
    if last.pointer("/metadata/job-name").and_then(Value::as_str) != Some(hint.job.as_str()) {
        return Err("the last measurement is another one");
    }
    let resume_at = last["resumeAt"].as_str().ok_or("no resumeAt")?;
    if GoTime::parse_rfc3339(resume_at).is_none_or(|t| t <= now) {
        return Err("it resumes now anyway");
    }
    let at = format!("/status/metricResults/{i}/measurements/{j}");
    let now = GoTime::from_unix(now.unix_seconds, 0).to_rfc3339();
    Ok(json!([
        {"op": "test", "path": "/metadata/uid", "value": hint.run_uid},
        {"op": "test", "path": format!("/status/metricResults/{i}/name"), "value": metric},
        {"op": "test", "path": format!("{at}/metadata/job-name"), "value": hint.job},
        {"op": "test", "path": format!("{at}/resumeAt"), "value": resume_at},
        {"op": "replace", "path": format!("{at}/resumeAt"), "value": now},
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint() -> ResumeHint {
        ResumeHint {
            namespace: "team-a".into(),
            run_uid: "uid-1".into(),
            job: "uid-1.smoke.2".into(),
        }
    }

    fn run(last: Value) -> Value {
        json!({
            "metadata": {"uid": "uid-1"},
            "status": {"metricResults": [
                {"name": "other", "measurements": []},
                {"name": "smoke", "measurements": [
                    {"phase": "Successful", "finishedAt": "2026-12-04T10:00:00Z",
                     "metadata": {"job-name": "uid-1.smoke.1"}},
                    last
                ]}
            ]}
        })
    }

    const NOW: i64 = 1_780_000_000;

    fn later() -> String {
        GoTime::from_unix(NOW + 40, 0).to_rfc3339()
    }

    #[test]
    fn the_patch_moves_the_last_measurements_resume_at_guarded_by_what_it_read() {
        let r = run(json!({"phase": "Running", "resumeAt": later(),
                           "metadata": {"job-name": "uid-1.smoke.2"}}));
        let p = resume_patch(&r, &hint(), "smoke", GoTime::from_unix(NOW, 5)).unwrap();
        let ops = p.as_array().unwrap();
        assert_eq!(ops.len(), 5);
        assert_eq!(ops[1]["path"], "/status/metricResults/1/name");
        assert_eq!(
            ops[2]["path"],
            "/status/metricResults/1/measurements/1/metadata/job-name"
        );
        assert_eq!(ops[3]["value"], later());
        assert_eq!(ops[4]["op"], "replace");
        assert_eq!(ops[4]["value"], GoTime::from_unix(NOW, 0).to_rfc3339());
    }

    #[test]
    fn nothing_is_patched_for_another_run_a_finished_or_other_measurement_or_a_due_one() {
        let now = GoTime::from_unix(NOW, 0);
        let running = |job: &str, resume_at: String| json!({"phase": "Running", "resumeAt": resume_at, "metadata": {"job-name": job}});
        let mut other_uid = run(running("uid-1.smoke.2", later()));
        other_uid["metadata"]["uid"] = json!("uid-2");
        let finished = run(json!({"phase": "Successful", "finishedAt": later(),
                                  "metadata": {"job-name": "uid-1.smoke.2"}}));
        let newer = run(running("uid-1.smoke.3", later()));
        let due = run(running(
            "uid-1.smoke.2",
            GoTime::from_unix(NOW - 1, 0).to_rfc3339(),
        ));
        for (r, why) in [
            (other_uid, "another run under that name"),
            (finished, "the measurement has finished"),
            (newer, "the last measurement is another one"),
            (due, "it resumes now anyway"),
        ] {
            assert_eq!(resume_patch(&r, &hint(), "smoke", now), Err(why));
        }
        assert_eq!(
            resume_patch(
                &run(running("uid-1.smoke.2", later())),
                &hint(),
                "nope",
                now
            ),
            Err("no result of the metric yet")
        );
    }

    #[test]
    fn with_hints_a_measurement_resumes_ever_later_up_to_the_safety_interval() {
        let client = ServerClient::new(&dispatch_api::client::ClientConfig {
            server: "http://127.0.0.1:1".into(),
            token_file: None,
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(1),
        })
        .unwrap();
        let r = Resumer::new(
            client.clone(),
            client,
            Duration::from_secs(60),
            Duration::from_secs(10),
        );
        assert_eq!(
            r.wait,
            Duration::from_secs(8),
            "a long poll within the timeout"
        );
        assert_eq!(r.delay(Duration::ZERO), Duration::from_secs(2));
        assert_eq!(r.delay(Duration::from_secs(50)), Duration::from_secs(20));
        assert_eq!(r.delay(Duration::from_secs(3600)), Duration::from_secs(60));
    }
}

/// The follower against a stand-in Kubernetes API on loopback: what it asks and how.
#[cfg(test)]
mod follow_tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn client(url: &str) -> ServerClient {
        ServerClient::new(&dispatch_api::client::ClientConfig {
            server: url.into(),
            token_file: None,
            ca_file: None,
            ca_only: true,
            insecure_plaintext: false,
            timeout: Duration::from_secs(60),
        })
        .expect("a loopback client")
    }

    /// Answers each GET of a run only once `together` of them are open at the same time (a
    /// barrier), with a run that has no results yet (nothing to patch).
    async fn api_answering_in_groups_of(together: usize) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let barrier = Arc::new(tokio::sync::Barrier::new(together));
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut byte = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") {
                        if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                            return;
                        }
                        head.push(byte[0]);
                    }
                    let head = String::from_utf8_lossy(&head);
                    let run = head.split_whitespace().nth(1).unwrap_or_default();
                    let uid = run
                        .rsplit('/')
                        .next()
                        .unwrap_or_default()
                        .replace("run", "uid");
                    barrier.wait().await;
                    let body = json!({"metadata": {"uid": uid}, "status": {}}).to_string();
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes()).await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn hints_are_acted_on_side_by_side_not_one_after_the_other() {
        const HINTS: usize = 8;
        let url = api_answering_in_groups_of(HINTS).await;
        let resumer = Arc::new(Resumer::new(
            client(&url),
            client(&url),
            Duration::from_secs(60),
            Duration::from_secs(60),
        ));
        let hints: Vec<ResumeHint> = (0..HINTS)
            .map(|k| {
                let hint = ResumeHint {
                    namespace: "team-a".into(),
                    run_uid: format!("uid{k}"),
                    job: format!("uid{k}.smoke.1"),
                };
                resumer.table().insert(
                    (hint.run_uid.clone(), hint.job.clone()),
                    Inflight {
                        namespace: "team-a".into(),
                        run: format!("run{k}"),
                        metric: "smoke".into(),
                        seen: std::time::Instant::now(),
                    },
                );
                hint
            })
            .collect();
        let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENT_POKES));
        // Every slot comes back only when every GET was answered, which the stand-in does only
        // once all of them are open at once (one after the other, the first would wait for the
        // client's timeout, longer than this one).
        let all = tokio::time::timeout(Duration::from_secs(20), async {
            resumer.act_on(hints, &permits).await;
            permits.acquire_many(CONCURRENT_POKES as u32).await
        })
        .await;
        assert!(
            all.is_ok(),
            "the {HINTS} hints' reads were not open at the same time"
        );
    }
}
