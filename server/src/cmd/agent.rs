//! `rollouts-dispatch agent`: runs the agent of one destination until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{parse_duration, AdminArgs, ServerArgs};

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
    };
    match crate::agent::run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "agent stopped");
            ExitCode::FAILURE
        }
    }
}
