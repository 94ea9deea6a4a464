//! The rollouts-dispatch metric provider: validates the plugin block locally (fast, clear errors),
//! then asks the rollouts-dispatch server to run the Jobs and report their verdict.
//!
//! Everything the plugin needs between calls lives in the measurement's metadata, so a relaunched
//! plugin continues where the old one stopped. A server outage does not burn the metric's
//! `consecutiveErrorLimit`: the measurement stays `Running` with a retry `ResumeAt` and a message
//! saying so, until `outage_deadline`, and only then becomes `Error`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dispatch_plugin::gob::GoTime;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tracing::{info, warn};

use crate::resume::Resumer;
use crate::rollouts::{
    phase, AnalysisRun, Measurement, Metric, MetricProvider, RpcError, PROVIDER_TYPE,
};
use dispatch_api::block::ConfigError;
use dispatch_api::client::{CallError, ServerClient};
use dispatch_api::v1::{self as api, Ensured, GcRequest, MeasurementRef, RunRef, Verdict};
use dispatch_api::{JobConfig, Redactor, PLUGIN_NAME};

/// The message of every measurement while no server is configured.
pub const NO_SERVER: &str = "no server configured (set --server / ROLLOUTS_DISPATCH_SERVER)";

/// Metadata keys the plugin keeps in its measurements.
pub mod keys {
    /// the Job name on every destination
    pub const JOB_NAME: &str = "job-name";
    /// the Jobs' namespace
    pub const JOB_NAMESPACE: &str = "job-namespace";
    /// comma-separated destinations
    pub const DESTINATIONS: &str = "destinations";
    /// set while the Jobs could not be created yet because the server was unreachable
    pub const PENDING: &str = "rollouts-dispatch/pending-ensure";
    /// when the current server outage began (RFC 3339)
    pub const OUTAGE_SINCE: &str = "rollouts-dispatch/outage-since";
    /// destinations whose Jobs a Terminate left to be deleted (set by the server, or `unknown`)
    pub const PENDING_DELETIONS: &str = dispatch_api::v1::PENDING_DELETIONS_KEY;
}

/// Provider settings from the plugin's `args` in `argo-rollouts-config` or its environment.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// The client of the rollouts-dispatch server; `None` when no server is configured.
    pub client: Option<ServerClient>,
    /// How long a server outage may last before a measurement becomes `Error`.
    pub outage_deadline: Duration,
    /// The longest wait between two `Resume` calls of a running measurement while no resume
    /// hints flow: how late a verdict may be noticed (a status lookup costs the server no
    /// Kubernetes API call).
    pub max_resume_interval: Duration,
    /// The follower of the server's resume hints, which resumes a measurement as soon as its
    /// Job ends (`crate::resume`); `None`: no Kubernetes access, or turned off.
    pub resumer: Option<Arc<Resumer>>,
}

impl Default for ProviderConfig {
    fn default() -> Self {
        Self {
            client: None,
            outage_deadline: Duration::from_secs(600),
            max_resume_interval: DEFAULT_MAX_RESUME,
            resumer: None,
        }
    }
}

/// The metric provider behind `rollouts-dispatch/job`.
#[derive(Debug)]
pub struct DispatchProvider {
    config: ProviderConfig,
}

/// The default of [`ProviderConfig::max_resume_interval`].
pub const DEFAULT_MAX_RESUME: Duration = Duration::from_secs(3);

/// How long to wait before asking again about a measurement that has run for `elapsed`, while
/// no resume hints flow: √(2·elapsed) like Argo's job provider, at least 1 s and at most `max`.
///
/// Why a cap: the controller skips `Resume` while `ResumeAt` is in the future, whatever wakes it
/// (argo-rollouts `analysis/analysis.go:187-190`), so without hints `ResumeAt` bounds how late a
/// finished Job is noticed. With them, [`Resumer::delay`].
pub fn resume_delay(elapsed: Duration, max: Duration) -> Duration {
    Duration::from_secs_f64(
        (2.0 * elapsed.as_secs_f64())
            .sqrt()
            .clamp(1.0, max.as_secs_f64().max(1.0)),
    )
}

/// The retry interval while the server is unreachable.
const OUTAGE_RETRY: Duration = Duration::from_secs(10);

fn at(base: GoTime, d: Duration) -> GoTime {
    let nanos = u64::from(base.nanos) + u64::from(d.subsec_nanos());
    GoTime::from_unix(
        base.unix_seconds + d.as_secs() as i64 + (nanos / 1_000_000_000) as i64,
        (nanos % 1_000_000_000) as u32,
    )
}

