//! One pass of the agent over its destination's work: create, watch and delete the Jobs of the
//! records, read what observe records (`rollout:`, `application:`) follow, and say which states
//! changed ([`Worker::pass`]); then remember what the server
//! accepted ([`Worker::accepted`]).
//!
//! A record whose final state (succeeded, failed, a permanent error, or deleted) the server
//! accepted is *settled*: it leaves the per-pass work and is not checked again (no pod security
//! check, no Job read, no ownership hash) until its record changes — a delete request, a new
//! spec. Without this every finished item of the destination is re-read twice a second until
//! garbage collection or the record's retention removes it (issue #15 item 6).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use dispatch_api::agent::{Report, WorkItem};
use tracing::{info, warn};

use super::guard::Guard;
use crate::destinations::Entry;
use crate::engine::{Engine, JobRef, Outcome};
use crate::logs::Redactor;
use crate::verdict::DestState;

/// How long the agent waits before it tries again to create a Job whose create failed
/// transiently (5xx, timeout, 429).
pub const CREATE_RETRY: Duration = Duration::from_secs(5);

/// How often the agent reads the objects of one observe record (a `get`, and a `list` for a
/// Rollout): the server's status calls come every few seconds at most.
const OBSERVE_EVERY: Duration = Duration::from_secs(2);

fn observe_name(observe: &dispatch_api::observe::Observe) -> &str {
    match observe {
        dispatch_api::observe::Observe::Rollout(r) => &r.name,
        dispatch_api::observe::Observe::Application(a) => &a.name,
    }
}

/// Whether a reported state is final: the Job's verdict cannot change any more (succeeded,
/// failed, a permanent error) or the Job is gone as asked (`None`). Running, an image pull
/// error (the kubelet keeps pulling) and an unreachable API can still change.
pub fn is_final(state: &Option<DestState>) -> bool {
    state.as_ref().is_none_or(DestState::is_final)
}

/// What the agent does for a record that asks for a Job, on one pass of its loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CreateStep {
    /// create (or adopt) the Job: the server has no state of it yet
    Create,
    /// the last create failed transiently: nothing to do or report before its retry time
    Wait,
    /// the Job was created, adopted or reported: read its state
    Observe,
}

/// The step for a record: `reported` (the server holds a state that is not a transient create
/// failure), `started` (this process created or adopted its Job), `retry_at` (when a create
/// that failed transiently may be tried again).
fn create_step(
    reported: bool,
    started: bool,
    retry_at: Option<tokio::time::Instant>,
    now: tokio::time::Instant,
) -> CreateStep {
    if reported || started {
        CreateStep::Observe
    } else if retry_at.is_some_and(|at| now < at) {
        CreateStep::Wait
    } else {
        CreateStep::Create
    }
}

/// The agent's memory of its work between passes. Every map is pruned of the records that left
/// the work, so it stays as large as the destination's records.
pub struct Worker {
    engine: Engine,
    destination: String,
    entry: Entry,
    guard: Guard,
    no_secrets: Redactor,
    /// what the server last accepted per record (state `None`: deleted)
    reported: HashMap<String, Report>,
    /// when each observe record's objects were last read: at most every [`OBSERVE_EVERY`]
    observed_at: HashMap<String, tokio::time::Instant>,
    /// the records whose Job this process created or adopted
    started: HashSet<String>,
    /// records whose create failed transiently, and when to try again
    retry_at: HashMap<String, tokio::time::Instant>,
    /// records whose final state the server accepted: skipped until their record changes
    settled: HashSet<String>,
    /// records whose create the cluster refused for good (validation, admission, quota), with
    /// the refusal: it stays their state, rather than the "does not exist" a later read gives
    /// once the record changes (the server marks it reported) and leaves `settled`
    refused: HashMap<String, DestState>,
    /// the work of the previous pass (the poller replaces the whole list when it changes)
    last: Arc<Vec<WorkItem>>,
    /// the records of the Application routes (`agent/sync.rs`)
    apps: super::sync::Apps,
}

impl Worker {
    /// A worker for `destination` of `engine`; `None` when the engine does not know it.
    pub fn new(engine: Engine, destination: &str, guard: Guard) -> Option<Self> {
        let entry = engine.registry().get(destination)?;
        Some(Self {
            engine,
            destination: destination.to_string(),
            entry,
            guard,
            no_secrets: Redactor::default(),
            reported: HashMap::new(),
            observed_at: HashMap::new(),
            started: HashSet::new(),
            retry_at: HashMap::new(),
            settled: HashSet::new(),
            refused: HashMap::new(),
            last: Arc::new(Vec::new()),
            apps: super::sync::Apps::default(),
        })
    }

