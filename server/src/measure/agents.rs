//! The agent routes (`/v1/agents/{destination}/work`, `…/report`): an agent destination's
//! work — its Job and check records, the Application records, the log requests for it — handed
//! out by a long poll, and its reports written back to the records. Only the agent token of that
//! destination is served (`http::authz::agent_caller`); its texts are bounded as the server's
//! own are.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Extension, Json, Router};
use dispatch_api::agent::{self as agent_api, ReportReply, ReportRequest, WorkReply, WorkRequest};
use dispatch_api::state::MAX_DETAIL;

use crate::destinations::{AgentDestination, Entry};
use crate::engine::Engine;
use crate::http::{authz, ApiFailure, ApiJson, DispatchError, Principal, Reason};
use crate::logs::relay::LogRelay;
use crate::logs::MAX_LOG_BYTES;
use crate::runtime::metrics::Metrics;
use crate::store::{DispatchJobStatus, Store};

/// The most long polls one agent destination may hold open on a replica. An agent holds one;
/// a few more absorb a restart whose old poll has not timed out yet. Beyond it a poll is
/// answered `429 too_many_polls` at once: a stolen or buggy agent token cannot pin the
/// replica's poll budget (`serve --max-agent-polls`, shared by every agent) with idle polls.
pub const MAX_POLLS_PER_AGENT: usize = 4;

/// The agents' side of the server: their work and their reports.
pub struct AgentChannel {
    engine: Engine,
    metrics: Arc<Metrics>,
    /// set at shutdown: open long polls answer at once so that the drain does not wait for them
    stopping: tokio::sync::watch::Sender<bool>,
    /// the log requests waiting for agents, handed out with the work
    relay: Arc<LogRelay>,
    /// set while the control plane leaves this replica's reads unanswered (`serve`'s readiness
    /// follows the same): its view of the records is stale and its writes do not land, so
    /// polls and reports are answered 503 and the agent connects again, to a ready replica
    control_plane_unanswered: std::sync::atomic::AtomicBool,
}

