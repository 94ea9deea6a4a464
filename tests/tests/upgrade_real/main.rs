//! `helm upgrade` and `helm rollback` with verifications in flight, as pods on the real node
//! (`make upgrade-real`, issue #32): what a platform team does on release day, with the
//! previous release as it shipped.
//!
//! On one real-node cluster (as `make e2e-real`'s, whose install, agent and example modules this
//! test shares): two server replicas on the Kubernetes store, the previous release's chart (`$ROLLOUTS_DISPATCH_PREVIOUS_CHART`, from this
//! repository's history) and image (`$ROLLOUTS_DISPATCH_PREVIOUS_IMAGE`, that release's own `make
//! image`) installed with `helm install` for the server and the agent, and the controller's
//! plugin from that image's init container. Then, in [`flight`]:
//!
//! 1. four runs in flight (a passing and a failing check on the direct destination `in-cluster`
//!    and on the agent's `edge-1`, each a container that sleeps before its verdict), the one-time
//!    CRD step of docs/upgrading.md run as written, `helm upgrade` of the server and then the
//!    agent to this chart and image; each run must end with its planned verdict, and must still
//!    have been running when both upgrades were done;
//! 2. four more in flight, `helm rollback` of the agent and then the server to their first
//!    revision (the previous release); the same checks, and the CRDs (which revision 1 did not
//!    own as templates) must still exist: the chart's `helm.sh/resource-policy: keep`.
//!
//! Throughout: one Job per run (a metadata watch of every Job of ours), and none left once the
//! runs are deleted (as Kargo deletes old verifications) and the sweep (every 20 s) has passed. The plugin stays the previous
//! release's (a controller restart is the user's separate step, docs/upgrading.md step 4), so
//! phase 1 also runs an older plugin against a newer server.
//!
//! `#[ignore]`d: `make upgrade-real` runs it with `--ignored` (as root). Its last line (also in
//! `$SUMMARY_FILE`) is
//! `upgrade: from=… upgraded_in_flight=N/N rolled_back_in_flight=N/N duplicate_jobs=0 leftover_jobs=0 crds_kept=yes`.

#[path = "../e2e_real/agent.rs"]
#[allow(dead_code)]
mod agent;
#[path = "../e2e_real/examples.rs"]
#[allow(dead_code)]
mod examples;
mod flight;
#[path = "../e2e_real/install.rs"]
#[allow(dead_code)]
mod install;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_tests::cluster::argo::apply_namespace;
use dispatch_tests::cluster::{Cluster, ClusterOptions};
use dispatch_tests::invariants::JobWatch;
use dispatch_tests::kargo::{Freight, PROJECT};
use dispatch_tests::summary;
use serde_json::json;

use install::{JOB_NAMESPACE, RELEASE_NAMESPACE, ROLLOUTS_NAMESPACE, WEB_NAMESPACE};

/// The tag the previous release's image is pushed under (both releases are version 0.1.0).
const PREVIOUS_TAG: &str = "0.1.0-previous";
/// The server release (docs/upgrading.md's commands name it).
const RELEASE: &str = "rollouts-dispatch";

fn env_path(name: &str) -> Result<PathBuf> {
    let path = std::env::var_os(name)
        .map(PathBuf::from)
        .with_context(|| format!("{name} is not set: run `make upgrade-real`"))?;
    ensure!(path.exists(), "{name}={} does not exist", path.display());
    Ok(path)
}

