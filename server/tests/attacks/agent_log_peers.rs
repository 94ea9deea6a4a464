//! The agent log relay across replicas attacked (group `agent_logs`): a replica that does not
//! hold a published request forwards an upload only for that id, of that destination, with that
//! destination's agent token — never another destination's token, an unknown id, a plugin token
//! or an upload claiming to be forwarded already; and a published request naming an owner that is
//! not a replica (no certificate of the replicas' CA for their name) gets no agent token.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::logs::LogEvent;
use dispatch_server::logs::board;
use dispatch_server::logs::peers::PeerTransport;
use futures::stream::BoxStream;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::agent_logs::{got_event, upload_to};
use crate::agent_rig::{board, poll, request, Replica, Rig, BOARD_NAMESPACE};
use crate::tally::{self, Outcome};
use crate::tls::{scratch, served_files, Ca};

/// The ids `replica`'s poll hands the agent of `edge`, waiting up to 5 s for one.
async fn handed_out(replica: SocketAddr) -> Result<Vec<String>> {
    let client = Rig::agent_client_of(replica, "edge")?;
    let reply = poll(&client, "x", 5).await?;
    Ok(reply.logs.into_iter().map(|r| r.id).collect())
}

/// Polls `replica` as the agent of `edge` until it hands out `id`, for up to 30 s: the replica's
/// board watch sees a freshly published request a moment later, later still on a loaded machine.
async fn handed_out_eventually(replica: SocketAddr, id: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < deadline {
        if handed_out(replica).await?.iter().any(|got| got == id) {
            return Ok(());
        }
    }
    anyhow::bail!("replica {replica} never handed out {id}")
}

/// A reader waiting on replica one of `rig`, its request published: (id, the reader's stream).
async fn waiting_reader(
    rig: &Rig,
    two: &Replica,
) -> Result<(String, BoxStream<'static, LogEvent>)> {
    let mut reader = rig.features.logs.agent_job_log("edge", request(false));
    // Polled once: the request is published while the reader waits.
    ensure!(!got_event(&mut reader).await, "an event before any upload");
    let ids = handed_out(two.addr).await?;
    let id = ids
        .first()
        .context("replica two handed out no request")?
        .clone();
    Ok((id, reader))
}

#[tokio::test]
async fn a_replica_forwards_only_its_destinations_agent_for_a_published_id() -> Result<()> {
    let (rig, two) = Rig::start_replicated().await?;
    let (id, mut reader) = waiting_reader(&rig, &two).await?;
    let edge = Rig::agent_token("edge")?;
    let edge2 = Rig::agent_token("edge2")?;
    let at_two = |dest: &'static str, id: String, token: String, by: Option<&'static str>| async move {
        upload_to(two.addr, dest, &id, &token, by).await
    };
    let cases = [
        (
            "agent_logs: another destination's agent uploads a request published by another replica",
            at_two("edge", id.clone(), edge2.clone(), None).await? == 403
                && at_two("edge2", id.clone(), edge2.clone(), None).await? == 404,
        ),
        (
            "agent_logs: an upload to an unknown id on a replica that does not hold it",
            at_two("edge", "0123456789abcdef0123456789abcdef".into(), edge.clone(), None).await?
                == 404,
        ),
        (
            "agent_logs: a plugin token uploads a request published by another replica",
            at_two("edge", id.clone(), Rig::plugin_token()?, None).await? == 403,
        ),
        (
            "agent_logs: an upload forged as already forwarded to a replica that does not hold it",
            at_two("edge", id.clone(), edge.clone(), Some("10.0.0.1:8443")).await? == 404,
        ),
    ];
    let leaked = got_event(&mut reader).await;
    for (name, refused) in cases {
        tally::refused(
            name,
            Outcome {
                refused,
                cross_tenant_read: leaked,
                ..Outcome::default()
            },
        );
    }
    // The genuine agent's upload to replica two is forwarded and reaches the reader.
    let genuine = at_two("edge", id, edge, None).await?;
    assert_eq!(genuine, 200);
    assert!(
        got_event(&mut reader).await,
        "the forwarded upload reached no reader"
    );
    Ok(())
}

