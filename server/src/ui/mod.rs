//! The web pages for people (`/ui`): a login form, the recent verifications a viewer may see,
//! the destinations, and one run with its live log. Server-rendered HTML (`render`), no
//! front-end build; the run page's small inline script streams the log API
//! (`/v1/runs/{ns}/{name}/logs?follow=true`), which the session cookie authenticates.
//!
//! Who is looking is decided as for the log API ([`crate::http::viewer::identify`]): a person a
//! trusted proxy names, else the token of the server-side session the cookie
//! [`SESSION_COOKIE`] names (`http::sessions`: the login keeps the token — a service token of
//! ours, never an agent's, or a person's Kubernetes token — and the cookie carries a random
//! id; logout ends the session). Without either, every page redirects to `/ui/login`. What a viewer sees is [`crate::http::viewer::may_see`] per
//! namespace (a SubjectAccessReview for a person), asked once per namespace per request.
//!
//! Every page carries a strict Content-Security-Policy (only our own style and script, by
//! hash), `nosniff`, no framing, no caching. Form posts must come from our own origin.

mod render;

use std::collections::HashMap;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Form, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{middleware, Extension, Router};
use dispatch_api::names::is_dns_subdomain;
use dispatch_api::v1::DestinationInfo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::engine::Engine;
use crate::http::viewer::{self, Viewer, SESSION_COOKIE};
use crate::http::{ApiFailure, Gate};
use crate::runs::{ReadError, RunSummary, Runs, SUMMARIES_KEPT};

mod load;
mod scope;

/// What the pages read: who is looking (`gate`), the runs of the control plane's watch, the
/// destinations of the engine.
#[derive(Clone)]
pub struct Pages {
    gate: Gate,
    runs: Option<Runs>,
    engine: Engine,
}

impl Pages {
    /// The pages of `engine`'s destinations and `runs`' runs, for the viewers `gate` identifies.
    pub fn new(gate: Gate, runs: Option<Runs>, engine: Engine) -> Self {
        Self { gate, runs, engine }
    }

    /// The recent runs (newest first, at most `limit`, every project: the pages filter by
    /// viewer); `None` when this server does not watch the control plane's runs.
    fn recent_runs(&self, limit: usize) -> Option<Vec<RunSummary>> {
        self.runs.as_ref().map(|runs| runs.recent(limit))
    }

    /// The summary of one run, if the watch of the control plane's runs holds it.
    async fn run_summary(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<RunSummary>, ReadError> {
        match &self.runs {
            Some(runs) => runs.summary(namespace, name).await,
            None => Ok(None),
        }
    }
}
use render::ListFilter;

/// The most runs the list looks at (newest first) before filtering by what the viewer may see.
/// As many as the watch keeps summaries of.
pub const LIST_SCAN: usize = crate::runs::SUMMARIES_KEPT;
/// The most rows the list shows.
pub const LIST_SHOW: usize = 200;
/// The longest token the login form accepts (a Kubernetes token is a few KiB at most).
const MAX_TOKEN: usize = 16 * 1024;

/// A destination as the destinations page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationLoad {
    /// what `/v1/destinations` says of it
    pub info: DestinationInfo,
    /// our Jobs running there now (`None`: not known, e.g. not synced)
    pub running: Option<usize>,
}

/// The `/ui` routes (no bearer layer: they authenticate with the session cookie themselves).
pub fn router(pages: Pages) -> Router {
    Router::new()
        .route("/ui", get(list))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/login", get(login_form).post(login))
        .route("/ui/logout", post(logout))
        .route("/ui/destinations", get(destinations))
        .route("/ui/runs/{namespace}/{name}", get(run))
        .layer(middleware::map_response(protect))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_TOKEN + 1024))
        .with_state(pages)
}

/// Headers of every page: the policy, no sniffing, no framing, no caching, no referrer to other
/// sites. `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null`
/// with the login form's POST (Fetch, "append a request Origin header"), which the same-origin
/// check below must refuse, so no browser could log in (`make e2e-ui`, Chromium 156).
async fn protect(mut response: Response) -> Response {
    let h = response.headers_mut();
    if let Ok(csp) = HeaderValue::from_str(render::csp()) {
        h.insert(header::CONTENT_SECURITY_POLICY, csp);
    }
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

fn peer_of(peer: Peer) -> Option<SocketAddr> {
    peer.map(|Extension(ConnectInfo(addr))| addr)
}

/// A page's refusal: the login page for 401, else a page saying why.
fn refusal(failure: ApiFailure) -> Response {
    if failure.status == StatusCode::UNAUTHORIZED {
        return Redirect::to("/ui/login").into_response();
    }
    let title = match failure.status {
        StatusCode::FORBIDDEN => "Forbidden",
        StatusCode::NOT_FOUND => "Not found",
        _ => "Unavailable",
    };
    (
        failure.status,
        Html(render::problem(title, None, &failure.body.message)),
    )
        .into_response()
}

/// The viewer of a page request, extracted before the handler runs; a request without one is
/// refused with [`refusal`] (the login page for 401).
struct PageViewer(Viewer);

impl FromRequestParts<Pages> for PageViewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Pages) -> Result<Self, Response> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| *addr);
        let token = viewer::request_token(&state.gate, &parts.headers);
        viewer::identify(&state.gate, &parts.headers, peer, token.as_deref())
            .await
            .map(PageViewer)
            .map_err(refusal)
    }
}

