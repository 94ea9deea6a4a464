//! What the pages show of an AnalysisRun (`/ui`): its project, Kargo stage, phase, message,
//! times, and per metric of ours the last measurement's phase, message and destinations. Kept
//! in the watch beside the uid, small and bounded: messages are cut to [`MAX_MESSAGE`] bytes,
//! at most [`MAX_METRICS`] metrics and [`MAX_DESTINATIONS`] destinations each; measurements
//! themselves (which grow with every interval) are not kept.
//!
//! Field names follow argo-rollouts `pkg/apis/rollouts/v1alpha1/analysis_types.go`:
//! `AnalysisRunStatus` (phase, message, metricResults, startedAt, completedAt: lines 460-475),
//! `MetricResult` (name, phase, measurements, message: lines 493-501), `Measurement` (phase,
//! message, startedAt, finishedAt, metadata: lines 528-541).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::DynamicObject;
use serde_json::Value;

use super::{ReadError, RunFacts, Runs, State};

/// The longest message kept (bytes, cut at a character boundary).
pub const MAX_MESSAGE: usize = 512;
/// The most metrics of ours kept per run.
pub(super) const MAX_METRICS: usize = 16;
/// The most destinations kept per metric.
pub(super) const MAX_DESTINATIONS: usize = 32;
/// The most runs whose summary the watch keeps, the newest by start: as many as the list page
/// looks at (`ui::LIST_SCAN`). An older run's page reads it live ([`Runs::summary`]). Kargo
/// keeps every verification's run until its Freight goes, so without a bound the summaries
/// (about 0.8 KiB each) grew with every run the control plane holds.
pub const SUMMARIES_KEPT: usize = 2000;
/// Summaries kept beyond [`SUMMARIES_KEPT`] before the oldest are dropped (a prune sorts them
/// all, so it runs once per this many new runs, not at every one).
const SUMMARIES_SLACK: usize = SUMMARIES_KEPT / 4;
/// Kargo's label naming the Stage a verification belongs to.
pub const LABEL_STAGE: &str = "kargo.akuity.io/stage";

/// One run, as the pages show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    /// the run's namespace: the Kargo project
    pub namespace: String,
    /// the run
    pub name: String,
    /// the Kargo Stage (label [`LABEL_STAGE`]), if any
    pub stage: Option<String>,
    /// `status.phase` (`Pending` when not set yet)
    pub phase: String,
    /// `status.message`, cut
    pub message: String,
    /// `status.startedAt`, else `metadata.creationTimestamp`
    pub started: Option<Time>,
    /// `status.completedAt`, else the latest `finishedAt` of a completed run's measurements
    pub finished: Option<Time>,
    /// the metrics of ours, in the run's order
    pub metrics: Vec<MetricSummary>,
}

/// One metric of ours in a run: its last measurement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricSummary {
    /// the metric's name
    pub name: String,
    /// the last measurement's phase (the metric result's phase before the first measurement)
    pub phase: String,
    /// the last measurement's message (else the metric result's), cut
    pub message: String,
    /// the destinations it ran on: the measurement metadata's `destinations` (`verdict.rs`)
    pub destinations: Vec<String>,
    /// the last measurement's per-destination state (metadata `state.<destination>`)
    pub states: Vec<(String, String)>,
}

