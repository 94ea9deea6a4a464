//! The whole log of a run's Jobs (`GET /v1/runs/{namespace}/{name}/logs`), for a viewer the
//! route has already allowed to see the run's namespace.
//!
//! The run is named by people, who do not know its uid: the watch of the control plane's
//! AnalysisRuns gives it ([`Runs::uid_of`]), so the log API needs `controlPlane` (and
//! `confirmRuns` left on). Its Jobs are found without an API call: on a direct destination in
//! the Job watch cache (label `rollouts-dispatch.io/run-uid`, metric from `job::ANN_METRIC`),
//! on an agent destination from the store's records of the run, whose log the agent streams
//! (`agent_job_log`). Labels are public: anyone who may create Jobs in the namespace can put
//! ours on a Job of theirs, so a Job is shown only when it also carries the server's mark for
//! this run and its pod template (`job::mark::verify`); one with our labels and not our mark is
//! named in a note and its log is not read.
//!
//! Each Job's log is [`job_log`], redacted of the values of every Secret its containers can read
//! (`logs::secrets`); a container whose Secret cannot be read is withheld with a note rather than
//! leaked. Without `follow` the destinations come one after the other (by name) and their Jobs
//! in order (metric, measurement, name), so the whole log arrives in order; with `follow` all
//! are read side by side. A destination that no longer has the run's Jobs gets a note saying
//! why: Jobs, and their logs, live `jobs.ttlAfterFinished` after they finish.
//!
//! Each read holds one of its project's log streams until its stream ends or the reader hangs
//! up (`budgets.logStreamsPerProject`), and one of its project's log requests per Job it asks
//! an agent for, all or none (`budgets.logRequestsPerProject`, and the destination's
//! `budgets.pendingLogRequestsPerDestination` until the upload starts): beyond any of them the
//! read is answered `429 over_budget` before any request reaches an agent.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dispatch_api::logs::{LogEvent, LogRequest, LogsQuery};
use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;

use super::relay::{LogRelay, Reach};
use super::secrets;
use super::stream::{job_log, JobLog};
use super::Redactor;
use crate::config::budgets::{LOG_REQUESTS_PER_PROJECT, LOG_STREAMS_PER_PROJECT};
use crate::config::{BudgetsConfig, JobsSettings};
use crate::destinations::{AgentDestination, Destination, Entry, Registry};
use crate::http::{DispatchError, RunName};
use crate::job::{self, Ownership, ANN_MEASUREMENT, ANN_METRIC};
use crate::policy::Policy;
use crate::runs::Runs;
use crate::runtime::metrics::Metrics;
use crate::runtime::quota::{Held, Quota};
use crate::signing::Signer;
use crate::store::{random_id, Store};

/// How long reading one Secret (to redact its values) may take.
const SECRET_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Where Jobs went when they are no longer there, for the notes.
const GONE: &str = "Jobs are kept for jobs.ttlAfterFinished after they finish (default 1h; the \
                    sweep deletes those of runs completed longer ago than jobs.retention), then \
                    deleted with their pods and logs";

/// The log API of one replica: a run's Jobs found on the destinations of the registry, their
/// logs read directly or relayed from agents.
pub struct RunLogs {
    pub(super) registry: Arc<Registry>,
    /// the records of agent destinations (`None`: no `agents` in the config)
    store: Option<Arc<Store>>,
    /// the control plane's AnalysisRuns: the uid of a run named by people
    runs: Option<Runs>,
    /// log requests waiting for, or streamed by, agents
    pub(super) relay: Arc<LogRelay>,
    /// an agent silent this long is not connected
    pub(super) offline_after: Duration,
    /// how long finished Jobs are kept, for the notes
    jobs: JobsSettings,
    /// the log streams each project has open
    streams: Quota,
    /// the log requests at agent destinations each project has open
    requests: Quota,
    /// what may be shown
    scope: Scope,
}

