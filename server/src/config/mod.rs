//! The server configuration file (YAML): destinations and their sources, policy, engine settings.
//!
//! Parsed once into typed structs and validated in one pass; any mistake yields one
//! [`ConfigFileError`] that names the file and the field (`destinations[1].server: …`). Without
//! a file, [`ServerConfig::embedded_default`] makes every kubeconfig context a destination.
//! Every key is documented in [`reference()`], rendered as docs/configuration.md (`make docs`).
//!
//! This module holds the typed configuration and its entry points ([`ServerConfig::load`],
//! [`ServerConfig::parse`], [`ServerConfig::embedded_default`]); `raw` holds the file format as
//! written and the validation that turns it into these types; `reference` the documentation of
//! every key; `schema` the JSON Schema of the file (the chart's values.schema.json `config`).
//!
//! ```yaml
//! controlPlane: {kubeconfig: /etc/cp.kubeconfig, context: cp}  # default: in-cluster, else $KUBECONFIG
//! destinations:
//! - name: prod-eu
//!   labels: {env: prod}
//!   namespace: verification          # default namespace of Jobs there
//!   kubeconfig: /etc/prod-eu.kubeconfig
//!   context: prod-eu
//! - name: edge-1
//!   server: https://10.0.0.1:6443
//!   tokenFile: /var/run/secrets/edge-1/token   # or token, certFile+keyFile, certData+keyData
//!   caFile: /etc/edge-1/ca.crt                 # or caData (PEM), or insecure: true
//! kubeconfigContexts: {path: ~/.kube/config, contexts: ["kind-*"]}
//! argocd: {namespace: argocd, inCluster: true, defaultNamespace: default}  # or a list:
//! # argocd:                        # one item per Argo CD instance; a Stage's spec.shard picks one
//! # - {name: main}                 # the control plane; no `shards`: the Stages without spec.shard
//! # - {name: eu, kubeconfig: {path: /etc/eu.kubeconfig}, shards: [eu]}   # destination `eu`
//! # - {name: us, destination: us-mgmt, namespace: gitops, shards: [us]}
//! policy:                          # none: nothing is dispatched; `{allowAll: true}`: anything
//!   rules:
//!   - projects: ["team-a", "team-b-*"]
//!     destinations: ["prod-*"]
//!     namespaces: ["verification"]
//!     podSecurity: restricted        # | baseline | privileged
//!     serviceAccounts: [default]
//!     automountServiceAccountToken: false
//!     secrets: ["team-a-*"]          # and configMaps, persistentVolumeClaims, csiDrivers,
//!     imagePullSecrets: [regcred]    #   imagePullSecrets: what the pods may name (default none)
//!     scheduling: [tolerations]      # pod fields that place the pods (default none)
//!     resources: {default: {cpu: 100m, memory: 128Mi}, max: {cpu: "2", memory: 2Gi}}
//!     jobLimits: {parallelism: 1, completions: 1, backoffLimit: 6}
//!     podLabels: ["app.kubernetes.io/*"]   # pod template keys (default none)
//!   callers:                         # TokenReview users bound to projects (no entry: refused)
//!   - {subject: "system:serviceaccount:argo-rollouts:argo-rollouts", projects: ["*"]}
//!   - {subject: "system:serviceaccount:team-a:*", projects: ["team-a"]}
//! engine: {connectTimeout: 5s, requestTimeout: 20s}
//! confirmRuns: true                  # default with controlPlane: only runs that exist are served
//! jobs: {ttlAfterFinished: 1h, retention: 24h}   # Job TTL unless the template sets one; sweep
//! ui:                                # the log API and pages for people
//!   externalURL: https://dispatch.example.com   # measurement messages end with the run page's URL
//!   people:
//!     tokenReview: true              # default with controlPlane: people's Kubernetes tokens
//!     proxy: {trustedAddresses: [10.0.0.0/8], userHeader: X-Forwarded-User, groupsHeader: X-Forwarded-Groups}
//! agents:                            # destinations reached through `rollouts-dispatch agent`
//!   store: kubernetes                # memory (default, one replica) | kubernetes (DispatchJobs)
//!   namespace: rollouts-dispatch     # of the DispatchJobs; default $POD_NAMESPACE
//!   offlineAfter: 60s
//!   destinations:
//!   - {name: edge-2, labels: {env: edge}, namespace: verification}
//! budgets:                           # what one project may hold at once per replica (429 beyond)
//!   measurementCallsPerProject: 32   # and applicationCallsPerProject, logStreamsPerProject,
//!   logRequestsPerProject: 32        #   pendingLogRequestsPerDestination (see `budgets`)
//! ```

