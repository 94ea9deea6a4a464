//! Who may call the API: bearer tokens checked by a [`Chain`] of [`Authenticator`]s.
//!
//! * [`JwtAuthenticator`]: JWTs signed with a shared HS256 key (dev, tests, agents). Several keys
//!   may be accepted at once so a key can be rotated with an overlap; revoked token ids (`jti`)
//!   are refused. Keys and revocations follow their files without a restart
//!   ([`JwtAuthenticator::reloading`]).
//! * [`Chain`]: tries several authenticators (e.g. TokenReview for the Rollouts controller's
//!   projected ServiceAccount token, then JWTs).
//!
//! Callers fail closed (#27): a JWT must carry a `projects` claim (unless it is an agent's), and
//! a TokenReview identity must match a `policy.callers` entry; there is no implicit "every
//! project".
//!
//! Every failure is a 401 (403 for a known caller bound to no project) with a message that says
//! what to fix, and a log line on the server.

use std::collections::HashSet;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use tracing::warn;

use super::tokenreview::TokenReviewAuthenticator;
use super::{ApiFailure, Gate};
use crate::runtime::reload::Reloading;

/// The audience every rollouts-dispatch token must carry.
pub const AUDIENCE: &str = "rollouts-dispatch";

/// Clock skew tolerated between a token's issuer and this server, in seconds, on `exp`, `nbf`
/// and `iat`.
///
/// 60 s, as Kubernetes allows for ServiceAccount tokens (go-jose's default leeway) and
/// jsonwebtoken by default: NTP-synced machines agree within milliseconds, and a minute absorbs
/// a laptop or VM clock that drifted (`rollouts-dispatch token issue` runs wherever an operator
/// is). A larger leeway would keep every expired token alive longer and accept tokens issued
/// "in the future" (a skewed or forged issuer clock) for longer; a smaller one turns ordinary
/// drift into 401s. Beyond it, a token from the future is refused with [`AuthError::NotYetValid`].
pub const CLOCK_LEEWAY_SECS: u64 = 60;

/// The only signing algorithm accepted.
const ALGORITHM: Algorithm = Algorithm::HS256;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// e.g. `system:serviceaccount:argo-rollouts:argo-rollouts` or the JWT `sub`
    pub subject: String,
    /// set for agent tokens: the only destination this caller may act for
    pub destination: Option<String>,
    /// the Kargo projects (AnalysisRun namespaces) this caller may act for
    pub projects: Projects,
}

impl Principal {
    /// A caller bound to every project by a `projects: ["*"]` claim, not an agent: the Rollouts
    /// controller's identity as tests build it.
    pub fn plugin(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            destination: None,
            projects: Projects::claimed(vec!["*".into()]),
        }
    }
}

/// The Kargo projects a caller may act for: the globs of its JWT's `projects` claim, or of the
/// first `policy.callers` entry its Kubernetes identity matches.
///
/// There is no "every project" that no one wrote: a JWT without a `projects` claim (not an
/// agent's) and a TokenReview identity without a `policy.callers` entry are refused when they
/// authenticate (#27); the Rollouts controller, which serves AnalysisRuns of every namespace,
/// is bound by an explicit `"*"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projects {
    /// the globs (`*`, `?`); empty for agent tokens, which act for no project
    pub globs: Vec<String>,
    /// what bound the caller to them: says what to change in a refusal
    pub bound_by: ScopeSource,
}

/// Where a caller's [`Projects`] come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeSource {
    /// the `projects` claim of its JWT
    TokenClaim,
    /// entry `index` of `policy.callers` in the config file `origin`
    Config {
        /// the entry
        index: usize,
        /// the config file
        origin: String,
    },
}

impl Projects {
    /// The projects of a JWT's `projects` claim.
    pub fn claimed(globs: Vec<String>) -> Self {
        Self {
            globs,
            bound_by: ScopeSource::TokenClaim,
        }
    }

    /// Whether the caller is bound to every project (a glob of only `*`: the Rollouts
    /// controller's `"*"`).
    pub fn is_every_project(&self) -> bool {
        self.globs
            .iter()
            .any(|g| !g.is_empty() && g.chars().all(|c| c == '*'))
    }

