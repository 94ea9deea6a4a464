//! The measurement routes of the plugin (`/v1/measurements:*`, `/v1/destinations`): each
//! names its run and metric in the request span, refuses agent tokens and callers of other
//! projects (`http::authz`) before the measurement is touched, holds one of its project's
//! measurement calls (`budgets.measurementCallsPerProject`: beyond it `429 over_budget`, so
//! one project's slow or flooding calls leave the API's slots to the others), and answers JSON.
//! The budget is charged after `authz`, so a caller can only spend its own projects' share.
//!
//! `GET /v1/measurements/hints` is the plugin's long poll for resume hints (`crate::hints`):
//! agent tokens are refused, and a caller sees only the hints of its projects — with
//! `confirmRuns`, only of runs the control plane has in that project, since a hint's namespace
//! comes from a Job's annotation, which whoever edits Jobs on the destination can change; it
//! holds no project's call (it is one connection per plugin, about no run in particular).
//!
//! The routes are generic over [`Measure`], so that the router's own tests (`app/tests.rs`)
//! can script the answers; the server runs them over [`super::Measurements`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use dispatch_api::v1::{self as api, DestinationInfo, Ensured, GcReply, GcRequest};
use dispatch_api::v1::{HintPage, HintQuery, MeasurementRef, Verdict, MAX_HINT_WAIT_SECONDS};

use super::Measurements;
use crate::hints::Hints;
use crate::http::{authz, record_measurement, ApiFailure, ApiJson, DispatchError, Principal};
use crate::runs::Runs;
use crate::runtime::metrics::Metrics;
use crate::runtime::quota::{Held, Quota};

/// What the measurement routes need: [`Measurements`] in the server, a script in tests.
pub trait Measure: Send + Sync + 'static {
    /// Creates or adopts the Jobs of one measurement.
    fn ensure(
        &self,
        req: MeasurementRef,
    ) -> impl Future<Output = Result<Ensured, DispatchError>> + Send;
    /// The verdict of one measurement so far.
    fn status(
        &self,
        req: MeasurementRef,
    ) -> impl Future<Output = Result<Verdict, DispatchError>> + Send;
    /// Deletes the Jobs of one measurement (foreground) on every destination.
    fn terminate(
        &self,
        req: MeasurementRef,
    ) -> impl Future<Output = Result<Verdict, DispatchError>> + Send;
    /// Deletes the oldest Jobs of a run beyond `limit`; returns how many were deleted.
    fn gc(&self, req: GcRequest) -> impl Future<Output = Result<u32, DispatchError>> + Send;
    /// The known destinations `caller` may be shown (`Measurements::destinations`).
    fn destinations(&self, caller: &Principal) -> Vec<DestinationInfo>;
}

impl Measure for Measurements {
    async fn ensure(&self, req: MeasurementRef) -> Result<Ensured, DispatchError> {
        Measurements::ensure(self, req).await
    }
    async fn status(&self, req: MeasurementRef) -> Result<Verdict, DispatchError> {
        Measurements::status(self, req).await
    }
    async fn terminate(&self, req: MeasurementRef) -> Result<Verdict, DispatchError> {
        Measurements::terminate(self, req).await
    }
    async fn gc(&self, req: GcRequest) -> Result<u32, DispatchError> {
        Measurements::gc(self, req).await
    }
    fn destinations(&self, caller: &Principal) -> Vec<DestinationInfo> {
        Measurements::destinations(self, caller)
    }
}

/// The state of the measurement routes.
struct Routes<M> {
    measure: Arc<M>,
    metrics: Arc<Metrics>,
    /// the measurement calls each project has in progress
    calls: Quota,
    /// the resume hints of this process
    hints: Hints,
    /// the control plane's AnalysisRuns, with `confirmRuns`: a hint is shown only for a run
    /// in the namespace it names
    runs: Option<Runs>,
}

impl<M> Clone for Routes<M> {
    fn clone(&self) -> Self {
        Self {
            measure: self.measure.clone(),
            metrics: self.metrics.clone(),
            calls: self.calls.clone(),
            hints: self.hints.clone(),
            runs: self.runs.clone(),
        }
    }
}

/// The measurement routes over `measure` (behind the bearer layer: they need the
/// [`Principal`]); verdicts are counted in `metrics`; each project's calls in progress are
/// bounded by `calls`; the hints route reads `hints`, checked against `runs` when given.
pub fn routes<M: Measure>(
    measure: Arc<M>,
    metrics: Arc<Metrics>,
    calls: Quota,
    (hints, runs): (Hints, Option<Runs>),
) -> Router {
    Router::new()
        .route(api::HINTS, get(hints_page::<M>))
        .route(api::ENSURE, post(ensure::<M>))
        .route(api::STATUS, post(status::<M>))
        .route(api::TERMINATE, post(terminate::<M>))
        .route(api::GC, post(gc::<M>))
        .route("/v1/destinations", get(destinations::<M>))
        .with_state(Routes {
            measure,
            metrics,
            calls,
            hints,
            runs,
        })
}

/// Checks that `caller` acts for `run`'s project, then holds one of that project's calls.
fn admit<M>(s: &Routes<M>, caller: &Principal, run: &api::RunRef) -> Result<Held, ApiFailure> {
    authz::measurement_caller(caller, run)?;
    Ok(s.calls.take(&run.namespace).map_err(DispatchError::from)?)
}

async fn ensure<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Ensured>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    let _call = admit(&s, &caller, &req.run)?;
    Ok(Json(s.measure.ensure(req).await?))
}

async fn status<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    let _call = admit(&s, &caller, &req.run)?;
    let v = s.measure.status(req).await?;
    s.metrics.observe_verdict(&v.phase);
    Ok(Json(v))
}

async fn terminate<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    let _call = admit(&s, &caller, &req.run)?;
    Ok(Json(s.measure.terminate(req).await?))
}

async fn gc<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<GcRequest>,
) -> Result<Json<GcReply>, ApiFailure> {
    record_measurement(&req.run, &req.metric);
    let _call = admit(&s, &caller, &req.run)?;
    Ok(Json(GcReply {
        deleted: s.measure.gc(req).await?,
    }))
}

/// `GET /v1/measurements/hints?epoch=&after=&waitSeconds=`: the hints after `after` for the
/// caller's projects, waiting up to `waitSeconds` (at most [`MAX_HINT_WAIT_SECONDS`]).
async fn hints_page<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
    query: Result<Query<HintQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<HintPage>, ApiFailure> {
    authz::not_an_agent(&caller)?;
    let Query(q) = query.map_err(|e| {
        ApiFailure::new(
            axum::http::StatusCode::BAD_REQUEST,
            "invalid_request",
            format!(
                "{}: the query is `epoch` (text), `after` and `waitSeconds` (numbers)",
                e.body_text()
            ),
        )
    })?;
    let wait = Duration::from_secs(u64::from(q.wait_seconds.min(MAX_HINT_WAIT_SECONDS)));
    let page = s
        .hints
        .after(q.epoch.as_deref(), q.after, wait, |h| {
            caller.projects.allows(&h.namespace)
                && s.runs
                    .as_ref()
                    .is_none_or(|r| r.is_run_in(&h.namespace, &h.run_uid))
        })
        .await;
    Ok(Json(page))
}

async fn destinations<M: Measure>(
    State(s): State<Routes<M>>,
    Extension(caller): Extension<Principal>,
) -> Json<Vec<DestinationInfo>> {
    Json(s.measure.destinations(&caller))
}
