//! The server configuration file (YAML): destinations and their sources, policy, engine settings.
//!
//! Parsed once into typed structs and validated in one pass; any mistake yields one
//! [`ConfigFileError`] that names the file and the field (`destinations[1].server: …`). Without
//! a file, [`ServerConfig::embedded_default`] makes every kubeconfig context a destination.
//! Every key is documented in [`reference()`], rendered as docs/configuration.md (`make docs`).
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

use dispatch_api::parse_go_duration;
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

// === configuration reference (docs/configuration.md, `make docs`) ===

/// What a key defaults to when it is not in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldDefault {
    /// the key must be given
    Required,
    /// this value (YAML) is applied by [`ServerConfig::parse`]; a test checks it
    Value(&'static str),
    /// not set; what that means (empty: nothing)
    Unset(&'static str),
}

/// One key of the configuration file, for the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldDoc {
    /// path of the key: `engine.connectTimeout`, `agents.destinations[].namespace`
    pub key: String,
    /// `string`, `path`, `bool`, `duration`, `enum`, `string map`, `list of strings`,
    /// `list of globs`, `object`, `list of objects`
    pub ty: &'static str,
    /// its default
    pub default: FieldDefault,
    /// one line
    pub description: &'static str,
}

impl FieldDoc {
    /// The section (table) the key belongs to: the path of its parent, empty for top-level keys.
    pub fn section(&self) -> &str {
        self.key.rsplit_once('.').map_or("", |(parent, _)| parent)
    }
}

/// The access keys shared by `controlPlane` and `destinations[]` (`RawAccess`).
#[rustfmt::skip]
const ACCESS_FIELDS: [(&str, &str, FieldDefault, &str); 13] = [
    ("kubeconfig", "path", FieldDefault::Unset("`$KUBECONFIG`, else `~/.kube/config`"), "kubeconfig file; with `context`, excludes `server`"),
    ("context", "string", FieldDefault::Unset("the kubeconfig's current context"), "context of the kubeconfig"),
    ("server", "string", FieldDefault::Unset(""), "API server URL (`https://host:port`); the credentials below need it"),
    ("token", "string", FieldDefault::Unset(""), "bearer token (never logged); excludes `tokenFile`"),
    ("tokenFile", "path", FieldDefault::Unset(""), "file with a bearer token, re-read when it changes (projected tokens)"),
    ("caData", "string", FieldDefault::Unset(""), "CA certificate(s), PEM; excludes `caFile`"),
    ("caFile", "path", FieldDefault::Unset(""), "CA certificate file, PEM"),
    ("certData", "string", FieldDefault::Unset(""), "client certificate, PEM; with `keyData`"),
    ("keyData", "string", FieldDefault::Unset(""), "client key, PEM (never logged); with `certData`"),
    ("certFile", "path", FieldDefault::Unset(""), "client certificate file; with `keyFile`, excludes `certData`"),
    ("keyFile", "path", FieldDefault::Unset(""), "client key file; with `certFile`"),
    ("insecure", "bool", FieldDefault::Value("false"), "skip verification of the server certificate"),
    ("tlsServerName", "string", FieldDefault::Unset("the host of `server`"), "server name for TLS verification"),
];

