//! Who reads logs and pages: a service (a token this server accepts: a plugin or tooling token,
//! never an agent's) or a person of the control plane.
//!
//! People are never given our tokens. They present a Kubernetes bearer token of the control plane
//! (TokenReview), or come through an authenticating proxy that sets user and group headers
//! (trusted only from the configured proxy addresses). What a person may see is what Kubernetes
//! says: a run is shown only if a SubjectAccessReview allows them `get analysisruns` in its
//! namespace on the control plane — the rule Kargo users already live under.
//! [`People`] is that contract; its implementation lives beside TokenReview.

use std::net::SocketAddr;

use axum::http::HeaderMap;
use futures::future::BoxFuture;

use super::auth::{AuthError, Principal};

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

/// Identifies people and says what they may see.
pub trait People: Send + Sync + 'static {
    /// The person behind a request: the trusted proxy's headers (when `peer` is a trusted proxy),
    /// else the bearer `token` reviewed by the control plane. `Ok(None)`: not a person of the
    /// control plane (the caller may still be a service).
    fn identify<'a>(
        &'a self,
        headers: &'a HeaderMap,
        peer: Option<SocketAddr>,
        token: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Person>, AuthError>>;

    /// Whether `person` may `get analysisruns.argoproj.io` in `namespace` on the control plane.
    fn may_see<'a>(
        &'a self,
        person: &'a Person,
        namespace: &'a str,
    ) -> BoxFuture<'a, Result<bool, AuthError>>;
}

/// No people: only services may read (a server without a control plane).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoPeople;

impl People for NoPeople {
    fn identify<'a>(
        &'a self,
        _: &'a HeaderMap,
        _: Option<SocketAddr>,
        _: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Person>, AuthError>> {
        Box::pin(std::future::ready(Ok(None)))
    }

    fn may_see<'a>(&'a self, _: &'a Person, _: &'a str) -> BoxFuture<'a, Result<bool, AuthError>> {
        Box::pin(std::future::ready(Ok(false)))
    }
}