/// A TLS listener serving a certificate for `localhost` issued by `ca`: its address, and every
/// byte of application data it received (only after a handshake the client accepted).
async fn tls_owner(ca: &Ca, case: &str) -> Result<(SocketAddr, Arc<Mutex<Vec<u8>>>)> {
    let files = served_files(&scratch(case)?, ca)?;
    let config = dispatch_server::runtime::listener::tls_config(&files.tls_cert, &files.tls_key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let got = Arc::new(Mutex::new(Vec::new()));
    let sink = got.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, sink) = (acceptor.clone(), sink.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = vec![0u8; 4096];
                // Read what arrives within a moment, then hang up: the forward fails either way.
                while let Ok(Ok(n @ 1..)) =
                    tokio::time::timeout(Duration::from_millis(500), tls.read(&mut buf)).await
                {
                    sink.lock().unwrap().extend_from_slice(&buf[..n]);
                }
            });
        }
    });
    Ok((addr, got))
}

/// Publishes a request of `edge` whose owner is `owner`, as one who can write the store would.
async fn publish_forged(rig: &Rig, id: &str, owner: SocketAddr) -> Result<()> {
    let client = rig.w.engine.client_of("a").context("cluster a")?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client, BOARD_NAMESPACE, &board::api_resource());
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "rollouts-dispatch.io/v1alpha1",
        "kind": board::KIND,
        "metadata": {"name": board::object_name(id), "namespace": BOARD_NAMESPACE},
        "spec": {"destination": "edge", "id": id, "namespace": "verify", "job": "j",
                 "owner": owner.to_string()},
    }))?;
    api.create(&PostParams::default(), &obj).await?;
    Ok(())
}

#[tokio::test]
async fn a_published_owner_without_the_replicas_certificate_gets_no_agent_token() -> Result<()> {
    let rig = Rig::start().await?;
    let replicas_ca = Ca::new("rollouts-dispatch replicas ca")?;
    let dir = scratch("peer-ca")?;
    let ca_file = dir.join("ca.crt");
    replicas_ca.write(&ca_file)?;
    let replica = Replica::start_with(
        &rig.w,
        Some(board(&rig.w)?),
        PeerTransport::tls("localhost", &ca_file)?,
    )
    .await?;
    let token = Rig::agent_token("edge")?;
    // An impostor: a certificate for the replicas' name, from another CA.
    let (impostor, impostor_got) = tls_owner(&Ca::new("impostor ca")?, "impostor").await?;
    let forged = "0123456789abcdef0123456789abcde0";
    publish_forged(&rig, forged, impostor).await?;
    handed_out_eventually(replica.addr, forged).await?;
    let status = upload_to(replica.addr, "edge", forged, &token, None).await?;
    // Any application data at all would be the forward, the agent's token in its headers.
    let leaked = !impostor_got.lock().unwrap().is_empty();
    tally::refused(
        "agent_logs: a published request names an owner that is not a replica (another CA)",
        Outcome {
            refused: status == 503 && !leaked,
            secret_leak: leaked,
            ..Outcome::default()
        },
    );
    // The control: an owner with a certificate of the replicas' CA does get the forward (its
    // headers HPACK-coded over HTTP/2, the body in clear): this test sees data when it is sent.
    let (genuine, genuine_got) = tls_owner(&replicas_ca, "genuine-owner").await?;
    let id = "0123456789abcdef0123456789abcde1";
    publish_forged(&rig, id, genuine).await?;
    handed_out_eventually(replica.addr, id).await?;
    let _ = upload_to(replica.addr, "edge", id, &token, None).await?;
    let seen = String::from_utf8_lossy(&genuine_got.lock().unwrap()).to_string();
    assert!(
        seen.contains("all checks passed"),
        "a replica of the CA got no forward: {seen:?}"
    );
    Ok(())
}
