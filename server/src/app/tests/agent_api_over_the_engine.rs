//! The agent API over the real engine and the in-memory store: no cluster is needed, because
//! the server never reaches an agent destination itself.

use super::*;
use crate::measure::Measurements;
use crate::verdict::DestState;
use dispatch_api::agent::{self as agent_api, ReportReply, ReportRequest, WorkReply};
use dispatch_api::agent::{Report, WorkItem};

fn agent_token(destination: &str) -> String {
    issue(
        KEY,
        &Claims {
            sub: format!("agent:{destination}"),
            aud: auth::AUDIENCE.into(),
            exp: now() + 600,
            iat: now(),
            jti: format!("a-{destination}"),
            destination: Some(destination.into()),
            projects: None,
        },
    )
    .unwrap()
}

async fn engine_app() -> (Router, Arc<Measurements>) {
    let mut config = crate::config::ServerConfig::parse(
        "agents: {destinations: [{name: cluster-b, namespace: verify}, {name: cluster-c}]}\n\
         policy: {rules: [{projects: ['*'], destinations: [cluster-b, cluster-c], namespaces: ['*']}]}",
        "config file t.yaml",
    )
    .unwrap();
    config.kubeconfig_contexts = None;
    let engine = crate::Engine::start(config).await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let features = features_of(engine, metrics.clone());
    let measure = features.measure.clone();
    let scene = Scene {
        features,
        gate: gate(),
        metrics,
    };
    (router(scene), measure)
}

