//! The `rollouts-dispatch` command line: `serve`, `agent`, `token issue`, `destinations`, `run`,
//! `doctor`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// human-readable lines
    Plain,
    /// one JSON object per line
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the server: the /v1 API for the plugin, the admin port, the dispatch engine.
    Serve(ServeArgs),
    /// Tokens for agents and plugins.
    #[command(subcommand)]
    Token(TokenCommand),
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
}

/// `rollouts-dispatch agent`
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// The rollouts-dispatch server's URL, e.g. `https://dispatch.example.com:8443`.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SERVER")]
    pub server: String,
    /// File holding the agent token (`rollouts-dispatch token issue --destination NAME`);
    /// re-read on every request.
    #[arg(long, env = "ROLLOUTS_DISPATCH_AGENT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// Extra CA certificate (PEM) to trust for the server.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// The destination this agent serves; must match the token (default: the token's).
    #[arg(long)]
    pub destination: Option<String>,
    /// Address of /live, /ready and /metrics.
    #[arg(
        long,
        env = "ROLLOUTS_DISPATCH_ADMIN_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,
    /// How long one long poll may stay open (Go duration, at most 55s).
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub poll_wait: Duration,
}

/// `rollouts-dispatch destinations`
#[derive(Debug, Clone, Args)]
pub struct DestinationsArgs {
    /// The rollouts-dispatch server's URL.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SERVER")]
    pub server: String,
    /// File holding a token the server accepts.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Extra CA certificate (PEM) to trust for the server.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `rollouts-dispatch run`
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The AnalysisTemplate or ClusterAnalysisTemplate YAML file.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// A template argument, `NAME=VALUE`; overrides the template's default. Repeatable.
    #[arg(long = "arg", value_name = "NAME=VALUE", value_parser = parse_arg)]
    pub args: Vec<(String, String)>,
    /// The metric to evaluate; needed when the template has several rollouts-dispatch/job metrics.
    #[arg(long)]
    pub metric: Option<String>,
    /// Server configuration file (destinations, policy, …); without it every context of the
    /// kubeconfig is a destination.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Namespace of the synthetic AnalysisRun (the Kargo project the policy checks).
    #[arg(long, default_value = "default")]
    pub namespace_of_run: String,
    /// Give up (and delete the Jobs) after this long (Go duration).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `rollouts-dispatch doctor`
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// Server configuration file; without it every context of the kubeconfig is a destination.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Bound on waiting for destinations (Go duration).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub timeout: Duration,
}

fn parse_arg(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.trim().is_empty() => {
            Ok((name.trim().to_string(), value.to_string()))
        }
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// `rollouts-dispatch serve`
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Server configuration file (destinations, policy, …); without it every context of the
    /// kubeconfig is a destination.
    #[arg(long, env = "ROLLOUTS_DISPATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the API.
    #[arg(long, env = "ROLLOUTS_DISPATCH_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Address of /live, /ready and /metrics.
    #[arg(
        long,
        env = "ROLLOUTS_DISPATCH_ADMIN_LISTEN",
        default_value = "0.0.0.0:9090"
    )]
    pub admin_listen: SocketAddr,
    /// PEM certificate chain of the API (with --tls-key); without both the API is plain HTTP.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the API.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// HS256 key file(s) whose JWTs are accepted; give two during a key rotation.
    #[arg(
        long = "jwt-key-file",
        env = "ROLLOUTS_DISPATCH_JWT_KEY_FILES",
        value_delimiter = ','
    )]
    pub jwt_key_files: Vec<PathBuf>,
    /// Token ids (`jti`) that are refused.
    #[arg(
        long = "revoked-token",
        env = "ROLLOUTS_DISPATCH_REVOKED_TOKENS",
        value_delimiter = ','
    )]
    pub revoked_tokens: Vec<String>,
    /// Kubernetes users whose ServiceAccount tokens are accepted (checked by TokenReview), e.g.
    /// `system:serviceaccount:argo-rollouts:argo-rollouts`.
    #[arg(
        long = "token-review-allow",
        env = "ROLLOUTS_DISPATCH_TOKEN_REVIEW_ALLOW",
        value_delimiter = ','
    )]
    pub token_review_allow: Vec<String>,
    /// How long to wait for destinations to sync before reporting ready anyway.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sync_timeout: Duration,
    /// Every this long, delete the Jobs whose AnalysisRun no longer exists on the control plane
    /// (needs list on analysisruns there). Off by default: only enable it when no other control
    /// plane's runs create Jobs on the same destinations.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SWEEP_ORPHANS_EVERY", value_parser = parse_duration)]
    pub sweep_orphans_every: Option<Duration>,
}

/// `rollouts-dispatch token …`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a signed JWT: for an agent with --destination, else for a plugin.
    Issue {
        /// Bind the token to this destination (agent tokens).
        #[arg(long)]
        destination: Option<String>,
        /// The subject; default `agent:<destination>` or `plugin`.
        #[arg(long)]
        subject: Option<String>,
        /// Validity (Go duration).
        #[arg(long, default_value = "720h", value_parser = parse_duration)]
        ttl: Duration,
        /// The server's HS256 key file.
        #[arg(long, env = "ROLLOUTS_DISPATCH_JWT_KEY_FILE")]
        key_file: PathBuf,
    },
}

fn parse_duration(s: &str) -> Result<Duration, dispatch_api::duration::DurationError> {
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
        Command::Serve(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the async runtime");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(crate::serve::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "server stopped");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Token(TokenCommand::Issue {
            destination,
            subject,
            ttl,
            key_file,
        }) => {
            let subject = subject.unwrap_or_else(|| {
                destination
                    .as_ref()
                    .map_or("plugin".into(), |d| format!("agent:{d}"))
            });
            let issued = crate::token::read_key(&key_file).and_then(|key| {
                crate::token::issue_token(&key, &subject, destination.as_deref(), ttl)
            });
            match issued {
                Ok((token, claims)) => {
                    eprintln!(
                        "token id {} for {} expires at Unix time {}",
                        claims.jti, claims.sub, claims.exp
                    );
                    println!("{token}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("rollouts-dispatch token issue: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => with_runtime(crate::cmd_run::run(args)),
        Command::Doctor(args) => with_runtime(crate::cmd_doctor::run(args)),
        Command::Agent(args) => with_runtime(async move {
            let opts = crate::agent::AgentOptions {
                server: args.server,
                token_file: args.token_file,
                ca_file: args.ca_file,
                destination: args.destination,
                admin_listen: args.admin_listen,
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
        }),
        Command::Destinations(args) => with_runtime(crate::agent::client::list(
            args.server,
            args.token_file,
            args.ca_file,
            args.json,
        )),
    }
}
