//! Per-project budgets (issue #27): a project saturating its measurement calls, Application
//! calls, log streams or agent log requests is answered `429 over_budget` with `Retry-After`
//! and a message naming the key, while another project's plugin calls are still served (a 503
//! or 429 for them records `starved_call`); agents' log uploads and log readers never take the
//! plugin's request slots; pending log requests are bounded per destination.
//!
//! A call is held by a destination that never answers ([`tarpit`]: the engine gives up after
//! `engine.requestTimeout`, 3 s in these worlds), or by a log read whose agent has not answered
//! yet (up to 30 s): each case checks what it needs while they are held.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::logs::{LogEvent, CONTENT_TYPE};
use dispatch_server::runs::Runs;
use dispatch_server::runtime::limits::BudgetArgs;
use dispatch_server::runtime::metrics::Metrics;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::{measurement, POLICY};
use crate::scene::{agent_token, plugin_token, Scene};
use crate::tally::{self, Outcome};
use crate::world::{eventually, Clusters, World};

/// The two projects: `team-a` floods, `team-b` only wants its calls served.
const A: &str = "team-a";
const B: &str = "team-b";
/// Two agent destinations, both polling this replica.
const AGENTS: &str = "agents: {store: memory, destinations: [{name: edge, namespace: verify}, \
                      {name: edge-2, namespace: verify}]}";

/// Run `n` of `project`: its name and uid.
fn run_of(project: &str, n: u32) -> (String, String) {
    let p = if project == A { 0xa } else { 0xb };
    (
        format!("uat.{project}.{n}"),
        format!("0000{n:04x}-bbbb-4bbb-8ccc-00000000000{p:x}"),
    )
}

/// Measurement `index` of run `n` of `project`, on `destination`.
fn measurement_of(project: &str, n: u32, index: u32, destination: &str) -> Value {
    let mut m = measurement(n, json!({"destination": destination}));
    let (name, uid) = run_of(project, n);
    m["run"] = json!({"name": name, "namespace": project, "uid": uid});
    m["index"] = json!(index);
    m
}

/// A synced watch of AnalysisRuns holding run 1 of each project, metric `budget` with our
/// plugin (the log API finds runs there; measurement calls are confirmed against them).
fn runs() -> Result<Runs> {
    let runs = Runs::default();
    runs.apply(Event::Init);
    for project in [A, B] {
        let (name, uid) = run_of(project, 1);
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": project, "uid": uid},
            "spec": {"metrics": [{"name": "budget", "provider": {"plugin": {
                dispatch_api::block::PLUGIN_NAME: {"destination": "edge"}}}}]}
        }))?;
        runs.apply(Event::InitApply(object));
    }
    runs.apply(Event::InitDone);
    Ok(runs)
}

/// A plugin token of `project` only.
fn token_of(project: &str) -> String {
    plugin_token(&format!("plugin-{project}"), Some(&[project]))
}

/// A reply with its `Retry-After`.
#[derive(Debug)]
struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: Value,
}

impl Answer {
    /// A refusal by the per-project budget `key`: 429, `Retry-After`, the key and the project.
    fn over(&self, key: &str, project: &str) -> bool {
        let message = self.body["message"].as_str().unwrap_or_default();
        self.status == 429
            && self.body["code"] == "over_budget"
            && self.retry_after.as_deref() == Some("1")
            && message.contains(key)
            && message.contains(project)
    }
}

/// `method path` with `token` and a JSON `body` (POST), read whole.
async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &Value,
) -> Result<Answer> {
    let resp = open(addr, method, path, token, body).await?;
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    Ok(Answer {
        status,
        retry_after,
        body,
    })
}

/// `method path` with `token`: the reply as it starts (a log stream stays open while held).
async fn open(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &Value,
) -> Result<reqwest::Response> {
    let method = reqwest::Method::from_bytes(method.as_bytes())?;
    let mut req = reqwest::Client::new()
        .request(method.clone(), format!("http://{addr}{path}"))
        .bearer_auth(token);
    if method == reqwest::Method::POST {
        req = req.json(body);
    }
    req.send().await.with_context(|| format!("calling {path}"))
}