fn block(dest: &str) -> serde_json::Value {
    serde_json::json!({"run": {"name": "r", "namespace": "p", "uid": "u"}, "metric": "m", "index": 1,
        "block": {"destination": dest, "logTail": 3,
                  "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}}})
}

async fn work(
    app: &Router,
    dest: &str,
    token: &str,
    req: serde_json::Value,
) -> (StatusCode, Vec<u8>) {
    let (status, body, _) = call(
        app,
        "POST",
        &agent_api::path(agent_api::WORK, dest),
        Some(token),
        Some(serde_json::to_vec(&req).unwrap()),
    )
    .await;
    (status, body)
}

async fn report(app: &Router, token: &str, name: &str, state: Option<DestState>) -> ReportReply {
    let req = ReportRequest {
        reports: vec![Report::new(name, state)],
    };
    let (status, body, _) = call(
        app,
        "POST",
        &agent_api::path(agent_api::REPORT, "cluster-b"),
        Some(token),
        Some(serde_json::to_vec(&req).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

async fn verdict(app: &Router, path: &str) -> Verdict {
    let (status, body, _) = call(
        app,
        "POST",
        path,
        Some(&valid()),
        Some(serde_json::to_vec(&block("cluster-b")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn an_agent_picks_up_reports_and_deletes_its_destinations_jobs() {
    let (app, _) = engine_app().await;
    let b = agent_token("cluster-b");
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&valid()),
        Some(serde_json::to_vec(&block("cluster-b")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let ensured: Ensured = serde_json::from_slice(&body).unwrap();
    assert_eq!(ensured.destinations, vec!["cluster-b"]);
    assert_eq!(ensured.namespace, "verify");

    // The agent gets the Job to create, with the same name and context as a direct one.
    let (status, body) = work(&app, "cluster-b", &b, serde_json::json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let reply: WorkReply = serde_json::from_slice(&body).unwrap();
    let [WorkItem {
        name,
        spec,
        reported,
    }] = &reply.jobs[..]
    else {
        panic!("one job: {reply:?}")
    };
    assert!(!reported && !spec.delete);
    assert_eq!(spec.job_name, ensured.job_name);
    let job = spec.job.as_ref().unwrap();
    assert_eq!(job["metadata"]["name"], ensured.job_name.as_str());
    assert_eq!(job["metadata"]["namespace"], "verify");
    assert_eq!(spec.log_tail, 3);

    // A transient create failure is not "reported": the agent tries the create again, and its
    // work has not changed (a poll on it stays open).
    let unavailable = DestState::Unavailable("cannot create job: HTTP 503".into());
    assert_eq!(report(&app, &b, name, Some(unavailable)).await.accepted, 1);
    let (_, body) = work(&app, "cluster-b", &b, serde_json::json!({})).await;
    let retry: WorkReply = serde_json::from_slice(&body).unwrap();
    assert!(!retry.jobs[0].reported, "{retry:?}");
    assert_eq!(retry.fingerprint, reply.fingerprint);

    // A poll with the current fingerprint waits, and answers as soon as the work changes.
    let poll = {
        let app = app.clone();
        let b = b.clone();
        let fingerprint = reply.fingerprint.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let (status, body) = work(
                &app,
                "cluster-b",
                &b,
                serde_json::json!({"fingerprint": fingerprint, "waitSeconds": 50}),
            )
            .await;
            (status, body, started.elapsed())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!poll.is_finished(), "an unchanged poll is held open");
    let r = report(&app, &b, name, Some(DestState::Running(None))).await;
    assert_eq!(r.accepted, 1);
    let (status, body, waited) = poll.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(waited < std::time::Duration::from_secs(20), "{waited:?}");
    let changed: WorkReply = serde_json::from_slice(&body).unwrap();
    assert!(changed.jobs[0].reported);
    assert_ne!(changed.fingerprint, reply.fingerprint);

    assert_eq!(verdict(&app, api::STATUS).await.phase, "Running");
    report(
        &app,
        &b,
        name,
        Some(DestState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "exit 1".into(),
            log: Some("curl: (7) connection refused".into()),
        }),
    )
    .await;
    let v = verdict(&app, api::STATUS).await;
    assert_eq!(v.phase, "Failed");
    assert!(
        v.message.contains("cluster-b") && v.message.contains("connection refused"),
        "{}",
        v.message
    );

    // Terminate: the agent is asked to delete, reports the Job gone, the record goes away.
    let v = verdict(&app, api::TERMINATE).await;
    assert!(v.message.contains("cluster-b"), "{}", v.message);
    let (_, body) = work(&app, "cluster-b", &b, serde_json::json!({})).await;
    let reply: WorkReply = serde_json::from_slice(&body).unwrap();
    assert!(reply.jobs[0].spec.delete);
    assert_eq!(report(&app, &b, name, None).await.accepted, 1);
    let (_, body) = work(&app, "cluster-b", &b, serde_json::json!({})).await;
    let reply: WorkReply = serde_json::from_slice(&body).unwrap();
    assert!(reply.jobs.is_empty(), "{reply:?}");
    assert_eq!(
        report(&app, &b, name, None).await.unknown,
        vec![name.clone()]
    );
}

#[tokio::test]
async fn agents_see_only_their_own_destination() {
    let (app, measure) = engine_app().await;
    let b = agent_token("cluster-b");
    let (status, body) = work(&app, "cluster-c", &b, serde_json::json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(api_error(&body)
        .message
        .contains("is for destination \"cluster-b\", not \"cluster-c\""));
    let (status, body) = work(&app, "cluster-b", &valid(), serde_json::json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(api_error(&body)
        .message
        .contains("token issue --destination cluster-b"));
    let (status, body) = work(
        &app,
        "nowhere",
        &agent_token("nowhere"),
        serde_json::json!({}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(api_error(&body)
        .message
        .contains("agents.destinations in config file t.yaml"));
    // An agent token cannot start measurements either.
    let (status, _, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&b),
        Some(serde_json::to_vec(&block("cluster-b")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Reports on records of another destination are refused.
    let (status, _, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&valid()),
        Some(serde_json::to_vec(&block("cluster-c")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, body) = work(
        &app,
        "cluster-c",
        &agent_token("cluster-c"),
        serde_json::json!({}),
    )
    .await;
    let c_work: WorkReply = serde_json::from_slice(&body).unwrap();
    let req = ReportRequest {
        reports: vec![Report::new(
            c_work.jobs[0].name.clone(),
            Some(DestState::Succeeded),
        )],
    };
    let (status, _, _) = call(
        &app,
        "POST",
        &agent_api::path(agent_api::REPORT, "cluster-b"),
        Some(&b),
        Some(serde_json::to_vec(&req).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Who polled shows up in /v1/destinations.
    let rows = measure.destinations(&Principal::plugin("operator"));
    let row = |n: &str| rows.iter().find(|r| r.name == n).unwrap().clone();
    assert_eq!(row("cluster-b").source, "agent");
    assert!(row("cluster-b").connected && row("cluster-b").last_contact.is_some());
    assert!(row("cluster-c").connected, "cluster-c's agent polled above");
}
