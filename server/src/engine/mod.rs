//! The dispatch engine: creates the verification Jobs of a measurement on its destinations and
//! turns their state into a verdict.
//!
//! * [`Engine::ensure`] resolves the destinations (names, selector or `stage`), checks the
//!   policy, builds the Job and creates it on every destination — or adopts the Job that is
//!   already there when it is ours, and refuses a foreign one. Idempotent.
//! * [`Engine::status`] reads the watch caches (no API call at steady state) and applies
//!   `require: all|any`; a failed container's log tail goes into the message.
//! * [`Engine::terminate`] deletes the Jobs (foreground) on every destination.
//! * [`Engine::gc`] keeps the newest `limit` Jobs of a run on each of its placements
//!   ([`Engine::gc_everywhere`]: on every destination, for tests and tools).
//! * [`Engine::expire_records`] asks agents to delete the Jobs of records finished longer ago
//!   than their retention (no control plane needed).
//!
//! The engine keeps no state that matters: a [`JobRef`] (stored in the measurement metadata)
//! and the Jobs on the destinations are the state, so a new engine picks up where another left.
//! Agent destinations have no reachable Jobs: their state is a [`DispatchJob`] record per Job in
//! the [`Store`], written by the engine (spec) and by the agent (status).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::block::{JobConfig, PLUGIN_NAME};
use k8s_openapi::api::batch::v1::Job;

use crate::config::{EngineSettings, JobsSettings};
use crate::destinations::client;
use crate::destinations::stage::StageInstance;
use crate::destinations::{Destination, Registry};
use crate::job::{self, Ownership, RunContext};
use crate::logs::{self, Redactor};
use crate::policy::{Denied, Policy};
use crate::signing::Signer;
use crate::store::Store;
use crate::verdict::{DestState, Verdict};

mod agents;
mod cleanup;
mod ensure;
mod expiry;
mod job_ref;
mod observing;
mod pending;
mod start;
mod status;
mod sweep;

pub use cleanup::CleanupError;
pub use job_ref::{
    Expected, JobRef, JobRefError, Placement, RefRefused, JOB_NAMESPACE_KEY, JOB_NAME_KEY, REF_KEY,
};
pub use observing::Observation;
pub use pending::PendingReport;
pub use sweep::{SweepReason, SweepReport, RUNS_PAGE};

/// One measurement to take.
#[derive(Debug, Clone)]
pub struct MeasureRequest {
    /// the AnalysisRun
    pub run: RunContext,
    /// the metric name
    pub metric: String,
    /// `n` of the Job name: the metric result's count + error + 1
    pub measurement: u32,
    /// the validated plugin block
    pub config: JobConfig,
    /// values of the run's secret args, redacted from every message
    pub secrets: Vec<String>,
}

/// The control plane (Kargo Stages, Argo CD Applications, AnalysisRuns) cannot be used. Cloned
/// to every caller of the one lazily built client, so its causes are shared.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ControlPlaneError {
    /// no credentials for it, or they cannot be read
    #[error("the control plane is not reachable (`controlPlane` in {origin}): {source}")]
    Unreachable {
        /// the config file naming it
        origin: String,
        /// why
        #[source]
        source: Arc<crate::destinations::client::AccessError>,
    },
    /// its client cannot be built from the credentials
    #[error("{0}")]
    Client(#[source] Arc<crate::destinations::client::AccessError>),
}

/// What `ensure` did on one destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// the Job was created
    Created,
    /// our Job was already there (a retry, or another engine instance created it)
    Adopted,
    /// no Job: the state says why
    NotCreated(DestState),
    /// nothing to create: an observe check reads what is deployed (`kind namespace/name`)
    Observed(String),
}

/// The result of [`Engine::ensure`].
#[derive(Debug, Clone)]
pub struct Ensured {
    /// where the Jobs are; store [`JobRef::metadata`] in the measurement
    pub job: JobRef,
    /// per destination, in placement order
    pub outcomes: Vec<(String, Outcome)>,
    /// the verdict right after creation (Running, or an error of a destination)
    pub verdict: Verdict,
}