pub mod budgets;
mod raw;
mod reference;
mod schema;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

pub use budgets::BudgetsConfig;
use raw::RawConfig;
pub use raw::{
    check_destination_name, check_namespaces, InvalidName, InvalidNamespace, InvalidNamespaces,
};
pub use reference::{reference, reference_markdown, FieldDefault, FieldDoc};
pub use schema::config_schema;

/// A configuration that cannot be used: one message naming the file and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {origin}: {message}")]
pub struct ConfigFileError {
    /// `config file /path` or `embedded default configuration`
    pub origin: String,
    /// the field and what is wrong with it
    pub message: String,
}

/// A secret string (token, key) that never appears in `Debug` output.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// where it came from, for messages: `config file /etc/x.yaml`
    pub origin: String,
    /// how to reach the control plane (Kargo Stages, Argo CD Applications and cluster Secrets)
    pub control_plane: Access,
    /// destinations from the file
    pub destinations: Vec<DestinationConfig>,
    /// every context of a kubeconfig as a destination
    pub kubeconfig_contexts: Option<KubeconfigContexts>,
    /// the Argo CD instances: their cluster Secrets as destinations, watched live, and the
    /// Applications `destination: stage` reads (empty: none)
    pub argocd: Vec<ArgoCdConfig>,
    /// `None`: nothing is dispatched (deny by default; a warning is logged at start)
    pub policy: Option<PolicyConfig>,
    /// timeouts
    pub engine: EngineSettings,
    /// destinations served by agents, and where their work is kept
    pub agents: Option<AgentsConfig>,
    /// whether measurement requests are checked against the control plane's AnalysisRuns
    pub confirm_runs: ConfirmRuns,
    /// how long our Jobs stay once done
    pub jobs: JobsSettings,
    /// globs over the destinations whose Argo CD Applications the API may sync
    /// (`applicationSync.destinations`; empty: none, the sync trigger answers 403)
    pub application_sync: Vec<String>,
    /// the log API and pages for people (`ui:`)
    pub ui: UiConfig,
    /// what one project (or agent destination) may hold at once (`budgets:`)
    pub budgets: BudgetsConfig,
}

/// The log API and pages for people (`ui:`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UiConfig {
    /// where people reach the pages (`ui.externalURL`, absolute http(s), no query, no trailing
    /// `/`): each measurement message ends with the run page's address under it
    pub external_url: Option<String>,
    /// who people are
    pub people: PeopleConfig,
    /// how long a login to the pages lasts, and how many may be open
    pub sessions: SessionSettings,
}

/// The default of `ui.sessionLifetime`: a working day.
pub const DEFAULT_SESSION_LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// The default of `ui.maxSessions`.
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;

/// The server-side sessions of the pages (`ui.sessionLifetime`, `ui.maxSessions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionSettings {
    /// how long a session lasts after login (then the person logs in again)
    pub lifetime: Duration,
    /// the most sessions held at once; a login beyond ends the one that expires first
    pub max: usize,
}

impl Default for SessionSettings {
    fn default() -> Self {
        Self {
            lifetime: DEFAULT_SESSION_LIFETIME,
            max: DEFAULT_MAX_SESSIONS,
        }
    }
}

/// How people of the control plane are recognised (`ui.people`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeopleConfig {
    /// accept people's Kubernetes bearer tokens, reviewed by the control plane's apiserver
    /// (`ui.people.tokenReview`; default true when `controlPlane` is set)
    pub token_review: bool,
    /// an authenticating proxy (oauth2-proxy) whose user and group headers are trusted
    pub proxy: Option<ProxyConfig>,
}

/// An authenticating proxy in front of the server (`ui.people.proxy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// the proxy's addresses: headers from any other peer are ignored (never empty)
    pub trusted_addresses: Vec<AddressRange>,
    /// the header naming the user (default `X-Forwarded-User`), lowercase
    pub user_header: String,
    /// the header listing the user's groups, comma-separated (default `X-Forwarded-Groups`),
    /// lowercase
    pub groups_header: String,
}

/// An IP address or a CIDR block (`10.0.0.0/8`, `fd00::/8`, `127.0.0.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    /// the network address (host bits cleared)
    pub network: std::net::IpAddr,
    /// the prefix length (32 or 128 for one address)
    pub prefix: u8,
}

