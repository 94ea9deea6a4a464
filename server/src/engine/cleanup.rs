//! Cleanup: `terminate` (foreground delete on every placement) and `gc` (keep the newest Jobs
//! of a run on its placements); the sweep of what nobody else removes is in `sweep`.

use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};

use super::{
    api_failure, no_answer, ControlPlaneError, Engine, GcReport, JobRef, Placement, TerminateReport,
};
use crate::destinations::{Destination, Entry};
use crate::job::{
    self, Ownership, ANN_MEASUREMENT, ANN_METRIC, LABEL_ARGO_RUN_UID, LABEL_RUN_UID,
    MANAGED_SELECTOR,
};
use crate::store;
use crate::verdict::{DestState, Verdict};

/// Why Jobs (or agent records) could not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// the destination cannot be reached or answered an error; the state says which and how
    #[error("{}", .0.summary())]
    Destination(DestState),
    /// the Job is not ours (another run's, or a person's): it is never deleted
    #[error("refusing to delete job {namespace}/{name}: {why}")]
    Foreign {
        /// the Job's namespace
        namespace: String,
        /// the Job's name
        name: String,
        /// whose it is
        why: String,
    },
    /// the agent store refused the delete request
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// several deletes failed
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Several(Vec<CleanupError>),
    /// the control plane is needed (orphan sweep) and cannot be reached
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    /// the orphan sweep may not (or cannot) list AnalysisRuns
    #[error(
        "cannot list analysisruns on the control plane: {0} (the server needs list on \
         analysisruns.argoproj.io to sweep orphans)"
    )]
    ListRuns(String),
    /// listing AnalysisRuns took longer than the request timeout
    #[error("listing analysisruns timed out")]
    ListRunsTimeout,
}

impl Engine {
    /// Deletes the measurement's Jobs (foreground: their Pods go first) on every destination.
    /// Only Jobs of this run created by us are deleted. A direct destination that cannot
    /// delete now (unreachable, failing) gets a pending deletion that the server retries until
    /// the Job is gone (`engine/pending.rs`), so the caller can answer at once.
    #[tracing::instrument(name = "terminate", skip_all, fields(job = %job.name, destinations = %job.destinations()))]
    pub async fn terminate(&self, job: &JobRef) -> TerminateReport {
        let results = join_all(job.placements.iter().map(|p| self.delete_one(job, p))).await;
        let mut report = TerminateReport::default();
        for (p, r) in job.placements.iter().zip(results) {
            let agent = matches!(
                self.inner.registry.get(&p.destination),
                Some(Entry::Agent(_))
            );
            match r {
                Ok(true) => report.deleted.push(p.destination.clone()),
                Ok(false) => report.absent.push(p.destination.clone()),
                Err(e @ CleanupError::Destination(_)) if !agent => {
                    match self.defer_deletion(job, p).await {
                        Ok(()) => report.pending.push((p.destination.clone(), e.to_string())),
                        Err(store) => report.failed.push((
                            p.destination.clone(),
                            format!("{e}; and it cannot be kept pending: {store}"),
                        )),
                    }
                }
                Err(e) => report.failed.push((p.destination.clone(), e.to_string())),
            }
        }
        tracing::info!(job = %job.name, deleted = ?report.deleted, absent = ?report.absent,
                       pending = ?report.pending, failed = ?report.failed, "terminate");
        report
    }

    /// Once `verdict` is decided, deletes the Jobs of the destinations still running: they can
    /// no longer change it (`require: all` with one destination Failed, `any` with one
    /// Succeeded), and would otherwise run to their own deadline. The decided destinations'
    /// Jobs stay, so a repeated status (a reply lost on the way) gives the same verdict.
    /// Returns the destinations whose Job was deleted.
    pub async fn stop_undecided(&self, job: &JobRef, verdict: &Verdict) -> Vec<String> {
        if verdict.phase == crate::verdict::Phase::Running || verdict.retryable {
            return Vec::new();
        }
        let running: Vec<&Placement> = job
            .placements
            .iter()
            .filter(|p| {
                verdict.destinations.iter().any(|s| {
                    s.destination == p.destination && matches!(s.state, DestState::Running(_))
                })
            })
            .collect();
        let results = join_all(running.iter().map(|p| self.delete_one(job, p))).await;
        let mut stopped = Vec::new();
        for (p, r) in running.iter().zip(results) {
            match r {
                Ok(true) => stopped.push(p.destination.clone()),
                Ok(false) => {}
                // Best effort: the Job's own activeDeadline, its TTL and the sweep remain.
                Err(e) => tracing::warn!(job = %job.name, destination = %p.destination, error = %e,
                                         "cannot stop a job the verdict no longer needs"),
            }
        }
        if !stopped.is_empty() {
            tracing::info!(job = %job.name, phase = ?verdict.phase, stopped = ?stopped,
                           "the verdict is decided: jobs still running were deleted");
        }
        stopped
    }

