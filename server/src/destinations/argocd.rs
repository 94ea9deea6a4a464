//! Argo CD cluster Secrets as destinations, watched live on the cluster each Argo CD instance
//! runs on (the control plane, or the instance's `kubeconfig`/`destination`).
//!
//! A Secret labelled `argocd.argoproj.io/secret-type: cluster` holds `name`, `server` and a
//! `config` JSON (`bearerToken`, `username`/`password`, `tlsClientConfig`, `awsAuthConfig`,
//! `execProviderConfig`), as Argo CD's `SecretToCluster` reads it. Argo CD's implicit
//! `in-cluster` destination exists on the control plane (unless disabled), reached with this
//! server's own credentials and limited to `argocd.inClusterNamespaces`; an instance with
//! `kubeconfig` registers its own cluster under its name instead ([`home_spec`]).
//! Secret labels become destination labels; annotation `rollouts-dispatch.io/namespace` sets the
//! default namespace, and `rollouts-dispatch.io/namespaces` (comma-separated) limits the
//! destination to those namespaces: its caches watch each of them instead of the whole cluster,
//! and a placement elsewhere is refused (`argocd.inClusterNamespaces` does the same for the
//! implicit `in-cluster`).
//!
//! What a Secret may not do here, although Argo CD would accept it (the field meanings are
//! Argo CD's `ClusterConfig`, pkg/apis/application/v1alpha1/types.go:2520-2544 at 37ee0097cf):
//! * borrow this server's credentials: a Secret without credentials of its own is unusable
//!   ([`SecretProblem::NoCredentials`]), where Argo CD would reach
//!   `https://kubernetes.default.svc` with its `rest.InClusterConfig()`; and a Secret for that
//!   server, or one claiming the name `in-cluster`, is ignored ([`watch`]): whoever may write
//!   Secrets in the Argo CD namespace would otherwise get the control plane with the server's
//!   credentials, past `argocd.inClusterNamespaces` (#27);
//! * shadow a configured destination: `destinations`, agents and an instance's own cluster
//!   keep their name against any Secret (`Source::priority`);
//! * run a command of its choosing: `execProviderConfig` (types.go:2486, turned into a client-go
//!   `ExecConfig` at types.go:4025) is refused unless its `command` is listed in
//!   `argocd.execProviders` of the server config, since whoever can write Secrets in the Argo CD
//!   namespace would otherwise run code inside this server, next to every destination's
//!   credentials;
//! * share its `name` with another Secret: both are refused ([`watch`]), as Argo CD refuses a
//!   destination name that several clusters carry (util/argo/argo.go:1116);
//! * turn TLS verification off silently: `tlsClientConfig.insecure` (types.go:2549) is honoured
//!   but logged at load, and shown by `doctor` and `GET /v1/destinations`.

pub mod instances;
mod watch;
pub use watch::{claims, watch, Claims, SharedClaims, WatchedInstance};

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::client::{config_from_kubeconfig, single_kubeconfig, AccessError};
use super::{DestinationSpec, Source, SpecError, IN_CLUSTER_NAME, IN_CLUSTER_SERVER};
use crate::config::{check_namespaces, Access, ArgoCdConfig, ArgoCdLocation};
use crate::job::fnv1a;

/// The label that marks Argo CD cluster Secrets.
pub const SECRET_TYPE_LABEL: &str = "argocd.argoproj.io/secret-type";
/// The selector of Argo CD cluster Secrets.
pub const CLUSTER_SELECTOR: &str = "argocd.argoproj.io/secret-type=cluster";
/// Annotation on a cluster Secret: default namespace of Jobs on that destination.
pub const NAMESPACE_ANNOTATION: &str = "rollouts-dispatch.io/namespace";
/// Annotation on a cluster Secret: the only namespaces (comma-separated) Jobs may run in there.
pub const NAMESPACES_ANNOTATION: &str = "rollouts-dispatch.io/namespaces";

