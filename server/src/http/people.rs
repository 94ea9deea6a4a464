//! People of the control plane ([`ControlPlanePeople`], the [`People`](super::viewer::People)
//! of `serve` with a control plane): who they are, from their own Kubernetes bearer token (a
//! TokenReview with no audiences: the apiserver's own, as `kubectl` tokens are) or from the
//! headers of a trusted authenticating proxy (oauth2-proxy `--pass-user-headers`; never a user
//! or group under Kubernetes' own `system:`), and what they
//! may see: a SubjectAccessReview of `get analysisruns.argoproj.io` in the run's namespace, the
//! rule Kargo users already live under.
//!
//! Every answer of the apiserver is cached in bounded LRUs ([`Lru`], as in `tokenreview`): token
//! reviews by token hash (accepted [`POSITIVE_TTL`], refused [`NEGATIVE_TTL`], each in its own
//! LRU so garbage never evicts a person), access reviews by (user, groups, namespace) for
//! [`ACCESS_TTL`], so a page that lists a hundred runs costs one review per namespace.

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use axum::http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;

use super::auth::AuthError;
use super::tokenreview::{is_ours, Lru, NEGATIVE_MAX, NEGATIVE_TTL, POSITIVE_MAX, POSITIVE_TTL};
use super::viewer::{Person, PersonSource};
use crate::config::{PeopleConfig, ProxyConfig};

/// How long a SubjectAccessReview's answer is reused: bounds how long a removed RoleBinding
/// still shows a person a namespace's runs.
pub const ACCESS_TTL: Duration = Duration::from_secs(30);
/// The most (user, groups, namespace) answers remembered.
pub const ACCESS_MAX: usize = 4096;
/// How long the apiserver may take to answer a review.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// The people of the control plane reached by `client`, as `config` says to recognise them.
pub struct ControlPlanePeople {
    client: kube::Client,
    config: PeopleConfig,
    hasher: RandomState,
    accepted: Mutex<Lru<Person>>,
    refused: Mutex<Lru<AuthError>>,
    access: Mutex<Lru<bool>>,
}

impl ControlPlanePeople {
    /// People reviewed by the apiserver of `client` (`config.token_review`) or named by the
    /// proxy of `config.proxy`.
    pub fn new(client: kube::Client, config: PeopleConfig) -> Self {
        Self {
            client,
            config,
            hasher: RandomState::new(),
            accepted: Mutex::new(Lru::new(POSITIVE_MAX, POSITIVE_TTL)),
            refused: Mutex::new(Lru::new(NEGATIVE_MAX, NEGATIVE_TTL)),
            access: Mutex::new(Lru::new(ACCESS_MAX, ACCESS_TTL)),
        }
    }

    /// Answers cached right now (token reviews, accepted and refused, and access reviews).
    pub fn cached(&self) -> usize {
        lock(&self.accepted).len() + lock(&self.refused).len() + self.access_cached()
    }

    fn access_cached(&self) -> usize {
        lock(&self.access).len()
    }

    async fn review(&self, token: &str) -> Result<Person, AuthError> {
        // No audiences: the apiserver's own, which `kubectl create token` and kubeconfig tokens
        // carry; a token made for another audience (ours, `rollouts-dispatch`) is refused.
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| {
                    AuthError::Unavailable("the TokenReview did not answer within 10s".into())
                })?
                .map_err(|e| AuthError::Unavailable(format!("TokenReview failed: {e}")))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status.error.unwrap_or_else(|| "not authenticated".into());
            return Err(AuthError::Invalid(format!(
                "the control plane's apiserver rejected the token: {why}"
            )));
        }
        let user = status.user.unwrap_or_default();
        let name = user.username.unwrap_or_default();
        if name.is_empty() {
            return Err(AuthError::Invalid(
                "the control plane's apiserver accepted the token but names no user".into(),
            ));
        }
        Ok(Person {
            user: name,
            groups: user.groups.unwrap_or_default(),
            via: PersonSource::Token,
        })
    }

    async fn access_review(&self, person: &Person, namespace: &str) -> Result<bool, AuthError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(person.user.clone()),
                groups: Some(person.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some("get".into()),
                    group: Some("argoproj.io".into()),
                    resource: Some("analysisruns".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let reviewed =
            tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
                .map_err(|_| {
                    AuthError::Unavailable(
                        "the SubjectAccessReview did not answer within 10s".into(),
                    )
                })?
                .map_err(|e| AuthError::Unavailable(format!("SubjectAccessReview failed: {e}")))?;
        Ok(reviewed.status.is_some_and(|s| s.allowed))
    }
}

