//! DoS budgets: what a caller (with or without a token) can make the server, the apiserver or
//! a client spend. Every case asserts the budget held and that no destination was called.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Result};
use base64::Engine as _;
use dispatch_api::client::{CallError, ClientConfig, ServerClient};
use dispatch_api::state::MAX_DETAIL;
use dispatch_server::engine::MAX_PLACEMENTS;
use dispatch_server::http::auth::{Chain, JwtAuthenticator};
use dispatch_server::http::tokenreview::{TokenReviewAuthenticator, NEGATIVE_MAX, POSITIVE_MAX};
use dispatch_server::http::Authenticator;
use dispatch_server::measure::agents::MAX_POLLS_PER_AGENT;
use dispatch_server::runtime::limits::BudgetArgs;
use dispatch_server::runtime::metrics::Metrics;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::scene::{token, Scene, KEY, REVOKED_JTI};
use crate::tally::{self, Outcome};
use crate::world::{Clusters, World};

/// Every project may use every destination: the budgets, not the policy, must stop these.
pub(crate) const POLICY: &str =
    "policy: {rules: [{projects: ['*'], destinations: ['*'], namespaces: ['*'], applicationNamespaces: [argocd]}]}";
const AGENTS: &str = "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}";

/// A measurement of run `n` of project `team-a` with the plugin block fields `routing`.
pub(crate) fn measurement(n: u32, routing: Value) -> Value {
    let mut block = json!({"spec": {"backoffLimit": 0, "template": {"spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "check",
            "image": "example.invalid/check:1",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
        }]
    }}}});
    if let (Some(b), Some(r)) = (block.as_object_mut(), routing.as_object()) {
        b.extend(r.clone());
    }
    json!({
        "run": {"name": format!("uat.budget.{n}"), "namespace": "team-a",
                "uid": format!("0000{n:04x}-bbbb-4bbb-8ccc-000000000002")},
        "metric": "budget",
        "index": 1,
        "block": block,
    })
}

/// The chain `serve` builds with `--token-review-allow` and `--jwt-key-file`: TokenReview
/// against the fake control plane first, then the JWT key.
fn chain(world: &World) -> Result<Arc<Chain>> {
    let cp = kube::Client::try_from(kube::Config::new(world.clusters.cp.url().parse()?))?;
    Ok(Arc::new(Chain(vec![
        Authenticator::TokenReview(TokenReviewAuthenticator::new(
            cp,
            Vec::new(),
            vec!["system:serviceaccount:argo-rollouts:argo-rollouts".into()],
        )),
        Authenticator::Jwt(JwtAuthenticator::new(
            &[KEY.to_vec()],
            [REVOKED_JTI.to_string()],
        )),
    ])))
}

/// A JWT-shaped token with header `alg`, unique by `n`, signed with nothing we know.
fn garbage_jwt(alg: &str, n: usize) -> String {
    let b64 = |v: Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap())
    };
    format!(
        "{}.{}.Zm9yZ2Vk",
        b64(json!({"alg": alg, "typ": "JWT"})),
        b64(json!({"sub": format!("storm-{n}"), "aud": "rollouts-dispatch"}))
    )
}

#[tokio::test]
async fn a_storm_of_garbage_jwts_costs_no_token_review() -> Result<()> {
    let world = World::start(POLICY).await?;
    let auth = chain(&world)?;
    let scene = Scene::serve_with(world, auth, Arc::new(Metrics::new())).await?;
    let reviews = || scene.world.clusters.cp.calls("POST", "tokenreviews");
    for n in 0..1000 {
        let reply = scene
            .call(
                "GET",
                "/v1/destinations",
                Some(&garbage_jwt("HS256", n)),
                &json!({}),
            )
            .await?;
        ensure!(reply.status == 401, "garbage token {n}: {:?}", reply.body);
    }
    let spent = reviews();
    // The counter works: a token that may be Kubernetes' costs one review.
    scene
        .call(
            "GET",
            "/v1/destinations",
            Some(&garbage_jwt("RS256", 0)),
            &json!({}),
        )
        .await?;
    assert_eq!(reviews(), 1, "the fake control plane counts reviews");
    tally::refused(
        "budgets: 1000 garbage HS256 tokens → 0 TokenReviews",
        Outcome {
            refused: spent == 0,
            ..Outcome::default()
        },
    );
    assert!(scene.destination_calls().is_empty());
    Ok(())
}

