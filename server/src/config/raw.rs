//! The configuration file as written (`Raw*`: deserialized as is, unknown keys refused) and the
//! validation that turns it into the typed [`ServerConfig`] in one pass; the first key that
//! cannot be used is reported as an [`InvalidField`] (`destinations[1].server: …`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use dispatch_api::duration::DurationError;
use dispatch_api::{names, parse_go_duration};
use serde::Deserialize;

use crate::podsecurity::{
    default_service_accounts, BadDefaultUser, DefaultUser, Level, UnknownLevel,
};

use super::{
    Access, AgentDestinationConfig, AgentsConfig, CallerBinding, ConfirmRuns, DestinationConfig,
    DirectAccess, KubeconfigContexts, PolicyConfig, PolicyRule, SecretValue, ServerConfig,
    StoreKind,
};

/// A key of the file that cannot be used: its path (`destinations[1].server`) and what is wrong
/// with it. [`ServerConfig::parse`] puts it in a `ConfigFileError` that names the file.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {problem}")]
pub(crate) struct InvalidField {
    /// the path of the key: `destinations[1].server`, `agents.offlineAfter`
    field: String,
    /// what is wrong with it
    #[source]
    problem: Problem,
}

/// The error of the key at `field`.
fn invalid(field: impl Into<String>, problem: impl Into<Problem>) -> InvalidField {
    InvalidField {
        field: field.into(),
        problem: problem.into(),
    }
}