    /// Whether the caller may act for `project`.
    pub fn allows(&self, project: &str) -> bool {
        self.globs
            .iter()
            .any(|g| crate::policy::glob_match(g, project))
    }

    /// The one project the caller is bound to, when it is bound to exactly one, by name (no
    /// glob).
    pub fn only_one(&self) -> Option<&str> {
        match self.globs.as_slice() {
            [one] if !one.contains(['*', '?']) => Some(one),
            _ => None,
        }
    }
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
    /// Not valid yet: `nbf` or `iat` lies in the future beyond [`CLOCK_LEEWAY_SECS`].
    #[error(
        "token is not valid yet: {0}; check the clocks of the token's issuer and of this server \
         (they may differ by at most {CLOCK_LEEWAY_SECS}s), then issue a new token"
    )]
    NotYetValid(String),
    /// Not for us.
    #[error("token audience is not \"rollouts-dispatch\"")]
    WrongAudience,
    /// A Kubernetes token the apiserver authenticated, but not for our audience (`status.audiences`
    /// names none of those asked for).
    #[error(
        "the apiserver authenticated the token, but not for audience {ours}: status.audiences is \
         {answered}; give the caller a projected ServiceAccount token with that audience \
         (serviceAccountToken.audience: {ours})"
    )]
    NotOurAudience {
        /// the audiences asked for, comma-separated
        ours: String,
        /// what the review answered
        answered: String,
    },
    /// A trusted proxy named a user under Kubernetes' reserved `system:` prefix.
    #[error(
        "the proxy names user {0:?}, under Kubernetes' reserved `system:` prefix, which no \
         proxy may vouch for (groups under `system:` are dropped likewise); sign in as a person"
    )]
    SystemIdentity(String),
    /// Revoked by id.
    #[error("token {0} is revoked")]
    Revoked(String),
    /// Valid, but the subject is not on the allow-list.
    #[error("{0} is not allowed to call this server (add it to --token-review-allow)")]
    NotAllowed(String),
    /// One of our JWTs that is not an agent's and has no `projects` claim: it may act for no
    /// project (there is no implicit "every project").
    #[error(
        "the token of {0} has no `projects` claim, so it may act for no Kargo project: issue it \
         with the projects it serves (rollouts-dispatch token issue --project team-a, once per \
         project; --project '*' for the Rollouts controller, which serves every namespace), or \
         with --destination for an agent"
    )]
    NoProjects(String),
    /// A Kubernetes identity on the allow-list that no `policy.callers` entry binds.
    #[error(
        "{user} matches no `policy.callers` entry in {origin}, so it may act for no Kargo \
         project: add one, e.g. `policy: {{callers: [{{subject: \"{user}\", projects: \
         [\"*\"]}}]}}` for the Rollouts controller (which serves every namespace), or the \
         projects that caller serves"
    )]
    Unbound {
        /// the Kubernetes username
        user: String,
        /// the config file of `policy.callers`
        origin: String,
    },
    /// Malformed, bad signature, unknown key …
    #[error("invalid token: {0}")]
    Invalid(String),
    /// The verifier (e.g. the kube-apiserver for TokenReview) could not be asked.
    #[error("cannot verify the token right now: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The HTTP status of the refusal: 503 when the verifier could not be asked (a retry),
    /// 403 for a known caller bound to no project, else 401.
    pub fn status(&self) -> StatusCode {
        match self {
            AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AuthError::Unbound { .. } => StatusCode::FORBIDDEN,
            _ => StatusCode::UNAUTHORIZED,
        }
    }

    /// The error code of the refusal's body (`forbidden` with [`Self::status`] 403).
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Unbound { .. } => "forbidden",
            _ => "unauthenticated",
        }
    }
}

/// Checks bearer tokens: one way of checking them. A server tries several in a [`Chain`].
pub enum Authenticator {
    /// our own HS256 JWTs
    Jwt(JwtAuthenticator),
    /// Kubernetes tokens, reviewed by the apiserver
    TokenReview(TokenReviewAuthenticator),
}

