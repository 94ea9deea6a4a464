//! `rollouts-dispatch logs RUN`: the whole log of an AnalysisRun's Jobs, kubectl-like, from the
//! server's log API (`GET /v1/runs/{namespace}/{name}/logs`), printed as
//! `[destination/pod/container] line` as it arrives.
//!
//! Whose token: `--token-file`, else the current kubeconfig context's user (`token` or
//! `tokenFile`; an `exec` user cannot be run here, so it is an error naming `--token-file`),
//! which the server reviews with the control plane's apiserver; the namespace defaults to the
//! context's, as kubectl's does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dispatch_api::client::{CallError, ClientConfig, ServerClient};
use dispatch_api::logs::{run_logs_path, LogEvent};
use kube::config::{AuthInfo, Kubeconfig};

use super::ServerArgs;

/// How long a log request may run: long enough to follow any measurement to its end
/// (`engine.maxMeasurementDeadline` defaults to 6h).
const STREAM_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// `rollouts-dispatch logs`
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The AnalysisRun.
    #[arg(value_name = "RUN")]
    pub run: String,
    /// Its namespace (the Kargo project); default: the kubeconfig context's, else `default`.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Only this metric's Jobs.
    #[arg(long)]
    pub metric: Option<String>,
    /// Only this destination.
    #[arg(long)]
    pub destination: Option<String>,
    /// Only this container.
    #[arg(long)]
    pub container: Option<String>,
    /// Keep streaming until the containers end.
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// `--server`, `--ca-file`
    #[command(flatten)]
    pub server: ServerArgs,
    /// File holding the bearer token (e.g. `kubectl create token …` output, or a token the
    /// server issued); default: the current kubeconfig context's token.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
}

/// Why the CLI cannot make its request.
#[derive(Debug, thiserror::Error)]
pub enum LogsCliError {
    /// The kubeconfig cannot be read.
    #[error("cannot read the kubeconfig ({0}); pass --token-file and -n")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// The current context has no user with a token.
    #[error(
        "the kubeconfig context {context:?} has {what}; pass --token-file with a token of the \
         control plane (e.g. `kubectl create token <serviceaccount> > token`)"
    )]
    NoToken {
        /// the context
        context: String,
        /// what its user has instead
        what: &'static str,
    },
    /// The token file cannot be read.
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        /// the file
        path: String,
        /// the error
        #[source]
        source: std::io::Error,
    },
}

/// Prints the log; exit 0 when the whole stream was read, 1 when the server refused or the
/// stream broke (with the server's message), 2 for a bad invocation.
pub(super) async fn run(args: LogsArgs) -> ExitCode {
    let (token, namespace) = match credentials(&args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rollouts-dispatch logs: {e}");
            return ExitCode::from(2);
        }
    };
    let client = match ServerClient::new(&ClientConfig {
        server: args.server.server.clone(),
        token_file: None,
        ca_file: args.server.ca_file.clone(),
        ca_only: false,
        insecure_plaintext: args.server.insecure_plaintext,
        timeout: STREAM_TIMEOUT,
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rollouts-dispatch logs: {e}");
            return ExitCode::from(2);
        }
    };
    let path = format!("{}{}", run_logs_path(&namespace, &args.run), query(&args));
    let printed = client
        .get_lines(&path, Some(&token), |line| {
            if line.trim().is_empty() {
                return;
            }
            match serde_json::from_str::<LogEvent>(line) {
                Ok(event) => println!("{}", event.to_text()),
                Err(_) => println!("{line}"),
            }
        })
        .await;
    match printed {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let message = match &e {
                CallError::Rejected(api) => api.message.clone(),
                CallError::Transient(m) | CallError::Busy { message: m, .. } => m.clone(),
            };
            eprintln!(
                "rollouts-dispatch logs: {} answered: {message}",
                client.server()
            );
            ExitCode::FAILURE
        }
    }
}

/// The bearer token and the namespace: the flags first, then the current kubeconfig context.
fn credentials(args: &LogsArgs) -> Result<(String, String), LogsCliError> {
    if let (Some(file), Some(ns)) = (&args.token_file, &args.namespace) {
        return Ok((read_token(file)?, ns.clone()));
    }
    let kubeconfig = Kubeconfig::read().map_err(LogsCliError::Kubeconfig)?;
    let (context_name, context) = current_context(&kubeconfig);
    let namespace = args
        .namespace
        .clone()
        .or_else(|| context.as_ref().and_then(|c| c.namespace.clone()))
        .unwrap_or_else(|| "default".to_string());
    if let Some(file) = &args.token_file {
        return Ok((read_token(file)?, namespace));
    }
    let user = context.and_then(|c| c.user);
    let auth = kubeconfig
        .auth_infos
        .iter()
        .find(|a| Some(&a.name) == user.as_ref())
        .and_then(|a| a.auth_info.clone());
    let token = token_of(auth.as_ref(), &context_name)?;
    Ok((token, namespace))
}

