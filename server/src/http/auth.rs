//! Who may call the API: bearer tokens checked by an [`Authenticator`].
//!
//! * [`JwtAuthenticator`]: JWTs signed with a shared HS256 key (dev, tests, agents). Several keys
//!   may be accepted at once so a key can be rotated with an overlap; revoked token ids (`jti`)
//!   are refused.
//! * [`Chain`]: tries several authenticators (e.g. TokenReview for the Rollouts controller's
//!   projected ServiceAccount token, then JWTs).
//!
//! Every failure is a 401 with a message that says what to fix, and a log line on the server.

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::{ApiFailure, AppState, BoxFuture};

/// The audience every rollouts-dispatch token must carry.
pub const AUDIENCE: &str = "rollouts-dispatch";

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// e.g. `system:serviceaccount:argo-rollouts:argo-rollouts` or the JWT `sub`
    pub subject: String,
    /// set for agent tokens: the only destination this caller may act for
    pub destination: Option<String>,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer` header.
    #[error("missing bearer token: send `Authorization: Bearer <token>` (plugin: --token-file)")]
    Missing,
    /// Expired.
    #[error("token expired; issue a new one (rollouts-dispatch token issue) or check the clocks")]
    Expired,
    /// Not for us.
    #[error("token audience is not \"rollouts-dispatch\"")]
    WrongAudience,
    /// Revoked by id.
    #[error("token {0} is revoked")]
    Revoked(String),
    /// Valid, but the subject is not on the allow-list.
    #[error("{0} is not allowed to call this server (add it to auth.tokenReview.allowed)")]
    NotAllowed(String),
    /// Malformed, bad signature, unknown key …
    #[error("invalid token: {0}")]
    Invalid(String),
    /// The verifier (e.g. the kube-apiserver for TokenReview) could not be asked.
    #[error("cannot verify the token right now: {0}")]
    Unavailable(String),
}

/// Checks bearer tokens.
pub trait Authenticator: Send + Sync + 'static {
    /// Returns the caller a token belongs to.
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Principal, AuthError>>;
}

/// The claims of a rollouts-dispatch JWT.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// subject
    pub sub: String,
    /// audience: `rollouts-dispatch`
    pub aud: String,
    /// expiry (Unix seconds)
    pub exp: u64,
    /// issued at (Unix seconds)
    pub iat: u64,
    /// token id, for revocation
    pub jti: String,
    /// agent tokens: the destination the agent serves
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
}

/// Signs `claims` with `key` (HS256).
pub fn issue(key: &[u8], claims: &Claims) -> Result<String, AuthError> {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(key),
    )
    .map_err(|e| AuthError::Invalid(e.to_string()))
}

/// HS256 JWTs with one or more accepted keys.
pub struct JwtAuthenticator {
    keys: Vec<DecodingKey>,
    revoked: HashSet<String>,
    validation: Validation,
}

impl JwtAuthenticator {
    /// Accepts tokens signed by any of `keys` (at least one), except the ids in `revoked`.
    pub fn new(keys: &[Vec<u8>], revoked: impl IntoIterator<Item = String>) -> Self {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        validation.leeway = 30;
        Self {
            keys: keys.iter().map(|k| DecodingKey::from_secret(k)).collect(),
            revoked: revoked.into_iter().collect(),
            validation,
        }
    }

    fn check(&self, token: &str) -> Result<Principal, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        let mut last = AuthError::Invalid("no signing key is configured".into());
        for key in &self.keys {
            match jsonwebtoken::decode::<Claims>(token, key, &self.validation) {
                Ok(data) => {
                    let c = data.claims;
                    if self.revoked.contains(&c.jti) {
                        return Err(AuthError::Revoked(c.jti));
                    }
                    return Ok(Principal {
                        subject: c.sub,
                        destination: c.destination,
                    });
                }
                Err(e) => {
                    last = match e.kind() {
                        ErrorKind::ExpiredSignature => return Err(AuthError::Expired),
                        ErrorKind::InvalidAudience => return Err(AuthError::WrongAudience),
                        ErrorKind::InvalidSignature => {
                            AuthError::Invalid("signature does not match any configured key".into())
                        }
                        _ => AuthError::Invalid(e.to_string()),
                    }
                }
            }
        }
        Err(last)
    }
}

impl Authenticator for JwtAuthenticator {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Principal, AuthError>> {
        Box::pin(std::future::ready(self.check(token)))
    }
}

/// Tries each authenticator in turn; the first that accepts wins.
pub struct Chain(pub Vec<Arc<dyn Authenticator>>);

impl Authenticator for Chain {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Principal, AuthError>> {
        Box::pin(async move {
            let mut best = AuthError::Invalid("no authenticator is configured".into());
            for a in &self.0 {
                match a.authenticate(token).await {
                    Ok(p) => return Ok(p),
                    // A specific reason (expired, revoked …) beats a generic "not ours".
                    Err(e @ AuthError::Invalid(_)) if !matches!(best, AuthError::Invalid(_)) => {
                        drop(e)
                    }
                    Err(e) => best = e,
                }
            }
            Err(best)
        })
    }
}

/// Middleware: rejects requests without an accepted bearer token; adds the [`Principal`].
pub async fn require_bearer(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty());
    let result = match token {
        None => Err(AuthError::Missing),
        Some(t) => state.auth.authenticate(t).await,
    };
    match result {
        Ok(p) => {
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => {
            let status = if matches!(e, AuthError::Unavailable(_)) {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::UNAUTHORIZED
            };
            warn!(path = %req.uri().path(), reason = %e, "request refused");
            let mut resp =
                ApiFailure::new(status, "unauthenticated", e.to_string()).into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
            resp
        }
    }
}
