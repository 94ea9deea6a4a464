//! The server's `/v1` JSON API and the admin endpoints.
//!
//! * [`router`] builds the API (`/v1/...`, all authenticated) over a [`Dispatcher`]; the log
//!   route (`logs`) identifies people as well as services (`viewer`, [`people`]); the
//!   measurement routes refuse agent tokens and callers not bound to the run's project
//!   (`authz`) before the dispatcher sees the request; the Argo CD Application routes
//!   (`applications`: read an Application, trigger its sync) likewise;
//! * [`ui`] serves the pages for people (`/ui`), which authenticate with a session cookie;
//! * the admin port, the listener (TLS, drain) and the metrics live in [`crate::runtime`].
//!
//! Errors are stable JSON (`{"code": …, "message": …}`) and never carry internals: the cause of an
//! internal error is logged in the request span and the reply names only an id to look it up.

mod applications;
pub mod auth;
mod authz;
mod error;
mod logs;
pub mod people;
pub mod tokenreview;
pub mod ui;
pub mod viewer;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{middleware, Extension, Json, Router};
use dispatch_api::v1::{self as api, Ensured, GcRequest, MeasurementRef, Verdict};
use dispatch_api::v1::{DestinationInfo, GcReply};

use crate::runtime::metrics::{self, Metrics};
pub use applications::AppRef;
pub use auth::{Authenticator, Principal};
use dispatch_api::agent::{self as agent_api, ReportReply, ReportRequest, WorkReply, WorkRequest};
use dispatch_api::logs::{self as logs_api, LogEvent, LogsQuery};
use dispatch_api::observe::{self as observe_api, ApplicationState, SyncRequest};
pub use error::{ApiFailure, Cause, Chain, DispatchError, Reason};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use tracing::Instrument;

/// An AnalysisRun named by people and tools (the log API, the pages): no uid, which they do not
/// know; the dispatcher finds it on the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunName {
    /// the run's namespace (the Kargo project)
    pub namespace: String,
    /// the run
    pub name: String,
}

/// What the API needs from the engine (direct destinations) or the agent store.
pub trait Dispatcher: Send + Sync + 'static {
    /// Creates or adopts the Jobs of one measurement.
    fn ensure<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Ensured, DispatchError>>;
    /// The verdict of one measurement so far.
    fn status<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Verdict, DispatchError>>;
    /// Deletes the Jobs of one measurement (foreground) on every destination.
    fn terminate<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Verdict, DispatchError>>;
    /// Deletes the oldest Jobs of a run beyond `limit`; returns how many were deleted.
    fn gc<'a>(
        &'a self,
        caller: &'a Principal,
        req: GcRequest,
    ) -> BoxFuture<'a, Result<u32, DispatchError>>;
    /// Every known destination.
    fn destinations(&self) -> Vec<DestinationInfo>;
    /// An Argo CD Application's state (read only); the caller and `app.project` were checked.
    fn application<'a>(
        &'a self,
        caller: &'a Principal,
        app: AppRef,
    ) -> BoxFuture<'a, Result<ApplicationState, DispatchError>> {
        let _ = caller;
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!(
                "this server does not read Argo CD Applications ({})",
                app.object()
            )
            .into(),
        ))))
    }
    /// Asks Argo CD to refresh and sync an Application; its state as it is now (the sync runs
    /// in Argo CD, later).
    fn sync_application<'a>(
        &'a self,
        caller: &'a Principal,
        app: AppRef,
        req: SyncRequest,
    ) -> BoxFuture<'a, Result<ApplicationState, DispatchError>> {
        let _ = (caller, req);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!(
                "this server does not sync Argo CD Applications ({})",
                app.object()
            )
            .into(),
        ))))
    }
    /// The whole log of a run's Jobs for `viewer`, who may see the run's namespace (checked by
    /// the route before: a person by SubjectAccessReview, a service by its projects).
    fn run_logs<'a>(
        &'a self,
        viewer: &'a viewer::Viewer,
        run: RunName,
        query: LogsQuery,
    ) -> BoxFuture<'a, Result<BoxStream<'static, LogEvent>, DispatchError>> {
        let _ = (viewer, query);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!(
                "this server serves no logs (run {}/{})",
                run.namespace, run.name
            )
            .into(),
        ))))
    }
    /// The pages' recent runs (newest first, at most `limit`, every project: the pages filter
    /// by viewer); `None` when this server does not watch the control plane's runs.
    fn recent_runs(&self, limit: usize) -> Option<Vec<crate::runs::RunSummary>> {
        let _ = limit;
        None
    }
    /// The pages' summary of one run, if the watch of the control plane's runs holds it.
    fn run_summary(&self, namespace: &str, name: &str) -> Option<crate::runs::RunSummary> {
        let _ = (namespace, name);
        None
    }
    /// Every destination with the number of our Jobs running there now.
    fn destination_load(&self) -> Vec<ui::DestinationLoad> {
        self.destinations()
            .into_iter()
            .map(|info| ui::DestinationLoad {
                info,
                running: None,
            })
            .collect()
    }
    /// The work of an agent destination (long poll).
    fn agent_work<'a>(
        &'a self,
        caller: &'a Principal,
        destination: String,
        req: WorkRequest,
    ) -> BoxFuture<'a, Result<WorkReply, DispatchError>> {
        let _ = (caller, req);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!("{destination} is not an agent destination of this server").into(),
        ))))
    }
    /// An agent's upload of the log it was asked for (request `id`), NDJSON [`LogEvent`]s read
    /// as they come: relayed to the reader, waiting for it when it is slow.
    fn agent_log_upload<'a>(
        &'a self,
        caller: &'a Principal,
        destination: String,
        id: String,
        upload: LogUpload,
    ) -> BoxFuture<'a, Result<agent_api::LogUploadReply, DispatchError>> {
        let _ = (caller, id, upload);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!("{destination} is not an agent destination of this server").into(),
        ))))
    }
    /// An agent's observations of its destination's Jobs.
    fn agent_report<'a>(
        &'a self,
        caller: &'a Principal,
        destination: String,
        req: ReportRequest,
    ) -> BoxFuture<'a, Result<ReportReply, DispatchError>> {
        let _ = (caller, req);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(
            format!("{destination} is not an agent destination of this server").into(),
        ))))
    }
}

