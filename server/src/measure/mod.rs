//! Measurements: what the plugin's `ensure`, `status`, `terminate` and `gc` calls do, over the
//! engine ([`Measurements`]), and their routes (`routes`); the agent routes, which carry the
//! same measurements' work to agent destinations and their state back (`agents`).
//!
//! The Job reference handed out in measurement metadata is signed with the server's key
//! ([`Signer`]); a reference that comes back is used only when [`JobRef::from_request`] accepts it
//! (this server's signature, this measurement's run and metric, the Job name of the formula) and
//! the policy still allows its placements; otherwise the call is refused (`403 forbidden`, an
//! `Error` measurement) before any destination is reached. Without a reference the Jobs are
//! located from the request, with the policy applied. The caller itself (agent tokens, project
//! binding) was checked by the route before (`http::authz`).
//!
//! With a watch of the control plane's AnalysisRuns ([`Measurements::with_runs`], `serve`
//! with `confirmRuns`), every measurement call first confirms that the run the request names
//! exists with that uid and has that metric with our plugin ([`Runs::confirm`]): a run it does
//! not confirm is `403 forbidden` before anything else, a watch that has not listed the runs yet
//! `503 unavailable` (a retry, never a verdict).
//!
//! Secret values never reach the server (the plugin redacts them from messages itself), so the
//! engine's redactor is empty here. A verdict that is `Error` only because a destination is
//! unreachable becomes `503 unavailable`, which the plugin turns into a retry, not an error.

pub mod agents;
pub mod routes;

use std::collections::BTreeMap;
use std::sync::Arc;

use dispatch_api::block::JobConfig;
use dispatch_api::v1::{self as api, DestinationInfo, GcRequest, MeasurementRef, RunRef};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;

use crate::destinations::{Entry, Source};
use crate::engine::{Engine, EngineError, Expected, JobRef, MeasureRequest, TerminateReport};
use crate::http::{DispatchError, Principal, Reason};
use crate::job::RunContext;
use crate::logs::Redactor;
use crate::runs::{RunError, Runs, CONFIRM_WAIT};
use crate::runtime::metrics::Metrics;
use crate::signing::Signer;
use crate::verdict::{Phase, Verdict};

pub use routes::Measure;

/// What ends a measurement message when `ui.externalURL` is set: ` — logs: <url>`.
const LINK_PREFIX: &str = " — logs: ";

/// The measurements of the plugin's calls, over the engine.
pub struct Measurements {
    engine: Engine,
    metrics: Arc<Metrics>,
    /// signs the Job references handed out, verifies those that come back
    signer: Arc<Signer>,
    /// the control plane's AnalysisRuns, when requests are confirmed against them
    runs: Option<Runs>,
    /// `ui.externalURL`: every measurement message ends with the run page's address under it
    external_url: Option<String>,
}

/// The phase of a Job for the `jobs` metric.
pub fn job_phase(job: &Job) -> &'static str {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    let has = |t: &str| {
        conditions.is_some_and(|cs| cs.iter().any(|c| c.type_ == t && c.status == "True"))
    };
    if has("Complete") {
        "succeeded"
    } else if has("Failed") {
        "failed"
    } else {
        "active"
    }
}