fn since(start: Option<GoTime>, now: GoTime) -> Duration {
    start.map_or(Duration::ZERO, |s| {
        let secs = now.unix_seconds - s.unix_seconds;
        if secs <= 0 {
            Duration::ZERO
        } else {
            Duration::from_secs(secs as u64)
        }
    })
}

/// The run's identity as the server needs it.
fn run_ref(run: &AnalysisRun) -> RunRef {
    let m = &run.object_meta;
    RunRef {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        labels: m.labels.clone(),
        annotations: m.annotations.clone(),
    }
}

/// Argo's job index: `count + error + 1` of this metric's result.
fn measurement_index(run: &AnalysisRun, metric: &str) -> u32 {
    run.status
        .metric_results
        .iter()
        .find(|r| r.name == metric)
        .map_or(1, |r| (r.count.max(0) + r.error.max(0)) as u32 + 1)
}

/// The secret-backed args (`valueFrom.secretKeyRef`) with the value the controller resolved;
/// values shorter than 3 characters are not treated as secrets (redacting them would mangle text).
fn secret_args(run: &AnalysisRun) -> impl Iterator<Item = (&str, &str)> {
    run.spec
        .args
        .iter()
        .filter(|a| {
            a.value_from
                .as_ref()
                .is_some_and(|v| v.secret_key_ref.is_some())
        })
        .filter_map(|a| Some((a.name.as_str(), a.value.as_deref()?)))
        .filter(|(_, v)| v.len() >= 3)
}

/// Hides the values of secret-backed args, which the controller resolves into the run we
/// receive: they must never appear in a message we return.
fn secret_values(run: &AnalysisRun) -> Redactor {
    Redactor::new(secret_args(run).map(|(_, v)| v))
}

/// The name of a secret-backed arg whose value the plugin block contains: `{{args.x}}` of a
/// `valueFrom.secretKeyRef` arg, resolved by the controller. Such a block is refused: the value
/// would land in the Job spec on the destination, readable by anyone who can read Jobs there, and
/// in the server's requests.
fn secret_in_block(run: &AnalysisRun, block: &serde_json::Value) -> Option<String> {
    let text = block.to_string();
    secret_args(run)
        .find(|(_, v)| {
            let escaped = serde_json::to_string(v).unwrap_or_default();
            text.contains(v) || text.contains(escaped.trim_matches('"'))
        })
        .map(|(name, _)| name.to_string())
}

impl DispatchProvider {
    /// A provider with `config`.
    pub fn new(config: ProviderConfig) -> Self {
        Self { config }
    }

    /// The wait before the next `Resume` of a running measurement that has run for `elapsed`:
    /// the resumer's while hints flow and the measurement has Jobs whose end they announce;
    /// an observe check (`rollout:`, `application:`) changes with what it reads, which no hint
    /// announces, so it keeps `--max-resume-interval`.
    fn next_delay(&self, elapsed: Duration, has_jobs: bool) -> Duration {
        match &self.config.resumer {
            Some(r) if has_jobs && r.is_flowing() => r.delay(elapsed),
            _ => resume_delay(elapsed, self.config.max_resume_interval),
        }
    }

    /// Tells the resumer what became of `m` (in flight or not).
    fn tracked(&self, run: &AnalysisRun, metric: &Metric, m: Measurement) -> Measurement {
        if let Some(r) = &self.config.resumer {
            r.track(run, &metric.name, m.metadata.get(keys::JOB_NAME), &m);
        }
        m
    }

    /// Validates the metric's block; the error is the measurement's message.
    fn job_config(metric: &Metric) -> Result<(JobConfig, serde_json::Value), ConfigError> {
        let cfg = JobConfig::from_plugin_map(
            &metric.name,
            metric
                .provider
                .plugin
                .iter()
                .map(|(k, v)| (k, v.0.as_slice())),
        )?;
        let raw = metric
            .provider
            .plugin
            .get(PLUGIN_NAME)
            .and_then(|b| serde_json::from_slice(&b.0).ok())
            .unwrap_or_default();
        Ok((cfg, raw))
    }

