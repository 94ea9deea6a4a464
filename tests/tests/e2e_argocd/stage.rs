//! `destination: stage` resolved from Applications that a real Argo CD manages (#29), for the
//! two places an Argo CD of a Kargo install lives (the servers' [`INSTANCES`]):
//!
//! * **on the control plane** (instance `central`, the Stages without a shard): a real Argo CD
//!   there deploys Application `shop-uat` to cluster-a through its cluster Secret for
//!   cluster-a's URL (the hub model); the Job runs on `cluster-a`, the configured destination
//!   for that URL (which outranks the Secret's `cluster-a-argocd`);
//! * **per shard** (instance `edge`, on the direct destination cluster-a, shard `edge`): a real
//!   Argo CD on cluster-a deploys Application `shop-edge` to its own cluster
//!   (`https://kubernetes.default.svc`); the Job runs on that instance's destination,
//!   `cluster-a`. The control plane has no Application `shop-edge`: only reading the shard's
//!   instance can resolve it.
//!
//! Each Stage names its Application in `kargo.akuity.io/argocd-context` as Kargo's
//! `argocd-update` step leaves it ([`create_stage`]), once the real controller has it Synced
//! and Healthy at the pushed commit, as that step waits for. cluster-b and its agent take no
//! part.

use anyhow::{ensure, Context, Result};
use dispatch_server::job::LABEL_DESTINATION;
use dispatch_tests::analysis::{self, phase};
use dispatch_tests::cluster::argocd::{self, apply_cluster_secret, cluster_config};
use dispatch_tests::cluster::argocd_real::{self, AppSpec, ArgoCd, GitRepo, IN_CLUSTER};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::kargo::{create_stage, Verification};
use dispatch_tests::objects::the_one_job;
use dispatch_tests::wait::{eventually, Progress};
use serde_json::json;

use super::{on_scene, record, run_report, shop_manifests, Scene, ARGOCD_TIMEOUT};

/// The servers' `argocd:` (part of the scene's config): `central` on the control plane for the
/// Stages without a shard, with no `in-cluster` (the policy allows `cluster-*` only); `edge` on
/// cluster-a for shard `edge`.
pub(crate) const INSTANCES: &str = "argocd:\n\
    - name: central\n  inCluster: false\n  shards: [\"\"]\n\
    - name: edge\n  destination: cluster-a\n  shards: [\"edge\"]\n";

/// The Secret of central's Argo CD for cluster-a, and the destination the server registers from
/// it (a `cluster-*` name, so that only the ranking below keeps the Job off it).
const SECRET_DESTINATION: &str = "cluster-a-argocd";
/// Where both Stages' Jobs run.
const RESOLVED: &str = "cluster-a";

/// One Stage of the scenario and its Application.
struct StageCase<'a> {
    /// the Stage and its Application
    name: &'a str,
    /// `spec.shard` (and label `kargo.akuity.io/shard`), if any
    shard: Option<&'a str>,
    /// the Argo CD managing the Application, and the cluster it runs on
    argocd: &'a ArgoCd,
    cluster: &'a Cluster,
    /// the Application's `destination.server`
    server: &'a str,
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn destination_stage_resolves_through_the_real_argo_cd_of_the_stages_shard() -> Result<()> {
    on_scene(async |s| {
        let outcome = scenario(s).await;
        record(
            "stage",
            match &outcome {
                Ok(()) => "Successful",
                Err(_) => "failed",
            },
        )?;
        outcome
    })
}

async fn scenario(s: &Scene) -> Result<()> {
    let w = &s.w;
    let (central, edge) = tokio::try_join!(ArgoCd::start(&w.control), ArgoCd::start(&w.a))
        .context("the real Argo CDs of the control plane and of cluster-a")?;
    let control = w.control.client().await?;
    apply_cluster_secret(
        &control,
        "cluster-a",
        SECRET_DESTINATION,
        &w.a.server,
        &cluster_config(&w.a.token, &w.a.ca_pem),
        &[],
    )
    .await?;
    let cases = [
        StageCase {
            name: "shop-uat",
            shard: None,
            argocd: &central,
            cluster: &w.control,
            server: &w.a.server,
        },
        StageCase {
            name: "shop-edge",
            shard: Some("edge"),
            argocd: &edge,
            cluster: &w.a,
            server: IN_CLUSTER,
        },
    ];
    for (i, case) in cases.iter().enumerate() {
        promote(&control, case).await?;
        let ulid = format!("01jargocdstage00000000000{i}");
        let v =
            Verification::new(case.name, &ulid, "unused").routed(json!({"destination": "stage"}));
        let run = s.w.finished(&s.w.submit(&v).await?).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Stage {} verified Successful on {RESOLVED}: {}\n{}",
            case.name,
            run_report(&run),
            case.argocd.log_tail(10)
        );
        let job = the_one_job(&w.a, &[&w.b, &w.control], &analysis::uid(&run))
            .await
            .with_context(|| format!("Stage {}", case.name))?;
        let through = job
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_DESTINATION));
        ensure!(
            through.map(String::as_str) == Some(RESOLVED),
            "the Job of Stage {} went through destination {through:?}, not {RESOLVED} \
             (the configured destination outranks the Argo CD cluster Secret's \
             {SECRET_DESTINATION})",
            case.name
        );
        println!(
            "e2e-argocd: stage {} (shard {:?}) → Application {} of the real Argo CD on {} → \
             {RESOLVED}: Successful",
            case.name,
            case.shard.unwrap_or_default(),
            case.name,
            case.cluster.name
        );
    }
    Ok(())
}

/// What a promotion of `case` leaves: the commit pushed, the Application Synced and Healthy at
/// it (written by the real controller), and the Stage naming it in its Argo CD context.
async fn promote(control: &kube::Client, case: &StageCase<'_>) -> Result<()> {
    let repo: GitRepo = case.argocd.repo(case.name)?;
    let sha = repo.commit(&shop_manifests("v1", json!({}), json!({})), "shop v1")?;
    let spec = AppSpec {
        name: case.name,
        repo_url: repo.url(),
        path: "deploy",
        server: case.server,
        namespace: case.name,
        automated: true,
        create_namespace: true,
    };
    let client = case.cluster.client().await?;
    argocd_real::create_application(&client, &spec).await?;
    let apps = argocd::applications(&client);
    eventually(
        &format!(
            "Argo CD on {} has {} Synced and Healthy at {sha}",
            case.cluster.name, case.name
        ),
        ARGOCD_TIMEOUT,
        || async {
            let app = apps.get(case.name).await?;
            Ok(if argocd_real::synced_healthy_at(&app.data, &sha) {
                Progress::Done(())
            } else {
                Progress::Waiting(app.data["status"].to_string())
            })
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", case.argocd.log_tail(20)))?;
    create_stage(
        control,
        case.name,
        &[(case.name, argocd::NAMESPACE)],
        case.shard,
    )
    .await?;
    Ok(())
}
