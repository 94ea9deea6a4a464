//! `test-cluster`: start real test clusters by hand and keep them until Ctrl-C.
//!
//! `cargo run -p dispatch-tests --bin test-cluster -- up a b` starts clusters `a` and `b` in
//! parallel, prints each kubeconfig (and the token and server), and stops everything on Ctrl-C
//! or SIGTERM. `--argo` also runs the Argo Rollouts controller on the first cluster, with
//! `--plugin PATH` registering `rollouts-dispatch/job` from that file. The binaries come from
//! `make k8s-bin`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::argo::{ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::start_many;

const USAGE: &str = "usage: test-cluster up [NAME...] [--argo] [--plugin PATH]";

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("up") => {}
        Some("-h" | "--help") | None => {
            println!("{USAGE}");
            return Ok(());
        }
        Some(other) => bail!("unknown command {other:?}; {USAGE}"),
    }
    let mut names = Vec::new();
    let mut argo = false;
    let mut plugin: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--argo" => argo = true,
            "--plugin" => {
                plugin = Some(args.next().context("--plugin needs a path")?.into());
                argo = true;
            }
            flag if flag.starts_with('-') => bail!("unknown flag {flag:?}; {USAGE}"),
            name => names.push(name.to_owned()),
        }
    }
    if names.is_empty() {
        names.push("dev".to_owned());
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut clusters = start_many(&refs).await?;
    for cluster in &clusters {
        println!(
            "cluster {} ready in {:.1}s\n  export KUBECONFIG={}\n  server: {}\n  token: {}\n  logs: {}",
            cluster.name,
            cluster.start_time.as_secs_f64(),
            cluster.kubeconfig.display(),
            cluster.server,
            cluster.token,
            cluster.dir.join("logs").display()
        );
    }
    if argo {
        let plugins = match &plugin {
            Some(path) => vec![MetricPlugin::file("rollouts-dispatch/job", path)?],
            None => Vec::new(),
        };
        let first = clusters.first_mut().context("no cluster")?;
        let rollouts = ArgoRollouts::install(first, &plugins).await?;
        println!(
            "argo rollouts controller running on {}\n  log: {}",
            first.name,
            rollouts.log.display()
        );
    }
    println!("press Ctrl-C to stop");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    drop(clusters);
    println!("stopped");
    Ok(())
}