/// The plugin's ensure of measurement `index` of run 1 of `project` on `destination`, with the
/// project's own token.
async fn ensure_of(scene: &Scene, project: &str, index: u32, destination: &str) -> Result<Answer> {
    let m = measurement_of(project, 1, index, destination);
    send(
        scene.addr,
        "POST",
        dispatch_api::v1::ENSURE,
        &token_of(project),
        &m,
    )
    .await
}

/// The followed log of run 1 of `project`.
fn follow_path(project: &str) -> String {
    let (name, _) = run_of(project, 1);
    format!(
        "{}?follow=true",
        dispatch_api::logs::run_logs_path(project, &name)
    )
}

/// `n` followed reads of run 1 of `project`, open (each `200`, its stream held by the reply).
async fn follow(scene: &Scene, project: &str, n: usize) -> Result<Vec<reqwest::Response>> {
    let mut open_reads = Vec::new();
    for _ in 0..n {
        let read = open(
            scene.addr,
            "GET",
            &follow_path(project),
            &token_of(project),
            &json!({}),
        )
        .await?;
        ensure!(
            read.status() == 200,
            "a read of {project}: {:?}",
            read.status()
        );
        open_reads.push(read);
    }
    Ok(open_reads)
}

/// A destination API server that accepts every connection and never answers, and the first
/// line of each request it got.
struct Tarpit {
    url: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Tarpit {
    /// How many requests it got whose first line contains `part`.
    fn got(&self, part: &str) -> usize {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().filter(|l| l.contains(part)).count()
    }
}

async fn tarpit() -> Result<Tarpit> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let seen = lines.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let Ok(n) = tcp.read(&mut buf).await else {
                    return;
                };
                let head = String::from_utf8_lossy(&buf[..n]);
                if let Some(first) = head.lines().next() {
                    seen.lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(first.to_string());
                }
                // Hold the connection, answering nothing, until the client gives up.
                while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
            });
        }
    });
    Ok(Tarpit { url, lines })
}

/// A scene over destinations `a`, `b` and `slow` (the tarpit) with `budgets` of the config,
/// behind request budgets of `requests` slots for the plugin and the API.
async fn slow_scene(
    pit: &Tarpit,
    budgets: &str,
    requests: usize,
) -> Result<(Arc<Scene>, Arc<Metrics>)> {
    let slow = format!(
        "- {{name: slow, server: \"{}\", token: t, namespace: verify}}\n",
        pit.url
    );
    let world = Clusters::start()
        .await?
        .engine(&slow, &format!("{POLICY}\nbudgets: {budgets}"), false)
        .await?;
    for d in ["a", "b"] {
        ensure!(
            world
                .destination(d)?
                .wait_synced(Duration::from_secs(10))
                .await,
            "{d} synced"
        );
    }
    let metrics = Arc::new(Metrics::new());
    let limits = BudgetArgs {
        max_concurrent_requests: requests,
        ..BudgetArgs::default()
    };
    let scene = Scene::serve_budgeted(world, None, limits, metrics.clone()).await?;
    Ok((Arc::new(scene), metrics))
}

/// The answers of `calls` that come within 5 s (the held ones may hang for as long as the
/// destination does: they are aborted).
async fn settled(calls: Vec<tokio::task::JoinHandle<Result<Answer>>>) -> Vec<Answer> {
    let mut out = Vec::new();
    for mut call in calls {
        match tokio::time::timeout(Duration::from_secs(5), &mut call).await {
            Ok(Ok(Ok(answer))) => out.push(answer),
            Ok(_) => {}
            Err(_) => call.abort(),
        }
    }
    out
}

/// Whether `b`'s plugin calls (ensure on destination `b`, then its status) were refused by a
/// budget (503 or 429): a starved call.
async fn b_starved(scene: &Scene) -> Result<bool> {
    let token = token_of(B);
    let m = measurement_of(B, 1, 9, "b");
    let ensured = send(scene.addr, "POST", dispatch_api::v1::ENSURE, &token, &m).await?;
    let mut status = m.clone();
    status["metadata"] = ensured.body["metadata"].clone();
    let verdict = send(
        scene.addr,
        "POST",
        dispatch_api::v1::STATUS,
        &token,
        &status,
    )
    .await?;
    let starved = [&ensured, &verdict]
        .iter()
        .any(|r| r.status == 503 || r.status == 429);
    ensure!(
        starved || (ensured.status == 200 && verdict.status == 200),
        "team-b's calls: {ensured:?} {verdict:?}"
    );
    Ok(starved)
}

