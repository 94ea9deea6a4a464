//! `destination: stage` end to end (issue #18): the server has the control plane and `argocd:`
//! (one Argo CD instance, in `argocd`); on the control plane, Argo CD's real Application CRD, a
//! cluster Secret for cluster-a (destination `cluster-a-argocd`, registered live), an
//! Application deploying to cluster-a's URL, and a Kargo Stage whose
//! `kargo.akuity.io/argocd-context` names that Application, as Kargo's `argocd-update` step
//! leaves it (the `{name, namespace}` of each Application the step updated: akuity/kargo
//! v1.11.2 pkg/promotion/runner/builtin/argocd_updater.go:201-207, written to the Stage by
//! pkg/api/stage.go:236-281). Kargo-shaped runs of that Stage whose block says
//! `destination: stage` (config/analysis-templates/stage.yaml) run their Job on cluster-a,
//! through the configured destination `cluster-a`, which outranks the Secret's for its server.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::v1::{DestinationInfo, DESTINATIONS};
use dispatch_server::job::LABEL_DESTINATION;
use dispatch_tests::analysis::{self, measurement_message, phase};
use dispatch_tests::cluster::argocd::{self, apply_cluster_secret, cluster_config};
use dispatch_tests::kargo::{create_stage, Verification};
use dispatch_tests::objects::job_env;
use dispatch_tests::wait::{eventually, Progress};
use kube::api::{DynamicObject, PostParams};
use serde_json::json;

use crate::{report, side_by_side, the_one_job_on_a};

/// The destination that the Argo CD cluster Secret for cluster-a registers (a `cluster-*` name:
/// the scene's policy allows those).
const ARGOCD_DESTINATION: &str = "cluster-a-argocd";
/// Where the Application's server URL resolves: the scene's configured destination for that
/// server, which outranks an Argo CD cluster Secret for the same server (#27: a Secret never
/// shadows a configured destination, by name or by URL).
const RESOLVED: &str = "cluster-a";
/// The Stage, and the Application its last promotion updated.
const STAGE: &str = "shop-uat";

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_stage_verification_runs_where_the_stages_application_deploys() -> Result<()> {
    side_by_side(async |w| {
        let control = &w.client;
        argocd::install(control).await?;
        let config = cluster_config(&w.a.token, &w.a.ca_pem);
        apply_cluster_secret(
            control,
            "cluster-a",
            ARGOCD_DESTINATION,
            &w.a.server,
            &config,
            &[],
        )
        .await?;
        let api = w.api_client()?;
        eventually(
            "the server registers cluster-a-argocd from the Argo CD cluster Secret",
            Duration::from_secs(30),
            || async {
                let rows: Vec<DestinationInfo> = api.get(DESTINATIONS).await?;
                let known = rows
                    .iter()
                    .any(|d| d.name == ARGOCD_DESTINATION && d.connected);
                Ok(if known {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!("{rows:?}"))
                })
            },
        )
        .await?;

        let app: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": STAGE, "namespace": argocd::NAMESPACE},
            "spec": {
                "project": "default",
                "source": {"repoURL": "https://git.example.invalid/shop.git", "path": "uat", "targetRevision": "main"},
                "destination": {"server": w.a.server, "namespace": "shop"}
            }
        }))?;
        argocd::applications(control)
            .create(&PostParams::default(), &app)
            .await
            .context("creating the Stage's Application")?;
        create_stage(control, STAGE, &[(STAGE, argocd::NAMESPACE)], None).await?;

        // The first verification passes; a re-verification requested by annotating the Stage
        // (no annotations on its run) fails.
        let routing = json!({"destination": "stage"});
        let first = Verification::new(STAGE, "01jstage00000000000000000a", "unused")
            .routed(routing.clone());
        let again = Verification::new(STAGE, "01jstage00000000000000000b", "unused")
            .routed(routing)
            .reverification()
            .exits(1);
        let (first, again) = (w.submit(&first).await?, w.submit(&again).await?);
        let (first, again) = (w.finished(&first).await?, w.finished(&again).await?);
        ensure!(
            phase(&first) == "Successful",
            "want the first verification Successful: {}",
            report(w, &first)
        );
        let message = measurement_message(&again);
        ensure!(
            phase(&again) == "Failed"
                && message.contains(RESOLVED)
                && message.contains("check failed: svc is not healthy"),
            "want the re-verification Failed on {RESOLVED} with its log tail: {}",
            report(w, &again)
        );

        let promotion = w.freight.promotion(STAGE);
        for (run, promotion) in [(&first, Some(promotion.as_str())), (&again, None)] {
            let job = &the_one_job_on_a(w, run).await?;
            let destination = job
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_DESTINATION));
            ensure!(
                destination.map(String::as_str) == Some(RESOLVED),
                "the Job of {} went through destination {destination:?}, not the configured \
                 {RESOLVED} (which outranks the Argo CD cluster Secret's {ARGOCD_DESTINATION})",
                analysis::name(run)
            );
            let env = job_env(job);
            let value = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
            ensure!(
                value("KARGO_STAGE") == Some(STAGE)
                    && value("KARGO_FREIGHT_COLLECTION") == Some(w.freight.collection_id.as_str())
                    && value("KARGO_PROMOTION") == promotion,
                "the Job of {} has the wrong Kargo context (want KARGO_PROMOTION={promotion:?}): \
                 {env:?}",
                analysis::name(run)
            );
        }
        println!(
            "e2e: destination: stage → Stage {STAGE}'s Application deploys to cluster-a → \
             {RESOLVED} (not the Secret's {ARGOCD_DESTINATION}): first verification Successful (KARGO_PROMOTION={promotion}), \
             re-verification without annotations Failed (no KARGO_PROMOTION)"
        );
        Ok(())
    })
}
