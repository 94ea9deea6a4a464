//! Who may call the API: bearer tokens checked by a [`Chain`] of [`Authenticator`]s.
//!
//! * [`JwtAuthenticator`]: JWTs signed with a shared HS256 key (dev, tests, agents). Several keys
//!   may be accepted at once so a key can be rotated with an overlap; revoked token ids (`jti`)
//!   are refused. Keys and revocations follow their files without a restart
//!   ([`JwtAuthenticator::reloading`]).
//! * [`Chain`]: tries several authenticators (e.g. TokenReview for the Rollouts controller's
//!   projected ServiceAccount token, then JWTs).
//!
//! Every failure is a 401 with a message that says what to fix, and a log line on the server.

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
    /// A caller for every project, not an agent (the Rollouts controller's identity).
    pub fn plugin(subject: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            destination: None,
            projects: Projects::All,
        }
    }
}

/// The Kargo projects a caller may act for.
///
/// The Rollouts controller serves AnalysisRuns of every namespace, so its identity is bound to
/// all projects: a JWT without a `projects` claim, a TokenReview identity without a
/// `policy.callers` entry. A token issued for one team's tooling lists its projects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Projects {
    /// every project
    All,
    /// only the projects matching these globs (`*`, `?`)
    Only {
        /// the globs
        globs: Vec<String>,
        /// what bound the caller to them: says what to change in a refusal
        bound_by: ScopeSource,
    },
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
    /// Whether the caller may act for `project`.
    pub fn allows(&self, project: &str) -> bool {
        match self {
            Projects::All => true,
            Projects::Only { globs, .. } => {
                globs.iter().any(|g| crate::policy::glob_match(g, project))
            }
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
    /// the Kargo projects (globs) the token may act for; absent: every project (the Rollouts
    /// controller's token, which serves every namespace)
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
                    return Ok(Principal {
                        subject: c.sub,
                        destination: c.destination,
                        projects: match c.projects {
                            None => Projects::All,
                            Some(globs) => Projects::Only {
                                globs,
                                bound_by: ScopeSource::TokenClaim,
                            },
                        },
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

#[cfg(test)]
mod tests {
    //! Attacks on the JWT check; every one must be refused with a reason that says what to fix.
    //! (Replaying an agent token for another destination is refused where the destination is
    //! known: the agent API.)

    use base64::Engine as _;
    use serde_json::json;

    use super::*;

    const KEY: &[u8] = b"the-signing-key-of-this-server-0123456789";
    const OTHER_KEY: &[u8] = b"a-key-this-server-does-not-know-0123456789";

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn auth() -> JwtAuthenticator {
        JwtAuthenticator::new(&[KEY.to_vec()], ["revoked-id".to_string()])
    }

    fn claims() -> serde_json::Value {
        json!({"sub": "plugin", "aud": AUDIENCE, "exp": now() + 600, "iat": now(), "jti": "t1"})
    }

    /// Any header and claims, signed with `key` under `alg` (an HMAC algorithm).
    fn raw(
        header: serde_json::Value,
        claims: &serde_json::Value,
        key: &[u8],
        alg: Algorithm,
    ) -> String {
        let b64 = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
        };
        let input = format!("{}.{}", b64(&header), b64(claims));
        let sig = jsonwebtoken::crypto::sign(input.as_bytes(), &EncodingKey::from_secret(key), alg)
            .unwrap();
        format!("{input}.{sig}")
    }

    fn hs256(claims: &serde_json::Value) -> String {
        raw(
            json!({"alg": "HS256", "typ": "JWT"}),
            claims,
            KEY,
            Algorithm::HS256,
        )
    }

    fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
        let mut c = claims();
        c[field] = value;
        c
    }

    fn refused(token: &str) -> AuthError {
        auth()
            .authenticate(token)
            .expect_err("the token must be refused")
    }

    #[test]
    fn a_well_formed_token_is_accepted() {
        let p = auth().authenticate(&hs256(&claims())).unwrap();
        assert_eq!(p.subject, "plugin");
        assert_eq!(p.destination, None);
        assert_eq!(p.projects, Projects::All);
    }

    #[test]
    fn the_projects_claim_binds_the_token() {
        let p = auth()
            .authenticate(&hs256(&with("projects", json!(["team-a", "shared-*"]))))
            .unwrap();
        assert!(p.projects.allows("team-a") && p.projects.allows("shared-x"));
        assert!(!p.projects.allows("team-b") && !p.projects.allows("team-a2"));
        assert!(matches!(
            p.projects,
            Projects::Only {
                bound_by: ScopeSource::TokenClaim,
                ..
            }
        ));
        // An empty list binds the token to no project at all.
        let none = auth()
            .authenticate(&hs256(&with("projects", json!([]))))
            .unwrap();
        assert!(!none.projects.allows("team-a"));
        // A claim that is not a list of strings is not ignored.
        assert!(matches!(
            refused(&hs256(&with("projects", json!("team-a")))),
            AuthError::Invalid(_)
        ));
    }

    #[test]
    fn a_forged_signature_is_refused() {
        let forged = raw(
            json!({"alg": "HS256"}),
            &claims(),
            OTHER_KEY,
            Algorithm::HS256,
        );
        assert_eq!(
            refused(&forged),
            AuthError::Invalid("signature does not match any configured key".into())
        );
        // Claims swapped under a genuine signature.
        let genuine = hs256(&claims());
        let (head, rest) = genuine.split_once('.').unwrap();
        let sig = rest.rsplit_once('.').unwrap().1;
        let elevated = with("sub", json!("admin"));
        let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&elevated).unwrap());
        assert!(matches!(
            refused(&format!("{head}.{body}.{sig}")),
            AuthError::Invalid(m) if m.contains("signature")
        ));
        // No signature at all.
        let unsigned = genuine.rsplit_once('.').unwrap().0.to_string() + ".";
        assert!(matches!(refused(&unsigned), AuthError::Invalid(_)));
    }

    #[test]
    fn another_audience_is_refused() {
        for aud in [
            "kubernetes",
            "rollouts-dispatch-dev",
            "Rollouts-Dispatch",
            "",
        ] {
            let e = refused(&hs256(&with("aud", json!(aud))));
            assert_eq!(e, AuthError::WrongAudience, "{aud:?}");
        }
        assert!(auth()
            .authenticate(&hs256(&with("aud", json!(["other"]))))
            .is_err());
        // A list that includes ours is not a token for us alone: the claims do not parse.
        assert!(matches!(
            refused(&hs256(&with("aud", json!([AUDIENCE, "other"])))),
            AuthError::Invalid(_)
        ));
    }

    #[test]
    fn expiry_is_enforced_beyond_the_leeway_only() {
        let late = hs256(&with("exp", json!(now() - CLOCK_LEEWAY_SECS - 5)));
        assert_eq!(refused(&late), AuthError::Expired);
        assert!(AuthError::Expired.to_string().contains("check the clocks"));
        let day_old = hs256(&with("exp", json!(now() - 86_400)));
        assert_eq!(refused(&day_old), AuthError::Expired);
        // Within the leeway: a clock a little behind the issuer's is tolerated.
        let just = hs256(&with("exp", json!(now() - CLOCK_LEEWAY_SECS + 10)));
        assert!(auth().authenticate(&just).is_ok());
    }

    #[test]
    fn a_token_not_valid_before_a_future_time_is_refused() {
        let later = hs256(&with("nbf", json!(now() + 3600)));
        let e = refused(&later);
        assert!(matches!(e, AuthError::NotYetValid(_)), "{e:?}");
        assert!(e.to_string().contains("`nbf`"), "{e}");
        assert!(e.to_string().contains("check the clocks"), "{e}");
        // Within the leeway, and in the past: fine.
        let soon = hs256(&with("nbf", json!(now() + CLOCK_LEEWAY_SECS - 10)));
        assert!(auth().authenticate(&soon).is_ok());
        assert!(auth()
            .authenticate(&hs256(&with("nbf", json!(now() - 10))))
            .is_ok());
        // An `nbf` that is not a number is not skipped.
        assert!(matches!(
            refused(&hs256(&with("nbf", json!("tomorrow")))),
            AuthError::Invalid(_)
        ));
    }

    #[test]
    fn a_token_issued_tomorrow_is_a_clock_skew_attack() {
        let tomorrow = now() + 86_400;
        let token = hs256(&with("iat", json!(tomorrow)).tap(|c| c["exp"] = json!(tomorrow + 600)));
        let e = refused(&token);
        assert!(matches!(e, AuthError::NotYetValid(_)), "{e:?}");
        let message = e.to_string();
        assert!(
            message.contains("`iat`") && message.contains("check the clocks"),
            "{message}"
        );
        assert!(
            message.contains(&format!("at most {CLOCK_LEEWAY_SECS}s")),
            "{message}"
        );
        // Just beyond the leeway: refused; within it: a clock slightly ahead is tolerated.
        let ahead = hs256(&with("iat", json!(now() + CLOCK_LEEWAY_SECS + 30)));
        assert!(matches!(refused(&ahead), AuthError::NotYetValid(_)));
        let slightly = hs256(&with("iat", json!(now() + CLOCK_LEEWAY_SECS - 10)));
        assert!(auth().authenticate(&slightly).is_ok());
    }

    #[test]
    fn the_leeway_is_one_minute() {
        assert_eq!(CLOCK_LEEWAY_SECS, 60);
        assert_eq!(auth().validation.leeway, CLOCK_LEEWAY_SECS);
        assert!(auth().validation.validate_nbf);
    }

    #[test]
    fn alg_none_is_refused() {
        for alg in ["none", "None", "NONE"] {
            let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&json!({"alg": alg, "typ": "JWT"})).unwrap());
            let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&claims()).unwrap());
            for token in [format!("{header}.{body}."), format!("{header}.{body}")] {
                let e = refused(&token);
                assert!(
                    matches!(&e, AuthError::Invalid(m) if m.contains(&format!("{alg:?} is not accepted"))),
                    "{alg}: {e:?}"
                );
            }
        }
    }

    #[test]
    fn other_algorithms_with_the_same_key_are_refused() {
        // HS512 with the right key: a valid signature, but not the algorithm we accept.
        let hs512 = raw(json!({"alg": "HS512"}), &claims(), KEY, Algorithm::HS512);
        assert!(
            matches!(refused(&hs512), AuthError::Invalid(m) if m.contains("\"HS512\" is not accepted"))
        );
        let via_jsonwebtoken = jsonwebtoken::encode(
            &Header::new(Algorithm::HS384),
            &claims(),
            &EncodingKey::from_secret(KEY),
        )
        .unwrap();
        assert!(matches!(refused(&via_jsonwebtoken), AuthError::Invalid(m) if m.contains("HS384")));
        // RS256 in the header, HMAC with our secret underneath: the key-confusion attack.
        let confused = raw(json!({"alg": "RS256"}), &claims(), KEY, Algorithm::HS256);
        assert!(
            matches!(refused(&confused), AuthError::Invalid(m) if m.contains("\"RS256\" is not accepted"))
        );
        // An HS256 signature labelled "hs256" (case games) is not HS256 either.
        let lower = raw(json!({"alg": "hs256"}), &claims(), KEY, Algorithm::HS256);
        assert!(matches!(refused(&lower), AuthError::Invalid(_)));
    }

    #[test]
    fn required_claims_must_be_present() {
        for missing in ["exp", "sub", "aud", "iat"] {
            let mut c = claims();
            c.as_object_mut().unwrap().remove(missing);
            let e = refused(&hs256(&c));
            assert!(
                matches!(&e, AuthError::Invalid(m) if m.contains(missing)),
                "{missing}: {e:?}"
            );
        }
        // An `exp` that is not a number does not make the token eternal.
        assert!(matches!(
            refused(&hs256(&with("exp", json!("never")))),
            AuthError::Invalid(_)
        ));
        assert!(matches!(
            refused(&hs256(&with("exp", json!(null)))),
            AuthError::Invalid(_)
        ));
    }

    #[test]
    fn revoked_ids_and_garbage_are_refused() {
        assert_eq!(
            refused(&hs256(&with("jti", json!("revoked-id")))),
            AuthError::Revoked("revoked-id".into())
        );
        for garbage in [
            "",
            ".",
            "..",
            "a.b.c",
            "not a token",
            "eyJhbGciOiJIUzI1NiJ9",
        ] {
            assert!(
                matches!(refused(garbage), AuthError::Invalid(_)),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn a_revocations_file_holds_one_id_per_line_with_comments() {
        let ids = parse_revoked("# leaked 2026-11-30\nabc123\n\n  def456  # laptop stolen\n#ghi\n");
        assert_eq!(
            ids,
            ["abc123", "def456"].map(String::from).into_iter().collect()
        );
    }

    /// Whichever comes first, a JWT's specific refusal beats TokenReview's "not a Kubernetes
    /// token" (an HS256 token: refused without asking the apiserver, which is never reached).
    #[tokio::test]
    async fn a_chain_answers_with_the_most_telling_refusal() {
        let unreachable = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let review = || {
            TokenReviewAuthenticator::new(unreachable.clone().try_into().unwrap(), vec![], vec![])
        };
        let expired = hs256(&with("exp", json!(now() - 86_400)));
        for chain in [
            Chain(vec![review().into(), auth().into()]),
            Chain(vec![auth().into(), review().into()]),
        ] {
            assert_eq!(chain.authenticate(&expired).await, Err(AuthError::Expired));
            assert!(chain.authenticate(&hs256(&claims())).await.is_ok());
        }
        let none = Chain(Vec::new()).authenticate(&expired).await;
        assert!(matches!(none, Err(AuthError::Invalid(m)) if m.contains("no authenticator")));
    }

    /// `let x = v.tap(|x| …)`: change a value in an expression.
    trait Tap: Sized {
        fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
            f(&mut self);
            self
        }
    }
    impl Tap for serde_json::Value {}
}