/// A cache, whether or not a panic poisoned its lock (its entries are whole either way).
fn lock<V>(m: &Mutex<Lru<V>>) -> MutexGuard<'_, Lru<V>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The person `proxy`'s headers name, when `peer` is one of its addresses; `None` otherwise
/// (headers from anyone else are not looked at beyond a debug line); an error for a user under
/// `system:`.
fn proxied_person(
    proxy: &ProxyConfig,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
) -> Option<Result<Person, AuthError>> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let trusted = peer.is_some_and(|p| proxy.trusted_addresses.iter().any(|r| r.contains(p.ip())));
    if !trusted {
        if header(&proxy.user_header).is_some() {
            tracing::debug!(
                peer = ?peer,
                header = %proxy.user_header,
                "user header from a peer outside ui.people.proxy.trustedAddresses: ignored"
            );
        }
        return None;
    }
    let user = header(&proxy.user_header)?;
    // `system:` is Kubernetes' own namespace of users and groups (system:masters,
    // system:nodes, system:serviceaccount:…): an identity provider behind the proxy may let
    // people name their own groups (a GitHub team, an LDAP group), so a name there is never
    // taken as a Kubernetes identity. Such a user is refused; such groups are dropped and the
    // person is reviewed with the rest (fewer groups only ever show less).
    if user.starts_with(SYSTEM_PREFIX) {
        tracing::warn!(peer = ?peer, user, "proxy user under `system:` refused");
        return Some(Err(AuthError::SystemIdentity(user.to_string())));
    }
    let groups = header(&proxy.groups_header)
        .map(|g| {
            g.split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .filter(|g| {
                    let system = g.starts_with(SYSTEM_PREFIX);
                    if system {
                        tracing::warn!(peer = ?peer, user, group = g,
                                       "proxy group under `system:` dropped");
                    }
                    !system
                })
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    Some(Ok(Person {
        user: user.to_string(),
        groups,
        via: PersonSource::Proxy,
    }))
}

/// Kubernetes' reserved prefix of users and groups: never accepted from a proxy.
const SYSTEM_PREFIX: &str = "system:";

impl ControlPlanePeople {
    /// The person the configured proxy vouches for (see [`People::by_proxy`](super::viewer::People::by_proxy)).
    pub fn by_proxy(
        &self,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<Option<Person>, AuthError> {
        self.config
            .proxy
            .as_ref()
            .and_then(|p| proxied_person(p, headers, peer))
            .transpose()
    }

    /// The person `token` belongs to, by a TokenReview (cached); `Ok(None)` when people's tokens
    /// are not reviewed (`token_review: false`) or it is one of our own JWTs.
    pub async fn by_token(&self, token: &str) -> Result<Option<Person>, AuthError> {
        // Our own JWTs are never Kubernetes tokens (see `tokenreview::is_ours`): no review.
        if !self.config.token_review || is_ours(token) {
            return Ok(None);
        }
        let key = self.hasher.hash_one(token);
        if let Some(p) = lock(&self.accepted).get(key) {
            return Ok(Some(p));
        }
        if let Some(e) = lock(&self.refused).get(key) {
            return Err(e);
        }
        match self.review(token).await {
            Ok(p) => {
                lock(&self.accepted).insert(key, p.clone());
                Ok(Some(p))
            }
            // An apiserver that cannot answer says nothing about the token: ask again.
            Err(e @ AuthError::Unavailable(_)) => Err(e),
            Err(e) => {
                lock(&self.refused).insert(key, e.clone());
                Err(e)
            }
        }
    }

    /// Whether `person` may `get analysisruns.argoproj.io` in `namespace`: a
    /// SubjectAccessReview, its answer cached for [`ACCESS_TTL`].
    pub async fn may_see(&self, person: &Person, namespace: &str) -> Result<bool, AuthError> {
        let key = self
            .hasher
            .hash_one((&person.user, &person.groups, namespace));
        let cached = lock(&self.access).get(key);
        if let Some(allowed) = cached {
            return Ok(allowed);
        }
        let allowed = self.access_review(person, namespace).await?;
        tracing::debug!(user = %person.user, namespace, allowed, "subject access review");
        lock(&self.access).insert(key, allowed);
        Ok(allowed)
    }
}

#[cfg(test)]
mod tests;