/// `may_see`, asked once per namespace for one request.
struct Sight<'a> {
    state: &'a Pages,
    viewer: &'a Viewer,
    seen: HashMap<String, bool>,
}

impl Sight<'_> {
    async fn may_see(&mut self, namespace: &str) -> Result<bool, ApiFailure> {
        if let Some(&answer) = self.seen.get(namespace) {
            return Ok(answer);
        }
        let answer = viewer::may_see(&self.state.gate, self.viewer, namespace).await?;
        self.seen.insert(namespace.to_string(), answer);
        Ok(answer)
    }
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

async fn list(
    State(state): State<Pages>,
    PageViewer(viewer): PageViewer,
    Query(filter): Query<ListFilter>,
) -> Response {
    let watched = state.recent_runs(LIST_SCAN);
    let runs_watched = watched.is_some();
    let mut sight = Sight {
        state: &state,
        viewer: &viewer,
        seen: HashMap::new(),
    };
    let mut rows = Vec::new();
    for run in watched.unwrap_or_default() {
        if rows.len() >= LIST_SHOW {
            break;
        }
        if !filter.admits(&run) {
            continue;
        }
        match sight.may_see(&run.namespace).await {
            Ok(true) => rows.push(run),
            Ok(false) => {}
            Err(e) => return refusal(e),
        }
    }
    tracing::debug!(viewer = viewer.name(), rows = rows.len(), "runs page");
    Html(render::runs(
        viewer.name(),
        runs_watched,
        &filter,
        &rows,
        now(),
    ))
    .into_response()
}

async fn destinations(State(state): State<Pages>, PageViewer(viewer): PageViewer) -> Response {
    let shown = match scope::Shown::of(&state, &viewer).await {
        Ok(s) => s,
        Err(e) => return refusal(e),
    };
    let policy = state.engine.policy();
    let rows: Vec<DestinationLoad> = state
        .destination_load()
        .into_iter()
        .filter(|d| shown.shows(policy, &d.info.name))
        .collect();
    Html(render::destinations(viewer.name(), &rows)).into_response()
}

async fn run(
    State(state): State<Pages>,
    PageViewer(viewer): PageViewer,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let who = Some(viewer.name());
    // Kubernetes object names (DNS subdomains) before they go into a page or a URL.
    if !is_dns_subdomain(&namespace) || !is_dns_subdomain(&name) {
        return (
            StatusCode::BAD_REQUEST,
            Html(render::problem(
                "Bad request",
                who,
                "a run is named by a Kubernetes namespace and name: lowercase letters, digits, \
                 '-' and '.'",
            )),
        )
            .into_response();
    }
    // The viewer's right first: a run they may not see is not even said to exist.
    match viewer::may_see(&state.gate, &viewer, &namespace).await {
        Ok(true) => {}
        Ok(false) => {
            tracing::info!(viewer = viewer.name(), %namespace, %name, "run page refused");
            let why = match &viewer {
                Viewer::Person(p) => format!(
                    "user {} may not get analysisruns in namespace {namespace} on the control \
                     plane (ask for a RoleBinding there to a role with get on \
                     analysisruns.argoproj.io)",
                    p.user
                ),
                Viewer::Service(p) => format!(
                    "token {} is not bound to project {namespace} (rollouts-dispatch token issue \
                     --project {namespace})",
                    p.subject
                ),
            };
            return (
                StatusCode::FORBIDDEN,
                Html(render::problem("Forbidden", who, &why)),
            )
                .into_response();
        }
        Err(e) => return refusal(e),
    }
    let summary = match state.run_summary(&namespace, &name).await {
        Ok(summary) => summary,
        Err(e) => {
            let why = format!(
                "AnalysisRun {namespace}/{name} is older than the {SUMMARIES_KEPT} newest runs \
                 the server keeps, and reading it from the control plane failed: {e}; try again"
            );
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                Html(render::problem("Unavailable", who, &why)),
            )
                .into_response();
        }
    };
    let Some(summary) = summary else {
        let why = if state.recent_runs(0).is_none() {
            "this server has no control plane (controlPlane in its config), so it shows no runs"
                .to_string()
        } else {
            format!("no AnalysisRun {namespace}/{name} of ours on the control plane")
        };
        return (
            StatusCode::NOT_FOUND,
            Html(render::problem("Not found", who, &why)),
        )
            .into_response();
    };
    let src = format!(
        "{}?follow=true",
        dispatch_api::logs::run_logs_path(&namespace, &name)
    );
    Html(render::run(viewer.name(), &summary, &src, now())).into_response()
}