/// The per-project quotas of the log API, sized by `budgets`, refusals counted in `metrics`.
pub fn log_quotas(budgets: &BudgetsConfig, metrics: Option<Arc<Metrics>>) -> (Quota, Quota) {
    let streams = Quota::new(
        LOG_STREAMS_PER_PROJECT,
        "project",
        "log streams open",
        budgets.log_streams_per_project,
        metrics.clone(),
    );
    let requests = Quota::new(
        LOG_REQUESTS_PER_PROJECT,
        "project",
        "log requests open at agent destinations",
        budgets.log_requests_per_project,
        metrics,
    );
    (streams, requests)
}

/// What the log view may show of a run: the destinations its project may use, the Jobs the
/// engine marked.
#[derive(Clone)]
pub struct Scope {
    /// the policy: only destinations the run's project may use are read (and named in notes)
    pub policy: Policy,
    /// the keys of the engine's Job marks (`Engine::job_marker`): only a Job marked with them
    /// is shown
    pub marker: Arc<Signer>,
}

impl RunLogs {
    /// The logs of the Jobs on `registry`'s destinations (agent destinations' records in
    /// `store`), runs found in `runs`, agents' logs through `relay`, within `scope`.
    pub fn new(
        registry: Arc<Registry>,
        store: Option<Arc<Store>>,
        runs: Option<Runs>,
        relay: Arc<LogRelay>,
        offline_after: Duration,
        jobs: JobsSettings,
        scope: Scope,
    ) -> Self {
        let (streams, requests) = log_quotas(&BudgetsConfig::default(), None);
        Self {
            registry,
            store,
            runs,
            relay,
            offline_after,
            jobs,
            streams,
            requests,
            scope,
        }
    }

    /// The same, each project's streams and agent log requests bounded by `streams` and
    /// `requests` ([`log_quotas`]).
    pub fn with_quotas(mut self, (streams, requests): (Quota, Quota)) -> Self {
        self.streams = streams;
        self.requests = requests;
        self
    }

    /// The relay of agents' logs (its log requests ride on the agents' work).
    pub fn relay(&self) -> &Arc<LogRelay> {
        &self.relay
    }