/// Shared state of the API handlers.
#[derive(Clone)]
pub struct AppState {
    /// the engine
    pub dispatcher: Arc<dyn Dispatcher>,
    /// who may call: each authenticator tried in turn
    pub auth: Arc<auth::Chain>,
    /// people of the control plane (logs, pages); [`viewer::People::Nobody`] without one
    pub people: Arc<viewer::People>,
    /// request and verdict metrics
    pub metrics: Arc<Metrics>,
}

/// The largest request body accepted: a plugin block plus run metadata is a few KiB.
pub const MAX_BODY: usize = 1 << 20;

/// The OpenAPI document of `/v1`, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Builds the `/v1` API, every route of which requires a bearer token accepted by
/// `state.auth`, and the pages (`/ui`), which take it from their session cookie.
pub fn router(state: AppState) -> Router {
    // The log route identifies people as well as services (`logs`), so it sits outside
    // `require_bearer`; so do the pages (`ui`), which take the token from their session
    // cookie; every other route, and the fallback, stay behind it.
    let authenticated = Router::new()
        .route(api::ENSURE, post(ensure))
        .route(api::STATUS, post(status))
        .route(api::TERMINATE, post(terminate))
        .route(api::GC, post(gc))
        .route("/v1/destinations", get(destinations))
        .route(
            observe_api::APPLICATION,
            get(applications::get).post(applications::post),
        )
        .route(agent_api::WORK, post(agent_work))
        .route(agent_api::REPORT, post(agent_report))
        // A log upload is as long as the log: read as a stream, never buffered, so MAX_BODY
        // does not apply (each line is bounded by the dispatcher instead).
        .route(
            dispatch_api::logs::AGENT_LOGS,
            post(agent_log_upload).layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_bearer,
        ));
    Router::new()
        .route(logs_api::RUN_LOGS, get(logs::run_logs))
        .merge(ui::router())
        .merge(authenticated)
        .layer(middleware::from_fn_with_state(
            state.metrics.clone(),
            metrics::track,
        ))
        .layer(middleware::from_fn(request_span))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// Middleware: every API call runs in a `request` span with its route; authentication fills in
/// the principal and the handlers the run and metric, so every log line of a call names them.
async fn request_span(req: Request, next: middleware::Next) -> axum::response::Response {
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
fn record_measurement(run: &api::RunRef, metric: &str) {
    let span = tracing::Span::current();
    span.record("run", format!("{}/{}", run.namespace, run.name));
    span.record("metric", metric);
}

async fn ensure(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Ensured>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    authz::measurement_caller(&caller, &req.run)?;
    Ok(Json(s.dispatcher.ensure(&caller, req).await?))
}

async fn status(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    authz::measurement_caller(&caller, &req.run)?;
    let v = s.dispatcher.status(&caller, req).await?;
    s.metrics.observe_verdict(&v.phase);
    Ok(Json(v))
}

async fn terminate(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    authz::measurement_caller(&caller, &req.run)?;
    Ok(Json(s.dispatcher.terminate(&caller, req).await?))
}

async fn gc(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<GcRequest>,
) -> Result<Json<GcReply>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    authz::measurement_caller(&caller, &req.run)?;
    Ok(Json(GcReply {
        deleted: s.dispatcher.gc(&caller, req).await?,
    }))
}

async fn agent_work(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<WorkRequest>,
) -> Result<Json<WorkReply>, ApiFailure> {
    Ok(Json(
        s.dispatcher.agent_work(&caller, destination, req).await?,
    ))
}

async fn agent_report(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<ReportRequest>,
) -> Result<Json<ReportReply>, ApiFailure> {
    Ok(Json(
        s.dispatcher.agent_report(&caller, destination, req).await?,
    ))
}

async fn agent_log_upload(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path((destination, id)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    body: axum::body::Body,
) -> Result<Json<agent_api::LogUploadReply>, ApiFailure> {
    use futures::StreamExt;
    let upload = LogUpload {
        body: body.into_data_stream().boxed(),
        bearer: auth::bearer_token(&headers).map(|t| BearerToken(t.to_string())),
        forwarded_by: headers
            .get(FORWARDED_BY)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.chars().take(64).collect()),
    };
    Ok(Json(
        s.dispatcher
            .agent_log_upload(&caller, destination, id, upload)
            .await?,
    ))
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

async fn destinations(State(s): State<AppState>) -> Json<Vec<DestinationInfo>> {
    Json(s.dispatcher.destinations())
}

async fn openapi() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

async fn not_found() -> ApiFailure {
    ApiFailure::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /v1/openapi.json",
    )
}

#[cfg(test)]
mod tests;
