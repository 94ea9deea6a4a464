//! The sweep: deletes our Jobs (and asks agents to delete theirs) that nothing else removes —
//! Jobs of AnalysisRuns that no longer exist (Argo calls `GarbageCollect` only for runs that
//! exist, and a Job off the run's cluster has no owner reference), and Jobs of runs that
//! completed longer ago than `jobs.retention` (a Job that never finished has no TTL to run out,
//! and Argo keeps the newest Jobs of a run forever), and at once the Jobs still running of runs
//! that completed (nothing reads them again: a Terminate that never reached the server).
//!
//! Only Jobs carrying this server's adoption mark (`job::mark`) are swept: another control
//! plane's server sharing a destination marks its Jobs with its own key, and its runs are not
//! on our control plane, so without the mark its live Jobs would look like orphans.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DynamicObject, ListParams};

use super::{CleanupError, Engine};
use crate::destinations::{self, client, Destination, Entry};
use crate::job;
use crate::runs::{RunState, Runs};
use crate::store;

/// Why the sweep deleted a Job: the `reason` label of `rollouts_dispatch_jobs_swept_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SweepReason {
    /// its AnalysisRun no longer exists on the control plane
    DeletedRun,
    /// its AnalysisRun completed longer ago than `jobs.retention`
    Retention,
    /// its AnalysisRun completed while the Job still runs: nothing will read it again (a
    /// Terminate that never reached the server, or a server restarted with in-memory pending
    /// deletions)
    RunCompleted,
    /// its agent record's final state was observed longer ago than the records' retention
    /// (`Engine::expire_records`, needs no control plane)
    RecordRetention,
    /// an agent record of the Application routes (read, sync) nobody asked for in
    /// `applications::APP_RECORD_IDLE` (`Applications::expire_idle`)
    ApplicationIdle,
}

impl SweepReason {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::DeletedRun => "deleted_run",
            Self::Retention => "retention",
            Self::RunCompleted => "run_completed",
            Self::RecordRetention => "record_retention",
            Self::ApplicationIdle => "application_idle",
        }
    }
}

/// The result of [`Engine::sweep_orphans`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// `(destination, namespace/name, why)` of each Job deleted (on an agent destination: whose
    /// deletion was asked of the agent)
    pub deleted: Vec<(String, String, SweepReason)>,
    /// `(destination, why)` of each deletion that failed
    pub failed: Vec<(String, String)>,
}

/// AnalysisRuns listed per request: bounds the memory of one sweep. Each run of a page is
/// parsed whole (a `DynamicObject` with its spec and status, tens of KiB once parsed), and the
/// allocator keeps the peak: with pages of 500, each server replica's resident memory grew by
/// 28 MiB over `make soak`'s 500 kept runs; with pages of 50, by 3 MiB. A sweep of 500 runs
/// then takes 10 requests, when it lists at all (`Engine::sweep_orphans_with` reads the runs'
/// watch while that holds every Job's run).
pub const RUNS_PAGE: u32 = 50;

impl Engine {
    /// Deletes the Jobs (and asks agents to delete the Jobs) of AnalysisRuns that no longer exist
    /// on the control plane, and of runs completed longer ago than `jobs.retention`; see the
    /// module documentation.
    ///
    /// The Jobs and records are snapshotted *before* the runs are listed: a Job exists only after
    /// its run, so a Job in the snapshot whose run is missing from the later list is an orphan —
    /// never a Job of a run created in between. Only Jobs of ours (labels, run UID, our mark)
    /// are deleted.
    pub async fn sweep_orphans(&self) -> Result<SweepReport, CleanupError> {
        self.sweep_orphans_with(None).await
    }

