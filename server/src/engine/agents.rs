//! Agent destinations: the engine writes a `DispatchJob` record per Job and reads the state the
//! agent reported, instead of calling a cluster it cannot reach.

use std::sync::Arc;

use dispatch_api::observe::Observe;

use super::cleanup::{measurement_of, CleanupError};
use super::{Engine, JobRef, MeasureRequest, Outcome, Placement};
use crate::destinations::{AgentDestination, Entry};
use crate::store::{self, Created, DispatchJob, DispatchJobSpec, Store};
use crate::verdict::DestState;

impl Engine {
    /// Signs the work of agent `spec` with the server's key (`signing::work`): the agent acts
    /// only on records a key it pins signed.
    pub fn sign_work(&self, spec: &mut DispatchJobSpec) {
        self.marker().sign_work(spec);
    }

    /// The public keys of the work this engine signs: what its agents pin (`--work-keys`).
    pub fn work_keys(&self) -> crate::signing::WorkKeys {
        crate::signing::WorkKeys::of(self.marker())
    }

    fn sealed(&self, mut record: DispatchJob) -> DispatchJob {
        self.sign_work(&mut record.spec);
        record
    }

    pub(super) fn agent_store(&self) -> Result<&Arc<Store>, DestState> {
        self.inner.store.as_ref().ok_or_else(|| {
            DestState::Error("agent destinations need `agents` in the server config".into())
        })
    }

    /// Writes the record that asks `agent` to run Job `obj` (or to observe `observe`, with no
    /// Job); an existing record of the same run
    /// is adopted (a retry, or another replica wrote it first).
    pub(super) async fn agent_create(
        &self,
        agent: &AgentDestination,
        namespace: &str,
        name: &str,
        req: &MeasureRequest,
        obj: Option<serde_json::Value>,
        observe: Option<Observe>,
    ) -> Outcome {
        let store = match self.agent_store() {
            Ok(s) => s,
            Err(e) => return Outcome::NotCreated(e),
        };
        let record = self.sealed(DispatchJob {
            name: store::record_name(name, &agent.name),
            spec: DispatchJobSpec {
                destination: agent.name.clone(),
                namespace: namespace.to_string(),
                job_name: name.to_string(),
                run_uid: req.run.uid.clone(),
                run: format!("{}/{}", req.run.namespace, req.run.name),
                metric: req.metric.clone(),
                measurement: req.measurement,
                log_tail: req.config.log_tail,
                job: obj,
                delete: false,
                observe,
                sync: None,
                project: req.run.namespace.clone(),
                deadline: self.deadline_of(req),
                signature: None,
                for_stage: None,
            },
            status: None,
            resource_version: None,
        });
        match store.create(record).await {
            Ok(Created::New) => Outcome::Created,
            Ok(Created::Existing(existing)) if existing.spec.run_uid == req.run.uid => {
                if existing.spec.delete {
                    Outcome::NotCreated(DestState::Unavailable(format!(
                        "job {namespace}/{name} on {} is being deleted; it will be created again on the next attempt",
                        agent.name
                    )))
                } else {
                    Outcome::Adopted
                }
            }
            Ok(Created::Existing(existing)) => Outcome::NotCreated(DestState::Error(format!(
                "dispatchjob {} already exists for another AnalysisRun ({}); it is left alone",
                existing.name, existing.spec.run
            ))),
            Err(e) => Outcome::NotCreated(DestState::Unavailable(e.to_string())),
        }
    }

    /// Whether a record of `job` on one of its agent destinations is missing: the in-memory store
    /// of a restarted server. The caller re-sends the measurement ([`Engine::ensure`] is
    /// idempotent), so that the agent gets the marked spec again and can check the Job it has
    /// against it, instead of an adopt-only record it could not check.
    pub fn agent_records_missing(&self, job: &JobRef) -> bool {
        let Some(store) = self.inner.store.as_ref() else {
            return false;
        };
        job.placements.iter().any(|p| {
            matches!(self.inner.registry.get(&p.destination), Some(Entry::Agent(a))
                if store.get(&store::record_name(&job.name, &a.name)).is_none())
        })
    }

