//! The budgets: each kind of request sorted to its own, refusals at once with the budget named,
//! slots given back, and the connection budget of the listener.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::Router;
use tower::ServiceExt;

use super::*;

#[test]
fn each_path_is_sorted_to_its_budget() {
    for (path, budget) in [
        ("/v1/measurements/ensure", Budget::Api),
        ("/v1/measurements/status", Budget::Api),
        ("/v1/destinations", Budget::Api),
        ("/v1/destinations/d/applications/argocd/app", Budget::Api),
        ("/ui/runs", Budget::Api),
        ("/", Budget::Api),
        ("/v1/agents/edge-1/work", Budget::AgentPolls),
        ("/v1/agents/edge-1/report", Budget::AgentReports),
        ("/v1/agents/edge-1/logs/3f2a", Budget::LogUploads),
        ("/v1/runs/team-a/prod.01j.abc1234/logs", Budget::LogReads),
        // Near misses stay with the API: the router answers them 404.
        ("/v1/agents/edge-1/work/more", Budget::Api),
        ("/v1/agents/edge-1/logs", Budget::Api),
        ("/v1/runs/team-a/logs", Budget::Api),
        ("/v2/agents/edge-1/work", Budget::Api),
        ("/v1/agentsx/edge-1/work", Budget::Api),
    ] {
        assert_eq!(Budget::of(path), budget, "{path}");
    }
    // The api crate's route templates land where the module's doc says.
    let fill = |t: &str| t.replace(['{', '}'], "");
    assert_eq!(
        Budget::of(&fill(dispatch_api::agent::WORK)),
        Budget::AgentPolls
    );
    assert_eq!(
        Budget::of(&fill(dispatch_api::agent::REPORT)),
        Budget::AgentReports
    );
    assert_eq!(
        Budget::of(&fill(dispatch_api::logs::AGENT_LOGS)),
        Budget::LogUploads
    );
    assert_eq!(
        Budget::of(&fill(dispatch_api::logs::RUN_LOGS)),
        Budget::LogReads
    );
    assert_eq!(Budget::of(dispatch_api::v1::ENSURE), Budget::Api);
}

/// A router whose `/slow` routes (one per budget) wait on `release`, counting who entered.
fn app(budgets: Budgets, release: Arc<Semaphore>, entered: Arc<AtomicUsize>) -> Router {
    let slow = move || {
        let (held, inside) = (release.clone(), entered.clone());
        async move {
            inside.fetch_add(1, Ordering::SeqCst);
            let _ = held.acquire().await;
        }
    };
    let router = Router::new()
        .route("/v1/measurements/ensure", post(slow.clone()))
        .route("/v1/agents/{d}/work", post(slow))
        .route("/v1/destinations", get(|| async { "ok" }))
        .route("/v1/agents/{d}/report", post(|| async { "ok" }));
    budgets.around(router)
}

