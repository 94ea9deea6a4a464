//! An Application deleted while a check waits for it: the real controller had it Synced and
//! Healthy at one commit, the check asks for another (never pushed, so it waits, Running), and
//! the Application is deleted. The check then says the Application is not found and ends at the
//! block's `activeDeadline` (plus `engine.deadlineGrace`) with that, not with a stale verdict of
//! what was there before.

use anyhow::{ensure, Result};
use dispatch_tests::analysis::{self, measurement_message, phase};
use dispatch_tests::cluster::argocd;
use dispatch_tests::cluster::argocd_real;
use dispatch_tests::wait::eventually;
use kube::api::DeleteParams;
use serde_json::json;

use dispatch_tests::kargo::Verification;

use super::{
    app_spec, on_scene, repo_with_shop, run_report, saying, wait_synced_healthy, ARGOCD_TIMEOUT,
};

/// A commit Argo CD can never be at.
const NEVER: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn an_application_deleted_mid_check_ends_at_the_deadline_saying_it_is_gone() -> Result<()> {
    on_scene(async |s| {
        let name = "shop-deleted";
        let (repo, sha) = repo_with_shop(s, name, "v1")?;
        argocd_real::create_application(&s.b, &app_spec(name, &repo, true)).await?;
        wait_synced_healthy(s, name, &sha).await?;
        let check = Verification::new("app-deleted", "01jargocd00000000000000009", "cluster-b")
            .observes(json!({
                "application": {"name": name, "revision": NEVER},
                "activeDeadline": "20s",
            }));
        let run = s.w.submit(&check).await?;
        let runs = s.w.runs();
        let waiting = eventually(
            "the check Running, waiting for the commit",
            ARGOCD_TIMEOUT,
            || async {
                let now = runs.get(analysis::name(&run)).await?;
                let message = measurement_message(&now);
                ensure!(
                    matches!(phase(&now).as_str(), "" | "Running" | "Pending"),
                    "decided before the delete: {}",
                    run_report(&now)
                );
                Ok((!message.is_empty()).then_some(message))
            },
        )
        .await?;
        argocd::applications(&s.b)
            .delete(name, &DeleteParams::default())
            .await?;
        let gone = saying(
            s,
            &run,
            "the check saying the Application is gone",
            "not found",
        )
        .await?;
        // An observe check has no Job whose own deadline comes first: it ends at the block's
        // `activeDeadline` (no `engine.deadlineGrace`), Failed with what it saw, and Argo
        // Rollouts does not measure again (it would for an Error).
        let ended = s.w.finished(&run).await?;
        let (ended_phase, message) = (phase(&ended), measurement_message(&ended));
        ensure!(
            ended_phase == "Failed"
                && message.contains("DeadlineExceeded")
                && message.contains("not found"),
            "want the check to end Failed at its activeDeadline, saying {name} is not found: {}",
            run_report(&ended)
        );
        println!(
            "e2e-argocd: deleted mid-check: waiting {waiting:?}; after the delete {gone:?}; \
             the measurement ended {ended_phase}: {message:?}"
        );
        Ok(())
    })
}
