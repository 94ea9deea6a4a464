//! The AnalysisRuns of the control plane, watched, so that the server acts only for runs that
//! exist: a measurement request names a run (namespace, name, uid) and a metric, and a caller
//! could name anything. [`Runs::confirm`] checks the request against a watch cache — no API
//! call per request — that keeps, per run, its uid and the names of the metrics that use
//! our plugin (an AnalysisRun's status grows with every measurement; we need none of it).
//!
//! The uid cannot be chosen by a tenant (the API server assigns it), so a request whose run,
//! uid and metric match a real run using our plugin is about that run and no other; what the
//! measurement metadata says is checked separately (`engine::job_ref`).
//!
//! A run created a moment ago may not have reached the watch yet: `confirm` waits for it up to
//! a bound before it refuses. Until the first list has arrived it answers
//! [`RunError::NotSynced`], which the API turns into a retry (503), never a verdict.
//!
//! The watch is a [`crate::watch::watch`]: a watch ended by `410 Gone` or stalled (open, silent
//! past [`crate::watch::STALL`]) lists again, with one line of its own. From then until that
//! relist ends the runs held may be stale — a run created, or created again under its name,
//! while the watch was silent is missing —, so `confirm` does not refuse from them: what would
//! be a 403 (no such run, another uid), and with it an `Error` measurement for a real run, is
//! [`RunError::NotSynced`] instead. What it confirms meanwhile is still so (a uid names one run
//! for ever; a run deleted meanwhile leaves Jobs the sweep removes).
//!
//! For the pages (`/ui`) each run of ours also keeps a small [`RunSummary`] (`runs/summary.rs`:
//! phase, message, times, the last measurement per metric), read by [`Runs::recent`] and
//! [`Runs::summary`].

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dispatch_api::block::PLUGIN_NAME;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::Instrument;

use crate::watch::{self as watches, Source, WatchError, Watched};

mod read;
mod summary;
pub use read::{ReadError, Reader, PAGE_READS_AT_ONCE, READS_AT_ONCE, READ_TIMEOUT};
pub use summary::{
    is_completed, MetricSummary, RunSummary, LABEL_STAGE, MAX_MESSAGE, SUMMARIES_KEPT,
};

/// How long [`Runs::confirm`] waits for a run it does not know yet (watch lag).
pub const CONFIRM_WAIT: Duration = Duration::from_secs(3);

/// The AnalysisRun resource (`argoproj.io/v1alpha1`).
pub fn resource() -> ApiResource {
    ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: "AnalysisRun".into(),
        plural: "analysisruns".into(),
    }
}

/// Where a run is in its life, as the sweep needs it (`engine/sweep.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    /// not finished
    Running,
    /// finished, at `status.completedAt` when Argo recorded it
    Completed(Option<Timestamp>),
}

impl RunState {
    /// The state of an AnalysisRun object: completed once its phase is final
    /// ([`is_completed`]).
    pub fn of(run: &DynamicObject) -> Self {
        let status = &run.data["status"];
        if !is_completed(status["phase"].as_str().unwrap_or_default()) {
            return Self::Running;
        }
        Self::Completed(summary::time(&status["completedAt"]).map(|t| t.0))
    }
}

/// What we keep of one AnalysisRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    /// `metadata.uid`
    pub uid: String,
    /// the names of its metrics whose provider is our plugin
    pub metrics: Vec<String>,
    /// running, or completed and when
    pub state: RunState,
    /// what the pages show of it (`/ui`); `None` for a run without metrics of ours, and for a
    /// run older than the newest [`SUMMARIES_KEPT`] (read live when asked for: `summary.rs`)
    pub summary: Option<Box<RunSummary>>,
}

