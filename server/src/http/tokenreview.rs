//! Authenticates Kubernetes ServiceAccount tokens (e.g. the Rollouts controller's projected token
//! with audience `rollouts-dispatch`) with a TokenReview against the control-plane apiserver.
//!
//! Results are cached by token hash in two bounded LRUs, so a burst of plugin calls costs one
//! review and a storm of garbage tokens costs bounded memory: accepted tokens for
//! [`POSITIVE_TTL`] (at most [`POSITIVE_MAX`]), refused ones for the shorter [`NEGATIVE_TTL`] (at
//! most [`NEGATIVE_MAX`], in their own LRU so that garbage can never evict a good result).
//! Tokens whose header says `alg: HS256` are our own JWTs, never Kubernetes ServiceAccount
//! tokens: they are refused here without a review (see [`is_ours`]).
//! A user matching a `policy.callers` entry may act only for that entry's projects; a user no
//! entry matches is refused (403 naming the entry to add: callers fail closed, #27). The review
//! asks for our audience, and the answer must name it in `status.audiences` (see
//! [`audience_checked`]).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::Api;

use super::auth::{AuthError, Principal, Projects, ScopeSource, AUDIENCE};
use crate::config::CallerBinding;

/// How long an accepted token is trusted without asking again: bounds how long a token whose
/// ServiceAccount (or pod, for a projected token) was deleted keeps working here.
pub const POSITIVE_TTL: Duration = Duration::from_secs(60);
/// How long a refused token stays refused without asking again. Shorter than [`POSITIVE_TTL`]:
/// a negative entry only spares the apiserver a caller that retries the same bad token, while a
/// stale one locks out a token that just became valid (a projected token presented while an HA
/// apiserver's key set is still rolling out, or an answer given during apiserver trouble), so it
/// is kept just long enough to absorb a retry loop.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// The most accepted tokens remembered (a few callers in practice: the Rollouts controller's
/// replicas and their token rotations).
pub const POSITIVE_MAX: usize = 4096;
/// The most refused tokens remembered; their own LRU, so a flood of garbage tokens evicts only
/// other garbage.
pub const NEGATIVE_MAX: usize = 1024;

/// A least-recently-used map with a hard size cap and a per-entry lifetime: `get` refreshes an
/// entry's recency, `insert` evicts the least recently used entry beyond the cap.
#[derive(Debug)]
pub(crate) struct Lru<V> {
    cap: usize,
    ttl: Duration,
    tick: u64,
    entries: HashMap<u64, (Instant, u64, V)>,
    /// recency tick → key; the first entry is the least recently used
    order: BTreeMap<u64, u64>,
}