/// The result of [`Engine::terminate`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TerminateReport {
    /// destinations where the Job was deleted
    pub deleted: Vec<String>,
    /// destinations where no Job of ours was left
    pub absent: Vec<String>,
    /// destinations where deleting failed for now, and why: kept pending and retried
    /// (`Engine::retry_pending_deletions`)
    pub pending: Vec<(String, String)>,
    /// destinations where deleting failed and could not be kept pending (the store failed, or
    /// the Job is not ours), and why
    pub failed: Vec<(String, String)>,
}

/// The result of [`Engine::gc`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// `(destination, namespace/name)` of each deleted Job
    pub deleted: Vec<(String, String)>,
    /// destinations where GC failed, and why
    pub failed: Vec<(String, String)>,
}

/// The most destinations one measurement runs on (after the selector or `stage` is
/// resolved). Each placement is a Job create, a watch lookup per status and a delete: a block
/// naming thousands of destinations (or a selector matching a whole fleet) would turn one
/// measurement into thousands of destination calls, so it is refused before any.
pub const MAX_PLACEMENTS: usize = 64;

/// A measurement that cannot be started at all. Each message is what the client reads; the
/// error it came from, if any, stays its `source` for the server log.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// no destination has that name
    #[error(
        "unknown destination {name:?} (known: {known}); add it to `destinations` in {origin}, \
         or register the cluster in Argo CD"
    )]
    UnknownDestination {
        /// the name asked for
        name: String,
        /// the known names the project may use (never another tenant's)
        known: String,
        /// the config file
        origin: String,
    },
    /// the selector matched nothing
    #[error(
        "destinationSelector {selector:?} matches no destination (known: {known}); give destinations \
         `labels` in {origin} or label their Argo CD cluster Secrets"
    )]
    NoMatch {
        /// the selector
        selector: String,
        /// names and labels of the destinations the project may use (never another tenant's)
        known: String,
        /// the config file
        origin: String,
    },
    /// the policy does not allow it
    #[error(transparent)]
    Denied(#[from] Denied),
    /// the policy lets the project use that destination nowhere
    #[error(transparent)]
    DestinationDenied(#[from] crate::policy::DestinationDenied),
    /// `destination: stage` could not be resolved
    #[error("destination \"stage\": {0}")]
    Stage(#[source] crate::destinations::stage::StageError),
    /// `destination: stage` needs the control plane, which cannot be used
    #[error("destination \"stage\": {0}")]
    StageControlPlane(#[source] ControlPlaneError),
    /// the plugin block does not give a valid Job
    #[error("invalid {PLUGIN_NAME} block in metric {metric:?}: {reason}")]
    InvalidJob {
        /// the metric
        metric: String,
        /// what is wrong
        #[source]
        reason: crate::job::BuildError,
    },
    /// the measurement would run on more destinations than [`MAX_PLACEMENTS`]
    #[error(
        "{target} gives {count} destinations, more than the {max} one measurement may run on; \
         narrow the selector or the list (or split the metric)"
    )]
    TooManyPlacements {
        /// the block's target (names, `stage` or the selector)
        target: String,
        /// destinations it gave
        count: usize,
        /// [`MAX_PLACEMENTS`]
        max: usize,
    },
    /// the Job's pod security profile refuses it (`podsecurity`)
    #[error("invalid {PLUGIN_NAME} block in metric {metric:?} for destination {destination:?}: {refused}")]
    PodSecurity {
        /// the metric
        metric: String,
        /// the destination whose policy rule refused it
        destination: String,
        /// the field, the level, the rule and the fix
        #[source]
        refused: crate::podsecurity::Refused,
    },
    /// the destination is limited to namespaces, and this is not one of them
    #[error(
        "destination {destination:?} is limited to namespaces {allowed} ({key} in {origin}); \
         namespace {namespace:?} is not one of them: set the block's `namespace` to one of them, \
         or add {namespace:?} to {key}"
    )]
    OutsideNamespaces {
        /// the destination
        destination: String,
        /// the namespace asked for (the block's, else the destination's default)
        namespace: String,
        /// the destination's namespaces
        allowed: String,
        /// the setting that limits it (`destinations[0].namespaces`, an Argo CD annotation…)
        key: String,
        /// the config file
        origin: String,
    },
    /// the block asks for a deadline longer than `engine.maxMeasurementDeadline`
    #[error(
        "invalid {PLUGIN_NAME} block in metric {metric:?}: field `activeDeadline` is {value}, \
         more than the {max} a measurement may hold its Stage (`engine.maxMeasurementDeadline` \
         in {origin}); shorten `activeDeadline`, or raise `engine.maxMeasurementDeadline`"
    )]
    DeadlineTooLong {
        /// the metric
        metric: String,
        /// the block's `activeDeadline` (Go syntax)
        value: String,
        /// `engine.maxMeasurementDeadline` (Go syntax)
        max: String,
        /// the config file
        origin: String,
    },
    /// the engine cannot start
    #[error("cannot start the dispatch engine: {message}")]
    Start {
        /// what cannot work, and why
        message: String,
        /// the error it came from, if any
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// the Argo CD instances of `argocd:` cannot start without the control plane
    #[error("cannot start the dispatch engine: {0}")]
    ArgoCd(#[source] crate::destinations::argocd::instances::ControlPlaneNeeded),
}

impl EngineError {
    /// The engine cannot start: `message` says what and why, `source` is the error it came from.
    fn cannot_start(
        message: String,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Start {
            message,
            source: Some(source.into()),
        }
    }
}

/// The API may not sync Applications on a destination (`applicationSync`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "syncing Argo CD Applications is not enabled for destination {destination:?}: add \
     {destination:?} (or a glob matching it) to `applicationSync.destinations` in {origin}"
)]
pub struct SyncDisabled {
    /// the destination
    pub destination: String,
    /// the config file
    pub origin: String,
}

