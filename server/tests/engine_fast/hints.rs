//! Resume hints (#30): a Job of ours that finishes in a destination's watch cache, a pod of it
//! that starts waiting for a reason that decides at once, and an agent record whose reported
//! state becomes final, each emit one hint naming the run's namespace, its uid and the Job; a Job
//! still running, a pod merely pending and a Running report emit none.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::v1::{HintPage, ResumeHint};
use dispatch_server::hints::Hints;
use dispatch_server::store::DispatchJobStatus;
use dispatch_server::verdict::DestState;
use serde_json::json;

use crate::cluster_side::{finish_job, pod_for};
use crate::world::{block, request, run, World, PROJECT};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";

/// Measurement 1 of run `n` on `destination`: the run and its Job's name.
async fn started(
    w: &World,
    n: u32,
    destination: &str,
) -> Result<(dispatch_server::job::RunContext, String)> {
    let r = run(n);
    let config = block(json!({"destination": destination}))?;
    let ensured = w.engine.ensure(&request(&r, "smoke", 1, config)).await?;
    Ok((r, ensured.job.name))
}

/// The hint of run `r`'s Job `job`.
fn hint_of(r: &dispatch_server::job::RunContext, job: &str) -> ResumeHint {
    ResumeHint {
        namespace: PROJECT.into(),
        run_uid: r.uid.clone(),
        job: job.into(),
    }
}

/// Where the reader stands now (a first call: a reset page at the newest hint).
async fn start(hints: &Hints) -> HintPage {
    hints.after(None, None, Duration::ZERO, |_| true).await
}

/// The hints after `page`, waiting up to `wait` for one.
async fn next(hints: &Hints, page: &HintPage, wait: Duration) -> HintPage {
    hints
        .after(Some(&page.epoch), Some(page.cursor), wait, |_| true)
        .await
}

#[tokio::test]
async fn a_job_that_finishes_on_a_direct_destination_emits_one_hint() -> Result<()> {
    let w = World::start("").await?;
    let hints = w.engine.registry().hints().clone();
    let (r, job) = started(&w, 21, "a").await?;
    let at = start(&hints).await;
    let quiet = next(&hints, &at, Duration::from_millis(300)).await;
    ensure!(quiet.hints.is_empty(), "a running Job: {quiet:?}");
    finish_job(w.api("a"), &job, "Complete", "Completed", "");
    let page = next(&hints, &quiet, Duration::from_secs(10)).await;
    ensure!(page.hints == vec![hint_of(&r, &job)], "{page:?}");
    // The Job changing again once it has finished is no new end.
    finish_job(w.api("a"), &job, "Complete", "Completed", "again");
    let after = next(&hints, &page, Duration::from_millis(300)).await;
    ensure!(after.hints.is_empty(), "{after:?}");
    Ok(())
}

#[tokio::test]
async fn an_agents_final_report_emits_one_hint_and_a_running_one_none() -> Result<()> {
    let w = World::start(AGENTS).await?;
    let hints = w.engine.registry().hints().clone();
    let (r, job) = started(&w, 22, "edge").await?;
    let store = w.engine.store().context("agent store")?.clone();
    let record = dispatch_server::store::record_name(&job, "edge");
    let at = start(&hints).await;
    let subject = "system:serviceaccount:edge:agent";
    store
        .set_status(
            &record,
            DispatchJobStatus::observed(Some(DestState::Running(None)), subject),
        )
        .await?;
    let running = next(&hints, &at, Duration::from_millis(300)).await;
    ensure!(running.hints.is_empty(), "a Running report: {running:?}");
    store
        .set_status(
            &record,
            DispatchJobStatus::observed(Some(DestState::Succeeded), subject),
        )
        .await?;
    let page = next(&hints, &running, Duration::from_secs(5)).await;
    ensure!(page.hints == vec![hint_of(&r, &job)], "{page:?}");
    Ok(())
}

#[tokio::test]
async fn a_pod_that_cannot_pull_its_image_emits_its_jobs_hint_and_a_pending_one_none() -> Result<()>
{
    let w = World::start("").await?;
    let hints = w.engine.registry().hints().clone();
    let (_, job) = started(&w, 23, "a").await?;
    // The Job must be in the cache for its pod to name it.
    crate::world::eventually("the Job in the cache", || async {
        let d = w.engine.registry().get("a");
        Ok(match d {
            Some(dispatch_server::destinations::Entry::Ready(d)) => {
                d.jobs().get(crate::world::NS, &job).map(|_| ())
            }
            _ => None,
        })
    })
    .await?;
    let at = start(&hints).await;
    pod_for(w.api("a"), &job, json!({"phase": "Pending"}), true)?;
    let pending = next(&hints, &at, Duration::from_millis(300)).await;
    ensure!(pending.hints.is_empty(), "a pending pod: {pending:?}");
    pod_for(
        w.api("a"),
        &job,
        json!({"phase": "Pending", "containerStatuses": [{"name": "check", "ready": false,
            "restartCount": 0, "image": "example.invalid/check:1", "imageID": "",
            "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]}),
        true,
    )?;
    let page = next(&hints, &pending, Duration::from_secs(10)).await;
    ensure!(
        page.hints
            .iter()
            .map(|h| h.job.as_str())
            .collect::<Vec<_>>()
            == [job.as_str()],
        "{page:?}"
    );
    Ok(())
}