    /// The log stream of run `run` as `query` narrows it (see the module).
    pub async fn of_run(
        &self,
        run: RunName,
        query: LogsQuery,
    ) -> Result<BoxStream<'static, LogEvent>, DispatchError> {
        let uid = run_uid(self.runs.as_ref(), &run)?;
        let stream = self.streams.take(&run.namespace)?;
        // The notes name destinations: only those the run's project may use (another tenant's
        // is as unknown here as a missing one).
        let usable = |e: &Entry| {
            self.scope
                .policy
                .allows_destination(&run.namespace, e.name())
        };
        let entries: Vec<Entry> = match &query.destination {
            Some(d) => vec![self
                .registry
                .get(d)
                .filter(usable)
                .ok_or_else(|| DispatchError::UnknownDestination(d.clone().into()))?],
            None => self.registry.entries().into_iter().filter(usable).collect(),
        };
        let mut found: Vec<Part> = Vec::new();
        for entry in entries {
            let part = match entry {
                Entry::Ready(d) => {
                    direct_logs(&d, &uid, &query, self.jobs, &self.scope.marker).map(Part::Ready)
                }
                Entry::Agent(a) => self.agent_logs(&a.name, &uid, &query),
                Entry::Broken(b) => (query.destination.is_some()).then(|| {
                    Part::Ready(note(
                        &b.name,
                        None,
                        format!("the destination cannot be used: {}", b.error),
                    ))
                }),
            };
            found.extend(part);
        }
        let mut parts = self.ask_agents(&run.namespace, found, query.follow)?;
        if parts.is_empty() {
            parts.push(note(
                query.destination.as_deref().unwrap_or("*"),
                None,
                format!(
                    "no Job of run {}/{}{} is on any destination now: not started yet, or {GONE}",
                    run.namespace,
                    run.name,
                    query
                        .metric
                        .as_ref()
                        .map(|m| format!(" (metric {m})"))
                        .unwrap_or_default()
                ),
            ));
        }
        Ok(holding(combine(parts, query.follow), stream))
    }

    /// The log requests of the run's Jobs on agent destination `destination`, from the
    /// store's records (`None`: no record of the run there); notes when its agent cannot be
    /// asked now.
    fn agent_logs(&self, destination: &str, uid: &str, query: &LogsQuery) -> Option<Part> {
        let store = self.store.as_ref()?;
        let mut records: Vec<_> = store
            .for_run(uid)
            .into_iter()
            .filter(|r| r.spec.destination == destination && r.spec.observe.is_none())
            .filter(|r| query.metric.as_ref().is_none_or(|m| &r.spec.metric == m))
            .collect();
        records.sort_by(|a, b| {
            (&a.spec.metric, a.spec.measurement, &a.spec.job_name).cmp(&(
                &b.spec.metric,
                b.spec.measurement,
                &b.spec.job_name,
            ))
        });
        let requests: Vec<LogRequest> = records
            .into_iter()
            .map(|r| LogRequest {
                id: random_id(),
                namespace: r.spec.namespace,
                job: r.spec.job_name,
                container: query.container.clone(),
                follow: query.follow,
            })
            .collect();
        let agent = match self.reach(destination, requests.first()?) {
            Reach::Agent(a) => a,
            // Not reachable: a note per Job (each names its Job), nothing asked.
            Reach::Note(_) => {
                let notes = requests
                    .iter()
                    .filter_map(|r| match self.reach(destination, r) {
                        Reach::Note(n) => Some(n),
                        Reach::Agent(_) => None,
                    })
                    .collect();
                return Some(Part::Ready(combine(notes, query.follow)));
            }
        };
        Some(Part::Ask {
            agent,
            destination: destination.to_string(),
            requests,
        })
    }

    /// The streams of a read's `parts`, its agents asked only once every unit is held: one of
    /// `project`'s requests and one of its destination's waiting ones per request, all or none
    /// (else `429`, and no agent was asked anything).
    fn ask_agents(
        &self,
        project: &str,
        parts: Vec<Part>,
        follow: bool,
    ) -> Result<Vec<BoxStream<'static, LogEvent>>, DispatchError> {
        let asked = parts
            .iter()
            .map(|p| match p {
                Part::Ask { requests, .. } => requests.len(),
                Part::Ready(_) => 0,
            })
            .sum();
        let mut projects = self.requests.take_n(project, asked)?;
        let mut waiting = Vec::new();
        for p in &parts {
            if let Part::Ask {
                destination,
                requests,
                ..
            } = p
            {
                waiting.push(self.relay.reserve(destination, requests.len())?);
            }
        }
        let mut waiting = waiting.into_iter();
        let streams = parts
            .into_iter()
            .map(|p| match p {
                Part::Ready(s) => s,
                Part::Ask {
                    agent,
                    destination,
                    requests,
                } => {
                    let held = waiting.next().unwrap_or_default();
                    let asks = requests
                        .into_iter()
                        .zip(held)
                        .map(|(req, w)| {
                            self.relayed(agent.clone(), &destination, req, w, projects.pop())
                        })
                        .collect();
                    combine(asks, follow)
                }
            })
            .collect();
        Ok(streams)
    }
}