impl RunSummary {
    /// The summary of an AnalysisRun object whose metrics of ours are `ours`.
    pub fn of(run: &DynamicObject, ours: &[String]) -> Option<Self> {
        let status = &run.data["status"];
        let phase = text(&status["phase"]);
        let results = status["metricResults"].as_array();
        let metrics: Vec<MetricSummary> = ours
            .iter()
            .take(MAX_METRICS)
            .map(|name| {
                let result = results
                    .into_iter()
                    .flatten()
                    .find(|r| r["name"].as_str() == Some(name));
                MetricSummary::of(name, result.unwrap_or(&Value::Null))
            })
            .collect();
        let started =
            time(&status["startedAt"]).or_else(|| run.metadata.creation_timestamp.clone());
        let finished = time(&status["completedAt"]).or_else(|| {
            if is_completed(&phase) {
                results
                    .into_iter()
                    .flatten()
                    .flat_map(|r| r["measurements"].as_array().into_iter().flatten())
                    .filter_map(|m| time(&m["finishedAt"]))
                    .max()
            } else {
                None
            }
        });
        Some(Self {
            namespace: run.metadata.namespace.clone()?,
            name: run.metadata.name.clone()?,
            stage: run
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_STAGE))
                .map(|s| cut(s, 253)),
            phase: if phase.is_empty() {
                "Pending".into()
            } else {
                phase
            },
            message: cut(&text(&status["message"]), MAX_MESSAGE),
            started,
            finished,
            metrics,
        })
    }

    /// Every destination any metric ran on, each once, in order.
    pub fn destinations(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for d in self.metrics.iter().flat_map(|m| &m.destinations) {
            if !out.contains(&d.as_str()) {
                out.push(d);
            }
        }
        out
    }

    /// Seconds from start to end (to `now` while running).
    pub fn duration_secs(&self, now: &Time) -> Option<i64> {
        let start = self.started.as_ref()?;
        let end = self.finished.as_ref().unwrap_or(now);
        Some((end.0.as_second() - start.0.as_second()).max(0))
    }
}

impl MetricSummary {
    fn of(name: &str, result: &Value) -> Self {
        let last = result["measurements"]
            .as_array()
            .and_then(|m| m.last())
            .unwrap_or(&Value::Null);
        let meta = &last["metadata"];
        let destinations: Vec<String> = meta["destinations"]
            .as_str()
            .unwrap_or_default()
            .split(',')
            .filter(|d| !d.is_empty())
            .take(MAX_DESTINATIONS)
            .map(|d| cut(d, 253))
            .collect();
        let states = destinations
            .iter()
            .filter_map(|d| {
                meta[format!("state.{d}")]
                    .as_str()
                    .map(|s| (d.clone(), cut(s, 128)))
            })
            .collect();
        let phase = [text(&last["phase"]), text(&result["phase"])]
            .into_iter()
            .find(|p| !p.is_empty())
            .unwrap_or_else(|| "Pending".into());
        let message = [text(&last["message"]), text(&result["message"])]
            .into_iter()
            .find(|m| !m.is_empty())
            .unwrap_or_default();
        Self {
            name: name.to_string(),
            phase,
            message: cut(&message, MAX_MESSAGE),
            destinations,
            states,
        }
    }
}

