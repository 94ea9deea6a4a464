//! Resume hints: which measurements may have a verdict now, so that the plugin can have Argo
//! Rollouts resume them at once instead of at their `resumeAt` (issue #30).
//!
//! A hint is emitted when one of our Jobs gets its final condition in a destination's watch
//! cache (`destinations`), when one of its pods starts waiting for a reason that decides the
//! verdict at once (an image that cannot be pulled or named, a crash loop: `verdict::waiting`),
//! and when an agent's record gets a final state in the store (`store::Index`), on every replica
//! that sees it. The plugin reads them from
//! `GET /v1/measurements/hints` (`measure::routes`), a long poll over this buffer.
//!
//! A hint is only a nudge, never a verdict: the plugin still asks `status` with its own token and
//! gets the verdict the usual way, and a hint about a measurement it does not have in flight is
//! dropped. That is why a hint may come from what a destination's Job says (its labels and
//! annotations, which whoever can edit Jobs there can change): a forged one costs one more
//! status call, nothing else. It carries no secret: the run's namespace and UID and the Job name.
//!
//! The buffer keeps the last [`CAPACITY`] hints, numbered from 1 in this process; a reader names
//! the last number it has and this process's `epoch` (random at start), and is told to `reset`
//! when either no longer fits (a restart, or hints it missed): then it falls back on its own
//! safety interval for what it has in flight.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::v1::{HintPage, ResumeHint};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::job::{run_uid_of, ANN_RUN_NAMESPACE};
use crate::verdict::{CRASH_LOOP, IMAGE_PULL_REASONS, INVALID_IMAGE};

/// How many hints the buffer keeps (a reader further behind is told to `reset`).
pub const CAPACITY: usize = 8192;

/// The hints of this process; cheap to clone.
#[derive(Clone)]
pub struct Hints {
    inner: Arc<Inner>,
}

struct Inner {
    epoch: String,
    buffer: Mutex<Buffer>,
    /// the number of the newest hint
    newest: watch::Sender<u64>,
}

#[derive(Default)]
struct Buffer {
    /// (number, hint), oldest first
    hints: VecDeque<(u64, ResumeHint)>,
}

impl std::fmt::Debug for Hints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hints")
            .field("epoch", &self.inner.epoch)
            .field("newest", &*self.inner.newest.borrow())
            .finish()
    }
}

impl Default for Hints {
    fn default() -> Self {
        Self::new()
    }
}

impl Hints {
    /// An empty buffer with a new epoch.
    pub fn new() -> Self {
        // Random, so that a restarted process never continues an old numbering; the clock
        // stands in if the system's random source fails.
        let mut bytes = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            .to_be_bytes();
        let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
        let epoch = bytes.iter().map(|b| format!("{b:02x}")).collect();
        Self {
            inner: Arc::new(Inner {
                epoch,
                buffer: Mutex::new(Buffer::default()),
                newest: watch::channel(0).0,
            }),
        }
    }

    /// This process's epoch: hint numbers mean nothing across two of them.
    pub fn epoch(&self) -> &str {
        &self.inner.epoch
    }

