//! Pending deletions: the Jobs `terminate` could not delete yet (their destination unreachable or
//! failing), kept until they are gone.
//!
//! Argo completes a terminated run whatever Terminate answers and never calls the plugin for it
//! again (argo-rollouts analysis/analysis.go:350-356, then `assessMetricStatus` while
//! terminating, :579-590), so a deletion that failed once would never be asked for again and the
//! Job would run to its own deadline. Instead, `terminate` answers at once and writes a
//! delete-only [`DispatchJob`] record for each such destination; `serve` retries them
//! ([`Engine::retry_pending_deletions`]) until the Job is gone. The records live in the agent
//! store when the server has one (`agents.store: kubernetes`: any replica retries them and a
//! restart keeps them), else in this process's memory (the sweep's `run_completed` reason is the
//! backstop after a restart). Agent destinations need nothing new: their records already carry
//! the delete request until the agent confirms it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::cleanup::measurement_of;
use super::{CleanupError, Engine, JobRef, Placement};
use crate::destinations::Entry;
use crate::store::{self, Created, DispatchJob, DispatchJobSpec, Store};

/// What one pass of [`Engine::retry_pending_deletions`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingReport {
    /// `(destination, namespace/name)` of the Jobs deleted (or found gone) in this pass
    pub done: Vec<(String, String)>,
    /// `(destination, why)` of the deletions still pending after this pass
    pub still_pending: Vec<(String, String)>,
    /// per registered destination (direct and agent), the deletions not confirmed yet after
    /// this pass (0 for the others)
    pub pending: BTreeMap<String, usize>,
}

impl Engine {
    /// Where pending deletions of direct destinations are kept: the agent store when there is
    /// one, else this process's own.
    pub(super) fn deletions(&self) -> &Arc<Store> {
        &self.inner.deletions
    }

    /// Keeps the deletion of `job`'s Job on direct destination `p` pending: a delete-only
    /// record that [`Engine::retry_pending_deletions`] works on until the Job is gone.
    pub(super) async fn defer_deletion(
        &self,
        job: &JobRef,
        p: &Placement,
    ) -> Result<(), store::StoreError> {
        let record = DispatchJob {
            name: store::record_name(&job.name, &p.destination),
            spec: DispatchJobSpec {
                destination: p.destination.clone(),
                namespace: p.namespace.clone(),
                job_name: job.name.clone(),
                run_uid: job.run_uid.clone(),
                run: format!("{}/{}", job.run_namespace, job.run_name),
                metric: job.metric.clone(),
                measurement: measurement_of(&job.name),
                log_tail: job.log_tail,
                job: None,
                delete: true,
                observe: None,
                sync: None,
                for_stage: None,
            },
            status: None,
            resource_version: None,
        };
        let store = self.deletions();
        match store.create(record).await? {
            Created::New => Ok(()),
            Created::Existing(r) if r.spec.delete => Ok(()),
            Created::Existing(r) => store.request_delete(&r.name).await,
        }
    }

    /// Tries every pending deletion of a direct destination once: a Job deleted (or already
    /// gone) drops its record; a destination still failing keeps it for the next pass. Only
    /// Jobs of the record's run that are ours are deleted (`delete_one`), so a record cannot be
    /// turned into a way to delete someone else's Job.
    #[tracing::instrument(name = "pending_deletions", skip_all)]
    pub async fn retry_pending_deletions(&self) -> PendingReport {
        let store = self.deletions();
        let mut report = PendingReport {
            pending: self
                .inner
                .registry
                .names()
                .into_iter()
                .map(|d| (d, 0))
                .collect(),
            ..PendingReport::default()
        };
        let mut direct = Vec::new();
        // Every 10 s: copy only the deletions, not every record with its Job spec.
        for r in store.deleting() {
            match self.inner.registry.get(&r.spec.destination) {
                // The agent confirms these; they are pending until it does.
                Some(Entry::Agent(_)) => {
                    if !r.status.as_ref().is_some_and(|s| s.deleted) {
                        *report
                            .pending
                            .entry(r.spec.destination.clone())
                            .or_default() += 1;
                    }
                }
                _ => direct.push(r),
            }
        }
        for r in direct {
            let job = JobRef::of_record(&r.spec, &r.spec.destination);
            let what = format!("{}/{}", r.spec.namespace, r.spec.job_name);
            let outcome = match self.inner.registry.get(&r.spec.destination) {
                // A destination removed from the registry (config, Argo CD Secret) can no
                // longer be reached by this server: nothing more it can do.
                None => {
                    tracing::warn!(destination = %r.spec.destination, job = %what,
                                   "pending deletion dropped: the destination is no longer registered");
                    Ok(false)
                }
                Some(_) => self.delete_one(&job, &job.placements[0]).await,
            };
            match outcome {
                Ok(_) => match store.remove(&r.name).await {
                    Ok(()) => report.done.push((r.spec.destination.clone(), what)),
                    Err(e) => {
                        report
                            .still_pending
                            .push((r.spec.destination.clone(), e.to_string()));
                        *report.pending.entry(r.spec.destination).or_default() += 1;
                    }
                },
                // Never ours to delete: keeping the record would retry a refusal forever.
                Err(e @ CleanupError::Foreign { .. }) => {
                    tracing::warn!(destination = %r.spec.destination, job = %what, error = %e,
                                   "pending deletion dropped");
                    let _ = store.remove(&r.name).await;
                }
                Err(e) => {
                    report
                        .still_pending
                        .push((r.spec.destination.clone(), e.to_string()));
                    *report.pending.entry(r.spec.destination).or_default() += 1;
                }
            }
        }
        if !report.done.is_empty() || !report.still_pending.is_empty() {
            tracing::info!(done = ?report.done, still_pending = ?report.still_pending,
                           "pending deletions retried");
        }
        report
    }
}