/// Every key of the configuration file, section by section, in the order of the reference.
///
/// Tests check it against the parser: every key listed is accepted, every key accepted is listed
/// (from serde's unknown-field errors), and the [`FieldDefault::Value`]s are what
/// [`ServerConfig::parse`] applies. `docs/configuration.md` is [`reference_markdown`].
#[rustfmt::skip]
pub fn reference() -> Vec<FieldDoc> {
    use FieldDefault::{Required, Unset, Value};
    let f = |key: &str, ty, default, description| FieldDoc {
        key: key.to_string(),
        ty,
        default,
        description,
    };
    let mut docs = vec![
        f("controlPlane", "object", Unset("the in-cluster service account, else `$KUBECONFIG`"), "how to reach the control plane: Kargo Stages, Argo CD Applications and cluster Secrets, `DispatchJob`s"),
        f("destinations", "list of objects", Unset("none"), "destinations by name, each reached with a kubeconfig (+ context) or a server URL + credentials"),
        f("kubeconfigContexts", "object", Unset("unset; without a file, every context of the default kubeconfig"), "every context of a kubeconfig as a destination named after the context"),
        f("argocd", "object", Unset("unset: no Argo CD destinations"), "Argo CD cluster Secrets on the control plane as destinations, watched live; needed by `destination: stage`"),
        f("policy", "object", Unset("unset: every project may use every destination (a warning at start)"), "which Kargo projects may run Jobs on which destinations and namespaces"),
        f("engine", "object", Unset("the defaults below"), "timeouts of the dispatch engine"),
        f("agents", "object", Unset("unset: no agent destinations"), "destinations reached through `rollouts-dispatch agent` (clusters that can only dial out; the server holds no credentials for them)"),
    ];
    for (key, ty, default, description) in ACCESS_FIELDS {
        docs.push(f(&format!("controlPlane.{key}"), ty, default, description));
    }
    docs.extend([
        f("destinations[].name", "string", Required, "its name in `destination:`; unique, no commas or white space, not `stage`"),
        f("destinations[].labels", "string map", Unset("no labels"), "labels for `destinationSelector`"),
        f("destinations[].namespace", "string", Unset("the kubeconfig context's namespace, else `default`"), "default namespace of Jobs there"),
    ]);
    for (key, ty, default, description) in ACCESS_FIELDS {
        docs.push(f(&format!("destinations[].{key}"), ty, default, description));
    }
    docs.extend([
        f("kubeconfigContexts.path", "path", Unset("`$KUBECONFIG`, else `~/.kube/config`"), "the kubeconfig file"),
        f("kubeconfigContexts.contexts", "list of globs", Unset("all contexts"), "globs (`*`, `?`) over context names"),
        f("kubeconfigContexts.labels", "string map", Unset("no labels"), "labels of every such destination"),
        f("kubeconfigContexts.namespace", "string", Unset("`default`"), "default namespace of Jobs when the context has none"),
        f("argocd.namespace", "string", Value("argocd"), "namespace of Argo CD and its cluster Secrets"),
        f("argocd.inCluster", "bool", Value("true"), "the implicit `in-cluster` destination, the control plane itself (like Argo CD's `cluster.inClusterEnabled`)"),
        f("argocd.defaultNamespace", "string", Value("default"), "default namespace of Jobs on these destinations; a Secret may override it with annotation `rollouts-dispatch.io/namespace`"),
        f("policy.rules", "list of objects", Unset("none; no rules allows everything (a warning at start)"), "allow rules; any matching rule allows"),
        f("policy.rules[].projects", "list of globs", Required, "Kargo projects (AnalysisRun namespaces)"),
        f("policy.rules[].destinations", "list of globs", Required, "destination names"),
        f("policy.rules[].namespaces", "list of globs", Value("[\"*\"]"), "namespaces on the destination"),
        f("engine.connectTimeout", "duration", Value("5s"), "TCP + TLS connect to a destination API server"),
        f("engine.requestTimeout", "duration", Value("20s"), "bound on one API call (create, get, delete, list)"),
        f("engine.cacheWait", "duration", Value("2s"), "how long a status lookup waits for a destination's first cache sync before asking the API server"),
        f("engine.logTimeout", "duration", Value("5s"), "bound on reading a log tail from `pods/log`"),
        f("agents.store", "enum", Value("memory"), "where agent work is kept: `memory` (in the server process: one replica only, forgotten on restart, agents resync) or `kubernetes` (`DispatchJob` resources on the control plane, CRD in config/crds: any number of replicas)"),
        f("agents.namespace", "string", Unset("`$POD_NAMESPACE`, else `rollouts-dispatch`"), "namespace of the `DispatchJob` resources (store `kubernetes`)"),
        f("agents.offlineAfter", "duration", Value("60s"), "an agent not heard from for this long is shown as not connected (at least 1s)"),
        f("agents.destinations", "list of objects", Unset("none"), "the agent destinations; the agent's token names its destination (`token issue --destination`)"),
        f("agents.destinations[].name", "string", Required, "its name in `destination:` and in the agent's token; unique, not also in `destinations`"),
        f("agents.destinations[].labels", "string map", Unset("no labels"), "labels for `destinationSelector`"),
        f("agents.destinations[].namespace", "string", Value("default"), "default namespace of Jobs there"),
    ]);
    docs
}