async fn call(app: &Router, method: &str, path: &str) -> Response {
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

async fn message(resp: Response) -> String {
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["code"], "overloaded");
    v["message"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_full_poll_budget_never_refuses_the_plugin_and_names_its_flag() {
    let metrics = Arc::new(Metrics::new());
    let budgets = Budgets::new(
        &BudgetArgs {
            max_concurrent_requests: 2,
            max_agent_polls: 3,
            ..BudgetArgs::default()
        },
        metrics.clone(),
    );
    let release = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let app = app(budgets, release.clone(), entered.clone());
    let polls: Vec<_> = (0..3)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, "POST", &format!("/v1/agents/a{i}/work")).await })
        })
        .collect();
    while entered.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    // The poll budget is used up: one more poll is refused, naming the poll budget...
    let refused = call(&app, "POST", "/v1/agents/a9/work").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "5");
    let why = message(refused).await;
    assert!(
        why.contains("3 agent long polls") && why.contains("--max-agent-polls"),
        "{why}"
    );
    // ... while the plugin's and the agents' other calls are served.
    assert_eq!(
        call(&app, "GET", "/v1/destinations").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        call(&app, "POST", "/v1/agents/a0/report").await.status(),
        StatusCode::OK
    );
    let text = metrics.encode();
    assert!(
        text.contains(r#"rollouts_dispatch_budget_in_use{budget="agent_polls"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rollouts_dispatch_budget_refused_total{budget="agent_polls"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"rollouts_dispatch_budget_size{budget="api"} 2"#),
        "{text}"
    );
    release.add_permits(3);
    for p in polls {
        assert_eq!(p.await.unwrap().status(), StatusCode::OK);
    }
    assert!(metrics
        .encode()
        .contains(r#"rollouts_dispatch_budget_in_use{budget="agent_polls"} 0"#));
}

#[tokio::test]
async fn requests_beyond_the_api_budget_get_503_at_once_and_slots_come_back() {
    let budgets = Budgets::new(
        &BudgetArgs {
            max_concurrent_requests: 2,
            ..BudgetArgs::default()
        },
        Arc::new(Metrics::new()),
    );
    let release = Arc::new(Semaphore::new(0));
    let entered = Arc::new(AtomicUsize::new(0));
    let app = app(budgets, release.clone(), entered.clone());
    let slow: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, "POST", "/v1/measurements/ensure").await })
        })
        .collect();
    while entered.load(Ordering::SeqCst) < 2 {
        tokio::task::yield_now().await;
    }
    let refused = call(&app, "GET", "/v1/destinations").await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
    let why = message(refused).await;
    assert!(
        why.contains("2 plugin and API requests (serve --max-concurrent-requests)"),
        "{why}"
    );
    // Agents are not held back by the plugin's budget either.
    assert_eq!(
        call(&app, "POST", "/v1/agents/a0/report").await.status(),
        StatusCode::OK
    );
    release.add_permits(2);
    for s in slow {
        assert_eq!(s.await.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(
        call(&app, "GET", "/v1/destinations").await.status(),
        StatusCode::OK
    );
}

#[test]
fn the_open_file_limit_is_raised_toward_the_connection_budget_never_lowered() {
    use nix::sys::resource::{getrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    assert_eq!(
        raise_open_files(1),
        Some(soft),
        "a smaller want lowers nothing"
    );
    let wanted = soft.saturating_add(1).min(hard);
    assert_eq!(raise_open_files(wanted), Some(wanted.max(soft)));
}

#[tokio::test]
async fn connections_beyond_the_budget_wait_until_one_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/", get(|| async { "ok" }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(super::super::listener::serve_limited(
        listener,
        app,
        None,
        async {
            let _ = stopped.await;
        },
        Some(2),
    ));
    // Two idle connections take both slots.
    let first = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _second = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
    third
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let early =
        tokio::time::timeout(Duration::from_millis(300), third.read_to_end(&mut answer)).await;
    assert!(
        early.is_err(),
        "served beyond the connection budget: {answer:?}"
    );
    drop(first);
    tokio::time::timeout(Duration::from_secs(5), third.read_to_end(&mut answer))
        .await
        .expect("served once a slot is free")
        .unwrap();
    assert!(String::from_utf8_lossy(&answer).starts_with("HTTP/1.1 200"));
    let _ = stop.send(());
    let _ = server.await;
}

#[tokio::test]
async fn a_log_read_holds_its_slot_until_its_stream_is_dropped() {
    let one_read = BudgetArgs {
        max_log_reads: 1,
        ..BudgetArgs::default()
    };
    let metrics = Arc::new(Metrics::new());
    let budgets = Budgets::new(&one_read, metrics.clone());
    // A followed log: the reply's headers come at once, its body never ends.
    let follow = || async {
        Body::from_stream(futures::stream::pending::<
            Result<bytes::Bytes, std::io::Error>,
        >())
    };
    let app = budgets.around(
        Router::new()
            .route("/v1/runs/{ns}/{name}/logs", get(follow))
            .route("/v1/destinations", get(|| async { "ok" })),
    );
    let path = "/v1/runs/team-a/uat.1/logs";
    let open = call(&app, "GET", path).await;
    assert_eq!(open.status(), StatusCode::OK);
    let refused = call(&app, "GET", path).await;
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(message(refused).await.contains("--max-log-reads"));
    assert!(metrics
        .encode()
        .contains(r#"rollouts_dispatch_budget_in_use{budget="log_reads"} 1"#));
    // Streaming log readers never take the plugin's slots.
    assert_eq!(
        call(&app, "GET", "/v1/destinations").await.status(),
        StatusCode::OK
    );
    drop(open);
    assert_eq!(call(&app, "GET", path).await.status(), StatusCode::OK);
    assert!(metrics
        .encode()
        .contains(r#"rollouts_dispatch_budget_in_use{budget="log_reads"} 0"#));
}
