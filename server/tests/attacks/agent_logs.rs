//! The agent log relay attacked: a log request pending for agent destination `edge` cannot be
//! answered (or hijacked) by another destination's agent, a plugin token or an unknown id; and
//! an agent asked for a Job that is not one of its records, or outside its `--namespaces`,
//! streams nothing and reads nothing in its cluster.

use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_api::agent::{self as agent_api, WorkItem, WorkReply, WorkRequest};
use dispatch_api::logs::{LogEvent, LogRequest, CONTENT_TYPE};
use dispatch_server::logs::agent::LogServer;
use dispatch_server::runtime::reload::Reloading;
use futures::StreamExt;

use crate::agent_rig::{job_pods, record, request, Rig, JOB};
use crate::tally::{self, Outcome};
use crate::world::NS;

/// One uploaded line: a log line claiming to be `edge`'s.
fn forged_body() -> String {
    let ev = LogEvent::Line {
        destination: "edge".into(),
        pod: format!("{JOB}-1"),
        container: "check".into(),
        text: "all checks passed".into(),
    };
    format!(
        "{}\n",
        serde_json::to_string(&ev).expect("an event serializes")
    )
}

/// `POST` the upload route of `destination` and `id` with `token`; the status code.
async fn upload(rig: &Rig, destination: &str, id: &str, token: &str) -> Result<u16> {
    upload_to(rig.addr, destination, id, token, None).await
}

/// `POST` the upload route of `destination` and `id` of the replica at `addr` with `token`
/// (and `forwarded_by`, the header of a replica's forward); the status code.
pub(crate) async fn upload_to(
    addr: std::net::SocketAddr,
    destination: &str,
    id: &str,
    token: &str,
    forwarded_by: Option<&str>,
) -> Result<u16> {
    let url = format!("http://{addr}{}", agent_api::logs_path(destination, id));
    let mut req = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("content-type", CONTENT_TYPE);
    if let Some(by) = forwarded_by {
        req = req.header(dispatch_server::http::FORWARDED_BY, by);
    }
    let resp = req.body(forged_body()).send().await?;
    Ok(resp.status().as_u16())
}

/// A rig whose `edge` agent has polled once (connected), and a request pending for it: its id
/// (as the genuine agent's next poll gets it) and the reader's stream.
async fn pending(rig: &Rig) -> Result<(String, futures::stream::BoxStream<'static, LogEvent>)> {
    let client = rig.agent_client("edge")?;
    let path = agent_api::path(agent_api::WORK, "edge");
    let _: WorkReply = client.post(&path, &WorkRequest::default()).await?;
    // Registered at once (the stream is the reader's end).
    let reader = rig.features.logs.agent_job_log("edge", request(false));
    let reply: WorkReply = client
        .post(
            &path,
            &WorkRequest {
                fingerprint: "x".into(),
                wait_seconds: 2,
            },
        )
        .await?;
    let id = reply
        .logs
        .first()
        .context("no log request in the work")?
        .id
        .clone();
    Ok((id, reader))
}

/// Whether `reader` got an event within a moment (it must not, from a refused upload).
pub(crate) async fn got_event(reader: &mut futures::stream::BoxStream<'static, LogEvent>) -> bool {
    tokio::time::timeout(Duration::from_millis(300), reader.next())
        .await
        .is_ok()
}

#[tokio::test]
async fn another_destinations_agent_cannot_answer_a_pending_log_request() -> Result<()> {
    let rig = Rig::start().await?;
    let (id, mut reader) = pending(&rig).await?;
    let other = Rig::agent_token("edge2")?;
    // Through edge's route with edge2's token, and through its own route with edge's id.
    let through_edge = upload(&rig, "edge", &id, &other).await?;
    let through_own = upload(&rig, "edge2", &id, &other).await?;
    let leaked = got_event(&mut reader).await;
    let outcome = Outcome {
        refused: through_edge == 403 && through_own == 404,
        cross_tenant_read: leaked,
        ..Outcome::default()
    };
    tally::refused(
        "agent_logs: another destination's agent uploads a pending request's log",
        outcome,
    );
    // The genuine agent still can.
    let genuine = upload(&rig, "edge", &id, &Rig::agent_token("edge")?).await?;
    assert_eq!(genuine, 200);
    Ok(())
}