    /// Adds `hint` and wakes the readers.
    pub fn emit(&self, hint: ResumeHint) {
        let mut buffer = self.lock();
        let number = *self.inner.newest.borrow() + 1;
        tracing::debug!(number, namespace = %hint.namespace, run_uid = %hint.run_uid, job = %hint.job,
                        "resume hint");
        buffer.hints.push_back((number, hint));
        while buffer.hints.len() > CAPACITY {
            buffer.hints.pop_front();
        }
        // Under the buffer's lock, so that numbers and order agree.
        self.inner.newest.send_replace(number);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.inner.buffer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hints after number `after` of epoch `epoch` that `visible` lets through, waiting up
    /// to `wait` for one when there is none yet. `after` of another epoch, or older than the
    /// buffer holds, is a `reset` page that starts at the newest hint; `after: None` too (a
    /// reader's first call: it has missed nothing it knows of).
    pub async fn after(
        &self,
        epoch: Option<&str>,
        after: Option<u64>,
        wait: Duration,
        visible: impl Fn(&ResumeHint) -> bool,
    ) -> HintPage {
        let mut newest = self.inner.newest.subscribe();
        let current = *newest.borrow_and_update();
        let from = match (epoch, after) {
            (Some(e), Some(n)) if e == self.inner.epoch && n <= current => n,
            _ => return self.page(current, Vec::new(), true),
        };
        if from < current.saturating_sub(CAPACITY as u64) {
            return self.page(current, Vec::new(), true);
        }
        let deadline = tokio::time::Instant::now() + wait;
        let mut cursor = from;
        loop {
            let (hints, last) = self.collect(cursor, &visible);
            if !hints.is_empty() {
                return self.page(last, hints, false);
            }
            // Nothing visible up to `last`: move on, so that other projects' hints are not read
            // again on every wake.
            cursor = last;
            let woke = tokio::time::timeout_at(deadline, newest.changed()).await;
            if !matches!(woke, Ok(Ok(()))) {
                return self.page(cursor, Vec::new(), false);
            }
        }
    }

    /// The visible hints numbered after `after`, and the newest number looked at.
    fn collect(
        &self,
        after: u64,
        visible: &impl Fn(&ResumeHint) -> bool,
    ) -> (Vec<ResumeHint>, u64) {
        let buffer = self.lock();
        let last = buffer.hints.back().map_or(after, |(n, _)| *n).max(after);
        let hints = buffer
            .hints
            .iter()
            .filter(|(n, h)| *n > after && visible(h))
            .map(|(_, h)| h.clone())
            .collect();
        (hints, last)
    }

    fn page(&self, cursor: u64, hints: Vec<ResumeHint>, reset: bool) -> HintPage {
        HintPage {
            epoch: self.inner.epoch.clone(),
            cursor,
            hints,
            reset,
        }
    }
}

/// The hint of one of our Jobs that has just finished: it has its final condition now
/// ([`is_finished`]) and had none before (`old`: `None` when new to the cache). `None` for any
/// other change, and for a Job without the run's namespace (annotation [`ANN_RUN_NAMESPACE`])
/// and uid ([`run_uid_of`]). What a Job says is trusted for nothing else: see the module docs.
pub fn of_finished_job(old: Option<&Job>, new: &Job) -> Option<ResumeHint> {
    if !is_finished(new) || old.is_some_and(is_finished) {
        return None;
    }
    of_job(new)
}

/// The hint of the Job of `new`, a pod of ours that has just started waiting for a reason that
/// decides the verdict at once ([`decides_at_once`]; it did not before), found by `job_of`
/// (namespace, Job name) among the cached Jobs. `None` otherwise.
pub fn of_waiting_pod(
    old: Option<&Pod>,
    new: &Pod,
    job_of: impl Fn(&str, &str) -> Option<std::sync::Arc<Job>>,
) -> Option<ResumeHint> {
    if !decides_at_once(new) || old.is_some_and(decides_at_once) {
        return None;
    }
    let owner = crate::job::controlling_job(new)?;
    let job = job_of(new.metadata.namespace.as_deref()?, owner)?;
    of_job(&job)
}

/// Whether a container of `pod` waits for a reason that decides its Job's verdict at once,
/// without a grace: an image that cannot be pulled or does not parse, a crash loop.
pub fn decides_at_once(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    let containers = status.init_container_statuses.iter().flatten();
    containers
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
        .any(|r| IMAGE_PULL_REASONS.contains(&r) || r == INVALID_IMAGE || r == CRASH_LOOP)
}

fn of_job(new: &Job) -> Option<ResumeHint> {
    let meta = &new.metadata;
    let (_, run_uid) = run_uid_of(meta.labels.as_ref()?)?;
    let namespace = meta.annotations.as_ref()?.get(ANN_RUN_NAMESPACE)?;
    Some(ResumeHint {
        namespace: namespace.clone(),
        run_uid: run_uid.to_string(),
        job: meta.name.clone()?,
    })
}

/// Whether `job` has its final condition (`Complete` or `Failed`, status `True`).
pub fn is_finished(job: &Job) -> bool {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .any(|c| c.status == "True" && matches!(c.type_.as_str(), "Complete" | "Failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(ns: &str, job: &str) -> ResumeHint {
        ResumeHint {
            namespace: ns.into(),
            run_uid: format!("uid-{job}"),
            job: job.into(),
        }
    }

    const NOW: Duration = Duration::ZERO;

    #[tokio::test]
    async fn a_first_call_resets_at_the_newest_and_later_calls_get_what_came_after() {
        let h = Hints::new();
        h.emit(hint("a", "j1"));
        let first = h.after(None, None, NOW, |_| true).await;
        assert!(first.reset && first.hints.is_empty() && first.cursor == 1);
        h.emit(hint("a", "j2"));
        h.emit(hint("b", "j3"));
        let next = h
            .after(Some(&first.epoch), Some(first.cursor), NOW, |_| true)
            .await;
        assert!(!next.reset);
        assert_eq!(
            next.hints
                .iter()
                .map(|h| h.job.as_str())
                .collect::<Vec<_>>(),
            ["j2", "j3"]
        );
        assert_eq!(next.cursor, 3);
    }

    #[tokio::test]
    async fn another_epoch_or_a_reader_too_far_behind_is_told_to_reset() {
        let h = Hints::new();
        h.emit(hint("a", "j1"));
        let other = h.after(Some("0000"), Some(1), NOW, |_| true).await;
        assert!(other.reset);
        let ahead = h.after(Some(h.epoch()), Some(5), NOW, |_| true).await;
        assert!(ahead.reset, "a number this process never gave");
        for i in 0..CAPACITY + 10 {
            h.emit(hint("a", &format!("j{i}")));
        }
        let behind = h.after(Some(h.epoch()), Some(1), NOW, |_| true).await;
        assert!(behind.reset && behind.hints.is_empty());
    }

    #[tokio::test]
    async fn a_reader_sees_only_what_it_may_and_waits_for_a_hint() {
        let h = Hints::new();
        let epoch = h.epoch().to_string();
        let reader = {
            let h = h.clone();
            let epoch = epoch.clone();
            tokio::spawn(async move {
                h.after(Some(&epoch), Some(0), Duration::from_secs(10), |x| {
                    x.namespace == "mine"
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        h.emit(hint("theirs", "j1"));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!reader.is_finished(), "another project's hint wakes nobody");
        h.emit(hint("mine", "j2"));
        let page = reader.await.expect("reader");
        assert_eq!(page.hints, vec![hint("mine", "j2")]);
        assert_eq!(page.cursor, 2);
        // Nothing new: an empty page at the same cursor once the wait is over.
        let empty = h
            .after(Some(&epoch), Some(2), Duration::from_millis(20), |_| true)
            .await;
        assert!(!empty.reset && empty.hints.is_empty() && empty.cursor == 2);
    }
}
