//! Kube clients for destinations: config from a kubeconfig, a server URL or Argo CD data, the
//! engine's timeouts, and a request counter on every client; [`follow`]: clients that follow
//! their credential files (a rewritten kubeconfig is used by the next request).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine as _;
use kube::client::ClientBuilder;
use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};
use serde_json::{json, Value};

use crate::config::{Access, DirectAccess, EngineSettings};

mod follow;
pub use follow::{client_of, files_of};

/// Counts the HTTP requests a client sends (the bench's `api_requests_per_lookup`).
#[derive(Debug, Clone, Default)]
pub struct RequestCounter(Arc<AtomicU64>);

impl RequestCounter {
    /// Requests so far.
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl<S> tower::Layer<S> for RequestCounter {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counter: self.0.clone(),
        }
    }
}

/// A service that counts its calls.
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    counter: Arc<AtomicU64>,
}

impl<S, R> tower::Service<R> for Counted<S>
where
    S: tower::Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }
    fn call(&mut self, req: R) -> Self::Future {
        self.counter.fetch_add(1, Ordering::Relaxed);
        self.inner.call(req)
    }
}

/// Why the credentials of an access (or a kubeconfig context) give no config or client. The
/// messages say where the credentials come from and what to fix; the kube error stays the source.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// `Access::Infer` found neither in-cluster credentials nor a kubeconfig.
    #[error(
        "cannot find cluster credentials (no in-cluster service account, no usable $KUBECONFIG \
         or ~/.kube/config): {0}"
    )]
    NoCredentials(#[source] InferConfigError),
    /// A kubeconfig file named in the config cannot be read.
    #[error("cannot read kubeconfig {path}: {source}")]
    ReadKubeconfig {
        /// the file, as shown
        path: String,
        /// the read or parse error
        #[source]
        source: KubeconfigError,
    },
    /// The default kubeconfig (`$KUBECONFIG`, else `~/.kube/config`) cannot be read.
    #[error("cannot read the default kubeconfig ({path}): {source}")]
    ReadDefaultKubeconfig {
        /// `$KUBECONFIG`, else `~/.kube/config`
        path: String,
        /// the read or parse error
        #[source]
        source: KubeconfigError,
    },
    /// A context of a kubeconfig file cannot be used.
    #[error("kubeconfig {path}: {source}")]
    InKubeconfig {
        /// the file, as shown
        path: String,
        /// what is wrong with the context
        #[source]
        source: Box<AccessError>,
    },
    /// The user of the context runs an exec plugin but names no command.
    #[error("exec credentials without a command")]
    ExecWithoutCommand,
    /// The exec plugin's command is not on this machine: it would only fail, obscurely, on
    /// the first request.
    #[error(
        "exec credential command {command:?} is not installed on this server (not found in \
         PATH); install it or use a bearer token{}",
        install_hint_suffix(.install_hint.as_deref())
    )]
    ExecNotInstalled {
        /// the command
        command: String,
        /// the plugin's `installHint`
        install_hint: Option<String>,
    },
    /// kube rejects the named context.
    #[error("context {context:?}: {source}")]
    Context {
        /// the context
        context: String,
        /// why kube rejects it
        #[source]
        source: KubeconfigError,
    },
    /// kube rejects the current context of a kubeconfig.
    #[error(transparent)]
    Kubeconfig(KubeconfigError),
    /// The config is fine but no client can be built from it (TLS setup, proxy).
    #[error("building the client: {0}")]
    Client(#[source] kube::Error),
    /// Reading the credentials again (a changed kubeconfig) did not complete at once, as a
    /// kubeconfig read always has: the client in force stays.
    #[error("reading the credentials again did not complete at once")]
    NotAtOnce,
}

fn install_hint_suffix(hint: Option<&str>) -> String {
    hint.map(|h| format!(" ({})", h.trim())).unwrap_or_default()
}

