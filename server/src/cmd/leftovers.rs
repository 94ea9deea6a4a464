//! What `doctor` says of the Jobs left behind (issue #15 item 8): per destination, how many of
//! our Jobs finished — or were created, if they never finished — longer ago than the retention,
//! and the oldest one. A count above zero means the TTL, the sweep or the record expiry is not
//! doing its work there (turned off, or failing: see the server's log and
//! `rollouts_dispatch_jobs_swept_total`).
//!
//! Direct destinations are read from the engine's Job cache (our Jobs only, label
//! `rollouts-dispatch.io/managed=true`); agent destinations from their `DispatchJob` records
//! when the doctor can read them (`agents.store: kubernetes`): a record counts from when its
//! final state was reported. The in-memory store is inside the server process: the doctor
//! cannot see it and says so.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use crate::config::StoreKind;
use crate::destinations::Entry;
use crate::engine::Engine;
use crate::store::DispatchJob;

/// One Job (or record) and since when it counts: finished, else created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Aged {
    /// `namespace/name` of the Job
    pub job: String,
    /// when it finished (or was created, if it never finished)
    pub since: Timestamp,
}

/// Since when a Job counts: its Complete/Failed condition, else its creation.
pub fn job_since(job: &Job) -> Option<Timestamp> {
    crate::job::lifecycle::ended_at(job)
        .or_else(|| job.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// Since when a record counts: when its agent reported a final state (`None`: not finished, or
/// nothing reported).
pub fn record_since(r: &DispatchJob) -> Option<Timestamp> {
    let status = r.status.as_ref()?;
    if !status.state.as_ref().is_some_and(|s| s.is_final()) {
        return None;
    }
    status.observed_at.parse().ok()
}

/// The doctor's line for `destination`: of `total` Jobs (`what`: "Job"/"record"), those in
/// `aged` older than `retention` at `now`, and the oldest of them.
pub fn line(
    destination: &str,
    what: &str,
    total: usize,
    aged: impl IntoIterator<Item = Aged>,
    now: Timestamp,
    retention: Duration,
) -> String {
    let cutoff = SignedDuration::try_from(retention)
        .ok()
        .and_then(|r| now.checked_sub(r).ok())
        .unwrap_or(Timestamp::MIN);
    let old: Vec<Aged> = aged.into_iter().filter(|a| a.since < cutoff).collect();
    let limit = dispatch_api::format_go_duration(retention);
    match old.iter().min_by_key(|a| a.since) {
        None => {
            format!("retention {destination}: OK, no {what} older than {limit} ({total} in all)")
        }
        Some(oldest) => {
            let age = now.duration_since(oldest.since).unsigned_abs();
            format!(
                "retention {destination}: {} {what}(s) of {total} finished (or created, if never \
                 finished) more than {limit} ago; oldest {} ({} old): check the sweep \
                 (--sweep-orphans-every) and the server's log",
                old.len(),
                oldest.job,
                dispatch_api::format_go_duration(age)
            )
        }
    }
}

/// One line per destination of `engine` (see the module documentation); `store` is the kind of
/// the agent store in the config, if any.
pub async fn lines(engine: &Engine, store: Option<StoreKind>, timeout: Duration) -> Vec<String> {
    let now = Timestamp::now();
    let retention = engine.jobs_settings().retention;
    let records = match (store, engine.store()) {
        (Some(StoreKind::Kubernetes), Some(s)) if s.wait_synced(timeout).await => Some(s.all()),
        _ => None,
    };
    let mut out = Vec::new();
    for entry in engine.registry().entries() {
        let name = entry.name().to_string();
        out.push(match &entry {
            Entry::Ready(d) if d.jobs().is_authoritative() => {
                let jobs = d.jobs().all();
                let aged = jobs.iter().filter_map(|j| {
                    Some(Aged {
                        job: format!(
                            "{}/{}",
                            j.metadata.namespace.as_deref()?,
                            j.metadata.name.as_deref()?
                        ),
                        since: job_since(j)?,
                    })
                });
                line(&name, "Job", jobs.len(), aged, now, retention)
            }
            Entry::Ready(_) | Entry::Broken(_) => {
                format!("retention {name}: cannot see: its Jobs are not listed (see the table)")
            }
            Entry::Agent(_) => match &records {
                Some(all) => {
                    let mine: Vec<&DispatchJob> =
                        all.iter().filter(|r| r.spec.destination == name).collect();
                    let aged = mine.iter().filter_map(|r| {
                        Some(Aged {
                            job: format!("{}/{}", r.spec.namespace, r.spec.job_name),
                            since: record_since(r)?,
                        })
                    });
                    line(
                        &name,
                        "record",
                        mine.len(),
                        aged,
                        now,
                        engine.record_retention(),
                    )
                }
                None if store == Some(StoreKind::Kubernetes) => format!(
                    "retention {name}: cannot see: the DispatchJob records were not listed within \
                     {} (the doctor needs list and watch on dispatchjobs.rollouts-dispatch.io)",
                    dispatch_api::format_go_duration(timeout)
                ),
                None => format!(
                    "retention {name}: cannot see: its records are in the server's memory \
                     (agents.store: memory); `kubectl get jobs -l rollouts-dispatch.io/managed=true` \
                     in its cluster shows its Jobs"
                ),
            },
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DispatchJobStatus;
    use crate::verdict::DestState;

    fn job(name: &str, created: &str, finished: Option<&str>) -> Job {
        let mut j: Job = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "verify", "creationTimestamp": created}
        }))
        .unwrap();
        if let Some(at) = finished {
            j.status = Some(
                serde_json::from_value(serde_json::json!({"conditions": [
                    {"type": "Complete", "status": "True", "lastTransitionTime": at}
                ]}))
                .unwrap(),
            );
        }
        j
    }

    fn aged(j: &Job) -> Aged {
        Aged {
            job: format!("verify/{}", j.metadata.name.as_deref().unwrap()),
            since: job_since(j).unwrap(),
        }
    }

    #[test]
    fn jobs_count_from_their_end_else_their_creation() {
        let now: Timestamp = "2026-01-10T00:00:00Z".parse().unwrap();
        let jobs = [
            // created long ago, finished yesterday: within a 2-day retention
            job("a", "2026-01-01T00:00:00Z", Some("2026-01-09T00:00:00Z")),
            // never finished, created 5 days ago: the oldest
            job("b", "2026-01-05T00:00:00Z", None),
            // finished 3 days ago
            job("c", "2026-01-02T00:00:00Z", Some("2026-01-07T00:00:00Z")),
            job("d", "2026-01-09T12:00:00Z", None),
        ];
        let two_days = Duration::from_secs(2 * 86_400);
        let l = line("a", "Job", jobs.len(), jobs.iter().map(aged), now, two_days);
        assert!(
            l.starts_with("retention a: 2 Job(s) of 4 finished (or created, if never finished) more than 48h ago; oldest verify/b (120h old)"),
            "{l}"
        );
        let ok = line("a", "Job", 1, [aged(&jobs[3])], now, two_days);
        assert_eq!(ok, "retention a: OK, no Job older than 48h (1 in all)");
    }

    #[test]
    fn records_count_from_their_final_report() {
        let record = |state: Option<DestState>, at: &str| {
            let mut r: DispatchJob = serde_json::from_value(serde_json::json!({"name": "j.1",
                "spec": {"destination": "edge", "namespace": "verify", "jobName": "j", "runUid": "u"}}))
            .unwrap();
            r.status = state.map(|s| DispatchJobStatus {
                observed_at: at.into(),
                ..DispatchJobStatus::observed(Some(s), "agent")
            });
            r
        };
        let at = "2026-01-01T00:00:00Z";
        assert_eq!(
            record_since(&record(Some(DestState::Succeeded), at)),
            Some(at.parse().unwrap())
        );
        assert_eq!(
            record_since(&record(Some(DestState::Running(None)), at)),
            None
        );
        assert_eq!(record_since(&record(None, at)), None);
    }
}