    fn measurement_ref(
        run: &AnalysisRun,
        metric: &Metric,
        block: serde_json::Value,
        metadata: &BTreeMap<String, String>,
    ) -> MeasurementRef {
        let mut metadata = metadata.clone();
        // Plugin-only bookkeeping is none of the server's business.
        metadata.remove(keys::PENDING);
        metadata.remove(keys::OUTAGE_SINCE);
        MeasurementRef {
            run: run_ref(run),
            metric: metric.name.clone(),
            index: measurement_index(run, &metric.name),
            block,
            metadata,
        }
    }

    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, CallError> {
        match &self.config.client {
            Some(c) => c.post(path, body).await,
            None => Err(CallError::Rejected(api::ApiError {
                code: "no_server".into(),
                message: NO_SERVER.into(),
            })),
        }
    }

    /// The measurement while the server cannot be reached: `Running` until the outage deadline.
    fn outage(&self, mut m: Measurement, reason: &str, now: GoTime) -> Measurement {
        let since_ts = m
            .metadata
            .get(keys::OUTAGE_SINCE)
            .and_then(|s| GoTime::parse_rfc3339(s))
            .unwrap_or(now);
        let give_up = at(since_ts, self.config.outage_deadline);
        if now >= give_up {
            m.metadata.remove(keys::OUTAGE_SINCE);
            let mut e = Measurement::error(format!(
                "rollouts-dispatch server unavailable since {}: {reason}",
                since_ts.to_rfc3339()
            ));
            e.started_at = m.started_at.or(Some(now));
            e.metadata = m.metadata;
            return e;
        }
        m.phase = phase::RUNNING.into();
        m.message = format!(
            "waiting for the rollouts-dispatch server: {reason}; retrying every {}s until {}",
            OUTAGE_RETRY.as_secs(),
            give_up.to_rfc3339()
        );
        m.metadata
            .insert(keys::OUTAGE_SINCE.into(), since_ts.to_rfc3339());
        m.started_at = m.started_at.or(Some(now));
        m.finished_at = None;
        m.resume_at = Some(at(now, OUTAGE_RETRY));
        m
    }

    async fn ensure(&self, run: &AnalysisRun, metric: &Metric, mut m: Measurement) -> Measurement {
        let now = GoTime::now();
        let (cfg, block) = match Self::job_config(metric) {
            Ok(c) => c,
            Err(error) => {
                warn!(run = %run.object_meta.name, metric = %metric.name, %error, "invalid plugin block");
                return Measurement::error(error.to_string());
            }
        };
        if let Some(arg) = secret_in_block(run, &block) {
            warn!(run = %run.object_meta.name, metric = %metric.name, %arg,
                  "refused: a secret arg's value is in the plugin block");
            return Measurement::error(format!(
                "the rollouts-dispatch/job block of metric {:?} contains the value of secret arg {arg:?}; \
                 secret values are never copied into Jobs (anyone who can read Jobs on the destination \
                 would see it): create the Secret on the destination and read it in the Job with \
                 env[].valueFrom.secretKeyRef instead of {{{{args.{arg}}}}}",
                metric.name
            ));
        }
        let req = Self::measurement_ref(run, metric, block, &BTreeMap::new());
        match self.call::<_, Ensured>(api::ENSURE, &req).await {
            Ok(e) => {
                info!(run = %run.object_meta.name, metric = %metric.name, job = %e.job_name,
                      destinations = %e.destinations.join(","), "jobs dispatched");
                m.metadata.remove(keys::PENDING);
                m.metadata.remove(keys::OUTAGE_SINCE);
                m.metadata.extend(e.metadata);
                m.metadata.insert(keys::JOB_NAME.into(), e.job_name);
                m.metadata.insert(keys::JOB_NAMESPACE.into(), e.namespace);
                m.metadata
                    .insert(keys::DESTINATIONS.into(), e.destinations.join(","));
                m.phase = phase::RUNNING.into();
                m.message = format!("dispatched to {}", m.metadata[keys::DESTINATIONS]);
                m.started_at = m.started_at.or(Some(now));
                m.resume_at = Some(at(now, Duration::from_secs(1)));
                m
            }
            Err(
                CallError::Transient(reason)
                | CallError::Busy {
                    message: reason, ..
                },
            ) => {
                warn!(run = %run.object_meta.name, metric = %metric.name, destination = %cfg.target_display(), %reason,
                      "server unavailable, will retry");
                m.metadata.insert(keys::PENDING.into(), "true".into());
                self.outage(m, &reason, now)
            }
            Err(CallError::Rejected(e)) => {
                warn!(run = %run.object_meta.name, metric = %metric.name, code = %e.code, message = %e.message,
                      "measurement rejected");
                let mut err = Measurement::error(secret_values(run).redact(&e.message));
                err.started_at = m.started_at.or(Some(now));
                err
            }
        }
    }
}

