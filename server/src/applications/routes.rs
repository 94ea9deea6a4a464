//! The Argo CD Application routes, for Kargo's `http` promotion step:
//! `GET /v1/destinations/{d}/applications/{ns}/{name}` (its [`ApplicationState`]) and
//! `POST …/{name}:sync` (a [`SyncRequest`]: refresh and sync it; `202` with its state as it is
//! now, the sync itself runs in Argo CD).
//!
//! Checked here, before [`super::Applications`] sees the request: the path names a valid
//! namespace and Application (`400` otherwise: no `..`, no `/`), the body is valid, the request
//! names the Kargo Stage it is for (`stage` in the POST body, `?stage=` on GET: `400` naming it
//! when missing), and the caller is a plugin token acting for one project
//! (`authz::application_caller`). [`super::Applications`] then
//! applies the policy (project × destination × the Application's namespace) and, for a sync,
//! `applicationSync.destinations`.
//!
//! Both routes share one axum route (`{name}` then ends in `:sync` for the POST): the router
//! (matchit 0.8.4) has no parameter with a static suffix inside one path segment.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use dispatch_api::observe::{self, ApplicationState, StageRef, SyncRequest};

use super::Applications;
use crate::http::{authz, ApiFailure, ApiJson, DispatchError, Principal};

/// The Application routes over `applications` (behind the bearer layer).
pub fn routes(applications: Arc<Applications>) -> Router {
    Router::new()
        .route(observe::APPLICATION, get(get_one).post(post))
        .with_state(applications)
}

/// What the Application routes ask for: one Application, for one project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppRef {
    /// the destination it lives on
    pub destination: String,
    /// its namespace on the destination
    pub namespace: String,
    /// its name
    pub name: String,
    /// the Kargo project the caller acts for (checked against the policy by [`super::Applications`])
    pub project: String,
    /// the Kargo Stage of that project the caller names: the Application must be authorized
    /// for it (`kargo.akuity.io/authorized-stage`, [`super::authorized`])
    pub stage: String,
}

impl AppRef {
    /// `destination/namespace/name`, for logs.
    pub fn object(&self) -> String {
        format!("{}/{}/{}", self.destination, self.namespace, self.name)
    }

    /// The caller's project and Stage.
    pub fn stage(&self) -> StageRef {
        StageRef {
            project: self.project.clone(),
            stage: self.stage.clone(),
        }
    }
}

/// `?project=` and `?stage=` of the GET route.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProjectQuery {
    project: Option<String>,
    stage: Option<String>,
}

/// Seconds an agent destination's client waits before asking again (its agent reports within
/// a poll or two).
const RETRY_AFTER_SECONDS: &str = "5";

/// The suffix of the sync route's last segment.
const SYNC_SUFFIX: &str = ":sync";

fn bad_request(message: String) -> ApiFailure {
    ApiFailure::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// An Application error as a reply; `503` carries `Retry-After`.
fn failure(e: DispatchError) -> Response {
    let retry = matches!(e, DispatchError::Unavailable(_));
    let mut reply = ApiFailure::from(e).into_response();
    if retry {
        reply.headers_mut().insert(
            header::RETRY_AFTER,
            header::HeaderValue::from_static(RETRY_AFTER_SECONDS),
        );
    }
    reply
}

/// The Application of the path for the caller's project and the Stage `stage` (checked by
/// the caller: the body's, or the query's), or the reply refusing it.
fn app_ref(
    caller: &Principal,
    (destination, namespace, name): (String, String, String),
    project: Option<&str>,
    stage: &str,
) -> Result<AppRef, ApiFailure> {
    let check = observe::application_of_route(&namespace, &name).map_err(|e| bad_request(e.0))?;
    let span = tracing::Span::current();
    span.record("run", format!("{destination}/{namespace}/{name}"));
    let project = authz::application_caller(caller, &destination, project)?;
    Ok(AppRef {
        destination,
        namespace: check.namespace,
        name: check.name,
        project,
        stage: stage.to_string(),
    })
}

/// `GET …/applications/{ns}/{name}`.
async fn get_one(
    State(applications): State<Arc<Applications>>,
    Extension(caller): Extension<Principal>,
    Path(path): Path<(String, String, String)>,
    query: Result<Query<ProjectQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Query(query) = match query {
        Ok(q) => q,
        Err(e) => return bad_request(e.body_text()).into_response(),
    };
    let stage = match observe::stage_name("query parameter `stage`", query.stage.as_deref()) {
        Ok(stage) => stage,
        Err(e) => return bad_request(e.0).into_response(),
    };
    let app = match app_ref(&caller, path, query.project.as_deref(), stage) {
        Ok(app) => app,
        Err(refused) => return refused.into_response(),
    };
    match applications.read(app).await {
        Ok(state) => Json::<ApplicationState>(state).into_response(),
        Err(e) => failure(e),
    }
}

/// `POST …/applications/{ns}/{name}:sync`.
async fn post(
    State(applications): State<Arc<Applications>>,
    Extension(caller): Extension<Principal>,
    Path((destination, namespace, name)): Path<(String, String, String)>,
    body: Result<ApiJson<SyncRequest>, ApiFailure>,
) -> Response {
    let Some(name) = name.strip_suffix(SYNC_SUFFIX).map(str::to_string) else {
        return ApiFailure::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "POST {name:?}: an Application is synced with POST \
                 /v1/destinations/{{destination}}/applications/{{namespace}}/{{name}}:sync"
            ),
        )
        .into_response();
    };
    let ApiJson(req) = match body {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = req.validate() {
        return bad_request(e.0).into_response();
    }
    let stage = match observe::stage_name("field `stage`", req.stage.as_deref()) {
        Ok(stage) => stage.to_string(),
        Err(e) => return bad_request(e.0).into_response(),
    };
    let app = match app_ref(
        &caller,
        (destination, namespace, name),
        req.project.as_deref(),
        &stage,
    ) {
        Ok(app) => app,
        Err(refused) => return refused.into_response(),
    };
    match applications.sync(app, req).await {
        Ok(state) => (StatusCode::ACCEPTED, Json(state)).into_response(),
        Err(e) => failure(e),
    }
}