    /// Deletes the measurement's Job on one destination; `Ok(false)`: none of ours was there.
    /// The agent calls this for its own cluster.
    pub async fn delete_one(&self, job: &JobRef, p: &Placement) -> Result<bool, CleanupError> {
        if let Some(Entry::Agent(a)) = self.inner.registry.get(&p.destination) {
            return self.agent_delete(&a, job, p).await;
        }
        if job.observe.is_some() {
            // An observe check created nothing on a direct destination (nor does the agent in
            // its cluster): no call is made, and the observed Rollout or Application is never
            // anyone's to delete here.
            return Ok(false);
        }
        let d = self
            .ready(&p.destination)
            .map_err(CleanupError::Destination)?;
        let existing = match self.cached(&d, &p.namespace, &job.name).await {
            Some((j, _)) => Some(j),
            None => self
                .fetch_job(&d, &p.namespace, &job.name)
                .await?
                .map(Arc::new),
        };
        let Some(existing) = existing else {
            return Ok(false);
        };
        self.delete_job(&d, &existing, &job.run_uid).await
    }

    pub(super) async fn fetch_job(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Job>, CleanupError> {
        let timeout = self.inner.settings.request_timeout;
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
        let what = format!("read job {namespace}/{name}");
        match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
            Ok(Ok(j)) => Ok(j),
            Ok(Err(e)) => Err(CleanupError::Destination(api_failure(d, &what, &e))),
            Err(_) => Err(CleanupError::Destination(no_answer(d, &what, timeout))),
        }
    }

