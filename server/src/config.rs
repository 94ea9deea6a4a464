//! The server configuration file (YAML): destinations and their sources, policy, engine settings.
//!
//! Parsed once into typed structs and validated in one pass; any mistake yields one
//! [`ConfigFileError`] that names the file and the field (`destinations[1].server: …`). Without
//! a file, [`ServerConfig::embedded_default`] makes every kubeconfig context a destination.
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
//! argocd: {namespace: argocd, inCluster: true, defaultNamespace: default}
//! policy:
//!   rules:
//!   - projects: ["team-a", "team-b-*"]
//!     destinations: ["prod-*"]
//!     namespaces: ["verification"]
//! engine: {connectTimeout: 5s, requestTimeout: 20s}
//! agents:                            # destinations reached through `rollouts-dispatch agent`
//!   store: kubernetes                # memory (default, one replica) | kubernetes (DispatchJobs)
//!   namespace: rollouts-dispatch     # of the DispatchJobs; default $POD_NAMESPACE
//!   offlineAfter: 60s
//!   destinations:
//!   - {name: edge-2, labels: {env: edge}, namespace: verification}
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dispatch_metric_provider::config::parse_go_duration;
use serde::Deserialize;

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
    /// Argo CD cluster Secrets on the control plane as destinations, watched live
    pub argocd: Option<ArgoCdConfig>,
    /// `None`: every project may use every destination (a warning is logged at start)
    pub policy: Option<PolicyConfig>,
    /// timeouts
    pub engine: EngineSettings,
    /// destinations served by agents, and where their work is kept
    pub agents: Option<AgentsConfig>,
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
    /// the default namespace of Jobs there (`None`: the kubeconfig context's, else `default`)
    pub namespace: Option<String>,
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

/// Argo CD cluster Secrets on the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgoCdConfig {
    /// the Argo CD namespace (default `argocd`)
    pub namespace: String,
    /// the implicit `in-cluster` destination, the control plane itself (default true, like
    /// Argo CD's `cluster.inClusterEnabled`)
    pub in_cluster: bool,
    /// default namespace of Jobs on these destinations (default `default`; a Secret may set
    /// annotation `rollouts-dispatch.io/namespace`)
    pub default_namespace: String,
}

/// Which projects may use which destinations and namespaces.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PolicyConfig {
    /// any matching rule allows
    pub rules: Vec<PolicyRule>,
}

/// One allow rule; every list holds globs (`*`, `?`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRule {
    /// Kargo projects (AnalysisRun namespaces)
    pub projects: Vec<String>,
    /// destination names
    pub destinations: Vec<String>,
    /// namespaces on the destination (default `["*"]`)
    pub namespaces: Vec<String>,
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
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(20),
            cache_wait: Duration::from_secs(2),
            log_timeout: Duration::from_secs(5),
        }
    }
}

