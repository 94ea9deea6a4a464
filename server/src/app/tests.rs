//! API tests over the real router (tower `oneshot`) and a real TLS listener, with scripted
//! measurements standing in for the engine's (the engine has its own real-cluster tests); the
//! other features run over an engine with no destination.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use dispatch_api::v1::{ApiError, Ensured, GcRequest, MeasurementRef, Verdict};
use tower::ServiceExt;

use axum::Router;
use dispatch_api::agent as agent_api;
use dispatch_api::v1::{self as api, DestinationInfo};

use super::Features;
use crate::http::auth::{self, issue, Chain, Claims, JwtAuthenticator};
use crate::http::{Authenticator, DispatchError, Gate, Principal, MAX_BODY};
use crate::measure::Measure;
use crate::runtime::admin::{self, Readiness};
use crate::runtime::listener::{serve, tls_config, HEADER_READ_TIMEOUT};
use crate::runtime::metrics::Metrics;
use tokio::net::TcpListener;

struct Scripted {
    calls: Mutex<Vec<(String, String)>>,
}

impl Measure for Scripted {
    async fn ensure(&self, req: MeasurementRef) -> Result<Ensured, DispatchError> {
        self.calls
            .lock()
            .unwrap()
            .push(("ensure".into(), req.metric.clone()));
        let dest = req.block["destination"].as_str().unwrap_or_default();
        match dest {
            "a" => Ok(Ensured {
                job_name: format!("{}.{}.{}", req.run.uid, req.metric, req.index),
                namespace: "v".into(),
                destinations: vec!["a".into()],
                metadata: BTreeMap::new(),
            }),
            "boom" => Err(DispatchError::Internal(
                "kube client panicked at secret-detail".into(),
            )),
            other => Err(DispatchError::UnknownDestination(
                format!("unknown destination {other:?}; known destinations: a, b").into(),
            )),
        }
    }
    async fn status(&self, req: MeasurementRef) -> Result<Verdict, DispatchError> {
        self.calls
            .lock()
            .unwrap()
            .push(("status".into(), req.metric.clone()));
        Ok(Verdict {
            phase: "Successful".into(),
            message: "a: Complete".into(),
            metadata: BTreeMap::new(),
        })
    }
    async fn terminate(&self, _: MeasurementRef) -> Result<Verdict, DispatchError> {
        Err(DispatchError::Forbidden(
            "project p may not use destination b (policy.rules)".into(),
        ))
    }
    async fn gc(&self, req: GcRequest) -> Result<u32, DispatchError> {
        Ok(req.limit)
    }
    fn destinations(&self, _caller: &Principal) -> Vec<DestinationInfo> {
        vec![DestinationInfo {
            name: "a".into(),
            source: "config".into(),
            default_namespace: "v".into(),
            connected: true,
            ..Default::default()
        }]
    }
}

const KEY: &[u8] = b"test-signing-key-0123456789abcdef";
const OLD_KEY: &[u8] = b"old-signing-key-0123456789abcdef";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(key: &[u8], exp: u64, aud: &str, jti: &str) -> String {
    issue(
        key,
        &Claims {
            sub: "plugin".into(),
            aud: aud.into(),
            exp,
            iat: now(),
            jti: jti.into(),
            destination: None,
            projects: Some(vec!["*".into()]),
        },
    )
    .unwrap()
}

fn valid() -> String {
    token(KEY, now() + 600, auth::AUDIENCE, "t1")
}

/// The router's parts: the features (measurements scripted, the rest over an engine with no
/// destination), who may call, the metrics.
struct Scene<M = Scripted> {
    features: Features<M>,
    gate: Gate,
    metrics: Arc<Metrics>,
}

/// An engine with no destination and no control plane.
async fn empty_engine() -> crate::Engine {
    let mut config = crate::config::ServerConfig::parse("", "config file t.yaml").unwrap();
    config.kubeconfig_contexts = None;
    crate::Engine::start(config).await.unwrap()
}

