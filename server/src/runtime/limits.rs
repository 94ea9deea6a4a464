//! Budgets of the API port: how many requests are served at once. Beyond the budget a request
//! is answered `503 overloaded` at once (with `Retry-After`), before authentication, so an
//! overload costs neither a TokenReview nor a destination call and every caller retries (the
//! plugin and the agent treat 503 as transient). The connection budget is in
//! [`super::listener::serve_limited`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

/// Default of `serve --max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default of `serve --max-concurrent-requests`.
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;

/// The requests in flight, at most a fixed number.
#[derive(Debug, Clone)]
pub struct ConcurrencyLimit {
    slots: Arc<Semaphore>,
    max: usize,
}

impl ConcurrencyLimit {
    /// At most `max` (≥ 1) requests at once.
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }
}

/// Middleware: runs the request if a slot is free, else answers `503 overloaded`.
pub async fn limit_requests(
    State(limit): State<ConcurrencyLimit>,
    req: Request,
    next: Next,
) -> Response {
    let Ok(_slot) = limit.slots.clone().try_acquire_owned() else {
        tracing::warn!(path = %req.uri().path(), max = limit.max,
                       "request refused: --max-concurrent-requests reached");
        let body = serde_json::json!({
            "code": "overloaded",
            "message": format!(
                "the server is serving its maximum of {} requests (serve --max-concurrent-requests); retry shortly",
                limit.max
            ),
        });
        let mut resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return resp;
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn requests_beyond_the_budget_get_503_at_once_and_slots_come_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let release = Arc::new(tokio::sync::Semaphore::new(0));
        let entered = Arc::new(AtomicUsize::new(0));
        let (held, inside) = (release.clone(), entered.clone());
        let app = Router::new()
            .route(
                "/slow",
                get(move || {
                    let (held, inside) = (held.clone(), inside.clone());
                    async move {
                        inside.fetch_add(1, Ordering::SeqCst);
                        let _ = held.acquire().await;
                    }
                }),
            )
            .route("/fast", get(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(
                ConcurrencyLimit::new(2),
                limit_requests,
            ));
        let call = |path: &'static str| {
            let app = app.clone();
            async move {
                let req = axum::http::Request::get(path).body(Body::empty()).unwrap();
                app.oneshot(req).await.unwrap()
            }
        };
        let a = tokio::spawn(call("/slow"));
        let b = tokio::spawn(call("/slow"));
        // Let both take their slots.
        while entered.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        let refused = call("/fast").await;
        assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        release.add_permits(2);
        assert_eq!(a.await.unwrap().status(), StatusCode::OK);
        assert_eq!(b.await.unwrap().status(), StatusCode::OK);
        assert_eq!(call("/fast").await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn connections_beyond_the_budget_wait_until_one_closes() {
        use std::time::Duration;
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
}
