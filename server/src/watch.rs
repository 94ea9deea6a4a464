//! The list-then-watch behind every watch of the server — the Job and Pod caches of each
//! destination (`destinations::cache`), the Argo CD cluster Secrets, the log board, the
//! AnalysisRuns of the control plane (`runs`) and the DispatchJob records (`store::kubernetes`)
//! —, built to survive the two faults of issue #32. A leaf of the module graph
//! (`docs/architecture.md` §3): it imports no other module of the crate, so that every module
//! may use it, `runs` included.
//!
//! **A watch ended by `410 Gone`** (an etcd compaction, or an API server whose watch cache
//! starts after our resourceVersion; the API server sends it as an `ERROR` event in the stream:
//! k8s.io/apiserver v0.37.2 `storage/cacher/cacher.go:635-640`, `watch_cache_history.go:236-237`,
//! `storage/etcd3/errors.go:31-34`): it lists again from scratch, after a backoff, with one
//! line ([`EXPIRED_LOG`]). kube-runtime 5.0.0's `watcher` relists on an `ERROR` 410 too
//! (`watcher.rs:729-733`) but logs it at debug only, and a 410 answered to the watch request
//! itself keeps it retrying the same resourceVersion for ever (`watcher.rs:693-696`); here both
//! relist.
//!
//! **A watch that stalls** (the connection stays open and no byte ever comes again): every call
//! and every wait for the next event is bounded by [`STALL`]; past it the connection is dropped,
//! and the watch lists again, with one warning ([`STALLED_LOG`]). Only a watch that sees the
//! API server's BOOKMARKs can tell a quiet watch from a dead one, and kube-runtime's swallows
//! them (`watcher.rs:725-728`): its only guard is its idle timeout of `timeoutSeconds` + 5 s,
//! 295 s by default and silent (`watcher.rs:516-548`), and a list or a watch request whose
//! answer never comes waits for ever (the client has no read timeout, `client.rs`). So this
//! module reads the watch itself.
//!
//! Retries back off exponentially (0.8 s to 30 s, jittered, like kube-runtime's default) and
//! the backoff starts over only when a watch delivers something: a relist that is answered
//! and a watch that ends in `410` at once, again and again, slow down instead of looping.
//!
//! What a consumer must do: from an error that [relists](WatchError::relists) until the relist's
//! `InitDone`, what it holds may be stale (an object changed or created while the watch was
//! silent), so it must not answer from it as if it were complete — the caches, the runs and
//! the store each call themselves not authoritative meanwhile.

use std::collections::VecDeque;
use std::fmt::Debug;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::StreamExt;
use kube::api::{Api, ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::Status;
use kube::runtime::watcher::Event;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

/// The longest a watch may stay silent — no event, no BOOKMARK, no answer to a list or watch
/// request — before it counts as stalled. Above the API server's BOOKMARK period (every minute,
/// k8s.io/apiserver `storage/cacher/cacher.go:76-78`, `cache_watcher.go:233-268`) and above
/// [`WATCH_TIMEOUT_SECS`], after which it ends a healthy watch even where it sends no BOOKMARK
/// (a resource served without the watch cache), so a healthy watch never reaches it.
pub const STALL: Duration = Duration::from_secs(180);

/// `timeoutSeconds` of each watch request: the API server ends the watch then
/// (`endpoints/handlers/get.go:273-275`) and it is opened again from the last resourceVersion.
/// Below [`STALL`] with room for the close to arrive (kube's default, 290 s, is above it).
pub const WATCH_TIMEOUT_SECS: u32 = 150;

/// Objects per list page (client-go's and kube-runtime's default).
const PAGE_SIZE: u32 = 500;

/// The message of the line logged when a watch is expired (410) and lists again.
pub const EXPIRED_LOG: &str = "watch expired (410 Gone); relisting";
/// The message of the line logged when a watch stalled and is dropped.
pub const STALLED_LOG: &str = "watch stalled; dropping it and relisting";

/// What a watch is of, for its log lines.
#[derive(Debug, Clone)]
pub struct Watched {
    /// the destination; for the server's own watches, their cluster: `control-plane` (the
    /// AnalysisRuns, the DispatchJob records), `store` (the log board), `argocd:<instance>`
    /// (its cluster Secrets)
    pub destination: String,
    /// the resource (plural): `jobs`, `pods`, `secrets`, ...
    pub resource: String,
    /// the one namespace watched (`None`: all)
    pub namespace: Option<String>,
}

impl Watched {
    fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("*")
    }
}

