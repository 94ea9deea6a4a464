//! The dispatch engine: creates the verification Jobs of a measurement on its destinations and
//! turns their state into a verdict.
//!
//! * [`Engine::ensure`] resolves the destinations (names, selector or `stage`), checks the
//!   policy, builds the Job and creates it on every destination — or adopts the Job that is
//!   already there when it is ours, and refuses a foreign one. Idempotent.
//! * [`Engine::status`] reads the watch caches (no API call at steady state) and applies
//!   `require: all|any`; a failed container's log tail goes into the message.
//! * [`Engine::terminate`] deletes the Jobs (foreground) on every destination.
//! * [`Engine::gc`] keeps the newest `limit` Jobs of a run per destination.
//!
//! The engine keeps no state that matters: a [`JobRef`] (stored in the measurement metadata)
//! and the Jobs on the destinations are the state, so a new engine picks up where another left.
//! Agent destinations have no reachable Jobs: their state is a [`DispatchJob`] record per Job in
//! the [`Store`], written by the engine (spec) and by the agent (status).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::block::{JobConfig, Require, Target, PLUGIN_NAME};
use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions,
};
use serde::{Deserialize, Serialize};

use crate::config::{EngineSettings, ServerConfig, StoreKind};
use crate::destinations::client::{self, RequestCounter};
use crate::destinations::{
    self, argocd, stage, AgentDestination, Destination, DestinationSpec, Entry, Registry, Source,
};
use crate::job::{
    self, JobInput, Ownership, RunContext, ANN_MEASUREMENT, ANN_METRIC, LABEL_RUN_UID,
    MANAGED_SELECTOR,
};
use crate::logs::{self, FailedContainer, Redactor};
use crate::policy::{Denied, Policy};
use crate::store::{self, Created, DispatchJob, DispatchJobSpec, Store};
use crate::verdict::{self, DestState, DestinationStatus, Observed, Verdict};

/// Measurement metadata key holding the [`JobRef`] as JSON.
pub const REF_KEY: &str = "dispatch-ref";
/// Measurement metadata key with the Job name (as Argo's built-in provider).
pub const JOB_NAME_KEY: &str = "job-name";
/// Measurement metadata key with the Job namespace (of the first destination).
pub const JOB_NAMESPACE_KEY: &str = "job-namespace";

/// `(destination, namespace, pod, container)`
type LogKey = (String, String, String, String);

/// Cached `pods/log` answers at most; the map is cleared when it grows beyond.
const MAX_CACHED_LOGS: usize = 4096;
/// Remembered `destination: stage` resolutions at most (cleared when it grows beyond).
const MAX_REMEMBERED: usize = 4096;

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

/// One destination of a measurement and the namespace of its Job there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// destination name
    pub destination: String,
    /// namespace there
    pub namespace: String,
}

/// Everything needed to find a measurement's Jobs again; round-trips through measurement
/// metadata ([`JobRef::metadata`], [`JobRef::from_metadata`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobRef {
    /// the AnalysisRun's UID
    pub run_uid: String,
    /// the Job name (the same on every destination)
    pub name: String,
    /// `all` or `any`
    #[serde(with = "require_serde")]
    pub require: Require,
    /// log lines of a failed container in the message
    pub log_tail: u32,
    /// where the Jobs are
    pub placements: Vec<Placement>,
}

mod require_serde {
    use dispatch_api::block::Require;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(r: &Require, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match r {
            Require::All => "all",
            Require::Any => "any",
        })
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Require, D::Error> {
        match String::deserialize(d)?.as_str() {
            "all" => Ok(Require::All),
            "any" => Ok(Require::Any),
            other => Err(serde::de::Error::custom(format!(
                "require must be all or any, got {other:?}"
            ))),
        }
    }
}

impl JobRef {
    /// The measurement metadata for this reference.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        m.insert(JOB_NAME_KEY.to_string(), self.name.clone());
        if let Some(p) = self.placements.first() {
            m.insert(JOB_NAMESPACE_KEY.to_string(), p.namespace.clone());
        }
        // Serializing plain strings and numbers cannot fail.
        m.insert(
            REF_KEY.to_string(),
            serde_json::to_string(self).unwrap_or_default(),
        );
        m
    }

    /// The reference stored by [`JobRef::metadata`].
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Result<Self, String> {
        let json = metadata.get(REF_KEY).ok_or_else(|| {
            format!("the measurement has no {REF_KEY} metadata: it was not started by this server")
        })?;
        serde_json::from_str(json)
            .map_err(|e| format!("the measurement's {REF_KEY} metadata is unreadable: {e}"))
    }
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
    /// destinations where deleting failed, and why
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