/// The features of `engine` with its measurements, as `serve` builds them.
fn features_of(engine: crate::Engine, metrics: Arc<Metrics>) -> Features {
    let signer = crate::signing::Signer::new(&[KEY.to_vec()]).unwrap();
    Features::new(engine, metrics, Arc::new(signer), super::Options::default())
}

fn gate() -> Gate {
    let jwt = Authenticator::Jwt(JwtAuthenticator::new(
        &[KEY.to_vec(), OLD_KEY.to_vec()],
        ["revoked-id".to_string()],
    ));
    Gate {
        auth: Arc::new(Chain(vec![jwt])),
        people: Arc::new(crate::http::viewer::People::Nobody),
        sessions: Arc::default(),
    }
}

async fn state() -> (Scene, Arc<Scripted>) {
    let d = Arc::new(Scripted {
        calls: Mutex::new(Vec::new()),
    });
    let metrics = Arc::new(Metrics::new());
    let features = features_of(empty_engine().await, metrics.clone()).with_measure(d.clone());
    (
        Scene {
            features,
            gate: gate(),
            metrics,
        },
        d,
    )
}

fn router<M: Measure>(s: Scene<M>) -> Router {
    super::router(&s.features, s.gate, s.metrics)
}

fn measurement(dest: &str) -> serde_json::Value {
    serde_json::json!({"run": {"name": "r", "namespace": "p", "uid": "u"}, "metric": "m", "index": 1,
                       "block": {"destination": dest, "spec": {"template": {}}}})
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> (StatusCode, Vec<u8>, axum::http::HeaderMap) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/json");
    if let Some(t) = token {
        req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = app
        .clone()
        .oneshot(req.body(body.map_or_else(Body::empty, Body::from)).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    (
        parts.status,
        axum::body::to_bytes(body, usize::MAX)
            .await
            .unwrap()
            .to_vec(),
        parts.headers,
    )
}

fn api_error(body: &[u8]) -> ApiError {
    serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("not a JSON error ({e}): {}", String::from_utf8_lossy(body)))
}

#[tokio::test]
async fn every_endpoint_needs_a_valid_token() {
    let (s, d) = state().await;
    let app = router(s);
    let body = serde_json::to_vec(&measurement("a")).unwrap();
    let expired = token(KEY, now() - 3600, auth::AUDIENCE, "t2");
    let other_aud = token(KEY, now() + 600, "someone-else", "t3");
    let revoked = token(KEY, now() + 600, auth::AUDIENCE, "revoked-id");
    let forged = token(
        b"not-our-key-at-all-0123456789abcd",
        now() + 600,
        auth::AUDIENCE,
        "t4",
    );
    for (tok, want) in [
        (None, "missing bearer token"),
        (Some(expired.as_str()), "expired"),
        (Some(other_aud.as_str()), "audience"),
        (Some(revoked.as_str()), "revoked"),
        (Some(forged.as_str()), "signature"),
        (Some("garbage"), "invalid token"),
    ] {
        for (method, path) in [
            ("POST", api::ENSURE),
            ("GET", "/v1/destinations"),
            ("GET", "/v1/openapi.json"),
            ("GET", "/v1/nope"),
        ] {
            let (status, body, headers) = call(&app, method, path, tok, Some(body.clone())).await;
            assert_eq!(
                status,
                StatusCode::UNAUTHORIZED,
                "{method} {path} with {tok:?}"
            );
            assert_eq!(headers[header::WWW_AUTHENTICATE], "Bearer");
            let e = api_error(&body);
            assert!(
                e.code == "unauthenticated" && e.message.contains(want),
                "{want}: {e:?}"
            );
        }
    }
    assert!(
        d.calls.lock().unwrap().is_empty(),
        "nothing reached the engine"
    );
}

#[tokio::test]
async fn a_valid_token_reaches_the_engine_with_its_principal() {
    let (s, d) = state().await;
    let app = router(s);
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&valid()),
        Some(serde_json::to_vec(&measurement("a")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let e: Ensured = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (e.job_name.as_str(), e.destinations),
        ("u.m.1", vec!["a".to_string()])
    );
    assert_eq!(
        d.calls.lock().unwrap()[0],
        ("ensure".to_string(), "m".to_string())
    );
    // A token signed with the previous key is still accepted during rotation.
    let old = token(OLD_KEY, now() + 600, auth::AUDIENCE, "t5");
    let (status, _, _) = call(
        &app,
        "POST",
        api::STATUS,
        Some(&old),
        Some(serde_json::to_vec(&measurement("a")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn engine_errors_are_stable_json_without_internals() {
    let (s, _) = state().await;
    let app = router(s);
    let t = valid();
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&t),
        Some(serde_json::to_vec(&measurement("zz")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let e = api_error(&body);
    assert_eq!(e.code, "unknown_destination");
    assert!(
        e.message.contains("\"zz\"") && e.message.contains("a, b"),
        "{}",
        e.message
    );
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&t),
        Some(serde_json::to_vec(&measurement("boom")).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    let e = api_error(&body);
    assert!(
        e.code == "internal" && !e.message.contains("secret-detail"),
        "{e:?}"
    );
    let (status, body, _) = call(
        &app,
        "POST",
        api::TERMINATE,
        Some(&t),
        Some(serde_json::to_vec(&measurement("a")).unwrap()),
    )
    .await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::FORBIDDEN, "forbidden")
    );
}

#[tokio::test]
async fn bad_requests_get_json_errors() {
    let (s, _) = state().await;
    let app = router(s);
    let t = valid();
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&t),
        Some(b"{not json".to_vec()),
    )
    .await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::BAD_REQUEST, "invalid_request")
    );
    let (status, body, _) = call(
        &app,
        "POST",
        api::ENSURE,
        Some(&t),
        Some(br#"{"run":{}}"#.to_vec()),
    )
    .await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, "invalid_request")
    );
    let big = vec![b' '; MAX_BODY + 1];
    let (status, body, _) = call(&app, "POST", api::ENSURE, Some(&t), Some(big)).await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request")
    );
    let (status, body, _) = call(&app, "GET", "/v1/nope", Some(&t), None).await;
    assert_eq!(
        (status, api_error(&body).code.as_str()),
        (StatusCode::NOT_FOUND, "not_found")
    );
}