impl AgentChannel {
    /// The agents of `engine`'s agent destinations, also handed the log requests of `relay`.
    pub fn new(engine: Engine, metrics: Arc<Metrics>, relay: Arc<LogRelay>) -> Self {
        Self {
            engine,
            metrics,
            stopping: tokio::sync::watch::channel(false).0,
            relay,
            control_plane_unanswered: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether the control plane leaves this replica unanswered (issue #32: a replica cut from
    /// the control plane answered polls from its stale records for minutes, and the agent,
    /// served, never left it).
    pub fn set_control_plane_unanswered(&self, unanswered: bool) {
        self.control_plane_unanswered
            .store(unanswered, std::sync::atomic::Ordering::Release);
    }

    /// 503 while the control plane leaves this replica unanswered.
    fn answering(&self) -> Result<(), DispatchError> {
        if self
            .control_plane_unanswered
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(DispatchError::Unavailable(
                "this replica cannot reach the control plane, where agent work is kept; \
                 connect again (a Service sends the connection to a ready replica)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Answers every open long poll now and every new one at once (shutdown).
    pub fn stop_polls(&self) {
        self.stopping.send_replace(true);
    }

    /// Publishes whether each agent destination's agent is connected.
    pub fn publish_agents(&self) {
        let offline_after = self.engine.agent_offline_after();
        for entry in self.engine.registry().entries() {
            if let Entry::Agent(a) = entry {
                self.metrics
                    .set_agent_connected(&a.name, a.connected(offline_after));
            }
        }
    }

    /// The agent destination `destination`, if `caller` holds its agent token.
    fn agent_for(
        &self,
        caller: &Principal,
        destination: &str,
    ) -> Result<(Arc<AgentDestination>, Arc<Store>), DispatchError> {
        authz::agent_caller(caller, destination)?;
        let store = self.engine.store().cloned();
        match (self.engine.registry().get(destination), store) {
            (Some(Entry::Agent(a)), Some(store)) => Ok((a, store)),
            _ => {
                tracing::warn!(subject = %caller.subject, destination, "refused: not an agent destination");
                Err(DispatchError::NotFound(
                    format!(
                        "{destination:?} is not an agent destination of this server; add it to \
                         agents.destinations in {}",
                        self.engine.origin()
                    )
                    .into(),
                ))
            }
        }
    }

    /// The work of agent destination `destination` (a long poll: answered when its records or
    /// the log requests for it change, at shutdown, or after `req.wait_seconds`).
    pub async fn work(
        &self,
        caller: &Principal,
        destination: String,
        req: WorkRequest,
    ) -> Result<WorkReply, DispatchError> {
        let (agent, store) = self.agent_for(caller, &destination)?;
        self.answering()?;
        if !agent.start_poll(&caller.subject, MAX_POLLS_PER_AGENT) {
            tracing::warn!(subject = %caller.subject, destination, max = MAX_POLLS_PER_AGENT,
                           "refused: too many open polls");
            return Err(DispatchError::TooManyPolls(
                format!(
                    "destination {destination:?} already has {MAX_POLLS_PER_AGENT} open polls on \
                 this server; one agent needs one (is another agent running with the same token?)"
                )
                .into(),
            ));
        }
        // Whatever happens below, the poll ends here.
        let _ended = scopeguard(|| agent.contact(&caller.subject, -1));
        let mut changes = store.subscribe(&destination);
        let mut stopping = self.stopping.subscribe();
        let mut asked = self.relay.subscribe();
        let wait = std::time::Duration::from_secs(u64::from(
            req.wait_seconds.min(agent_api::MAX_WAIT_SECONDS),
        ));
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            changes.mark_unchanged();
            asked.mark_unchanged();
            let stop = *stopping.borrow();
            if store.fingerprint(&destination) != req.fingerprint
                || self.relay.has_new(&destination)
                || stop
                || tokio::time::Instant::now() >= deadline
            {
                // Copy the records only to answer; the reply's fingerprint is theirs.
                let records = store.for_destination(&destination);
                let fingerprint = crate::store::work_fingerprint(&records);
                return Ok(WorkReply {
                    fingerprint,
                    jobs: records
                        .into_iter()
                        .map(crate::store::DispatchJob::into_work_item)
                        .collect(),
                    logs: self.relay.for_poll(&destination),
                });
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = stopping.changed() => {}
                _ = asked.changed() => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// The agent of `destination` reports the state of its Jobs and checks.
    pub async fn report(
        &self,
        caller: &Principal,
        destination: String,
        req: ReportRequest,
    ) -> Result<ReportReply, DispatchError> {
        let (agent, store) = self.agent_for(caller, &destination)?;
        self.answering()?;
        agent.contact(&caller.subject, 0);
        let mut reply = ReportReply::default();
        for mut report in req.reports {
            // An agent's texts are kept as the server would have made them itself: no
            // detail beyond MAX_DETAIL, no log tail beyond MAX_LOG_BYTES, whatever it sent.
            report.state = report.state.map(|s| s.bounded(MAX_DETAIL, MAX_LOG_BYTES));
            let notes = dispatch_api::observe::bounded_notes(report.notes, MAX_DETAIL);
            let application = report.application.map(|a| a.bounded(MAX_DETAIL));
            let Some(record) = store.get(&report.name) else {
                reply.unknown.push(report.name);
                continue;
            };
            if record.spec.destination != destination {
                tracing::warn!(subject = %caller.subject, destination, record = %report.name,
                               "refused: report on a record of another destination");
                return Err(DispatchError::Forbidden(
                    format!(
                        "dispatchjob {} belongs to destination {:?}, not {destination:?}",
                        report.name, record.spec.destination
                    )
                    .into(),
                ));
            }
            let result = if report.state.is_none() {
                store.remove(&report.name).await
            } else {
                let status = DispatchJobStatus {
                    notes,
                    application,
                    ..DispatchJobStatus::observed(report.state, &caller.subject)
                };
                let unchanged = record.status.as_ref().is_some_and(|s| {
                    s.state == status.state
                        && s.deleted == status.deleted
                        && s.notes == status.notes
                        && s.application == status.application
                });
                if unchanged {
                    Ok(())
                } else {
                    store.set_status(&report.name, status).await
                }
            };
            match result {
                Ok(()) => reply.accepted += 1,
                Err(crate::store::StoreError::NotFound(_)) => reply.unknown.push(report.name),
                Err(e) => return Err(DispatchError::Unavailable(Reason::of(e))),
            }
        }
        self.metrics
            .count_agent_reports(&destination, u64::from(reply.accepted));
        Ok(reply)
    }
}

/// The agent routes over `agents` (behind the bearer layer).
pub fn routes(agents: Arc<AgentChannel>) -> Router {
    Router::new()
        .route(agent_api::WORK, post(work))
        .route(agent_api::REPORT, post(report))
        .with_state(agents)
}

async fn work(
    State(agents): State<Arc<AgentChannel>>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<WorkRequest>,
) -> Result<Json<WorkReply>, ApiFailure> {
    Ok(Json(agents.work(&caller, destination, req).await?))
}

async fn report(
    State(agents): State<Arc<AgentChannel>>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<ReportRequest>,
) -> Result<Json<ReportReply>, ApiFailure> {
    Ok(Json(agents.report(&caller, destination, req).await?))
}

/// Runs `f` when dropped (also when the request future is cancelled by a client going away).
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}
