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
//! * [`config`]: the plugin block of an AnalysisTemplate, validated into [`config::JobConfig`].
//! * [`selector`]: label selectors for `destinationSelector`.
//! * [`provider`]: the provider itself.
//! * [`log`]: hclog-style JSON logging on stderr.

use std::process::ExitCode;
use std::sync::Arc;

pub mod config;
pub mod log;
pub mod provider;
pub mod rollouts;
pub mod selector;

use dispatch_plugin::{HandshakeConfig, ServeConfig};
use provider::{DispatchProvider, ProviderConfig};
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
    /// Log filter, e.g. `info` or `dispatch_plugin=debug,info`.
    #[arg(long, env = "ROLLOUTS_DISPATCH_LOG", default_value = "info")]
    pub log_level: String,
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
        log_level: _,
    } = args;
    let provider = Arc::new(DispatchProvider::new(ProviderConfig { server }));
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