#[tokio::test]
async fn a_project_at_its_measurement_calls_leaves_the_plugin_slots_to_the_others() -> Result<()> {
    let pit = tarpit().await?;
    // 12 slots for every plugin call: without a per-project budget team-a's 12 would hold all.
    let (scene, metrics) = slow_scene(&pit, "{measurementCallsPerProject: 3}", 12).await?;
    let token = token_of(A);
    let flood: Vec<_> = (0..12)
        .map(|n| {
            let (scene, token) = (scene.clone(), token.clone());
            let m = measurement_of(A, 100 + n, 1, "slow");
            tokio::spawn(async move {
                send(scene.addr, "POST", dispatch_api::v1::ENSURE, &token, &m).await
            })
        })
        .collect();
    // The three calls team-a may hold reach the destination, and hang there.
    eventually("team-a's calls at the destination", || async {
        Ok((pit.got("POST") >= 3).then_some(()))
    })
    .await?;
    let over = send(
        scene.addr,
        "POST",
        dispatch_api::v1::ENSURE,
        &token,
        &measurement_of(A, 999, 1, "slow"),
    )
    .await?;
    let starved = b_starved(&scene).await?;
    let held = pit.got("POST");
    let answers = settled(flood).await;
    let over_budget = answers
        .iter()
        .filter(|r| r.over("budgets.measurementCallsPerProject", A))
        .count();
    let counted = metrics.encode().contains(
        r#"rollouts_dispatch_over_budget_total{key="budgets.measurementCallsPerProject"} 10"#,
    );
    tally::refused(
        "budgets: team-a holds its 3 measurement calls on a hanging destination → its 10 more 429 naming budgets.measurementCallsPerProject, team-b's ensure and status served",
        Outcome {
            refused: held == 3
                && over_budget == 9
                && over.over("budgets.measurementCallsPerProject", A)
                && counted,
            starved_call: starved,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn a_project_at_its_application_calls_leaves_the_plugin_slots_to_the_others() -> Result<()> {
    let pit = tarpit().await?;
    let (scene, _) = slow_scene(&pit, "{applicationCallsPerProject: 2}", 8).await?;
    let token = token_of(A);
    let app =
        |n: u32| format!("/v1/destinations/slow/applications/argocd/app-{n}?project={A}&stage=uat");
    let flood: Vec<_> = (0..8)
        .map(|n| {
            let (scene, token, path) = (scene.clone(), token.clone(), app(n));
            tokio::spawn(async move { send(scene.addr, "GET", &path, &token, &json!({})).await })
        })
        .collect();
    eventually("team-a's Application reads at the destination", || async {
        Ok((pit.got("applications") >= 2).then_some(()))
    })
    .await?;
    let over = send(scene.addr, "GET", &app(99), &token, &json!({})).await?;
    let starved = b_starved(&scene).await?;
    // team-b's own Application read reaches its destination (no such Application there).
    let b_read = send(
        scene.addr,
        "GET",
        &format!("/v1/destinations/a/applications/argocd/app?project={B}&stage=uat"),
        &token_of(B),
        &json!({}),
    )
    .await?;
    let held = pit.got("applications");
    let over_budget = settled(flood)
        .await
        .iter()
        .filter(|r| r.over("budgets.applicationCallsPerProject", A))
        .count();
    tally::refused(
        "budgets: team-a holds its 2 Application reads on a hanging destination → the rest 429 naming budgets.applicationCallsPerProject, team-b's calls and Application read served",
        Outcome {
            refused: held == 2
                && over_budget == 6
                && over.over("budgets.applicationCallsPerProject", A),
            starved_call: starved || b_read.status == 429 || b_read.status == 503,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn an_application_read_on_a_hanging_destination_ends_at_the_request_timeout() -> Result<()> {
    let pit = tarpit().await?;
    // The test world's `engine.requestTimeout` is 3 s.
    let (scene, _) = slow_scene(&pit, "{}", 8).await?;
    let path = format!("/v1/destinations/slow/applications/argocd/app-1?project={A}&stage=uat");
    let started = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(15),
        send(scene.addr, "GET", &path, &token_of(A), &json!({})),
    )
    .await
    .context("the read still hangs after 15 s")??;
    let message = answer.body["message"].as_str().unwrap_or_default();
    let ended = answer.status == 503 && message.contains("engine.requestTimeout");
    tally::refused(
        "budgets: an Application read on a destination that never answers holds its call only until engine.requestTimeout",
        Outcome {
            refused: ended && pit.got("applications") >= 1,
            starved_call: !ended,
            ..Outcome::default()
        },
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "ended after {:?}",
        started.elapsed()
    );
    Ok(())
}

/// A scene with agent destinations `edge`, `edge-2` (both connected: polled once), run 1 of
/// each project known to the log API, and `records` measurements of run 1 of `team-a` on each
/// destination named (one record each).
async fn agent_scene(budgets: &str, limits: BudgetArgs, records: &[&str]) -> Result<Arc<Scene>> {
    let world = World::start(&format!("{POLICY}\n{AGENTS}\nbudgets: {budgets}")).await?;
    let scene = Arc::new(
        Scene::serve_budgeted(world, Some(runs()?), limits, Arc::new(Metrics::new())).await?,
    );
    let b = [(B, 1, "edge")];
    let a = records.iter().zip(1u32..).map(|(d, index)| (A, index, *d));
    for (project, index, destination) in a.chain(b) {
        let ensured = ensure_of(&scene, project, index, destination).await?;
        ensure!(ensured.status == 200, "{ensured:?}");
    }
    for destination in ["edge", "edge-2"] {
        poll(&scene, destination).await?;
    }
    Ok(scene)
}

/// One poll of `destination`'s agent, answered at once: the ids of the log requests it got.
async fn poll(scene: &Scene, destination: &str) -> Result<Vec<String>> {
    let path = dispatch_api::agent::path(dispatch_api::agent::WORK, destination);
    let work = send(
        scene.addr,
        "POST",
        &path,
        &agent_token(destination),
        &json!({"waitSeconds": 0}),
    )
    .await?;
    ensure!(work.status == 200, "{work:?}");
    Ok(work.body["logs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| l["id"].as_str().map(str::to_string))
        .collect())
}

#[tokio::test]
async fn a_project_at_its_log_streams_leaves_the_others_their_streams_and_calls() -> Result<()> {
    let scene = agent_scene(
        "{logStreamsPerProject: 2}",
        BudgetArgs::default(),
        &["edge"],
    )
    .await?;
    let token = token_of(A);
    // Two followed reads: their agent has not answered, so both stay open.
    let _open = follow(&scene, A, 2).await?;
    let third = send(scene.addr, "GET", &follow_path(A), &token, &json!({})).await?;
    let b_read = open(scene.addr, "GET", &follow_path(B), &token_of(B), &json!({})).await?;
    let starved = b_starved(&scene).await?;
    tally::refused(
        "budgets: team-a follows 2 logs → its 3rd read 429 naming budgets.logStreamsPerProject, team-b's read and plugin calls served",
        Outcome {
            refused: third.over("budgets.logStreamsPerProject", A) && b_read.status() == 200,
            starved_call: starved,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn pending_log_requests_are_bounded_per_destination() -> Result<()> {
    // Run 1 of team-a has two Jobs on edge: each read asks two requests of edge's agent.
    let budgets = "{pendingLogRequestsPerDestination: 3}";
    let scene = agent_scene(budgets, BudgetArgs::default(), &["edge", "edge"]).await?;
    let token = token_of(A);
    let first = follow(&scene, A, 1).await?;
    let second = send(scene.addr, "GET", &follow_path(A), &token, &json!({})).await?;
    // The agent is handed the first read's two requests, nothing of the refused one.
    let handed = poll(&scene, "edge").await?;
    let starved = b_starved(&scene).await?;
    tally::refused(
        "budgets: 2 log requests waiting for edge's agent, a read asking 2 more → 429 naming budgets.pendingLogRequestsPerDestination, nothing more asked of the agent",
        Outcome {
            refused: second.over("budgets.pendingLogRequestsPerDestination", "edge")
                && handed.len() == 2,
            starved_call: starved,
            ..Outcome::default()
        },
    );
    drop(first);
    Ok(())
}

#[tokio::test]
async fn a_project_at_its_log_requests_asks_no_agent_anything() -> Result<()> {
    // Run 1 of team-a has Jobs on edge and edge-2, two each: one read asks four requests.
    let scene = agent_scene(
        "{logRequestsPerProject: 3}",
        BudgetArgs::default(),
        &["edge", "edge", "edge-2", "edge-2"],
    )
    .await?;
    let refused = send(scene.addr, "GET", &follow_path(A), &token_of(A), &json!({})).await?;
    let handed = [poll(&scene, "edge").await?, poll(&scene, "edge-2").await?];
    // team-b's read (one Job on edge) is its own project's share.
    let b_read = open(scene.addr, "GET", &follow_path(B), &token_of(B), &json!({})).await?;
    let starved = b_starved(&scene).await?;
    tally::refused(
        "budgets: a read of team-a asking 4 agent log requests with budgets.logRequestsPerProject 3 → 429 naming it, no agent asked anything, team-b's read served",
        Outcome {
            refused: refused.over("budgets.logRequestsPerProject", A)
                && handed.iter().all(Vec::is_empty)
                && b_read.status() == 200,
            starved_call: starved,
            ..Outcome::default()
        },
    );
    Ok(())
}

/// Starts the agent's upload of request `id` of `destination` and keeps it open (the first
/// line sent, the body never ends).
async fn hold_upload(addr: SocketAddr, destination: &str, id: &str) -> Result<TcpStream> {
    let mut tcp = TcpStream::connect(addr).await?;
    let path = dispatch_api::agent::logs_path(destination, id);
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {}\r\nContent-Type: \
         {CONTENT_TYPE}\r\nTransfer-Encoding: chunked\r\n\r\n",
        agent_token(destination)
    );
    tcp.write_all(head.as_bytes()).await?;
    let event = LogEvent::Note {
        destination: destination.to_string(),
        pod: None,
        text: "streaming".into(),
    };
    let line = format!("{}\n", serde_json::to_string(&event)?);
    tcp.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
        .await?;
    Ok(tcp)
}

/// The status code of the reply `tcp` gets.
async fn status_of(tcp: &mut TcpStream) -> Result<u16> {
    let mut head = [0u8; 12];
    tcp.read_exact(&mut head).await?;
    let line = String::from_utf8_lossy(&head);
    line.get(9..12)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no status line: {line:?}"))
}

#[tokio::test]
async fn log_readers_and_agent_uploads_never_take_the_plugin_slots() -> Result<()> {
    // 2 slots for the plugin and the API, 2 for uploads: readers and uploads fill theirs.
    let limits = BudgetArgs {
        max_concurrent_requests: 2,
        max_log_uploads: 2,
        ..BudgetArgs::default()
    };
    let scene = agent_scene("{}", limits, &["edge"]).await?;
    let readers = follow(&scene, A, 3).await?;
    let ids = poll(&scene, "edge").await?;
    ensure!(ids.len() == 3, "three requests for the agent: {ids:?}");
    // Two uploads stream (and hold both upload slots); the third is refused at once.
    let _uploads = [
        hold_upload(scene.addr, "edge", &ids[0]).await?,
        hold_upload(scene.addr, "edge", &ids[1]).await?,
    ];
    let mut third = hold_upload(scene.addr, "edge", &ids[2]).await?;
    let third_status = status_of(&mut third).await?;
    // With 3 streams and 2 uploads open, the plugin's calls of both projects are served.
    let starved = b_starved(&scene).await?;
    let a_call = ensure_of(&scene, A, 7, "a").await?;
    ensure!(third_status == 503, "the third upload: {third_status}");
    // Meanwhile the two uploads reach their readers.
    let mut streaming = 0;
    for mut read in readers {
        let first = tokio::time::timeout(Duration::from_secs(3), read.chunk()).await;
        if matches!(&first, Ok(Ok(Some(c))) if String::from_utf8_lossy(c).contains("streaming")) {
            streaming += 1;
        }
    }
    ensure!(
        streaming == 2,
        "two uploads reach their readers: {streaming}"
    );
    tally::refused(
        "budgets: 3 followed log reads and 2 streaming agent uploads beside 2 plugin slots → the 3rd upload 503 (--max-log-uploads), every plugin call served",
        Outcome {
            refused: third_status == 503 && a_call.status == 200,
            starved_call: starved || a_call.status == 503 || a_call.status == 429,
            ..Outcome::default()
        },
    );
    Ok(())
}
