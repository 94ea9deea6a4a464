//! Resume hints (#30): a Job of ours that finishes in a destination's watch cache, and an agent
//! record whose reported state becomes final, each emit one hint naming the run's namespace,
//! its uid and the Job; a Job still running, a relisted old Job and a Running report emit none.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::v1::{HintPage, ResumeHint};
use dispatch_server::hints::Hints;
use dispatch_server::store::DispatchJobStatus;
use dispatch_server::verdict::DestState;
use serde_json::json;

use crate::cluster_side::finish_job;
use crate::world::{block, request, run, World, PROJECT};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";

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
    let r = run(21);
    let ensured = w
        .engine
        .ensure(&request(
            &r,
            "smoke",
            1,
            block(json!({"destination": "a"}))?,
        ))
        .await?;
    let job = ensured.job.name.clone();
    let at = start(&hints).await;
    let quiet = next(&hints, &at, Duration::from_millis(300)).await;
    ensure!(quiet.hints.is_empty(), "a running Job: {quiet:?}");
    finish_job(w.api("a"), &job, "Complete", "Completed", "");
    let page = next(&hints, &quiet, Duration::from_secs(10)).await;
    ensure!(
        page.hints
            == vec![ResumeHint {
                namespace: PROJECT.into(),
                run_uid: r.uid.clone(),
                job: job.clone(),
            }],
        "{page:?}"
    );
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
    let r = run(22);
    let ensured = w
        .engine
        .ensure(&request(
            &r,
            "smoke",
            1,
            block(json!({"destination": "edge"}))?,
        ))
        .await?;
    let store = w.engine.store().context("agent store")?.clone();
    let record = dispatch_server::store::record_name(&ensured.job.name, "edge");
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
    ensure!(
        page.hints
            == vec![ResumeHint {
                namespace: PROJECT.into(),
                run_uid: r.uid.clone(),
                job: ensured.job.name.clone(),
            }],
        "{page:?}"
    );
    Ok(())
}