const REFERENCE_INTRO: &str = "\
<!-- Generated from server/src/config.rs (`reference()`); do not edit: run `make docs`. -->

# Server configuration reference

The server configuration file is YAML, given to `rollouts-dispatch serve`, `run` and `doctor`
with `--config FILE` (or `$ROLLOUTS_DISPATCH_CONFIG`); in the Helm chart it is the `config:`
value. Every top-level key is optional. Without a file, the embedded default applies: every
context of `$KUBECONFIG` / `~/.kube/config` is a destination, and there is no policy (every
project may use every destination). An unknown key, or a value that cannot be used, is refused
with one message naming the file and the key (`destinations[1].server: …`).

A commented example is [`config/server.yaml`](../config/server.yaml).

Keys are written as paths: `agents.destinations[].namespace` is `namespace` in an item of the
list `destinations` under `agents`. Durations are Go durations (`90s`, `2m`, `1h30m`). Globs
match with `*` and `?`. A destination (in `destinations` or `controlPlane`) is reached either
with `kubeconfig` (+ `context`) or with `server` and credentials, never both.
";

/// The reference as Markdown: an introduction, then one table per section of [`reference()`].
/// `docs/configuration.md` holds exactly this (a test checks it; `make docs` rewrites it).
pub fn reference_markdown() -> String {
    let docs = reference();
    let mut sections: Vec<&str> = Vec::new();
    for d in &docs {
        if !sections.contains(&d.section()) {
            sections.push(d.section());
        }
    }
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(REFERENCE_INTRO);
    for section in sections {
        if section.is_empty() {
            out.push_str("\n## Top level\n\n");
        } else {
            out.push_str(&format!("\n## `{section}`\n\n"));
        }
        out.push_str("| Key | Type | Default | Description |\n|---|---|---|---|\n");
        for d in docs.iter().filter(|d| d.section() == section) {
            let default = match d.default {
                FieldDefault::Required => "required".to_string(),
                FieldDefault::Value(v) => format!("`{v}`"),
                FieldDefault::Unset("") => "—".to_string(),
                FieldDefault::Unset(note) => note.to_string(),
            };
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                d.key,
                d.ty,
                cell(&default),
                cell(d.description)
            ));
        }
    }
    out
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

/// The reference against the parser; `UPDATE_DOCS=1` rewrites docs/configuration.md (`make docs`).
#[cfg(test)]
mod reference_tests {
    use super::*;
    use serde_json::{json, Map, Value as Json};

    /// A value of a documented type that the raw structs accept.
    fn example(ty: &str) -> Json {
        match ty {
            "string" | "path" | "enum" => json!("x"),
            "bool" => json!(true),
            "duration" => json!("5s"),
            "string map" => json!({"k": "v"}),
            "list of strings" | "list of globs" => json!(["x"]),
            "object" => json!({}),
            "list of objects" => json!([]),
            other => panic!("type {other:?} has no example value: add one to `example`"),
        }
    }