    /// Carries out the sync orders of the Application routes (`--argocd-sync`).
    #[must_use]
    pub fn with_argocd_sync(mut self, on: bool) -> Self {
        self.apps.argocd_sync = on;
        self
    }

    /// How many records are settled (left the per-pass work).
    pub fn settled(&self) -> usize {
        self.settled.len()
    }

    /// Works through `work` once; returns the reports of the records whose state differs from
    /// what the server last accepted.
    pub async fn pass(&mut self, work: &Arc<Vec<WorkItem>>) -> Vec<Report> {
        if !Arc::ptr_eq(work, &self.last) {
            self.forget_changed(work);
            self.last = work.clone();
        }
        let mut reports = Vec::new();
        for item in work.iter() {
            if crate::store::is_application_record(&item.spec) {
                let (entry, dest) = (&self.entry, self.destination.as_str());
                reports.extend(self.apps.pass(entry, dest, &self.guard, item).await);
                continue;
            }
            if self.settled.contains(&item.name) {
                continue;
            }
            if let Some(report) = self.item(item).await {
                if self.reported.get(&item.name) != Some(&report) {
                    reports.push(report);
                } else if is_final(&report.state) {
                    // Checked again after its record changed (often only `reported`, which the
                    // server sets on the first report), and still what the server has.
                    self.settled.insert(item.name.clone());
                }
            }
        }
        reports
    }

    /// The server stored `reports` except those of records it no longer has (`unknown`).
    pub fn accepted(&mut self, reports: Vec<Report>, unknown: &[String]) {
        self.apps.accepted(&reports, unknown);
        let unknown: HashSet<&String> = unknown.iter().collect();
        for r in reports {
            if unknown.contains(&r.name) {
                continue;
            }
            if is_final(&r.state) {
                self.settled.insert(r.name.clone());
            }
            self.reported.insert(r.name.clone(), r);
        }
    }

    /// The work changed: records whose item differs from the last pass's are checked again,
    /// and the memory of records that left the work is dropped.
    fn forget_changed(&mut self, work: &Arc<Vec<WorkItem>>) {
        let before: HashMap<&str, &WorkItem> =
            self.last.iter().map(|w| (w.name.as_str(), w)).collect();
        let now: HashMap<&str, &WorkItem> = work.iter().map(|w| (w.name.as_str(), w)).collect();
        self.settled
            .retain(|k| matches!((before.get(k.as_str()), now.get(k.as_str())), (Some(a), Some(b)) if a == b));
        self.reported.retain(|k, _| now.contains_key(k.as_str()));
        self.observed_at.retain(|k, _| now.contains_key(k.as_str()));
        self.started.retain(|k| now.contains_key(k.as_str()));
        self.retry_at.retain(|k, _| now.contains_key(k.as_str()));
        self.refused.retain(|k, _| now.contains_key(k.as_str()));
        self.apps.retain(|k| now.contains_key(k));
    }

    /// The report of one record after acting on it; `None` when there is nothing to say yet.
    async fn item(&mut self, item: &WorkItem) -> Option<Report> {
        if item.spec.observe.is_some() {
            return self.observe_item(item).await;
        }
        let state = self.job_item(item).await?;
        Some(Report::new(item.name.clone(), state))
    }

    /// An observe record: read (`get`/`list` only) and judge what it observes in this cluster,
    /// at most every [`OBSERVE_EVERY`]; a delete request is acknowledged without any call, as
    /// there is nothing of ours to delete (the observed object is never deleted).
    async fn observe_item(&mut self, item: &WorkItem) -> Option<Report> {
        let destination = self.destination.as_str();
        let spec = &item.spec;
        let job = JobRef::of_record(spec, destination);
        let observe = job.observe.clone()?;
        let at = format!(
            "{} {}/{}",
            observe.kind(),
            spec.namespace,
            observe_name(&observe)
        );
        if let Err(refused) = self.guard.admit(destination, spec) {
            warn!(%destination, observed = %at, run = %spec.run, error = %refused,
                  "refused work from the server");
            return Some(Report::new(
                item.name.clone(),
                Some(DestState::Error(format!(
                    "{at} on {destination}: {refused}"
                ))),
            ));
        }
        if spec.delete {
            return Some(Report::new(item.name.clone(), None));
        }
        let now = tokio::time::Instant::now();
        if self
            .observed_at
            .get(&item.name)
            .is_some_and(|last| now < *last + OBSERVE_EVERY)
        {
            return None;
        }
        self.observed_at.insert(item.name.clone(), now);
        let seen = self
            .engine
            .observe_placement(&job, &job.placements[0], &observe)
            .await;
        Some(Report {
            name: item.name.clone(),
            state: Some(seen.state),
            notes: seen.notes,
            application: seen.application,
        })
    }