/// Waits until the server's and the agent's Deployments both run `image` and are available.
async fn both_run(cluster: &Cluster, image: &str) -> Result<()> {
    flight::expect_image(cluster, RELEASE_NAMESPACE, RELEASE, image).await?;
    flight::expect_image(cluster, agent::NAMESPACE, &agent::deployment(), image).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs root and the real-node pieces: run `make upgrade-real`"]
async fn helm_upgrade_and_rollback_with_runs_in_flight() -> Result<()> {
    let previous = std::env::var("ROLLOUTS_DISPATCH_PREVIOUS").unwrap_or_default();
    let previous_chart = env_path("ROLLOUTS_DISPATCH_PREVIOUS_CHART")?;
    let previous_layout = env_path("ROLLOUTS_DISPATCH_PREVIOUS_IMAGE")?;
    let mut options = ClusterOptions::new("upgrade");
    options.real_node = true;
    options.ready_timeout = Duration::from_secs(240);
    let cluster = Cluster::start_with(options).await?;
    println!("upgrade: node ready ({})", cluster.dir().display());
    let client = cluster.client().await?;

    let current_image = install::push_our_image(&cluster)?;
    let registry = cluster
        .node
        .as_ref()
        .and_then(|n| n.registry.as_ref())
        .context("the node's registry")?;
    let previous_image = format!("ghcr.io/rollouts-dispatch/rollouts-dispatch:{PREVIOUS_TAG}");
    registry.push(&previous_layout, &previous_image)?;
    for ns in [
        PROJECT,
        JOB_NAMESPACE,
        WEB_NAMESPACE,
        ROLLOUTS_NAMESPACE,
        install::ARGOCD_NAMESPACE,
        agent::NAMESPACE,
        agent::JOB_NAMESPACE,
    ] {
        apply_namespace(&client, ns).await?;
    }

    // The previous release, as its users installed it: its chart, its image, its plugin; two
    // replicas on the Kubernetes store, as a platform team runs it (with the default in-memory
    // store a restart forgets the records of the agent's finished Jobs, which then wait for
    // their `ttlSecondsAfterFinished`: docs/air-gapped.md). The sweep runs every 20 s, so that
    // the Jobs of deleted runs are seen gone within the test (the previous chart's schema has
    // no `config.jobs`, so the retention stays the default 24h).
    let mut values = install::chart_values(PROJECT);
    values["server"] = json!({"sweepOrphansEvery": "20s", "replicas": 2});
    values["agents"]["store"] = json!("kubernetes");
    let mut previous_values = values.clone();
    previous_values["image"] = json!({"tag": PREVIOUS_TAG});
    install::helm_release(
        &cluster,
        "install",
        RELEASE,
        &previous_chart,
        RELEASE_NAMESPACE,
        &previous_values,
    )?;
    install::install_controller(&cluster, Some(&previous_image)).await?;
    let (_, agent_values) =
        agent::install_from(&cluster, &previous_chart, Some(PREVIOUS_TAG)).await?;
    println!("upgrade: {previous} installed: server, agent and plugin on {previous_image}");

    examples::install_my_app(&cluster)?;
    install::wait_available(&cluster, "my-app", "my-app", Duration::from_secs(120)).await?;
    let freight = Freight::create(&client).await?;
    let runs = examples::project_runs(&cluster).await?;
    let jobs = JobWatch::start(vec![("real", client.clone())]);
    let mut flights = flight::Flights::new(runs, freight, jobs);

    // 1. Upgrade: the CRD step of docs/upgrading.md, then the server, then the agent.
    let upgrade = flights.launch(1).await?;
    flight::run_upgrading_doc_crd_step(&cluster)?;
    install::helm_release(
        &cluster,
        "upgrade",
        RELEASE,
        &install::our_chart(),
        RELEASE_NAMESPACE,
        &values,
    )?;
    install::helm_release(
        &cluster,
        "upgrade",
        agent::RELEASE,
        &install::our_chart(),
        agent::NAMESPACE,
        &agent_values,
    )?;
    both_run(&cluster, &current_image).await?;
    let upgraded = flights.land(&upgrade, "upgrade").await?;
    let keep = flight::crds_kept(&client).await?;
    ensure!(
        keep,
        "after the upgrade the CRDs do not carry the chart's keep policy"
    );

    // 2. Rollback to the previous release: the agent, then the server.
    let rollback = flights.launch(2).await?;
    for (release, namespace) in [
        (agent::RELEASE, agent::NAMESPACE),
        (RELEASE, RELEASE_NAMESPACE),
    ] {
        install::helm(
            &cluster,
            &[
                "rollback",
                release,
                "1",
                "--namespace",
                namespace,
                "--wait",
                "--timeout",
                "4m",
            ],
        )?;
    }
    both_run(&cluster, &previous_image).await?;
    let rolled_back = flights.land(&rollback, "rollback").await?;
    let crds_kept = flight::crds_kept(&client).await?;

    let duplicates = flights.duplicate_jobs();
    flights.delete_runs().await?;
    let leftovers = flight::leftover_jobs(&client, Duration::from_secs(240)).await?;
    let total = upgrade.len();
    let line = format!(
        "upgrade: from={previous} upgraded_in_flight={upgraded}/{total} rolled_back_in_flight={rolled_back}/{} duplicate_jobs={duplicates} leftover_jobs={leftovers} crds_kept={}",
        rollback.len(),
        if crds_kept { "yes" } else { "no" }
    );
    summary::report(&line)?;
    ensure!(
        upgraded == total && rolled_back == rollback.len(),
        "a run in flight did not end as planned across the upgrade or the rollback"
    );
    ensure!(duplicates == 0, "{duplicates} duplicate Jobs");
    ensure!(
        leftovers == 0,
        "{leftovers} Jobs left after the runs were deleted and the sweep passed"
    );
    ensure!(crds_kept, "the rollback deleted the CRDs");
    Ok(())
}