    /// Sets `key` (`a.b[].c`) in `doc` unless already there; `b[]` is the first item of list `b`.
    fn insert(doc: &mut Map<String, Json>, key: &str, value: Json) {
        let mut segments: Vec<&str> = key.split('.').collect();
        let last = segments.pop().unwrap();
        let mut cursor = doc;
        for seg in segments {
            cursor = match seg.strip_suffix("[]") {
                Some(list) => {
                    let Json::Array(items) = cursor.entry(list).or_insert_with(|| json!([])) else {
                        panic!("{key}: {list} is not a list")
                    };
                    if items.is_empty() {
                        items.push(json!({}));
                    }
                    items[0].as_object_mut().unwrap()
                }
                None => cursor
                    .entry(seg)
                    .or_insert_with(|| json!({}))
                    .as_object_mut()
                    .unwrap_or_else(|| panic!("{key}: {seg} is not an object")),
            };
        }
        cursor.entry(last).or_insert(value);
    }

    /// A document with `key` set to `value` and the required keys of the list items on its path.
    fn document_with(docs: &[FieldDoc], key: &str, value: Json) -> String {
        let mut doc = Map::new();
        for r in docs {
            let on_path = !r.section().is_empty() && key.starts_with(&format!("{}.", r.section()));
            if r.default == FieldDefault::Required && on_path && r.key != key {
                insert(&mut doc, &r.key, example(r.ty));
            }
        }
        insert(&mut doc, key, value);
        Json::Object(doc).to_string()
    }

    fn parse_raw(text: &str) -> Result<RawConfig, String> {
        serde_saphyr::from_str::<RawConfig>(text).map_err(|e| e.to_string())
    }

