//! `rollouts-dispatch`: the companion server of the rollouts-dispatch Argo Rollouts plugin.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = dispatch_server::cmd::Cli::parse();
    dispatch_server::runtime::telemetry::init(&cli.log_level, cli.log_format);
    dispatch_server::cmd::run(cli)
}