/// The current context's name and settings.
fn current_context(k: &Kubeconfig) -> (String, Option<kube::config::Context>) {
    let name = k.current_context.clone().unwrap_or_default();
    let context = k
        .contexts
        .iter()
        .find(|c| c.name == name)
        .and_then(|c| c.context.clone());
    (name, context)
}

/// The bearer token of a kubeconfig user: `token`, else `tokenFile`.
fn token_of(auth: Option<&AuthInfo>, context: &str) -> Result<String, LogsCliError> {
    let no_token = |what| LogsCliError::NoToken {
        context: context.to_string(),
        what,
    };
    let Some(auth) = auth else {
        return Err(no_token("no user"));
    };
    // `token` is a SecretString that only serde exposes (kube serializes it as the string).
    let json = serde_json::to_value(auth).unwrap_or_default();
    if let Some(t) = json["token"].as_str().filter(|t| !t.trim().is_empty()) {
        return Ok(t.trim().to_string());
    }
    if let Some(file) = &auth.token_file {
        return read_token(&PathBuf::from(file));
    }
    Err(no_token(if auth.exec.is_some() {
        "an exec user (a credential plugin this command does not run)"
    } else if auth.auth_provider.is_some() {
        "an auth-provider user (not run by this command)"
    } else {
        "a user without a token (a client certificate is not a bearer token)"
    }))
}

fn read_token(file: &PathBuf) -> Result<String, LogsCliError> {
    std::fs::read_to_string(file)
        .map(|t| t.trim().to_string())
        .map_err(|source| LogsCliError::TokenFile {
            path: file.display().to_string(),
            source,
        })
}

/// `?metric=…&follow=true` of the set flags (empty without any).
fn query(args: &LogsArgs) -> String {
    let mut pairs: Vec<String> = [
        ("metric", &args.metric),
        ("destination", &args.destination),
        ("container", &args.container),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", encode(v))))
    .collect();
    if args.follow {
        pairs.push("follow=true".into());
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("?{}", pairs.join("&"))
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cmd::{Cli, Command};

    fn parse(argv: &[&str]) -> LogsArgs {
        let mut full = vec!["rollouts-dispatch", "logs"];
        full.extend(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Logs(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn flags_become_the_query() {
        let a = parse(&[
            "uat.1",
            "-n",
            "p",
            "--server",
            "https://s",
            "-f",
            "--metric",
            "a b",
        ]);
        assert_eq!(a.namespace.as_deref(), Some("p"));
        assert_eq!(query(&a), "?metric=a%20b&follow=true");
        let b = parse(&[
            "uat.1",
            "--server",
            "https://s",
            "--container",
            "c",
            "--destination",
            "d",
        ]);
        assert_eq!(query(&b), "?destination=d&container=c");
        assert_eq!(query(&parse(&["r", "--server", "https://s"])), "");
    }

    #[test]
    fn the_kubeconfig_user_gives_the_token_or_the_error_names_token_file() {
        let kubeconfig: Kubeconfig = serde_json::from_value(serde_json::json!({
            "current-context": "cp",
            "contexts": [{"name": "cp", "context": {"cluster": "c", "user": "u", "namespace": "team-a"}}],
            "users": [
                {"name": "u", "user": {"token": "t0ken"}},
                {"name": "e", "user": {"exec": {"command": "gke-gcloud-auth-plugin", "apiVersion": "client.authentication.k8s.io/v1beta1"}}}
            ],
            "clusters": [{"name": "c", "cluster": {"server": "https://cp"}}]
        }))
        .unwrap();
        let (name, ctx) = current_context(&kubeconfig);
        assert_eq!(
            (name.as_str(), ctx.unwrap().namespace.as_deref()),
            ("cp", Some("team-a"))
        );
        let user = |n: &str| {
            kubeconfig
                .auth_infos
                .iter()
                .find(|a| a.name == n)
                .and_then(|a| a.auth_info.clone())
        };
        assert_eq!(token_of(user("u").as_ref(), "cp").unwrap(), "t0ken");
        let e = token_of(user("e").as_ref(), "cp").unwrap_err().to_string();
        assert!(e.contains("exec user") && e.contains("--token-file"), "{e}");
        let e = token_of(None, "cp").unwrap_err().to_string();
        assert!(e.contains("--token-file"), "{e}");
    }
}