/// Why the credentials of an Argo CD cluster Secret cannot be used, and which Secret to fix.
#[derive(Debug, thiserror::Error)]
#[error("{problem} (fix the {secret})")]
pub struct SecretError {
    /// the Secret
    pub secret: Source,
    /// what is wrong with it
    #[source]
    pub problem: SecretProblem,
}

/// What is wrong with an Argo CD cluster Secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretProblem {
    /// A `data` field is not text.
    #[error("data.{key} is not UTF-8")]
    NotUtf8 {
        /// the field
        key: &'static str,
        /// the decoding error
        #[source]
        source: std::string::FromUtf8Error,
    },
    /// `data.name` is absent or empty.
    #[error("data.name is missing")]
    MissingName,
    /// `data.server` is absent or empty.
    #[error("data.server is missing")]
    MissingServer,
    /// `data.config` is not JSON of Argo CD's `ClusterConfig` shape.
    #[error("data.config is not valid JSON: {0}")]
    ConfigJson(#[source] serde_json::Error),
    /// `proxyUrl` is set; this server does not support proxies.
    #[error("data.config.proxyUrl is not supported by this server")]
    ProxyUrl,
    /// Only one of a client certificate and its key is given.
    #[error("data.config.tlsClientConfig: certData and keyData go together")]
    CertWithoutKey,
    /// A PEM field is not base64.
    #[error("data.config.{field} is not base64: {source}")]
    NotBase64 {
        /// the field under `data.config`
        field: &'static str,
        /// the decoding error
        #[source]
        source: base64::DecodeError,
    },
    /// A PEM field decodes to something else than a PEM block.
    #[error("data.config.{field} is not a base64-encoded PEM block")]
    NotPem {
        /// the field under `data.config`
        field: &'static str,
    },
    /// `execProviderConfig.command` is not in `argocd.execProviders`.
    #[error(
        "data.config.execProviderConfig would run {command:?} inside the rollouts-dispatch server; \
         commands are refused unless listed in argocd.execProviders of the server config \
         (allowed: {allowed})"
    )]
    ExecNotAllowed {
        /// the command the Secret asks for
        command: String,
        /// the allowlist, for the message
        allowed: String,
    },
    /// Several Secrets give the same destination name.
    #[error(
        "{} Argo CD cluster Secrets define destination {name:?}: {}; neither is used (Argo CD \
         itself refuses a destination name several clusters carry): give each a unique \
         data.name, or delete the extra one",
        secrets.len(),
        secrets.join(", ")
    )]
    DuplicateName {
        /// the destination name
        name: String,
        /// `namespace/name` of every Secret that claims it
        secrets: Vec<String>,
    },
    /// Annotation `rollouts-dispatch.io/namespaces` cannot be used.
    #[error("annotation {NAMESPACES_ANNOTATION} {value:?} {source}")]
    Namespaces {
        /// the annotation's value
        value: String,
        /// what is wrong with it
        #[source]
        source: crate::config::InvalidNamespaces,
    },
    /// No credentials of its own: this server never lends its own to a Secret.
    #[error(
        "data.config gives no credentials (bearerToken, username/password, tlsClientConfig \
         certData/keyData, execProviderConfig or awsAuthConfig); rollouts-dispatch never reaches \
         a cluster Secret's server with its own credentials: put a token for it in the Secret (the \
         cluster Argo CD runs on is the implicit in-cluster destination, argocd.inClusterNamespaces)"
    )]
    NoCredentials,
    /// The server `https://kubernetes.default.svc`: the cluster of whoever reads it.
    #[error(
        "data.server is {IN_CLUSTER_SERVER}, the cluster Argo CD runs on: rollouts-dispatch reaches \
         it only as the implicit in-cluster destination (argocd.inCluster, \
         argocd.inClusterNamespaces), never through a Secret"
    )]
    InClusterServer,
    /// The kubeconfig made from the Secret cannot be used (e.g. an exec command is missing).
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// The `config` JSON of a cluster Secret (Argo CD's `ClusterConfig`); unknown fields ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ClusterConfig {
    username: Option<String>,
    password: Option<String>,
    bearer_token: Option<String>,
    #[serde(default)]
    tls_client_config: TlsClientConfig,
    aws_auth_config: Option<AwsAuthConfig>,
    exec_provider_config: Option<ExecProviderConfig>,
    #[serde(default)]
    disable_compression: bool,
    proxy_url: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlsClientConfig {
    #[serde(default)]
    insecure: bool,
    server_name: Option<String>,
    cert_data: Option<String>,
    key_data: Option<String>,
    ca_data: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AwsAuthConfig {
    cluster_name: String,
    #[serde(rename = "roleARN")]
    role_arn: Option<String>,
    profile: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ExecProviderConfig {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    api_version: Option<String>,
    install_hint: Option<String>,
}

/// The destination name a cluster Secret claims: `data.name`, else the Secret's own name.
pub fn destination_name(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("name"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| secret.metadata.name.clone().unwrap_or_default())
}

/// The destination a cluster Secret of instance `settings` defines; credentials that cannot be
/// used (or none at all) give a spec whose `config` is the error.
pub async fn spec_from_secret(secret: &Secret, settings: &ArgoCdConfig) -> DestinationSpec {
    let meta = &secret.metadata;
    let secret_name = meta.name.clone().unwrap_or_default();
    let source = Source::ArgoCd {
        instance: settings.name.clone(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        secret: secret_name.clone(),
    };
    let data = secret.data.clone().unwrap_or_default();
    let text = |key: &'static str| -> Result<Option<String>, SecretProblem> {
        match data.get(key) {
            None => Ok(None),
            Some(b) => String::from_utf8(b.0.clone())
                .map(|s| Some(s.trim().to_string()))
                .map_err(|source| SecretProblem::NotUtf8 { key, source }),
        }
    };
    let labels = meta.labels.clone().unwrap_or_default();
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    let explicit = annotation(NAMESPACE_ANNOTATION);
    let limit = annotation(NAMESPACES_ANNOTATION);
    let (namespaces, limit_problem) = match &limit {
        None => (None, None),
        Some(value) => {
            let list: Vec<String> = value
                .split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect();
            match check_namespaces(Some(&list), explicit.as_deref()) {
                Ok(()) => (Some(list), None),
                Err(source) => (
                    None,
                    Some(SecretProblem::Namespaces {
                        value: value.clone(),
                        source,
                    }),
                ),
            }
        }
    };
    let namespace =
        explicit.unwrap_or_else(|| default_in(namespaces.as_deref(), &settings.default_namespace));
    let mut hashed = serde_json::to_vec(&(&data, &labels, &namespace, &limit)).unwrap_or_default();
    hashed.extend_from_slice(secret_name.as_bytes());
    let fingerprint = fnv1a(&hashed);

    let name = text("name").ok().flatten().filter(|n| !n.is_empty());
    let server = text("server")
        .ok()
        .flatten()
        .map(|s| s.trim_end_matches('/').to_string())
        .unwrap_or_default();
    let config = async {
        if let Some(problem) = limit_problem {
            return Err(problem);
        }
        let name = name.clone().ok_or(SecretProblem::MissingName)?;
        if server.is_empty() {
            return Err(SecretProblem::MissingServer);
        }
        let raw = text("config")?.unwrap_or_default();
        let cfg: ClusterConfig = if raw.is_empty() {
            ClusterConfig::default()
        } else {
            serde_json::from_str(&raw).map_err(SecretProblem::ConfigJson)?
        };
        // Argo CD reads a Secret for this server without credentials as its own cluster
        // (rest.InClusterConfig()); here it never becomes a destination (the watch ignores it
        // first), and nothing lends the server's credentials to a Secret.
        if server == IN_CLUSTER_SERVER {
            return Err(SecretProblem::InClusterServer);
        }
        if !has_credentials(&cfg) {
            return Err(SecretProblem::NoCredentials);
        }
        let (cluster, user) = kubeconfig_entries(&server, &cfg, &settings.exec_providers)?;
        if cfg.tls_client_config.insecure {
            tracing::warn!(destination = %name, secret = %source, server = %server,
                           "tlsClientConfig.insecure: TLS certificates of this destination are not verified");
        }
        config_from_kubeconfig(single_kubeconfig(&name, cluster, user, None), Some(&name))
            .await
            .map_err(SecretProblem::Access)
    }
    .await
    .map_err(|problem| {
        SpecError::from(SecretError {
            secret: source.clone(),
            problem,
        })
    });
    DestinationSpec {
        name: name.unwrap_or(secret_name),
        labels,
        namespace,
        namespaces,
        server,
        source,
        fingerprint,
        config,
        // A changed Secret is seen by the watch and registered again.
        follows: None,
    }
}

/// Whether a Secret's `config` brings credentials of its own.
fn has_credentials(cfg: &ClusterConfig) -> bool {
    let tls = &cfg.tls_client_config;
    cfg.bearer_token
        .as_deref()
        .is_some_and(|t| !t.trim().is_empty())
        || cfg.username.is_some()
        || cfg.password.is_some()
        || cfg.exec_provider_config.is_some()
        || cfg.aws_auth_config.is_some()
        || (tls.cert_data.is_some() && tls.key_data.is_some())
}

fn kubeconfig_entries(
    server: &str,
    cfg: &ClusterConfig,
    allowed_exec: &[String],
) -> Result<(Value, Value), SecretProblem> {
    if cfg.proxy_url.is_some() {
        return Err(SecretProblem::ProxyUrl);
    }
    let mut cluster = Map::new();
    cluster.insert("server".into(), server.into());
    let tls = &cfg.tls_client_config;
    if tls.insecure {
        cluster.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(n) = &tls.server_name {
        cluster.insert("tls-server-name".into(), n.clone().into());
    }
    if cfg.disable_compression {
        cluster.insert("disable-compression".into(), true.into());
    }
    // The PEM blocks are base64 in Argo CD's JSON ([]byte), exactly like kubeconfig's *-data.
    if let Some(ca) = &tls.ca_data {
        check_pem("tlsClientConfig.caData", ca)?;
        cluster.insert("certificate-authority-data".into(), ca.clone().into());
    }
    let mut user = Map::new();
    if let Some(t) = &cfg.bearer_token {
        user.insert("token".into(), t.clone().into());
    }
    if let Some(u) = &cfg.username {
        user.insert("username".into(), u.clone().into());
    }
    if let Some(p) = &cfg.password {
        user.insert("password".into(), p.clone().into());
    }
    match (&tls.cert_data, &tls.key_data) {
        (Some(c), Some(k)) => {
            check_pem("tlsClientConfig.certData", c)?;
            check_pem("tlsClientConfig.keyData", k)?;
            user.insert("client-certificate-data".into(), c.clone().into());
            user.insert("client-key-data".into(), k.clone().into());
        }
        (None, None) => {}
        _ => return Err(SecretProblem::CertWithoutKey),
    }
    if let Some(aws) = &cfg.aws_auth_config {
        // What Argo CD runs for EKS (argocd-k8s-auth must be installed on this server).
        let mut args = vec![
            "aws".to_string(),
            "--cluster-name".into(),
            aws.cluster_name.clone(),
        ];
        if let Some(r) = aws.role_arn.as_ref().filter(|r| !r.is_empty()) {
            args.extend(["--role-arn".to_string(), r.clone()]);
        }
        if let Some(p) = aws.profile.as_ref().filter(|p| !p.is_empty()) {
            args.extend(["--profile".to_string(), p.clone()]);
        }
        user.insert(
            "exec".into(),
            json!({
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": "argocd-k8s-auth",
                "args": args,
                "interactiveMode": "Never",
                "installHint": "awsAuthConfig needs argocd-k8s-auth (from the Argo CD image) in PATH",
            }),
        );
    } else if let Some(exec) = &cfg.exec_provider_config {
        if !allowed_exec.contains(&exec.command) {
            return Err(SecretProblem::ExecNotAllowed {
                command: exec.command.clone(),
                allowed: if allowed_exec.is_empty() {
                    "none".into()
                } else {
                    allowed_exec.join(", ")
                },
            });
        }
        let env: Vec<Value> = exec
            .env
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v}))
            .collect();
        let mut e = json!({
            "apiVersion": exec.api_version.clone()
                .unwrap_or_else(|| "client.authentication.k8s.io/v1beta1".into()),
            "command": exec.command,
            "args": exec.args,
            "env": env,
            "interactiveMode": "Never",
        });
        if let Some(h) = &exec.install_hint {
            e["installHint"] = h.clone().into();
        }
        user.insert("exec".into(), e);
    }
    Ok((Value::Object(cluster), Value::Object(user)))
}

