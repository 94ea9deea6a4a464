//! `rollouts-dispatch token issue`: prints a signed JWT for an agent or a plugin.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;

use super::parse_duration;
use crate::token::{issue_token_for, read_key};

/// `rollouts-dispatch token …`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Print a signed JWT: for an agent with --destination, else for a plugin.
    Issue {
        /// Bind the token to this destination (agent tokens).
        #[arg(long)]
        destination: Option<String>,
        /// Bind the token to this Kargo project (a glob over AnalysisRun namespaces); repeat for
        /// several; `'*'` for the Rollouts controller, which serves every namespace. Required
        /// for a plugin token: the server refuses one without projects.
        #[arg(
            long = "project",
            conflicts_with = "destination",
            required_unless_present = "destination"
        )]
        projects: Vec<String>,
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

/// Runs `rollouts-dispatch token …`; returns the exit code.
pub(super) fn run(command: TokenCommand) -> ExitCode {
    let TokenCommand::Issue {
        destination,
        projects,
        subject,
        ttl,
        key_file,
    } = command;
    {
        let subject = subject.unwrap_or_else(|| {
            destination
                .as_ref()
                .map_or("plugin".into(), |d| format!("agent:{d}"))
        });
        let projects = (!projects.is_empty()).then_some(projects.as_slice());
        let issued = read_key(&key_file)
            .and_then(|key| issue_token_for(&key, &subject, destination.as_deref(), projects, ttl));
        match issued {
            Ok((token, claims)) => {
                eprintln!(
                    "token id {} for {} ({}) expires at Unix time {}",
                    claims.jti,
                    claims.sub,
                    claims
                        .projects
                        .as_ref()
                        .map_or("no project: an agent".into(), |p| format!(
                            "projects {}",
                            p.join(", ")
                        )),
                    claims.exp
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
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::TokenCommand;

    /// `rollouts-dispatch token issue --key-file k` with `args`.
    fn issue(args: &[&str]) -> Result<Cli, clap::Error> {
        let head = ["rollouts-dispatch", "token", "issue", "--key-file", "k"];
        Cli::try_parse_from(head.iter().chain(args))
    }

    #[test]
    fn project_is_repeatable_and_not_for_agent_tokens() {
        let cli = issue(&["--project", "team-a", "--project", "team-b-*"]).unwrap();
        let Command::Token(TokenCommand::Issue { projects, .. }) = cli.command else {
            panic!("token issue")
        };
        assert_eq!(projects, vec!["team-a", "team-b-*"]);
        let e = issue(&["--destination", "edge", "--project", "team-a"]).unwrap_err();
        assert!(e.to_string().contains("cannot be used with"), "{e}");
        // A plugin token names its projects (#27): none would be refused by the server.
        let e = issue(&[]).unwrap_err();
        assert!(e.to_string().contains("--project"), "{e}");
        assert!(issue(&["--destination", "edge"]).is_ok());
    }
}
