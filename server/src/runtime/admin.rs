//! The admin port: `/live`, `/ready` (false until the first sync) and `/metrics`. Unauthenticated
//! by design (probes and scrapers); keep it off the public Service.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::metrics::Metrics;

/// Whether the server is ready to take traffic; starts unready.
#[derive(Clone, Default)]
pub struct Readiness {
    ready: Arc<AtomicBool>,
    reason: Arc<Mutex<String>>,
}

impl Readiness {
    /// Unready, with the reason shown by `/ready`.
    pub fn new(reason: &str) -> Self {
        let r = Self::default();
        r.set_unready(reason);
        r
    }

    /// Marks the server ready.
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Marks the server unready and says why.
    pub fn set_unready(&self, reason: &str) {
        *self.reason.lock().expect("readiness lock") = reason.to_string();
        self.ready.store(false, Ordering::Release);
    }

    /// Whether the server is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    metrics: Arc<Metrics>,
}

/// The admin router.
pub fn router(readiness: Readiness, metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/live", get(|| async { "live\n" }))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { readiness, metrics })
}

async fn ready(State(s): State<AdminState>) -> (StatusCode, String) {
    if s.readiness.is_ready() {
        (StatusCode::OK, "ready\n".into())
    } else {
        let reason = s.readiness.reason.lock().expect("readiness lock").clone();
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
    }
}

async fn metrics_text(
    State(s): State<AdminState>,
) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}
