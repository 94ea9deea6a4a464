//! Logs of Jobs on agent destinations, end to end in process: the reader asks
//! (`RunLogs::agent_job_log`), the agent's open poll answers at once with the request,
//! the real agent code (`logs::agent::LogServer`) reads the Job's pods on its cluster (fake
//! cluster `a`), redacts, and streams NDJSON to the real upload route, which relays it to the
//! reader — whole, in order, without buffering the log.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::agent::{self as agent_api, WorkReply, WorkRequest};
use dispatch_api::client::ServerClient;
use dispatch_api::logs::LogEvent;
use dispatch_server::logs::agent::LogServer;
use dispatch_server::runtime::reload::Reloading;
use futures::StreamExt;

use crate::agent_rig::{job_pods, poll, record, request, Rig, JOB, PASSWORD};
use crate::world::{NS, WAIT};

/// The agent's poll loop, as `agent::run` does it: every reply's log requests go to `server`.
pub(crate) async fn agent_polls(client: ServerClient, server: Arc<LogServer>) {
    let path = agent_api::path(agent_api::WORK, "edge");
    let mut fingerprint = String::new();
    loop {
        let req = WorkRequest {
            fingerprint: fingerprint.clone(),
            wait_seconds: 5,
        };
        match client.post::<_, WorkReply>(&path, &req).await {
            Ok(reply) => {
                fingerprint = reply.fingerprint;
                // The store holds no record here: the agent's work is the one record.
                server.serve(reply.logs, &[record()]);
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

#[tokio::test]
async fn the_whole_log_of_every_attempt_arrives_in_order_through_the_agent_redacted() -> Result<()>
{
    let rig = Rig::start().await?;
    const LINES: usize = 5_000;
    job_pods(&rig.w, LINES);
    let (events, elapsed) = read_through_agent(&rig, rig.addr).await?;
    whole_and_redacted(&events, LINES)?;
    // The open poll answered at once: far below the poll's wait.
    ensure!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    Ok(())
}

/// The log of `JOB` read by the rig's reader while the agent of `edge` polls (and uploads to)
/// the replica at `agent_at`; how long it took.
pub(crate) async fn read_through_agent(
    rig: &Rig,
    agent_at: std::net::SocketAddr,
) -> Result<(Vec<LogEvent>, Duration)> {
    let client = Rig::agent_client_of(agent_at, "edge")?;
    let kube = rig.w.engine.client_of("a").context("cluster a")?;
    let server = LogServer::new(
        Reloading::fixed("agent client", client.clone()),
        kube,
        "edge",
        vec![NS.into()],
    );
    // One poll first: the agent is connected when the reader asks.
    poll(&client, "", 0).await?;
    let poller = tokio::spawn(agent_polls(client, server));
    let asked = tokio::time::Instant::now();
    let events = tokio::time::timeout(
        WAIT * 3,
        rig.features
            .logs
            .agent_job_log("edge", request(false))
            .collect(),
    )
    .await
    .context("the log did not end");
    poller.abort();
    Ok((events?, asked.elapsed()))
}

/// `events` are every line of both attempts of `JOB` (`lines` each, `job_pods`), in order,
/// with the Secret's value redacted.
pub(crate) fn whole_and_redacted(events: &[LogEvent], lines: usize) -> Result<()> {
    let texts: Vec<String> = events.iter().map(LogEvent::to_text).collect();
    ensure!(
        events.len() == 2 * lines,
        "{} events: {:?}",
        events.len(),
        &texts[..texts.len().min(5)]
    );
    for (i, t) in texts.iter().enumerate() {
        let (n, line) = (i / lines + 1, i % lines + 1);
        let want = format!("[edge/{JOB}-{n}/check] attempt {n} line {line:06}");
        ensure!(t.starts_with(&want), "event {i}: {t} (want {want})");
    }
    ensure!(
        !texts.iter().any(|t| t.contains(PASSWORD)),
        "a Secret value was streamed"
    );
    let redacted = format!("password={}", dispatch_server::logs::REDACTED);
    ensure!(texts[1].ends_with(&redacted), "{}", texts[1]);
    Ok(())
}

#[tokio::test]
async fn an_agent_not_connected_is_a_note_at_once() -> Result<()> {
    let rig = Rig::start().await?;
    let events: Vec<LogEvent> = tokio::time::timeout(
        Duration::from_secs(2),
        rig.features
            .logs
            .agent_job_log("edge", request(false))
            .collect(),
    )
    .await?;
    ensure!(events.len() == 1, "{events:?}");
    let t = events[0].to_text();
    ensure!(
        t.starts_with("[edge] -- the agent of edge is not connected (last contact: never)"),
        "{t}"
    );
    Ok(())
}

#[tokio::test]
async fn a_reader_that_hangs_up_stops_the_upload() -> Result<()> {
    let rig = Rig::start().await?;
    job_pods(&rig.w, 50_000);
    let client = rig.agent_client("edge")?;
    let _: WorkReply = client
        .post(
            &agent_api::path(agent_api::WORK, "edge"),
            &WorkRequest::default(),
        )
        .await?;
    let path = agent_api::path(agent_api::WORK, "edge");
    let mut log = rig.features.logs.agent_job_log("edge", request(false));
    // The reader is waiting; the poll hands out the request.
    let reader = tokio::spawn(async move {
        let first = log.next().await;
        drop(log);
        first
    });
    let reply: WorkReply = client
        .post(
            &path,
            &WorkRequest {
                fingerprint: "x".into(),
                wait_seconds: 5,
            },
        )
        .await?;
    ensure!(reply.logs.len() == 1, "{:?}", reply.logs);
    let id = reply.logs[0].id.clone();
    // An endless upload: the server stops reading once the reader is gone.
    let line = serde_json::to_vec(&LogEvent::Line {
        destination: "edge".into(),
        pod: "p".into(),
        container: "c".into(),
        text: "x".repeat(100),
    })?;
    let body = futures::stream::repeat(line).map(|mut l| {
        l.push(b'\n');
        Ok::<_, std::io::Error>(l)
    });
    let upload_path = agent_api::logs_path("edge", &id);
    let upload = client.post_stream::<agent_api::LogUploadReply>(
        &upload_path,
        dispatch_api::logs::CONTENT_TYPE,
        dispatch_api::client::Body::wrap_stream(body),
        Duration::from_secs(10),
    );
    let (first, reply) = tokio::join!(reader, upload);
    ensure!(matches!(first?, Some(LogEvent::Line { .. })));
    // Either the reply says so, or the server closed the connection mid-body.
    if let Ok(r) = reply {
        ensure!(r.reader_gone, "{r:?}");
    }
    // The id is gone: a second upload is refused.
    let again = client
        .post_stream::<agent_api::LogUploadReply>(
            &agent_api::logs_path("edge", &id),
            dispatch_api::logs::CONTENT_TYPE,
            dispatch_api::client::Body::from(Vec::new()),
            Duration::from_secs(5),
        )
        .await;
    ensure!(
        matches!(&again, Err(dispatch_api::client::CallError::Rejected(e)) if e.code == "not_found"),
        "{again:?}"
    );
    Ok(())
}