/// Every destination of `engine`'s registry as `/v1/destinations` lists it, by name.
pub fn destination_rows(engine: &Engine) -> Vec<DestinationInfo> {
    let mut rows: Vec<DestinationInfo> = engine
        .registry()
        .entries()
        .into_iter()
        .map(|e| DestinationInfo {
            name: e.name().to_string(),
            source: match e.source() {
                Source::Config { .. } => "config",
                Source::ArgoCd { .. } | Source::ArgoCdInCluster { .. } => "argocd-secret",
                Source::ArgoCdHome { .. } => "argocd-instance",
                Source::Kubeconfig { .. } => "kubeconfig",
                Source::Agent { .. } => "agent",
                Source::Local => "local",
            }
            .to_string(),
            labels: e.labels().clone(),
            default_namespace: e.namespace().to_string(),
            connected: match &e {
                Entry::Ready(d) => d.cache_problem().is_none(),
                Entry::Broken(_) => false,
                Entry::Agent(a) => a.connected(engine.agent_offline_after()),
            },
            last_contact: match &e {
                Entry::Agent(a) => a
                    .last_contact()
                    .and_then(|t| Timestamp::try_from(t).ok())
                    .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()),
                _ => None,
            },
            warnings: e.warnings(),
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// `message` ending with the address of run `namespace/name`'s page under `external_url` (run
/// names are DNS subdomains: no escaping needed).
fn with_logs_link(message: String, external_url: &str, namespace: &str, name: &str) -> String {
    format!("{message}{LINK_PREFIX}{external_url}/ui/runs/{namespace}/{name}")
}

impl Measurements {
    /// Measures on `engine`, reporting to `metrics`; Job references are signed by `signer`.
    pub fn new(engine: Engine, metrics: Arc<Metrics>, signer: Arc<Signer>) -> Self {
        // The same keys mark the Jobs, so every replica adopts what another created.
        engine.mark_jobs_with(signer.clone());
        Self {
            engine,
            metrics,
            signer,
            runs: None,
            external_url: None,
        }
    }

    /// Ends every measurement message with the run page under `url` (`ui.externalURL`), so
    /// that Kargo's verification tab shows where the full logs are.
    pub fn with_external_url(mut self, url: Option<String>) -> Self {
        self.external_url = url;
        self
    }

    /// Serves only measurement requests whose run `runs` confirms (`confirmRuns`).
    pub fn with_runs(mut self, runs: Runs) -> Self {
        self.runs = Some(runs);
        self
    }

    /// `message` with the run page's link when `ui.externalURL` is configured.
    fn linked(&self, run: &RunRef, message: String) -> String {
        match &self.external_url {
            Some(url) => with_logs_link(message, url, &run.namespace, &run.name),
            None => message,
        }
    }

    /// `Ok` when requests are not confirmed, or when run `run` exists on the control plane and
    /// has `metric` with our plugin; else `403` (no such run, another uid, no such metric) or
    /// `503` (the watch has not listed the runs yet: the plugin retries).
    async fn confirm(&self, run: &RunRef, metric: &str) -> Result<(), DispatchError> {
        let Some(runs) = &self.runs else {
            return Ok(());
        };
        let confirmed = runs
            .confirm(&run.namespace, &run.name, &run.uid, metric, CONFIRM_WAIT)
            .await;
        confirmed.map_err(|e| {
            tracing::warn!(run = %format!("{}/{}", run.namespace, run.name), uid = %run.uid,
                           metric, reason = %e, "refused: run not confirmed");
            match e {
                RunError::NotSynced { .. } => DispatchError::Unavailable(Reason::of(e)),
                _ => DispatchError::Forbidden(Reason::of(e)),
            }
        })
    }

    /// Publishes the number of our Jobs per destination and phase, from the watch caches.
    pub fn publish_job_counts(&self) {
        for entry in self.engine.registry().entries() {
            if let Entry::Ready(d) = entry {
                let counts = d.jobs().count_by(job_phase);
                for phase in ["active", "succeeded", "failed"] {
                    self.metrics.set_jobs(
                        &d.name,
                        phase,
                        counts.get(phase).copied().unwrap_or(0) as i64,
                    );
                }
            }
        }
    }

    /// Records how long after its Jobs finished a verdict was handed out.
    fn observe_latency(&self, job: &JobRef) {
        let now = Timestamp::now();
        let latest = job
            .placements
            .iter()
            .filter_map(|p| match self.engine.registry().get(&p.destination) {
                Some(Entry::Ready(d)) => d
                    .jobs()
                    .get(&p.namespace, &job.name)
                    .and_then(|j| crate::job::lifecycle::ended_at(&j)),
                _ => None,
            })
            .max();
        if let Some(t) = latest {
            let secs = now.duration_since(t).as_secs_f64();
            self.metrics.observe_verdict_latency(secs.max(0.0));
        }
    }

    /// The engine's request for measurement `index` of `metric` of `run`.
    fn request(
        run: &RunRef,
        metric: &str,
        index: u32,
        block: &serde_json::Value,
    ) -> Result<MeasureRequest, DispatchError> {
        let config = parse_block(metric, block)?;
        Ok(MeasureRequest {
            run: RunContext {
                name: run.name.clone(),
                namespace: run.namespace.clone(),
                uid: run.uid.clone(),
                labels: run.labels.clone(),
                annotations: run.annotations.clone(),
            },
            metric: metric.to_string(),
            measurement: index.max(1),
            config,
            secrets: Vec::new(),
        })
    }

    /// The Jobs of a measurement, signed: from the reference in its metadata when this server
    /// signed it for this measurement and the policy still allows its placements, else
    /// recomputed from the request (policy applied; no API call). A refused reference reaches
    /// no destination.
    async fn job_ref(&self, req: &MeasurementRef) -> Result<JobRef, DispatchError> {
        let expected = Expected {
            run_uid: &req.run.uid,
            run_namespace: &req.run.namespace,
            run_name: &req.run.name,
            metric: &req.metric,
            // As the Job name's `n` (`Self::request`): a reference of another measurement of
            // this metric is refused. The index (count + error + 1) holds still while a
            // measurement runs: Argo counts a measurement only once it completed
            // (argo-rollouts analysis/analysis.go:378-405), so Resume and Terminate send the
            // index that Run did.
            measurement: req.index.max(1),
        };
        let refused = |why: Reason| {
            tracing::warn!(run = %format!("{}/{}", req.run.namespace, req.run.name),
                           metric = %req.metric, reason = %why, "refused: measurement reference");
            DispatchError::Forbidden(why)
        };
        match JobRef::from_request(&req.metadata, &self.signer, expected) {
            Err(e) => Err(refused(Reason::of(e))),
            Ok(Some(job)) => {
                self.engine
                    .check_placements(&req.run.namespace, &job)
                    .map_err(|d| {
                        refused(Reason::caused_by(
                            format!(
                                "refusing the measurement's dispatch-ref: {d}. No Job was read or deleted"
                            ),
                            d,
                        ))
                    })?;
                Ok(job)
            }
            Ok(None) => {
                let mr = Self::request(&req.run, &req.metric, req.index, &req.block)?;
                let job = self.engine.locate(&mr).await.map_err(engine_error)?;
                Ok(job.signed(&self.signer))
            }
        }
    }
}

fn engine_error(e: EngineError) -> DispatchError {
    // The patterns bind nothing, so `e` itself becomes the cause.
    match e {
        EngineError::UnknownDestination { .. } | EngineError::NoMatch { .. } => {
            DispatchError::UnknownDestination(Reason::of(e))
        }
        EngineError::Denied(_)
        | EngineError::DestinationDenied(_)
        | EngineError::PodSecurity { .. }
        | EngineError::OutsideNamespaces { .. } => DispatchError::Forbidden(Reason::of(e)),
        EngineError::Stage(_) | EngineError::StageControlPlane(_) => {
            DispatchError::NotFound(Reason::of(e))
        }
        EngineError::InvalidJob { .. }
        | EngineError::TooManyPlacements { .. }
        | EngineError::DeadlineTooLong { .. } => DispatchError::InvalidBlock(Reason::of(e)),
        EngineError::Start { .. } | EngineError::ArgoCd(_) => {
            DispatchError::Internal(Reason::of(e))
        }
    }
}

/// Validates the plugin block a request carries; the error names the metric and the field.
fn parse_block(metric: &str, block: &serde_json::Value) -> Result<JobConfig, DispatchError> {
    JobConfig::from_value(block.clone()).map_err(|reason| {
        DispatchError::InvalidBlock(Reason::caused_by(
            format!("invalid rollouts-dispatch/job block in metric {metric:?}: {reason}"),
            reason,
        ))
    })
}

/// The answer to Terminate: terminal at once, whatever is still being deleted. Argo completes a
/// terminated run whatever Terminate answers and never asks again (argo-rollouts
/// analysis/analysis.go:350-356), so a `Running` answer would only hide the Jobs left; the
/// pending ones are retried by the server instead (`engine/pending.rs`). Argo replaces the
/// message of an Inconclusive Terminate with "Metric Terminated" (analysis.go:354-356), so the
/// pending destinations are also in the metadata (`pending-deletions`, `state.<destination>`).
fn terminated(report: &TerminateReport) -> api::Verdict {
    let mut lines: Vec<String> = report
        .deleted
        .iter()
        .map(|d| format!("{d}: Job deleted"))
        .collect();
    lines.extend(report.absent.iter().map(|d| format!("{d}: no Job left")));
    let mut metadata = BTreeMap::new();
    for (d, e) in &report.pending {
        lines.push(format!(
            "{d}: the Job could not be deleted yet ({e}); the server retries until it is gone"
        ));
        metadata.insert(format!("state.{d}"), "deleting".to_string());
    }
    for (d, e) in &report.failed {
        lines.push(format!(
            "{d}: the Job could not be deleted ({e}); it ends at its deadline, and the sweep \
             removes the Jobs of completed runs"
        ));
        metadata.insert(format!("state.{d}"), "not-deleted".to_string());
    }
    let waiting: Vec<&str> = report
        .pending
        .iter()
        .chain(&report.failed)
        .map(|(d, _)| d.as_str())
        .collect();
    if !waiting.is_empty() {
        metadata.insert(api::PENDING_DELETIONS_KEY.to_string(), waiting.join(","));
    }
    api::Verdict {
        phase: Phase::Inconclusive.as_str().into(),
        message: lines.join("\n"),
        metadata,
    }
}

fn wire(v: Verdict) -> Result<api::Verdict, DispatchError> {
    if v.retryable {
        return Err(DispatchError::Unavailable(v.message.into()));
    }
    Ok(api::Verdict {
        phase: v.phase.as_str().to_string(),
        message: v.message,
        metadata: v.metadata,
    })
}

impl Measurements {
    /// Creates or adopts the Jobs of one measurement.
    pub async fn ensure(&self, req: MeasurementRef) -> Result<api::Ensured, DispatchError> {
        self.confirm(&req.run, &req.metric).await?;
        let mr = Self::request(&req.run, &req.metric, req.index, &req.block)?;
        let ensured = self.engine.ensure(&mr).await.map_err(engine_error)?;
        if ensured.verdict.retryable {
            // Some destination could not be reached: ensure is idempotent, let the plugin retry.
            return Err(DispatchError::Unavailable(ensured.verdict.message.into()));
        }
        if ensured.verdict.phase != Phase::Running {
            // Decided at creation: a destination refused the Job, and retrying the same Job
            // cannot help. End the measurement now with the destination's reason (not later
            // with "job does not exist"), and delete what was created elsewhere.
            let report = self.engine.terminate(&ensured.job).await;
            tracing::info!(run = %format!("{}/{}", req.run.namespace, req.run.name), metric = %req.metric,
                           deleted = ?report.deleted, failed = ?report.failed,
                           "a destination refused the job; the others' jobs are deleted");
            return Err(DispatchError::Refused(
                self.linked(&req.run, ensured.verdict.message).into(),
            ));
        }
        let job = ensured.job.signed(&self.signer);
        let mut metadata = ensured.verdict.metadata;
        metadata.extend(job.metadata());
        Ok(api::Ensured {
            job_name: job.name.clone(),
            namespace: job
                .placements
                .first()
                .map(|p| p.namespace.clone())
                .unwrap_or_default(),
            destinations: job
                .placements
                .iter()
                .map(|p| p.destination.clone())
                .collect(),
            metadata,
        })
    }

    /// The verdict of one measurement so far.
    pub async fn status(&self, req: MeasurementRef) -> Result<api::Verdict, DispatchError> {
        self.confirm(&req.run, &req.metric).await?;
        let job = self.job_ref(&req).await?;
        if self.engine.agent_records_to_rewrite(&job) {
            // A restarted server with the in-memory store: the request still carries the
            // block, so the agent gets the spec (and its mark) again. Never past the
            // deadline: the records may have expired, and the Job must not come back.
            let mr = Self::request(&req.run, &req.metric, job.measurement, &req.block)?;
            if let Err(e) = self.engine.ensure(&mr).await {
                tracing::warn!(job = %job.name, error = %e,
                               "cannot write the lost agent records again; asking the agent to adopt");
            }
        }
        let mut verdict = self
            .engine
            .status(&job, &Redactor::new(Vec::<String>::new()))
            .await;
        if let Some(late) = self.engine.past_deadline(&job, &verdict).await {
            // `past_deadline` already deleted every Job of the measurement.
            self.metrics.count_past_deadline();
            verdict = late;
        } else {
            self.engine.stop_undecided(&job, &verdict).await;
        }
        if verdict.phase != Phase::Running && !verdict.retryable {
            self.observe_latency(&job);
        }
        let mut reply = wire(verdict)?;
        reply.message = self.linked(&req.run, reply.message);
        Ok(reply)
    }

    /// Deletes the Jobs of one measurement (foreground) on every destination.
    pub async fn terminate(&self, req: MeasurementRef) -> Result<api::Verdict, DispatchError> {
        self.confirm(&req.run, &req.metric).await?;
        let job = self.job_ref(&req).await?;
        let report = self.engine.terminate(&job).await;
        Ok(terminated(&report))
    }

    /// The known destinations `caller` may be shown (`/v1/destinations`): every one to a caller
    /// bound to every project (`"*"`), its own to an agent, and to a caller bound to projects only those the
    /// policy lets one of them use (another tenant's names and labels are none of its business).
    pub fn destinations(&self, caller: &Principal) -> Vec<DestinationInfo> {
        let policy = self.engine.policy();
        destination_rows(&self.engine)
            .into_iter()
            .filter(|row| match (&caller.destination, &caller.projects) {
                (Some(own), _) => *own == row.name,
                // Bound to every project (the Rollouts controller's `"*"`): every destination.
                (None, p) if p.is_every_project() => true,
                (None, p) => policy.shows_destination(&p.globs, &row.name),
            })
            .collect()
    }

    /// Deletes the oldest Jobs of a run beyond `limit`; returns how many were deleted.
    pub async fn gc(&self, req: GcRequest) -> Result<u32, DispatchError> {
        // The run's own placements, from its block with the policy applied: GC lists and
        // deletes there only, never on the rest of the registry.
        self.confirm(&req.run, &req.metric).await?;
        let mr = Self::request(&req.run, &req.metric, 1, &req.block)?;
        let job = self.engine.locate(&mr).await.map_err(engine_error)?;
        let report = self
            .engine
            .gc(
                &req.run.uid,
                Some(&req.metric),
                &job.placements,
                req.limit as usize,
            )
            .await;
        // Best effort: an error here makes Argo skip trimming the run's measurement history,
        // and the Jobs left behind still end by their TTL and the sweep.
        for (destination, error) in &report.failed {
            tracing::warn!(run = %format!("{}/{}", req.run.namespace, req.run.name),
                           metric = %req.metric, %destination, %error,
                           "garbage collection could not finish on a destination");
            self.metrics.count_gc_failure(destination);
        }
        Ok(report.deleted.len() as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_ends_with_the_run_page() {
        assert_eq!(
            with_logs_link(
                "cluster-a: check: exit 1".into(),
                "https://d.example.com/dispatch",
                "team-a",
                "uat.01j.abc"
            ),
            "cluster-a: check: exit 1 — logs: https://d.example.com/dispatch/ui/runs/team-a/uat.01j.abc"
        );
    }

    #[test]
    fn terminate_answers_at_once_and_names_what_is_still_being_deleted() {
        let report = TerminateReport {
            deleted: vec!["a".into()],
            absent: vec!["b".into()],
            pending: vec![("c".into(), "destination unreachable".into())],
            failed: vec![("d".into(), "the store is down".into())],
        };
        let v = terminated(&report);
        assert_eq!(v.phase, "Inconclusive", "terminal even with deletions left");
        assert!(v.message.contains("a: Job deleted"), "{}", v.message);
        assert!(v.message.contains("b: no Job left"), "{}", v.message);
        assert!(
            v.message.contains(
                "c: the Job could not be deleted yet (destination unreachable); the server retries"
            ),
            "{}",
            v.message
        );
        assert!(v
            .message
            .contains("d: the Job could not be deleted (the store is down)"));
        assert_eq!(v.metadata[api::PENDING_DELETIONS_KEY], "c,d");
        assert_eq!(v.metadata["state.c"], "deleting");
        let clean = terminated(&TerminateReport {
            deleted: vec!["a".into()],
            ..Default::default()
        });
        assert!(clean.metadata.is_empty(), "{:?}", clean.metadata);
    }
}
