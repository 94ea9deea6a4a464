//! Expiry of agent records: a record whose final state (succeeded, failed, a permanent error)
//! was observed longer ago than the records' retention gets a delete request, so the agent
//! deletes its Job, reports `deleted`, and the server removes the record. It needs no control
//! plane (unlike the orphan sweep, `sweep.rs`), so a server with only agents keeps its store and
//! the agents' 500 ms loops bounded (issue #15 items 6 and 8).
//!
//! Safety: a status call for a measurement whose records are missing writes them again from the
//! request's block (the in-memory store of a restarted server, `Engine::agent_records_missing`),
//! which would make the agent create the Job again. So the records are kept at least the longest
//! deadline a measurement can have (`engine.maxMeasurementDeadline` + `engine.deadlineGrace`)
//! after their final state was seen, and lost records are written again only for a reference
//! whose deadline has not passed ([`Engine::agent_records_to_rewrite`]): an expired record
//! always belongs to a measurement past its deadline, whose records are never written again.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::{Engine, JobRef, SweepReason, SweepReport};
use crate::store;
use crate::store::DispatchJob;
use crate::verdict::DestState;

impl Engine {
    /// How long a record's final state is kept: `jobs.retention`, and never less than the
    /// longest deadline of a measurement (see the module documentation).
    pub fn record_retention(&self) -> Duration {
        let s = &self.inner.settings;
        self.inner
            .jobs
            .retention
            .max(s.max_measurement_deadline + s.deadline_grace)
    }

    /// Asks the agents to delete the Jobs of the records whose final state was observed
    /// longer ago than [`Engine::record_retention`]; each is reported with
    /// [`SweepReason::RecordRetention`]. Without agents, nothing to do.
    #[tracing::instrument(name = "expire_records", skip_all)]
    pub async fn expire_records(&self) -> SweepReport {
        let mut report = SweepReport::default();
        let Some(store) = &self.inner.store else {
            return report;
        };
        let keep = self.record_retention();
        let cutoff = SignedDuration::try_from(keep)
            .ok()
            .and_then(|keep| Timestamp::now().checked_sub(keep).ok())
            .unwrap_or(Timestamp::MIN);
        for r in store.all() {
            if r.spec.delete
                || store::is_application_record(&r.spec)
                || !observed_final_before(&r, cutoff)
            {
                continue;
            }
            match store.request_delete(&r.name).await {
                Ok(()) => report.deleted.push((
                    r.spec.destination.clone(),
                    format!("{}/{}", r.spec.namespace, r.spec.job_name),
                    SweepReason::RecordRetention,
                )),
                Err(store::StoreError::NotFound(_)) => {}
                Err(e) => report
                    .failed
                    .push((r.spec.destination.clone(), e.to_string())),
            }
        }
        if !report.deleted.is_empty() || !report.failed.is_empty() {
            tracing::info!(deleted = ?report.deleted, failed = ?report.failed, retention_s = keep.as_secs(),
                           "agent records finished before the retention: their Jobs are to be deleted");
        }
        report
    }

    /// Whether a status call for `job` writes its missing agent records again from the request's
    /// block: some are missing and the reference's deadline has not passed. A reference without
    /// a deadline (from before deadlines, or located without one) never does: its measurement's
    /// records may have expired, and writing them again would create its Job again.
    pub fn agent_records_to_rewrite(&self, job: &JobRef) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // An observe record needs no spec from the request: `agent_state` writes it again from
        // the signed reference, whereas the request's block could name another object.
        job.observe.is_none()
            && job.deadline != 0
            && now < job.deadline
            && self.agent_records_missing(job)
    }
}

/// Whether `r`'s agent reported a final state, observed before `cutoff`.
fn observed_final_before(r: &DispatchJob, cutoff: Timestamp) -> bool {
    r.status.as_ref().is_some_and(|s| {
        s.state.as_ref().is_some_and(DestState::is_final)
            && s.observed_at
                .parse::<Timestamp>()
                .is_ok_and(|at| at < cutoff)
    })
}

#[cfg(test)]
mod tests {
    use super::{observed_final_before, Timestamp};
    use crate::store::{DispatchJob, DispatchJobSpec};
    use crate::verdict::DestState;

    use crate::store::DispatchJobStatus;

    fn record(state: Option<DestState>, observed_at: &str) -> DispatchJob {
        DispatchJob {
            name: "j.1".into(),
            spec: DispatchJobSpec {
                destination: "edge".into(),
                namespace: "verify".into(),
                job_name: "j".into(),
                run_uid: "u".into(),
                run: "p/r".into(),
                metric: "m".into(),
                measurement: 1,
                log_tail: 0,
                job: None,
                delete: false,
                observe: None,
                sync: None,
                for_stage: None,
            },
            status: Some(DispatchJobStatus {
                observed_at: observed_at.into(),
                ..DispatchJobStatus::observed(state, "agent")
            }),
            resource_version: None,
        }
    }

    #[test]
    fn only_final_states_seen_before_the_cutoff_expire() {
        let cutoff: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let old = "2026-01-01T00:00:00Z";
        assert!(observed_final_before(
            &record(Some(DestState::Succeeded), old),
            cutoff
        ));
        assert!(observed_final_before(
            &record(Some(DestState::Error("refused".into())), old),
            cutoff
        ));
        assert!(!observed_final_before(
            &record(Some(DestState::Succeeded), "2026-01-03T00:00:00Z"),
            cutoff
        ));
        assert!(!observed_final_before(
            &record(Some(DestState::Running(None)), old),
            cutoff
        ));
        assert!(!observed_final_before(
            &record(Some(DestState::Unavailable("503".into())), old),
            cutoff
        ));
        assert!(!observed_final_before(
            &record(Some(DestState::Succeeded), "not a time"),
            cutoff
        ));
        let mut unreported = record(None, old);
        unreported.status = None;
        assert!(!observed_final_before(&unreported, cutoff));
    }
}