/// A measurement that cannot be started at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// no destination has that name
    #[error(
        "unknown destination {name:?} (known: {known}); add it to `destinations` in {origin}, \
         or register the cluster in Argo CD"
    )]
    UnknownDestination {
        /// the name asked for
        name: String,
        /// the known names
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
        /// known names and labels
        known: String,
        /// the config file
        origin: String,
    },
    /// the policy does not allow it
    #[error(transparent)]
    Denied(#[from] Denied),
    /// `destination: stage` could not be resolved
    #[error("destination \"stage\": {0}")]
    Stage(String),
    /// the plugin block does not give a valid Job
    #[error("invalid {PLUGIN_NAME} block in metric {metric:?}: {reason}")]
    InvalidJob {
        /// the metric
        metric: String,
        /// what is wrong
        reason: String,
    },
    /// the engine cannot start
    #[error("cannot start the dispatch engine: {0}")]
    Start(String),
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
    control_plane: tokio::sync::OnceCell<Result<kube::Client, String>>,
    control_plane_access: crate::config::Access,
    argocd_namespace: String,
    /// `pods/log` answers (or failures) per (destination, namespace, pod, container)
    logs: Mutex<HashMap<LogKey, Result<String, String>>>,
    /// `destination: stage` resolutions per run UID
    stages: Mutex<HashMap<String, Vec<String>>>,
    tasks: Vec<tokio::task::AbortHandle>,
    /// the records of agent destinations (`None`: no `agents` in the config)
    store: Option<Arc<dyn Store>>,
    /// an agent silent this long is shown as not connected
    offline_after: Duration,
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

impl Engine {
    /// Registers every destination of `config`, starts their watch caches and the Argo CD
    /// Secret watch, and returns without waiting for any cluster: an unreachable destination
    /// never blocks the start. Fails only when the configuration cannot work at all.
    pub async fn start(config: ServerConfig) -> Result<Self, EngineError> {
        let ServerConfig {
            origin,
            control_plane: control_plane_access,
            destinations,
            kubeconfig_contexts,
            argocd,
            policy,
            engine: settings,
            agents,
        } = config;
        let policy = Policy::new(policy.as_ref(), &origin);
        if let Some(w) = policy.warning() {
            tracing::warn!("{w}");
        }
        let registry = Arc::new(Registry::new(settings, argocd.is_some()));
        let control_plane = tokio::sync::OnceCell::new();
        let mut tasks = Vec::new();
        let argocd_namespace = argocd
            .as_ref()
            .map_or_else(|| "argocd".to_string(), |a| a.namespace.clone());
        if let Some(argo) = argocd {
            let cp_config = client::config_for(&control_plane_access, "control-plane")
                .await
                .map_err(|e| {
                    EngineError::Start(format!(
                        "`argocd` needs the control plane (`controlPlane` in {origin}): {e}"
                    ))
                })?;
            let cp = client::client(cp_config.clone(), &settings, &RequestCounter::default())
                .map_err(|e| EngineError::Start(format!("control plane: {e}")))?;
            let _ = control_plane.set(Ok(cp.clone()));
            tasks.push(
                tokio::spawn(argocd::watch(registry.clone(), cp, cp_config, argo)).abort_handle(),
            );
        }
        for (i, d) in destinations.iter().enumerate() {
            registry.insert(destinations::spec_from_config(i, d).await);
        }
        if let Some(k) = &kubeconfig_contexts {
            match destinations::specs_from_kubeconfig(k).await {
                Ok(specs) => {
                    for s in specs {
                        registry.insert(s);
                    }
                }
                // The embedded default on a machine without a kubeconfig: nothing to add.
                Err(e) if k.path.is_none() => {
                    tracing::warn!(error = %e, "no kubeconfig contexts as destinations");
                }
                Err(e) => {
                    return Err(EngineError::Start(format!(
                        "kubeconfigContexts.path in {origin}: {e}"
                    )))
                }
            }
        }
        let mut store: Option<Arc<dyn Store>> = None;
        let mut offline_after = Duration::from_secs(60);
        if let Some(agents) = &agents {
            offline_after = agents.offline_after;
            store = Some(match agents.store {
                StoreKind::Memory => Arc::new(store::memory::MemoryStore::new()),
                StoreKind::Kubernetes => {
                    let namespace = agents.namespace.clone().unwrap_or_else(|| {
                        std::env::var("POD_NAMESPACE")
                            .unwrap_or_else(|_| "rollouts-dispatch".into())
                    });
                    let cp_config = client::config_for(&control_plane_access, "control-plane")
                        .await
                        .map_err(|e| {
                            EngineError::Start(format!(
                                "`agents.store: kubernetes` needs the control plane (`controlPlane` in {origin}): {e}"
                            ))
                        })?;
                    let cp = client::client(cp_config, &settings, &RequestCounter::default())
                        .map_err(|e| EngineError::Start(format!("control plane: {e}")))?;
                    Arc::new(store::kubernetes::KubeStore::start(
                        cp,
                        &namespace,
                        settings.request_timeout,
                    ))
                }
            });
            for (i, a) in agents.destinations.iter().enumerate() {
                registry.insert_agent(AgentDestination::new(
                    &a.name,
                    a.labels.clone(),
                    &a.namespace,
                    i,
                ));
            }
        }
        tracing::info!(destinations = ?registry.names(), %origin, "dispatch engine started");
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                policy,
                settings,
                origin,
                control_plane,
                control_plane_access,
                argocd_namespace,
                logs: Mutex::new(HashMap::new()),
                stages: Mutex::new(HashMap::new()),
                tasks,
                store,
                offline_after,
            }),
        })
    }

    /// The engine of an agent: one destination, `name`, the cluster the agent runs in
    /// (in-cluster credentials, else `$KUBECONFIG`), with the same Job caches and verdict code
    /// as the server's direct destinations.
    pub async fn start_local(
        name: &str,
        namespace: &str,
        settings: EngineSettings,
    ) -> Result<Self, EngineError> {
        let config = client::config_for(&crate::config::Access::Infer, name)
            .await
            .map_err(|e| {
                EngineError::Start(format!(
                    "no credentials for this cluster (in-cluster ServiceAccount or $KUBECONFIG): {e}"
                ))
            })?;
        let registry = Arc::new(Registry::new(settings, false));
        registry.insert(DestinationSpec {
            name: name.to_string(),
            labels: BTreeMap::new(),
            namespace: namespace.to_string(),
            server: config.cluster_url.to_string(),
            source: Source::Local,
            fingerprint: 0,
            config: Ok(config),
        });
        if let Some(Entry::Broken(b)) = registry.get(name) {
            return Err(EngineError::Start(b.error.clone()));
        }
        let origin = "agent".to_string();
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                policy: Policy::new(None, &origin),
                settings,
                origin,
                control_plane: tokio::sync::OnceCell::new(),
                control_plane_access: crate::config::Access::Infer,
                argocd_namespace: "argocd".into(),
                logs: Mutex::new(HashMap::new()),
                stages: Mutex::new(HashMap::new()),
                tasks: Vec::new(),
                store: None,
                offline_after: Duration::from_secs(60),
            }),
        })
    }

    /// The records of agent destinations (`None` without `agents` in the config).
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.inner.store.as_ref()
    }

    /// How long an agent may be silent before it is shown as not connected.
    pub fn agent_offline_after(&self) -> Duration {
        self.inner.offline_after
    }

    /// The config file (for messages).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The destination registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Waits up to `timeout` for live sources and every destination's caches; returns the
    /// destinations that did not sync.
    pub async fn wait_synced(&self, timeout: Duration) -> Vec<String> {
        self.inner.registry.wait_sources(timeout).await;
        self.inner.registry.wait_synced(timeout).await
    }

    /// HTTP requests sent to destinations so far (watches included).
    pub fn api_requests(&self) -> u64 {
        self.inner.registry.api_requests()
    }

    // === ensure ===

    /// Creates (or adopts) the measurement's Job on each destination.
    pub async fn ensure(&self, req: &MeasureRequest) -> Result<Ensured, EngineError> {
        let targets = self.targets(req).await?;
        let name = job::job_name(&req.run.uid, &req.metric, req.measurement);
        // Build every Job first: a bad spec creates nothing anywhere.
        let mut objects = Vec::with_capacity(targets.len());
        for (entry, namespace) in &targets {
            let obj = job::build(&JobInput {
                run: &req.run,
                metric: &req.metric,
                measurement: req.measurement,
                config: &req.config,
                destination: entry.name(),
                namespace,
            })
            .map_err(|e| EngineError::InvalidJob {
                metric: req.metric.clone(),
                reason: e.to_string(),
            })?;
            objects.push(obj);
        }
        let outcomes = join_all(targets.iter().zip(objects).map(|((entry, ns), obj)| {
            let name = &name;
            async move {
                match entry {
                    Entry::Agent(a) => self.agent_create(a, ns, name, req, obj).await,
                    _ => {
                        self.create_or_adopt(entry, ns, name, &req.run.uid, obj)
                            .await
                    }
                }
            }
        }))
        .await;
        let job = JobRef {
            run_uid: req.run.uid.clone(),
            name,
            require: req.config.require,
            log_tail: req.config.log_tail,
            placements: targets
                .iter()
                .map(|(e, ns)| Placement {
                    destination: e.name().to_string(),
                    namespace: ns.clone(),
                })
                .collect(),
        };
        let statuses = job
            .placements
            .iter()
            .zip(&outcomes)
            .map(|(p, o)| DestinationStatus {
                destination: p.destination.clone(),
                namespace: p.namespace.clone(),
                state: match o {
                    Outcome::Created | Outcome::Adopted => DestState::Running(None),
                    Outcome::NotCreated(s) => s.clone(),
                },
            })
            .collect();
        for ((entry, ns), o) in targets.iter().zip(&outcomes) {
            tracing::info!(run = %format!("{}/{}", req.run.namespace, req.run.name), metric = %req.metric,
                           destination = entry.name(), job = %format!("{ns}/{}", job.name), outcome = ?o, "ensure");
        }
        let redactor = Redactor::new(req.secrets.iter().cloned());
        let verdict = finish(&job, verdict::combine(job.require, statuses), &redactor);
        Ok(Ensured {
            outcomes: job
                .placements
                .iter()
                .map(|p| p.destination.clone())
                .zip(outcomes)
                .collect(),
            job,
            verdict,
        })
    }

    /// The [`JobRef`] of a measurement without creating anything: where [`Engine::ensure`]
    /// put (or would put) its Jobs. For callers that identify a measurement by run, metric and
    /// index instead of keeping the [`JobRef`] (the `/v1` API). Costs no API call, except the
    /// first `destination: stage` resolution of a run.
    pub async fn locate(&self, req: &MeasureRequest) -> Result<JobRef, EngineError> {
        let targets = self.targets(req).await?;
        Ok(JobRef {
            run_uid: req.run.uid.clone(),
            name: job::job_name(&req.run.uid, &req.metric, req.measurement),
            require: req.config.require,
            log_tail: req.config.log_tail,
            placements: targets
                .iter()
                .map(|(e, ns)| Placement {
                    destination: e.name().to_string(),
                    namespace: ns.clone(),
                })
                .collect(),
        })
    }

    /// The destinations (and namespaces) of a request, after the policy.
    async fn targets(&self, req: &MeasureRequest) -> Result<Vec<(Entry, String)>, EngineError> {
        let registry = &self.inner.registry;
        let (candidates, selector) = match &req.config.target {
            Target::Names(names) => {
                let mut out = Vec::new();
                for n in names {
                    out.push(self.lookup(n).await?);
                }
                (out, None)
            }
            Target::Selector(sel) => {
                registry.wait_sources(self.sources_wait()).await;
                let found = registry.matching(sel);
                if found.is_empty() {
                    let known = registry
                        .entries()
                        .iter()
                        .map(|e| format!("{} {:?}", e.name(), e.labels()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(EngineError::NoMatch {
                        selector: sel.to_string(),
                        known: if known.is_empty() {
                            "none".into()
                        } else {
                            known
                        },
                        origin: self.inner.origin.clone(),
                    });
                }
                (found, Some(sel))
            }
            Target::Stage => {
                let names = self.stage_destinations(&req.run).await?;
                let mut out = Vec::new();
                for n in &names {
                    out.push(self.lookup(n).await?);
                }
                (out, None)
            }
        };
        let project = &req.run.namespace;
        let mut allowed = Vec::new();
        let mut denied = Vec::new();
        for e in candidates {
            let ns = req
                .config
                .namespace
                .clone()
                .unwrap_or_else(|| e.namespace().to_string());
            match self.inner.policy.check(project, e.name(), &ns) {
                Ok(()) => allowed.push((e, ns)),
                Err(d) => denied.push(d),
            }
        }
        match (selector, denied.into_iter().next()) {
            // A selector may span destinations of several teams: keep the allowed ones.
            (Some(sel), Some(d)) if !allowed.is_empty() => {
                tracing::info!(selector = %sel, project = %project, skipped = %d.destination,
                               "policy excludes destinations the selector matched");
                Ok(allowed)
            }
            (_, Some(d)) => Err(d.into()),
            (_, None) => Ok(allowed),
        }
    }

    /// The destinations of the run's Stage; resolved once per run (a run belongs to one
    /// promotion), then remembered so that later lookups of the run cost no API call.
    async fn stage_destinations(&self, run: &RunContext) -> Result<Vec<String>, EngineError> {
        let known = self
            .inner
            .stages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&run.uid)
            .cloned();
        if let Some(names) = known {
            return Ok(names);
        }
        let cp = self.control_plane().await.map_err(EngineError::Stage)?;
        let registry = &self.inner.registry;
        registry.wait_sources(self.sources_wait()).await;
        let names = stage::resolve(
            &cp,
            run,
            &self.inner.argocd_namespace,
            registry,
            self.inner.settings.request_timeout,
        )
        .await
        .map_err(EngineError::Stage)?;
        let mut memo = self.inner.stages.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= MAX_REMEMBERED {
            memo.clear();
        }
        memo.insert(run.uid.clone(), names.clone());
        Ok(names)
    }

    fn sources_wait(&self) -> Duration {
        self.inner
            .settings
            .request_timeout
            .min(Duration::from_secs(10))
    }

    async fn lookup(&self, name: &str) -> Result<Entry, EngineError> {
        let registry = &self.inner.registry;
        if let Some(e) = registry.get(name) {
            return Ok(e);
        }
        // Right after start, Argo CD Secrets may not be listed yet.
        if registry.wait_sources(self.sources_wait()).await {
            if let Some(e) = registry.get(name) {
                return Ok(e);
            }
        }
        let names = registry.names();
        Err(EngineError::UnknownDestination {
            name: name.to_string(),
            known: if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
            origin: self.inner.origin.clone(),
        })
    }

    async fn control_plane(&self) -> Result<kube::Client, String> {
        let inner = &self.inner;
        inner
            .control_plane
            .get_or_init(|| async {
                let config = client::config_for(&inner.control_plane_access, "control-plane")
                    .await
                    .map_err(|e| {
                        format!(
                            "the control plane is not reachable (`controlPlane` in {}): {e}",
                            inner.origin
                        )
                    })?;
                client::client(config, &inner.settings, &RequestCounter::default())
            })
            .await
            .clone()
    }

    /// Creates Job `obj` (named `name`) on a direct destination, or adopts the Job of run
    /// `run_uid` already there. The agent calls this for its own cluster.
    pub async fn create_or_adopt(
        &self,
        entry: &Entry,
        namespace: &str,
        name: &str,
        run_uid: &str,
        obj: serde_json::Value,
    ) -> Outcome {
        let d = match entry {
            Entry::Ready(d) => d,
            Entry::Broken(b) => {
                return Outcome::NotCreated(DestState::Error(format!(
                    "destination is unusable: {}",
                    b.error
                )))
            }
            Entry::Agent(a) => {
                return Outcome::NotCreated(DestState::Error(format!(
                    "destination {} is reached through its agent, not directly",
                    a.name
                )))
            }
        };
        if d.jobs().is_authoritative() {
            if let Some(existing) = d.jobs().get(namespace, name) {
                return adopt_or_refuse(&existing, run_uid, namespace, name);
            }
        }
        let what = format!("create job {namespace}/{name}");
        let object: DynamicObject = match serde_json::from_value(obj) {
            Ok(o) => o,
            Err(e) => return Outcome::NotCreated(DestState::Error(format!("cannot {what}: {e}"))),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            d.client().clone(),
            namespace,
            &ApiResource::erase::<Job>(&()),
        );
        let timeout = self.inner.settings.request_timeout;
        match tokio::time::timeout(timeout, api.create(&PostParams::default(), &object)).await {
            Ok(Ok(_)) => Outcome::Created,
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
                match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
                    Ok(Ok(Some(existing))) => adopt_or_refuse(&existing, run_uid, namespace, name),
                    // Deleted in between (foreground deletion still running): try again later.
                    Ok(Ok(None)) => Outcome::NotCreated(DestState::Unavailable(format!(
                        "job {namespace}/{name} is being deleted; it will be created again on the next attempt"
                    ))),
                    Ok(Err(e)) => Outcome::NotCreated(api_failure(d, &format!("read job {namespace}/{name}"), &e)),
                    Err(_) => Outcome::NotCreated(no_answer(d, &what, timeout)),
                }
            }
            Ok(Err(e)) => Outcome::NotCreated(api_failure(d, &what, &e)),
            Err(_) => Outcome::NotCreated(no_answer(d, &what, timeout)),
        }
    }

    // === agent destinations ===

    fn agent_store(&self) -> Result<&Arc<dyn Store>, DestState> {
        self.inner.store.as_ref().ok_or_else(|| {
            DestState::Error("agent destinations need `agents` in the server config".into())
        })
    }

    /// Writes the record that asks `agent` to run Job `obj`; an existing record of the same run
    /// is adopted (a retry, or another replica wrote it first).
    async fn agent_create(
        &self,
        agent: &AgentDestination,
        namespace: &str,
        name: &str,
        req: &MeasureRequest,
        obj: serde_json::Value,
    ) -> Outcome {
        let store = match self.agent_store() {
            Ok(s) => s,
            Err(e) => return Outcome::NotCreated(e),
        };
        let record = DispatchJob {
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
                job: Some(obj),
                delete: false,
            },
            status: None,
            resource_version: None,
        };
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

    /// The state of a measurement's Job on an agent destination, as its agent last reported.
    async fn agent_state(
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
        let Some(record) = store.get(&name) else {
            // The record is gone while Argo still asks: the in-memory store of a restarted
            // server. Ask the agent to adopt the Job it has (never to create one).
            return match store.create(bare_record(agent, job, p, false)).await {
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
    async fn agent_delete(
        &self,
        agent: &AgentDestination,
        job: &JobRef,
        p: &Placement,
    ) -> Result<bool, String> {
        let store = self.agent_store().map_err(|s| s.summary())?;
        let name = store::record_name(&job.name, &agent.name);
        match store.get(&name) {
            Some(r) if r.status.as_ref().is_some_and(|s| s.deleted) => Ok(false),
            Some(r) if r.spec.delete => Ok(true),
            Some(_) => match store.request_delete(&name).await {
                Ok(()) => Ok(true),
                Err(store::StoreError::NotFound(_)) => Ok(false),
                Err(e) => Err(e.to_string()),
            },
            None => {
                store
                    .create(bare_record(agent, job, p, true))
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(true)
            }
        }
    }

    /// Keeps the newest `limit` records of run `run_uid` per agent destination (and metric, or
    /// all metrics together) and asks the agents to delete the Jobs of the others.
    async fn gc_agents(
        &self,
        run_uid: &str,
        metric: Option<&str>,
        limit: usize,
    ) -> (Vec<(String, String)>, Vec<(String, String)>) {
        let Some(store) = &self.inner.store else {
            return Default::default();
        };
        let records: Vec<DispatchJob> = store
            .for_run(run_uid)
            .into_iter()
            .filter(|r| !r.spec.delete && metric.is_none_or(|m| r.spec.metric == m))
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

    // === status ===

    /// The verdict of a measurement, from the watch caches: at steady state no API call.
    pub async fn status(&self, job: &JobRef, secrets: &Redactor) -> Verdict {
        self.status_with(job, secrets, true).await
    }

    /// The verdict by asking every API server (GET the Job, list its Pods): what an engine
    /// without watch caches does on every lookup. For comparison (`make bench-engine`) and
    /// diagnostics.
    pub async fn status_uncached(&self, job: &JobRef, secrets: &Redactor) -> Verdict {
        self.status_with(job, secrets, false).await
    }

    async fn status_with(&self, job: &JobRef, secrets: &Redactor, cached: bool) -> Verdict {
        let states = join_all(
            job.placements
                .iter()
                .map(|p| self.placement_state(job, p, secrets, cached)),
        )
        .await;
        let statuses = job
            .placements
            .iter()
            .zip(states)
            .map(|(p, state)| DestinationStatus {
                destination: p.destination.clone(),
                namespace: p.namespace.clone(),
                state,
            })
            .collect();
        finish(job, verdict::combine(job.require, statuses), secrets)
    }

    fn ready(&self, destination: &str) -> Result<Arc<Destination>, DestState> {
        match self.inner.registry.get(destination) {
            Some(Entry::Ready(d)) => Ok(d),
            Some(Entry::Broken(b)) => Err(DestState::Error(format!(
                "destination is unusable: {}",
                b.error
            ))),
            Some(Entry::Agent(a)) => Err(DestState::Error(format!(
                "destination {} is reached through its agent, not directly",
                a.name
            ))),
            None => Err(DestState::Error(format!(
                "destination {destination:?} is no longer known (removed from {} or its Argo CD \
                 cluster Secret was deleted)",
                self.inner.origin
            ))),
        }
    }

    /// The state of the measurement's Job on one destination. The agent calls this for its own
    /// cluster.
    pub async fn placement_state(
        &self,
        job: &JobRef,
        p: &Placement,
        secrets: &Redactor,
        cached: bool,
    ) -> DestState {
        if let Some(Entry::Agent(a)) = self.inner.registry.get(&p.destination) {
            return self.agent_state(&a, job, p).await;
        }
        let d = match self.ready(&p.destination) {
            Ok(d) => d,
            Err(s) => return s,
        };
        let hit = if cached {
            self.cached(&d, &p.namespace, &job.name).await
        } else {
            None
        };
        let from_cache = hit.is_some();
        let (obj, mut pods) = match hit {
            Some(x) => x,
            None => match self.fetch(&d, &p.namespace, &job.name).await {
                Ok(Some(x)) => x,
                Ok(None) => {
                    return DestState::Error(format!(
                        "job {}/{} does not exist (deleted by terminate, garbage collection or a person)",
                        p.namespace, job.name
                    ))
                }
                Err(s) => return s,
            },
        };
        match verdict::observe(&obj, &pods) {
            Observed::Running(detail) => DestState::Running(detail),
            Observed::Succeeded => DestState::Succeeded,
            Observed::ImagePull {
                container,
                reason,
                message,
            } => DestState::ImagePull {
                container,
                reason,
                message,
            },
            Observed::Failed { reason, message } => {
                let mut failed = logs::failed_container(&pods);
                if failed.is_none() && from_cache && reason != "DeadlineExceeded" {
                    // The Job and Pod watches are separate streams: the Job's Failed condition
                    // can arrive before the terminated Pod. The verdict is final, so ask once.
                    if let Ok(Some((_, fresh))) = self.fetch(&d, &p.namespace, &job.name).await {
                        pods = fresh;
                        failed = logs::failed_container(&pods);
                    }
                }
                let mut detail = message;
                if reason == "DeadlineExceeded" {
                    if let Some(s) = obj.spec.as_ref().and_then(|s| s.active_deadline_seconds) {
                        detail = format!("{detail} (activeDeadline {s}s)");
                    }
                }
                if let Some(f) = &failed {
                    detail = format!("{detail}; {}", f.describe());
                }
                let log = match &failed {
                    Some(f) => self.log_tail(&d, f, job.log_tail, secrets).await,
                    None => None,
                };
                DestState::Failed {
                    reason,
                    detail,
                    log,
                }
            }
        }
    }

    /// The Job and its Pods from the caches, when they are authoritative and hold the Job.
    async fn cached(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Option<(Arc<Job>, Vec<Arc<Pod>>)> {
        if !d.jobs().is_ready() || !d.pods().is_ready() {
            // Only while the first list is on its way; a failing watch does not make us wait.
            if d.jobs().failing_for().is_none() {
                d.wait_synced(self.inner.settings.cache_wait).await;
            }
        }
        if !d.is_authoritative() {
            return None;
        }
        let obj = d.jobs().get(namespace, name)?;
        Some((obj, d.pods_of(namespace, name)))
    }

    /// The Job and its Pods from the API server (`Ok(None)`: no such Job).
    async fn fetch(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Result<Option<(Arc<Job>, Vec<Arc<Pod>>)>, DestState> {
        let timeout = self.inner.settings.request_timeout;
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
        let what = format!("read job {namespace}/{name}");
        let obj = match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
            Ok(Ok(Some(j))) => j,
            Ok(Ok(None)) => return Ok(None),
            Ok(Err(e)) => return Err(with_cache_problem(d, api_failure(d, &what, &e))),
            Err(_) => return Err(with_cache_problem(d, no_answer(d, &what, timeout))),
        };
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let pods: Api<Pod> = Api::namespaced(d.client().clone(), namespace);
        let params =
            ListParams::default().labels(&format!("batch.kubernetes.io/controller-uid={uid}"));
        let what = format!("list pods of job {namespace}/{name}");
        let list = match tokio::time::timeout(timeout, pods.list(&params)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => return Err(api_failure(d, &what, &e)),
            Err(_) => return Err(no_answer(d, &what, timeout)),
        };
        Ok(Some((
            Arc::new(obj),
            list.items.into_iter().map(Arc::new).collect(),
        )))
    }

    /// The failed container's log tail: its termination message (free), else `pods/log`
    /// (cached per container, failures too, so a broken log API costs one timeout).
    async fn log_tail(
        &self,
        d: &Destination,
        failed: &FailedContainer,
        lines: u32,
        secrets: &Redactor,
    ) -> Option<String> {
        if lines == 0 {
            return None;
        }
        if let Some(m) = &failed.message {
            return Some(logs::render(
                failed,
                m,
                "termination message",
                lines,
                secrets,
            ));
        }
        let key = (
            d.name.clone(),
            failed.namespace.clone(),
            failed.pod.clone(),
            failed.container.clone(),
        );
        let known = self
            .inner
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let raw = match known {
            Some(r) => r,
            None => {
                let r =
                    logs::fetch(d.client(), failed, lines, self.inner.settings.log_timeout).await;
                let mut cache = self.inner.logs.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= MAX_CACHED_LOGS {
                    cache.clear();
                }
                cache.insert(key, r.clone());
                r
            }
        };
        Some(match raw {
            Ok(text) => logs::render(failed, &text, "pods/log", lines, secrets),
            Err(e) => format!(
                "no log of {} (pod {}): {}",
                failed.describe(),
                failed.pod,
                secrets.redact(&e)
            ),
        })
    }

    // === terminate, gc ===

    /// Deletes the measurement's Jobs (foreground: their Pods go first) on every destination.
    /// Only Jobs of this run created by us are deleted.
    pub async fn terminate(&self, job: &JobRef) -> TerminateReport {
        let results = join_all(job.placements.iter().map(|p| self.delete_one(job, p))).await;
        let mut report = TerminateReport::default();
        for (p, r) in job.placements.iter().zip(results) {
            match r {
                Ok(true) => report.deleted.push(p.destination.clone()),
                Ok(false) => report.absent.push(p.destination.clone()),
                Err(e) => report.failed.push((p.destination.clone(), e)),
            }
        }
        tracing::info!(job = %job.name, deleted = ?report.deleted, absent = ?report.absent,
                       failed = ?report.failed, "terminate");
        report
    }

    /// Deletes the measurement's Job on one destination; `Ok(false)`: none of ours was there.
    /// The agent calls this for its own cluster.
    pub async fn delete_one(&self, job: &JobRef, p: &Placement) -> Result<bool, String> {
        if let Some(Entry::Agent(a)) = self.inner.registry.get(&p.destination) {
            return self.agent_delete(&a, job, p).await;
        }
        let d = self.ready(&p.destination).map_err(|s| s.summary())?;
        let existing = match self.cached(&d, &p.namespace, &job.name).await {
            Some((j, _)) => Some(j),
            None => self
                .fetch_job(&d, &p.namespace, &job.name)
                .await?
                .map(Arc::new),
        };
        let Some(existing) = existing else {
            return Ok(false);
        };
        self.delete_job(&d, &existing, &job.run_uid).await
    }

    async fn fetch_job(
        &self,
        d: &Destination,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Job>, String> {
        let timeout = self.inner.settings.request_timeout;
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
        let what = format!("read job {namespace}/{name}");
        match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
            Ok(Ok(j)) => Ok(j),
            Ok(Err(e)) => Err(api_failure(d, &what, &e).summary()),
            Err(_) => Err(no_answer(d, &what, timeout).summary()),
        }
    }

    /// Foreground delete with a UID precondition; `Ok(false)`: already gone.
    async fn delete_job(&self, d: &Destination, obj: &Job, run_uid: &str) -> Result<bool, String> {
        let namespace = obj.metadata.namespace.clone().unwrap_or_default();
        let name = obj.metadata.name.clone().unwrap_or_default();
        if let Ownership::Foreign(why) = job::ownership(obj, run_uid) {
            return Err(format!("refusing to delete job {namespace}/{name}: {why}"));
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: obj.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::foreground()
        };
        let jobs: Api<Job> = Api::namespaced(d.client().clone(), &namespace);
        let timeout = self.inner.settings.request_timeout;
        let what = format!("delete job {namespace}/{name}");
        match tokio::time::timeout(timeout, jobs.delete(&name, &params)).await {
            Ok(Ok(_)) => Ok(true),
            // Gone, or replaced by another object of that name: nothing of ours to delete.
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => Ok(false),
            Ok(Err(e)) => Err(api_failure(d, &what, &e).summary()),
            Err(_) => Err(no_answer(d, &what, timeout).summary()),
        }
    }

    /// Keeps the newest `limit` Jobs of run `run_uid` on each destination and deletes the older
    /// ones: of one metric, or (`metric: None`) of all metrics together, like Argo's built-in
    /// provider.
    pub async fn gc(&self, run_uid: &str, metric: Option<&str>, limit: usize) -> GcReport {
        let dests: Vec<Arc<Destination>> = self
            .inner
            .registry
            .entries()
            .into_iter()
            .filter_map(|e| match e {
                Entry::Ready(d) => Some(d),
                Entry::Broken(_) | Entry::Agent(_) => None,
            })
            .collect();
        let results = join_all(dests.iter().map(|d| self.gc_one(d, run_uid, metric, limit))).await;
        let (agent_deleted, agent_failed) = self.gc_agents(run_uid, metric, limit).await;
        let mut report = GcReport {
            deleted: agent_deleted,
            failed: agent_failed,
        };
        for (d, r) in dests.iter().zip(results) {
            match r {
                Ok(deleted) => report
                    .deleted
                    .extend(deleted.into_iter().map(|j| (d.name.clone(), j))),
                Err(e) => report.failed.push((d.name.clone(), e)),
            }
        }
        if !report.deleted.is_empty() || !report.failed.is_empty() {
            tracing::info!(run_uid, limit, deleted = ?report.deleted, failed = ?report.failed, "gc");
        }
        report
    }

    async fn gc_one(
        &self,
        d: &Destination,
        run_uid: &str,
        metric: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, String> {
        let mut jobs: Vec<Arc<Job>> = if d.jobs().is_authoritative() {
            d.jobs().group(run_uid)
        } else {
            let api: Api<Job> = Api::all(d.client().clone());
            let params = ListParams::default()
                .labels(&format!("{LABEL_RUN_UID}={run_uid},{MANAGED_SELECTOR}"));
            let timeout = self.inner.settings.request_timeout;
            match tokio::time::timeout(timeout, api.list(&params)).await {
                Ok(Ok(l)) => l.items.into_iter().map(Arc::new).collect(),
                Ok(Err(e)) => return Err(api_failure(d, "list jobs", &e).summary()),
                Err(_) => return Err(no_answer(d, "list jobs", timeout).summary()),
            }
        };
        jobs.retain(|j| {
            let of_metric = metric.is_none_or(|m| {
                j.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(ANN_METRIC))
                    .is_some_and(|v| v == m)
            });
            of_metric
                && j.metadata.deletion_timestamp.is_none()
                && job::ownership(j, run_uid) == Ownership::Ours
        });
        if jobs.len() <= limit {
            return Ok(Vec::new());
        }
        let measurement = |j: &Job| {
            j.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_MEASUREMENT))
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Oldest first; creation timestamps have 1 s resolution, the measurement index breaks ties.
        jobs.sort_by(|a, b| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
                .then_with(|| measurement(a).cmp(&measurement(b)))
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        let excess = jobs.len() - limit;
        let mut deleted = Vec::new();
        let mut errors = Vec::new();
        for j in &jobs[..excess] {
            match self.delete_job(d, j, run_uid).await {
                Ok(true) => deleted.push(format!(
                    "{}/{}",
                    j.metadata.namespace.as_deref().unwrap_or_default(),
                    j.metadata.name.as_deref().unwrap_or_default()
                )),
                Ok(false) => {}
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            Ok(deleted)
        } else {
            Err(errors.join("; "))
        }
    }
}

/// The AnalysisRun resource on the control plane.
fn analysis_run_resource() -> ApiResource {
    ApiResource {
        group: "argoproj.io".into(),
        version: "v1alpha1".into(),
        api_version: "argoproj.io/v1alpha1".into(),
        kind: "AnalysisRun".into(),
        plural: "analysisruns".into(),
    }
}

/// A record without a Job spec, for a measurement whose record is gone (the in-memory store of a
/// restarted server): the agent adopts the Job it has (`delete: false`) or deletes it.
fn bare_record(agent: &AgentDestination, job: &JobRef, p: &Placement, delete: bool) -> DispatchJob {
    DispatchJob {
        name: store::record_name(&job.name, &agent.name),
        spec: DispatchJobSpec {
            destination: agent.name.clone(),
            namespace: p.namespace.clone(),
            job_name: job.name.clone(),
            run_uid: job.run_uid.clone(),
            run: String::new(),
            metric: String::new(),
            measurement: measurement_of(&job.name),
            log_tail: job.log_tail,
            job: None,
            delete,
        },
        status: None,
        resource_version: None,
    }
}

/// The `n` of a Job name `<uid>.<metric>.<n>` (0 when it has none).
fn measurement_of(job_name: &str) -> u32 {
    job_name
        .rsplit('.')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl Engine {
    /// Deletes the Jobs (and asks agents to delete the Jobs) whose AnalysisRun no longer exists
    /// on the control plane: a run deleted while its Jobs ran, or Jobs of measurements that a
    /// crash left behind after their run went away. Argo calls `GarbageCollect` only for runs
    /// that exist, so without this nothing would ever remove them.
    ///
    /// The Jobs and records are snapshotted *before* the runs are listed: a Job exists only after
    /// its run, so a Job in the snapshot whose run is missing from the later list is an orphan —
    /// never a Job of a run created in between. Only Jobs of ours (labels, run UID) are deleted.
    pub async fn sweep_orphans(&self) -> Result<GcReport, String> {
        let direct: Vec<(Arc<Destination>, Vec<Arc<Job>>)> = self
            .inner
            .registry
            .entries()
            .into_iter()
            .filter_map(|e| match e {
                // A cache that is not authoritative may miss Jobs; the next sweep gets them.
                Entry::Ready(d) if d.jobs().is_authoritative() => {
                    let jobs = d.jobs().all();
                    Some((d, jobs))
                }
                _ => None,
            })
            .collect();
        let records = self
            .inner
            .store
            .as_ref()
            .map(|s| s.all())
            .unwrap_or_default();
        let cp = self.control_plane().await?;
        let runs: Api<DynamicObject> = Api::all_with(cp, &analysis_run_resource());
        let timeout = self.inner.settings.request_timeout;
        let live: std::collections::HashSet<String> =
            match tokio::time::timeout(timeout, runs.list_metadata(&ListParams::default())).await {
                Ok(Ok(list)) => list
                    .items
                    .into_iter()
                    .filter_map(|r| r.metadata.uid)
                    .collect(),
                Ok(Err(e)) => {
                    return Err(format!(
                    "cannot list analysisruns on the control plane: {} (the server needs list on \
                         analysisruns.argoproj.io to sweep orphans)",
                    client::describe(&e)
                ))
                }
                Err(_) => return Err("listing analysisruns timed out".into()),
            };
        let mut report = GcReport::default();
        for (d, jobs) in direct {
            for j in jobs {
                let Some(uid) = destinations::job_group(&j) else {
                    continue;
                };
                if live.contains(&uid) || j.metadata.deletion_timestamp.is_some() {
                    continue;
                }
                let what = format!(
                    "{}/{}",
                    j.metadata.namespace.as_deref().unwrap_or_default(),
                    j.metadata.name.as_deref().unwrap_or_default()
                );
                match self.delete_job(&d, &j, &uid).await {
                    Ok(true) => report.deleted.push((d.name.clone(), what)),
                    Ok(false) => {}
                    Err(e) => report.failed.push((d.name.clone(), e)),
                }
            }
        }
        if let Some(store) = &self.inner.store {
            for r in records {
                if live.contains(&r.spec.run_uid) || r.spec.delete {
                    continue;
                }
                match store.request_delete(&r.name).await {
                    Ok(()) => report.deleted.push((
                        r.spec.destination.clone(),
                        format!("{}/{}", r.spec.namespace, r.spec.job_name),
                    )),
                    Err(store::StoreError::NotFound(_)) => {}
                    Err(e) => report
                        .failed
                        .push((r.spec.destination.clone(), e.to_string())),
                }
            }
        }
        if !report.deleted.is_empty() || !report.failed.is_empty() {
            tracing::info!(deleted = ?report.deleted, failed = ?report.failed,
                           "orphan sweep: Jobs of AnalysisRuns that no longer exist");
        }
        Ok(report)
    }
}

fn adopt_or_refuse(existing: &Job, run_uid: &str, namespace: &str, name: &str) -> Outcome {
    match job::ownership(existing, run_uid) {
        Ownership::Ours => Outcome::Adopted,
        Ownership::Foreign(why) => Outcome::NotCreated(DestState::Error(format!(
            "job {namespace}/{name} already exists and is not ours: {why}; it is left alone — delete it \
             or rename the metric"
        ))),
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
        kube::Error::Api(s) if s.code == 403 => DestState::Error(format!(
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
    use super::*;

    #[test]
    fn job_refs_round_trip_through_metadata() {
        let r = JobRef {
            run_uid: "u".into(),
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
        };
        let m = r.metadata();
        assert_eq!(m[JOB_NAME_KEY], "u.m.1");
        assert_eq!(m[JOB_NAMESPACE_KEY], "ns1");
        assert!(m[REF_KEY].contains("\"require\":\"any\""), "{}", m[REF_KEY]);
        assert_eq!(JobRef::from_metadata(&m).unwrap(), r);
        assert!(JobRef::from_metadata(&BTreeMap::new())
            .unwrap_err()
            .contains("not started by this server"));
        let bad = BTreeMap::from([(REF_KEY.to_string(), "{".to_string())]);
        assert!(JobRef::from_metadata(&bad)
            .unwrap_err()
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
        let mut config = ServerConfig::parse("", "config file t.yaml").unwrap();
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
                    name: "n".into(),
                    require: Require::All,
                    log_tail: 1,
                    placements: vec![Placement {
                        destination: "gone".into(),
                        namespace: "ns".into(),
                    }],
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
        assert_eq!(engine.gc("u", None, 1).await, GcReport::default());
    }
}
