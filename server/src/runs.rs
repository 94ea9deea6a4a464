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
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use tokio::sync::watch;
use tracing::Instrument;

use crate::watch::{self as watches, Source, WatchError, Watched};

mod read;
mod summary;
pub use read::{ReadError, Reader, READS_AT_ONCE, READ_TIMEOUT};
pub use summary::{is_completed, MetricSummary, RunSummary, LABEL_STAGE, MAX_MESSAGE};

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

/// What we keep of one AnalysisRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFacts {
    /// `metadata.uid`
    pub uid: String,
    /// the names of its metrics whose provider is our plugin
    pub metrics: Vec<String>,
    /// what the pages show of it (`/ui`); `None` for a run without metrics of ours
    pub summary: Option<RunSummary>,
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
            RunSummary::of(run, &metrics)
        };
        Some((
            key,
            Self {
                uid,
                metrics,
                summary,
            },
        ))
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
}

impl State {
    fn apply(&mut self, event: Event<DynamicObject>) {
        match event {
            Event::Apply(run) => {
                if let Some((key, facts)) = RunFacts::of(&run) {
                    self.namespaces.insert(facts.uid.clone(), key.0.clone());
                    let uid = facts.uid.clone();
                    // A run deleted and created again under its name has a new uid.
                    if let Some(old) = self.runs.insert(key, facts) {
                        if old.uid != uid {
                            self.namespaces.remove(&old.uid);
                        }
                    }
                }
            }
            Event::Delete(run) => {
                if let Some((key, _)) = RunFacts::of(&run) {
                    if let Some(old) = self.runs.remove(&key) {
                        self.namespaces.remove(&old.uid);
                    }
                }
            }
            Event::Init => {
                self.relist = Some(HashMap::new());
                self.relisting = true;
            }
            Event::InitApply(run) => {
                if let (Some(relist), Some((key, facts))) = (&mut self.relist, RunFacts::of(&run)) {
                    relist.insert(key, facts);
                }
            }
            Event::InitDone => {
                if let Some(relist) = self.relist.take() {
                    self.namespaces = relist
                        .iter()
                        .map(|((namespace, _), f)| (f.uid.clone(), namespace.clone()))
                        .collect();
                    self.runs = relist;
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
                return self
                    .read_before_refusing(namespace, name, uid, metric, verdict)
                    .await;
            }
        }
    }

    /// `verdict` unless it refuses (no such run, another uid) and the live read (`read.rs`)
    /// says otherwise: the run found is taken into the cache and checked; no answer is a retry.
    async fn read_before_refusing(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        metric: &str,
        verdict: Result<(), RunError>,
    ) -> Result<(), RunError> {
        let refused = matches!(
            verdict,
            Err(RunError::NoSuchRun { .. } | RunError::OtherUid { .. })
        );
        let Some(reader) = self.reader.as_ref().filter(|_| refused) else {
            return verdict;
        };
        match reader.read(namespace, name).await {
            Ok(Some(run)) => {
                let Some((_, facts)) = RunFacts::of(&run) else {
                    return verdict;
                };
                if facts.uid == uid && facts.metrics.iter().any(|m| m == metric) {
                    self.apply(Event::Apply(run));
                    return Ok(());
                }
                if facts.uid != uid {
                    return Err(RunError::OtherUid {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        claimed: uid.to_string(),
                        actual: facts.uid,
                    });
                }
                Err(RunError::NoSuchMetric {
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    metric: metric.to_string(),
                })
            }
            Ok(None) => Err(RunError::NoSuchRun {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            Err(e) => Err(RunError::NotSynced {
                namespace: namespace.to_string(),
                name: name.to_string(),
                problem: format!(": {e}"),
            }),
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
        if facts.uid != uid {
            return Err(RunError::OtherUid {
                namespace: namespace.to_string(),
                name: name.to_string(),
                claimed: uid.to_string(),
                actual: facts.uid.clone(),
            });
        }
        if !facts.metrics.iter().any(|m| m == metric) {
            return Err(RunError::NoSuchMetric {
                namespace: namespace.to_string(),
                name: name.to_string(),
                metric: metric.to_string(),
            });
        }
        Ok(())
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
mod tests {
    use super::*;
    use crate::watch::script::{after, error_event, Beat, Logs, Script};
    use crate::watch::{EXPIRED_LOG, STALL, STALLED_LOG};
    use serde_json::json;

    fn run(ns: &str, name: &str, uid: &str, metrics: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": ns, "uid": uid},
            "spec": {"metrics": metrics}
        }))
        .unwrap()
    }

    fn ours(name: &str) -> serde_json::Value {
        json!({"name": name, "provider": {"plugin": {PLUGIN_NAME: {"destination": "a"}}}})
    }

    fn synced(objects: Vec<DynamicObject>) -> Runs {
        let runs = Runs::default();
        runs.apply(Event::Init);
        for o in objects {
            runs.apply(Event::InitApply(o));
        }
        runs.apply(Event::InitDone);
        runs
    }

    #[test]
    fn only_a_real_run_with_our_metric_is_confirmed() {
        let runs = synced(vec![run(
            "team-a",
            "uat.1",
            "uid-1",
            json!([ours("smoke"), {"name": "builtin", "provider": {"job": {}}}]),
        )]);
        assert_eq!(runs.check("team-a", "uat.1", "uid-1", "smoke"), Ok(()));
        assert!(matches!(
            runs.check("team-a", "uat.1", "uid-2", "smoke"),
            Err(RunError::OtherUid { .. })
        ));
        assert!(matches!(
            runs.check("team-b", "uat.1", "uid-1", "smoke"),
            Err(RunError::NoSuchRun { .. })
        ));
        let e = runs
            .check("team-a", "uat.1", "uid-1", "builtin")
            .unwrap_err();
        assert!(
            e.to_string().contains(
                "no metric \"builtin\" whose provider is the rollouts-dispatch/job plugin"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_runs_namespace_is_known_by_its_uid_through_recreation_delete_and_relist() {
        let runs = synced(vec![run(
            "team-a",
            "uat.1",
            "uid-1",
            json!([ours("smoke")]),
        )]);
        assert!(runs.is_run_in("team-a", "uid-1"));
        assert!(
            !runs.is_run_in("team-b", "uid-1"),
            "a uid is in one namespace"
        );
        runs.apply(Event::Apply(run("team-a", "uat.1", "uid-2", json!([]))));
        assert!(!runs.is_run_in("team-a", "uid-1") && runs.is_run_in("team-a", "uid-2"));
        runs.apply(Event::Delete(run("team-a", "uat.1", "uid-2", json!([]))));
        assert!(!runs.is_run_in("team-a", "uid-2"));
        runs.apply(Event::Init);
        runs.apply(Event::InitApply(run("team-b", "x", "uid-3", json!([]))));
        runs.apply(Event::InitDone);
        assert!(runs.is_run_in("team-b", "uid-3"));
    }

    #[test]
    fn nothing_is_confirmed_before_the_first_list_and_a_relist_replaces_everything() {
        let runs = Runs::default();
        let e = runs.check("ns", "r", "u", "m").unwrap_err();
        assert!(matches!(e, RunError::NotSynced { .. }), "{e}");
        runs.set_problem("analysisruns.argoproj.io is forbidden".into());
        let e = runs.check("ns", "r", "u", "m").unwrap_err().to_string();
        assert!(
            e.contains("not synced: analysisruns.argoproj.io is forbidden"),
            "{e}"
        );
        assert!(e.contains("`confirmRuns: false`"), "{e}");
        assert_eq!(
            runs.problem().as_deref(),
            Some("analysisruns.argoproj.io is forbidden")
        );

        let runs = synced(vec![run("ns", "old", "u0", json!([ours("m")]))]);
        runs.apply(Event::Apply(run("ns", "r", "u", json!([ours("m")]))));
        assert_eq!(runs.check("ns", "r", "u", "m"), Ok(()));
        runs.apply(Event::Init);
        runs.apply(Event::InitApply(run("ns", "r", "u", json!([ours("m")]))));
        // Until the re-list is done, the old view answers.
        assert_eq!(runs.check("ns", "old", "u0", "m"), Ok(()));
        runs.apply(Event::InitDone);
        assert!(
            runs.check("ns", "old", "u0", "m").is_err(),
            "deleted while the watch was down"
        );
        runs.apply(Event::Delete(run("ns", "r", "u", json!([]))));
        assert!(matches!(
            runs.check("ns", "r", "u", "m"),
            Err(RunError::NoSuchRun { .. })
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_is_relisted_and_refuses_nothing_meanwhile() {
        let (logs, _guard) = Logs::capture();
        let script: Script<DynamicObject> = Script::default();
        let old = run("ns", "old", "u0", json!([ours("m")]));
        script
            .list(vec![old.clone()], "1")
            .watch(vec![Beat::Hang])
            // The relist takes 10 s to answer; it has the run created while the watch stalled.
            .list_after(
                Duration::from_secs(10),
                vec![old, run("ns", "new", "u1", json!([ours("m")]))],
                "5",
            )
            .watch(vec![Beat::Hang]);
        let runs = Runs::watch_from(script.clone(), None);
        assert!(runs.wait_synced(Duration::from_secs(1)).await);
        assert!(runs.is_authoritative());

        // Within the bound a silent watch is a quiet one: what it lacks does not exist.
        tokio::time::sleep(STALL - Duration::from_secs(2)).await;
        assert_eq!(script.lists(), 1);
        assert!(matches!(
            runs.check("ns", "new", "u1", "m"),
            Err(RunError::NoSuchRun { .. })
        ));

        // Past it the watch is dropped and lists again; until that list ends, no refusal.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(script.lists(), 2);
        assert!(!runs.is_authoritative());
        let e = runs.check("ns", "new", "u1", "m").unwrap_err();
        assert!(matches!(e, RunError::NotSynced { .. }), "{e}");
        assert!(e.to_string().contains("not synced: stalled: "), "{e}");
        assert!(matches!(
            runs.check("ns", "old", "u9", "m"),
            Err(RunError::NotSynced { .. })
        ));
        assert_eq!(runs.check("ns", "old", "u0", "m"), Ok(()), "still true");

        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(runs.is_authoritative() && runs.problem().is_none());
        assert_eq!(runs.check("ns", "new", "u1", "m"), Ok(()));
        assert!(matches!(
            runs.check("ns", "old", "u9", "m"),
            Err(RunError::OtherUid { .. })
        ));

        let lines = logs.lines();
        assert_eq!(lines.len(), 1, "the stall's line only: {lines:?}");
        for part in [
            " WARN ",
            STALLED_LOG,
            "destination=control-plane",
            "resource=analysisruns",
            "namespace=*",
        ] {
            assert!(lines[0].contains(part), "{part} in {}", lines[0]);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_410_relists_with_one_info_line() {
        let (logs, _guard) = Logs::capture();
        let script: Script<DynamicObject> = Script::default();
        script
            .list(vec![], "1")
            .watch(vec![
                after(
                    Duration::from_secs(5),
                    error_event(410, "too old resource version"),
                ),
                Beat::End,
            ])
            .list(vec![run("ns", "new", "u1", json!([ours("m")]))], "9")
            .watch(vec![Beat::Hang]);
        let runs = Runs::watch_from(script.clone(), None);
        assert!(runs.wait_synced(Duration::from_secs(1)).await);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(script.lists(), 2);
        assert_eq!(runs.check("ns", "new", "u1", "m"), Ok(()));

        let lines = logs.lines();
        assert_eq!(lines.len(), 1, "the 410's line only: {lines:?}");
        for part in [
            " INFO ",
            EXPIRED_LOG,
            "destination=control-plane",
            "resource=analysisruns",
        ] {
            assert!(lines[0].contains(part), "{part} in {}", lines[0]);
        }
    }

    #[tokio::test]
    async fn confirm_waits_for_a_run_the_watch_has_not_delivered_yet() {
        let runs = synced(vec![]);
        let feed = runs.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            feed.apply(Event::Apply(run("ns", "new", "u", json!([ours("m")]))));
        });
        assert_eq!(
            runs.confirm("ns", "new", "u", "m", Duration::from_secs(5))
                .await,
            Ok(())
        );
        let started = tokio::time::Instant::now();
        let e = runs
            .confirm("ns", "never", "u", "m", Duration::from_millis(100))
            .await;
        assert!(matches!(e, Err(RunError::NoSuchRun { .. })));
        assert!(started.elapsed() >= Duration::from_millis(100));
    }
}