/// The engine. Cheap to clone; dropping the last clone stops every watch.
#[derive(Debug, Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

struct Inner {
    registry: Arc<Registry>,
    policy: Policy,
    settings: EngineSettings,
    origin: String,
    control_plane: tokio::sync::OnceCell<Result<kube::Client, ControlPlaneError>>,
    control_plane_access: crate::config::Access,
    /// the Argo CD instances `destination: stage` reads (one for the control plane without
    /// `argocd`; none on an agent)
    stage_instances: Vec<StageInstance>,
    /// the log tails of failed containers, and what is remembered of them
    tails: logs::tails::Tails,
    /// `destination: stage` resolutions per run UID
    stages: Mutex<HashMap<String, Vec<String>>>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// the records of agent destinations (`None`: no `agents` in the config)
    store: Option<Arc<Store>>,
    /// the pending deletions of direct destinations (`engine/pending.rs`): `store` when there
    /// is one, else a store of this process's own
    deletions: Arc<Store>,
    /// an agent silent this long is shown as not connected
    offline_after: Duration,
    /// the key of the adoption mark on our Jobs (`job::mark`); see [`Engine::mark_jobs_with`]
    marker: std::sync::OnceLock<Arc<Signer>>,
    /// the agent's engine: it holds no key, and compares Jobs with the marked spec the server
    /// sent instead (`job::mark::check`)
    marks_sent: bool,
    /// TTL of finished Jobs, retention of completed runs' Jobs (`jobs:`)
    jobs: JobsSettings,
    /// the control plane's API server URL (no trailing `/`), when its credentials resolve: a
    /// destination at that URL is the cluster of the AnalysisRuns (`Engine::on_control_plane`)
    control_plane_url: Option<String>,
    /// globs over the destinations whose Applications the API may sync (`applicationSync`)
    application_sync: Vec<String>,
    /// what one project may hold at once (`budgets:`), read by the features (`app`)
    budgets: crate::config::BudgetsConfig,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("origin", &self.origin)
            .field("registry", &self.registry)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Why a Job under our name is not ours.
#[derive(Debug, thiserror::Error)]
enum NotOurs {
    /// its labels say so (`job::ownership`)
    #[error("{0}")]
    Labels(String),
    /// it has our labels but not our mark
    #[error(transparent)]
    Mark(job::mark::MarkMismatch),
}

impl Engine {
    /// Whether `found` (a Job under our name on a direct destination) is the Job we created for
    /// run `run_uid`: our labels, and our mark (`job::mark`). The server verifies the mark with
    /// its keys; the agent compares it with `ours`, the marked spec the server sent.
    fn is_ours(
        &self,
        found: &Job,
        run_uid: &str,
        ours: Option<&serde_json::Value>,
    ) -> Result<(), NotOurs> {
        if let Ownership::Foreign(why) = job::ownership(found, run_uid) {
            return Err(NotOurs::Labels(why));
        }
        // Our labels are public: only the mark tells our Job from one made to look like it.
        let value = serde_json::to_value(found).unwrap_or_default();
        let checked = match (self.inner.marks_sent, ours) {
            (true, Some(ours)) => job::mark::check(&value, ours),
            (true, None) => Err(job::mark::MarkMismatch::NothingToCompare),
            (false, _) => job::mark::verify(&value, self.marker(), run_uid),
        };
        checked.map_err(|mismatch| {
            tracing::warn!(job = %format!("{}/{}", found.metadata.namespace.as_deref().unwrap_or_default(),
                                          found.metadata.name.as_deref().unwrap_or_default()),
                           %mismatch, "a job with our name and labels but not our mark is refused");
            NotOurs::Mark(mismatch)
        })
    }

