//! `status`: the verdict of a measurement from the watch caches (no API call at steady state),
//! with the log tail of a failed container fetched once and redacted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};

use super::{api_failure, finish, no_answer, with_cache_problem, Engine, JobRef, Placement};
use crate::destinations::{Destination, Entry};
use crate::logs;
use crate::logs::Redactor;
use crate::verdict::{self, DestState, DestinationStatus, Graces, Observed, Phase, Verdict};

impl Engine {
    /// The verdict of a measurement, from the watch caches: at steady state no API call.
    #[tracing::instrument(name = "status", skip_all, fields(job = %job.name, destinations = %job.destinations()))]
    pub async fn status(&self, job: &JobRef, secrets: &Redactor) -> Verdict {
        self.status_with(job, secrets, true).await
    }

    /// The verdict by asking every API server (GET the Job, list its Pods): what an engine
    /// without watch caches does on every lookup. For comparison (`make bench-engine`) and
    /// diagnostics.
    #[tracing::instrument(name = "status_uncached", skip_all, fields(job = %job.name, destinations = %job.destinations()))]
    pub async fn status_uncached(&self, job: &JobRef, secrets: &Redactor) -> Verdict {
        self.status_with(job, secrets, false).await
    }

    /// The verdict of a measurement that is past its deadline ([`JobRef::deadline`]) and still
    /// has none (`Running`, or only unreachable destinations): `Error`, naming what did not
    /// answer (the per-destination lines) and since when, and the Jobs are deleted (best
    /// effort: Argo calls Terminate only for runs that it aborts itself). `None`: within the
    /// deadline, no deadline, or a verdict.
    ///
    /// An observe check whose every destination answered (`Running`: the object was read, or
    /// read as missing, and is not yet as wanted) is `Failed` instead, reason
    /// `DeadlineExceeded`, like a Job past its `activeDeadlineSeconds`: what it saw is the
    /// verdict. `Error` would have Argo Rollouts measure again, up to the metric's
    /// `consecutiveErrorLimit` (default 4, argo-rollouts utils/defaults/defaults.go:35-37,
    /// analysis/analysis.go:681), each time for a whole `activeDeadline`, for an answer it
    /// already has; it stays for destinations that did not answer, where asking again can help.
    ///
    /// Argo Rollouts has no timeout of its own for a metric (a plugin measurement stays
    /// `Running` for as long as the plugin says so: `analysis/analysis.go`, `runMeasurements`,
    /// resumes it at `resumeAt` without a bound), and Kargo keeps a Stage's promotion pending
    /// until its verification ends, so the server owns this deadline.
    pub async fn past_deadline(&self, job: &JobRef, verdict: &Verdict) -> Option<Verdict> {
        let undecided = verdict.phase == Phase::Running || verdict.retryable;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if job.deadline == 0 || !undecided || now < job.deadline {
            return None;
        }
        let report = self.terminate(job).await;
        let at = std::time::UNIX_EPOCH + Duration::from_secs(job.deadline);
        let mut late = verdict.clone();
        late.retryable = false;
        let all_seen = verdict
            .destinations
            .iter()
            .all(|d| d.seen || d.state.is_final());
        if job.observe.is_some() && verdict.phase == Phase::Running && all_seen {
            late.phase = Phase::Failed;
            late.message = format!(
                "DeadlineExceeded: not as the check wants by its activeDeadline {} ({}s ago), \
                 as last seen: {}",
                humantime::format_rfc3339_seconds(at),
                now - job.deadline,
                verdict.message
            );
            tracing::info!(job = %job.name, destinations = %job.destinations(), deadline = job.deadline,
                           "an observe check is past its deadline: Failed with what it saw");
            return Some(late);
        }
        late.phase = Phase::Error;
        late.message = format!(
            "no verdict by the server's deadline {} ({}s ago: the block's activeDeadline, else \
             engine.measurementDeadline{}): {}; its Jobs {}",
            humantime::format_rfc3339_seconds(at),
            now - job.deadline,
            if job.observe.is_some() {
                ""
            } else {
                ", plus engine.deadlineGrace"
            },
            verdict.message,
            if job.observe.is_some() && report.failed.is_empty() {
                // An observe check created nothing; only agent records were asked to go.
                "are none (an observe check creates nothing; the observed objects are left \
                 alone)"
                    .to_string()
            } else if report.failed.is_empty() {
                "were deleted".to_string()
            } else {
                format!(
                    "could not all be deleted yet ({})",
                    report
                        .failed
                        .iter()
                        .map(|(d, why)| format!("{d}: {why}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            }
        );
        tracing::warn!(job = %job.name, destinations = %job.destinations(), deadline = job.deadline,
                       "a measurement is past its deadline without a verdict");
        Some(late)
    }

    pub(super) async fn status_with(
        &self,
        job: &JobRef,
        secrets: &Redactor,
        cached: bool,
    ) -> Verdict {
        let states: Vec<(DestState, BTreeMap<String, String>, bool)> = match &job.observe {
            // What the signed reference observes, never what the request's block says.
            Some(observe) => join_all(
                job.placements
                    .iter()
                    .map(|p| self.observe_placement(job, p, observe)),
            )
            .await
            .into_iter()
            .map(|o| (o.state, o.notes, o.seen))
            .collect(),
            None => join_all(
                job.placements
                    .iter()
                    .map(|p| self.placement_state(job, p, secrets, cached, None)),
            )
            .await
            .into_iter()
            .map(|s| (s, BTreeMap::new(), false))
            .collect(),
        };
        let statuses = job
            .placements
            .iter()
            .zip(states)
            .map(|(p, (state, notes, seen))| DestinationStatus {
                destination: p.destination.clone(),
                namespace: p.namespace.clone(),
                state,
                notes,
                seen,
            })
            .collect();
        finish(job, verdict::combine(job.require, statuses), secrets)
    }

    pub(super) fn ready(&self, destination: &str) -> Result<Arc<Destination>, DestState> {
        match self.inner.registry.get(destination) {
            Some(Entry::Ready(d)) => Ok(d),
            Some(Entry::Broken(b)) => Err(DestState::Error(format!(
                "destination is unusable: {}",
                b.error
            ))),
            Some(Entry::Agent(a)) => Err(DestState::Error(format!(
                "destination {} is reached through its agent, not directly",
                a.name
            ))),
            None => Err(DestState::Error(format!(
                "destination {destination:?} is no longer known (removed from {} or its Argo CD \
                 cluster Secret was deleted)",
                self.inner.origin
            ))),
        }
    }

    /// The state of the measurement's Job on one destination, read only from a Job that is ours
    /// (labels and mark). The agent calls this for its own cluster with `ours`, the marked spec
    /// the server sent, to compare the Job with (it holds no key to verify the mark).
    pub async fn placement_state(
        &self,
        job: &JobRef,
        p: &Placement,
        secrets: &Redactor,
        cached: bool,
        ours: Option<&serde_json::Value>,
    ) -> DestState {
        if let Some(Entry::Agent(a)) = self.inner.registry.get(&p.destination) {
            return self.agent_state(&a, job, p).await;
        }
        let d = match self.ready(&p.destination) {
            Ok(d) => d,
            Err(s) => return s,
        };
        let hit = if cached {
            self.cached(&d, &p.namespace, &job.name).await
        } else {
            None
        };
        let from_cache = hit.is_some();
        let (obj, mut pods) = match hit {
            Some(x) => x,
            None => match self.fetch(&d, &p.namespace, &job.name).await {
                Ok(Some(x)) => x,
                Ok(None) => {
                    return DestState::Error(format!(
                        "job {}/{} does not exist (deleted by terminate, garbage collection or a person)",
                        p.namespace, job.name
                    ))
                }
                Err(s) => return s,
            },
        };
        // The name is predictable and the labels are public: read the verdict of our Job only.
        if let Err(why) = self.is_ours(&obj, &job.run_uid, ours) {
            return DestState::Error(format!(
                "job {}/{} is not ours: {why}; it is left alone and its result is not used",
                p.namespace, job.name
            ));
        }
        let graces = Graces {
            start: self.inner.settings.start_grace,
            scheduling: self.inner.settings.scheduling_grace,
        };
        match verdict::observe(&obj, &pods, graces, Timestamp::now()) {
            Observed::Running(detail) => DestState::Running(detail),
            Observed::Succeeded => DestState::Succeeded,
            Observed::ImagePull {
                pod,
                container,
                reason,
                message,
            } => DestState::ImagePull {
                pod,
                container,
                reason,
                message,
            },
            // A pod that cannot start or be scheduled: its Job stays, like one that cannot
            // pull its image (a repeated status gives the same verdict); the sweep deletes it
            // once its run has completed (`engine/sweep.rs`, `RunCompleted`).
            Observed::Error(line) => DestState::Error(line),
            Observed::CrashLoop {
                pod,
                container,
                message,
                restarts,
            } => {
                let failed = logs::crashed_container(&pods, &pod, &container);
                let what = match &failed {
                    Some(f) => f.describe(),
                    None => format!("container {container:?} failed"),
                };
                let mut detail = format!(
                    "pod {pod} {what} and is restarted with back-off ({restarts} restart{})",
                    if restarts == 1 { "" } else { "s" }
                );
                if !message.is_empty() {
                    detail = format!("{detail}: {message}");
                }
                let log = match &failed {
                    Some(f) => self.inner.tails.tail(&d, f, job.log_tail, secrets).await,
                    None => None,
                };
                DestState::Failed {
                    reason: verdict::CRASH_LOOP.to_string(),
                    detail,
                    log,
                }
            }
            Observed::Failed { reason, message } => {
                let mut failed = logs::failed_container(&pods);
                if failed.is_none() && from_cache && reason != "DeadlineExceeded" {
                    // The Job and Pod watches are separate streams: the Job's Failed condition
                    // can arrive before the terminated Pod. The verdict is final, so ask once.
                    if let Ok(Some((_, fresh))) = self.fetch(&d, &p.namespace, &job.name).await {
                        pods = fresh;
                        failed = logs::failed_container(&pods);
                    }
                }
                let mut detail = message;
                if reason == "DeadlineExceeded" {
                    if let Some(s) = obj.spec.as_ref().and_then(|s| s.active_deadline_seconds) {
                        detail = format!("{detail} (activeDeadline {s}s)");
                    }
                }
                if let Some(f) = &failed {
                    detail = format!("{detail}; {}", f.describe());
                }
                let log = match &failed {
                    Some(f) => self.inner.tails.tail(&d, f, job.log_tail, secrets).await,
                    None => None,
                };
                DestState::Failed {
                    reason,
                    detail,
                    log,
                }
            }
        }
    }

    /// The Job and its Pods from the caches, when they are authoritative and hold the Job.
    pub(super) async fn cached(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Option<(Arc<Job>, Vec<Arc<Pod>>)> {
        if !d.watches(namespace) {
            // A destination limited to namespaces does not watch this one (a reference signed
            // before the limit): its caches know nothing there, ask the API server.
            return None;
        }
        if !d.jobs().is_ready() || !d.pods().is_ready() {
            // Only while the first list is on its way; a failing watch does not make us wait.
            if d.jobs().failing_for().is_none() {
                d.wait_synced(self.inner.settings.cache_wait).await;
            }
        }
        if !d.is_authoritative() {
            return None;
        }
        let obj = d.jobs().get(namespace, name)?;
        Some((obj, d.pods_of(namespace, name)))
    }

    /// The Job and its Pods from the API server (`Ok(None)`: no such Job).
    pub(super) async fn fetch(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(Arc<Job>, Vec<Arc<Pod>>)>, DestState> {
        let timeout = self.inner.settings.request_timeout;
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
        let what = format!("read job {namespace}/{name}");
        let obj = match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
            Ok(Ok(Some(j))) => j,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return Err(with_cache_problem(d, api_failure(d, &what, &e))),
            Err(_) => return Err(with_cache_problem(d, no_answer(d, &what, timeout))),
        };
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(d.client().clone(), namespace);
        let params =
            ListParams::default().labels(&format!("batch.kubernetes.io/controller-uid={uid}"));
        let what = format!("list pods of job {namespace}/{name}");
        let list = match tokio::time::timeout(timeout, pods.list(&params)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(api_failure(d, &what, &e)),
            Err(_) => return Err(no_answer(d, &what, timeout)),
        };
        Ok(Some((
            Arc::new(obj),
            list.items.into_iter().map(Arc::new).collect(),
        )))
    }
}
