//! Destinations: the registry of clusters that Jobs run on, and the sources that fill it.
//!
//! A destination is a name, labels (for `destinationSelector`), a default namespace, a server
//! URL and a kube client, plus two watch caches selected by `rollouts-dispatch.io/managed=true`:
//! our Jobs (indexed by run UID) and their Pods (indexed by Job), so that a status lookup costs
//! no API call. Sources, merged by name (and, for an Application's server URL, by server) with
//! this precedence:
//!
//! 1. the config file's `destinations` ([`Source::Config`]) and agents; the cluster an Argo CD
//!    instance with `kubeconfig` runs on, named after it, like a configured destination;
//! 2. the implicit Argo CD `in-cluster` destination, the control plane itself;
//! 3. Argo CD cluster Secrets, watched live on the cluster of each Argo CD instance
//!    ([`argocd`]): whoever may write them never shadows what the platform team configured, nor
//!    `in-cluster` (#27); the Secret is ignored with a warning naming both;
//! 4. kubeconfig contexts ([`Source::Kubeconfig`], the embedded default on a laptop).
//!
//! Agent destinations (`agents.destinations` of the config, [`Source::Agent`]) are
//! [`AgentDestination`]s: no client and no cache here, their work goes through the
//! [`crate::store`]; the registry tracks when their agent was last heard from.
//!
//! A destination whose credentials cannot be used is registered as [`Broken`]: measurements
//! that target it get its error instead of "unknown destination".

mod agent;
pub mod argocd;
pub mod cache;
pub mod client;
mod source;
pub mod stage;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dispatch_api::selector::Selector;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::config::{
    check_destination_name, Access, DestinationConfig, EngineSettings, KubeconfigContexts,
};
use crate::hints::Hints;
use crate::job::MANAGED_SELECTOR;
use crate::policy::glob_match;
pub use agent::AgentDestination;
use cache::{Cache, ChangeHook};
use client::{AccessError, RequestCounter};
pub use source::Source;

/// The warning of a destination whose TLS certificates are not verified.
pub const INSECURE_WARNING: &str = "insecure: TLS certificates are not verified (Argo CD \
     tlsClientConfig.insecure or kubeconfig insecure-skip-tls-verify); a man in the middle can \
     read its credentials and forge its answers";

/// Name of Argo CD's implicit local cluster.
pub const IN_CLUSTER_NAME: &str = "in-cluster";
/// Server URL of Argo CD's implicit local cluster.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