    /// The state of one record's Job after acting on it; `None` when there is nothing to say
    /// yet (a deletion under way or that failed, logged).
    async fn job_item(&mut self, item: &WorkItem) -> Option<Option<DestState>> {
        let destination = self.destination.as_str();
        let spec = &item.spec;
        // The agent's own reference to a Job the server asked for: never signed, never handed
        // out (the agent acts on its own cluster only).
        let job = JobRef::of_record(spec, destination);
        let placement = &job.placements[0];
        let at = format!("{}/{}", spec.namespace, spec.job_name);
        // Pure, so checked on every pass until settled: a refused item keeps its refusal.
        let admitted = match self.guard.admit(destination, spec) {
            Ok(obj) => obj,
            Err(refused) => {
                warn!(%destination, job = %at, run = %spec.run, error = %refused,
                      "refused work from the server");
                return Some(Some(DestState::Error(format!(
                    "job {at} on {destination}: {refused}"
                ))));
            }
        };
        if spec.delete {
            return match self.engine.delete_one(&job, placement).await {
                Ok(false) => Some(None),
                Ok(true) => None,
                Err(e) => {
                    warn!(%destination, job = %at, error = %e, "cannot delete the job");
                    None
                }
            };
        }
        if let Some(refusal) = self.refused.get(&item.name) {
            return Some(Some(refusal.clone()));
        }
        let step = create_step(
            item.reported,
            self.started.contains(&item.name),
            self.retry_at.get(&item.name).copied(),
            tokio::time::Instant::now(),
        );
        // Between two tries the Job does not exist: observing it would report "does not
        // exist", a verdict (Error) that ends the retries; the transient failure last reported
        // stands until the next try.
        if step == CreateStep::Wait {
            return None;
        }
        if step == CreateStep::Create {
            if let Some(obj) = admitted.clone() {
                // A record replayed after its measurement ended creates nothing.
                let now = crate::signing::work::now_secs();
                if let Err(expired) = self.guard.work_keys.verify_in_time(spec, now) {
                    warn!(%destination, job = %at, run = %spec.run, error = %expired,
                          "refused work from the server");
                    let state = DestState::Error(format!(
                        "job {at} on {destination}: the agent refused it: {expired}"
                    ));
                    self.refused.insert(item.name.clone(), state.clone());
                    return Some(Some(state));
                }
                let outcome = self
                    .engine
                    .create_or_adopt(
                        &self.entry,
                        &spec.namespace,
                        &spec.job_name,
                        &spec.run_uid,
                        obj,
                    )
                    .await;
                info!(%destination, job = %at, run = %spec.run, outcome = ?outcome, "ensure");
                match outcome {
                    Outcome::Created | Outcome::Adopted | Outcome::Observed(_) => {
                        self.started.insert(item.name.clone());
                        self.retry_at.remove(&item.name);
                    }
                    Outcome::NotCreated(s) => {
                        // The server keeps a transient failure unreported (`reported: false`),
                        // so the create is tried again after a pause.
                        if s.is_retryable() {
                            self.retry_at.insert(
                                item.name.clone(),
                                tokio::time::Instant::now() + CREATE_RETRY,
                            );
                        } else {
                            self.refused.insert(item.name.clone(), s.clone());
                        }
                        return Some(Some(s));
                    }
                }
            }
        }
        Some(Some(
            self.engine
                .placement_state(&job, placement, &self.no_secrets, true, admitted.as_ref())
                .await,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transiently_failed_create_waits_for_its_retry_then_creates_again() {
        let now = tokio::time::Instant::now();
        let later = now + CREATE_RETRY;
        // Before the retry time the record is neither created nor observed (observing a Job
        // that was never created reports "does not exist", an Error verdict).
        assert_eq!(
            create_step(false, false, Some(later), now),
            CreateStep::Wait
        );
        assert_eq!(
            create_step(false, false, Some(later), later),
            CreateStep::Create
        );
        assert_eq!(create_step(false, false, None, now), CreateStep::Create);
        assert_eq!(create_step(false, true, None, now), CreateStep::Observe);
        assert_eq!(
            create_step(true, false, Some(later), now),
            CreateStep::Observe
        );
    }

    #[test]
    fn only_decided_states_are_final() {
        assert!(is_final(&None));
        assert!(is_final(&Some(DestState::Succeeded)));
        assert!(is_final(&Some(DestState::Error("gone".into()))));
        assert!(is_final(&Some(DestState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: String::new(),
            log: None,
        })));
        assert!(!is_final(&Some(DestState::Running(None))));
        assert!(!is_final(&Some(DestState::Unavailable("503".into()))));
        assert!(!is_final(&Some(DestState::ImagePull {
            pod: "p".into(),
            container: "c".into(),
            reason: "ImagePullBackOff".into(),
            message: String::new(),
        })));
    }
}