/// One destination's share of a read, before any agent is asked.
enum Part {
    /// a stream that asks no agent
    Ready(BoxStream<'static, LogEvent>),
    /// requests for `agent`, asked once the read's budgets are held
    Ask {
        agent: Arc<AgentDestination>,
        destination: String,
        requests: Vec<LogRequest>,
    },
}

/// The uid of `run` from the watch of the control plane's runs.
fn run_uid(runs: Option<&Runs>, run: &RunName) -> Result<String, DispatchError> {
    let Some(runs) = runs else {
        return Err(DispatchError::NotFound(
            format!(
            "cannot find run {}/{}: the log API finds runs in the server's watch of the control \
             plane's AnalysisRuns, which needs `controlPlane` in the server's config (and \
             `confirmRuns` not false)",
            run.namespace, run.name
        )
            .into(),
        ));
    };
    if !runs.is_synced() {
        return Err(DispatchError::Unavailable(
            format!(
            "the server's watch of analysisruns on the control plane has not listed them yet{}; \
             ask again in a moment (the server needs list and watch on analysisruns.argoproj.io \
             there)",
            runs.problem().map(|p| format!(": {p}")).unwrap_or_default()
        )
            .into(),
        ));
    }
    runs.uid_of(&run.namespace, &run.name).ok_or_else(|| {
        DispatchError::NotFound(
            format!(
                "no AnalysisRun {}/{} on the control plane",
                run.namespace, run.name
            )
            .into(),
        )
    })
}

/// The logs of the run's Jobs on direct destination `d` (`None`: none of them there and the
/// query did not name it); a Job with our labels but not `marker`'s mark gets a note instead.
fn direct_logs(
    d: &Arc<Destination>,
    uid: &str,
    query: &LogsQuery,
    jobs: JobsSettings,
    marker: &Signer,
) -> Option<BoxStream<'static, LogEvent>> {
    if !d.jobs().is_authoritative() {
        return Some(note(
            &d.name,
            None,
            format!(
                "the server's watch of Jobs on this destination is not synced{}; ask again in \
                 a moment",
                d.cache_problem()
                    .map(|p| format!(" ({p})"))
                    .unwrap_or_default()
            ),
        ));
    }
    let (mut found, unmarked): (Vec<Arc<Job>>, Vec<Arc<Job>>) = d
        .jobs()
        .group(uid)
        .into_iter()
        .filter(|j| job::ownership(j, uid) == Ownership::Ours)
        .filter(|j| {
            query
                .metric
                .as_ref()
                .is_none_or(|m| annotation(j, ANN_METRIC) == Some(m.as_str()))
        })
        .partition(|j| {
            let value = serde_json::to_value(&**j).unwrap_or_default();
            job::mark::verify(&value, marker, uid).is_ok()
        });
    let refused: Vec<BoxStream<'static, LogEvent>> = unmarked
        .iter()
        .map(|j| {
            let what = format!(
                "{}/{}",
                j.metadata.namespace.as_deref().unwrap_or_default(),
                j.metadata.name.as_deref().unwrap_or_default()
            );
            tracing::warn!(destination = %d.name, job = %what,
                           "log not shown: a job with this run's labels but not our mark");
            note(
                &d.name,
                None,
                format!(
                    "Job {what} carries this run's labels but not this server's mark \
                     ({}): it was not created by this server for this run, or was changed \
                     since, so its log is not shown",
                    job::mark::ANN_MARK
                ),
            )
        })
        .collect();
    if found.is_empty() && !refused.is_empty() {
        return Some(combine(refused, false));
    }
    if found.is_empty() {
        return query.destination.is_some().then(|| {
            note(
                &d.name,
                None,
                format!(
                    "no Job of this run here: not started yet, or deleted: {GONE} ({} here)",
                    dispatch_api::format_go_duration(jobs.ttl_after_finished)
                ),
            )
        });
    }
    found.sort_by_key(|j| {
        (
            annotation(j, ANN_METRIC).unwrap_or_default().to_string(),
            annotation(j, ANN_MEASUREMENT)
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0),
            j.metadata.name.clone().unwrap_or_default(),
        )
    });
    let parts = refused
        .into_iter()
        .chain(found.iter().map(|j| one_job(d, j, query)))
        .collect::<Vec<_>>();
    Some(combine(parts, query.follow))
}