impl RunFacts {
    /// The facts of an AnalysisRun object (`None` without a name or namespace).
    pub fn of(run: &DynamicObject) -> Option<((String, String), Self)> {
        let key = (run.metadata.namespace.clone()?, run.metadata.name.clone()?);
        let metrics: Vec<String> = run.data["spec"]["metrics"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["provider"]["plugin"].get(PLUGIN_NAME).is_some())
            .filter_map(|m| m["name"].as_str().map(String::from))
            .collect();
        let uid = run.metadata.uid.clone().unwrap_or_default();
        // Runs of other providers are never shown: the pages are about our Jobs.
        let summary = if metrics.is_empty() {
            None
        } else {
            RunSummary::of(run, &metrics).map(Box::new)
        };
        Some((
            key,
            Self {
                uid,
                metrics,
                state: RunState::of(run),
                summary,
            },
        ))
    }

    /// Whether these are the facts of the run with `uid` that has our `metric`.
    fn confirms(&self, uid: &str, metric: &str) -> bool {
        self.uid == uid && self.metrics.iter().any(|m| m == metric)
    }

    /// Whether run `namespace/name`, with these facts, is the run with `uid` that has our
    /// `metric`: `Ok`, or the refusal that says which it is not.
    fn judge(&self, namespace: &str, name: &str, uid: &str, metric: &str) -> Result<(), RunError> {
        if self.uid != uid {
            return Err(RunError::OtherUid {
                namespace: namespace.to_string(),
                name: name.to_string(),
                claimed: uid.to_string(),
                actual: self.uid.clone(),
            });
        }
        if !self.metrics.iter().any(|m| m == metric) {
            return Err(RunError::NoSuchMetric {
                namespace: namespace.to_string(),
                name: name.to_string(),
                metric: metric.to_string(),
            });
        }
        Ok(())
    }
}

/// Run `namespace/name` cannot be confirmed because its live read failed with `error`.
fn not_synced(namespace: &str, name: &str, error: &ReadError) -> RunError {
    RunError::NotSynced {
        namespace: namespace.to_string(),
        name: name.to_string(),
        problem: format!(": {error}"),
    }
}

/// A request the control plane's runs do not confirm.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The watch has not listed the runs yet, or lists them again (after a 410 or a stall):
    /// ask again later.
    #[error(
        "cannot confirm AnalysisRun {namespace}/{name} yet: the server's watch of analysisruns \
         on the control plane is not synced{problem}; the server needs list and watch on \
         analysisruns.argoproj.io there (or `confirmRuns: false` in its config)"
    )]
    NotSynced {
        /// the run's namespace
        namespace: String,
        /// the run
        name: String,
        /// `: <why the watch fails>`, or empty
        problem: String,
    },
    /// No such run.
    #[error("AnalysisRun {namespace}/{name} does not exist on the control plane")]
    NoSuchRun {
        /// the run's namespace
        namespace: String,
        /// the run
        name: String,
    },
    /// The run exists with another uid: the request is not about it.
    #[error(
        "AnalysisRun {namespace}/{name} has uid {actual}, not {claimed}: the request is not \
         about that run"
    )]
    OtherUid {
        /// the run's namespace
        namespace: String,
        /// the run
        name: String,
        /// the uid the request claims
        claimed: String,
        /// the run's uid
        actual: String,
    },
    /// The run has no such metric using our plugin.
    #[error(
        "AnalysisRun {namespace}/{name} has no metric {metric:?} whose provider is the \
         {PLUGIN_NAME} plugin"
    )]
    NoSuchMetric {
        /// the run's namespace
        namespace: String,
        /// the run
        name: String,
        /// the metric the request names
        metric: String,
    },
}

#[derive(Debug, Default)]
struct State {
    runs: HashMap<(String, String), RunFacts>,
    /// run uid → namespace, of `runs`
    namespaces: HashMap<String, String>,
    /// the objects of a re-list in progress, swapped in at its end
    relist: Option<HashMap<(String, String), RunFacts>>,
    synced: bool,
    /// a list is under way after the first (a 410 or a stall started it): `runs` may be stale
    relisting: bool,
    problem: Option<String>,
    /// how many of `runs` keep a summary (`summary.rs` keeps it near [`SUMMARIES_KEPT`])
    summaries: usize,
    /// runs started before this keep no summary (the oldest start kept at the last prune)
    summary_cutoff: Option<Time>,
}

