//! Logs of Jobs on agent destinations across two server replicas (`Rig::start_replicated`): the
//! reader asks replica one, the agent polls and uploads to replica two only. The request reaches
//! the agent through the published `DispatchLogRequest` (on fake cluster `a`'s API, as on the
//! control plane), the upload is forwarded from replica two to replica one, and the published
//! request is deleted once served or given up.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_server::logs::board;
use futures::StreamExt;
use kube::api::{Api, DynamicObject, ListParams};

use crate::agent_logs::{read_through_agent, whole_and_redacted};
use crate::agent_rig::{job_pods, poll, request, Rig, BOARD_NAMESPACE};
use crate::world::{eventually, World};

/// The `DispatchLogRequest`s stored on fake cluster `a`.
pub(crate) async fn published(w: &World) -> Result<Vec<DynamicObject>> {
    let client = w.engine.client_of("a").context("cluster a")?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, BOARD_NAMESPACE, &board::api_resource());
    Ok(api.list(&ListParams::default()).await?.items)
}

/// Waits until no `DispatchLogRequest` is left.
async fn none_left(w: &World) -> Result<()> {
    eventually("the published log request deleted", || async {
        Ok(published(w).await?.is_empty().then_some(()))
    })
    .await
}

#[tokio::test]
async fn the_whole_log_crosses_replicas_in_order_and_its_request_is_deleted() -> Result<()> {
    let (rig, two) = Rig::start_replicated().await?;
    const LINES: usize = 5_000;
    job_pods(&rig.w, LINES);
    // The agent knows replica two only; the reader asks replica one.
    let (events, elapsed) = read_through_agent(&rig, two.addr).await?;
    whole_and_redacted(&events, LINES)?;
    // Replica two's open poll answered as soon as the request was published, not at its end.
    ensure!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    none_left(&rig.w).await
}

#[tokio::test]
async fn a_reader_that_hangs_up_withdraws_its_published_request() -> Result<()> {
    let (rig, two) = Rig::start_replicated().await?;
    let mut log = rig.features.logs.agent_job_log("edge", request(false));
    // The reader waits: its request is published meanwhile (no agent answers).
    let waited = tokio::time::timeout(Duration::from_millis(300), log.next()).await;
    ensure!(waited.is_err(), "an event without an agent: {waited:?}");
    let on_board = published(&rig.w).await?;
    ensure!(on_board.len() == 1, "{} published", on_board.len());
    let owner = on_board[0].data["spec"]["owner"]
        .as_str()
        .unwrap_or_default();
    ensure!(
        owner == rig.addr.to_string(),
        "owner {owner}, reader's replica {}",
        rig.addr
    );
    // Replica two hands it out: the agent of edge polls it.
    let client = Rig::agent_client_of(two.addr, "edge")?;
    let reply = poll(&client, "x", 5).await?;
    ensure!(reply.logs.len() == 1, "{:?}", reply.logs);
    ensure!(reply.logs[0].job == request(false).job);
    // The reader hangs up before any upload: the request goes from the store.
    drop(log);
    none_left(&rig.w).await?;
    let again = poll(&client, &reply.fingerprint, 1).await?;
    ensure!(again.logs.is_empty(), "still handed out: {:?}", again.logs);
    Ok(())
}
