//! The log of a Job on an agent destination, streamed by its agent over its own outbound
//! connection: the request rides on the agent's long-polled work, the agent `POST`s the lines to
//! `/v1/agents/{destination}/logs/{id}`, and the replica holding the reader's request relays them.
//!
//! [`LogRelay`] holds the pending requests of this replica: a fresh unguessable id, the reader's
//! bounded channel and whether an agent's poll has carried it yet. An open poll of the
//! destination answers at once when a request appears ([`LogRelay::subscribe`]); a request goes
//! away when its upload starts (the upload then owns the sender), when the reader hangs up (its
//! stream is dropped), or after [`ANSWER_WAIT`] without an upload (a note says so).
//!
//! Pending requests are bounded per destination (`budgets.pendingLogRequestsPerDestination`,
//! [`LogRelay::reserve`]): each holds a unit until it leaves, so a reader cannot queue an
//! unbounded backlog for one agent. `RunLogs::of_run` also holds one unit of its project's
//! `budgets.logRequestsPerProject` per request, for as long as the reader reads.
//!
//! With several replicas ([`LogRelay::with_peers`], `logs/peers.rs`) every request is
//! also published on the store, so that the replica the agent polls hands it out, and an upload
//! landing on another replica is forwarded here (see `docs/architecture.md`, "Logs on agent
//! destinations"). The reader's end never leaves this replica.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dispatch_api::agent::LogUploadReply;
use dispatch_api::logs::{LogEvent, LogRequest};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::{mpsc, watch};

use super::peers::LogPeers;
use super::run::RunLogs;
use crate::config::budgets::PENDING_LOG_REQUESTS_PER_DESTINATION;
use crate::config::BudgetsConfig;
use crate::destinations::{AgentDestination, Entry};
use crate::http::{authz, DispatchError, LogUpload, Principal, Reason};
use crate::runtime::quota::{Held, OverQuota, Quota};

/// How long a request waits for its agent to start the upload before the reader gets a note.
pub const ANSWER_WAIT: Duration = Duration::from_secs(30);
/// Events buffered between an upload and its reader: beyond it the upload waits for the reader
/// (backpressure), so a slow reader never makes the server hold a whole log.
const CHANNEL: usize = 256;

/// The log requests of this replica waiting for, or being served by, their agent.
pub struct LogRelay {
    pending: Mutex<HashMap<String, Pending>>,
    /// bumped whenever a request is added (here or, with peers, published by any replica):
    /// open polls look again
    added: watch::Sender<u64>,
    /// the other replicas (`agents.store: kubernetes` with `serve --pod-ip`)
    peers: Option<LogPeers>,
    /// the requests each destination has waiting
    waiting: Quota,
}

struct Pending {
    destination: String,
    request: LogRequest,
    /// taken by the upload when it starts
    sender: Option<mpsc::Sender<LogEvent>>,
    /// a poll has carried it to the agent
    handed_out: bool,
    /// its unit of the destination's waiting requests, given back when it leaves
    _waiting: Held,
}

/// The quota of waiting requests per destination, of `max` each.
pub fn waiting_quota(max: usize, metrics: Option<Arc<crate::runtime::metrics::Metrics>>) -> Quota {
    Quota::new(
        PENDING_LOG_REQUESTS_PER_DESTINATION,
        "destination",
        "log requests waiting for its agent",
        max,
        metrics,
    )
}

/// Why an upload is not accepted.
#[derive(Debug, thiserror::Error)]
pub enum UploadRefused {
    /// No pending request of that destination has that id (unknown, answered, timed out, or
    /// another destination's).
    #[error("no log request {id} is pending for destination {destination:?} on this server (unknown id, already answered, or the reader gave up)")]
    Unknown {
        /// the id
        id: String,
        /// the destination of the route
        destination: String,
    },
}

impl Default for LogRelay {
    fn default() -> Self {
        Self {
            pending: Mutex::new(HashMap::new()),
            added: watch::channel(0).0,
            peers: None,
            waiting: waiting_quota(
                BudgetsConfig::default().pending_log_requests_per_destination,
                None,
            ),
        }
    }
}