impl State {
    fn apply(&mut self, event: Event<DynamicObject>) {
        match event {
            Event::Apply(run) => {
                if let Some((key, mut facts)) = RunFacts::of(&run) {
                    self.trim_summary(&mut facts);
                    self.namespaces.insert(facts.uid.clone(), key.0.clone());
                    let uid = facts.uid.clone();
                    self.summaries += usize::from(facts.summary.is_some());
                    // A run deleted and created again under its name has a new uid.
                    if let Some(old) = self.runs.insert(key, facts) {
                        self.summaries -= usize::from(old.summary.is_some());
                        if old.uid != uid {
                            self.namespaces.remove(&old.uid);
                        }
                    }
                    self.prune_summaries();
                }
            }
            Event::Delete(run) => {
                if let Some((key, _)) = RunFacts::of(&run) {
                    if let Some(old) = self.runs.remove(&key) {
                        self.summaries -= usize::from(old.summary.is_some());
                        self.namespaces.remove(&old.uid);
                    }
                }
            }
            Event::Init => {
                self.relist = Some(HashMap::new());
                self.relisting = true;
            }
            Event::InitApply(run) => {
                if let Some((key, mut facts)) = RunFacts::of(&run) {
                    self.trim_summary(&mut facts);
                    if let Some(relist) = &mut self.relist {
                        relist.insert(key, facts);
                    }
                }
            }
            Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.namespaces = relist
                        .iter()
                        .map(|((namespace, _), f)| (f.uid.clone(), namespace.clone()))
                        .collect();
                    self.summaries = relist.values().filter(|f| f.summary.is_some()).count();
                    self.runs = relist;
                    self.prune_summaries();
                }
                self.synced = true;
                self.relisting = false;
                self.problem = None;
            }
        }
    }
}

/// The watch cache of the control plane's AnalysisRuns. Cheap to clone; the watch stops when
/// the last clone is dropped (a restarted `serve` in a test process, `doctor`).
#[derive(Debug, Clone)]
pub struct Runs {
    state: Arc<RwLock<State>>,
    changed: watch::Sender<u64>,
    /// reads a run live before a refusal (`read.rs`); `None`: refusals come from the watch alone
    reader: Option<Reader>,
    /// reads the page of a run older than the summaries kept (`summary.rs`), beside `reader`
    page_reader: Option<Reader>,
    /// aborts the watch task when the last handle goes (the task's own handle has none)
    _task: Option<Arc<AbortOnDrop>>,
}

#[derive(Debug)]
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Default for Runs {
    fn default() -> Self {
        Self {
            state: Arc::default(),
            changed: watch::channel(0).0,
            reader: None,
            page_reader: None,
            _task: None,
        }
    }
}