async fn login_form() -> Html<String> {
    Html(render::login(None))
}

/// The login form's body.
#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// Whether a form post comes from our own pages: a browser sends `Origin` with every POST; one
/// naming another host is a cross-site post (CSRF) and refused. Our host is the `Host` header
/// (HTTP/1.1) or the request's authority (`uri`): over HTTP/2, which browsers speak when the
/// TLS listener offers `h2`, there is no `Host` header, only `:authority`, which hyper puts in
/// the URI.
fn same_origin(headers: &HeaderMap, uri: &Uri) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()) else {
        return true; // not a browser (curl), or an old one: SameSite=Strict still holds
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| uri.authority().map(|a| a.as_str()))
        .unwrap_or_default();
    let forwarded = headers
        .get("x-forwarded-host")
        .and_then(|h| h.to_str().ok());
    let origin_host = origin.split_once("://").map_or("", |(_, h)| h);
    origin_host == host || forwarded == Some(origin_host)
}

/// The refusal of a form post from another site.
fn cross_site(what: &str) -> Response {
    let text = format!("a {what} posted from another site (its Origin is not this server)");
    (
        StatusCode::FORBIDDEN,
        Html(render::problem("Forbidden", None, &text)),
    )
        .into_response()
}

/// The session cookie with `value` (an id of `http::sessions`), or its removal (`max_age` 0).
/// Always `Secure`: a `__Host-` cookie must be, so the pages need HTTPS (browsers treat
/// `localhost` as secure too).
fn cookie(value: &str, max_age: u64) -> HeaderValue {
    let c = format!(
        "{SESSION_COOKIE}={value}; Max-Age={max_age}; Secure; HttpOnly; SameSite=Strict; Path=/"
    );
    HeaderValue::from_str(&c).unwrap_or_else(|_| HeaderValue::from_static(""))
}

async fn login(
    State(state): State<Pages>,
    headers: HeaderMap,
    uri: Uri,
    peer: Peer,
    Form(form): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers, &uri) {
        return cross_site("login");
    }
    let token = form.token.trim();
    // A token goes into a cookie: only what a JWT or a Kubernetes token is made of.
    let plausible = !token.is_empty()
        && token.len() <= MAX_TOKEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.~+/=".contains(&b));
    if !plausible {
        return (
            StatusCode::UNAUTHORIZED,
            Html(render::login(Some(
                "that is not a bearer token (letters, digits and -_.~+/= only)",
            ))),
        )
            .into_response();
    }
    match viewer::identify(&state.gate, &HeaderMap::new(), peer_of(peer), Some(token)).await {
        Ok(viewer) => {
            let sessions = &state.gate.sessions;
            let id = match sessions.open(token) {
                Ok(id) => id,
                Err(e) => {
                    tracing::error!(error = %e, "login to the pages failed");
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        Html(render::login(Some(&e.to_string()))),
                    )
                        .into_response();
                }
            };
            tracing::info!(
                viewer = viewer.name(),
                sessions = sessions.len(),
                "logged in to the pages"
            );
            let mut response = Redirect::to("/ui").into_response();
            response.headers_mut().insert(
                header::SET_COOKIE,
                cookie(&id, sessions.lifetime().as_secs()),
            );
            response
        }
        Err(e) => {
            tracing::info!(reason = %e.body.message, "login to the pages refused");
            (e.status, Html(render::login(Some(&e.body.message)))).into_response()
        }
    }
}

async fn logout(State(state): State<Pages>, headers: HeaderMap, uri: Uri) -> Response {
    if !same_origin(&headers, &uri) {
        return cross_site("logout");
    }
    // The session ends here, not only in this browser: a copy of the cookie is worth nothing.
    if let Some(id) = viewer::session_id(&headers) {
        state.gate.sessions.close(id);
    }
    let mut response = Redirect::to("/ui/login").into_response();
    response
        .headers_mut()
        .insert(header::SET_COOKIE, cookie("", 0));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn posts_come_from_us() {
        // HTTP/1.1: the path alone in the URI, our host in `Host`.
        let path = Uri::from_static("/ui/login");
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("dispatch.example"));
        assert!(same_origin(&h, &path));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://dispatch.example"),
        );
        assert!(same_origin(&h, &path));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example"),
        );
        assert!(!same_origin(&h, &path));
        // HTTP/2: no `Host`, our host in the URI's authority.
        let h2 = Uri::from_static("https://dispatch.example:8443/ui/login");
        let mut h = HeaderMap::new();
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://dispatch.example:8443"),
        );
        assert!(same_origin(&h, &h2));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("https://evil.example:8443"),
        );
        assert!(!same_origin(&h, &h2));
        assert!(!same_origin(&h, &path), "no host known: refused");
        let c = cookie("id", 28800);
        assert_eq!(
            c.to_str().unwrap(),
            "__Host-rollouts-dispatch-session=id; Max-Age=28800; Secure; HttpOnly; \
             SameSite=Strict; Path=/"
        );
    }
}