impl Authenticator {
    /// Returns the caller a token belongs to.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        match self {
            Authenticator::Jwt(a) => a.authenticate(token),
            Authenticator::TokenReview(a) => a.authenticate(token).await,
        }
    }
}

impl From<JwtAuthenticator> for Authenticator {
    fn from(a: JwtAuthenticator) -> Self {
        Authenticator::Jwt(a)
    }
}

impl From<TokenReviewAuthenticator> for Authenticator {
    fn from(a: TokenReviewAuthenticator) -> Self {
        Authenticator::TokenReview(a)
    }
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
    /// the Kargo projects (globs) the token may act for (`["*"]`: every project, the Rollouts
    /// controller's); required unless `destination` is set (an agent acts for no project)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projects: Option<Vec<String>>,
}

/// Signs `claims` with `key` (HS256).
pub fn issue(key: &[u8], claims: &Claims) -> Result<String, AuthError> {
    jsonwebtoken::encode(
        &Header::new(ALGORITHM),
        claims,
        &EncodingKey::from_secret(key),
    )
    .map_err(|e| AuthError::Invalid(e.to_string()))
}

/// The keys whose HS256 signatures are accepted (several during a rotation).
pub struct JwtKeys(Vec<DecodingKey>);

impl JwtKeys {
    /// The keys of these shared secrets.
    pub fn from_secrets(secrets: &[Vec<u8>]) -> Self {
        Self(
            secrets
                .iter()
                .map(|k| DecodingKey::from_secret(k))
                .collect(),
        )
    }
}

/// The token ids (`jti`) that are refused.
pub type Revoked = HashSet<String>;

/// The token ids of a revocations file: one `jti` per line; blank lines and everything from a
/// `#` on are ignored (a jti never holds `#` or whitespace: `token issue` makes hex ids).
pub fn parse_revoked(text: &str) -> Revoked {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or_default().trim())
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// HS256 JWTs with one or more accepted keys.
pub struct JwtAuthenticator {
    keys: Reloading<JwtKeys>,
    revoked: Revoked,
    revoked_file: Option<Reloading<Revoked>>,
    validation: Validation,
}

impl JwtAuthenticator {
    /// Accepts tokens signed by any of `keys` (at least one), except the ids in `revoked`.
    pub fn new(keys: &[Vec<u8>], revoked: impl IntoIterator<Item = String>) -> Self {
        Self::reloading(
            Reloading::fixed("jwt keys", JwtKeys::from_secrets(keys)),
            revoked,
            None,
        )
    }

    /// Accepts tokens signed by the current `keys`, except the ids in `revoked` and those of
    /// the current `revoked_file`: both follow their files (see [`Reloading`]), so a key
    /// rotation or a revocation needs no restart.
    pub fn reloading(
        keys: Reloading<JwtKeys>,
        revoked: impl IntoIterator<Item = String>,
        revoked_file: Option<Reloading<Revoked>>,
    ) -> Self {
        let mut validation = Validation::new(ALGORITHM);
        validation.set_audience(&[AUDIENCE]);
        validation.set_required_spec_claims(&["exp", "aud", "sub"]);
        validation.leeway = CLOCK_LEEWAY_SECS;
        // Off by default in jsonwebtoken: a token must not be usable before its `nbf`.
        validation.validate_nbf = true;
        Self {
            keys,
            revoked: revoked.into_iter().collect(),
            revoked_file,
            validation,
        }
    }

    fn is_revoked(&self, jti: &str) -> bool {
        self.revoked.contains(jti)
            || self
                .revoked_file
                .as_ref()
                .is_some_and(|f| f.get().contains(jti))
    }