impl Runs {
    /// Starts watching every AnalysisRun `client` may list, until the last handle is dropped.
    pub fn watch(client: kube::Client) -> Self {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource());
        Self::watch_from(api, Some(Reader::of(client)))
    }

    /// [`Runs::watch`] of the AnalysisRuns `source` lists and watches (a scripted API in tests).
    fn watch_from<S: Source<DynamicObject>>(source: S, reader: Option<Reader>) -> Self {
        let mut runs = Self {
            page_reader: reader.as_ref().map(|r| r.beside(PAGE_READS_AT_ONCE)),
            reader,
            ..Self::default()
        };
        let feed = runs.clone();
        let watched = Watched {
            destination: "control-plane".into(),
            resource: resource().plural,
            namespace: None,
        };
        let task = tokio::spawn(
            async move {
                let mut stream = watches::watch(source, None, watched);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(e) => feed.apply(e),
                        Err(e) => feed.failed(&e),
                    }
                }
            }
            .instrument(tracing::info_span!("analysisrun_watch")),
        );
        runs._task = Some(Arc::new(AbortOnDrop(task.abort_handle())));
        runs
    }

    /// No watch: what tests feed with [`Runs::apply`], refusing only after `reader`'s read.
    #[cfg(test)]
    pub(crate) fn with_reader(reader: Option<Reader>) -> Self {
        Self {
            page_reader: reader.as_ref().map(|r| r.beside(PAGE_READS_AT_ONCE)),
            reader,
            ..Self::default()
        }
    }

    /// The watch failed with `error`; it goes on by itself after a backoff.
    fn failed(&self, error: &WatchError) {
        // A 410 or a stall said so in its own line (`crate::watch`), and lists again: until
        // that list ends, refusals are not to be trusted.
        if error.relists() {
            self.state
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .relisting = true;
        } else {
            tracing::warn!(%error, "watching analysisruns on the control plane");
        }
        self.set_problem(error.to_string());
    }

    /// Feeds one watch event (the watch task, and tests).
    pub fn apply(&self, event: Event<DynamicObject>) {
        if let Some(reader) = &self.reader {
            reader.heard();
        }
        self.state
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .apply(event);
        self.changed.send_modify(|n| *n += 1);
    }

    fn set_problem(&self, problem: String) {
        self.state
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .problem = Some(problem);
        self.changed.send_modify(|n| *n += 1);
    }

    /// Whether the run with UID `uid` is in `namespace` (as the watch last saw it).
    pub fn is_run_in(&self, namespace: &str, uid: &str) -> bool {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.namespaces.get(uid).is_some_and(|ns| ns == namespace)
    }

    /// Whether the first list has arrived.
    pub fn is_synced(&self) -> bool {
        self.state.read().unwrap_or_else(|e| e.into_inner()).synced
    }

    /// Whether a run the watch does not hold does not exist (or is too new for the watch yet):
    /// the first list has arrived, and no list after a 410 or a stall is under way.
    pub fn is_authoritative(&self) -> bool {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.synced && !state.relisting
    }

    /// Why the watch fails, if it does (its last error since the last complete list).
    pub fn problem(&self) -> Option<String> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.problem.clone()
    }

    /// Waits up to `timeout` for the first list; whether it arrived.
    pub async fn wait_synced(&self, timeout: std::time::Duration) -> bool {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.mark_unchanged();
            if self.is_synced() {
                return true;
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return self.is_synced();
            }
        }
    }

    /// `Ok` when run `namespace/name` exists with `uid` and has `metric` with our plugin,
    /// waiting up to `wait` for a run the watch has not delivered yet.
    pub async fn confirm(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
        wait: Duration,
    ) -> Result<(), RunError> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            changes.mark_unchanged();
            let verdict = self.check(namespace, name, uid, metric);
            match &verdict {
                Ok(()) | Err(RunError::NoSuchMetric { .. }) => return verdict,
                Err(_) => {}
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return self.read_live(namespace, name, uid, metric, verdict).await;
            }
        }
    }

    /// `verdict` unless the live read (`read.rs`) says otherwise: before a refusal
    /// ([`Runs::read_before_refusing`]) and while the watch cannot say
    /// ([`Runs::read_while_unlisted`]).
    async fn read_live(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
        verdict: Result<(), RunError>,
    ) -> Result<(), RunError> {
        match verdict {
            Err(RunError::NoSuchRun { .. } | RunError::OtherUid { .. }) => {
                self.read_before_refusing(namespace, name, uid, metric, verdict)
                    .await
            }
            Err(RunError::NotSynced { .. }) => {
                self.read_while_unlisted(namespace, name, uid, metric, verdict)
                    .await
            }
            _ => verdict,
        }
    }

    /// A refusal (no such run, another uid) checked against a live read: the run found is
    /// taken into the cache and checked; no answer (or an error answer) is a retry, and no
    /// answer marks the control plane unanswered.
    async fn read_before_refusing(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
        verdict: Result<(), RunError>,
    ) -> Result<(), RunError> {
        let Some(reader) = self.reader.as_ref() else {
            return verdict;
        };
        match reader.read(namespace, name).await {
            Ok(Some(run)) => {
                let Some((_, facts)) = RunFacts::of(&run) else {
                    return verdict;
                };
                let judged = facts.judge(namespace, name, uid, metric);
                if judged.is_ok() {
                    self.apply(Event::Apply(run));
                }
                judged
            }
            Ok(None) => Err(RunError::NoSuchRun {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            Err(e) => Err(not_synced(namespace, name, &e)),
        }
    }

    /// While the watch has not listed (or lists again), one live read: the run found with
    /// `uid` and our `metric` is confirmed (and taken into the cache); no answer is
    /// `NotSynced` naming it and marks the control plane unanswered; anything else keeps
    /// `verdict` — a refusal waits for the list, and the watch's own problem (a missing
    /// permission, say) says more than one read's. Without it a replica that never reached its
    /// control plane (cut from it as it started) stayed ready, answered 503 to every call, and
    /// took the agents' polls: `make faults`' replica cut ended an agent run `Running` at its
    /// deadline that way when the cut came before the first list.
    async fn read_while_unlisted(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
        verdict: Result<(), RunError>,
    ) -> Result<(), RunError> {
        let Some(reader) = self.reader.as_ref() else {
            return verdict;
        };
        match reader.read(namespace, name).await {
            Ok(Some(run)) => {
                if RunFacts::of(&run).is_some_and(|(_, facts)| facts.confirms(uid, metric)) {
                    self.apply(Event::Apply(run));
                    return Ok(());
                }
                verdict
            }
            Err(e @ ReadError::Unanswered { .. }) => Err(not_synced(namespace, name, &e)),
            Ok(None) | Err(_) => verdict,
        }
    }

    /// Since when the control plane has left a live read of a run unanswered, with nothing
    /// heard from it since (no watch event, no other answer): this replica cannot confirm runs
    /// and should take no traffic (`serve` turns it unready).
    pub fn control_plane_unanswered_since(&self) -> Option<std::time::Instant> {
        self.reader.as_ref()?.unanswered_since()
    }

    /// [`Runs::confirm`] without waiting.
    pub fn check(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
    ) -> Result<(), RunError> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let not_synced = || RunError::NotSynced {
            namespace: namespace.to_string(),
            name: name.to_string(),
            problem: state
                .problem
                .as_ref()
                .map(|p| format!(": {p}"))
                .unwrap_or_default(),
        };
        if !state.synced {
            return Err(not_synced());
        }
        // While a relist is under way, a run missing, or held with another uid, may have been
        // created since the watch went silent: a retry, not a refusal.
        let Some(facts) = state.runs.get(&(namespace.to_string(), name.to_string())) else {
            if state.relisting {
                return Err(not_synced());
            }
            return Err(RunError::NoSuchRun {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        };
        if facts.uid != uid && state.relisting {
            return Err(not_synced());
        }
        facts.judge(namespace, name, uid, metric)
    }
    /// Every run's state by uid, for the sweep; `None` unless the watch is authoritative
    /// ([`Runs::is_authoritative`]): the sweep lists the runs itself then. A copy, not a view
    /// under the lock: the sweep awaits its deletions while it judges, and the watch must not
    /// wait on them (a few thousand short strings per sweep, next to the list it replaces).
    pub fn states(&self) -> Option<HashMap<String, RunState>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        if !state.synced || state.relisting {
            return None;
        }
        Some(
            state
                .runs
                .values()
                .map(|f| (f.uid.clone(), f.state))
                .collect(),
        )
    }

    /// The uid of run `namespace/name`, if the watch has it (people name runs without one).
    pub fn uid_of(&self, namespace: &str, name: &str) -> Option<String> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state
            .runs
            .get(&(namespace.to_string(), name.to_string()))
            .map(|f| f.uid.clone())
    }
}

#[cfg(test)]
mod tests;