fn check_pem(field: &'static str, b64: &str) -> Result<(), SecretProblem> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .map_err(|source| SecretProblem::NotBase64 { field, source })?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN") {
        return Err(SecretProblem::NotPem { field });
    }
    Ok(())
}

/// The default namespace of a destination limited to `namespaces`: `default` when listed (or
/// when not limited), else the first listed.
fn default_in(namespaces: Option<&[String]>, default: &str) -> String {
    match namespaces {
        Some(list) if !list.iter().any(|n| n == default) => {
            list.first().cloned().unwrap_or_else(|| default.to_string())
        }
        _ => default.to_string(),
    }
}

/// The implicit `in-cluster` destination of the instance on the control plane: the control
/// plane.
pub fn in_cluster_spec(settings: &ArgoCdConfig, control_plane: &kube::Config) -> DestinationSpec {
    let namespaces = settings.in_cluster_namespaces.clone();
    DestinationSpec {
        name: IN_CLUSTER_NAME.into(),
        labels: BTreeMap::new(),
        namespace: default_in(namespaces.as_deref(), &settings.default_namespace),
        namespaces,
        server: IN_CLUSTER_SERVER.into(),
        source: Source::ArgoCdInCluster {
            instance: settings.name.clone(),
        },
        fingerprint: 0,
        config: Ok(control_plane.clone()),
        follows: None,
    }
}

/// The cluster an instance with `kubeconfig` runs on, as a destination named after the
/// instance (`cluster`: the kubeconfig's config, or why it cannot be used).
pub fn home_spec(
    settings: &ArgoCdConfig,
    cluster: Result<kube::Config, std::sync::Arc<AccessError>>,
) -> DestinationSpec {
    let namespaces = settings.in_cluster_namespaces.clone();
    let server = cluster
        .as_ref()
        .map(|c| c.cluster_url.to_string().trim_end_matches('/').to_string())
        .unwrap_or_default();
    DestinationSpec {
        name: settings.name.clone(),
        labels: BTreeMap::new(),
        namespace: default_in(namespaces.as_deref(), &settings.default_namespace),
        namespaces,
        server,
        source: Source::ArgoCdHome {
            instance: settings.name.clone(),
        },
        fingerprint: 0,
        config: cluster.map_err(SpecError::from),
        follows: match &settings.location {
            ArgoCdLocation::Kubeconfig { path, context } => Some(Access::Kubeconfig {
                path: path.clone(),
                context: context.clone(),
            }),
            ArgoCdLocation::ControlPlane | ArgoCdLocation::Destination(_) => None,
        },
    }
}

#[cfg(test)]
mod tests;