/// A TokenReview endpoint that accepts nothing and counts reviews.
async fn refusing_apiserver() -> Result<(kube::Client, Arc<AtomicUsize>)> {
    let reviews = Arc::new(AtomicUsize::new(0));
    let counted = reviews.clone();
    let app = axum::Router::new().route(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        axum::routing::post(move |axum::Json(mut review): axum::Json<Value>| {
            counted.fetch_add(1, Ordering::SeqCst);
            review["status"] = json!({"authenticated": false, "error": "invalid bearer token"});
            async move { axum::Json(review) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((
        kube::Client::try_from(kube::Config::new(url.parse()?))?,
        reviews,
    ))
}

#[tokio::test]
async fn the_token_review_cache_stays_within_its_cap() -> Result<()> {
    let (client, reviews) = refusing_apiserver().await?;
    let auth = TokenReviewAuthenticator::new(client, Vec::new(), vec!["nobody".into()]);
    let cap = POSITIVE_MAX + NEGATIVE_MAX;
    let n = NEGATIVE_MAX * 2;
    let mut most = 0;
    for i in 0..n {
        assert!(auth.authenticate(&garbage_jwt("RS256", i)).await.is_err());
        most = most.max(auth.cached());
    }
    assert_eq!(
        reviews.load(Ordering::SeqCst),
        n,
        "each distinct token is reviewed once"
    );
    tally::refused(
        &format!("budgets: {n} distinct refused tokens → TokenReview cache ≤ {cap}"),
        Outcome {
            refused: most <= NEGATIVE_MAX && most <= cap,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn random_methods_and_paths_add_no_metric_series() -> Result<()> {
    let metrics = Arc::new(Metrics::new());
    let world = World::start(POLICY).await?;
    let auth: Arc<Chain> =
        Arc::new(JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]).into());
    let scene = Scene::serve_with(world, auth, metrics.clone()).await?;
    let plugin = token("plugin", |_| {});
    for i in 0..1000u32 {
        let method = format!("X{:08X}", i.wrapping_mul(2_654_435_761));
        let path = format!("/v1/{:x}/{i}", i.wrapping_mul(40_503));
        let t = (i % 2 == 0).then_some(plugin.as_str());
        scene.call(&method, &path, t, &json!({})).await?;
    }
    let series: Vec<String> = metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with("rollouts_dispatch_http_requests_total{"))
        .map(str::to_string)
        .collect();
    let raw = series.iter().any(|s| s.contains("X") || s.contains("/v1/"));
    assert!(!raw, "raw methods or paths in labels: {series:#?}");
    tally::refused(
        "budgets: 1000 random methods and paths → a bounded number of metric series",
        Outcome {
            refused: series.len() <= 4 && !raw,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn ten_thousand_placements_are_refused_before_any_destination_call() -> Result<()> {
    let scene = Scene::start(POLICY).await?;
    let plugin = token("plugin", |_| {});
    let names: Vec<String> = (0..10_000).map(|i| format!("d{i}")).collect();
    let reply = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&plugin),
            &measurement(1, json!({"destination": names.join(",")})),
        )
        .await?;
    let message = reply.body["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert_eq!(reply.status, 422, "{:?}", reply.body);
    assert!(
        message.contains("10000 destinations") && message.contains(&MAX_PLACEMENTS.to_string()),
        "{message}"
    );
    // A reference listing 10 000 placements (written into a run's status by a tenant).
    let placements: Vec<Value> = (0..10_000)
        .map(|_| json!({"destination": "a", "namespace": "verify"}))
        .collect();
    let forged = json!({"runUid": "x", "name": "j", "require": "all", "logTail": 0, "placements": placements});
    let mut status = measurement(1, json!({"destination": "a"}));
    status["metadata"] = json!({"dispatch-ref": forged.to_string()});
    let refused = scene
        .call("POST", dispatch_api::v1::STATUS, Some(&plugin), &status)
        .await?;
    assert!(refused.status >= 400, "{:?}", refused.body);
    let calls = scene.destination_calls();
    tally::refused(
        "budgets: 10 000 placements (names, forged reference) → refused, 0 destination calls",
        Outcome {
            refused: reply.status == 422 && refused.status >= 400 && calls.is_empty(),
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn a_selector_matching_too_many_destinations_is_refused() -> Result<()> {
    let clusters = Clusters::start().await?;
    let fleet: String = (0..=MAX_PLACEMENTS)
        .map(|i| {
            format!(
                "- {{name: fleet-{i}, server: \"{}\", token: t, namespace: verify, labels: {{fleet: edge}}}}\n",
                clusters.a.url()
            )
        })
        .collect();
    let world = clusters.engine(&fleet, POLICY, false).await?;
    let auth: Arc<Chain> =
        Arc::new(JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]).into());
    let scene = Scene::serve_with(world, auth, Arc::new(Metrics::new())).await?;
    let reply = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&token("plugin", |_| {})),
            &measurement(2, json!({"destinationSelector": "fleet=edge"})),
        )
        .await?;
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("fleet=edge") && message.contains("65 destinations"),
        "{message}"
    );
    let calls = scene.destination_calls();
    tally::refused(
        "budgets: a selector matching 65 destinations → refused naming the selector, 0 calls",
        Outcome {
            refused: reply.status == 422 && calls.is_empty(),
            ..Outcome::default()
        },
    );
    Ok(())
}

/// The agent `token` parks [`MAX_POLLS_PER_AGENT`] long polls at `path` (they wait: the work
/// does not change); returns them, still open, and the work's fingerprint.
async fn park_polls(
    scene: &Arc<Scene>,
    token: &str,
    path: &str,
) -> Result<(
    Vec<tokio::task::JoinHandle<Result<crate::scene::Reply>>>,
    Value,
)> {
    let first = scene
        .call("POST", path, Some(token), &json!({"waitSeconds": 0}))
        .await?;
    let fingerprint = first.body["fingerprint"].clone();
    let mut open = Vec::new();
    for _ in 0..MAX_POLLS_PER_AGENT {
        let (scene, token, path) = (scene.clone(), token.to_string(), path.to_string());
        let body = json!({"fingerprint": fingerprint, "waitSeconds": 30});
        open.push(tokio::spawn(async move {
            scene.call("POST", &path, Some(&token), &body).await
        }));
    }
    // Let the polls arrive and park.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((open, fingerprint))
}

#[tokio::test]
async fn the_fifth_long_poll_of_an_agent_is_refused_at_once() -> Result<()> {
    let scene = Arc::new(Scene::start(&format!("{POLICY}\n{AGENTS}")).await?);
    let agent = token("agent-edge", |c| c.destination = Some("edge".into()));
    let path = dispatch_api::agent::path(dispatch_api::agent::WORK, "edge");
    let (open, fingerprint) = park_polls(&scene, &agent, &path).await?;
    let started = std::time::Instant::now();
    let fifth = scene
        .call(
            "POST",
            &path,
            Some(&agent),
            &json!({"fingerprint": fingerprint, "waitSeconds": 30}),
        )
        .await?;
    let quick = started.elapsed() < Duration::from_secs(5);
    assert_eq!(fifth.status, 429, "{:?}", fifth.body);
    assert_eq!(fifth.body["code"], "too_many_polls");
    assert!(
        open.iter().all(|p| !p.is_finished()),
        "the first polls are still open"
    );
    for p in open {
        p.abort();
    }
    tally::refused(
        "budgets: 5th open long poll of one agent → 429 too_many_polls at once",
        Outcome {
            refused: fifth.status == 429 && quick,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn agents_holding_every_poll_slot_cannot_take_the_plugins() -> Result<()> {
    // Two agent destinations; the replica holds 4 polls in all (the poll budget), 8 requests of
    // the plugin and the API.
    let agents = "agents: {store: memory, destinations: [{name: edge, namespace: verify}, \
                  {name: edge-2, namespace: verify}]}";
    let budgets = BudgetArgs {
        max_agent_polls: MAX_POLLS_PER_AGENT,
        max_concurrent_requests: 8,
        ..BudgetArgs::default()
    };
    let scene = Arc::new(Scene::start_budgeted(&format!("{POLICY}\n{agents}"), budgets).await?);
    let agent = token("agent-edge", |c| c.destination = Some("edge".into()));
    let other = token("agent-edge-2", |c| c.destination = Some("edge-2".into()));
    let path = dispatch_api::agent::path(dispatch_api::agent::WORK, "edge");
    // One agent parks as many polls as the whole poll budget holds.
    let (open, _) = park_polls(&scene, &agent, &path).await?;
    let other_poll = scene
        .call(
            "POST",
            &dispatch_api::agent::path(dispatch_api::agent::WORK, "edge-2"),
            Some(&other),
            &json!({"waitSeconds": 30}),
        )
        .await?;
    let plugin = token("plugin", |_| {});
    let ensured = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&plugin),
            &measurement(1, json!({"destination": "a"})),
        )
        .await?;
    let message = other_poll.body["message"].as_str().unwrap_or_default();
    assert_eq!(other_poll.status, 503, "{:?}", other_poll.body);
    assert!(message.contains("--max-agent-polls"), "{message}");
    assert_eq!(ensured.status, 200, "{:?}", ensured.body);
    assert!(
        open.iter().all(|p| !p.is_finished()),
        "the parked polls are still open"
    );
    for p in open {
        p.abort();
    }
    tally::refused(
        "budgets: polls filling the poll budget → the next poll 503 naming --max-agent-polls, the plugin's ensure served",
        Outcome {
            refused: other_poll.status == 503 && ensured.status == 200,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn oversized_agent_report_strings_are_cut() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{AGENTS}")).await?;
    let plugin = token("plugin", |_| {});
    let agent = token("agent-edge", |c| c.destination = Some("edge".into()));
    let m = measurement(3, json!({"destination": "edge"}));
    let ensured = scene
        .call("POST", dispatch_api::v1::ENSURE, Some(&plugin), &m)
        .await?;
    assert_eq!(ensured.status, 200, "{:?}", ensured.body);
    let work = scene
        .call(
            "POST",
            &dispatch_api::agent::path(dispatch_api::agent::WORK, "edge"),
            Some(&agent),
            &json!({"waitSeconds": 0}),
        )
        .await?;
    let record = work.body["jobs"][0]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(!record.is_empty(), "{:?}", work.body);
    let big = "x".repeat(200_000);
    let report = json!({"reports": [{"name": record, "state": {"kind": "failed", "detail": {
        "reason": big, "detail": big, "log": big}}}]});
    let stored = scene
        .call(
            "POST",
            &dispatch_api::agent::path(dispatch_api::agent::REPORT, "edge"),
            Some(&agent),
            &report,
        )
        .await?;
    assert_eq!(stored.status, 200, "{:?}", stored.body);
    let mut status = m.clone();
    status["metadata"] = ensured.body["metadata"].clone();
    let verdict = scene
        .call("POST", dispatch_api::v1::STATUS, Some(&plugin), &status)
        .await?;
    let size = verdict.body.to_string().len();
    assert_eq!(verdict.body["phase"], "Failed", "{:?}", verdict.body);
    // Reason and detail at MAX_DETAIL each, the log tail at 4 KiB, plus metadata.
    let bound = 4 * MAX_DETAIL + 4096 + 2048;
    tally::refused(
        "budgets: 600 kB of agent report strings → a verdict of a few kB",
        Outcome {
            refused: size <= bound && !verdict.body.to_string().contains(&"x".repeat(5000)),
            ..Outcome::default()
        },
    );
    Ok(())
}

/// A server that answers every request with `head` and then zeros until the client hangs up;
/// returns its URL and how many body bytes it got to send.
async fn flood(head: &'static str) -> Result<(String, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                if tcp.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = format!("10000\r\n{}\r\n", "0".repeat(0x10000));
                for _ in 0..4096 {
                    if tcp.write_all(chunk.as_bytes()).await.is_err() {
                        return;
                    }
                    counter.fetch_add(0x10000, Ordering::SeqCst);
                }
            });
        }
    });
    Ok((url, sent))
}

#[tokio::test]
async fn oversized_reply_bodies_are_refused_by_the_plugin_and_the_agent_clients() -> Result<()> {
    const HEAD: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    for (who, max) in [
        ("plugin", dispatch_api::client::DEFAULT_MAX_REPLY_BYTES),
        ("agent", dispatch_server::agent::MAX_WORK_REPLY_BYTES),
    ] {
        let (url, sent) = flood(HEAD).await?;
        let client = ServerClient::new(&ClientConfig {
            server: url,
            token_file: None,
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?
        .with_max_reply_bytes(max);
        let result = client.get::<Value>("/v1/destinations").await;
        let refused = matches!(&result, Err(CallError::Transient(m)) if m.contains("larger than"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // 256 MiB offered; the client stopped reading near its limit.
        let read = sent.load(Ordering::SeqCst);
        assert!(refused, "{who}: {result:?}");
        tally::refused(
            &format!("budgets: a 256 MiB reply → refused by the {who}'s client"),
            Outcome {
                refused: refused && read < max + (16 << 20),
                ..Outcome::default()
            },
        );
    }
    Ok(())
}

mod projects;