/// Whether an AnalysisRun phase is final (`AnalysisPhase`: Successful, Failed, Error,
/// Inconclusive; analysis_types.go).
pub fn is_completed(phase: &str) -> bool {
    matches!(phase, "Successful" | "Failed" | "Error" | "Inconclusive")
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// `v` as a Kubernetes time, if it is one (`status.startedAt`, `completedAt`).
pub(super) fn time(v: &Value) -> Option<Time> {
    serde_json::from_value(v.clone()).ok()
}

/// `s` cut to at most `max` bytes at a character boundary, `…` marking the cut.
pub(super) fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl Runs {
    /// The runs the watch holds, newest first (by start), at most `limit`.
    pub fn recent(&self, limit: usize) -> Vec<RunSummary> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<&RunSummary> = state
            .runs
            .values()
            .filter_map(|f| f.summary.as_deref())
            .collect();
        all.sort_by(|a, b| {
            b.started
                .cmp(&a.started)
                .then_with(|| a.namespace.cmp(&b.namespace))
                .then_with(|| a.name.cmp(&b.name))
        });
        all.into_iter().take(limit).cloned().collect()
    }

    /// The summary of run `namespace/name` of ours, if the watch holds the run: from the watch
    /// for the newest [`SUMMARIES_KEPT`] runs, else read live (through slots of its own,
    /// `read.rs`); the error says why that read gave no answer.
    pub async fn summary(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<RunSummary>, ReadError> {
        let uid = {
            let state = self.state.read().unwrap_or_else(|e| e.into_inner());
            let Some(facts) = state.runs.get(&(namespace.to_string(), name.to_string())) else {
                return Ok(None);
            };
            if facts.summary.is_some() || facts.metrics.is_empty() {
                return Ok(facts.summary.as_deref().cloned());
            }
            facts.uid.clone()
        };
        let Some(reader) = &self.page_reader else {
            return Ok(None);
        };
        let Some(run) = reader.read(namespace, name).await? else {
            return Ok(None);
        };
        // Deleted and created again since the watch saw it: not the run the watch holds.
        Ok(RunFacts::of(&run)
            .filter(|(_, facts)| facts.uid == uid)
            .and_then(|(_, facts)| facts.summary.map(|s| *s)))
    }
}

impl State {
    /// Drops `facts`' summary when its run started before the oldest summary kept.
    pub(super) fn trim_summary(&self, facts: &mut RunFacts) {
        let Some(cutoff) = &self.summary_cutoff else {
            return;
        };
        if facts
            .summary
            .as_ref()
            .is_some_and(|s| s.started.as_ref() < Some(cutoff))
        {
            facts.summary = None;
        }
    }

    /// Once more than [`SUMMARIES_KEPT`] + slack runs keep a summary, keeps it only for the
    /// newest [`SUMMARIES_KEPT`] by start (and any started at the same instant as the last).
    pub(super) fn prune_summaries(&mut self) {
        if self.summaries <= SUMMARIES_KEPT + SUMMARIES_SLACK {
            return;
        }
        let mut started: Vec<Option<&Time>> = self
            .runs
            .values()
            .filter_map(|f| f.summary.as_ref())
            .map(|s| s.started.as_ref())
            .collect();
        started.sort_unstable_by(|a, b| b.cmp(a));
        let cutoff = started.get(SUMMARIES_KEPT - 1).copied().flatten().cloned();
        let mut kept = 0;
        for facts in self.runs.values_mut() {
            if facts
                .summary
                .as_ref()
                .is_some_and(|s| s.started.as_ref() < cutoff.as_ref())
            {
                facts.summary = None;
            }
            kept += usize::from(facts.summary.is_some());
        }
        self.summaries = kept;
        self.summary_cutoff = cutoff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn run(ns: &str, name: &str, started: &str, status: Value) -> DynamicObject {
        let mut status = status;
        status["startedAt"] = json!(started);
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}"),
                         "labels": {LABEL_STAGE: "uat"}},
            "spec": {"metrics": [
                {"name": "smoke", "provider": {"plugin": {dispatch_api::block::PLUGIN_NAME: {}}}},
                {"name": "web", "provider": {"web": {}}}
            ]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn a_run_is_summed_up_from_its_last_measurement() {
        let long = "x".repeat(2000);
        let r = run(
            "team-a",
            "uat.1",
            "2026-01-01T00:00:00Z",
            json!({"phase": "Failed", "message": long, "completedAt": "2026-01-01T00:01:30Z",
                   "metricResults": [{"name": "smoke", "phase": "Failed", "measurements": [
                       {"phase": "Running", "metadata": {"destinations": "a"}},
                       {"phase": "Failed", "message": "a: Failed: BackoffLimitExceeded",
                        "metadata": {"destinations": "a,b", "state.a": "Failed: BackoffLimitExceeded",
                                     "state.b": "Successful"}}]}]}),
        );
        let s = RunSummary::of(&r, &["smoke".to_string()]).unwrap();
        assert_eq!(s.stage.as_deref(), Some("uat"));
        assert_eq!(s.phase, "Failed");
        assert!(
            s.message.len() <= MAX_MESSAGE && s.message.ends_with('…'),
            "{}",
            s.message.len()
        );
        let m = &s.metrics[0];
        assert_eq!((m.name.as_str(), m.phase.as_str()), ("smoke", "Failed"));
        assert_eq!(m.destinations, ["a", "b"]);
        assert_eq!(
            m.states[0],
            ("a".into(), "Failed: BackoffLimitExceeded".into())
        );
        assert_eq!(s.destinations(), ["a", "b"]);
        assert_eq!(
            s.duration_secs(&Time(k8s_openapi::jiff::Timestamp::now())),
            Some(90)
        );
    }

    #[test]
    fn a_run_not_measured_yet_is_pending_and_cut_respects_characters() {
        let s = RunSummary::of(
            &run("ns", "r", "2026-01-01T00:00:00Z", json!({})),
            &["smoke".into()],
        )
        .unwrap();
        assert_eq!(s.phase, "Pending");
        assert_eq!(s.metrics[0].phase, "Pending");
        assert!(s.metrics[0].destinations.is_empty());
        let cut_text = cut(&"é".repeat(600), 512);
        assert!(cut_text.len() <= 512, "{}", cut_text.len());
    }

    #[tokio::test]
    async fn recent_is_newest_first_and_bounded() {
        let runs = Runs::default();
        runs.apply(Event::Init);
        for (i, name) in ["old", "mid", "new"].iter().enumerate() {
            let t = format!("2026-01-01T00:0{i}:00Z");
            runs.apply(Event::InitApply(run("ns", name, &t, json!({}))));
        }
        runs.apply(Event::InitDone);
        let names: Vec<_> = runs.recent(2).into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["new", "mid"]);
        assert_eq!(
            runs.summary("ns", "old")
                .await
                .unwrap()
                .unwrap()
                .stage
                .as_deref(),
            Some("uat")
        );
        assert!(runs.summary("other", "old").await.unwrap().is_none());
    }

    /// Run `i` of many, started `i` seconds after midnight.
    fn nth(i: usize) -> DynamicObject {
        let t = k8s_openapi::jiff::Timestamp::from_second(1_767_225_600 + i as i64).unwrap();
        run("ns", &format!("r{i}"), &t.to_string(), json!({}))
    }

    #[tokio::test]
    async fn only_the_newest_keep_a_summary_and_an_older_page_is_read_live() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let reads = Arc::new(AtomicUsize::new(0));
        let reader = super::super::Reader::with({
            let reads = reads.clone();
            move |_, name| {
                reads.fetch_add(1, Ordering::SeqCst);
                let i: usize = name[1..].parse().unwrap();
                Box::pin(async move { Ok(Some(nth(i))) })
            }
        });
        let runs = Runs::with_reader(Some(reader));
        let total = SUMMARIES_KEPT + SUMMARIES_SLACK + 1;
        runs.apply(Event::Init);
        for i in 0..total {
            runs.apply(Event::InitApply(nth(i)));
        }
        runs.apply(Event::InitDone);
        let held = |runs: &Runs| {
            let state = runs.state.read().unwrap();
            (
                state.summaries,
                state.runs.values().filter(|f| f.summary.is_some()).count(),
            )
        };
        assert_eq!(held(&runs), (SUMMARIES_KEPT, SUMMARIES_KEPT));
        let recent = runs.recent(SUMMARIES_KEPT);
        assert_eq!(recent.len(), SUMMARIES_KEPT);
        assert_eq!(recent[0].name, format!("r{}", total - 1));
        assert_eq!(
            recent[SUMMARIES_KEPT - 1].name,
            format!("r{}", total - SUMMARIES_KEPT)
        );

        // The newest is answered from the watch; the oldest by a live read of its run.
        let newest = format!("r{}", total - 1);
        assert!(runs.summary("ns", &newest).await.unwrap().is_some());
        assert_eq!(reads.load(Ordering::SeqCst), 0);
        let oldest = runs.summary("ns", "r0").await.unwrap().expect("read live");
        assert_eq!(
            (oldest.name.as_str(), oldest.stage.as_deref()),
            ("r0", Some("uat"))
        );
        assert_eq!(reads.load(Ordering::SeqCst), 1);

        // An old run updated keeps no summary; new runs do, and the count is pruned again.
        runs.apply(Event::Apply(nth(0)));
        assert_eq!(held(&runs), (SUMMARIES_KEPT, SUMMARIES_KEPT));
        for i in total..total + SUMMARIES_SLACK + 1 {
            runs.apply(Event::Apply(nth(i)));
        }
        assert_eq!(held(&runs), (SUMMARIES_KEPT, SUMMARIES_KEPT));
        runs.apply(Event::Delete(nth(total)));
        assert_eq!(held(&runs).0, SUMMARIES_KEPT - 1);
        // Every run keeps its uid and state for the sweep, summary or not.
        let states = runs.states().unwrap();
        assert_eq!(states.len(), total + SUMMARIES_SLACK);
        assert_eq!(states["uid-r0"], crate::runs::RunState::Running);
    }
}