/// The call a watch was in when it failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// listing (a page of) the objects
    List,
    /// asking to watch
    WatchRequest,
    /// waiting for the next event
    Watch,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::List => "list",
            Step::WatchRequest => "watch request",
            Step::Watch => "watch",
        })
    }
}

/// Why a watch yielded no event; it goes on by itself after a backoff.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// The list failed.
    #[error("list failed: {0}")]
    List(#[source] kube::Error),
    /// The watch request failed.
    #[error("watch request failed: {0}")]
    Start(#[source] kube::Error),
    /// The watch stream broke.
    #[error("watch stream failed: {0}")]
    Stream(#[source] kube::Error),
    /// The API server ended the watch with an error other than 410.
    #[error("the API server ended the watch: {} ({})", .0.message, .0.code)]
    Status(Box<Status>),
    /// 410 Gone: the resourceVersion is no longer available; the watch lists again.
    #[error("resourceVersion expired (410 Gone) during the {step}: {message}; relisting")]
    Expired {
        /// where
        step: Step,
        /// the API server's message
        message: String,
    },
    /// Nothing came for [`STALL`]; the connection was dropped and the watch lists again.
    #[error(
        "stalled: nothing from the API server for {}s during the {step}; relisting",
        STALL.as_secs()
    )]
    Stalled {
        /// where
        step: Step,
    },
    /// A list or an object without a resourceVersion; the watch lists again.
    #[error("no resourceVersion in the answer (does the resource support watch?)")]
    NoResourceVersion,
}

impl WatchError {
    /// Whether the watch starts over with a list, and the line saying so was logged (a 410, a
    /// stall): the caller need not log it again.
    pub fn relists(&self) -> bool {
        matches!(
            self,
            WatchError::Expired { .. } | WatchError::Stalled { .. }
        )
    }
}

/// The raw events of one watch request.
pub type RawEvents<K> = BoxStream<'static, kube::Result<WatchEvent<K>>>;

/// Where a watch lists and watches: an [`Api`], or a scripted one in tests.
pub trait Source<K: Clone>: Send + Sync + 'static {
    /// One page of the list.
    fn list<'a>(&'a self, params: &'a ListParams) -> BoxFuture<'a, kube::Result<ObjectList<K>>>;
    /// A watch from `version`.
    fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<RawEvents<K>>>;
}

impl<K> Source<K> for Api<K>
where
    K: Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn list<'a>(&'a self, params: &'a ListParams) -> BoxFuture<'a, kube::Result<ObjectList<K>>> {
        Box::pin(Api::list(self, params))
    }

    fn watch<'a>(
        &'a self,
        params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<RawEvents<K>>> {
        Box::pin(async move { Ok(Api::watch(self, params, version).await?.boxed()) })
    }
}

/// The events of `source` (label-selected by `labels`) as kube-runtime's `watcher` delivers
/// them (`Init`, `InitApply`…, `InitDone` for each list, then `Apply`/`Delete`), for ever: an
/// error is yielded, then the watch goes on after a backoff. Poll it from one task.
pub fn watch<K, S>(
    source: S,
    labels: Option<&str>,
    watched: Watched,
) -> BoxStream<'static, Result<Event<K>, WatchError>>
where
    K: Resource + Clone + Send + 'static,
    S: Source<K>,
{
    let mut list = ListParams::default().limit(PAGE_SIZE);
    // BOOKMARKs are requested (`allowWatchBookmarks`, on by default): they are what shows a
    // quiet watch alive, and they keep its resourceVersion recent, so fewer 410s.
    let mut watch = WatchParams::default().timeout(WATCH_TIMEOUT_SECS);
    if let Some(labels) = labels {
        list = list.labels(labels);
        watch = watch.labels(labels);
    }
    let walker = Walker {
        source,
        list,
        watch,
        watched,
        phase: Phase::Relist,
        backoff: Backoff::default(),
        resume_at: None,
    };
    futures::stream::unfold(walker, |mut w| async move {
        let item = w.step().await;
        Some((item, w))
    })
    .boxed()
}