impl MetricProvider for DispatchProvider {
    async fn init_plugin(self: Arc<Self>) -> RpcError {
        info!(
            server = self.config.client.as_ref().map_or("none", |c| c.server()),
            "InitPlugin"
        );
        RpcError::default()
    }

    async fn run(self: Arc<Self>, run: AnalysisRun, metric: Metric) -> Measurement {
        let m = self.ensure(&run, &metric, Measurement::default()).await;
        self.tracked(&run, &metric, m)
    }

    async fn resume(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        m: Measurement,
    ) -> Measurement {
        if m.metadata.contains_key(keys::PENDING) || !m.metadata.contains_key(keys::JOB_NAME) {
            let m = self.ensure(&run, &metric, m).await;
            return self.tracked(&run, &metric, m);
        }
        let now = GoTime::now();
        let (has_jobs, block) = Self::job_config(&metric)
            .map(|(cfg, b)| (cfg.observe().is_none(), b))
            .unwrap_or_default();
        let req = Self::measurement_ref(&run, &metric, block, &m.metadata);
        let secrets = secret_values(&run);
        let m = match self.call::<_, Verdict>(api::STATUS, &req).await {
            Ok(v) => finish(m, v, now, &secrets, |elapsed| {
                self.next_delay(elapsed, has_jobs)
            }),
            Err(
                CallError::Transient(reason)
                | CallError::Busy {
                    message: reason, ..
                },
            ) => self.outage(m, &reason, now),
            Err(CallError::Rejected(e)) => {
                let mut err = Measurement::error(secrets.redact(&e.message));
                err.started_at = m.started_at;
                err.metadata = m.metadata;
                err
            }
        };
        self.tracked(&run, &metric, m)
    }

    async fn terminate(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        mut m: Measurement,
    ) -> Measurement {
        let now = GoTime::now();
        let mut message = "terminated: the Jobs were deleted".to_string();
        if m.metadata.contains_key(keys::JOB_NAME) {
            let block = Self::job_config(&metric)
                .map(|(_, b)| b)
                .unwrap_or_default();
            let req = Self::measurement_ref(&run, &metric, block, &m.metadata);
            match self.call::<_, Verdict>(api::TERMINATE, &req).await {
                Ok(v) => {
                    if !v.message.is_empty() {
                        message = format!("terminated:\n{}", v.message);
                    }
                    m.metadata.extend(v.metadata);
                }
                // Argo completes a terminated run whatever Terminate answers and never calls it
                // again (argo-rollouts analysis/analysis.go:350-356), so waiting (`Running`)
                // would only hide the Jobs left behind: say so, and answer at once. The Jobs end
                // at their deadline; the server's sweep deletes the Jobs of completed runs.
                Err(
                    CallError::Transient(reason)
                    | CallError::Busy {
                        message: reason, ..
                    },
                ) => {
                    message = format!(
                        "terminated, but the rollouts-dispatch server could not be reached to \
                         delete the Jobs ({reason}); they end at their deadline, and the server's \
                         sweep deletes the Jobs of completed runs"
                    );
                    m.metadata
                        .insert(keys::PENDING_DELETIONS.into(), "unknown".into());
                }
                Err(CallError::Rejected(e)) => {
                    let mut err = Measurement::error(secret_values(&run).redact(&e.message));
                    err.metadata = m.metadata;
                    return err;
                }
            }
        }
        m.metadata.remove(keys::OUTAGE_SINCE);
        // As Argo's own job provider (v1.10): a terminated measurement is Inconclusive.
        m.phase = phase::INCONCLUSIVE.into();
        m.message = message;
        m.finished_at = Some(now);
        m.resume_at = None;
        self.tracked(&run, &metric, m)
    }

    async fn garbage_collect(
        self: Arc<Self>,
        run: AnalysisRun,
        metric: Metric,
        limit: i64,
    ) -> RpcError {
        if self.config.client.is_none() {
            return RpcError::default();
        }
        let block = match Self::job_config(&metric) {
            Ok((_, b)) => b,
            // Nothing can have been dispatched for an invalid block.
            Err(_) => return RpcError::default(),
        };
        let req = GcRequest {
            run: run_ref(&run),
            metric: metric.name.clone(),
            limit: limit.clamp(0, u32::MAX as i64) as u32,
            block,
        };
        match self.call::<_, serde_json::Value>(api::GC, &req).await {
            Ok(_) => RpcError::default(),
            Err(e) => RpcError {
                error_string: e.to_string(),
            },
        }
    }

