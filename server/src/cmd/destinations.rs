//! `rollouts-dispatch destinations`: the server's destinations as it sees them, with the
//! connection state and last contact of each agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_api::v1::{self as api, DestinationInfo};

use super::ServerArgs;

/// `rollouts-dispatch destinations`
#[derive(Debug, Clone, Args)]
pub struct DestinationsArgs {
    /// `--server`, `--ca-file`
    #[command(flatten)]
    pub server: ServerArgs,
    /// File holding a token the server accepts.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Prints the destinations of the server as a table (or JSON); exit 0 when the server answered.
pub(super) async fn run(args: DestinationsArgs) -> ExitCode {
    let DestinationsArgs {
        server:
            ServerArgs {
                server,
                ca_file,
                insecure_plaintext,
            },
        token_file,
        json,
    } = args;
    let client = match ServerClient::new(&ClientConfig {
        server,
        token_file,
        ca_file,
        ca_only: false,
        insecure_plaintext,
        timeout: Duration::from_secs(20),
    }) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rollouts-dispatch destinations: {e}");
            return ExitCode::from(2);
        }
    };
    let rows: Vec<DestinationInfo> = match client.get(api::DESTINATIONS).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "rollouts-dispatch destinations: {} answered: {e}",
                client.server()
            );
            return ExitCode::FAILURE;
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).unwrap_or_default()
        );
    } else {
        print!("{}", table(&rows));
    }
    ExitCode::SUCCESS
}

/// The rows as an aligned table.
pub fn table(rows: &[DestinationInfo]) -> String {
    let mut lines = vec![[
        "NAME".to_string(),
        "SOURCE".into(),
        "CONNECTED".into(),
        "LAST-CONTACT".into(),
        "NAMESPACE".into(),
        "LABELS".into(),
        "WARNINGS".into(),
    ]];
    for r in rows {
        let labels: Vec<String> = r.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        lines.push([
            r.name.clone(),
            r.source.clone(),
            if r.connected { "yes" } else { "no" }.into(),
            r.last_contact.clone().unwrap_or_else(|| "-".into()),
            r.default_namespace.clone(),
            if labels.is_empty() {
                "-".into()
            } else {
                labels.join(",")
            },
            r.warnings.join("; "),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for l in &lines {
        let cells: Vec<String> = l
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_agent_connections() {
        let rows = vec![
            DestinationInfo {
                name: "cluster-a".into(),
                source: "config".into(),
                default_namespace: "default".into(),
                connected: true,
                ..Default::default()
            },
            DestinationInfo {
                name: "cluster-b".into(),
                source: "agent".into(),
                default_namespace: "verify".into(),
                connected: false,
                last_contact: Some("2026-12-01T05:00:00Z".into()),
                labels: [("env".to_string(), "edge".to_string())].into(),
                warnings: vec!["insecure: TLS".into()],
            },
        ];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("NAME       SOURCE  CONNECTED"), "{t}");
        assert!(
            lines[2].contains(
                "agent   no         2026-12-01T05:00:00Z  verify     env=edge  insecure: TLS"
            ),
            "{t}"
        );
    }
}