    fn adopt_or_refuse(
        &self,
        existing: &Job,
        ours: &serde_json::Value,
        run_uid: &str,
        namespace: &str,
        name: &str,
    ) -> Outcome {
        match self.is_ours(existing, run_uid, Some(ours)) {
            Ok(()) => Outcome::Adopted,
            Err(why) => Outcome::NotCreated(DestState::Error(format!(
                "job {namespace}/{name} already exists and is not ours: {why}; it is left alone — \
                 delete it or rename the metric"
            ))),
        }
    }
}

/// A failed API call as a destination state: transient trouble is retryable.
fn api_failure(d: &Destination, what: &str, err: &kube::Error) -> DestState {
    let text = client::describe(err);
    if client::is_transient(err) {
        return DestState::Unavailable(format!(
            "destination unreachable: cannot {what} at {}: {text}",
            d.server
        ));
    }
    match err {
        // Only the authorizer's denial says "cannot <verb>"; an admission webhook, a
        // ValidatingAdmissionPolicy or a quota answer 403 too, and their reason is the message.
        kube::Error::Api(s) if s.code == 403 && s.message.contains(" cannot ") => DestState::Error(format!(
            "forbidden to {what}: {text}; grant the server's credentials for this destination RBAC on \
             jobs and pods (create, get, list, watch, delete) and pods/log (get)"
        )),
        kube::Error::Api(s) if s.code == 401 => DestState::Error(format!(
            "the credentials for {} are rejected (HTTP 401) when trying to {what}: renew the token or certificate",
            d.server
        )),
        _ => DestState::Error(format!("cannot {what}: {text}")),
    }
}

fn no_answer(d: &Destination, what: &str, timeout: Duration) -> DestState {
    DestState::Unavailable(format!(
        "destination unreachable: no answer from {} within {}s to {what}",
        d.server,
        timeout.as_secs()
    ))
}

fn with_cache_problem(d: &Destination, state: DestState) -> DestState {
    match (state, d.cache_problem()) {
        (DestState::Unavailable(m), Some(p)) => DestState::Unavailable(format!("{m} ({p})")),
        (s, _) => s,
    }
}

/// Adds the [`JobRef`] to the metadata and redacts the message.
fn finish(job: &JobRef, mut v: Verdict, secrets: &Redactor) -> Verdict {
    v.metadata.extend(job.metadata());
    v.message = secrets.redact(&v.message);
    v
}

#[cfg(test)]
mod tests {
    use super::{
        Engine, EngineError, GcReport, JobRef, MeasureRequest, Placement, JOB_NAMESPACE_KEY,
        JOB_NAME_KEY, REF_KEY,
    };
    use crate::config::ServerConfig;
    use crate::job::RunContext;
    use crate::logs::Redactor;
    use dispatch_api::block::JobConfig;
    use std::collections::BTreeMap;