enum Phase<K> {
    /// to list from scratch: the first list, after a 410 or a stall
    Relist,
    /// a list under way: the objects of the page not yet yielded, the next page's token
    Listing {
        page: VecDeque<K>,
        continue_token: Option<String>,
        version: Option<String>,
    },
    /// to watch from `version`
    Watch { version: String },
    /// watching; `delivered`: the stream brought an event or a BOOKMARK
    Watching {
        version: String,
        stream: RawEvents<K>,
        delivered: bool,
    },
}

struct Walker<K, S> {
    source: S,
    list: ListParams,
    watch: WatchParams,
    watched: Watched,
    phase: Phase<K>,
    backoff: Backoff,
    /// when to go on after an error
    resume_at: Option<Instant>,
}

impl<K, S> Walker<K, S>
where
    K: Resource + Clone + Send + 'static,
    S: Source<K>,
{
    /// The next event, or the next error.
    async fn step(&mut self) -> Result<Event<K>, WatchError> {
        loop {
            if let Some(at) = self.resume_at.take() {
                tokio::time::sleep_until(at).await;
            }
            match std::mem::replace(&mut self.phase, Phase::Relist) {
                Phase::Relist => {
                    let page = self.list_page(None).await?;
                    self.phase = page;
                    return Ok(Event::Init);
                }
                Phase::Listing {
                    mut page,
                    continue_token,
                    version,
                } => {
                    if let Some(obj) = page.pop_front() {
                        self.phase = Phase::Listing {
                            page,
                            continue_token,
                            version,
                        };
                        return Ok(Event::InitApply(obj));
                    }
                    match (continue_token, version) {
                        (Some(token), _) => self.phase = self.list_page(Some(token)).await?,
                        (None, Some(version)) => {
                            self.phase = Phase::Watch { version };
                            return Ok(Event::InitDone);
                        }
                        (None, None) => {
                            return self.fail(Phase::Relist, WatchError::NoResourceVersion)
                        }
                    }
                }
                Phase::Watch { version } => {
                    let call = self.source.watch(&self.watch, &version);
                    match tokio::time::timeout(STALL, call).await {
                        Ok(Ok(stream)) => {
                            self.phase = Phase::Watching {
                                version,
                                stream,
                                delivered: false,
                            }
                        }
                        Ok(Err(kube::Error::Api(s))) if s.code == 410 => {
                            return self.expired(Step::WatchRequest, s.message)
                        }
                        Ok(Err(e)) => {
                            return self.fail(Phase::Watch { version }, WatchError::Start(e))
                        }
                        Err(_) => return self.stalled(Step::WatchRequest),
                    }
                }
                Phase::Watching {
                    version,
                    mut stream,
                    delivered,
                } => {
                    let next = match tokio::time::timeout(STALL, stream.next()).await {
                        Ok(next) => next,
                        // Dropping the stream closes its connection.
                        Err(_) => return self.stalled(Step::Watch),
                    };
                    let event = match next {
                        // Ended: `timeoutSeconds`, or the server went away. A watch that ends
                        // without bringing anything, again and again, backs off.
                        None => {
                            if !delivered {
                                self.resume_at = Some(Instant::now() + self.backoff.next_delay());
                            }
                            self.phase = Phase::Watch { version };
                            continue;
                        }
                        Some(Err(e)) => {
                            return self.fail(Phase::Watch { version }, WatchError::Stream(e))
                        }
                        Some(Ok(event)) => event,
                    };
                    match event {
                        WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                            return self.delivered(stream, obj, Event::Apply)
                        }
                        WatchEvent::Deleted(obj) => {
                            return self.delivered(stream, obj, Event::Delete)
                        }
                        WatchEvent::Bookmark(bookmark) => {
                            self.backoff.reset();
                            self.phase = Phase::Watching {
                                version: bookmark.metadata.resource_version,
                                stream,
                                delivered: true,
                            };
                        }
                        WatchEvent::Error(s) if s.code == 410 => {
                            return self.expired(Step::Watch, s.message)
                        }
                        // The server ends the watch after an error: watch again from `version`.
                        WatchEvent::Error(s) => {
                            return self.fail(Phase::Watch { version }, WatchError::Status(s))
                        }
                    }
                }
            }
        }
    }

    /// A page of the list (the first with `None`); a 410 (an expired continue token) relists.
    async fn list_page(&mut self, token: Option<String>) -> Result<Phase<K>, WatchError> {
        let mut params = self.list.clone();
        params.continue_token = token;
        match tokio::time::timeout(STALL, self.source.list(&params)).await {
            Ok(Ok(list)) => {
                let version = list.metadata.resource_version.filter(|v| !v.is_empty());
                let continue_token = list.metadata.continue_.filter(|t| !t.is_empty());
                Ok(Phase::Listing {
                    page: list.items.into(),
                    continue_token,
                    version,
                })
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 410 => self.expired(Step::List, s.message),
            Ok(Err(e)) => self.fail(Phase::Relist, WatchError::List(e)),
            Err(_) => self.stalled(Step::List),
        }
    }

    /// An object event: the watch is alive, its resourceVersion moves on.
    fn delivered(
        &mut self,
        stream: RawEvents<K>,
        obj: K,
        event: fn(K) -> Event<K>,
    ) -> Result<Event<K>, WatchError> {
        let Some(version) = obj.resource_version().filter(|v| !v.is_empty()) else {
            return self.fail(Phase::Relist, WatchError::NoResourceVersion);
        };
        self.backoff.reset();
        self.phase = Phase::Watching {
            version,
            stream,
            delivered: true,
        };
        Ok(event(obj))
    }

    fn expired<T>(&mut self, step: Step, message: String) -> Result<T, WatchError> {
        let w = &self.watched;
        tracing::info!(destination = %w.destination, resource = %w.resource,
                       namespace = %w.namespace(), %step, reason = %message, "{EXPIRED_LOG}");
        self.fail(Phase::Relist, WatchError::Expired { step, message })
    }

    fn stalled<T>(&mut self, step: Step) -> Result<T, WatchError> {
        let w = &self.watched;
        tracing::warn!(destination = %w.destination, resource = %w.resource,
                       namespace = %w.namespace(), %step, silent_for = ?STALL, "{STALLED_LOG}");
        self.fail(Phase::Relist, WatchError::Stalled { step })
    }

    /// Goes on with `next` after a backoff.
    fn fail<T>(&mut self, next: Phase<K>, error: WatchError) -> Result<T, WatchError> {
        self.phase = next;
        self.resume_at = Some(Instant::now() + self.backoff.next_delay());
        Err(error)
    }
}

/// Exponential backoff, jittered: 0.8 s doubling up to 30 s (kube-runtime's `DefaultBackoff`,
/// after client-go's reflector); it starts over when reset, or two minutes after its last use.
#[derive(Debug, Default)]
struct Backoff {
    /// the retries since the last reset
    tries: u32,
    last: Option<Instant>,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(800);
    const MAX: Duration = Duration::from_secs(30);
    const RESET_AFTER: Duration = Duration::from_secs(120);

    fn next_delay(&mut self) -> Duration {
        let now = Instant::now();
        if self.last.is_some_and(|t| now - t >= Self::RESET_AFTER) {
            self.tries = 0;
        }
        self.last = Some(now);
        let base = Self::FIRST
            .saturating_mul(1 << self.tries.min(6))
            .min(Self::MAX);
        self.tries = self.tries.saturating_add(1);
        // Many watches fail together (an API server restarts): spread them over ±25 %.
        let spread =
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), now)
                % 500;
        base.mul_f64(0.75 + spread as f64 / 1000.0)
    }

    fn reset(&mut self) {
        self.tries = 0;
    }
}

#[cfg(test)]
pub(crate) mod script;

#[cfg(test)]
mod tests;
