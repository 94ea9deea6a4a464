//! Authenticates Kubernetes ServiceAccount tokens (e.g. the Rollouts controller's projected token
//! with audience `rollouts-dispatch`) with a TokenReview against the control-plane apiserver.
//!
//! Results are cached for a minute by token hash, so a burst of plugin calls costs one review.
//! A user matching a `policy.callers` entry may act only for that entry's projects.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;
use kube::Api;

use super::auth::{AuthError, Authenticator, Principal, Projects, ScopeSource, AUDIENCE};
use crate::config::CallerBinding;
use futures::future::BoxFuture;

const CACHE_TTL: Duration = Duration::from_secs(60);
const CACHE_MAX: usize = 4096;

/// A review result and when it was made, by token hash.
type ReviewCache = HashMap<u64, (Instant, Result<Principal, AuthError>)>;

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
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// Binds the users matching a `policy.callers` entry of config file `origin` to its
    /// projects (the first matching entry applies; users no entry matches: every project).
    pub fn with_callers(mut self, callers: Vec<CallerBinding>, origin: &str) -> Self {
        self.callers = callers;
        self.origin = origin.to_string();
        self
    }

    /// The projects user `user` may act for.
    fn projects_of(&self, user: &str) -> Projects {
        match self
            .callers
            .iter()
            .position(|c| crate::policy::glob_match(&c.subject, user))
        {
            None => Projects::All,
            Some(index) => Projects::Only {
                globs: self.callers[index].projects.clone(),
                bound_by: ScopeSource::Config {
                    index,
                    origin: self.origin.clone(),
                },
            },
        }
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
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        if !self.allowed.iter().any(|a| a == &user) {
            return Err(AuthError::NotAllowed(user));
        }
        Ok(Principal {
            projects: self.projects_of(&user),
            subject: user,
            destination: None,
        })
    }
}

impl Authenticator for TokenReviewAuthenticator {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Principal, AuthError>> {
        Box::pin(async move {
            // A JWT from `token issue` is not a Kubernetes token: let the next authenticator try.
            let key = self.hasher.hash_one(token);
            if let Some((at, result)) = self.cache.lock().expect("cache lock").get(&key) {
                if at.elapsed() < CACHE_TTL {
                    return result.clone();
                }
            }
            let result = self.review(token).await;
            if !matches!(result, Err(AuthError::Unavailable(_))) {
                let mut cache = self.cache.lock().expect("cache lock");
                if cache.len() >= CACHE_MAX {
                    cache.retain(|_, (at, _)| at.elapsed() < CACHE_TTL);
                }
                cache.insert(key, (Instant::now(), result.clone()));
            }
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let a = auth.projects_of("system:serviceaccount:team-a:ci");
        assert!(a.allows("team-a") && !a.allows("shared-x"));
        assert_eq!(
            a,
            Projects::Only {
                globs: vec!["team-a".into()],
                bound_by: ScopeSource::Config {
                    index: 0,
                    origin: "config file c.yaml".into()
                }
            }
        );
        let other = auth.projects_of("system:serviceaccount:argo-rollouts:argo-rollouts");
        assert!(other.allows("shared-1") && !other.allows("team-a"));
        assert_eq!(auth.projects_of("alice"), Projects::All);
    }
}
