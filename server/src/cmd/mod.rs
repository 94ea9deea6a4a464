//! The `rollouts-dispatch` command line: `serve`, `agent`, `token issue`, `work-keys`, `destinations`, `run`,
//! `doctor` (with `leftovers`: Jobs older than the retention), `logs` (a run's full log),
//! `install-plugin` (the plugin handed to the Rollouts controller by an init container). Each subcommand owns its args
//! next to its `run`; the flags several of them share
//! are the [`ConfigArgs`], [`AdminArgs`] and [`ServerArgs`] groups below.

pub mod agent;
pub mod deletions;
pub mod destinations;
pub mod doctor;
pub mod install_plugin;
pub mod leftovers;
pub mod logs;
pub mod run;
pub mod serve;
pub mod sweep;
pub mod token;
pub mod work_keys;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::config::{ConfigFileError, ServerConfig};
pub use crate::runtime::telemetry::LogFormat;

pub use agent::AgentArgs;
pub use destinations::DestinationsArgs;
pub use doctor::DoctorArgs;
pub use install_plugin::InstallPluginArgs;
pub use logs::LogsArgs;
pub use run::RunArgs;
pub use serve::ServeArgs;
pub use token::TokenCommand;
pub use work_keys::WorkKeysArgs;

/// rollouts-dispatch: runs Argo Rollouts / Kargo verification Jobs on the clusters they verify.
#[derive(Debug, Parser)]
#[command(name = "rollouts-dispatch", version)]
pub struct Cli {
    /// Log filter, e.g. `info` or `dispatch_server=debug,info`.
    #[arg(
        long,
        global = true,
        env = "ROLLOUTS_DISPATCH_LOG",
        default_value = "info"
    )]
    pub log_level: String,
    /// `plain` or `json`.
    #[arg(
        long,
        global = true,
        env = "ROLLOUTS_DISPATCH_LOG_FORMAT",
        default_value = "plain"
    )]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: the /v1 API for the plugin, the admin port, the dispatch engine.
    Serve(ServeArgs),
    /// Tokens for agents and plugins.
    #[command(subcommand)]
    Token(TokenCommand),
    /// Print the public keys agents pin (`agent --work-keys`) to check the work the server
    /// signs, from the server's own key flags.
    WorkKeys(WorkKeysArgs),
    /// Run the agent in a cluster that can only dial out: long-polls the server for its
    /// destination's Jobs, runs them in this cluster, reports their state.
    Agent(AgentArgs),
    /// List the server's destinations: source, agent connection state, last contact.
    Destinations(DestinationsArgs),
    /// Evaluate one metric of an AnalysisTemplate against a destination, without Argo: create
    /// the Job, follow it, print the verdict (exit 0 Successful, 1 otherwise, 2 usage/config).
    Run(RunArgs),
    /// Check the configuration and every destination: reachable, caches synced, RBAC.
    Doctor(DoctorArgs),
    /// The whole log of an AnalysisRun's Jobs from the server, kubectl-like (your kubeconfig
    /// token or --token-file; exit 1 with the server's message when it refuses).
    Logs(LogsArgs),
    /// Copy the metric-provider plugin shipped beside this binary into a directory shared with
    /// the Argo Rollouts controller (an init container's job; the controller then loads it from
    /// `file://DIR/rollouts-dispatch-plugin`).
    InstallPlugin(InstallPluginArgs),
}

/// `--config`: the server configuration file (`serve`, `run`, `doctor`).
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// Server configuration file (destinations, policy, …); without it every context of the
    /// kubeconfig is a destination, but nothing is dispatched (the policy denies by default).
    #[arg(
        long = "config",
        value_name = "CONFIG",
        env = "ROLLOUTS_DISPATCH_CONFIG"
    )]
    pub config_file: Option<PathBuf>,
}

impl ConfigArgs {
    /// The configuration: the file, validated, or the embedded default without one.
    pub fn load(&self) -> Result<ServerConfig, ConfigFileError> {
        match &self.config_file {
            Some(path) => ServerConfig::load(path),
            None => Ok(ServerConfig::embedded_default()),
        }
    }
}

/// `--admin-listen` (`serve`, `agent`).
#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Address of /live, /ready and /metrics.
    #[arg(
        long,
        env = "ROLLOUTS_DISPATCH_ADMIN_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,
}