impl ServerConfig {
    /// Without a file: every context of the default kubeconfig is a destination; no policy.
    pub fn embedded_default() -> Self {
        Self {
            origin: "embedded default configuration".into(),
            control_plane: Access::Infer,
            destinations: Vec::new(),
            kubeconfig_contexts: Some(KubeconfigContexts::default()),
            argocd: None,
            policy: None,
            engine: EngineSettings::default(),
            agents: None,
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
        raw.validate(origin).map_err(err)
    }
}

// === raw file format ===

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawConfig {
    control_plane: Option<RawAccess>,
    #[serde(default)]
    destinations: Vec<RawDestination>,
    kubeconfig_contexts: Option<RawKubeconfigContexts>,
    argocd: Option<RawArgoCd>,
    policy: Option<RawPolicy>,
    engine: Option<RawEngine>,
    agents: Option<RawAgents>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAgents {
    store: Option<String>,
    namespace: Option<String>,
    offline_after: Option<String>,
    #[serde(default)]
    destinations: Vec<RawAgentDestination>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAgentDestination {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    namespace: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawAccess {
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    server: Option<String>,
    token: Option<SecretValue>,
    token_file: Option<PathBuf>,
    ca_data: Option<String>,
    ca_file: Option<PathBuf>,
    cert_data: Option<String>,
    key_data: Option<SecretValue>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure: bool,
    tls_server_name: Option<String>,
}

// `flatten` cannot be combined with `deny_unknown_fields`, so the access fields are repeated.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDestination {
    name: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    namespace: Option<String>,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    server: Option<String>,
    token: Option<SecretValue>,
    token_file: Option<PathBuf>,
    ca_data: Option<String>,
    ca_file: Option<PathBuf>,
    cert_data: Option<String>,
    key_data: Option<SecretValue>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure: bool,
    tls_server_name: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawKubeconfigContexts {
    path: Option<PathBuf>,
    #[serde(default)]
    contexts: Vec<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawArgoCd {
    namespace: Option<String>,
    in_cluster: Option<bool>,
    default_namespace: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    projects: Vec<String>,
    #[serde(default)]
    destinations: Vec<String>,
    namespaces: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawEngine {
    connect_timeout: Option<String>,
    request_timeout: Option<String>,
    cache_wait: Option<String>,
    log_timeout: Option<String>,
}

impl RawDestination {
    fn split(self) -> (String, BTreeMap<String, String>, Option<String>, RawAccess) {
        let access = RawAccess {
            kubeconfig: self.kubeconfig,
            context: self.context,
            server: self.server,
            token: self.token,
            token_file: self.token_file,
            ca_data: self.ca_data,
            ca_file: self.ca_file,
            cert_data: self.cert_data,
            key_data: self.key_data,
            cert_file: self.cert_file,
            key_file: self.key_file,
            insecure: self.insecure,
            tls_server_name: self.tls_server_name,
        };
        (self.name, self.labels, self.namespace, access)
    }
}

impl RawConfig {
    fn validate(self, origin: &str) -> Result<ServerConfig, String> {
        let control_plane = match self.control_plane {
            None => Access::Infer,
            Some(a) => a.validate("controlPlane", true)?,
        };
        let mut destinations = Vec::new();
        let mut names = BTreeSet::new();
        for (i, d) in self.destinations.into_iter().enumerate() {
            let at = format!("destinations[{i}]");
            let (name, labels, namespace, access) = d.split();
            check_destination_name(&name).map_err(|e| format!("{at}.name: {e}"))?;
            if !names.insert(name.clone()) {
                return Err(format!(
                    "{at}.name: {name:?} is used twice; names must be unique"
                ));
            }
            check_labels(&labels).map_err(|e| format!("{at}.labels: {e}"))?;
            check_namespace(namespace.as_deref()).map_err(|e| format!("{at}.namespace: {e}"))?;
            let access = access.validate(&at, false)?;
            destinations.push(DestinationConfig {
                name,
                labels,
                namespace,
                access,
            });
        }
        let kubeconfig_contexts = match self.kubeconfig_contexts {
            None => None,
            Some(k) => {
                check_labels(&k.labels).map_err(|e| format!("kubeconfigContexts.labels: {e}"))?;
                check_namespace(k.namespace.as_deref())
                    .map_err(|e| format!("kubeconfigContexts.namespace: {e}"))?;
                if let Some(i) = k.contexts.iter().position(|c| c.trim().is_empty()) {
                    return Err(format!("kubeconfigContexts.contexts[{i}]: empty pattern"));
                }
                Some(KubeconfigContexts {
                    path: k.path,
                    contexts: k.contexts,
                    labels: k.labels,
                    namespace: k.namespace,
                })
            }
        };
        let argocd = match self.argocd {
            None => None,
            Some(a) => {
                let namespace = a.namespace.unwrap_or_else(|| "argocd".into());
                check_namespace(Some(&namespace)).map_err(|e| format!("argocd.namespace: {e}"))?;
                let default_namespace = a.default_namespace.unwrap_or_else(|| "default".into());
                check_namespace(Some(&default_namespace))
                    .map_err(|e| format!("argocd.defaultNamespace: {e}"))?;
                Some(ArgoCdConfig {
                    namespace,
                    in_cluster: a.in_cluster.unwrap_or(true),
                    default_namespace,
                })
            }
        };
        let policy = match self.policy {
            None => None,
            Some(p) => {
                let mut rules = Vec::new();
                for (i, r) in p.rules.into_iter().enumerate() {
                    let at = format!("policy.rules[{i}]");
                    let namespaces = r.namespaces.unwrap_or_else(|| vec!["*".into()]);
                    for (field, list) in [
                        ("projects", &r.projects),
                        ("destinations", &r.destinations),
                        ("namespaces", &namespaces),
                    ] {
                        if list.is_empty() {
                            return Err(format!(
                                "{at}.{field}: empty list; give at least one glob (\"*\" matches all)"
                            ));
                        }
                        if let Some(j) = list.iter().position(|g| g.trim().is_empty()) {
                            return Err(format!("{at}.{field}[{j}]: empty glob"));
                        }
                    }
                    rules.push(PolicyRule {
                        projects: r.projects,
                        destinations: r.destinations,
                        namespaces,
                    });
                }
                Some(PolicyConfig { rules })
            }
        };
        let mut engine = EngineSettings::default();
        if let Some(e) = self.engine {
            for (field, value, slot) in [
                (
                    "connectTimeout",
                    e.connect_timeout,
                    &mut engine.connect_timeout,
                ),
                (
                    "requestTimeout",
                    e.request_timeout,
                    &mut engine.request_timeout,
                ),
                ("cacheWait", e.cache_wait, &mut engine.cache_wait),
                ("logTimeout", e.log_timeout, &mut engine.log_timeout),
            ] {
                if let Some(v) = value {
                    let d = parse_go_duration(&v).map_err(|err| {
                        format!("engine.{field}: {v:?} is not a duration ({err}; e.g. 5s)")
                    })?;
                    if d.is_zero() {
                        return Err(format!("engine.{field}: must be more than 0"));
                    }
                    *slot = d;
                }
            }
        }
        let agents = match self.agents {
            None => None,
            Some(a) => Some(validate_agents(a, &names)?),
        };
        Ok(ServerConfig {
            origin: origin.to_string(),
            control_plane,
            destinations,
            kubeconfig_contexts,
            argocd,
            policy,
            engine,
            agents,
        })
    }
}

impl RawAccess {
    /// `optional`: an empty block means [`Access::Infer`] (control plane) instead of an error.
    fn validate(self, at: &str, optional: bool) -> Result<Access, String> {
        let RawAccess {
            kubeconfig,
            context,
            server,
            token,
            token_file,
            ca_data,
            ca_file,
            cert_data,
            key_data,
            cert_file,
            key_file,
            insecure,
            tls_server_name,
        } = self;
        let direct_fields = [
            ("token", token.is_some()),
            ("tokenFile", token_file.is_some()),
            ("caData", ca_data.is_some()),
            ("caFile", ca_file.is_some()),
            ("certData", cert_data.is_some()),
            ("keyData", key_data.is_some()),
            ("certFile", cert_file.is_some()),
            ("keyFile", key_file.is_some()),
            ("insecure", insecure),
            ("tlsServerName", tls_server_name.is_some()),
        ];
        match server {
            None => {
                if let Some((field, _)) = direct_fields.iter().find(|(_, set)| *set) {
                    return Err(format!(
                        "{at}.{field}: only allowed with `server`; with a kubeconfig the credentials come from the file"
                    ));
                }
                if kubeconfig.is_none() && context.is_none() {
                    return if optional {
                        Ok(Access::Infer)
                    } else {
                        Err(format!(
                            "{at}: say how to reach it: `kubeconfig` (+ `context`) or `server` (+ credentials)"
                        ))
                    };
                }
                Ok(Access::Kubeconfig {
                    path: kubeconfig,
                    context,
                })
            }
            Some(server) => {
                if kubeconfig.is_some() || context.is_some() {
                    return Err(format!(
                        "{at}: `server` and `kubeconfig`/`context` are mutually exclusive; keep one"
                    ));
                }
                let server = server.trim_end_matches('/').to_string();
                let uri: http::Uri = server
                    .parse()
                    .map_err(|e| format!("{at}.server: {server:?} is not a URL ({e})"))?;
                if !matches!(uri.scheme_str(), Some("https" | "http")) || uri.host().is_none() {
                    return Err(format!(
                        "{at}.server: {server:?} must be an https:// URL with a host"
                    ));
                }
                if token.is_some() && token_file.is_some() {
                    return Err(format!(
                        "{at}: `token` and `tokenFile` are mutually exclusive"
                    ));
                }
                if ca_data.is_some() && ca_file.is_some() {
                    return Err(format!(
                        "{at}: `caData` and `caFile` are mutually exclusive"
                    ));
                }
                if let Some(pem) = &ca_data {
                    if !pem.contains("-----BEGIN CERTIFICATE-----") {
                        return Err(format!(
                            "{at}.caData: not a PEM certificate (expected -----BEGIN CERTIFICATE-----)"
                        ));
                    }
                }
                if cert_data.is_some() != key_data.is_some() {
                    return Err(format!("{at}: `certData` and `keyData` go together"));
                }
                if cert_file.is_some() != key_file.is_some() {
                    return Err(format!("{at}: `certFile` and `keyFile` go together"));
                }
                if cert_data.is_some() && cert_file.is_some() {
                    return Err(format!(
                        "{at}: `certData`/`keyData` and `certFile`/`keyFile` are mutually exclusive"
                    ));
                }
                Ok(Access::Direct(Box::new(DirectAccess {
                    server,
                    token,
                    token_file,
                    ca_data,
                    ca_file,
                    cert_data,
                    key_data,
                    cert_file,
                    key_file,
                    insecure,
                    tls_server_name,
                })))
            }
        }
    }
}

fn validate_agents(a: RawAgents, direct: &BTreeSet<String>) -> Result<AgentsConfig, String> {
    let store = match a.store.as_deref() {
        None | Some("memory") => StoreKind::Memory,
        Some("kubernetes") => StoreKind::Kubernetes,
        Some(other) => {
            return Err(format!(
                "agents.store: {other:?} is not a store; use memory (one replica) or kubernetes"
            ))
        }
    };
    check_namespace(a.namespace.as_deref()).map_err(|e| format!("agents.namespace: {e}"))?;
    let offline_after = match a.offline_after {
        None => Duration::from_secs(60),
        Some(v) => {
            let d = parse_go_duration(&v).map_err(|err| {
                format!("agents.offlineAfter: {v:?} is not a duration ({err}; e.g. 60s)")
            })?;
            if d < Duration::from_secs(1) {
                return Err("agents.offlineAfter: must be at least 1s".into());
            }
            d
        }
    };
    let mut names = BTreeSet::new();
    let mut destinations = Vec::new();
    for (i, d) in a.destinations.into_iter().enumerate() {
        let at = format!("agents.destinations[{i}]");
        check_destination_name(&d.name).map_err(|e| format!("{at}.name: {e}"))?;
        if direct.contains(&d.name) {
            return Err(format!(
                "{at}.name: {:?} is also in `destinations`; a destination is reached either \
                 directly or through its agent, remove one",
                d.name
            ));
        }
        if !names.insert(d.name.clone()) {
            return Err(format!(
                "{at}.name: {:?} is used twice; names must be unique",
                d.name
            ));
        }
        check_labels(&d.labels).map_err(|e| format!("{at}.labels: {e}"))?;
        check_namespace(d.namespace.as_deref()).map_err(|e| format!("{at}.namespace: {e}"))?;
        destinations.push(AgentDestinationConfig {
            name: d.name,
            labels: d.labels,
            namespace: d.namespace.unwrap_or_else(|| "default".into()),
        });
    }
    Ok(AgentsConfig {
        store,
        namespace: a.namespace,
        offline_after,
        destinations,
    })
}

/// A destination name: used in `destination: a,b`, so no commas or white space; `stage` is
/// reserved.
pub fn check_destination_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > 253 {
        return Err(format!("{name:?} is longer than 253 characters"));
    }
    if name.contains(',') || name.chars().any(char::is_whitespace) {
        return Err(format!("{name:?} contains a comma or white space"));
    }
    if name == "stage" {
        return Err("\"stage\" is reserved for `destination: stage`; pick another name".into());
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), String> {
    for (k, v) in labels {
        let key_ok = !k.is_empty()
            && k.len() <= 317
            && k.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
        if !key_ok {
            return Err(format!("{k:?} is not a valid label key"));
        }
        if !v.is_empty() && !crate::job::is_label_value(v) {
            return Err(format!("{k}: {v:?} is not a valid label value"));
        }
    }
    Ok(())
}

fn check_namespace(ns: Option<&str>) -> Result<(), String> {
    match ns {
        None => Ok(()),
        Some(ns)
            if !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !ns.starts_with('-')
                && !ns.ends_with('-') =>
        {
            Ok(())
        }
        Some(ns) => Err(format!(
            "{ns:?} is not a valid namespace name (lowercase letters, digits and '-', at most 63)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ServerConfig, String> {
        ServerConfig::parse(text, "config file t.yaml").map_err(|e| e.to_string())
    }

    #[test]
    fn a_full_file_parses() {
        let c = parse(
            r#"
controlPlane: {kubeconfig: /cp.kubeconfig, context: cp}
destinations:
- name: prod-eu
  labels: {env: prod}
  namespace: verification
  kubeconfig: /k
  context: prod-eu
- name: edge-1
  server: https://10.0.0.1:6443/
  token: abc
  caData: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
- name: "arn:aws:eks:eu-west-1:1:cluster/x"
  kubeconfig: /k
kubeconfigContexts: {contexts: ["kind-*"]}
argocd: {namespace: gitops}
policy:
  rules:
  - projects: [team-a]
    destinations: ["prod-*"]
engine: {connectTimeout: 2s}
"#,
        )
        .unwrap();
        assert_eq!(c.origin, "config file t.yaml");
        assert_eq!(
            c.control_plane,
            Access::Kubeconfig {
                path: Some("/cp.kubeconfig".into()),
                context: Some("cp".into())
            }
        );
        assert_eq!(c.destinations.len(), 3);
        assert_eq!(c.destinations[0].labels["env"], "prod");
        let Access::Direct(d) = &c.destinations[1].access else {
            panic!("direct")
        };
        assert_eq!(d.server, "https://10.0.0.1:6443");
        assert_eq!(d.token.as_ref().unwrap().expose(), "abc");
        assert!(
            !format!("{d:?}").contains("abc"),
            "tokens never appear in Debug"
        );
        let argocd = c.argocd.unwrap();
        assert_eq!(argocd.namespace, "gitops");
        assert!(argocd.in_cluster);
        assert_eq!(argocd.default_namespace, "default");
        assert_eq!(c.policy.unwrap().rules[0].namespaces, vec!["*"]);
        assert_eq!(c.engine.connect_timeout, Duration::from_secs(2));
        assert_eq!(c.engine.request_timeout, Duration::from_secs(20));
    }

    #[test]
    fn the_example_file_is_valid() {
        let c = ServerConfig::parse(
            include_str!("../../config/server.yaml"),
            "config file config/server.yaml",
        )
        .unwrap();
        assert_eq!(c.destinations.len(), 2);
        assert!(matches!(&c.destinations[1].access, Access::Direct(d) if d.token_file.is_some()));
        assert_eq!(c.policy.unwrap().rules.len(), 2);
        assert_eq!(c.argocd.unwrap().default_namespace, "verification");
        let agents = c.agents.unwrap();
        assert_eq!(agents.store, StoreKind::Kubernetes);
        assert_eq!(agents.destinations[0].name, "edge-2");
    }

    #[test]
    fn agents_have_defaults() {
        let c = parse("agents: {destinations: [{name: edge-1, labels: {env: edge}}]}").unwrap();
        let a = c.agents.unwrap();
        assert_eq!(a.store, StoreKind::Memory);
        assert_eq!(a.offline_after, Duration::from_secs(60));
        assert_eq!(a.namespace, None);
        assert_eq!(a.destinations[0].namespace, "default");
        assert_eq!(a.destinations[0].labels["env"], "edge");
        let k = parse("agents: {store: kubernetes, namespace: rd, offlineAfter: 2m}").unwrap();
        let a = k.agents.unwrap();
        assert_eq!(
            (a.store, a.namespace.as_deref(), a.offline_after),
            (StoreKind::Kubernetes, Some("rd"), Duration::from_secs(120))
        );
    }

    #[test]
    fn empty_and_default() {
        let c = parse("").unwrap();
        assert!(c.destinations.is_empty() && c.policy.is_none());
        assert_eq!(c.control_plane, Access::Infer);
        let d = ServerConfig::embedded_default();
        assert!(d.kubeconfig_contexts.is_some());
    }

    #[test]
    fn every_mistake_names_file_and_field() {
        for (text, needle) in [
            (
                "destinations: [{name: a, kubeconfig: /k, tokn: x}]",
                "unknown field `tokn`",
            ),
            ("destinaton: []", "unknown field `destinaton`"),
            (
                "destinations: [{name: a}]",
                "destinations[0]: say how to reach it",
            ),
            (
                "destinations: [{name: 'a b', kubeconfig: /k}]",
                "destinations[0].name",
            ),
            ("destinations: [{name: stage, kubeconfig: /k}]", "reserved"),
            (
                "destinations: [{name: a, kubeconfig: /k}, {name: a, kubeconfig: /k}]",
                "destinations[1].name: \"a\" is used twice",
            ),
            (
                "destinations: [{name: a, kubeconfig: /k, token: t}]",
                "destinations[0].token: only allowed with `server`",
            ),
            (
                "destinations: [{name: a, server: 'ftp://x'}]",
                "destinations[0].server",
            ),
            (
                "destinations: [{name: a, server: 'https://x', kubeconfig: /k}]",
                "mutually exclusive",
            ),
            (
                "destinations: [{name: a, server: 'https://x', caData: nope}]",
                "destinations[0].caData",
            ),
            (
                "destinations: [{name: a, server: 'https://x', certData: c}]",
                "go together",
            ),
            (
                "destinations: [{name: a, kubeconfig: /k, namespace: Bad}]",
                "destinations[0].namespace",
            ),
            (
                "destinations: [{name: a, kubeconfig: /k, labels: {env: 'a b'}}]",
                "destinations[0].labels",
            ),
            (
                "policy: {rules: [{projects: [a]}]}",
                "policy.rules[0].destinations: empty list",
            ),
            ("engine: {connectTimeout: soon}", "engine.connectTimeout"),
            (
                "engine: {requestTimeout: 0s}",
                "engine.requestTimeout: must be more",
            ),
            ("argocd: {namespace: Argo}", "argocd.namespace"),
            ("destinations: {}", "line 1 column 15"),
            (
                "agents: {store: etcd}",
                "agents.store: \"etcd\" is not a store",
            ),
            (
                "agents: {offlineAfter: 10ms}",
                "agents.offlineAfter: must be at least 1s",
            ),
            (
                "agents: {destinations: [{name: a}, {name: a}]}",
                "agents.destinations[1].name: \"a\" is used twice",
            ),
            (
                "destinations: [{name: a, kubeconfig: /k}]\nagents: {destinations: [{name: a}]}",
                "agents.destinations[0].name: \"a\" is also in `destinations`",
            ),
            (
                "agents: {destinations: [{name: a, namespace: A}]}",
                "agents.destinations[0].namespace",
            ),
            (
                "agents: {destinations: [{name: a, url: x}]}",
                "unknown field `url`",
            ),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with("invalid config file t.yaml: "), "{e}");
            assert!(e.contains(needle), "{text}: {e}");
        }
        let e = ServerConfig::load(Path::new("/nonexistent/x.yaml")).unwrap_err();
        assert!(
            e.to_string()
                .contains("/nonexistent/x.yaml: cannot read it"),
            "{e}"
        );
    }
}