impl<V: Clone> Lru<V> {
    /// Empty; holds at most `cap` (≥ 1) entries for `ttl` each.
    pub(crate) fn new(cap: usize, ttl: Duration) -> Self {
        Self {
            cap: cap.max(1),
            ttl,
            tick: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    fn touch(&mut self, key: u64) -> u64 {
        self.tick += 1;
        self.order.insert(self.tick, key);
        self.tick
    }

    /// The live value of `key` (an expired one is dropped), now the most recently used.
    pub(crate) fn get(&mut self, key: u64) -> Option<V> {
        let (at, tick, _) = self.entries.get(&key)?;
        let (at, old) = (*at, *tick);
        self.order.remove(&old);
        if at.elapsed() >= self.ttl {
            self.entries.remove(&key);
            return None;
        }
        let tick = self.touch(key);
        let entry = self.entries.get_mut(&key)?;
        entry.1 = tick;
        Some(entry.2.clone())
    }

    /// Stores `value` for `key`, evicting the least recently used entries beyond the cap.
    pub(crate) fn insert(&mut self, key: u64, value: V) {
        if let Some((_, old, _)) = self.entries.remove(&key) {
            self.order.remove(&old);
        }
        while self.entries.len() >= self.cap {
            let Some((_, lru)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&lru);
        }
        let tick = self.touch(key);
        self.entries.insert(key, (Instant::now(), tick, value));
    }

    /// Entries held (expired ones included until they are looked up or evicted).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Review results by token hash: accepted and refused ones apart.
#[derive(Debug)]
struct ReviewCache {
    accepted: Lru<Principal>,
    refused: Lru<AuthError>,
}

impl ReviewCache {
    fn new() -> Self {
        Self {
            accepted: Lru::new(POSITIVE_MAX, POSITIVE_TTL),
            refused: Lru::new(NEGATIVE_MAX, NEGATIVE_TTL),
        }
    }

    fn get(&mut self, key: u64) -> Option<Result<Principal, AuthError>> {
        if let Some(p) = self.accepted.get(key) {
            return Some(Ok(p));
        }
        self.refused.get(key).map(Err)
    }

    fn insert(&mut self, key: u64, result: &Result<Principal, AuthError>) {
        match result {
            Ok(p) => self.accepted.insert(key, p.clone()),
            Err(e) => self.refused.insert(key, e.clone()),
        }
    }

    fn len(&self) -> usize {
        self.accepted.len() + self.refused.len()
    }
}

/// Whether `token` is one of our own JWTs by its header (`alg: HS256`): Kubernetes signs
/// ServiceAccount tokens with RS256 (RSA keys) or ES256/384/512 (ECDSA keys), never an HMAC
/// (kubernetes pkg/serviceaccount/jwt.go, `JWTTokenGenerator`, `signerFromRSAPrivateKey`,
/// `signerFromECDSAPrivateKey`, at 023feb4a), so a review of such a token can only fail and
/// would let anyone spend the apiserver's time with forged JWTs.
pub fn is_ours(token: &str) -> bool {
    super::auth::header_alg(token).as_deref() == Some("HS256")
}

/// Refuses a review whose `status.audiences` names none of the `asked` audiences. Kubernetes
/// says a client that sets `spec.audiences` "should validate that a compatible audience
/// identifier is returned in the status.audiences field to ensure that the TokenReview server
/// is audience aware", and an empty `status.audiences` with `authenticated: true` means the
/// token is valid for the apiserver's own audience (k8s.io/api authentication/v1/types.go:91-102
/// at v0.34.5, `TokenReviewStatus.Audiences`), not ours: a token made for the apiserver (a
/// kubeconfig or `kubectl create token` token) or a webhook authenticator that ignores
/// audiences would otherwise be taken for the Rollouts controller's projected token. (People's
/// reviews ask for no audience, the apiserver's own, and are not checked this way.)
fn audience_checked(asked: &[String], answered: Option<&[String]>) -> Result<(), AuthError> {
    let answered = answered.unwrap_or_default();
    if answered.iter().any(|a| asked.contains(a)) {
        return Ok(());
    }
    let answered = if answered.is_empty() {
        "none (the token is for the apiserver itself, or the authenticator is not audience-aware)"
            .to_string()
    } else {
        answered.join(", ")
    };
    Err(AuthError::NotOurAudience {
        ours: asked.join(", "),
        answered,
    })
}

/// TokenReview-backed authenticator with an allow-list of usernames.
pub struct TokenReviewAuthenticator {
    client: kube::Client,
    audiences: Vec<String>,
    allowed: Vec<String>,
    /// `policy.callers`: users bound to projects
    callers: Vec<CallerBinding>,
    /// the config file of `callers`, for messages
    origin: String,
    hasher: RandomState,
    cache: Mutex<ReviewCache>,
}

impl TokenReviewAuthenticator {
    /// Accepts tokens the apiserver of `client` validates for `audiences` (default
    /// `rollouts-dispatch`) whose user is in `allowed` (e.g.
    /// `system:serviceaccount:argo-rollouts:argo-rollouts`).
    pub fn new(client: kube::Client, audiences: Vec<String>, allowed: Vec<String>) -> Self {
        let audiences = if audiences.is_empty() {
            vec![AUDIENCE.to_string()]
        } else {
            audiences
        };
        Self {
            client,
            audiences,
            allowed,
            callers: Vec::new(),
            origin: String::new(),
            hasher: RandomState::new(),
            cache: Mutex::new(ReviewCache::new()),
        }
    }

    /// Results cached right now (accepted and refused); never more than
    /// [`POSITIVE_MAX`] + [`NEGATIVE_MAX`].
    pub fn cached(&self) -> usize {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Binds the users matching a `policy.callers` entry of config file `origin` to its
    /// projects (the first matching entry applies; a user no entry matches is refused).
    pub fn with_callers(mut self, callers: Vec<CallerBinding>, origin: &str) -> Self {
        self.callers = callers;
        self.origin = origin.to_string();
        self
    }

    /// The allowed users no `policy.callers` entry matches: each would be refused on every
    /// request, so `serve` refuses to start with them.
    pub fn unbound(&self) -> Vec<&str> {
        self.allowed
            .iter()
            .map(String::as_str)
            .filter(|u| self.projects_of(u).is_none())
            .collect()
    }

    /// The projects user `user` may act for: its first matching `policy.callers` entry's.
    fn projects_of(&self, user: &str) -> Option<Projects> {
        let index = self
            .callers
            .iter()
            .position(|c| crate::policy::glob_match(&c.subject, user))?;
        Some(Projects {
            globs: self.callers[index].projects.clone(),
            bound_by: ScopeSource::Config {
                index,
                origin: self.origin.clone(),
            },
        })
    }

    async fn review(&self, token: &str) -> Result<Principal, AuthError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(self.audiences.clone()),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed = tokio::time::timeout(
            Duration::from_secs(10),
            api.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| AuthError::Unavailable("the TokenReview did not answer within 10s".into()))?
        .map_err(|e| AuthError::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status.error.unwrap_or_else(|| "not authenticated".into());
            return Err(AuthError::Invalid(format!(
                "the apiserver rejected the token: {why}"
            )));
        }
        audience_checked(&self.audiences, status.audiences.as_deref())?;
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        if !self.allowed.iter().any(|a| a == &user) {
            return Err(AuthError::NotAllowed(user));
        }
        let Some(projects) = self.projects_of(&user) else {
            tracing::warn!(user = %user, origin = %self.origin,
                           "refused: TokenReview identity with no policy.callers entry");
            return Err(AuthError::Unbound {
                user,
                origin: self.origin.clone(),
            });
        };
        Ok(Principal {
            projects,
            subject: user,
            destination: None,
        })
    }

    /// Returns the caller `token` belongs to: the apiserver's answer, cached.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        // A JWT from `token issue` is not a Kubernetes token: the JWT authenticator of the
        // chain alone decides it, and no review is spent on it.
        if is_ours(token) {
            return Err(AuthError::Invalid(
                "an HS256 token is a rollouts-dispatch JWT, not a Kubernetes ServiceAccount \
                 token; it is checked against --jwt-key-file only"
                    .into(),
            ));
        }
        let key = self.hasher.hash_one(token);
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key);
        if let Some(result) = cached {
            return result;
        }
        let result = self.review(token).await;
        // An apiserver that cannot answer says nothing about the token: ask again next time.
        if !matches!(result, Err(AuthError::Unavailable(_))) {
            self.cache
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, &result);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    //! The review budget: what a storm of tokens costs the apiserver and this server's memory.

    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use axum::routing::post;
    use axum::{Json, Router};
    use base64::Engine as _;
    use serde_json::{json, Value};

    use super::*;

    /// A TokenReview endpoint that accepts `good-…` tokens only and counts the reviews.
    async fn apiserver() -> (kube::Client, Arc<AtomicUsize>) {
        let reviews = Arc::new(AtomicUsize::new(0));
        let counted = reviews.clone();
        let app = Router::new().route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(move |Json(review): Json<Value>| {
                counted.fetch_add(1, Ordering::SeqCst);
                let token = review["spec"]["token"].as_str().unwrap_or_default().to_string();
                async move {
                    let mut answer = review.clone();
                    answer["status"] = if token.starts_with("good-") {
                        json!({"authenticated": true, "audiences": review["spec"]["audiences"],
                               "user": {"username": "system:serviceaccount:argo-rollouts:argo-rollouts"}})
                    } else {
                        json!({"authenticated": false, "error": "invalid bearer token"})
                    };
                    Json(answer)
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
        (client, reviews)
    }

    /// Allows the controller, bound by one `policy.callers` entry (`subject` to `projects`).
    fn controller_bound_by(
        client: kube::Client,
        subject: &str,
        projects: &str,
    ) -> TokenReviewAuthenticator {
        TokenReviewAuthenticator::new(
            client,
            Vec::new(),
            vec!["system:serviceaccount:argo-rollouts:argo-rollouts".into()],
        )
        .with_callers(
            vec![CallerBinding {
                subject: subject.into(),
                projects: vec![projects.into()],
            }],
            "config file c.yaml",
        )
    }

    fn authenticator(client: kube::Client) -> TokenReviewAuthenticator {
        controller_bound_by(client, "system:serviceaccount:argo-rollouts:*", "*")
    }

    /// A JWT-shaped token with header `alg` and a unique body (its signature is garbage).
    fn jwt(alg: &str, n: usize) -> String {
        let b64 = |v: Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(&v).unwrap())
        };
        format!(
            "{}.{}.c2ln",
            b64(json!({"alg": alg, "typ": "JWT"})),
            b64(json!({"sub": format!("garbage-{n}")}))
        )
    }

    #[tokio::test]
    async fn a_storm_of_garbage_hs256_tokens_costs_no_review() {
        let (client, reviews) = apiserver().await;
        let auth = authenticator(client);
        for n in 0..1000 {
            let e = auth.authenticate(&jwt("HS256", n)).await.unwrap_err();
            assert!(
                matches!(&e, AuthError::Invalid(m) if m.contains("--jwt-key-file")),
                "{e:?}"
            );
        }
        assert_eq!(reviews.load(Ordering::SeqCst), 0);
        assert_eq!(
            auth.cached(),
            0,
            "refused without a review, nothing to remember"
        );
        // An RS256 token is what Kubernetes issues: that one is reviewed.
        assert!(auth.authenticate(&jwt("RS256", 0)).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn the_cache_never_exceeds_its_cap_and_garbage_never_evicts_a_good_token() {
        let (client, reviews) = apiserver().await;
        let auth = authenticator(client);
        assert!(auth.authenticate("good-controller").await.is_ok());
        let n = NEGATIVE_MAX + 500;
        for i in 0..n {
            assert!(auth.authenticate(&jwt("RS256", i)).await.is_err());
            assert!(auth.cached() <= POSITIVE_MAX + NEGATIVE_MAX);
        }
        assert_eq!(auth.cached(), 1 + NEGATIVE_MAX);
        assert_eq!(reviews.load(Ordering::SeqCst), 1 + n);
        // The controller's token is still remembered: no new review.
        assert!(auth.authenticate("good-controller").await.is_ok());
        assert_eq!(reviews.load(Ordering::SeqCst), 1 + n);
        // A recent refusal is remembered too; an evicted one is asked again.
        assert!(auth.authenticate(&jwt("RS256", n - 1)).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 1 + n);
        assert!(auth.authenticate(&jwt("RS256", 0)).await.is_err());
        assert_eq!(reviews.load(Ordering::SeqCst), 2 + n);
    }

    #[test]
    fn the_lru_evicts_the_least_recently_used_and_expires_entries() {
        let mut lru = Lru::new(3, Duration::from_secs(60));
        for k in 0..3 {
            lru.insert(k, k * 10);
        }
        // 0 is used again: 1 is now the least recently used and goes first.
        assert_eq!(lru.get(0), Some(0));
        lru.insert(3, 30);
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.get(1), None);
        assert_eq!(lru.get(0), Some(0));
        assert_eq!(lru.get(2), Some(20));
        // Re-inserting a key replaces it without growing.
        lru.insert(2, 21);
        assert_eq!(lru.len(), 3);
        assert_eq!(lru.get(2), Some(21));
        for k in 100..10_000 {
            lru.insert(k, k);
            assert!(lru.len() <= 3);
        }
        assert_eq!(
            lru.order.len(),
            lru.len(),
            "the recency index holds no stale ticks"
        );
        let mut short = Lru::new(3, Duration::ZERO);
        short.insert(1, 1);
        assert_eq!(short.get(1), None, "an expired entry is not returned");
        assert_eq!(short.len(), 0);
    }

    #[tokio::test]
    async fn callers_bind_users_to_projects_first_match_wins() {
        let client =
            kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap()))
                .unwrap();
        let auth = TokenReviewAuthenticator::new(client, Vec::new(), Vec::new()).with_callers(
            vec![
                CallerBinding {
                    subject: "system:serviceaccount:team-a:*".into(),
                    projects: vec!["team-a".into()],
                },
                CallerBinding {
                    subject: "system:serviceaccount:*".into(),
                    projects: vec!["shared-*".into()],
                },
            ],
            "config file c.yaml",
        );
        let a = auth.projects_of("system:serviceaccount:team-a:ci").unwrap();
        assert!(a.allows("team-a") && !a.allows("shared-x"));
        assert_eq!(
            a,
            Projects {
                globs: vec!["team-a".into()],
                bound_by: ScopeSource::Config {
                    index: 0,
                    origin: "config file c.yaml".into()
                }
            }
        );
        let other = auth
            .projects_of("system:serviceaccount:argo-rollouts:argo-rollouts")
            .unwrap();
        assert!(other.allows("shared-1") && !other.allows("team-a"));
        // Fail closed (#27): no entry, no project (it once meant every project).
        assert_eq!(auth.projects_of("alice"), None);
    }

    #[tokio::test]
    async fn an_identity_without_a_callers_entry_is_refused_with_the_entry_to_add() {
        let (client, _) = apiserver().await;
        let auth = controller_bound_by(client, "system:serviceaccount:team-a:*", "team-a");
        assert_eq!(
            auth.unbound(),
            ["system:serviceaccount:argo-rollouts:argo-rollouts"]
        );
        let e = auth.authenticate("good-controller").await.unwrap_err();
        assert_eq!(e.status(), axum::http::StatusCode::FORBIDDEN);
        let message = e.to_string();
        assert!(
            message.contains(
                "system:serviceaccount:argo-rollouts:argo-rollouts matches no `policy.callers` \
                 entry in config file c.yaml"
            ) && message.contains(
                "`policy: {callers: [{subject: \"system:serviceaccount:argo-rollouts:argo-rollouts\", \
                 projects: [\"*\"]}]}`"
            ),
            "{message}"
        );
        assert!(authenticator(kube_client()).unbound().is_empty());
    }

    fn kube_client() -> kube::Client {
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap()
    }

    #[test]
    fn the_answer_must_name_an_audience_we_asked_for() {
        let ours = vec![AUDIENCE.to_string()];
        assert!(audience_checked(&ours, Some(&ours)).is_ok());
        let both = vec!["other".to_string(), AUDIENCE.to_string()];
        assert!(audience_checked(&ours, Some(&both)).is_ok());
        for answered in [
            None,
            Some(&[][..]),
            Some(&["https://kubernetes.default.svc".to_string()][..]),
        ] {
            let e = audience_checked(&ours, answered).unwrap_err().to_string();
            assert!(
                e.contains("not for audience rollouts-dispatch")
                    && e.contains("serviceAccountToken.audience: rollouts-dispatch"),
                "{e}"
            );
        }
        let e = audience_checked(&ours, None).unwrap_err().to_string();
        assert!(e.contains("not audience-aware"), "{e}");
    }
}
