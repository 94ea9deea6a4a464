//! The log routes: `GET /v1/runs/{namespace}/{name}/logs`, the whole log of a run's Jobs for
//! people and tools, and `POST /v1/agents/{destination}/logs/{id}`, an agent's upload of a log
//! it was asked for.
//!
//! Outside the `require_bearer` layer, because people are not service tokens: the viewer is
//! identified here (`viewer::identify`: a trusted proxy's person, else the bearer token — from
//! `Authorization`, else the session cookie — as a service token, agent tokens refused, else as
//! a person's Kubernetes token), then the path and query are checked (`400`: no `..`, no `/`, no
//! unknown field), then whether the viewer may see the run's namespace (`403` naming what is
//! missing) — all before [`RunLogs`], so a refused request costs no destination call. The
//! reply streams [`LogEvent`]s as newline-delimited JSON while they are read.
//!
//! An upload is read as a stream, never buffered (so the body limit does not apply: each line is
//! bounded by the relay instead); only the agent token of its destination is served.

use std::convert::Infallible;
use std::net::SocketAddr;

use axum::body::Body;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use dispatch_api::agent::LogUploadReply;
use dispatch_api::logs::{self as logs_api, LogEvent, LogsQuery, CONTENT_TYPE};
use dispatch_api::names::{is_dns_label, is_dns_labels};
use futures::StreamExt;

use super::run::RunLogs;
use crate::http::viewer::{self, Viewer};
use crate::http::FORWARDED_BY;
use crate::http::{auth, ApiFailure, BearerToken, Gate, LogUpload, Principal, RunName};

/// The state of the log read route: the logs, and who may read them.
#[derive(Clone)]
struct Readers {
    logs: Arc<RunLogs>,
    gate: Gate,
}

/// The route people and tools read logs by (outside the bearer layer: it identifies people
/// as well as services through `gate`).
pub fn read_routes(logs: Arc<RunLogs>, gate: Gate) -> Router {
    Router::new()
        .route(logs_api::RUN_LOGS, get(run_logs))
        .with_state(Readers { logs, gate })
}

/// The route agents upload logs by (behind the bearer layer).
pub fn upload_routes(logs: Arc<RunLogs>) -> Router {
    Router::new()
        .route(
            logs_api::AGENT_LOGS,
            post(agent_log_upload).layer(DefaultBodyLimit::disable()),
        )
        .with_state(logs)
}

async fn agent_log_upload(
    State(logs): State<Arc<RunLogs>>,
    Extension(caller): Extension<Principal>,
    Path((destination, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Json<LogUploadReply>, ApiFailure> {
    let upload = LogUpload {
        body: body.into_data_stream().boxed(),
        bearer: auth::bearer_token(&headers).map(|t| BearerToken(t.to_string())),
        forwarded_by: headers
            .get(FORWARDED_BY)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.chars().take(64).collect()),
    };
    Ok(Json(logs.upload(&caller, destination, id, upload).await?))
}

/// The query as sent: unknown fields refused (a typo must not widen what is shown).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLogsQuery {
    metric: Option<String>,
    destination: Option<String>,
    container: Option<String>,
    follow: Option<bool>,
}

impl From<RawLogsQuery> for LogsQuery {
    fn from(q: RawLogsQuery) -> Self {
        let set = |v: Option<String>| v.filter(|v| !v.is_empty());
        LogsQuery {
            metric: set(q.metric),
            destination: set(q.destination),
            container: set(q.container),
            follow: q.follow.unwrap_or(false),
        }
    }
}

fn bad_request(message: String) -> ApiFailure {
    ApiFailure::new(StatusCode::BAD_REQUEST, "invalid_request", message)
}

/// The run the path names: a namespace name and an object name (DNS-1123 subdomain), nothing
/// else — `..`, `/` (`%2F`) and the like are refused.
fn run_of_path(namespace: String, name: String) -> Result<RunName, ApiFailure> {
    if !is_dns_label(&namespace) {
        return Err(bad_request(format!(
            "path segment {{namespace}} is not a valid namespace name: {namespace:?} (lowercase \
             letters, digits and '-', at most 63)"
        )));
    }
    if !is_dns_labels(&name) {
        return Err(bad_request(format!(
            "path segment {{name}} is not a valid AnalysisRun name: {name:?} (lowercase letters, \
             digits, '-' and '.', at most 253)"
        )));
    }
    Ok(RunName { namespace, name })
}

/// Why `viewer` may not see the runs of `namespace`, and what would let them.
fn not_allowed(viewer: &Viewer, namespace: &str) -> ApiFailure {
    let message = match viewer {
        Viewer::Person(p) => format!(
            "user {} may not get analysisruns in namespace {namespace} on the control plane; \
             what would allow it: a RoleBinding in {namespace} to a role with get on \
             analysisruns.argoproj.io (for the user or one of their groups: {})",
            p.user,
            if p.groups.is_empty() {
                "none".to_string()
            } else {
                p.groups.join(", ")
            }
        ),
        Viewer::Service(p) => format!(
            "{} may not read the runs of project {namespace}: the token is bound to other \
             projects; issue one for it (rollouts-dispatch token issue --project {namespace}) or \
             use your own Kubernetes token",
            p.subject
        ),
    };
    ApiFailure::new(StatusCode::FORBIDDEN, "forbidden", message)
}

/// The handler of [`dispatch_api::logs::RUN_LOGS`].
async fn run_logs(
    State(s): State<Readers>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    Path((namespace, name)): Path<(String, String)>,
    query: Result<Query<RawLogsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiFailure> {
    let peer = peer.map(|Extension(ConnectInfo(p))| p);
    let token = viewer::request_token(&s.gate, &headers);
    let who = match viewer::identify(&s.gate, &headers, peer, token.as_deref()).await {
        Ok(who) => who,
        Err(refusal) => {
            tracing::warn!(reason = %refusal.body.message, "log request refused");
            let mut reply = refusal.into_response();
            if reply.status() == StatusCode::UNAUTHORIZED {
                reply
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            return Ok(reply);
        }
    };
    let span = tracing::Span::current();
    span.record("principal", who.name());
    let run = run_of_path(namespace, name)?;
    span.record("run", format!("{}/{}", run.namespace, run.name));
    let Query(query) = query.map_err(|e| bad_request(e.body_text()))?;
    let query = LogsQuery::from(query);
    if let Some(m) = &query.metric {
        span.record("metric", m.as_str());
    }
    if !viewer::may_see(&s.gate, &who, &run.namespace).await? {
        tracing::warn!(viewer = who.name(), namespace = %run.namespace, "log request forbidden");
        return Err(not_allowed(&who, &run.namespace));
    }
    tracing::info!(
        viewer = who.name(),
        follow = query.follow,
        "streaming run logs"
    );
    let events = s.logs.of_run(run, query).await?;
    let body = events.map(|event: LogEvent| {
        let mut line = serde_json::to_string(&event).unwrap_or_default();
        line.push('\n');
        Ok::<_, Infallible>(line)
    });
    Ok((
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        Body::from_stream(body),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_names_a_run_and_nothing_else() {
        assert!(run_of_path("kargo-demo".into(), "uat.01j.abc-1".into()).is_ok());
        for (ns, name) in [
            ("..", "x"),
            ("a/b", "x"),
            ("a", ".."),
            ("a", "x/../y"),
            ("a", "x/y"),
            ("A", "x"),
            ("a", ""),
            ("-a", "x"),
            ("a", "x."),
        ] {
            let e = run_of_path(ns.into(), name.into()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{ns}/{name}");
        }
    }
}