    /// Foreground delete with a UID precondition; `Ok(false)`: already gone.
    pub(super) async fn delete_job(
        &self,
        d: &Destination,
        obj: &Job,
        run_uid: &str,
    ) -> Result<bool, CleanupError> {
        let namespace = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        if let Ownership::Foreign(why) = job::ownership(obj, run_uid) {
            return Err(CleanupError::Foreign {
                namespace,
                name,
                why,
            });
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: obj.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::foreground()
        };
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), &namespace);
        let timeout = self.inner.settings.request_timeout;
        let what = format!("delete job {namespace}/{name}");
        match tokio::time::timeout(timeout, jobs.delete(&name, &params)).await {
            Ok(Ok(_)) => Ok(true),
            // Gone, or replaced by another object of that name: nothing of ours to delete.
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Ok(false),
            Ok(Err(e)) => Err(CleanupError::Destination(api_failure(d, &what, &e))),
            Err(_) => Err(CleanupError::Destination(no_answer(d, &what, timeout))),
        }
    }

    /// Keeps the newest `limit` Jobs of run `run_uid` on each of `placements` (the run's own,
    /// resolved from its block with the policy applied) and deletes the older ones: of one
    /// metric, or (`metric: None`) of all metrics together, like Argo's built-in provider. No
    /// other destination or namespace is listed or touched.
    #[tracing::instrument(name = "gc", skip(self, placements), fields(placements = placements.len()))]
    pub async fn gc(
        &self,
        run_uid: &str,
        metric: Option<&str>,
        placements: &[Placement],
        limit: usize,
    ) -> GcReport {
        let mut direct: Vec<(Arc<Destination>, Option<String>)> = Vec::new();
        for p in placements {
            if let Some(Entry::Ready(d)) = self.inner.registry.get(&p.destination) {
                if !direct
                    .iter()
                    .any(|(x, ns)| x.name == d.name && ns.as_deref() == Some(&p.namespace))
                {
                    direct.push((d, Some(p.namespace.clone())));
                }
            }
        }
        self.gc_on(run_uid, metric, direct, Some(placements), limit)
            .await
    }

    /// [`Engine::gc`] on every destination of the registry and every agent record of the run:
    /// for tools and tests that know no placements. The API never calls it: a caller could
    /// otherwise reach destinations its project may not use.
    #[tracing::instrument(name = "gc_everywhere", skip(self))]
    pub async fn gc_everywhere(
        &self,
        run_uid: &str,
        metric: Option<&str>,
        limit: usize,
    ) -> GcReport {
        let direct = self
            .inner
            .registry
            .entries()
            .into_iter()
            .flat_map(|e| match e {
                // Limited to namespaces: each of them, as its credentials may list no other.
                Entry::Ready(d) => match d.namespaces.clone() {
                    Some(list) => list.into_iter().map(|ns| (d.clone(), Some(ns))).collect(),
                    None => vec![(d, None)],
                },
                Entry::Broken(_) | Entry::Agent(_) => Vec::new(),
            })
            .collect();
        self.gc_on(run_uid, metric, direct, None, limit).await
    }

    /// GC on `direct` destinations (each in one namespace, or all), and on the agent records of
    /// `placements` (`None`: every record of the run).
    async fn gc_on(
        &self,
        run_uid: &str,
        metric: Option<&str>,
        direct: Vec<(Arc<Destination>, Option<String>)>,
        placements: Option<&[Placement]>,
        limit: usize,
    ) -> GcReport {
        let results = join_all(
            direct
                .iter()
                .map(|(d, ns)| self.gc_one(d, ns.as_deref(), run_uid, metric, limit)),
        )
        .await;
        let (agent_deleted, agent_failed) =
            self.gc_agents(run_uid, metric, placements, limit).await;
        let mut report = GcReport {
            deleted: agent_deleted,
            failed: agent_failed,
        };
        for ((d, _), r) in direct.iter().zip(results) {
            match r {
                Ok(deleted) => report
                    .deleted
                    .extend(deleted.into_iter().map(|j| (d.name.clone(), j))),
                Err(e) => report.failed.push((d.name.clone(), e.to_string())),
            }
        }
        if !report.deleted.is_empty() || !report.failed.is_empty() {
            tracing::info!(run_uid, limit, deleted = ?report.deleted, failed = ?report.failed, "gc");
        }
        report
    }

    /// GC on one destination, in `namespace` only when given.
    pub(super) async fn gc_one(
        &self,
        d: &Destination,
        namespace: Option<&str>,
        run_uid: &str,
        metric: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, CleanupError> {
        let mut jobs: Vec<Arc<Job>> = if d.jobs().is_authoritative() {
            d.jobs().group(run_uid)
        } else {
            let api: Api<Job> = match namespace {
                Some(ns) => Api::namespaced(d.client().clone(), ns),
                None => Api::all(d.client().clone()),
            };
            let timeout = self.inner.settings.request_timeout;
            let mut found: Vec<Arc<Job>> = Vec::new();
            // Our label, then Argo's for Jobs created before ours (`job::run_uid_of`).
            for key in [LABEL_RUN_UID, LABEL_ARGO_RUN_UID] {
                let params =
                    ListParams::default().labels(&format!("{key}={run_uid},{MANAGED_SELECTOR}"));
                let items = match tokio::time::timeout(timeout, api.list(&params)).await {
                    Ok(Ok(l)) => l.items,
                    Ok(Err(e)) => {
                        return Err(CleanupError::Destination(api_failure(d, "list jobs", &e)))
                    }
                    Err(_) => {
                        return Err(CleanupError::Destination(no_answer(
                            d,
                            "list jobs",
                            timeout,
                        )))
                    }
                };
                for j in items {
                    if !found.iter().any(|f| f.metadata.uid == j.metadata.uid) {
                        found.push(Arc::new(j));
                    }
                }
            }
            found
        };
        jobs.retain(|j| {
            let in_namespace =
                namespace.is_none_or(|ns| j.metadata.namespace.as_deref() == Some(ns));
            let of_metric = metric.is_none_or(|m| {
                j.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_METRIC))
                    .is_some_and(|v| v == m)
            });
            in_namespace
                && of_metric
                && j.metadata.deletion_timestamp.is_none()
                && job::ownership(j, run_uid) == Ownership::Ours
        });
        if jobs.len() <= limit {
            return Ok(Vec::new());
        }
        let measurement = |j: &Job| {
            j.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_MEASUREMENT))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Oldest first; creation timestamps have 1 s resolution, the measurement index breaks ties.
        jobs.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
                .then_with(|| measurement(a).cmp(&measurement(b)))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        let excess = jobs.len() - limit;
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for j in &jobs[..excess] {
            match self.delete_job(d, j, run_uid).await {
                Ok(true) => deleted.push(format!(
                    "{}/{}",
                    j.metadata.namespace.as_deref().unwrap_or_default(),
                    j.metadata.name.as_deref().unwrap_or_default()
                )),
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(deleted)
        } else {
            Err(CleanupError::Several(errors))
        }
    }
}

/// The `n` of a Job name `<uid>.<metric>.<n>` (0 when it has none).
pub(super) fn measurement_of(job_name: &str) -> u32 {
    job_name
        .rsplit('.')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
