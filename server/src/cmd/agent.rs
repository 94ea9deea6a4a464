//! `rollouts-dispatch agent`: runs the agent of one destination until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{parse_duration, AdminArgs, ServerArgs};
use crate::podsecurity::Level;

/// `rollouts-dispatch agent`
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// `--server`, `--ca-file`, `--insecure-plaintext`
    #[command(flatten)]
    pub server: ServerArgs,
    /// File holding the agent token (`rollouts-dispatch token issue --destination NAME`);
    /// re-read on every request.
    #[arg(long, env = "ROLLOUTS_DISPATCH_AGENT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// The destination this agent serves; must match the token (default: the token's).
    #[arg(long)]
    pub destination: Option<String>,
    /// `--admin-listen`
    #[command(flatten)]
    pub admin: AdminArgs,
    /// How long one long poll may stay open (Go duration, at most 55s).
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub poll_wait: Duration,
    /// Namespaces where the agent creates and deletes Jobs, comma-separated globs ('*': all);
    /// default: its own, `$POD_NAMESPACE` (it refuses to start without either). Work for any
    /// other namespace is refused and reported, whatever the server asks.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ROLLOUTS_DISPATCH_AGENT_NAMESPACES"
    )]
    pub namespaces: Vec<String>,
    /// Pod Security Standards level of the Jobs it creates: restricted (unset restricted fields
    /// are filled in), baseline or privileged; checked again here whatever the server allowed.
    #[arg(long, default_value = "restricted")]
    pub pod_security: Level,
    /// Service accounts the Jobs' pods may run as, comma-separated exact names.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub service_accounts: Vec<String>,
    /// Let the Jobs' pods mount an API token (`automountServiceAccountToken: true`, projected
    /// service account tokens); without it, `automountServiceAccountToken: false` is set.
    #[arg(long)]
    pub automount_service_account_token: bool,
    /// Carry out the Application sync orders of the server's sync trigger (`POST
    /// /v1/destinations/{d}/applications/{ns}/{name}:sync`): patch the Application's operation
    /// as Argo CD's API does, once per order. Needs `patch` on applications.argoproj.io
    /// (chart value `agent.argocd.sync: true`). Without it a sync order is refused and reported.
    #[arg(long, env = "ROLLOUTS_DISPATCH_AGENT_ARGOCD_SYNC")]
    pub argocd_sync: bool,
}

/// Runs the agent; returns the exit code.
pub(super) async fn run(args: AgentArgs) -> ExitCode {
    let opts = crate::agent::AgentOptions {
        server: args.server.server,
        token_file: args.token_file,
        ca_file: args.server.ca_file,
        insecure_plaintext: args.server.insecure_plaintext,
        destination: args.destination,
        admin_listen: args.admin.admin_listen,
        poll_wait: args.poll_wait.min(Duration::from_secs(u64::from(
            dispatch_api::agent::MAX_WAIT_SECONDS,
        ))),
        namespaces: args.namespaces,
        pod_security: args.pod_security,
        service_accounts: args.service_accounts,
        automount_service_account_token: args.automount_service_account_token,
        argocd_sync: args.argocd_sync,
        allowlists: Default::default(),
    };
    match crate::agent::run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Rendered here, once: the error, then each source whose text the line does not
            // hold yet (a message that quotes its source is not followed by it again).
            tracing::error!(error = %crate::http::Chain(&e), "agent stopped");
            ExitCode::FAILURE
        }
    }
}
