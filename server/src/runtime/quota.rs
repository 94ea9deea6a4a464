//! Budgets shared out per owner (a Kargo project, an agent destination): at most `max` of one
//! kind of work held at once by each owner, counted on this replica ([`Quota`]). The request
//! budgets of `limits` bound a kind of request for everyone together, before authentication;
//! a quota bounds what one owner may hold of it, after the route knows who the owner is, so
//! that one project saturating its measurement calls, log streams or Application calls cannot
//! take the slots another project's plugin call needs (issue #27).
//!
//! Taking is immediate: a quota never queues. Beyond its size the caller gets [`OverQuota`],
//! whose message names the owner, the size and the config key that sets it, and which the API
//! answers `429 over_budget` with `Retry-After`. What is held is given back when the [`Held`]
//! is dropped, however the work ends (a reader hanging up included). Only owners holding
//! something are remembered, so the map is bounded by what is in flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::metrics::Metrics;

/// `Retry-After` of a refusal, seconds: the work of the same owner in flight ends soon or is
/// long (a followed log), and the caller (the plugin, `logs -f`, Kargo's step) retries anyway.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// At most `max` units held at once per owner.
#[derive(Clone)]
pub struct Quota {
    inner: Arc<Inner>,
}

struct Inner {
    /// the config key that sizes it: `budgets.measurementCallsPerProject`
    key: &'static str,
    /// what an owner is, for messages: `project`, `destination`
    owner: &'static str,
    /// what a unit is, for messages: `measurement calls in progress`
    what: &'static str,
    max: usize,
    held: Mutex<HashMap<String, usize>>,
    metrics: Option<Arc<Metrics>>,
}

impl std::fmt::Debug for Quota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Quota")
            .field("key", &self.inner.key)
            .field("max", &self.inner.max)
            .finish_non_exhaustive()
    }
}

/// Units of a [`Quota`] held by one owner; given back when dropped.
#[must_use = "the units are given back when this is dropped"]
pub struct Held {
    inner: Arc<Inner>,
    owner: String,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Held({} of {:?})", self.inner.key, self.owner)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.inner.lock();
        if let Some(n) = held.get_mut(&self.owner) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.owner);
            }
        }
    }
}

/// An owner at its quota: the message names the owner, the size and the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.describe())]
pub struct OverQuota {
    /// the config key that sizes the quota
    pub key: &'static str,
    /// what the owner is (`project`, `destination`)
    pub owner_kind: &'static str,
    /// the owner
    pub owner: String,
    /// what a unit is
    pub what: &'static str,
    /// the size
    pub max: usize,
    /// what the owner holds now
    pub held: usize,
    /// how many units were asked for at once
    pub wanted: usize,
}

impl OverQuota {
    fn describe(&self) -> String {
        let Self {
            key,
            owner_kind,
            owner,
            what,
            max,
            held,
            wanted,
        } = self;
        let has = if *wanted > 1 {
            format!(
                "would have {} {what} ({held} now and {wanted} more)",
                held + wanted
            )
        } else {
            format!("already has {held} {what}")
        };
        format!(
            "{owner_kind} {owner:?} {has} on this server replica, and `{key}` allows {max}; \
             retry shortly, or raise `{key}` in the server's config"
        )
    }
}

impl Quota {
    /// A quota of `max` (at least 1) per owner, sized by config key `key`; `owner` and `what`
    /// name an owner and a unit in messages. With `metrics`, refusals are counted by `key`.
    pub fn new(
        key: &'static str,
        owner: &'static str,
        what: &'static str,
        max: usize,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        if let Some(m) = &metrics {
            m.start_over_budget(key);
        }
        Self {
            inner: Arc::new(Inner {
                key,
                owner,
                what,
                max: max.max(1),
                held: Mutex::new(HashMap::new()),
                metrics,
            }),
        }
    }

    /// One unit for `owner`, or why not.
    pub fn take(&self, owner: &str) -> Result<Held, OverQuota> {
        let mut held = self.take_n(owner, 1)?;
        Ok(held.pop().expect("take_n(1) holds one unit"))
    }

