//! A commit pushed and never synced: what the real controller makes of it, what a refresh
//! changes, and what an `application:` check at that commit says. The repo-server caches a
//! repository's references for `--revision-cache-expiration` (3 minutes by default, argo-cd
//! v3.2.6 reposerver/cache/cache.go:69), so the controller's periodic comparisons keep the
//! Application at the old commit for a while, and the check waits ("is at revision …, not yet
//! …"). A hard refresh (annotation `argocd.argoproj.io/refresh: hard`, which skips that cache:
//! controller/appcontroller.go:1775) shows the push: `status.sync.revision` moves to the new
//! commit, OutOfSync and still Healthy, and the controller removes the annotation. With nothing
//! syncing, the check ends at its `activeDeadline` `Failed`, `DeadlineExceeded: … is
//! OutOfSync`: the message that tells a person to sync (the sync trigger, `sync.rs`) or to turn
//! automated sync on.

use anyhow::{ensure, Result};
use dispatch_tests::analysis::{self, measurement_message, phase};
use dispatch_tests::cluster::argocd;
use dispatch_tests::cluster::argocd_real::{self, text};
use dispatch_tests::kargo::Verification;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use super::{
    app_spec, on_scene, repo_with_shop, run_report, saying, shop_manifests, wait_synced_healthy,
    ARGOCD_TIMEOUT,
};
use dispatch_tests::wait::eventually;

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn a_pushed_commit_nobody_syncs_fails_its_check_at_the_deadline_saying_out_of_sync() -> Result<()> {
    on_scene(async |s| {
        let name = "shop-refresh";
        let (repo, c1) = repo_with_shop(s, name, "v1")?;
        argocd_real::create_application(&s.b, &app_spec(name, &repo, true)).await?;
        wait_synced_healthy(s, name, &c1).await?;
        // Automated sync off, as for a Stage whose promotions sync explicitly.
        let apps = argocd::applications(&s.b);
        let manual = json!({"spec": {"syncPolicy": {"automated": null}}});
        apps.patch(name, &PatchParams::default(), &Patch::Merge(&manual))
            .await?;
        let c2 = repo.commit(&shop_manifests("v2", json!({}), json!({})), "shop v2")?;
        let check = Verification::new("app-refresh", "01jargocd0000000000000000a", "cluster-b")
            .observes(json!({
                "application": {"name": name, "revision": c2},
                "activeDeadline": "75s",
            }));
        let run = s.w.submit(&check).await?;
        let waiting = saying(
            s,
            &run,
            "the check waiting for Argo CD to see the commit",
            "not yet",
        )
        .await?;
        // Two periodic comparisons later, is the push still hidden by the revision cache?
        tokio::time::sleep(2 * argocd_real::RESYNC).await;
        let before = text(&apps.get(name).await?.data, "/status/sync/revision");
        let refresh = json!({"metadata": {"annotations": {argocd::REFRESH_ANNOTATION: "hard"}}});
        apps.patch(name, &PatchParams::default(), &Patch::Merge(&refresh))
            .await?;
        let refreshed = eventually(
            "the hard refresh shows the pushed commit OutOfSync",
            ARGOCD_TIMEOUT,
            || async {
                let app = apps.get(name).await?;
                let d = &app.data;
                let seen = text(d, "/status/sync/revision") == c2
                    && text(d, "/status/sync/status") == "OutOfSync"
                    && d.pointer(&format!(
                        "/metadata/annotations/{}",
                        argocd::REFRESH_ANNOTATION.replace('/', "~1")
                    ))
                    .is_none();
                Ok(seen.then(|| {
                    format!(
                        "sync={} health={}",
                        d["status"]["sync"], d["status"]["health"]
                    )
                }))
            },
        )
        .await?;
        let ended = s.w.finished(&run).await?;
        let message = measurement_message(&ended);
        ensure!(
            phase(&ended) == "Failed"
                && message.contains("DeadlineExceeded")
                && message.contains("is OutOfSync"),
            "want Failed at the deadline, saying {name} is OutOfSync at {c2}: {}\n{}",
            run_report(&ended),
            s.report(name).await
        );
        let hidden = if before == c2 {
            "seen without a refresh (the revision cache had expired)"
        } else {
            "hidden by the repo-server's revision cache"
        };
        println!(
            "e2e-argocd: refresh: the push of {c2} was {hidden} 20 s later (at {before:?}; the \
             check said {waiting:?}); after a hard refresh {refreshed}; the check of run {} \
             ended Failed: {message:?}",
            analysis::name(&ended)
        );
        Ok(())
    })
}