    /// The state of a measurement's Job on an agent destination, as its agent last reported.
    pub(super) async fn agent_state(
        &self,
        agent: &AgentDestination,
        job: &JobRef,
        p: &Placement,
    ) -> DestState {
        let store = match self.agent_store() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let name = store::record_name(&job.name, &agent.name);
        let silence = || {
            if agent.connected(self.inner.offline_after) {
                String::new()
            } else {
                match agent.last_contact().and_then(|t| t.elapsed().ok()) {
                    Some(e) => format!(" (its agent has not been heard from for {}s)", e.as_secs()),
                    None => " (its agent has not connected to this server replica yet)".into(),
                }
            }
        };
        // Not what a relisting store's index may still say: the agent's final report could be
        // missing from it, and past the deadline the measurement would end in `Error`.
        let record = match store.get_current(&name).await {
            Ok(record) => record,
            Err(e) => return DestState::Unavailable(e.to_string()),
        };
        let Some(record) = record else {
            // The record is gone while Argo still asks: the in-memory store of a restarted
            // server. Ask the agent to adopt the Job it has (never to create one).
            return match store
                .create(self.sealed(bare_record(agent, job, p, false)))
                .await
            {
                Ok(_) => DestState::Running(Some(format!(
                    "waiting for the agent of {} to report job {}/{}{}",
                    agent.name,
                    p.namespace,
                    job.name,
                    silence()
                ))),
                Err(e) => DestState::Unavailable(e.to_string()),
            };
        };
        match record.status {
            Some(s) if s.deleted => DestState::Error(format!(
                "job {}/{} on {} was deleted (terminate or garbage collection)",
                p.namespace, job.name, agent.name
            )),
            Some(s) => match s.state {
                Some(DestState::Running(detail)) => {
                    let note = silence();
                    DestState::Running(match (detail, note.is_empty()) {
                        (d, true) => d,
                        (Some(d), false) => Some(format!("{d}{note}")),
                        (None, false) => Some(note.trim_start().to_string()),
                    })
                }
                Some(state) => state,
                None => DestState::Running(None),
            },
            None => DestState::Running(Some(format!(
                "waiting for the agent of {} to pick up job {}/{}{}",
                agent.name,
                p.namespace,
                job.name,
                silence()
            ))),
        }
    }

    /// Asks the agent to delete the Job (a delete-only record when the record is gone).
    pub(super) async fn agent_delete(
        &self,
        agent: &AgentDestination,
        job: &JobRef,
        p: &Placement,
    ) -> Result<bool, CleanupError> {
        let store = self.agent_store().map_err(CleanupError::Destination)?;
        let name = store::record_name(&job.name, &agent.name);
        // A record a relisting store's index misses would get a delete-only record, which its
        // create finds existing, and no delete request.
        match store.get_current(&name).await? {
            Some(r) if r.status.as_ref().is_some_and(|s| s.deleted) => Ok(false),
            Some(r) if r.spec.delete => Ok(true),
            Some(_) => match store.request_delete(&name).await {
                Ok(()) => Ok(true),
                Err(store::StoreError::NotFound(_)) => Ok(false),
                Err(e) => Err(e.into()),
            },
            None => {
                store
                    .create(self.sealed(bare_record(agent, job, p, true)))
                    .await?;
                Ok(true)
            }
        }
    }

    /// Keeps the newest `limit` records of run `run_uid` per agent destination (and metric, or
    /// all metrics together) and asks the agents to delete the Jobs of the others; only records
    /// on `placements` when given.
    pub(super) async fn gc_agents(
        &self,
        run_uid: &str,
        metric: Option<&str>,
        placements: Option<&[Placement]>,
        limit: usize,
    ) -> (Vec<(String, String)>, Vec<(String, String)>) {
        let Some(store) = &self.inner.store else {
            return Default::default();
        };
        let placed = |r: &DispatchJob| {
            placements.is_none_or(|ps| {
                ps.iter()
                    .any(|p| p.destination == r.spec.destination && p.namespace == r.spec.namespace)
            })
        };
        let records: Vec<DispatchJob> = store
            .for_run(run_uid)
            .into_iter()
            .filter(|r| !r.spec.delete && metric.is_none_or(|m| r.spec.metric == m) && placed(r))
            .map(|mut r| {
                if metric.is_none() {
                    r.spec.metric = String::new();
                }
                r
            })
            .collect();
        let (mut deleted, mut failed) = (Vec::new(), Vec::new());
        for ((destination, _), list) in store::by_metric(records) {
            if list.len() <= limit {
                continue;
            }
            let excess = list.len() - limit;
            for r in &list[..excess] {
                match store.request_delete(&r.name).await {
                    Ok(()) => deleted.push((
                        destination.clone(),
                        format!("{}/{}", r.spec.namespace, r.spec.job_name),
                    )),
                    Err(store::StoreError::NotFound(_)) => {}
                    Err(e) => failed.push((destination.clone(), e.to_string())),
                }
            }
        }
        (deleted, failed)
    }
}

/// A record without a Job spec, for a measurement whose record is gone (the in-memory store of a
/// restarted server): the agent adopts the Job it has (`delete: false`) or deletes it.
pub(super) fn bare_record(
    agent: &AgentDestination,
    job: &JobRef,
    p: &Placement,
    delete: bool,
) -> DispatchJob {
    DispatchJob {
        name: store::record_name(&job.name, &agent.name),
        spec: DispatchJobSpec {
            destination: agent.name.clone(),
            namespace: p.namespace.clone(),
            job_name: job.name.clone(),
            run_uid: job.run_uid.clone(),
            run: if job.run_name.is_empty() {
                String::new()
            } else {
                format!("{}/{}", job.run_namespace, job.run_name)
            },
            metric: job.metric.clone(),
            measurement: measurement_of(&job.name),
            log_tail: job.log_tail,
            job: None,
            delete,
            // An observe record written again keeps what the signed reference observes.
            observe: job.observe.clone(),
            sync: None,
            project: job.run_namespace.clone(),
            // It creates nothing: no deadline to hold it to.
            deadline: 0,
            signature: None,
            for_stage: None,
        },
        status: None,
        resource_version: None,
    }
}
