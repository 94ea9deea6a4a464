//! The web layer every feature's routes stand on: who is calling (`auth`, `tokenreview`, the
//! people of `viewer` and [`people`]), what they may do (`authz`), stable JSON errors (`error`),
//! the JSON body extractor, the `request` span of every call.
//!
//! The routes themselves live with their features (`measure`, `logs`, `applications`, `ui`),
//! and `app` assembles them into the server's router; this module knows no feature and nothing
//! of the engine. Errors are stable JSON (`{"code": …, "message": …}`) and never carry
//! internals: the cause of an internal error is logged in the request span and the reply names
//! only an id to look it up.

pub mod auth;
pub mod authz;
mod error;
pub mod people;
pub mod sessions;
pub mod tokenreview;
pub mod viewer;

use std::sync::Arc;

use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::{middleware, Json};
use dispatch_api::v1 as api;

pub use auth::{Authenticator, Principal};
pub use error::{ApiFailure, Cause, Chain, DispatchError, Reason};
use futures::stream::BoxStream;
use tracing::Instrument;

/// An AnalysisRun named by people and tools (the log API, the pages): no uid, which they do not
/// know; the log feature finds it on the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunName {
    /// the run's namespace (the Kargo project)
    pub namespace: String,
    /// the run
    pub name: String,
}

/// Who may call: what the bearer layer and the log and page routes identify callers with.
#[derive(Clone)]
pub struct Gate {
    /// who may call the API (services: plugins, tools, agents): each authenticator tried in turn
    pub auth: Arc<auth::Chain>,
    /// people of the control plane (logs, pages); [`viewer::People::Nobody`] without one
    pub people: Arc<viewer::People>,
    /// the pages' logins on this replica (`sessions`)
    pub sessions: Arc<sessions::Sessions>,
}

/// The largest request body accepted: a plugin block plus run metadata is a few KiB.
pub const MAX_BODY: usize = 1 << 20;

/// The OpenAPI document of `/v1`, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Middleware: every API call runs in a `request` span with its route; authentication fills in
/// the principal and the handlers the run and metric, so every log line of a call names them.
pub async fn request_span(req: Request, next: middleware::Next) -> axum::response::Response {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |m| m.as_str())
        .to_string();
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        route,
        principal = tracing::field::Empty,
        run = tracing::field::Empty,
        metric = tracing::field::Empty,
    );
    next.run(req).instrument(span).await
}

/// Names the measurement in the current request span.
pub fn record_measurement(run: &api::RunRef, metric: &str) {
    let span = tracing::Span::current();
    span.record("run", format!("{}/{}", run.namespace, run.name));
    span.record("metric", metric);
}

/// The header a replica sets on an agent's log upload it forwards to the replica holding the
/// reader (its own address as value, for the logs): an upload carrying it is never forwarded
/// again. An agent setting it only stops its own upload from being forwarded.
pub const FORWARDED_BY: &str = "x-rollouts-dispatch-forwarded-by";

/// An agent's log upload as the route received it.
pub struct LogUpload {
    /// the NDJSON body, read as it comes
    pub body: BoxStream<'static, Result<axum::body::Bytes, axum::Error>>,
    /// the caller's own bearer token: a replica that does not hold the request forwards the
    /// upload with it, so that the one holding it authenticates the agent exactly as here
    pub bearer: Option<BearerToken>,
    /// [`FORWARDED_BY`]: the forwarding replica's address
    pub forwarded_by: Option<String>,
}

/// A bearer token, never printed (`Debug` says only that there is one).
#[derive(Clone)]
pub struct BearerToken(pub String);

impl std::fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BearerToken(…)")
    }
}

/// A JSON body whose rejections (malformed, too large, wrong content type) are JSON errors too.
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiFailure;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(ApiFailure::new(
                rejection.status(),
                "invalid_request",
                rejection.body_text(),
            )),
        }
    }
}

/// `GET /v1/openapi.json`: the document of the API.
pub async fn openapi() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

/// The reply to a path no route serves.
pub async fn not_found() -> ApiFailure {
    ApiFailure::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /v1/openapi.json",
    )
}
