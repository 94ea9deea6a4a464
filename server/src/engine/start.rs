//! Starting an engine: the destination registry and its sources, the agent store, the
//! control-plane client, and the accessors the server and the agent read.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{ControlPlaneError, Engine, EngineError, Inner, SyncDisabled};
use crate::config::{EngineSettings, JobsSettings, ServerConfig, StoreKind};
use crate::destinations::client::RequestCounter;
use crate::destinations::stage::StageInstance;
use crate::destinations::{
    self, argocd, client, AgentDestination, DestinationSpec, Entry, Registry, Source,
};
use crate::logs;
use crate::policy::Policy;
use crate::signing::Signer;
use crate::store;
use crate::store::Store;

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
            // read by `serve`, which watches the runs (`cmd::serve::confirming_runs`)
            confirm_runs: _,
            jobs,
            application_sync,
            // read by `serve` (people, the log API) and the measurements (the verdict's link)
            ui: _,
            budgets,
        } = config;
        let policy = Policy::new(policy.as_ref(), &origin);
        if let Some(w) = policy.warning() {
            tracing::warn!("{w}");
        }
        for w in policy.namespace_warnings() {
            tracing::warn!(origin = %origin, "{w}");
        }
        let registry = Arc::new(Registry::new(settings, !argocd.is_empty()));
        let control_plane = tokio::sync::OnceCell::new();
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
                    return Err(EngineError::cannot_start(
                        format!("kubeconfigContexts.path in {origin}: {e}"),
                        e,
                    ))
                }
            }
        }
        // After the configured destinations: an instance's `destination` is one of them.
        let mut tasks = Vec::new();
        let stage_instances = if argocd.is_empty() {
            vec![StageInstance::unconfigured()]
        } else {
            let direct = argocd::instances::DirectSources {
                destinations: &destinations,
                kubeconfig_contexts: kubeconfig_contexts.as_ref(),
            };
            let started = argocd::instances::start(
                &registry,
                argocd,
                &control_plane_access,
                &direct,
                &settings,
                &origin,
            )
            .await
            .map_err(EngineError::ArgoCd)?;
            if let Some(cp) = started.control_plane {
                let _ = control_plane.set(Ok(cp));
            }
            tasks = started.tasks;
            started.stage
        };
        let mut store: Option<Arc<Store>> = None;
        let mut offline_after = Duration::from_secs(60);
        if let Some(agents) = &agents {
            offline_after = agents.offline_after;
            store = Some(match agents.store {
                StoreKind::Memory => Arc::new(Store::memory()),
                StoreKind::Kubernetes => {
                    let namespace = agents.namespace.clone().unwrap_or_else(|| {
                        std::env::var("POD_NAMESPACE")
                            .unwrap_or_else(|_| "rollouts-dispatch".into())
                    });
                    let cp_config = client::config_for(&control_plane_access, "control-plane")
                        .await
                        .map_err(|e| {
                            EngineError::cannot_start(format!(
                                "`agents.store: kubernetes` needs the control plane (`controlPlane` in {origin}): {e}"
                            ), e)
                        })?;
                    let cp = client::client_of(
                        &control_plane_access,
                        "control-plane",
                        cp_config,
                        &settings,
                        &RequestCounter::default(),
                    )
                    .map_err(|e| EngineError::cannot_start(format!("control plane: {e}"), e))?;
                    Arc::new(Store::Kubernetes(Box::new(
                        store::kubernetes::KubeStore::start(
                            cp,
                            &namespace,
                            settings.request_timeout,
                        ),
                    )))
                }
            });
            if let Some(store) = &store {
                // An agent's final report nudges the plugin as a Job's end does.
                store.index().set_hints(registry.hints().clone());
            }
            for (i, a) in agents.destinations.iter().enumerate() {
                registry.insert_agent(AgentDestination::new(
                    &a.name,
                    a.labels.clone(),
                    &a.namespace,
                    i,
                ));
            }
        }
        // Owner references need to know which destination is the control plane; without
        // credentials for it (a laptop without a kubeconfig) none is.
        let control_plane_url = client::config_for(&control_plane_access, "control-plane")
            .await
            .ok()
            .map(|c| c.cluster_url.to_string().trim_end_matches('/').to_string());
        tracing::info!(destinations = ?registry.names(), %origin, "dispatch engine started");
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                policy,
                settings,
                origin,
                control_plane,
                control_plane_access,
                stage_instances,
                tails: logs::tails::Tails::new(settings.log_timeout),
                stages: Mutex::new(HashMap::new()),
                tasks,
                deletions: store.clone().unwrap_or_else(|| Arc::new(Store::memory())),
                store,
                offline_after,
                marker: std::sync::OnceLock::new(),
                marks_sent: false,
                jobs,
                control_plane_url,
                application_sync,
                budgets,
            }),
        })
    }

    /// The engine of an agent: one destination, `name`, the cluster the agent runs in
    /// (in-cluster credentials, else `$KUBECONFIG`), with the same Job caches and verdict code
    /// as the server's direct destinations. `namespaces`: the only namespaces its caches watch
    /// (one watch each, so the agent needs no cluster-wide read); `None`: every namespace.
    pub async fn start_local(
        name: &str,
        namespaces: Option<Vec<String>>,
        settings: EngineSettings,
    ) -> Result<Self, EngineError> {
        let config = client::config_for(&crate::config::Access::Infer, name)
            .await
            .map_err(|e| {
                EngineError::cannot_start(
                    format!(
                        "no credentials for this cluster (in-cluster ServiceAccount or $KUBECONFIG): {e}"
                    ),
                    e,
                )
            })?;
        let registry = Arc::new(Registry::new(settings, false));
        // The agent names the namespace of every Job it creates; this default is never used.
        let namespace = namespaces
            .as_ref()
            .and_then(|n| n.first())
            .map_or("default", String::as_str)
            .to_string();
        registry.insert(DestinationSpec {
            name: name.to_string(),
            labels: BTreeMap::new(),
            namespace,
            namespaces,
            server: config.cluster_url.to_string(),
            source: Source::Local,
            fingerprint: 0,
            config: Ok(config),
            // In-cluster credentials: kube-rs follows the projected token and CA itself.
            follows: None,
        });
        if let Some(Entry::Broken(b)) = registry.get(name) {
            return Err(EngineError::Start {
                message: b.error.clone(),
                source: None,
            });
        }
        let origin = "agent".to_string();
        Ok(Self {
            inner: Arc::new(Inner {
                registry,
                // The agent's checks are its own flags (`agent`), run before this engine is asked.
                policy: Policy::allow_all(&origin),
                settings,
                origin,
                control_plane: tokio::sync::OnceCell::new(),
                control_plane_access: crate::config::Access::Infer,
                stage_instances: Vec::new(),
                tails: logs::tails::Tails::new(settings.log_timeout),
                stages: Mutex::new(HashMap::new()),
                tasks: Vec::new(),
                store: None,
                deletions: Arc::new(Store::memory()),
                offline_after: Duration::from_secs(60),
                marker: std::sync::OnceLock::new(),
                marks_sent: true,
                // The agent creates the Jobs the server built (TTL included); its cluster is
                // never the control plane.
                jobs: crate::config::JobsSettings::default(),
                control_plane_url: None,
                application_sync: Vec::new(),
                // The agent serves no project's calls.
                budgets: crate::config::BudgetsConfig::default(),
            }),
        })
    }

    /// Marks the Jobs this engine creates with `signer`'s keys (`job::mark`), so that any
    /// replica with the same keys (and a restarted server) adopts them. Set once, before the
    /// first measurement; without it the engine marks with a key of its own process, which
    /// only it can adopt.
    pub fn mark_jobs_with(&self, signer: Arc<Signer>) {
        if self.inner.marker.set(signer).is_err() {
            tracing::warn!("the engine's Job mark key was already set; the new one is ignored");
        }
    }

    /// The signer of Job marks, shared: for the log view, which shows only Jobs it marked.
    pub fn job_marker(&self) -> Arc<Signer> {
        self.marker_cell().clone()
    }

    /// The signer of Job marks.
    pub(super) fn marker(&self) -> &Signer {
        self.marker_cell()
    }

    fn marker_cell(&self) -> &Arc<Signer> {
        self.inner.marker.get_or_init(|| {
            let mut key = [0u8; 32];
            // A process-local key: only this engine can adopt what it created.
            ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut key)
                .expect("the system's random source is unavailable");
            Arc::new(Signer::new(&[key.to_vec()]).expect("one key is a valid key set"))
        })
    }

    /// The records of agent destinations (`None` without `agents` in the config).
    pub fn store(&self) -> Option<&Arc<Store>> {
        self.inner.store.as_ref()
    }

    /// Whether `entry` is the control plane's cluster, where the AnalysisRuns are: Argo CD's
    /// implicit `in-cluster` destination (built from the control plane's own credentials), or a
    /// destination whose API server URL is the control plane's. Two URLs for one cluster (an
    /// external name and the in-cluster service) are not recognised: such Jobs get no owner
    /// reference and are left to their TTL and the sweep, never deleted for a missing owner.
    pub fn on_control_plane(&self, entry: &Entry) -> bool {
        let Entry::Ready(d) = entry else {
            return false;
        };
        matches!(d.source, Source::ArgoCdInCluster { .. })
            || self
                .inner
                .control_plane_url
                .as_deref()
                .is_some_and(|cp| cp == d.server.trim_end_matches('/'))
    }

    /// Whether credentials for the control plane resolved at start (`controlPlane`, else
    /// in-cluster or the kubeconfig): the sweep is on by default only then.
    pub fn has_control_plane(&self) -> bool {
        self.inner.control_plane_url.is_some()
    }

    /// How long our Jobs stay once done (`jobs:` of the config).
    pub fn jobs_settings(&self) -> JobsSettings {
        self.inner.jobs
    }

    /// What one project (or agent destination) may hold at once (`budgets:` of the config).
    pub fn budgets(&self) -> crate::config::BudgetsConfig {
        self.inner.budgets
    }

    /// The longest any single API call to a destination may take (`engine.requestTimeout`).
    pub fn request_timeout(&self) -> Duration {
        self.inner.settings.request_timeout
    }

    /// How long an agent may be silent before it is shown as not connected.
    pub fn agent_offline_after(&self) -> Duration {
        self.inner.offline_after
    }

    /// The client of the control plane (built once, on first use), for the server's own
    /// watches there: the AnalysisRuns that confirm measurement requests (`runs`).
    pub async fn control_plane_client(&self) -> Result<kube::Client, ControlPlaneError> {
        self.control_plane().await
    }

    /// The config file (for messages).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }

    /// The destination registry.
    pub fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The destination registry, shared (the log feature holds it without the engine).
    pub fn shared_registry(&self) -> Arc<Registry> {
        self.inner.registry.clone()
    }

    /// The client of the usable direct destination `name` (the agent's own cluster, read by
    /// its log streams).
    pub fn client_of(&self, name: &str) -> Option<kube::Client> {
        match self.registry().get(name) {
            Some(Entry::Ready(d)) => Some(d.client().clone()),
            _ => None,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// Whether the API may sync Argo CD Applications on `destination`
    /// (`applicationSync.destinations`); the refusal names the key to set.
    pub fn sync_enabled(&self, destination: &str) -> Result<(), SyncDisabled> {
        let globs = &self.inner.application_sync;
        if globs
            .iter()
            .any(|g| crate::policy::glob_match(g, destination))
        {
            return Ok(());
        }
        Err(SyncDisabled {
            destination: destination.to_string(),
            origin: self.inner.origin.clone(),
        })
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
}