impl AddressRange {
    /// Parses `a.b.c.d`, `a.b.c.d/n`, an IPv6 address or `v6/n`; `None` when it is neither.
    pub fn parse(s: &str) -> Option<Self> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p.parse::<u8>().ok()?)),
            None => (s, None),
        };
        let network: std::net::IpAddr = addr.parse().ok()?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = prefix.unwrap_or(max);
        if prefix > max {
            return None;
        }
        let range = Self { network, prefix };
        Some(Self {
            network: range.masked(network),
            prefix,
        })
    }

    /// `ip` with the bits past the prefix cleared.
    fn masked(&self, ip: std::net::IpAddr) -> std::net::IpAddr {
        use std::net::IpAddr;
        match ip {
            IpAddr::V4(v4) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(v4) & mask).into())
            }
            IpAddr::V6(v6) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(v6) & mask).into())
            }
        }
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 peer counts as its IPv4 address).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, std::net::IpAddr::V4),
            v4 => v4,
        };
        ip.is_ipv4() == self.network.is_ipv4() && self.masked(ip) == self.network
    }
}

/// Whether the server confirms, on every measurement request, that the run it names exists on
/// the control plane with that uid and has that metric with our plugin (`confirmRuns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmRuns {
    /// from a watch of the AnalysisRuns of `controlPlane` (the default when it is given)
    On,
    /// `confirmRuns: false`
    Off,
    /// no `controlPlane` in the file: which cluster holds the runs is not known
    NoControlPlane,
}

impl ConfirmRuns {
    /// Why runs are not confirmed (`None` when they are): logged at start, shown by `doctor`.
    pub fn not_confirmed_because(self) -> Option<&'static str> {
        match self {
            Self::On => None,
            Self::Off => Some("`confirmRuns: false` in the config"),
            Self::NoControlPlane => Some(
                "the config has no `controlPlane`, so the server does not know which cluster \
                 holds the AnalysisRuns; add `controlPlane` (`{}` for the in-cluster service \
                 account) to confirm them",
            ),
        }
    }
}

/// How long our Jobs stay once done (`jobs:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobsSettings {
    /// `spec.ttlSecondsAfterFinished` of every Job whose template sets none: the destination's
    /// TTL controller deletes the Job (and its Pods) this long after it finished. Long enough
    /// that the verdict is read first: Argo resumes a measurement within seconds of its
    /// `resumeAt`, so an hour leaves room for a controller or server outage.
    pub ttl_after_finished: Duration,
    /// the orphan sweep deletes the Jobs (and agent records) of AnalysisRuns that completed
    /// longer ago than this; agent records whose final state was reported longer ago than this
    /// (and than the longest deadline, `Engine::record_retention`) are expired
    pub retention: Duration,
}

impl Default for JobsSettings {
    fn default() -> Self {
        Self {
            ttl_after_finished: Duration::from_secs(3600),
            retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// Where the records of agent destinations live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// in the server process: one replica only, forgotten on restart (agents resync)
    Memory,
    /// `DispatchJob` resources on the control plane: any number of replicas
    Kubernetes,
}

/// Destinations served by `rollouts-dispatch agent`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentsConfig {
    /// where the work records live
    pub store: StoreKind,
    /// namespace of the `DispatchJob` resources (`None`: `$POD_NAMESPACE`, else
    /// `rollouts-dispatch`)
    pub namespace: Option<String>,
    /// an agent not heard from for this long is shown as not connected
    pub offline_after: Duration,
    /// the agent destinations
    pub destinations: Vec<AgentDestinationConfig>,
}

/// One agent destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDestinationConfig {
    /// its name in `destination:` and in the agent's token
    pub name: String,
    /// labels for `destinationSelector`
    pub labels: BTreeMap<String, String>,
    /// default namespace of Jobs there
    pub namespace: String,
}

/// How to reach a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// in-cluster service account, else `$KUBECONFIG` / `~/.kube/config`
    Infer,
    /// a kubeconfig file (`None`: the default one) and context (`None`: its current context)
    Kubeconfig {
        /// the file
        path: Option<PathBuf>,
        /// the context
        context: Option<String>,
    },
    /// a server URL and credentials
    Direct(Box<DirectAccess>),
}

/// A server URL and credentials.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirectAccess {
    /// `https://host:port`
    pub server: String,
    /// bearer token
    pub token: Option<SecretValue>,
    /// file with a bearer token, re-read when it changes (projected tokens)
    pub token_file: Option<PathBuf>,
    /// CA certificate(s), PEM
    pub ca_data: Option<String>,
    /// CA file
    pub ca_file: Option<PathBuf>,
    /// client certificate, PEM
    pub cert_data: Option<String>,
    /// client key, PEM
    pub key_data: Option<SecretValue>,
    /// client certificate file
    pub cert_file: Option<PathBuf>,
    /// client key file
    pub key_file: Option<PathBuf>,
    /// skip server certificate verification
    pub insecure: bool,
    /// server name for TLS verification
    pub tls_server_name: Option<String>,
}