    /// `n` units for `owner`, all or none (one [`Held`] each, so that each piece of work gives
    /// its own back when it ends).
    pub fn take_n(&self, owner: &str, n: usize) -> Result<Vec<Held>, OverQuota> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut held = self.inner.lock();
        let now = held.get(owner).copied().unwrap_or(0);
        if now.saturating_add(n) > self.inner.max {
            drop(held);
            let refused = OverQuota {
                key: self.inner.key,
                owner_kind: self.inner.owner,
                owner: owner.to_string(),
                what: self.inner.what,
                max: self.inner.max,
                held: now,
                wanted: n,
            };
            if let Some(m) = &self.inner.metrics {
                m.count_over_budget(self.inner.key);
            }
            tracing::warn!(
                key = self.inner.key,
                owner_kind = self.inner.owner,
                owner,
                held = now,
                wanted = n,
                max = self.inner.max,
                "refused: over its budget"
            );
            return Err(refused);
        }
        held.insert(owner.to_string(), now + n);
        drop(held);
        Ok((0..n)
            .map(|_| Held {
                inner: self.inner.clone(),
                owner: owner.to_string(),
            })
            .collect())
    }

    /// What `owner` holds now.
    pub fn held(&self, owner: &str) -> usize {
        self.inner.lock().get(owner).copied().unwrap_or(0)
    }

    /// How many owners hold something now.
    pub fn owners(&self) -> usize {
        self.inner.lock().len()
    }

    /// The size.
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// The config key that sizes it.
    pub fn key(&self) -> &'static str {
        self.inner.key
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(max: usize, metrics: Option<Arc<Metrics>>) -> Quota {
        Quota::new(
            "budgets.measurementCallsPerProject",
            "project",
            "measurement calls in progress",
            max,
            metrics,
        )
    }

    #[test]
    fn each_owner_has_its_own_share() {
        let q = quota(2, None);
        let a1 = q.take("team-a").unwrap();
        let _a2 = q.take("team-a").unwrap();
        let refused = q.take("team-a").unwrap_err();
        assert_eq!((refused.held, refused.max, refused.wanted), (2, 2, 1));
        // Another project is not touched by team-a's share.
        let _b = q.take("team-b").unwrap();
        assert_eq!((q.held("team-a"), q.held("team-b")), (2, 1));
        drop(a1);
        assert_eq!(q.held("team-a"), 1);
        let _a3 = q.take("team-a").expect("a unit given back is free again");
    }

    #[test]
    fn the_message_names_the_owner_the_size_and_the_key() {
        let q = quota(1, None);
        let _a = q.take("team-a").unwrap();
        let text = q.take("team-a").unwrap_err().to_string();
        assert_eq!(
            text,
            "project \"team-a\" already has 1 measurement calls in progress on this server \
             replica, and `budgets.measurementCallsPerProject` allows 1; retry shortly, or raise \
             `budgets.measurementCallsPerProject` in the server's config"
        );
        let many = quota(3, None).take_n("team-a", 5).unwrap_err().to_string();
        assert!(
            many.starts_with(
                "project \"team-a\" would have 5 measurement calls in progress (0 now and 5 more)"
            ),
            "{many}"
        );
    }

    #[test]
    fn several_units_are_taken_all_or_none_and_given_back_one_by_one() {
        let q = quota(3, None);
        let _one = q.take("p").unwrap();
        assert!(q.take_n("p", 3).is_err(), "1 + 3 > 3");
        assert_eq!(q.held("p"), 1, "a refusal takes nothing");
        let mut two = q.take_n("p", 2).unwrap();
        assert_eq!((two.len(), q.held("p")), (2, 3));
        two.pop();
        assert_eq!(q.held("p"), 2);
        assert!(q.take_n("p", 0).unwrap().is_empty());
    }

    #[test]
    fn owners_are_forgotten_once_they_hold_nothing() {
        let q = quota(1, None);
        for i in 0..1000 {
            let _h = q.take(&format!("p{i}")).unwrap();
        }
        assert_eq!(q.owners(), 0, "no entry left behind");
        let h = q.take("p").unwrap();
        assert_eq!(q.owners(), 1);
        drop(h);
        assert_eq!(q.owners(), 0);
    }

    #[test]
    fn a_size_of_zero_is_one_and_clones_share_the_count() {
        let q = quota(0, None);
        assert_eq!(q.max(), 1);
        let _h = q.clone().take("p").unwrap();
        assert!(q.take("p").is_err());
    }

    #[test]
    fn refusals_are_counted_by_key_without_the_owner() {
        let metrics = Arc::new(Metrics::new());
        let q = quota(1, Some(metrics.clone()));
        let zero = metrics.encode();
        assert!(
            zero.contains(
                r#"rollouts_dispatch_over_budget_total{key="budgets.measurementCallsPerProject"} 0"#
            ),
            "{zero}"
        );
        let _h = q.take("team-a").unwrap();
        let _ = q.take("team-a").unwrap_err();
        let _ = q.take_n("team-b", 2).unwrap_err();
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"rollouts_dispatch_over_budget_total{key="budgets.measurementCallsPerProject"} 2"#
            ),
            "{text}"
        );
        assert!(!text.contains("team-"), "no owner in a label: {text}");
    }
}