#[tokio::test]
async fn an_unknown_id_is_404_and_a_plugin_token_403() -> Result<()> {
    let rig = Rig::start().await?;
    let (id, mut reader) = pending(&rig).await?;
    let edge = Rig::agent_token("edge")?;
    let unknown = upload(&rig, "edge", "0123456789abcdef0123456789abcdef", &edge).await?;
    let plugin = upload(&rig, "edge", &id, &Rig::plugin_token()?).await?;
    let leaked = got_event(&mut reader).await;
    tally::refused(
        "agent_logs: an upload to an unknown id",
        Outcome {
            refused: unknown == 404,
            ..Outcome::default()
        },
    );
    tally::refused(
        "agent_logs: a plugin token on the upload route",
        Outcome {
            refused: plugin == 403,
            cross_tenant_read: leaked,
            ..Outcome::default()
        },
    );
    Ok(())
}

/// What `server` sends for `req` with `work`, and the calls it made on cluster `a`.
async fn agent_answer(
    rig: &Rig,
    server: &LogServer,
    req: &LogRequest,
    work: &[WorkItem],
) -> (Vec<LogEvent>, usize) {
    let api = rig.w.api("a");
    let before = api.requests().iter().filter(|r| !r.is_watch()).count();
    let events: Vec<LogEvent> = server.events(req, work).collect().await;
    let after = api.requests().iter().filter(|r| !r.is_watch()).count();
    (events, after - before)
}

#[tokio::test]
async fn an_agent_streams_only_the_jobs_of_its_records_in_its_namespaces() -> Result<()> {
    let rig = Rig::start().await?;
    job_pods(&rig.w, 10);
    let kube = rig.w.engine.client_of("a").context("cluster a")?;
    let client = rig.agent_client("edge")?;
    let server = LogServer::new(
        Reloading::fixed("agent client", client),
        kube,
        "edge",
        vec![NS.into()],
    );
    // Not a Job of its records (the work holds another Job).
    let mut other = record();
    other.spec.job_name = "someone-elses-job".into();
    let (events, calls) = agent_answer(&rig, &server, &request(false), &[other]).await;
    let streamed = events.iter().any(|e| matches!(e, LogEvent::Line { .. }));
    assert!(
        events.len() == 1
            && events[0]
                .to_text()
                .contains("not the Job of one of its records"),
        "{events:?}"
    );
    tally::refused(
        "agent_logs: an agent asked for a Job that is not one of its records",
        Outcome {
            refused: !streamed && calls == 0,
            cross_tenant_read: streamed,
            ..Outcome::default()
        },
    );
    // Outside its namespaces, even with a record that names it (a record is the server's word).
    let mut outside = record();
    outside.spec.namespace = "kube-system".into();
    let req = LogRequest {
        namespace: "kube-system".into(),
        ..request(false)
    };
    let (events, calls) = agent_answer(&rig, &server, &req, &[outside]).await;
    let streamed = events.iter().any(|e| matches!(e, LogEvent::Line { .. }));
    assert!(
        events.len() == 1 && events[0].to_text().contains("not one of its --namespaces"),
        "{events:?}"
    );
    tally::refused(
        "agent_logs: an agent asked for a Job outside its --namespaces",
        Outcome {
            refused: !streamed && calls == 0,
            cross_tenant_read: streamed,
            ..Outcome::default()
        },
    );
    // The genuine request streams (the refusals above are not a broken agent), and only the
    // Job's own pods: not the one someone else labelled `job-name` like it.
    let (events, _) = agent_answer(&rig, &server, &request(false), &[record()]).await;
    let injected = events.iter().any(|e| e.to_text().contains("impostor line"));
    tally::refused(
        "agent_logs: a pod not of the Job wearing its job-name label",
        Outcome {
            refused: !injected,
            cross_tenant_read: injected,
            ..Outcome::default()
        },
    );
    assert_eq!(events.len(), 20, "{events:?}");
    Ok(())
}