/// Why a [`DestinationSpec`] has no client config: the credentials its source gives cannot be
/// used. The destination is then registered as [`Broken`] with this message.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// A configured access or a kubeconfig context.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// An Argo CD cluster Secret.
    #[error(transparent)]
    ArgoCd(#[from] argocd::SecretError),
    /// The credentials of an Argo CD instance's own cluster (`argocd[].kubeconfig`), shared
    /// with the instance's watch.
    #[error(transparent)]
    Instance(#[from] Arc<AccessError>),
}

/// Everything needed to register a destination.
#[derive(Debug)]
pub struct DestinationSpec {
    /// the name
    pub name: String,
    /// labels for `destinationSelector`
    pub labels: BTreeMap<String, String>,
    /// default namespace of Jobs
    pub namespace: String,
    /// the namespaces its Jobs may run in, and the only ones its caches watch (`None`: every
    /// namespace, watched cluster-wide)
    pub namespaces: Option<Vec<String>>,
    /// API server URL (no trailing `/`), for messages and Argo CD matching
    pub server: String,
    /// where it comes from
    pub source: Source,
    /// changes when the source's data changes (an unchanged Secret is not reconnected)
    pub fingerprint: u64,
    /// the client config, or why there is none
    pub config: Result<kube::Config, SpecError>,
    /// the access `config` was read from, when its client follows its credential files (a
    /// rewritten kubeconfig or token file is used by the next request: `client::client_of`);
    /// `None`: the client keeps `config` (Argo CD Secrets are watched and re-registered instead)
    pub follows: Option<Access>,
}

/// A usable destination.
pub struct Destination {
    /// the name
    pub name: String,
    /// labels
    pub labels: BTreeMap<String, String>,
    /// default namespace of Jobs
    pub namespace: String,
    /// the only namespaces its Jobs may run in and its caches watch (`None`: every namespace)
    pub namespaces: Option<Vec<String>>,
    /// API server URL
    pub server: String,
    /// where it comes from
    pub source: Source,
    /// TLS certificates are not verified (`insecure-skip-tls-verify`, Argo CD's
    /// `tlsClientConfig.insecure`): shown as a warning wherever destinations are listed
    pub insecure: bool,
    client: kube::Client,
    jobs: Arc<Cache<Job>>,
    pods: Arc<Cache<Pod>>,
    counter: RequestCounter,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl fmt::Debug for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Destination")
            .field("name", &self.name)
            .field("server", &self.server)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Drop for Destination {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The run UID a Job of ours belongs to (`job::run_uid_of`: our label, else Argo's on Jobs
/// created before ours).
pub(crate) fn job_group(job: &Job) -> Option<String> {
    crate::job::run_uid_of(job.metadata.labels.as_ref()?).map(|(_, uid)| uid.to_string())
}

/// Emits the resume hint of a Job that has just finished (it had no final condition before, or
/// was not in the cache).
fn job_hints(hints: Hints) -> ChangeHook<Job> {
    Arc::new(move |old, new| {
        if let Some(hint) = crate::hints::of_finished_job(old, new) {
            hints.emit(hint);
        }
    })
}

/// Emits the resume hint of the Job of a pod that has just started waiting for a reason that
/// decides the verdict at once (an image that cannot be pulled, a crash loop).
fn pod_hints(hints: Hints, jobs: Arc<Cache<Job>>) -> ChangeHook<Pod> {
    Arc::new(move |old, new| {
        if let Some(hint) = crate::hints::of_waiting_pod(old, new, |ns, job| jobs.get(ns, job)) {
            hints.emit(hint);
        }
    })
}

fn pod_group(pod: &Pod) -> Option<String> {
    let owner = crate::job::controlling_job(pod)?;
    Some(pod_group_key(
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        owner,
    ))
}

fn pod_group_key(namespace: &str, job: &str) -> String {
    format!("{namespace}/{job}")
}

impl Destination {
    /// Builds the client and starts the watch caches (without waiting for them); a Job of ours
    /// that gets its final condition there emits a resume hint into `hints`.
    fn start(
        spec: &DestinationSpec,
        config: kube::Config,
        settings: &EngineSettings,
        hints: &Hints,
    ) -> Result<Self, AccessError> {
        let counter = RequestCounter::default();
        let insecure = config.accept_invalid_certs;
        if insecure {
            tracing::warn!(destination = %spec.name, source = %spec.source, server = %spec.server,
                           "TLS verification is off for this destination: {INSECURE_WARNING}");
        }
        let client = match &spec.follows {
            Some(access) => client::client_of(access, &spec.name, config, settings, &counter)?,
            None => client::client(config, settings, &counter)?,
        };
        // Limited to namespaces: one watch per namespace, so that no cluster-wide list or watch
        // (of every Pod of the cluster, plain env values included) is needed.
        let watched = spec.namespaces.as_deref();
        let jobs = Arc::new(
            Cache::new("Job", &spec.name, job_group, watched).with_hook(job_hints(hints.clone())),
        );
        let pods = Arc::new(
            Cache::new("Pod", &spec.name, pod_group, watched)
                .with_hook(pod_hints(hints.clone(), jobs.clone())),
        );
        let mut tasks = jobs.spawn(&client, MANAGED_SELECTOR);
        tasks.extend(pods.spawn(&client, MANAGED_SELECTOR));
        tracing::info!(destination = %spec.name, server = %spec.server, source = %spec.source,
                       namespace = %spec.namespace, watched = ?spec.namespaces,
                       "destination registered");
        Ok(Self {
            name: spec.name.clone(),
            labels: spec.labels.clone(),
            namespace: spec.namespace.clone(),
            namespaces: spec.namespaces.clone(),
            server: spec.server.clone(),
            source: spec.source.clone(),
            insecure,
            client,
            jobs,
            pods,
            counter,
            tasks,
        })
    }

    /// The kube client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The Job cache.
    pub fn jobs(&self) -> &Cache<Job> {
        &self.jobs
    }

    /// The Pod cache.
    pub fn pods(&self) -> &Cache<Pod> {
        &self.pods
    }

    /// Whether its caches see Jobs and Pods in `namespace` (every namespace unless limited).
    pub fn watches(&self, namespace: &str) -> bool {
        self.jobs.watches(namespace) && self.pods.watches(namespace)
    }

    /// The cached Pods of Job `namespace/name`.
    pub fn pods_of(&self, namespace: &str, job: &str) -> Vec<Arc<Pod>> {
        self.pods.group(&pod_group_key(namespace, job))
    }

    /// HTTP requests this destination's client has sent (watches included).
    pub fn api_requests(&self) -> u64 {
        self.counter.get()
    }

    /// Both caches listed once and their watches are healthy.
    pub fn is_authoritative(&self) -> bool {
        self.jobs.is_authoritative() && self.pods.is_authoritative()
    }

    /// Waits up to `timeout` for both caches' first list.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let (a, b) = tokio::join!(self.jobs.wait_ready(timeout), self.pods.wait_ready(timeout));
        a && b
    }

    /// Why the caches cannot be trusted right now, if they cannot.
    pub fn cache_problem(&self) -> Option<String> {
        for (kind, failing, ready) in [
            ("jobs", self.jobs.failing_for(), self.jobs.is_ready()),
            ("pods", self.pods.failing_for(), self.pods.is_ready()),
        ] {
            if let Some((d, e)) = failing {
                return Some(format!("watch of {kind} failing for {}s: {e}", d.as_secs()));
            }
            if !ready {
                return Some(format!("watch of {kind} not synced yet"));
            }
        }
        None
    }
}

/// A destination whose credentials cannot be used.
#[derive(Debug, Clone)]
pub struct Broken {
    /// the name
    pub name: String,
    /// labels
    pub labels: BTreeMap<String, String>,
    /// default namespace of Jobs
    pub namespace: String,
    /// the only namespaces its Jobs may run in (`None`: every namespace)
    pub namespaces: Option<Vec<String>>,
    /// API server URL, if known
    pub server: String,
    /// where it comes from
    pub source: Source,
    /// why it cannot be used, and how to fix it
    pub error: String,
}

/// A registry entry.
#[derive(Debug, Clone)]
pub enum Entry {
    /// usable
    Ready(Arc<Destination>),
    /// known but unusable
    Broken(Arc<Broken>),
    /// reached through its agent
    Agent(Arc<AgentDestination>),
}

impl Entry {
    /// The name.
    pub fn name(&self) -> &str {
        match self {
            Self::Ready(d) => &d.name,
            Self::Broken(b) => &b.name,
            Self::Agent(a) => &a.name,
        }
    }
    /// The labels.
    pub fn labels(&self) -> &BTreeMap<String, String> {
        match self {
            Self::Ready(d) => &d.labels,
            Self::Broken(b) => &b.labels,
            Self::Agent(a) => &a.labels,
        }
    }
    /// The default namespace of Jobs.
    pub fn namespace(&self) -> &str {
        match self {
            Self::Ready(d) => &d.namespace,
            Self::Broken(b) => &b.namespace,
            Self::Agent(a) => &a.namespace,
        }
    }
    /// The only namespaces its Jobs may run in (`None`: any; an agent destination's agent
    /// checks its own `--namespaces`).
    pub fn namespaces(&self) -> Option<&[String]> {
        match self {
            Self::Ready(d) => d.namespaces.as_deref(),
            Self::Broken(b) => b.namespaces.as_deref(),
            Self::Agent(_) => None,
        }
    }
    /// The server URL (empty for an agent destination: the server cannot reach it).
    pub fn server(&self) -> &str {
        match self {
            Self::Ready(d) => &d.server,
            Self::Broken(b) => &b.server,
            Self::Agent(_) => "",
        }
    }
    /// What a person should know before trusting this destination (shown by `doctor` and
    /// `GET /v1/destinations`).
    pub fn warnings(&self) -> Vec<String> {
        match self {
            Self::Ready(d) if d.insecure => vec![INSECURE_WARNING.to_string()],
            _ => Vec::new(),
        }
    }
    /// The source.
    pub fn source(&self) -> &Source {
        match self {
            Self::Ready(d) => &d.source,
            Self::Broken(b) => &b.source,
            Self::Agent(a) => &a.source,
        }
    }
}

struct Slot {
    entry: Entry,
    fingerprint: u64,
}

/// All known destinations, updated live by the sources.
pub struct Registry {
    slots: RwLock<BTreeMap<String, Slot>>,
    settings: EngineSettings,
    hints: Hints,
    version: watch::Sender<u64>,
    sources_synced: watch::Sender<bool>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("names", &self.names())
            .finish_non_exhaustive()
    }
}

impl Registry {
    /// An empty registry; `live_sources`: a live source (Argo CD) will call
    /// [`Registry::mark_synced`] after its first sync.
    pub fn new(settings: EngineSettings, live_sources: bool) -> Self {
        Self {
            slots: RwLock::new(BTreeMap::new()),
            settings,
            hints: Hints::new(),
            version: watch::channel(0).0,
            sources_synced: watch::channel(!live_sources).0,
        }
    }

    /// The resume hints its destinations' Job caches emit (`crate::hints`).
    pub fn hints(&self) -> &Hints {
        &self.hints
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<Entry> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.get(name).map(|s| s.entry.clone())
    }

    /// Every entry, by name.
    pub fn entries(&self) -> Vec<Entry> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.values().map(|s| s.entry.clone()).collect()
    }

    /// Every name.
    pub fn names(&self) -> Vec<String> {
        let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
        slots.keys().cloned().collect()
    }

    /// Entries whose labels match `selector`.
    pub fn matching(&self, selector: &Selector) -> Vec<Entry> {
        self.entries()
            .into_iter()
            .filter(|e| selector.matches(e.labels()))
            .collect()
    }

    /// Entries with API server `server`, by precedence: a configured destination before an
    /// Argo CD cluster Secret for the same server (#27: a Secret, which another team may write,
    /// never takes an Application's cluster from the destination the platform team configured).
    pub fn by_server(&self, server: &str) -> Vec<Entry> {
        let server = server.trim_end_matches('/');
        let mut found: Vec<Entry> = self
            .entries()
            .into_iter()
            .filter(|e| e.server() == server)
            .collect();
        found.sort_by_key(|e| e.source().priority());
        found
    }

    /// Sum of all destinations' API requests (watches included).
    pub fn api_requests(&self) -> u64 {
        self.entries()
            .iter()
            .map(|e| match e {
                Entry::Ready(d) => d.api_requests(),
                Entry::Broken(_) | Entry::Agent(_) => 0,
            })
            .sum()
    }

    /// Registers `spec` unless a source with precedence holds the name; replaces an entry of the
    /// same source whose fingerprint changed. Returns whether the registry changed.
    pub fn insert(&self, mut spec: DestinationSpec) -> bool {
        spec.server = spec.server.trim_end_matches('/').to_string();
        if let Err(e) = check_destination_name(&spec.name) {
            tracing::warn!(source = %spec.source, error = %e, "destination ignored: bad name");
            return false;
        }
        {
            let slots = self.slots.read().unwrap_or_else(|e| e.into_inner());
            if let Some(slot) = slots.get(&spec.name) {
                let existing = slot.entry.source();
                if existing.priority() < spec.source.priority() {
                    tracing::warn!(destination = %spec.name, kept = %existing, ignored = %spec.source,
                                   "two sources define this destination; keeping the one with precedence (a configured destination, then in-cluster, then Argo CD cluster Secrets)");
                    return false;
                }
                if *existing == spec.source && slot.fingerprint == spec.fingerprint {
                    return false;
                }
                if *existing != spec.source {
                    tracing::warn!(destination = %spec.name, replaced = %existing, by = %spec.source,
                                   "two sources define this destination");
                }
            }
        }
        let name = spec.name.clone();
        let fingerprint = spec.fingerprint;
        let entry = match &spec.config {
            Ok(config) => {
                match Destination::start(&spec, config.clone(), &self.settings, &self.hints) {
                    Ok(d) => Entry::Ready(Arc::new(d)),
                    Err(e) => Entry::Broken(Arc::new(broken(&spec, &e))),
                }
            }
            Err(e) => Entry::Broken(Arc::new(broken(&spec, e))),
        };
        if let Entry::Broken(b) = &entry {
            tracing::error!(destination = %b.name, source = %b.source, error = %b.error,
                            "destination unusable");
        }
        let old = {
            let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
            slots.insert(name, Slot { entry, fingerprint })
        };
        // Dropping the old destination (outside the lock) stops its watches.
        drop(old);
        self.version.send_modify(|v| *v += 1);
        true
    }

    /// Registers an agent destination (config: before any other source, so nothing shadows it).
    pub fn insert_agent(&self, agent: AgentDestination) {
        let name = agent.name.clone();
        tracing::info!(destination = %name, source = %agent.source, namespace = %agent.namespace,
                       "agent destination registered");
        let old = {
            let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
            slots.insert(
                name,
                Slot {
                    entry: Entry::Agent(Arc::new(agent)),
                    fingerprint: 0,
                },
            )
        };
        drop(old);
        self.version.send_modify(|v| *v += 1);
    }

    /// Removes `name` if it still comes from `source`.
    pub fn remove(&self, name: &str, source: &Source) -> bool {
        let old = {
            let mut slots = self.slots.write().unwrap_or_else(|e| e.into_inner());
            match slots.get(name) {
                Some(slot) if slot.entry.source() == source => slots.remove(name),
                _ => None,
            }
        };
        let removed = old.is_some();
        if removed {
            tracing::info!(destination = name, %source, "destination removed");
            self.version.send_modify(|v| *v += 1);
        }
        removed
    }

    /// Called by a live source after its first full sync.
    pub fn mark_synced(&self) {
        self.sources_synced.send_replace(true);
    }

    /// Waits up to `timeout` until live sources did their first sync; returns whether they did.
    pub async fn wait_sources(&self, timeout: Duration) -> bool {
        let mut rx = self.sources_synced.subscribe();
        let ok = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|s| *s)).await,
            Ok(Ok(_))
        );
        ok
    }

    /// Waits up to `timeout` for an entry called `name` that `accept` accepts.
    pub async fn wait_for(
        &self,
        name: &str,
        timeout: Duration,
        accept: impl Fn(&Entry) -> bool,
    ) -> Option<Entry> {
        let mut rx = self.version.subscribe();
        let wait = async {
            loop {
                if let Some(e) = self.get(name).filter(|e| accept(e)) {
                    return e;
                }
                if rx.changed().await.is_err() {
                    // The registry is gone; nothing will change any more.
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.ok()
    }

    /// Waits up to `timeout` for every usable destination's caches; returns the names that are
    /// not synced.
    pub async fn wait_synced(&self, timeout: Duration) -> Vec<String> {
        let waits = self.entries().into_iter().filter_map(|e| match e {
            Entry::Ready(d) => Some(async move {
                let ok = d.wait_synced(timeout).await;
                (!ok).then(|| d.name.clone())
            }),
            Entry::Broken(_) | Entry::Agent(_) => None,
        });
        futures::future::join_all(waits)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

fn broken(spec: &DestinationSpec, error: &dyn std::error::Error) -> Broken {
    Broken {
        name: spec.name.clone(),
        labels: spec.labels.clone(),
        namespace: spec.namespace.clone(),
        namespaces: spec.namespaces.clone(),
        server: spec.server.clone(),
        source: spec.source.clone(),
        // The message alone: it already names the cause, and it is what users see.
        error: error.to_string(),
    }
}

/// The spec of `destinations[index]` of the config file.
pub async fn spec_from_config(index: usize, d: &DestinationConfig) -> DestinationSpec {
    let config = client::config_for(&d.access, &d.name)
        .await
        .map_err(SpecError::from);
    let server = config
        .as_ref()
        .map(|c| c.cluster_url.to_string().trim_end_matches('/').to_string())
        .unwrap_or_default();
    // Limited to namespaces: the first is the default (the config checked that an explicit
    // `namespace` is one of them).
    let first = d.namespaces.as_ref().and_then(|n| n.first()).cloned();
    let namespace = d
        .namespace
        .clone()
        .or(first)
        .or_else(|| config.as_ref().ok().map(|c| c.default_namespace.clone()))
        .unwrap_or_else(|| "default".into());
    DestinationSpec {
        name: d.name.clone(),
        labels: d.labels.clone(),
        namespace,
        namespaces: d.namespaces.clone(),
        server,
        source: Source::Config { index },
        fingerprint: 0,
        config,
        follows: Some(d.access.clone()),
    }
}

/// One spec per (matching) context of a kubeconfig. `Err` when the file cannot be read.
pub async fn specs_from_kubeconfig(
    k: &KubeconfigContexts,
) -> Result<Vec<DestinationSpec>, AccessError> {
    let (kubeconfig, shown) = client::read_kubeconfig(k.path.as_deref())?;
    let mut specs = Vec::new();
    for ctx in &kubeconfig.contexts {
        let name = ctx.name.clone();
        if !k.contexts.is_empty() && !k.contexts.iter().any(|g| glob_match(g, &name)) {
            continue;
        }
        if let Err(e) = check_destination_name(&name) {
            tracing::warn!(kubeconfig = %shown, context = %name, error = %e,
                           "kubeconfig context skipped: not usable as a destination name");
            continue;
        }
        let config = client::config_from_kubeconfig(kubeconfig.clone(), Some(&name))
            .await
            .map_err(|e| {
                SpecError::from(AccessError::InKubeconfig {
                    path: shown.clone(),
                    source: Box::new(e),
                })
            });
        let server = config
            .as_ref()
            .map(|c| c.cluster_url.to_string().trim_end_matches('/').to_string())
            .unwrap_or_default();
        let namespace = ctx
            .context
            .as_ref()
            .and_then(|c| c.namespace.clone())
            .or_else(|| k.namespace.clone())
            .unwrap_or_else(|| "default".into());
        specs.push(DestinationSpec {
            name: name.clone(),
            labels: k.labels.clone(),
            namespace,
            namespaces: None,
            server,
            source: Source::Kubeconfig {
                path: shown.clone(),
                context: name.clone(),
            },
            fingerprint: 0,
            config,
            follows: Some(Access::Kubeconfig {
                path: k.path.clone(),
                context: Some(name),
            }),
        });
    }
    Ok(specs)
}

#[cfg(test)]
mod tests;