fn annotation<'a>(job: &'a Job, key: &str) -> Option<&'a str> {
    job.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The log of one Job of ours on `d`, redacted of the Secrets its containers read; a container
/// whose Secrets cannot be read is withheld with a note.
fn one_job(d: &Arc<Destination>, j: &Job, query: &LogsQuery) -> BoxStream<'static, LogEvent> {
    let namespace = j.metadata.namespace.clone().unwrap_or_default();
    let name = j.metadata.name.clone().unwrap_or_default();
    // The pod template says which Secrets each container reads (every pod of the Job is made
    // from it).
    let template = Pod {
        spec: j.spec.as_ref().and_then(|s| s.template.spec.clone()),
        ..Pod::default()
    };
    let containers: Vec<String> = template
        .spec
        .iter()
        .flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        })
        .map(|c| c.name.clone())
        .filter(|c| query.container.as_ref().is_none_or(|o| o == c))
        .collect();
    let reads: BTreeMap<String, Vec<String>> = containers
        .iter()
        .map(|c| (c.clone(), secrets::referenced(&template, c)))
        .collect();
    let client = d.client().clone();
    let target = JobLog {
        destination: d.name.clone(),
        namespace,
        job: name,
        container: query.container.clone(),
        follow: query.follow,
        // The Job of the watch cache, whose mark was checked: only its own pods are read.
        job_uid: j.metadata.uid.clone(),
    };
    stream::once(async move {
        let mut values = Vec::new();
        let mut unreadable: BTreeMap<String, String> = BTreeMap::new();
        let names: std::collections::BTreeSet<&String> = reads.values().flatten().collect();
        for secret in names {
            let one = std::slice::from_ref(secret);
            match secrets::read(&client, &target.namespace, one, SECRET_READ_TIMEOUT).await {
                Ok(v) => values.extend(v),
                Err(e) => {
                    tracing::warn!(destination = %target.destination, job = %target.job,
                                   error = %e, "log withheld: a Secret its container reads cannot be read to redact it");
                    unreadable.insert(secret.clone(), e.to_string());
                }
            }
        }
        let redactor = Arc::new(Redactor::default().with(values));
        if unreadable.is_empty() {
            return job_log(client, target, redactor);
        }
        let mut parts = Vec::new();
        for container in containers {
            let blocked: Vec<&String> = reads[&container]
                .iter()
                .filter_map(|s| unreadable.get(s))
                .collect();
            if blocked.is_empty() {
                let only = JobLog {
                    container: Some(container),
                    ..target.clone()
                };
                parts.push(job_log(client.clone(), only, redactor.clone()));
            } else {
                parts.push(note(
                    &target.destination,
                    None,
                    format!(
                        "Job {}/{}, container {container}: log withheld, since a Secret it \
                         reads cannot be read to redact its values ({}); the server needs get \
                         on those secrets there",
                        target.namespace,
                        target.job,
                        blocked
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                ));
            }
        }
        combine(parts, target.follow)
    })
    .flatten()
    .boxed()
}

/// `events`, holding `held` until they end or the reader drops them.
fn holding(events: BoxStream<'static, LogEvent>, held: Held) -> BoxStream<'static, LogEvent> {
    stream::unfold((events, held), |(mut events, held)| async move {
        events.next().await.map(|e| (e, (events, held)))
    })
    .boxed()
}

/// Streams one after the other, or side by side when following.
fn combine(parts: Vec<BoxStream<'static, LogEvent>>, follow: bool) -> BoxStream<'static, LogEvent> {
    if follow {
        stream::select_all(parts).boxed()
    } else {
        stream::iter(parts).flatten().boxed()
    }
}

fn note(destination: &str, pod: Option<String>, text: String) -> BoxStream<'static, LogEvent> {
    stream::iter([LogEvent::Note {
        destination: destination.to_string(),
        pod,
        text,
    }])
    .boxed()
}