/// The kube config for `access`; `name` names the kubeconfig entries of a direct access.
pub async fn config_for(access: &Access, name: &str) -> Result<kube::Config, AccessError> {
    match access {
        Access::Infer => kube::Config::infer()
            .await
            .map_err(AccessError::NoCredentials),
        Access::Kubeconfig { path, context } => {
            let (kubeconfig, shown) = read_kubeconfig(path.as_deref())?;
            config_from_kubeconfig(kubeconfig, context.as_deref())
                .await
                .map_err(|e| AccessError::InKubeconfig {
                    path: shown,
                    source: Box::new(e),
                })
        }
        Access::Direct(d) => config_from_kubeconfig(direct_kubeconfig(d, name), Some(name)).await,
    }
}

/// Reads a kubeconfig file (`None`: `$KUBECONFIG`, else `~/.kube/config`); returns it and the
/// path as shown in messages.
pub fn read_kubeconfig(path: Option<&Path>) -> Result<(Kubeconfig, String), AccessError> {
    match path {
        Some(p) => Kubeconfig::read_from(p)
            .map(|k| (k, p.display().to_string()))
            .map_err(|source| AccessError::ReadKubeconfig {
                path: p.display().to_string(),
                source,
            }),
        None => Kubeconfig::read()
            .map(|k| (k, default_kubeconfig_path()))
            .map_err(|source| AccessError::ReadDefaultKubeconfig {
                path: default_kubeconfig_path(),
                source,
            }),
    }
}

fn default_kubeconfig_path() -> String {
    std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into())
}

/// The config for `context` of `kubeconfig` (after checking that an exec command exists).
pub async fn config_from_kubeconfig(
    kubeconfig: Kubeconfig,
    context: Option<&str>,
) -> Result<kube::Config, AccessError> {
    check_exec(&kubeconfig, context)?;
    let options = KubeConfigOptions {
        context: context.map(String::from),
        ..KubeConfigOptions::default()
    };
    kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|source| match context {
            Some(c) => AccessError::Context {
                context: c.to_string(),
                source,
            },
            None => AccessError::Kubeconfig(source),
        })
}

/// An exec credential plugin only fails on the first request, and then obscurely: check now
/// that its command exists.
fn check_exec(kubeconfig: &Kubeconfig, context: Option<&str>) -> Result<(), AccessError> {
    let context = context.or(kubeconfig.current_context.as_deref());
    let user = kubeconfig
        .contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.as_deref());
    let exec = kubeconfig
        .auth_infos
        .iter()
        .find(|a| Some(a.name.as_str()) == user)
        .and_then(|a| a.auth_info.as_ref())
        .and_then(|a| a.exec.as_ref());
    let Some(exec) = exec else { return Ok(()) };
    let Some(command) = exec.command.as_deref() else {
        return Err(AccessError::ExecWithoutCommand);
    };
    if find_command(command).is_some() {
        return Ok(());
    }
    Err(AccessError::ExecNotInstalled {
        command: command.to_string(),
        install_hint: exec.install_hint.clone(),
    })
}

/// The path of `command`: as given when it has a `/`, else the first match in `$PATH`.
pub fn find_command(command: &str) -> Option<PathBuf> {
    if command.contains('/') {
        let p = PathBuf::from(command);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

/// A kubeconfig with one cluster, user and context called `name`.
pub fn single_kubeconfig(
    name: &str,
    cluster: Value,
    user: Value,
    namespace: Option<&str>,
) -> Kubeconfig {
    let mut context = json!({"cluster": name, "user": name});
    if let Some(ns) = namespace {
        context["namespace"] = ns.into();
    }
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": context}],
        "current-context": name,
    });
    // Every field above is a plain string or object of the kubeconfig schema.
    serde_json::from_value(doc).unwrap_or_default()
}