/// `--jwt-key-file` and `--signing-key-file`: the server's keys (`serve`, and `work-keys`, which
/// prints the public keys of the work they sign).
#[derive(Debug, Clone, Args)]
pub struct KeyArgs {
    /// HS256 key file(s) whose JWTs are accepted, one key per file; name two to rotate keys
    /// without a restart. Re-read when they change on disk (every 3 s): a key written into a
    /// file is accepted, and a file emptied or removed holds no key (its key is no longer
    /// accepted); at least one file must hold a key.
    #[arg(
        long = "jwt-key-file",
        env = "ROLLOUTS_DISPATCH_JWT_KEY_FILES",
        value_delimiter = ','
    )]
    pub jwt_key_files: Vec<PathBuf>,
    /// Key file(s) of the HMAC that signs the Job references the server hands out (measurement
    /// metadata `dispatch-ref`); the first file holding a key signs, all verify: name two to
    /// rotate keys without a restart (an empty or absent file holds no key). Every replica needs
    /// the same keys. Default: derived from each --jwt-key-file.
    #[arg(
        long = "signing-key-file",
        env = "ROLLOUTS_DISPATCH_SIGNING_KEY_FILES",
        value_delimiter = ','
    )]
    pub signing_key_files: Vec<PathBuf>,
}

/// `--server`, `--ca-file` and `--insecure-plaintext`: how to reach a rollouts-dispatch server
/// (`agent`, `destinations`).
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// The rollouts-dispatch server's URL, e.g. `https://dispatch.example.com:8443`; `http://`
    /// only to a loopback host or with --insecure-plaintext.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SERVER")]
    pub server: String,
    /// CA certificate(s) (PEM; every one of a bundle, during a CA rotation) of the server,
    /// re-read when the file changes. `agent` trusts only these (pinned, not the system roots);
    /// `destinations` trusts them in addition to the system roots.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Allow an `http://` --server that is not loopback: the token crosses the network in
    /// clear, so only when TLS ends in a sidecar on both sides.
    #[arg(long, env = "ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, dispatch_api::duration::DurationError> {
    dispatch_api::parse_go_duration(s)
}

/// Runs `fut` (which returns the exit code) on a fresh multi-threaded runtime.
fn with_runtime(fut: impl std::future::Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(fut),
        Err(e) => {
            eprintln!("rollouts-dispatch: cannot start the async runtime: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => with_runtime(serve::run(args)),
        Command::Token(command) => token::run(command),
        Command::WorkKeys(args) => work_keys::run(args),
        Command::Run(args) => with_runtime(run::run(args)),
        Command::Doctor(args) => with_runtime(doctor::run(args)),
        Command::Agent(args) => with_runtime(agent::run(args)),
        Command::Destinations(args) => with_runtime(destinations::run(args)),
        Command::Logs(args) => with_runtime(logs::run(args)),
        Command::InstallPlugin(args) => install_plugin::run(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn every_subcommand_has_unique_args() {
        // clap checks a command's definition only when it is built; build them all here, so a
        // clash between a subcommand's args and a shared group fails a test, not a user.
        Cli::command().debug_assert();
        for argv in [
            vec![
                "rollouts-dispatch",
                "run",
                "-f",
                "t.yaml",
                "--config",
                "c.yaml",
            ],
            vec!["rollouts-dispatch", "doctor", "--config", "c.yaml"],
            vec![
                "rollouts-dispatch",
                "serve",
                "--config",
                "c.yaml",
                "--jwt-key-file",
                "k",
            ],
        ] {
            let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let config = match cli.command {
                Command::Run(a) => a.config,
                Command::Doctor(a) => a.config,
                Command::Serve(a) => a.config,
                _ => unreachable!(),
            };
            assert_eq!(
                config.config_file,
                Some(PathBuf::from("c.yaml")),
                "{argv:?}"
            );
        }
        let cli = Cli::try_parse_from([
            "rollouts-dispatch",
            "agent",
            "--server",
            "https://s",
            "--token-file",
            "t",
            "--ca-file",
            "ca.pem",
            "--work-keys",
            "k",
        ])
        .unwrap();
        let Command::Agent(a) = cli.command else {
            unreachable!()
        };
        assert_eq!(a.server.ca_file, Some(PathBuf::from("ca.pem")));
    }
}
