//! `dispatch-plugin`: a HashiCorp go-plugin **netrpc** server for Rust.
//!
//! Hosts such as the Argo Rollouts controller load plugins with go-plugin's netrpc protocol: the
//! plugin prints a handshake line, the host connects to a unix socket, runs a yamux session over
//! it, and makes Go `net/rpc` calls whose arguments and replies are Go `encoding/gob` values. This
//! crate implements the plugin side of that contract exactly; it knows nothing about Argo.
//!
//! # Layout
//!
//! * [`gob`]: pure bytes-in/bytes-out gob codec (no tokio).
//! * [`rpc`]: net/rpc headers and the per-stream server loop; implement [`rpc::Service`].
//! * [`yamux`]: the server side of hashicorp/yamux (ACK at once, pings, per-stream windows).
//! * `handshake`, `control`, `broker`: cookie + socket + stdout line; `Control`/`Dispenser`
//!   services; the MuxBroker that gives each dispensed plugin its own stream.
//! * [`serve`]: ties it together; the entry point.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # async fn run(service: Arc<dyn dispatch_plugin::rpc::Service>) -> Result<(), dispatch_plugin::Error> {
//! use dispatch_plugin::{serve, HandshakeConfig, ServeConfig};
//! serve(ServeConfig {
//!     handshake: HandshakeConfig {
//!         protocol_version: 1,
//!         magic_cookie_key: "ARGO_ROLLOUTS_RPC_PLUGIN",
//!         magic_cookie_value: "metricprovider",
//!     },
//!     plugins: vec![("RpcMetricProviderPlugin".into(), service)],
//! })
//! .await
//! # }
//! ```

use std::path::PathBuf;
use std::time::Duration;

mod broker;
mod control;
pub mod gob;
mod handshake;
pub mod rpc;
mod serve;
pub mod yamux;

pub use handshake::{check_cookie, HandshakeConfig, NOT_A_PLUGIN_MESSAGE};
pub use serve::{serve, ServeConfig};

/// Why serving a plugin failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The magic cookie is missing: a person ran the binary, not a plugin host.
    #[error("{}", NOT_A_PLUGIN_MESSAGE)]
    NotAPlugin,
    /// The unix socket could not be created.
    #[error("cannot create the plugin socket in {dir}: {source} (set PLUGIN_UNIX_SOCKET_DIR or TMPDIR to a writable directory)")]
    Listen {
        /// the directory tried
        dir: PathBuf,
        /// the bind error
        source: std::io::Error,
    },
    /// `PLUGIN_UNIX_SOCKET_GROUP` could not be applied.
    #[error("cannot give the plugin socket to group {group:?}: {reason}")]
    SocketGroup {
        /// the group asked for
        group: String,
        /// what went wrong
        reason: String,
    },
    /// The handshake line could not be written.
    #[error("cannot write the handshake line to stdout: {0}")]
    Handshake(std::io::Error),
    /// The host never connected.
    #[error("the host did not connect within {0:?} after the handshake")]
    AcceptTimeout(Duration),
    /// Accepting the host's connection failed.
    #[error("accepting the host connection: {0}")]
    Accept(std::io::Error),
    /// Installing the SIGINT handler failed.
    #[error("installing the SIGINT handler: {0}")]
    Signal(std::io::Error),
}