fn direct_kubeconfig(d: &DirectAccess, name: &str) -> Kubeconfig {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s.as_bytes());
    let path = |p: &PathBuf| p.display().to_string();
    let mut cluster = serde_json::Map::new();
    cluster.insert("server".into(), d.server.clone().into());
    if let Some(ca) = &d.ca_data {
        cluster.insert("certificate-authority-data".into(), b64(ca).into());
    }
    if let Some(f) = &d.ca_file {
        cluster.insert("certificate-authority".into(), path(f).into());
    }
    if d.insecure {
        cluster.insert("insecure-skip-tls-verify".into(), true.into());
    }
    if let Some(n) = &d.tls_server_name {
        cluster.insert("tls-server-name".into(), n.clone().into());
    }
    let mut user = serde_json::Map::new();
    if let Some(t) = &d.token {
        user.insert("token".into(), t.expose().into());
    }
    if let Some(f) = &d.token_file {
        user.insert("tokenFile".into(), path(f).into());
    }
    if let Some(c) = &d.cert_data {
        user.insert("client-certificate-data".into(), b64(c).into());
    }
    if let Some(k) = &d.key_data {
        user.insert("client-key-data".into(), b64(k.expose()).into());
    }
    if let Some(f) = &d.cert_file {
        user.insert("client-certificate".into(), path(f).into());
    }
    if let Some(f) = &d.key_file {
        user.insert("client-key".into(), path(f).into());
    }
    single_kubeconfig(name, Value::Object(cluster), Value::Object(user), None)
}

/// The `User-Agent` of every request the server sends to a Kubernetes API server.
pub const USER_AGENT: &str = concat!("rollouts-dispatch/", env!("CARGO_PKG_VERSION"));

/// Applies the engine's timeouts and builds a client that counts its requests.
pub fn client(
    mut config: kube::Config,
    settings: &EngineSettings,
    counter: &RequestCounter,
) -> Result<kube::Client, AccessError> {
    config.connect_timeout = Some(settings.connect_timeout);
    // Watches are long reads: their liveness is `crate::watch`'s stall bound (a list, a watch
    // request or the wait for the next event past `watch::STALL` is dropped and relisted);
    // every other call is bounded by `request_timeout` in the engine.
    config.read_timeout = None;
    // Named in every API server's audit log, beside the controllers that write there.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    let builder = ClientBuilder::try_from(config).map_err(AccessError::Client)?;
    Ok(builder.with_layer(counter).build())
}

/// Whether an API error is worth retrying (the destination may recover) or permanent.
pub fn is_transient(err: &kube::Error) -> bool {
    match err {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// A readable, single-line description of an API error.
pub fn describe(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(s) => {
            let reason = if s.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.reason)
            };
            format!("{}{reason}, HTTP {}", s.message, s.code)
        }
        other => {
            // Service errors wrap the interesting cause (refused, timed out, TLS) deep down.
            let mut text = other.to_string();
            let mut source = std::error::Error::source(other);
            while let Some(s) = source {
                let s_text = s.to_string();
                if !text.contains(&s_text) {
                    text = format!("{text}: {s_text}");
                }
                source = s.source();
            }
            // hyper-timeout's wording for the connect timeout.
            text.replace('\n', " ")
                .replace("deadline has elapsed", "connect timed out")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SecretValue;

    #[tokio::test]
    async fn direct_access_becomes_a_config() {
        let d = DirectAccess {
            server: "https://10.1.2.3:6443".into(),
            token: Some(SecretValue::new("tok")),
            insecure: true,
            ..DirectAccess::default()
        };
        let c = config_for(&Access::Direct(Box::new(d)), "edge")
            .await
            .unwrap();
        assert_eq!(c.cluster_url.to_string(), "https://10.1.2.3:6443/");
        assert!(c.accept_invalid_certs);
        assert_eq!(c.default_namespace, "default");
    }

    #[tokio::test]
    async fn a_missing_exec_command_is_named() {
        let kc = single_kubeconfig(
            "eks",
            json!({"server": "https://example.invalid"}),
            json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "argocd-k8s-auth-missing", "args": ["aws"],
                            "installHint": "install argocd-k8s-auth"}}),
            None,
        );
        let e = config_from_kubeconfig(kc, Some("eks"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"argocd-k8s-auth-missing\" is not installed"),
            "{e}"
        );
        assert!(e.contains("install argocd-k8s-auth"), "{e}");
        assert!(find_command("sh").is_some());
    }

    #[tokio::test]
    async fn missing_files_are_named() {
        let e = config_for(
            &Access::Kubeconfig {
                path: Some("/nonexistent/kc".into()),
                context: None,
            },
            "x",
        )
        .await
        .unwrap_err();
        assert!(matches!(e, AccessError::ReadKubeconfig { .. }), "{e:?}");
        assert!(e.to_string().contains("/nonexistent/kc"), "{e}");
    }
}
