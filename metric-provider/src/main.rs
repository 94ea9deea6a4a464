//! `rollouts-dispatch-plugin`: the Argo Rollouts metric-provider plugin binary.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = dispatch_metric_provider::Args::parse();
    dispatch_metric_provider::log::init(&args.log_level);
    let code = dispatch_metric_provider::run(args);
    // Exit right away: the runtime may still hold tasks for streams the host has already dropped.
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 });
}