/// A destination from the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationConfig {
    /// its name in `destination:`
    pub name: String,
    /// labels for `destinationSelector`
    pub labels: BTreeMap<String, String>,
    /// the default namespace of Jobs there (`None`: the first of `namespaces`, else the
    /// kubeconfig context's, else `default`)
    pub namespace: Option<String>,
    /// the only namespaces Jobs may run in there; its caches watch each of them instead of the
    /// whole cluster (`None`: every namespace, watched cluster-wide). Never empty; holds
    /// `namespace` when that is given.
    pub namespaces: Option<Vec<String>>,
    /// how to reach it
    pub access: Access,
}

/// Every context of a kubeconfig as a destination named after the context.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KubeconfigContexts {
    /// the file (`None`: `$KUBECONFIG`, else `~/.kube/config`)
    pub path: Option<PathBuf>,
    /// globs over context names (empty: all)
    pub contexts: Vec<String>,
    /// labels of every such destination
    pub labels: BTreeMap<String, String>,
    /// default namespace when the context has none
    pub namespace: Option<String>,
}

/// The name of the Argo CD instance of the single-map form `argocd: {…}`.
pub const DEFAULT_ARGOCD_INSTANCE: &str = "argocd";

/// One Argo CD instance (`argocd:` one map, or `argocd[]`): its cluster Secrets become
/// destinations, watched live on the cluster it runs on, and `destination: stage` reads the
/// Applications of the Stages of its `shards` there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgoCdConfig {
    /// unique among the instances (`argocd` for the single-map form); with `kubeconfig`, also
    /// the name of the destination that is the cluster it runs on
    pub name: String,
    /// the cluster it runs on
    pub location: ArgoCdLocation,
    /// the Kargo shards whose Stages promote through it
    pub shards: Shards,
    /// the Argo CD namespace (default `argocd`)
    pub namespace: String,
    /// the cluster it runs on is a destination (default true, like Argo CD's
    /// `cluster.inClusterEnabled`): `in-cluster` on the control plane, the instance's name with
    /// `kubeconfig`; `https://kubernetes.default.svc` and `in-cluster` in Applications map to it
    pub in_cluster: bool,
    /// the only namespaces Jobs may run in on that destination, each watched on its own
    /// instead of the whole cluster (`None`: every namespace)
    pub in_cluster_namespaces: Option<Vec<String>>,
    /// default namespace of Jobs on these destinations (default `default`; a Secret may set
    /// annotation `rollouts-dispatch.io/namespace`)
    pub default_namespace: String,
    /// the commands a Secret's `execProviderConfig` may run inside the server (exact match);
    /// empty: a Secret with `execProviderConfig` is refused
    pub exec_providers: Vec<String>,
}

/// The cluster an Argo CD instance runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArgoCdLocation {
    /// the control plane (neither `kubeconfig` nor `destination`)
    ControlPlane,
    /// `kubeconfig: {path, context}`
    Kubeconfig {
        /// the file (`None`: `$KUBECONFIG`, else `~/.kube/config`)
        path: Option<PathBuf>,
        /// the context (`None`: the file's current context)
        context: Option<String>,
    },
    /// `destination: NAME`: a direct destination of `destinations[]` or `kubeconfigContexts`
    Destination(String),
}

/// The Kargo shards (a Stage's `spec.shard`) an Argo CD instance serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shards {
    /// every Stage, whatever its shard: the single-map form without `shards`
    Every,
    /// these shards; `""` stands for the Stages without `spec.shard` (what a list item
    /// without `shards` serves)
    Only(std::collections::BTreeSet<String>),
}

impl Shards {
    /// Whether a Stage with `spec.shard` = `shard` (`""`: none) promotes through this instance.
    pub fn serves(&self, shard: &str) -> bool {
        match self {
            Self::Every => true,
            Self::Only(set) => set.contains(shard),
        }
    }
}

/// Which projects may use which destinations and namespaces. Without rules (and without
/// `allowAll`) nothing is dispatched: the policy denies by default.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyConfig {
    /// any matching rule allows
    pub rules: Vec<PolicyRule>,
    /// which projects TokenReview callers may act for (`policy.callers`)
    pub callers: Vec<CallerBinding>,
    /// `allowAll: true`: every project may use every destination and namespace, with the default
    /// pod security profile (never together with `rules`)
    pub allow_all: bool,
}