#[tokio::test]
async fn the_openapi_document_lists_exactly_the_routes() {
    let (s, _) = state().await;
    let app = router(s);
    let (status, body, _) = call(&app, "GET", "/v1/openapi.json", Some(&valid()), None).await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let mut documented: Vec<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    documented.sort();
    let mut served = vec![
        api::ENSURE,
        api::STATUS,
        api::TERMINATE,
        api::GC,
        api::HINTS,
        "/v1/destinations",
        "/v1/openapi.json",
        agent_api::WORK,
        agent_api::REPORT,
        dispatch_api::logs::AGENT_LOGS,
        dispatch_api::observe::APPLICATION,
        dispatch_api::observe::APPLICATION_SYNC,
        dispatch_api::logs::RUN_LOGS,
    ];
    served.sort();
    assert_eq!(documented, served);
    // And every served route answers (not 404) with a token.
    for path in served {
        let method = if doc["paths"][path].get("post").is_some() {
            "POST"
        } else {
            "GET"
        };
        let (status, _, _) = call(
            &app,
            method,
            path,
            Some(&valid()),
            Some(serde_json::to_vec(&measurement("a")).unwrap()),
        )
        .await;
        assert_ne!(status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn admin_readiness_and_metrics() {
    let (s, _) = state().await;
    let metrics = s.metrics.clone();
    let api_app = router(s);
    let readiness = Readiness::new("destinations not synced yet");
    let app = admin::router(readiness.clone(), metrics);
    let (status, body, _) = call(&app, "GET", "/ready", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("destinations not synced yet"));
    readiness.set_ready();
    assert_eq!(
        call(&app, "GET", "/ready", None, None).await.0,
        StatusCode::OK
    );
    assert_eq!(
        call(&app, "GET", "/live", None, None).await.0,
        StatusCode::OK
    );
    call(
        &api_app,
        "POST",
        api::STATUS,
        Some(&valid()),
        Some(serde_json::to_vec(&measurement("a")).unwrap()),
    )
    .await;
    call(&api_app, "POST", api::STATUS, None, None).await;
    let (_, body, _) = call(&app, "GET", "/metrics", None, None).await;
    let text = String::from_utf8(body).unwrap();
    assert!(text.contains(r#"rollouts_dispatch_http_requests_total{route="/v1/measurements/status",method="POST",code="200"} 1"#), "{text}");
    assert!(text.contains(r#"code="401"} 1"#), "{text}");
    assert!(
        text.contains(r#"rollouts_dispatch_verdicts_total{phase="Successful"} 1"#),
        "{text}"
    );
}

#[tokio::test]
async fn serves_tls_and_drains_on_shutdown() {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = std::env::temp_dir().join(format!("rd-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert_file, key_file) = (dir.join("tls.crt"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.cert.pem()).unwrap();
    std::fs::write(&key_file, cert.signing_key.serialize_pem()).unwrap();
    let tls = tls_config(&cert_file, &key_file).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (s, _) = state().await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router(s), Some(tls), async move {
        let _ = stop_rx.await;
    }));
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.cert.pem().as_bytes()).unwrap())
        .build()
        .unwrap();
    let resp = client
        .get(format!("https://localhost:{port}/v1/destinations"))
        .bearer_auth(valid())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rows: Vec<DestinationInfo> = resp.json().await.unwrap();
    assert_eq!(rows[0].name, "a");
    // Plain HTTP on the TLS port is refused, not served.
    assert!(
        reqwest::get(format!("http://127.0.0.1:{port}/v1/destinations"))
            .await
            .is_err()
    );
    stop_tx.send(()).unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(30), server)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_client_trickling_its_headers_is_cut_off() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (s, _) = state().await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(listener, router(s), None, async move {
        let _ = stop_rx.await;
    }));
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /v1/destinations HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut buf = Vec::new();
    // The server closes the connection (with or without a 408) once the header timeout passes.
    let read = tokio::time::timeout(HEADER_READ_TIMEOUT * 2, slow.read_to_end(&mut buf)).await;
    assert!(
        read.is_ok(),
        "the connection was still open after {:?}",
        HEADER_READ_TIMEOUT * 2
    );
    assert!(started.elapsed() >= HEADER_READ_TIMEOUT - std::time::Duration::from_secs(1));
    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn agents_and_callers_of_other_projects_never_reach_the_measurements() {
    let (state, scripted) = state().await;
    let app = router(state);
    let jwt = |sub: &str, destination: Option<&str>, projects: Option<Vec<String>>| {
        let claims = Claims {
            sub: sub.into(),
            aud: auth::AUDIENCE.into(),
            exp: now() + 600,
            iat: now(),
            jti: sub.into(),
            destination: destination.map(Into::into),
            projects,
        };
        issue(KEY, &claims).unwrap()
    };
    let agent = jwt("agent:a", Some("a"), None);
    let other_project = jwt("ci-team-b", None, Some(vec!["team-b".into()]));
    // `measurement` is a run of namespace `p`; `limit` makes it a GC request too.
    let mut body = measurement("a");
    body["limit"] = serde_json::json!(1);
    let body = serde_json::to_vec(&body).unwrap();
    for token in [&agent, &other_project] {
        for path in [api::ENSURE, api::STATUS, api::TERMINATE, api::GC] {
            let (status, reply, _) =
                call(&app, "POST", path, Some(token), Some(body.clone())).await;
            assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
            assert_eq!(api_error(&reply).code, "forbidden", "{path}");
        }
    }
    assert!(scripted.calls.lock().unwrap().is_empty());
}

mod agent_api_over_the_engine;
