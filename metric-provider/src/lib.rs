//! `dispatch-metric-provider`: the Argo Rollouts metric-provider plugin `rollouts-dispatch-plugin`.
//!
//! The unmodified Argo Rollouts controller loads the binary over go-plugin netrpc (see
//! `dispatch-plugin`) and calls it for every metric whose provider is `plugin:
//! rollouts-dispatch/job`.
//!
//! # Layout
//!
//! * [`rollouts`]: Argo's RPC names and types, the [`rollouts::MetricProvider`] trait and the
//!   net/rpc `Plugin` service.
//! * [`provider`]: the provider: local validation of the plugin block
//!   ([`dispatch_api::JobConfig`]), then the server through [`dispatch_api::client`].
//! * [`resume`]: the resume hints: a measurement resumes as soon as its Job ends.
//! * [`log`]: hclog-style JSON logging on stderr.

use std::process::ExitCode;
use std::sync::Arc;

pub mod log;
pub mod provider;
pub mod resume;
pub mod rollouts;

use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_plugin::{HandshakeConfig, ServeConfig};
use provider::{DispatchProvider, ProviderConfig};
use resume::Resumer;
use rollouts::PluginService;

/// This build's version, reported in metric metadata.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Command-line arguments (`args` in `argo-rollouts-config`) and their environment fallbacks.
#[derive(Debug, clap::Parser)]
#[command(
    name = "rollouts-dispatch-plugin",
    version,
    about = "Argo Rollouts metric-provider plugin of rollouts-dispatch"
)]
pub struct Args {
    /// URL of the rollouts-dispatch server.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SERVER")]
    pub server: Option<String>,
    /// File with the bearer token for the server, re-read on every request (a projected
    /// ServiceAccount token with audience `rollouts-dispatch`, or a JWT from `rollouts-dispatch token issue`).
    #[arg(long, env = "ROLLOUTS_DISPATCH_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// PEM file with the CA that signed the server's certificate (in addition to the system
    /// roots: the server may sit behind an ingress with a public certificate); every certificate
    /// of a bundle is trusted, and the file is read again when it changes (a CA rotation).
    #[arg(long, env = "ROLLOUTS_DISPATCH_CA_FILE")]
    pub ca_file: Option<std::path::PathBuf>,
    /// Allow an `http://` --server that is not loopback: the token crosses the network in
    /// clear, so only when TLS ends in a sidecar on both sides.
    #[arg(long, env = "ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// How long a server outage may last before measurements turn `Error` (Go duration).
    #[arg(long, env = "ROLLOUTS_DISPATCH_OUTAGE_DEADLINE", default_value = "10m", value_parser = parse_duration)]
    pub outage_deadline: std::time::Duration,
    /// The longest wait between two checks of a running measurement (Go duration): how late a
    /// finished Job can be noticed.
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_RESUME_INTERVAL", default_value = "3s", value_parser = parse_duration)]
    pub max_resume_interval: std::time::Duration,
    /// Follow the server's resume hints and resume a measurement as soon as its Job ends, by
    /// moving its `resumeAt` with the controller's own credentials (`false`: every
    /// `--max-resume-interval`).
    #[arg(long, env = "ROLLOUTS_DISPATCH_RESUME_HINTS", default_value_t = true, action = clap::ArgAction::Set)]
    pub resume_hints: bool,
    /// While hints flow, the longest wait between two checks of a running measurement (Go
    /// duration): how late a verdict a hint does not announce (an image that cannot be pulled)
    /// is noticed.
    #[arg(long, env = "ROLLOUTS_DISPATCH_RESUME_SAFETY_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub resume_safety_interval: std::time::Duration,
    /// The controller's Kubernetes API server, for the resume hints (default: in cluster,
    /// `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`).
    #[arg(long, env = "ROLLOUTS_DISPATCH_KUBE_API_SERVER")]
    pub kube_api_server: Option<String>,
    /// Bearer token file for `--kube-api-server` (default: the pod's ServiceAccount token, the
    /// controller's).
    #[arg(long, env = "ROLLOUTS_DISPATCH_KUBE_TOKEN_FILE")]
    pub kube_token_file: Option<std::path::PathBuf>,
    /// CA file of `--kube-api-server` (default: the pod's ServiceAccount CA).
    #[arg(long, env = "ROLLOUTS_DISPATCH_KUBE_CA_FILE")]
    pub kube_ca_file: Option<std::path::PathBuf>,
    /// Timeout of one request to the server (Go duration).
    #[arg(long, env = "ROLLOUTS_DISPATCH_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: std::time::Duration,
    /// Log filter, e.g. `info` or `dispatch_plugin=debug,info`.
    #[arg(long, env = "ROLLOUTS_DISPATCH_LOG", default_value = "info")]
    pub log_level: String,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, dispatch_api::duration::DurationError> {
    dispatch_api::parse_go_duration(s)
}

/// The go-plugin handshake Argo Rollouts uses for metric providers.
pub const HANDSHAKE: HandshakeConfig = HandshakeConfig {
    protocol_version: 1,
    magic_cookie_key: rollouts::MAGIC_COOKIE_KEY,
    magic_cookie_value: rollouts::MAGIC_COOKIE_VALUE,
};

/// Runs the plugin until the controller quits it; returns the process exit code.
pub fn run(args: Args) -> ExitCode {
    if let Err(e) = dispatch_plugin::check_cookie(&HANDSHAKE) {
        // A person started the binary: say so in go-plugin's words, on stderr only.
        eprintln!("{e}");
        return ExitCode::from(1);
    }
    let Args {
        server,
        token_file,
        ca_file,
        insecure_plaintext,
        outage_deadline,
        request_timeout,
        max_resume_interval,
        resume_hints,
        resume_safety_interval,
        kube_api_server,
        kube_token_file,
        kube_ca_file,
        log_level: _,
    } = args;
    let client = match server {
        None => None,
        Some(server) => match ServerClient::new(&ClientConfig {
            server,
            token_file,
            ca_file,
            ca_only: false,
            insecure_plaintext,
            timeout: request_timeout,
        }) {
            Ok(c) => Some(c),
            Err(e) => {
                // Bad plugin args: say so in the controller log and refuse to start, naming the flag.
                tracing::error!(error = %e, "invalid plugin configuration in argo-rollouts-config args");
                return ExitCode::from(1);
            }
        },
    };
    let kube = resume::KubeAccess {
        server: kube_api_server,
        token_file: kube_token_file,
        ca_file: kube_ca_file,
    };
    let resumer = match (&client, resume_hints) {
        (Some(server), true) => match kube.client(request_timeout) {
            Ok(kube) => Some(Arc::new(Resumer::new(
                server.clone(),
                kube,
                resume_safety_interval,
                request_timeout,
            ))),
            Err(why) => {
                tracing::warn!(%why, "no resume hints: measurements resume every --max-resume-interval");
                None
            }
        },
        _ => None,
    };
    let provider = Arc::new(DispatchProvider::new(ProviderConfig {
        client,
        outage_deadline,
        max_resume_interval,
        resumer: resumer.clone(),
    }));
    // One thread is plenty: every call is I/O-bound, and a small footprint matters inside the controller.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(1);
        }
    };
    tracing::info!(version = VERSION, "rollouts-dispatch-plugin started");
    if let Some(r) = resumer {
        runtime.spawn(r.follow());
    }
    let served = runtime.block_on(dispatch_plugin::serve(ServeConfig {
        handshake: HANDSHAKE,
        plugins: vec![(
            rollouts::DISPENSE_NAME.to_string(),
            Arc::new(PluginService::new(provider)),
        )],
    }));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "plugin stopped");
            ExitCode::from(1)
        }
    }
}
