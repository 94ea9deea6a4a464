//! Test support for the watches: a scripted [`Source`], in which each list and watch request
//! takes the next answer of its queue, and once a queue is empty the request never gets an
//! answer (what a stalled API server does) — watch events come after their scripted delays, so
//! tests run in paused time —, and [`Logs`], the lines a test's code logged.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectList, WatchEvent, WatchParams};
use kube::core::{ListMeta, Status, TypeMeta};
use serde::de::DeserializeOwned;
use tokio::time::Instant;

use super::{RawEvents, Source};

/// What a watch stream does, in order.
#[derive(Clone)]
pub(crate) enum Beat<K = ConfigMap> {
    /// an event, after a delay
    After(Duration, Box<WatchEvent<K>>),
    /// the server ends the watch
    End,
    /// nothing, ever again (the connection stays open)
    Hang,
}

enum Answer<K: Clone> {
    /// a list page after a delay; `None`: no answer ever
    List(Duration, Option<ObjectList<K>>),
    Watch(Result<Vec<Beat<K>>, u16>),
}

struct Inner<K: Clone> {
    lists: VecDeque<Answer<K>>,
    watches: VecDeque<Answer<K>>,
    /// (when, what): `list`, `watch <resourceVersion>`
    calls: Vec<(Instant, String)>,
}

/// The scripted API of objects `K` (ConfigMaps unless said otherwise); clones share the
/// script.
#[derive(Clone)]
pub(crate) struct Script<K: Clone = ConfigMap> {
    inner: Arc<Mutex<Inner<K>>>,
}

// By hand: derived, it would ask `K` to be `Default` too.
impl<K: Clone> Default for Script<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                lists: VecDeque::new(),
                watches: VecDeque::new(),
                calls: Vec::new(),
            })),
        }
    }
}

impl<K: Clone> Script<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next list answers `items` at `version`.
    pub(crate) fn list(&self, items: Vec<K>, version: &str) -> &Self {
        self.list_after(Duration::ZERO, items, version)
    }

    /// The next list gets no answer, ever.
    pub(crate) fn hang_list(&self) -> &Self {
        self.lock()
            .lists
            .push_back(Answer::List(Duration::ZERO, None));
        self
    }

    /// The next list answers `items` at `version` after `delay`.
    pub(crate) fn list_after(&self, delay: Duration, items: Vec<K>, version: &str) -> &Self {
        let list = ObjectList {
            // Nothing reads it: a list of any kind.
            types: TypeMeta {
                api_version: "v1".into(),
                kind: "List".into(),
            },
            metadata: ListMeta {
                resource_version: Some(version.into()),
                ..ListMeta::default()
            },
            items,
        };
        self.lock().lists.push_back(Answer::List(delay, Some(list)));
        self
    }

    /// The next watch request is answered with a stream that does `beats`.
    pub(crate) fn watch(&self, beats: Vec<Beat<K>>) -> &Self {
        self.lock().watches.push_back(Answer::Watch(Ok(beats)));
        self
    }

    /// The next watch request is refused with HTTP `code`.
    pub(crate) fn refuse_watch(&self, code: u16) -> &Self {
        self.lock().watches.push_back(Answer::Watch(Err(code)));
        self
    }

    /// Every request so far, with the time it came.
    pub(crate) fn calls(&self) -> Vec<(Instant, String)> {
        self.lock().calls.clone()
    }

    /// How many lists were asked for.
    pub(crate) fn lists(&self) -> usize {
        self.calls().iter().filter(|(_, c)| c == "list").count()
    }
}

/// A ConfigMap `name` in namespace `ns` at resourceVersion `version`, in group `group` (the
/// label `g`).
pub(crate) fn object(ns: &str, name: &str, version: &str, group: &str) -> ConfigMap {
    ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            resource_version: Some(version.into()),
            labels: Some([("g".to_string(), group.to_string())].into()),
            ..Default::default()
        },
        ..ConfigMap::default()
    }
}

/// `event` after `delay`.
pub(crate) fn after<K>(delay: Duration, event: WatchEvent<K>) -> Beat<K> {
    Beat::After(delay, Box::new(event))
}

/// An `ERROR` event with HTTP `code`.
pub(crate) fn error_event<K>(code: u16, message: &str) -> WatchEvent<K> {
    WatchEvent::Error(Status::failure(message, "Expired").with_code(code).boxed())
}

/// A `BOOKMARK` at `version`.
pub(crate) fn bookmark<K: DeserializeOwned>(version: &str) -> WatchEvent<K> {
    serde_json::from_value(serde_json::json!({
        "type": "BOOKMARK",
        "object": {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"resourceVersion": version}}
    }))
    .expect("a bookmark")
}

fn refused(code: u16) -> kube::Error {
    kube::Error::Api(
        Status::failure("scripted refusal", "Scripted")
            .with_code(code)
            .boxed(),
    )
}

impl<K: Clone + Send + 'static> Source<K> for Script<K> {
    fn list<'a>(&'a self, _params: &'a ListParams) -> BoxFuture<'a, kube::Result<ObjectList<K>>> {
        let next = {
            let mut inner = self.lock();
            inner.calls.push((Instant::now(), "list".into()));
            inner.lists.pop_front()
        };
        Box::pin(async move {
            match next {
                Some(Answer::List(delay, Some(list))) => {
                    tokio::time::sleep(delay).await;
                    Ok(list)
                }
                _ => futures::future::pending().await,
            }
        })
    }

    fn watch<'a>(
        &'a self,
        _params: &'a WatchParams,
        version: &'a str,
    ) -> BoxFuture<'a, kube::Result<RawEvents<K>>> {
        let next = {
            let mut inner = self.lock();
            inner
                .calls
                .push((Instant::now(), format!("watch {version}")));
            inner.watches.pop_front()
        };
        Box::pin(async move {
            let beats = match next {
                Some(Answer::Watch(Ok(beats))) => beats,
                Some(Answer::Watch(Err(code))) => return Err(refused(code)),
                _ => futures::future::pending().await,
            };
            let stream = futures::stream::unfold(beats.into_iter(), |mut beats| async move {
                match beats.next()? {
                    Beat::After(delay, event) => {
                        tokio::time::sleep(delay).await;
                        Some((Ok(*event), beats))
                    }
                    Beat::End => None,
                    Beat::Hang => futures::future::pending().await,
                }
            });
            Ok(stream.boxed())
        })
    }
}

/// The log lines written while the guard lives (this thread: the tests' runtime is
/// single-threaded).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }
}
