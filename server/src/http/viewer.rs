//! Who reads logs and pages: a service (a token this server accepts: a plugin or tooling token,
//! never an agent's) or a person of the control plane.
//!
//! People are never given our tokens. They present a Kubernetes bearer token of the control plane
//! (TokenReview), or come through an authenticating proxy that sets user and group headers
//! (trusted only from the configured proxy addresses). What a person may see is what Kubernetes
//! says: a run is shown only if a SubjectAccessReview allows them `get analysisruns` in its
//! namespace on the control plane — the rule Kargo users already live under.
//! [`People`] is that contract; its implementation ([`ControlPlanePeople`]) lives beside
//! TokenReview.

use std::net::SocketAddr;

use axum::http::{HeaderMap, StatusCode};

use super::auth::{AuthError, Principal};
use super::people::ControlPlanePeople;
use super::{ApiFailure, Gate};

pub use super::sessions::SESSION_COOKIE;

/// The bearer token of a request: `Authorization: Bearer …`, else the token of the session the
/// [`SESSION_COOKIE`] names (a cookie holding anything but an open session's id gives none).
pub fn request_token(gate: &Gate, headers: &HeaderMap) -> Option<String> {
    if let Some(bearer) = super::auth::bearer_token(headers) {
        return Some(bearer.to_string());
    }
    gate.sessions.token(session_id(headers)?)
}

/// The session id in the [`SESSION_COOKIE`] of a request, if any.
pub fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().trim_matches('"'))
        .filter(|t| !t.is_empty())
}

/// A person of the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// the Kubernetes user name (`status.user.username`, or the proxy's user header)
    pub user: String,
    /// the user's groups
    pub groups: Vec<String>,
    /// how they were identified
    pub via: PersonSource,
}

/// How a [`Person`] was identified.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PersonSource {
    /// a bearer token of the control plane, reviewed by its apiserver
    Token,
    /// the headers of a trusted authenticating proxy
    Proxy,
}

/// Who reads logs and pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Viewer {
    /// a token this server issued or trusts (bound to its projects); agents are refused
    Service(Principal),
    /// a person; what they see is decided by SubjectAccessReviews
    Person(Person),
}

impl Viewer {
    /// For logs and spans: the subject or user name.
    pub fn name(&self) -> &str {
        match self {
            Viewer::Service(p) => &p.subject,
            Viewer::Person(p) => &p.user,
        }
    }
}

/// Identifies people and says what they may see: nobody, or the people of the control plane.
pub enum People {
    /// No people: only services may read (a server without a control plane).
    Nobody,
    /// the people of the control plane: TokenReview, a trusted proxy, SubjectAccessReviews;
    /// boxed, as `Nobody` is nothing
    ControlPlane(Box<ControlPlanePeople>),
}

impl People {
    /// The person a trusted authenticating proxy vouches for: `Some` only when `peer` is one of
    /// the configured proxy addresses and the user header is set; headers from anyone else are
    /// ignored.
    pub fn by_proxy(
        &self,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<Option<Person>, AuthError> {
        match self {
            People::Nobody => Ok(None),
            People::ControlPlane(p) => p.by_proxy(headers, peer),
        }
    }

    /// The person a bearer token of the control plane belongs to (TokenReview); `Ok(None)` when
    /// people's tokens are not accepted here.
    pub async fn by_token(&self, token: &str) -> Result<Option<Person>, AuthError> {
        match self {
            People::Nobody => Ok(None),
            People::ControlPlane(p) => p.by_token(token).await,
        }
    }

    /// Whether `person` may `get analysisruns.argoproj.io` in `namespace` on the control plane.
    pub async fn may_see(&self, person: &Person, namespace: &str) -> Result<bool, AuthError> {
        match self {
            People::Nobody => Ok(false),
            People::ControlPlane(p) => p.may_see(person, namespace).await,
        }
    }
}

impl From<ControlPlanePeople> for People {
    fn from(p: ControlPlanePeople) -> Self {
        People::ControlPlane(Box::new(p))
    }
}

/// The viewer behind a request: the person a trusted proxy names; else the bearer `token` as a
/// service token (an agent token is refused: 403); else as a person's token of the control plane.
/// No token, or one nobody accepts: 401.
pub async fn identify(
    gate: &Gate,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    token: Option<&str>,
) -> Result<Viewer, ApiFailure> {
    let unauthenticated = |e: AuthError| ApiFailure::new(e.status(), e.code(), e.to_string());
    if let Some(person) = gate
        .people
        .by_proxy(headers, peer)
        .map_err(unauthenticated)?
    {
        return Ok(Viewer::Person(person));
    }
    let token = token.ok_or_else(|| unauthenticated(AuthError::Missing))?;
    match gate.auth.authenticate(token).await {
        Ok(principal) if principal.destination.is_some() => Err(ApiFailure::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{} holds an agent token; agent tokens read no logs or pages: use a plugin or \
                 tooling token (rollouts-dispatch token issue --project …) or your own \
                 Kubernetes token",
                principal.subject
            ),
        )),
        Ok(principal) => Ok(Viewer::Service(principal)),
        Err(service_refusal) => match gate.people.by_token(token).await {
            Ok(Some(person)) => Ok(Viewer::Person(person)),
            Ok(None) => Err(unauthenticated(service_refusal)),
            Err(e) => Err(unauthenticated(e)),
        },
    }
}

/// Whether `viewer` may see the runs of `namespace`: a service by its projects, a person by a
/// SubjectAccessReview (`get analysisruns` there).
pub async fn may_see(gate: &Gate, viewer: &Viewer, namespace: &str) -> Result<bool, ApiFailure> {
    match viewer {
        Viewer::Service(p) => Ok(p.destination.is_none() && p.projects.allows(namespace)),
        Viewer::Person(person) => gate.people.may_see(person, namespace).await.map_err(|e| {
            ApiFailure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            )
        }),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn gate() -> Gate {
        Gate {
            auth: std::sync::Arc::new(super::super::auth::Chain(Vec::new())),
            people: std::sync::Arc::new(People::Nobody),
            sessions: std::sync::Arc::default(),
        }
    }

    #[test]
    fn the_token_is_the_bearer_else_the_sessions_token() {
        let gate = gate();
        let id = gate.sessions.open("from-session").unwrap();
        let mut h = HeaderMap::new();
        assert_eq!(request_token(&gate, &h), None);
        h.append(
            axum::http::header::COOKIE,
            HeaderValue::from_str(&format!("theme=dark; {SESSION_COOKIE}={id}")).unwrap(),
        );
        assert_eq!(request_token(&gate, &h).as_deref(), Some("from-session"));
        h.insert(
            axum::http::header::AUTHORIZATION,
            HeaderValue::from_static("Bearer from-header"),
        );
        assert_eq!(request_token(&gate, &h).as_deref(), Some("from-header"));
        // A token put in the cookie is no session; nor is the old cookie, nor a lookalike name.
        for cookie in [
            format!("{SESSION_COOKIE}=a-bearer-token"),
            format!("rollouts-dispatch-session={id}"),
            format!("{SESSION_COOKIE}x={id}; session={id}"),
        ] {
            let mut other = HeaderMap::new();
            other.insert(
                axum::http::header::COOKIE,
                HeaderValue::from_str(&cookie).unwrap(),
            );
            assert_eq!(request_token(&gate, &other), None, "{cookie}");
        }
        gate.sessions.close(&id);
        h.remove(axum::http::header::AUTHORIZATION);
        assert_eq!(request_token(&gate, &h), None, "logged out");
    }
}