    fn provider_type(&self) -> String {
        PROVIDER_TYPE.to_string()
    }

    async fn get_metadata(self: Arc<Self>, metric: Metric) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match Self::job_config(&metric) {
            Ok((cfg, _)) => {
                out.insert("plugin-version".into(), crate::VERSION.into());
                out.insert("destination".into(), cfg.target_display());
            }
            Err(e) => {
                out.insert("error".into(), e.to_string());
            }
        }
        out
    }
}

/// Folds a server verdict into the measurement.
fn finish(
    mut m: Measurement,
    v: Verdict,
    now: GoTime,
    secrets: &Redactor,
    delay: impl Fn(Duration) -> Duration,
) -> Measurement {
    m.metadata.remove(keys::OUTAGE_SINCE);
    m.metadata.extend(v.metadata);
    m.message = secrets.redact(&v.message);
    match v.phase.as_str() {
        phase::SUCCESSFUL | phase::FAILED | phase::INCONCLUSIVE | phase::ERROR => {
            m.phase = v.phase;
            m.finished_at = Some(now);
            m.resume_at = None;
        }
        _ => {
            m.phase = phase::RUNNING.into();
            m.resume_at = Some(at(now, delay(since(m.started_at, now))));
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollouts::{Argument, SecretKeyRef, ValueFrom};

    #[test]
    fn resume_delay_grows_like_argos_and_is_bounded() {
        let cap = Duration::from_secs(60);
        assert_eq!(resume_delay(Duration::ZERO, cap), Duration::from_secs(1));
        assert_eq!(
            resume_delay(Duration::from_secs(50), cap),
            Duration::from_secs(10)
        );
        assert_eq!(
            resume_delay(Duration::from_secs(86_400), cap),
            Duration::from_secs(60)
        );
        assert_eq!(
            resume_delay(Duration::from_secs(86_400), DEFAULT_MAX_RESUME),
            DEFAULT_MAX_RESUME
        );
    }

    /// Arg `token`, from a Secret, resolved by the controller to `s3cr3t-value`.
    fn secret_arg() -> Argument {
        Argument {
            name: "token".into(),
            value: Some("s3cr3t-value".into()),
            value_from: Some(ValueFrom {
                secret_key_ref: Some(SecretKeyRef {
                    name: "s".into(),
                    key: "k".into(),
                }),
                field_ref: None,
            }),
        }
    }

    #[test]
    fn secret_arg_values_are_redacted() {
        let mut run = AnalysisRun::default();
        run.spec.args = vec![
            secret_arg(),
            Argument {
                name: "destination".into(),
                value: Some("cluster-a".into()),
                value_from: None,
            },
        ];
        let secrets = secret_values(&run);
        assert_eq!(
            secrets.redact("curl -H 'x: s3cr3t-value' to cluster-a failed"),
            "curl -H 'x: *****' to cluster-a failed"
        );
    }

    #[tokio::test]
    async fn a_block_holding_a_secret_value_is_refused_before_anything_is_sent() {
        let mut run = AnalysisRun::default();
        run.spec.args = vec![secret_arg()];
        let mut metric = Metric {
            name: "smoke".into(),
            ..Default::default()
        };
        let block = |env: &str| {
            dispatch_plugin::gob::GoBytes(
                format!(
                    r#"{{"destination":"a","spec":{{"template":{{"spec":{{"containers":[{{"name":"c","image":"x","env":[{{"name":"T","value":"{env}"}}]}}]}}}}}}}}"#
                )
                .into_bytes(),
            )
        };
        metric
            .provider
            .plugin
            .insert(PLUGIN_NAME.into(), block("Bearer s3cr3t-value"));
        // No server is configured: a call would say so, so this message proves nothing was sent.
        let provider = Arc::new(DispatchProvider::new(ProviderConfig::default()));
        let m = provider.clone().run(run.clone(), metric.clone()).await;
        assert_eq!(m.phase, "Error");
        assert!(
            m.message.contains("secret arg \"token\"")
                && m.message.contains("valueFrom.secretKeyRef")
                && !m.message.contains("s3cr3t-value"),
            "{}",
            m.message
        );
        metric
            .provider
            .plugin
            .insert(PLUGIN_NAME.into(), block("plain"));
        let m = provider.run(run, metric).await;
        assert!(!m.message.contains("secret arg"), "{}", m.message);
    }

    #[tokio::test]
    async fn a_server_at_its_budget_keeps_the_measurement_running_and_says_which_budget() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // A server refusing every call as `runtime::limits` does when its budget is used up.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let body = r#"{"code":"overloaded","message":"the server is serving its maximum of 256 plugin and API requests (serve --max-concurrent-requests); retry shortly"}"#;
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 8192];
                let _ = tcp.read(&mut buf).await;
                let reply = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(reply.as_bytes()).await;
            }
        });
        let client = ServerClient::new(&dispatch_api::client::ClientConfig {
            server: url,
            token_file: None,
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(10),
        })
        .unwrap();
        let provider = Arc::new(DispatchProvider::new(ProviderConfig {
            client: Some(client),
            ..ProviderConfig::default()
        }));
        let mut metric = Metric {
            name: "smoke".into(),
            ..Default::default()
        };
        metric.provider.plugin.insert(
            PLUGIN_NAME.into(),
            dispatch_plugin::gob::GoBytes(
                br#"{"destination":"a","spec":{"template":{"spec":{"containers":[{"name":"c","image":"x"}]}}}}"#.to_vec(),
            ),
        );
        let m = provider.run(AnalysisRun::default(), metric).await;
        assert_eq!(m.phase, "Running", "{}", m.message);
        assert!(
            m.message
                .contains("waiting for the rollouts-dispatch server")
                && m.message
                    .contains("256 plugin and API requests (serve --max-concurrent-requests)"),
            "{}",
            m.message
        );
        assert!(m.resume_at.is_some());
    }

    #[test]
    fn a_running_verdict_keeps_the_measurement_in_flight_with_resume_at() {
        let now = GoTime::from_unix(1_000, 0);
        let m = Measurement {
            started_at: Some(GoTime::from_unix(950, 0)),
            ..Default::default()
        };
        let v = Verdict {
            phase: "Running".into(),
            message: "a: running".into(),
            metadata: [("a".to_string(), "Running".to_string())].into(),
        };
        let capped = |e| resume_delay(e, Duration::from_secs(60));
        let m = finish(m, v, now, &Redactor::default(), capped);
        assert_eq!(m.phase, "Running");
        assert_eq!(m.resume_at, Some(GoTime::from_unix(1_010, 0)));
        assert_eq!(m.finished_at, None);
        let done = finish(
            m,
            Verdict {
                phase: "Failed".into(),
                message: "a: Failed".into(),
                metadata: BTreeMap::new(),
            },
            now,
            &Redactor::default(),
            capped,
        );
        assert_eq!(
            (done.phase.as_str(), done.finished_at, done.resume_at),
            ("Failed", Some(now), None)
        );
    }

    #[test]
    fn an_outage_stays_running_until_the_deadline_then_errors() {
        let p = DispatchProvider::new(ProviderConfig {
            client: None,
            outage_deadline: Duration::from_secs(60),
            max_resume_interval: DEFAULT_MAX_RESUME,
            resumer: None,
        });
        let t0 = GoTime::from_unix(10_000, 0);
        let m = p.outage(Measurement::default(), "connection refused", t0);
        assert_eq!(m.phase, "Running");
        assert!(
            m.message.contains("connection refused") && m.message.contains("retrying"),
            "{}",
            m.message
        );
        assert_eq!(m.resume_at, Some(GoTime::from_unix(10_010, 0)));
        let still = p.outage(
            m.clone(),
            "connection refused",
            GoTime::from_unix(10_059, 0),
        );
        assert_eq!(still.phase, "Running");
        let gave_up = p.outage(m, "connection refused", GoTime::from_unix(10_060, 0));
        assert_eq!(gave_up.phase, "Error");
        assert!(
            gave_up.message.contains("unavailable since") && gave_up.finished_at.is_some(),
            "{}",
            gave_up.message
        );
    }

    #[test]
    fn the_measurement_index_follows_argos_job_provider() {
        let mut run = AnalysisRun::default();
        assert_eq!(measurement_index(&run, "m"), 1);
        run.status
            .metric_results
            .push(crate::rollouts::MetricResult {
                name: "m".into(),
                count: 3,
                error: 2,
                ..Default::default()
            });
        assert_eq!(measurement_index(&run, "m"), 6);
    }
}