    /// Returns the caller `token` belongs to. Synchronous: the keys and revocations are in
    /// memory ([`Authenticator::authenticate`] is the async face).
    pub fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        use jsonwebtoken::errors::ErrorKind;
        // Say plainly why `alg: none`, HS512 or RS256 tokens are refused (jsonwebtoken would
        // refuse them too, with less telling errors).
        if let Some(alg) = header_alg(token) {
            if alg != "HS256" {
                return Err(AuthError::Invalid(format!(
                    "token algorithm {alg:?} is not accepted: only HS256 tokens signed with a \
                     configured key are"
                )));
            }
        }
        let mut last = AuthError::Invalid("no signing key is configured".into());
        let keys = self.keys.get();
        for key in &keys.0 {
            match jsonwebtoken::decode::<Claims>(token, key, &self.validation) {
                Ok(data) => {
                    let c = data.claims;
                    if self.is_revoked(&c.jti) {
                        return Err(AuthError::Revoked(c.jti));
                    }
                    // jsonwebtoken does not look at `iat`: a token issued "tomorrow" would
                    // otherwise live a day longer than its issuer meant.
                    let now = jsonwebtoken::get_current_timestamp();
                    if c.iat > now.saturating_add(CLOCK_LEEWAY_SECS) {
                        return Err(AuthError::NotYetValid(format!(
                            "it was issued (`iat`) {}s ahead of this server's clock",
                            c.iat - now
                        )));
                    }
                    let projects = match (c.projects, &c.destination) {
                        (Some(globs), _) => Projects::claimed(globs),
                        // An agent serves its destination's work, never a project's routes.
                        (None, Some(_)) => Projects::claimed(Vec::new()),
                        // Fail closed: no claim once meant every project (#27).
                        (None, None) => return Err(AuthError::NoProjects(c.sub)),
                    };
                    return Ok(Principal {
                        subject: c.sub,
                        destination: c.destination,
                        projects,
                    });
                }
                // The signature is checked before the claims: these are final.
                Err(e) => {
                    last = match e.kind() {
                        ErrorKind::ExpiredSignature => return Err(AuthError::Expired),
                        ErrorKind::ImmatureSignature => {
                            return Err(AuthError::NotYetValid(
                                "its `nbf` (not before) is still ahead of this server's clock"
                                    .into(),
                            ))
                        }
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

/// The `alg` of a JWT's header, if the header can be read at all.
pub(crate) fn header_alg(token: &str) -> Option<String> {
    use base64::Engine as _;
    let header = token.split('.').next()?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header.trim_end_matches('='))
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&json).ok()?;
    Some(value.get("alg")?.as_str()?.to_string())
}

/// Tries each authenticator in turn; the first that accepts wins.
pub struct Chain(pub Vec<Authenticator>);

impl Chain {
    /// Returns the caller a token belongs to: the first authenticator's that accepts it; else
    /// the most telling refusal.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let mut best = AuthError::Invalid("no authenticator is configured".into());
        for a in &self.0 {
            match a.authenticate(token).await {
                Ok(p) => return Ok(p),
                // A specific reason (expired, revoked …) beats a generic "not ours".
                Err(e @ AuthError::Invalid(_)) if !matches!(best, AuthError::Invalid(_)) => drop(e),
                Err(e) => best = e,
            }
        }
        Err(best)
    }
}

/// A chain of one: it accepts and refuses exactly as its one authenticator.
impl<A: Into<Authenticator>> From<A> for Chain {
    fn from(a: A) -> Self {
        Chain(vec![a.into()])
    }
}

/// The token of `Authorization: Bearer <token>`, if any.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Middleware: rejects requests without an accepted bearer token; adds the [`Principal`].
pub async fn require_bearer(State(gate): State<Gate>, mut req: Request, next: Next) -> Response {
    let token = bearer_token(req.headers());
    let result = match token {
        None => Err(AuthError::Missing),
        Some(t) => gate.auth.authenticate(t).await,
    };
    match result {
        Ok(p) => {
            tracing::Span::current().record("principal", p.subject.as_str());
            req.extensions_mut().insert(p);
            next.run(req).await
        }
        Err(e) => {
            warn!(path = %req.uri().path(), reason = %e, "request refused");
            let status = e.status();
            let mut resp = ApiFailure::new(status, e.code(), e.to_string()).into_response();
            if status == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
            }
            resp
        }
    }
}

#[cfg(test)]
mod tests;