impl LogRelay {
    /// A relay whose requests every replica sees, built by `start(wake)` (given the sender its
    /// open polls watch).
    pub fn with_peers(start: impl FnOnce(watch::Sender<u64>) -> LogPeers) -> Self {
        let added = watch::channel(0).0;
        Self {
            pending: Mutex::new(HashMap::new()),
            peers: Some(start(added.clone())),
            added,
            waiting: waiting_quota(
                BudgetsConfig::default().pending_log_requests_per_destination,
                None,
            ),
        }
    }

    /// The same relay, each destination's waiting requests bounded by `waiting`.
    pub fn with_waiting(mut self, waiting: Quota) -> Self {
        self.waiting = waiting;
        self
    }

    /// `n` units of `destination`'s waiting requests, one per request to [`LogRelay::ask`],
    /// all or none.
    pub fn reserve(&self, destination: &str, n: usize) -> Result<Vec<Held>, OverQuota> {
        self.waiting.take_n(destination, n)
    }

    /// The other replicas, when requests are published to them.
    pub fn peers(&self) -> Option<&LogPeers> {
        self.peers.as_ref()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers `request` (its id replaced by a fresh one) for `destination`, holding
    /// `waiting` (from [`LogRelay::reserve`]) until it leaves; returns the id and the reader's
    /// end.
    pub fn ask(
        &self,
        destination: &str,
        mut request: LogRequest,
        waiting: Held,
    ) -> (String, mpsc::Receiver<LogEvent>) {
        let id = crate::store::random_id();
        request.id = id.clone();
        let (tx, rx) = mpsc::channel(CHANNEL);
        self.lock().insert(
            id.clone(),
            Pending {
                destination: destination.to_string(),
                request,
                sender: Some(tx),
                handed_out: false,
                _waiting: waiting,
            },
        );
        self.added.send_modify(|n| *n = n.wrapping_add(1));
        (id, rx)
    }

    /// Wakes when a request is added (any destination: the poll then looks at its own).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.added.subscribe()
    }

    /// Whether `destination` has a request no poll (of this replica) has carried yet.
    pub fn has_new(&self, destination: &str) -> bool {
        let local = self
            .lock()
            .values()
            .any(|p| p.destination == destination && !p.handed_out && p.sender.is_some());
        local || self.peers.as_ref().is_some_and(|p| p.has_new(destination))
    }

    /// The requests of `destination` whose upload has not started, for a poll's reply (marked
    /// carried; they stay listed until their upload starts, in case this reply is lost).
    pub fn for_poll(&self, destination: &str) -> Vec<LogRequest> {
        let mut pending = self.lock();
        let mut out: Vec<LogRequest> = pending
            .values_mut()
            .filter(|p| p.destination == destination && p.sender.is_some())
            .map(|p| {
                p.handed_out = true;
                p.request.clone()
            })
            .collect();
        drop(pending);
        if let Some(peers) = &self.peers {
            // Ours are published too: each id once.
            out.extend(peers.for_poll(destination));
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out.dedup_by(|a, b| a.id == b.id);
        out
    }

    /// The reader's channel of request `id` of `destination`, once: the upload starts.
    pub fn start_upload(
        &self,
        destination: &str,
        id: &str,
    ) -> Result<mpsc::Sender<LogEvent>, UploadRefused> {
        let mut pending = self.lock();
        let unknown = || UploadRefused::Unknown {
            id: id.to_string(),
            destination: destination.to_string(),
        };
        let p = pending
            .get_mut(id)
            .filter(|p| p.destination == destination)
            .ok_or_else(unknown)?;
        let sender = p.sender.take().ok_or_else(unknown)?;
        pending.remove(id);
        drop(pending);
        self.withdraw(id);
        Ok(sender)
    }

    /// Drops request `id` unless its upload started; `true` if it was still waiting.
    fn give_up(&self, id: &str) -> bool {
        let mut pending = self.lock();
        let waiting = pending.get(id).is_some_and(|p| p.sender.is_some());
        pending.remove(id);
        drop(pending);
        self.withdraw(id);
        waiting
    }

    /// Removes request `id` from the other replicas' view (served, or given up).
    fn withdraw(&self, id: &str) {
        if let Some(peers) = &self.peers {
            peers.withdraw(id);
        }
    }
}

/// Removes its request from the relay when the reader's stream is dropped (and gives back its
/// project's unit).
struct Forget {
    relay: Arc<LogRelay>,
    id: String,
    _project: Option<Held>,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.relay.give_up(&self.id);
    }
}