    /// [`Engine::sweep_orphans`], reading the runs' states from `runs`' watch when it is
    /// authoritative and holds the run of every Job and record snapshotted; else (no watch, a
    /// relist under way, a run it does not hold) listing them. A run missing from the watch
    /// may be one created a moment ago that the watch has not delivered yet (another replica
    /// made its Job), so only a list, read after the snapshot, may call a Job an orphan. With
    /// the watch, a sweep costs the control plane nothing while every Job has its run: at the
    /// soak's 3 000 kept runs, listing cost each replica 60 requests and ~29 MB parsed a pass.
    #[tracing::instrument(name = "sweep_orphans", skip_all, fields(from_watch = runs.is_some()))]
    pub async fn sweep_orphans_with(
        &self,
        runs: Option<&Runs>,
    ) -> Result<SweepReport, CleanupError> {
        let direct: Vec<(Arc<Destination>, Vec<Arc<Job>>)> = self
            .inner
            .registry
            .entries()
            .into_iter()
            .filter_map(|e| match e {
                // A cache that is not authoritative may miss Jobs; the next sweep gets them.
                Entry::Ready(d) if d.jobs().is_authoritative() => {
                    let jobs = d.jobs().all();
                    Some((d, jobs))
                }
                _ => None,
            })
            .collect();
        let records = self
            .inner
            .store
            .as_ref()
            .map(|s| s.all())
            .unwrap_or_default();
        let held = runs
            .and_then(Runs::states)
            .filter(|states| self.holds_every_run(states, &direct, &records));
        let runs = match held {
            Some(states) => states,
            None => self.list_runs().await?,
        };
        let retention =
            SignedDuration::try_from(self.inner.jobs.retention).unwrap_or(SignedDuration::MAX);
        let cutoff = Timestamp::now()
            .checked_sub(retention)
            .unwrap_or(Timestamp::MIN);
        // `since`: when the run completed (else when the Job was created); `active`: the Job
        // has not finished.
        let reason = |uid: &str, since: Option<Timestamp>, active: bool| match runs.get(uid) {
            None => Some(SweepReason::DeletedRun),
            Some(RunState::Running) => None,
            Some(RunState::Completed(_)) if active => Some(SweepReason::RunCompleted),
            Some(RunState::Completed(at)) => at
                .or(since)
                .is_some_and(|t| t < cutoff)
                .then_some(SweepReason::Retention),
        };
        let mut report = SweepReport::default();
        for (d, jobs) in direct {
            for j in jobs {
                let Some(uid) = destinations::job_group(&j) else {
                    continue;
                };
                if j.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let created = j.metadata.creation_timestamp.as_ref().map(|t| t.0);
                let Some(why) = reason(&uid, created, !job::lifecycle::has_ended(&j)) else {
                    continue;
                };
                if !self.marked_by_us(&d, &j, &uid) {
                    continue;
                }
                let what = format!(
                    "{}/{}",
                    j.metadata.namespace.as_deref().unwrap_or_default(),
                    j.metadata.name.as_deref().unwrap_or_default()
                );
                match self.delete_job(&d, &j, &uid).await {
                    Ok(true) => report.deleted.push((d.name.clone(), what, why)),
                    Ok(false) => {}
                    Err(e) => report.failed.push((d.name.clone(), e.to_string())),
                }
            }
        }
        if let Some(store) = &self.inner.store {
            for r in records {
                // The Application routes' records belong to no run (`Applications::expire_idle`).
                if r.spec.delete || store::is_application_record(&r.spec) {
                    continue;
                }
                let active = r
                    .status
                    .as_ref()
                    .and_then(|s| s.state.as_ref())
                    .is_none_or(|s| !s.is_final());
                let Some(why) = reason(&r.spec.run_uid, None, active) else {
                    continue;
                };
                match store.request_delete(&r.name).await {
                    Ok(()) => report.deleted.push((
                        r.spec.destination.clone(),
                        format!("{}/{}", r.spec.namespace, r.spec.job_name),
                        why,
                    )),
                    Err(store::StoreError::NotFound(_)) => {}
                    Err(e) => report
                        .failed
                        .push((r.spec.destination.clone(), e.to_string())),
                }
            }
        }
        if !report.deleted.is_empty() || !report.failed.is_empty() {
            tracing::info!(deleted = ?report.deleted, failed = ?report.failed,
                           retention_s = self.inner.jobs.retention.as_secs(),
                           "sweep: Jobs of AnalysisRuns deleted, or completed before the retention");
        }
        Ok(report)
    }

    /// Whether `states` (the runs' watch) holds the run of every Job and record the sweep
    /// would judge: those it skips anyway (being deleted, another server's Jobs, delete-only
    /// and Application records) need no list, or a destination shared with another control
    /// plane's server would make every sweep list.
    fn holds_every_run(
        &self,
        states: &HashMap<String, RunState>,
        direct: &[(Arc<Destination>, Vec<Arc<Job>>)],
        records: &[store::DispatchJob],
    ) -> bool {
        let jobs_held = direct.iter().all(|(d, jobs)| {
            jobs.iter().all(|j| {
                let Some(uid) = destinations::job_group(j) else {
                    return true;
                };
                states.contains_key(&uid)
                    || j.metadata.deletion_timestamp.is_some()
                    || !self.marked_by_us(d, j, &uid)
            })
        });
        jobs_held
            && records.iter().all(|r| {
                r.spec.delete
                    || store::is_application_record(&r.spec)
                    || states.contains_key(&r.spec.run_uid)
            })
    }

    /// Whether Job `j` of run `uid` on `d` carries this server's adoption mark (`job::mark`).
    fn marked_by_us(&self, d: &Destination, j: &Job, uid: &str) -> bool {
        let value = serde_json::to_value(j).unwrap_or_default();
        match job::mark::verify(&value, self.marker(), uid) {
            Ok(_) => true,
            Err(mismatch) => {
                tracing::debug!(destination = %d.name, job = ?j.metadata.name, %mismatch,
                                "not swept: not marked by this server");
                false
            }
        }
    }

    /// Every AnalysisRun on the control plane by UID, page by page.
    async fn list_runs(&self) -> Result<HashMap<String, RunState>, CleanupError> {
        let cp = self.control_plane().await?;
        let api: Api<DynamicObject> = Api::all_with(cp, &crate::runs::resource());
        let timeout = self.inner.settings.request_timeout;
        let mut runs = HashMap::new();
        let mut params = ListParams::default().limit(RUNS_PAGE);
        loop {
            let page = match tokio::time::timeout(timeout, api.list(&params)).await {
                Ok(Ok(page)) => page,
                Ok(Err(e)) => return Err(CleanupError::ListRuns(client::describe(&e))),
                Err(_) => return Err(CleanupError::ListRunsTimeout),
            };
            for r in page.items {
                let Some(uid) = r.metadata.uid.clone() else {
                    continue;
                };
                runs.insert(uid, RunState::of(&r));
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => return Ok(runs),
            }
        }
    }
}