    /// The sections with fields of their own: the top level, every object and list item.
    fn sections(docs: &[FieldDoc]) -> Vec<String> {
        let mut out = vec![String::new()];
        for d in docs {
            match d.ty {
                "object" => out.push(d.key.clone()),
                "list of objects" => out.push(format!("{}[]", d.key)),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn reference_is_well_formed() {
        let docs = reference();
        let mut keys = BTreeSet::new();
        for d in &docs {
            assert!(keys.insert(d.key.as_str()), "{} is documented twice", d.key);
            assert!(!d.description.is_empty(), "{} has no description", d.key);
            example(d.ty);
        }
        for d in &docs {
            let section = d.section();
            if section.is_empty() {
                continue;
            }
            let (parent, ty) = match section.strip_suffix("[]") {
                Some(list) => (list, "list of objects"),
                None => (section, "object"),
            };
            assert!(
                docs.iter().any(|p| p.key == parent && p.ty == ty),
                "{}: its parent `{parent}` must be documented as {ty}",
                d.key
            );
        }
    }

    #[test]
    fn every_documented_key_is_accepted_alone() {
        let docs = reference();
        for d in &docs {
            let text = document_with(&docs, &d.key, example(d.ty));
            if let Err(e) = parse_raw(&text) {
                panic!(
                    "documented key `{}` is rejected by the parser: {e}\n{text}",
                    d.key
                );
            }
        }
    }

    #[test]
    fn every_documented_key_is_accepted_at_once() {
        let docs = reference();
        let mut doc = Map::new();
        for d in &docs {
            insert(&mut doc, &d.key, example(d.ty));
        }
        let text = Json::Object(doc).to_string();
        if let Err(e) = parse_raw(&text) {
            panic!("a document with every documented key is rejected: {e}\n{text}");
        }
    }

    /// serde lists the fields a struct accepts in its unknown-field error: each section's list
    /// must be the documented one, so a field added to a raw struct without docs fails here.
    #[test]
    fn every_accepted_key_is_documented() {
        let docs = reference();
        for section in sections(&docs) {
            let probe = if section.is_empty() {
                "zzz".to_string()
            } else {
                format!("{section}.zzz")
            };
            let text = document_with(&docs, &probe, json!(1));
            let e = match parse_raw(&text) {
                Ok(_) => panic!("{text}: accepted an unknown field"),
                Err(e) => e,
            };
            assert!(e.contains("unknown field `zzz`"), "{text}: {e}");
            // `… unknown field `zzz`, expected one of a, b, c` (or `expected a`; serde quotes
            // the names with backticks, serde-saphyr does not)
            let listed = e
                .split_once("expected ")
                .map_or("", |(_, rest)| rest.lines().next().unwrap_or(""));
            let listed = listed.strip_prefix("one of ").unwrap_or(listed);
            let accepted: BTreeSet<&str> = listed
                .split(", ")
                .map(|f| f.trim().trim_matches('`'))
                .filter(|f| !f.is_empty())
                .collect();
            let documented: BTreeSet<&str> = docs
                .iter()
                .filter(|d| d.section() == section)
                .map(|d| d.key.rsplit('.').next().unwrap())
                .collect();
            let name = if section.is_empty() {
                "the top level"
            } else {
                &section
            };
            let undocumented: Vec<_> = accepted.difference(&documented).collect();
            let unknown: Vec<_> = documented.difference(&accepted).collect();
            assert!(
                undocumented.is_empty() && unknown.is_empty(),
                "keys of {name}: accepted by the parser but missing from reference(): \
                 {undocumented:?}; in reference() but not accepted: {unknown:?} (parser: {e})"
            );
        }
    }

    #[test]
    fn documented_defaults_are_what_parse_applies() {
        let c = ServerConfig::parse(
            r#"
controlPlane: {server: "https://cp.example"}
destinations: [{name: a, server: "https://a.example"}]
argocd: {}
policy: {rules: [{projects: [p], destinations: [d]}]}
engine: {}
agents: {destinations: [{name: e}]}
"#,
            "test",
        )
        .unwrap();
        let dur = |v: &str| parse_go_duration(v).unwrap();
        let Access::Direct(cp) = &c.control_plane else {
            panic!("direct")
        };
        let Access::Direct(dest) = &c.destinations[0].access else {
            panic!("direct")
        };
        let argocd = c.argocd.as_ref().unwrap();
        let agents = c.agents.as_ref().unwrap();
        let rule = &c.policy.as_ref().unwrap().rules[0];
        let mut checked = 0;
        for d in reference() {
            let FieldDefault::Value(v) = d.default else {
                continue;
            };
            let applied = match d.key.as_str() {
                "controlPlane.insecure" => v == cp.insecure.to_string(),
                "destinations[].insecure" => v == dest.insecure.to_string(),
                "argocd.namespace" => v == argocd.namespace,
                "argocd.inCluster" => v == argocd.in_cluster.to_string(),
                "argocd.defaultNamespace" => v == argocd.default_namespace,
                "policy.rules[].namespaces" => {
                    serde_json::from_str::<Vec<String>>(v).unwrap() == rule.namespaces
                }
                "engine.connectTimeout" => dur(v) == c.engine.connect_timeout,
                "engine.requestTimeout" => dur(v) == c.engine.request_timeout,
                "engine.cacheWait" => dur(v) == c.engine.cache_wait,
                "engine.logTimeout" => dur(v) == c.engine.log_timeout,
                "agents.store" => {
                    agents.store
                        == match v {
                            "memory" => StoreKind::Memory,
                            "kubernetes" => StoreKind::Kubernetes,
                            other => panic!("agents.store: {other:?}"),
                        }
                }
                "agents.offlineAfter" => dur(v) == agents.offline_after,
                "agents.destinations[].namespace" => v == agents.destinations[0].namespace,
                other => panic!(
                    "{other}: documented default {v} is checked by no test; add it to \
                     documented_defaults_are_what_parse_applies"
                ),
            };
            assert!(
                applied,
                "{}: reference() says the default is {v}, ServerConfig::parse applies another",
                d.key
            );
            checked += 1;
        }
        assert_eq!(checked, 13);
        // without a file, or without an `engine:` section, the engine defaults are the same
        assert_eq!(ServerConfig::embedded_default().engine, c.engine);
        assert_eq!(ServerConfig::parse("", "test").unwrap().engine, c.engine);
    }

    #[test]
    fn docs_configuration_md_is_up_to_date() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
        let want = reference_markdown();
        if std::env::var_os("UPDATE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
            return;
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let line = have
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "docs/configuration.md differs from reference_markdown() (first at line {}): \
                 run `make docs` to regenerate it from server/src/config.rs",
                line + 1
            );
        }
    }
}