fn note(destination: &str, text: String) -> LogEvent {
    LogEvent::Note {
        destination: destination.to_string(),
        pod: None,
        text,
    }
}

/// `time` as RFC 3339, or "never".
fn contact(time: Option<SystemTime>) -> String {
    time.and_then(|t| k8s_openapi::jiff::Timestamp::try_from(t).ok())
        .map_or_else(|| "never".to_string(), |t| t.to_string())
}

/// Whether an agent destination can be asked for a log now.
pub(super) enum Reach {
    /// its agent, to ask
    Agent(Arc<AgentDestination>),
    /// why not, as the reader's stream
    Note(BoxStream<'static, LogEvent>),
}

impl RunLogs {
    /// The log `req` asks for, of a Job on agent destination `destination`: asked of its agent
    /// through its work, relayed from its upload. Never fails: an agent that is not connected,
    /// a destination with [`PENDING_LOG_REQUESTS_PER_DESTINATION`] requests waiting already, or
    /// an agent that does not start within [`ANSWER_WAIT`], is a note.
    pub fn agent_job_log(
        &self,
        destination: &str,
        req: LogRequest,
    ) -> BoxStream<'static, LogEvent> {
        let agent = match self.reach(destination, &req) {
            Reach::Agent(a) => a,
            Reach::Note(n) => return n,
        };
        match self.relay.reserve(destination, 1) {
            Ok(mut waiting) => match waiting.pop() {
                Some(w) => self.relayed(agent, destination, req, w, None),
                None => stream::empty().boxed(),
            },
            Err(e) => stream::iter([note(destination, e.to_string())]).boxed(),
        }
    }

    /// Whether `destination` is an agent destination whose agent can be asked for `req` now.
    pub(super) fn reach(&self, destination: &str, req: &LogRequest) -> Reach {
        let agent = match self.registry.get(destination) {
            Some(Entry::Agent(a)) => a,
            _ => {
                return Reach::Note(
                    stream::iter([note(
                        destination,
                        format!("{destination:?} is not an agent destination of this server"),
                    )])
                    .boxed(),
                )
            }
        };
        // With peers the agent may be polling another replica: only the wait below tells.
        if self.relay.peers().is_none() && !agent.connected(self.offline_after) {
            return Reach::Note(
                stream::iter([note(
                    destination,
                    format!(
                        "the agent of {destination} is not connected (last contact: {}); the log \
                         of Job {}/{} can only be read through it",
                        contact(agent.last_contact()),
                        req.namespace,
                        req.job
                    ),
                )])
                .boxed(),
            );
        }
        Reach::Agent(agent)
    }