    use dispatch_api::Require;

    #[test]
    fn job_refs_round_trip_through_metadata() {
        let r = JobRef {
            run_uid: "u".into(),
            run_namespace: "p".into(),
            run_name: "r".into(),
            metric: "m".into(),
            measurement: 1,
            name: "u.m.1".into(),
            require: Require::Any,
            log_tail: 7,
            placements: vec![
                Placement {
                    destination: "a".into(),
                    namespace: "ns1".into(),
                },
                Placement {
                    destination: "b".into(),
                    namespace: "ns2".into(),
                },
            ],
            deadline: 0,
            observe: None,
            sig: String::new(),
        };
        let m = r.metadata();
        assert_eq!(m[JOB_NAME_KEY], "u.m.1");
        assert_eq!(m[JOB_NAMESPACE_KEY], "ns1");
        assert!(m[REF_KEY].contains("\"require\":\"any\""), "{}", m[REF_KEY]);
        assert_eq!(JobRef::from_metadata(&m).unwrap(), r);
        assert!(JobRef::from_metadata(&BTreeMap::new())
            .unwrap_err()
            .to_string()
            .contains("not started by this server"));
        let bad = BTreeMap::from([(REF_KEY.to_string(), "{".to_string())]);
        assert!(JobRef::from_metadata(&bad)
            .unwrap_err()
            .to_string()
            .contains("unreadable"));
    }

    #[test]
    fn errors_name_the_fix() {
        let e = EngineError::UnknownDestination {
            name: "prod".into(),
            known: "a, b".into(),
            origin: "config file /c.yaml".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("\"prod\"")
                && s.contains("a, b")
                && s.contains("`destinations` in config file /c.yaml"),
            "{s}"
        );
    }

    #[tokio::test]
    async fn an_empty_engine_reports_unknown_destinations() {
        let mut config =
            ServerConfig::parse("policy: {allowAll: true}", "config file t.yaml").unwrap();
        config.kubeconfig_contexts = None;
        let engine = Engine::start(config).await.unwrap();
        let req = MeasureRequest {
            run: RunContext {
                name: "r".into(),
                namespace: "p".into(),
                uid: "u".into(),
                ..RunContext::default()
            },
            metric: "m".into(),
            measurement: 1,
            config: JobConfig::parse(
                br#"{"destination":"nowhere","spec":{"template":{"spec":{"containers":[{"name":"c"}]}}}}"#,
            )
            .unwrap(),
            secrets: vec![],
        };
        let e = engine.ensure(&req).await.unwrap_err();
        assert!(matches!(e, EngineError::UnknownDestination { .. }), "{e}");
        assert!(e.to_string().contains("known: none"), "{e}");
        let status = engine
            .status(
                &JobRef {
                    run_uid: "u".into(),
                    run_namespace: "p".into(),
                    run_name: "r".into(),
                    metric: "m".into(),
                    measurement: 1,
                    name: "n".into(),
                    require: Require::All,
                    log_tail: 1,
                    placements: vec![Placement {
                        destination: "gone".into(),
                        namespace: "ns".into(),
                    }],
                    deadline: 0,
                    observe: None,
                    sig: String::new(),
                },
                &Redactor::default(),
            )
            .await;
        assert_eq!(status.phase, crate::Phase::Error);
        assert!(
            status.message.contains("no longer known"),
            "{}",
            status.message
        );
        assert_eq!(
            engine.gc_everywhere("u", None, 1).await,
            GcReport::default()
        );
    }
}