/// `policy.callers[]`: binds the Kubernetes users (TokenReview identities) matching `subject`
/// to `projects`. The first matching entry applies; a user no entry matches may act for no
/// project and is refused (callers fail closed, #27): the Rollouts controller, which serves
/// every namespace, needs an entry with `projects: ["*"]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerBinding {
    /// glob over usernames, e.g. `system:serviceaccount:team-a:*`
    pub subject: String,
    /// globs over Kargo projects (AnalysisRun namespaces)
    pub projects: Vec<String>,
}

/// One allow rule; `projects`, `destinations` and `namespaces` hold globs (`*`, `?`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// Kargo projects (AnalysisRun namespaces)
    pub projects: Vec<String>,
    /// destination names
    pub destinations: Vec<String>,
    /// namespaces on the destination (required: a rule without them is a config error; `"*"`
    /// must be written, and is warned about)
    pub namespaces: Vec<String>,
    /// namespaces on the destination whose Argo CD Applications the projects may read and sync
    /// (`applicationNamespaces`; default none: `namespaces` never allows Applications)
    pub application_namespaces: Vec<String>,
    /// the Pod Security Standards level of the Jobs (default `restricted`)
    pub pod_security: crate::podsecurity::Level,
    /// service accounts the Jobs' pods may run as, exact names (default `["default"]`)
    pub service_accounts: Vec<String>,
    /// whether the Jobs' pods may mount an API token (default false)
    pub automount_service_account_token: bool,
    /// what the Jobs' pods may reference, set and use (#27; default: nothing referenced, the
    /// built-in resources and caps)
    pub allow: crate::podsecurity::Allowlists,
    /// the user and group of a restricted pod whose template names none (`defaultRunAsUser`)
    pub default_user: crate::podsecurity::DefaultUser,
}

/// Timeouts of the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSettings {
    /// TCP+TLS connect timeout to a destination API server
    pub connect_timeout: Duration,
    /// bound on one API call (create, get, delete, list)
    pub request_timeout: Duration,
    /// how long a status lookup waits for a destination's first cache sync before it asks the
    /// API server directly
    pub cache_wait: Duration,
    /// bound on reading a log tail from the `pods/log` API
    pub log_timeout: Duration,
    /// a measurement's deadline when its block sets no `activeDeadline`
    pub measurement_deadline: Duration,
    /// added to every measurement's deadline before the server gives up on it, so that the
    /// destination's own `activeDeadlineSeconds` (and its Failed verdict) comes first
    pub deadline_grace: Duration,
    /// the longest deadline a block may ask for (`activeDeadline`): a longer one is refused at
    /// ensure, so that no tenant holds its Stage for days; also bounds how long the records of
    /// finished measurements must be kept (`engine::expiry`)
    pub max_measurement_deadline: Duration,
    /// how long a Job's container may fail to start before the measurement is an Error
    pub start_grace: Duration,
    /// how long a Job's pod may stay unschedulable before the measurement is an Error
    pub scheduling_grace: Duration,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(20),
            cache_wait: Duration::from_secs(2),
            log_timeout: Duration::from_secs(5),
            measurement_deadline: Duration::from_secs(30 * 60),
            deadline_grace: Duration::from_secs(2 * 60),
            max_measurement_deadline: Duration::from_secs(6 * 3600),
            start_grace: Duration::from_secs(30),
            scheduling_grace: Duration::from_secs(60),
        }
    }
}

impl ServerConfig {
    /// Without a file: every context of the default kubeconfig is a destination; no policy, so
    /// nothing is dispatched until a file gives one.
    pub fn embedded_default() -> Self {
        Self {
            origin: "embedded default configuration".into(),
            control_plane: Access::Infer,
            destinations: Vec::new(),
            kubeconfig_contexts: Some(KubeconfigContexts::default()),
            argocd: Vec::new(),
            policy: None,
            engine: EngineSettings::default(),
            agents: None,
            confirm_runs: ConfirmRuns::NoControlPlane,
            jobs: JobsSettings::default(),
            application_sync: Vec::new(),
            ui: UiConfig::default(),
            budgets: BudgetsConfig::default(),
        }
    }

    /// Reads and validates the file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let origin = format!("config file {}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| ConfigFileError {
            origin: origin.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, &origin)
    }

    /// Parses and validates YAML `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigFileError> {
        let err = |message: String| ConfigFileError {
            origin: origin.to_string(),
            message,
        };
        let raw: RawConfig = if text.trim().is_empty() {
            RawConfig::default()
        } else {
            serde_saphyr::from_str(text).map_err(|e| {
                let text = e.to_string();
                err(text.strip_prefix("error: ").unwrap_or(&text).to_string())
            })?
        };
        raw.validate(origin).map_err(|e| err(e.to_string()))
    }
}

#[cfg(test)]
mod tests;