/// What is wrong with a key of the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Problem {
    #[error(transparent)]
    Name(#[from] InvalidName),
    #[error(transparent)]
    Label(#[from] InvalidLabel),
    #[error(transparent)]
    Namespace(#[from] InvalidNamespace),
    #[error(transparent)]
    Namespaces(#[from] InvalidNamespaces),
    #[error("{0:?} is used twice; names must be unique")]
    Duplicate(String),
    #[error(
        "{0:?} is also in `destinations`; a destination is reached either directly or through \
         its agent, remove one"
    )]
    AlsoDirect(String),
    #[error("empty pattern")]
    EmptyPattern,
    #[error("empty list; give at least one glob (\"*\" matches all)")]
    EmptyList,
    #[error("empty glob")]
    EmptyGlob,
    #[error(
        "name its namespaces (`namespaces: [verification]`); write `\"*\"` to allow every \
         namespace"
    )]
    NoNamespaces,
    #[error("{value:?} is not a duration ({source}; e.g. {example})")]
    NotADuration {
        value: String,
        /// a valid value, for the message
        example: &'static str,
        #[source]
        source: DurationError,
    },
    #[error("must be more than 0")]
    Zero,
    #[error("must be at least 1s")]
    UnderOneSecond,
    #[error("must be at least 1m, so that the verdict is read before the Job goes")]
    UnderOneMinute,
    #[error("{0:?} is not a store; use memory (one replica) or kubernetes")]
    UnknownStore(String),
    #[error("only allowed with `server`; with a kubeconfig the credentials come from the file")]
    NeedsServer,
    #[error("say how to reach it: `kubeconfig` (+ `context`) or `server` (+ credentials)")]
    NoAccess,
    #[error("`server` and `kubeconfig`/`context` are mutually exclusive; keep one")]
    ServerAndKubeconfig,
    #[error("{url:?} is not a URL ({source})")]
    NotAUrl {
        url: String,
        #[source]
        source: http::uri::InvalidUri,
    },
    #[error("{0:?} must be an https:// URL with a host")]
    NotHttps(String),
    #[error("`{0}` and `{1}` are mutually exclusive")]
    Exclusive(&'static str, &'static str),
    #[error("not a PEM certificate (expected -----BEGIN CERTIFICATE-----)")]
    NotPem,
    #[error("`{0}` and `{1}` go together")]
    Together(&'static str, &'static str),
    #[error("`certData`/`keyData` and `certFile`/`keyFile` are mutually exclusive")]
    CertDataAndFile,
    #[error(
        "{0:?} is not a command: give it non-empty, without surrounding white space, exactly as \
         the cluster Secrets' execProviderConfig.command gives it"
    )]
    BadCommand(String),
    #[error(transparent)]
    Level(#[from] UnknownLevel),
    #[error(transparent)]
    DefaultUser(#[from] BadDefaultUser),
    #[error(
        "`allowAll: true` and `rules` are mutually exclusive: keep the rules (they say who may use \
         what), or drop them to allow every project everywhere"
    )]
    AllowAllAndRules,
    #[error(
        "`true` needs `controlPlane`: runs are confirmed against the AnalysisRuns of the control \
         plane, and without `controlPlane` the server does not know which cluster that is. Add \
         `controlPlane` (`controlPlane: {{}}` for the in-cluster service account, else a \
         `kubeconfig` or a `server`), or remove `confirmRuns`"
    )]
    ConfirmRunsWithoutControlPlane,
    #[error(
        "{} is more than `engine.maxMeasurementDeadline` ({}); shorten it, or raise \
         `engine.maxMeasurementDeadline`",
        dispatch_api::format_go_duration(*deadline),
        dispatch_api::format_go_duration(*max)
    )]
    DeadlineOverMax { deadline: Duration, max: Duration },
    #[error(transparent)]
    Ui(#[from] ui::UiProblem),
    #[error(transparent)]
    ArgoCd(#[from] argocd::ArgoCdProblem),
    /// a pod allowlist key of a rule (#27)
    #[error(transparent)]
    Pods(#[from] pods::PodsProblem),
}

/// Why a string cannot be a destination name ([`check_destination_name`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidName {
    /// the empty string
    #[error("empty name")]
    Empty,
    /// longer than 253 bytes
    #[error("{0:?} is longer than 253 characters")]
    TooLong(String),
    /// a comma or white space, which `destination: a,b` could not list
    #[error("{0:?} contains a comma or white space")]
    Separator(String),
    /// `stage`, which `destination: stage` means
    #[error("\"stage\" is reserved for `destination: stage`; pick another name")]
    Reserved,
}

/// A label map that cannot be used for `destinationSelector`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InvalidLabel {
    #[error("{0:?} is not a valid label key")]
    Key(String),
    #[error("{key}: {value:?} is not a valid label value")]
    Value { key: String, value: String },
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawConfig {
    control_plane: Option<RawAccess>,
    #[serde(default)]
    destinations: Vec<RawDestination>,
    kubeconfig_contexts: Option<RawKubeconfigContexts>,
    argocd: Option<RawArgoCdSection>,
    policy: Option<RawPolicy>,
    engine: Option<RawEngine>,
    agents: Option<RawAgents>,
    confirm_runs: Option<bool>,
    jobs: Option<RawJobs>,
    application_sync: Option<RawApplicationSync>,
    ui: Option<RawUi>,
    budgets: Option<RawBudgets>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawApplicationSync {
    #[serde(default)]
    destinations: Vec<String>,
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
    namespaces: Option<Vec<String>>,
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
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    rules: Vec<RawRule>,
    #[serde(default, rename = "allowAll")]
    allow_all: bool,
    #[serde(default)]
    callers: Vec<RawCaller>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCaller {
    subject: String,
    #[serde(default)]
    projects: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    projects: Vec<String>,
    #[serde(default)]
    destinations: Vec<String>,
    namespaces: Option<Vec<String>>,
    #[serde(default, rename = "applicationNamespaces")]
    application_namespaces: Vec<String>,
    #[serde(rename = "podSecurity")]
    pod_security: Option<String>,
    #[serde(rename = "serviceAccounts")]
    service_accounts: Option<Vec<String>>,
    #[serde(default, rename = "automountServiceAccountToken")]
    automount_service_account_token: bool,
    #[serde(rename = "defaultRunAsUser")]
    default_run_as_user: Option<RawUser>,
    // The pod allowlists (#27), read by `pods.rs` into `PolicyRule::allow`; kept as one block.
    #[serde(default)]
    secrets: Vec<String>,
    #[serde(default, rename = "configMaps")]
    config_maps: Vec<String>,
    #[serde(default, rename = "persistentVolumeClaims")]
    persistent_volume_claims: Vec<String>,
    #[serde(default, rename = "csiDrivers")]
    csi_drivers: Vec<String>,
    #[serde(default, rename = "imagePullSecrets")]
    image_pull_secrets: Vec<String>,
    #[serde(default, rename = "ephemeralVolumes")]
    ephemeral_volumes: bool,
    #[serde(default)]
    scheduling: Vec<String>,
    resources: Option<pods::RawResources>,
    #[serde(rename = "jobLimits")]
    job_limits: Option<pods::RawJobLimits>,
    #[serde(default, rename = "podLabels")]
    pod_labels: Vec<String>,
    #[serde(default, rename = "podAnnotations")]
    pod_annotations: Vec<String>,
}

/// `defaultRunAsUser`: a user id, or `none`.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawUser {
    Id(i64),
    Word(String),
}

impl RawUser {
    fn validate(self) -> Result<DefaultUser, BadDefaultUser> {
        match self {
            Self::Id(n) => DefaultUser::from_id(n),
            Self::Word(w) => w.parse(),
        }
    }
}

/// `name`, `labels`, `namespace`, `namespaces` and the access of a destination.
type DestinationParts = (
    String,
    BTreeMap<String, String>,
    Option<String>,
    Option<Vec<String>>,
    RawAccess,
);

impl RawDestination {
    fn split(self) -> DestinationParts {
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
        (
            self.name,
            self.labels,
            self.namespace,
            self.namespaces,
            access,
        )
    }
}

impl RawConfig {
    /// The typed configuration, or the first key that cannot be used.
    pub(super) fn validate(self, origin: &str) -> Result<ServerConfig, InvalidField> {
        let confirm_runs = match (self.confirm_runs, self.control_plane.is_some()) {
            (Some(false), _) => ConfirmRuns::Off,
            (None | Some(true), true) => ConfirmRuns::On,
            (None, false) => ConfirmRuns::NoControlPlane,
            (Some(true), false) => {
                return Err(invalid(
                    "confirmRuns",
                    Problem::ConfirmRunsWithoutControlPlane,
                ))
            }
        };
        let has_control_plane = self.control_plane.is_some();
        let control_plane = match self.control_plane {
            None => Access::Infer,
            Some(a) => a.validate("controlPlane", true)?,
        };
        let mut destinations = Vec::new();
        let mut names = BTreeSet::new();
        for (i, d) in self.destinations.into_iter().enumerate() {
            let at = format!("destinations[{i}]");
            let (name, labels, namespace, namespaces, access) = d.split();
            check_destination_name(&name).map_err(|e| invalid(format!("{at}.name"), e))?;
            if !names.insert(name.clone()) {
                return Err(invalid(format!("{at}.name"), Problem::Duplicate(name)));
            }
            check_labels(&labels).map_err(|e| invalid(format!("{at}.labels"), e))?;
            check_namespace(namespace.as_deref())
                .map_err(|e| invalid(format!("{at}.namespace"), e))?;
            check_namespaces(namespaces.as_deref(), namespace.as_deref())
                .map_err(|e| invalid(format!("{at}.namespaces"), e))?;
            let access = access.validate(&at, false)?;
            destinations.push(DestinationConfig {
                name,
                labels,
                namespace,
                namespaces,
                access,
            });
        }
        let kubeconfig_contexts = match self.kubeconfig_contexts {
            None => None,
            Some(k) => {
                check_labels(&k.labels).map_err(|e| invalid("kubeconfigContexts.labels", e))?;
                check_namespace(k.namespace.as_deref())
                    .map_err(|e| invalid("kubeconfigContexts.namespace", e))?;
                if let Some(i) = k.contexts.iter().position(|c| c.trim().is_empty()) {
                    return Err(invalid(
                        format!("kubeconfigContexts.contexts[{i}]"),
                        Problem::EmptyPattern,
                    ));
                }
                Some(KubeconfigContexts {
                    path: k.path,
                    contexts: k.contexts,
                    labels: k.labels,
                    namespace: k.namespace,
                })
            }
        };
        let agent_names = self.agents.as_ref().map_or_else(BTreeSet::new, |a| {
            a.destinations.iter().map(|d| d.name.clone()).collect()
        });
        let known = KnownDestinations {
            direct: &names,
            agents: agent_names,
            kubeconfig_contexts: kubeconfig_contexts.is_some(),
        };
        let argocd = validate_argocd(self.argocd, &known)?;
        let policy = match self.policy {
            None => None,
            Some(p) => {
                let mut rules = Vec::new();
                for (i, r) in p.rules.into_iter().enumerate() {
                    let at = format!("policy.rules[{i}]");
                    let allow = r.allowlists(&at)?;
                    // No default: a rule that named no namespaces once allowed every one of
                    // them (kube-system, argocd …) on its destinations (#27).
                    let namespaces = r.namespaces.unwrap_or_default();
                    let apps = &r.application_namespaces;
                    if let Some(j) = apps.iter().position(|g| g.trim().is_empty()) {
                        let at = format!("{at}.applicationNamespaces[{j}]");
                        return Err(invalid(at, Problem::EmptyGlob));
                    }
                    for (field, list) in [
                        ("projects", &r.projects),
                        ("destinations", &r.destinations),
                        ("namespaces", &namespaces),
                    ] {
                        if list.is_empty() && field == "namespaces" {
                            return Err(invalid(at, Problem::NoNamespaces));
                        }
                        if list.is_empty() {
                            return Err(invalid(format!("{at}.{field}"), Problem::EmptyList));
                        }
                        if let Some(j) = list.iter().position(|g| g.trim().is_empty()) {
                            return Err(invalid(format!("{at}.{field}[{j}]"), Problem::EmptyGlob));
                        }
                    }
                    let pod_security = match r.pod_security.as_deref() {
                        None => Level::default(),
                        Some(l) => l
                            .parse()
                            .map_err(|e| invalid(format!("{at}.podSecurity"), Problem::Level(e)))?,
                    };
                    let service_accounts =
                        r.service_accounts.unwrap_or_else(default_service_accounts);
                    if service_accounts.is_empty() {
                        let at = format!("{at}.serviceAccounts");
                        return Err(invalid(at, Problem::EmptyList));
                    }
                    if let Some(j) = service_accounts.iter().position(|a| a.trim().is_empty()) {
                        let at = format!("{at}.serviceAccounts[{j}]");
                        return Err(invalid(at, Problem::EmptyGlob));
                    }
                    let default_user = match r.default_run_as_user {
                        None => DefaultUser::default(),
                        Some(u) => u.validate().map_err(|e| {
                            invalid(format!("{at}.defaultRunAsUser"), Problem::DefaultUser(e))
                        })?,
                    };
                    rules.push(PolicyRule {
                        projects: r.projects,
                        destinations: r.destinations,
                        namespaces,
                        application_namespaces: r.application_namespaces,
                        pod_security,
                        service_accounts,
                        automount_service_account_token: r.automount_service_account_token,
                        allow,
                        default_user,
                    });
                }
                if p.allow_all && !rules.is_empty() {
                    return Err(invalid("policy.allowAll", Problem::AllowAllAndRules));
                }
                let callers = validate_callers(p.callers)?;
                Some(PolicyConfig {
                    rules,
                    callers,
                    allow_all: p.allow_all,
                })
            }
        };
        let engine = validate_engine(self.engine)?;
        let agents = match self.agents {
            None => None,
            Some(a) => Some(validate_agents(a, &names)?),
        };
        let jobs = validate_jobs(self.jobs)?;
        let application_sync = self.application_sync.map_or(Ok(Vec::new()), |a| {
            match a.destinations.iter().position(|g| g.trim().is_empty()) {
                Some(i) => Err(invalid(
                    format!("applicationSync.destinations[{i}]"),
                    Problem::EmptyGlob,
                )),
                None => Ok(a.destinations),
            }
        })?;
        Ok(ServerConfig {
            origin: origin.to_string(),
            control_plane,
            destinations,
            kubeconfig_contexts,
            argocd,
            policy,
            engine,
            agents,
            confirm_runs,
            jobs,
            application_sync,
            ui: validate_ui(self.ui, has_control_plane)?,
            budgets: validate_budgets(self.budgets)?,
        })
    }
}

impl RawAccess {
    /// `optional`: an empty block means [`Access::Infer`] (control plane) instead of an error.
    fn validate(self, at: &str, optional: bool) -> Result<Access, InvalidField> {
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
                    return Err(invalid(format!("{at}.{field}"), Problem::NeedsServer));
                }
                if kubeconfig.is_none() && context.is_none() {
                    return if optional {
                        Ok(Access::Infer)
                    } else {
                        Err(invalid(at, Problem::NoAccess))
                    };
                }
                Ok(Access::Kubeconfig {
                    path: kubeconfig,
                    context,
                })
            }
            Some(server) => {
                if kubeconfig.is_some() || context.is_some() {
                    return Err(invalid(at, Problem::ServerAndKubeconfig));
                }
                let server = server.trim_end_matches('/').to_string();
                let uri: http::Uri = match server.parse() {
                    Ok(uri) => uri,
                    Err(source) => {
                        let problem = Problem::NotAUrl {
                            url: server,
                            source,
                        };
                        return Err(invalid(format!("{at}.server"), problem));
                    }
                };
                if !matches!(uri.scheme_str(), Some("https" | "http")) || uri.host().is_none() {
                    return Err(invalid(format!("{at}.server"), Problem::NotHttps(server)));
                }
                if token.is_some() && token_file.is_some() {
                    return Err(invalid(at, Problem::Exclusive("token", "tokenFile")));
                }
                if ca_data.is_some() && ca_file.is_some() {
                    return Err(invalid(at, Problem::Exclusive("caData", "caFile")));
                }
                if let Some(pem) = &ca_data {
                    if !pem.contains("-----BEGIN CERTIFICATE-----") {
                        return Err(invalid(format!("{at}.caData"), Problem::NotPem));
                    }
                }
                if cert_data.is_some() != key_data.is_some() {
                    return Err(invalid(at, Problem::Together("certData", "keyData")));
                }
                if cert_file.is_some() != key_file.is_some() {
                    return Err(invalid(at, Problem::Together("certFile", "keyFile")));
                }
                if cert_data.is_some() && cert_file.is_some() {
                    return Err(invalid(at, Problem::CertDataAndFile));
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

/// `policy.callers`: a non-empty subject glob and a non-empty list of project globs each.
fn validate_callers(raw: Vec<RawCaller>) -> Result<Vec<CallerBinding>, InvalidField> {
    let mut out = Vec::with_capacity(raw.len());
    for (i, c) in raw.into_iter().enumerate() {
        let at = format!("policy.callers[{i}]");
        if c.subject.trim().is_empty() {
            return Err(invalid(format!("{at}.subject"), Problem::EmptyGlob));
        }
        if c.projects.is_empty() {
            return Err(invalid(format!("{at}.projects"), Problem::EmptyList));
        }
        if let Some(j) = c.projects.iter().position(|g| g.trim().is_empty()) {
            return Err(invalid(format!("{at}.projects[{j}]"), Problem::EmptyGlob));
        }
        out.push(CallerBinding {
            subject: c.subject,
            projects: c.projects,
        });
    }
    Ok(out)
}

fn validate_agents(a: RawAgents, direct: &BTreeSet<String>) -> Result<AgentsConfig, InvalidField> {
    let store = match a.store.as_deref() {
        None | Some("memory") => StoreKind::Memory,
        Some("kubernetes") => StoreKind::Kubernetes,
        Some(other) => {
            return Err(invalid(
                "agents.store",
                Problem::UnknownStore(other.to_string()),
            ))
        }
    };
    check_namespace(a.namespace.as_deref()).map_err(|e| invalid("agents.namespace", e))?;
    let offline_after = match a.offline_after {
        None => Duration::from_secs(60),
        Some(v) => {
            let d = parse_go_duration(&v).map_err(|source| {
                invalid(
                    "agents.offlineAfter",
                    Problem::NotADuration {
                        value: v.clone(),
                        example: "60s",
                        source,
                    },
                )
            })?;
            if d < Duration::from_secs(1) {
                return Err(invalid("agents.offlineAfter", Problem::UnderOneSecond));
            }
            d
        }
    };
    let mut names = BTreeSet::new();
    let mut destinations = Vec::new();
    for (i, d) in a.destinations.into_iter().enumerate() {
        let at = format!("agents.destinations[{i}]");
        check_destination_name(&d.name).map_err(|e| invalid(format!("{at}.name"), e))?;
        if direct.contains(&d.name) {
            return Err(invalid(format!("{at}.name"), Problem::AlsoDirect(d.name)));
        }
        if !names.insert(d.name.clone()) {
            return Err(invalid(format!("{at}.name"), Problem::Duplicate(d.name)));
        }
        check_labels(&d.labels).map_err(|e| invalid(format!("{at}.labels"), e))?;
        check_namespace(d.namespace.as_deref())
            .map_err(|e| invalid(format!("{at}.namespace"), e))?;
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
pub fn check_destination_name(name: &str) -> Result<(), InvalidName> {
    if name.is_empty() {
        return Err(InvalidName::Empty);
    }
    if name.len() > 253 {
        return Err(InvalidName::TooLong(name.to_string()));
    }
    if name.contains(',') || name.chars().any(char::is_whitespace) {
        return Err(InvalidName::Separator(name.to_string()));
    }
    if name == "stage" {
        return Err(InvalidName::Reserved);
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), InvalidLabel> {
    for (k, v) in labels {
        if !names::is_loose_label_key(k) {
            return Err(InvalidLabel::Key(k.clone()));
        }
        if !v.is_empty() && !names::is_label_value(v) {
            return Err(InvalidLabel::Value {
                key: k.clone(),
                value: v.clone(),
            });
        }
    }
    Ok(())
}

mod argocd;
mod budgets;
mod durations;
mod namespaces;
mod pods;
mod ui;
use argocd::{validate_argocd, KnownDestinations, RawArgoCdSection};
use budgets::{validate_budgets, RawBudgets};
use durations::{validate_engine, validate_jobs, RawEngine, RawJobs};
use namespaces::check_namespace;
pub use namespaces::{check_namespaces, InvalidNamespace, InvalidNamespaces};
use ui::{validate_ui, RawUi};

#[cfg(test)]
mod tests;