    /// `req` asked of `agent` (of `destination`), holding `waiting` until its upload starts
    /// and `project` (its project's unit) as long as the reader reads.
    pub(super) fn relayed(
        &self,
        agent: Arc<AgentDestination>,
        destination: &str,
        req: LogRequest,
        waiting: Held,
        project: Option<Held>,
    ) -> BoxStream<'static, LogEvent> {
        let (id, mut rx) = self.relay.ask(destination, req.clone(), waiting);
        tracing::info!(destination, id = %id, namespace = %req.namespace, job = %req.job,
                       follow = req.follow, "log asked of the agent");
        let forget = Forget {
            relay: self.relay.clone(),
            id,
            _project: project,
        };
        let destination = destination.to_string();
        let first = async move {
            if let Some(peers) = forget.relay.peers() {
                let mut published = req.clone();
                published.id.clone_from(&forget.id);
                peers.publish(&destination, &published).await;
            }
            // Until the upload starts the wait is bounded; after, the agent's stream decides.
            let got = tokio::time::timeout(ANSWER_WAIT, rx.recv()).await;
            let mut lead = Vec::new();
            match got {
                Ok(Some(ev)) => lead.push(ev),
                Ok(None) => {}
                Err(_) if forget.relay.give_up(&forget.id) => {
                    lead.push(note(
                        &destination,
                        format!(
                            "the agent of {destination} did not answer within {}s (last \
                             contact: {}); is it running a version that streams logs?",
                            ANSWER_WAIT.as_secs(),
                            contact(agent.last_contact())
                        ),
                    ));
                    return stream::iter(lead).boxed();
                }
                Err(_) => {}
            }
            let rest = stream::unfold((rx, forget), |(mut rx, forget)| async move {
                rx.recv().await.map(|ev| (ev, (rx, forget)))
            });
            stream::iter(lead).chain(rest).boxed()
        };
        stream::once(first).flatten().boxed()
    }

    /// An agent's upload of the log request `id`: its token must be `destination`'s, the id a
    /// pending request of that destination; the body's NDJSON events go to the reader one by
    /// one, waiting for it when it is slow. Events are relabelled with the route's destination
    /// (an agent speaks only for its own). A request another replica published and holds is
    /// forwarded there (once: a forwarded upload is never forwarded again).
    pub async fn upload(
        &self,
        caller: &Principal,
        destination: String,
        id: String,
        upload: LogUpload,
    ) -> Result<LogUploadReply, DispatchError> {
        authz::agent_caller(caller, &destination)?;
        let Some(Entry::Agent(agent)) = self.registry.get(&destination) else {
            tracing::warn!(subject = %caller.subject, destination, "refused: not an agent destination");
            return Err(DispatchError::NotFound(
                format!("{destination:?} is not an agent destination of this server").into(),
            ));
        };
        agent.contact(&caller.subject, 0);
        let sender = match self.relay.start_upload(&destination, &id) {
            Ok(sender) => sender,
            Err(e) => {
                let elsewhere = self
                    .relay
                    .peers()
                    .filter(|_| upload.forwarded_by.is_none())
                    .and_then(|p| Some((p, p.owner_of(&destination, &id)?)));
                if let Some((peers, owner)) = elsewhere {
                    return peers.forward(owner, &destination, &id, upload).await;
                }
                tracing::warn!(subject = %caller.subject, destination, id,
                               forwarded_by = upload.forwarded_by.as_deref(),
                               "refused: log upload of no pending request");
                return Err(DispatchError::NotFound(Reason::of(e)));
            }
        };
        let span = tracing::info_span!(
            "log_upload",
            destination,
            id,
            forwarded_by = upload.forwarded_by.as_deref()
        );
        let reply = relay_lines(&destination, upload.body, &sender).await;
        span.in_scope(|| {
            tracing::info!(
                delivered = reply.delivered,
                reader_gone = reply.reader_gone,
                "log upload ended"
            )
        });
        Ok(reply)
    }
}

mod lines;
use lines::relay_lines;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_is_handed_out_until_its_upload_starts_then_only_once() {
        let relay = LogRelay::default();
        let req = LogRequest {
            id: String::new(),
            namespace: "verify".into(),
            job: "j".into(),
            container: None,
            follow: false,
        };
        let waiting = relay.reserve("edge", 1).unwrap().pop().unwrap();
        let (id, _rx) = relay.ask("edge", req, waiting);
        assert_eq!(id.len(), 32, "128 random bits: {id}");
        assert!(relay.has_new("edge") && !relay.has_new("other"));
        assert_eq!(relay.for_poll("edge")[0].id, id);
        assert!(
            !relay.has_new("edge"),
            "carried: a poll does not answer at once again"
        );
        assert_eq!(
            relay.for_poll("edge").len(),
            1,
            "listed until the upload starts"
        );
        assert!(
            relay.start_upload("other", &id).is_err(),
            "another destination's route"
        );
        assert!(relay.start_upload("edge", &id).is_ok());
        assert!(relay.start_upload("edge", &id).is_err(), "only one upload");
        assert!(relay.for_poll("edge").is_empty());
    }
}
