//! A stateful fake Kubernetes API server, served in-process on 127.0.0.1 over plain HTTP, so
//! that the engine runs with its real kube clients, watch caches and timeouts against it.
//!
//! It speaks the part of the API the engine uses — GET, LIST (with label selectors, full or as
//! `PartialObjectMetadataList`), WATCH (`?watch=true`, streamed from any resourceVersion), POST,
//! DELETE (UID precondition, foreground or background propagation), PATCH (JSON merge patch, with
//! a resourceVersion precondition) and `pods/log` — for any
//! resource, generically, over the [`store::Store`]. The test plays the Job controller and the
//! kubelet with [`FakeApi::put`] and [`FakeApi::update`], and scripts trouble with
//! [`FakeApi::fail`] (an error answer), [`FakeApi::hold_watches`] (events that arrive late) and
//! [`FakeApi::hold_deletions`] (a slow garbage collector). Every request is logged, so a test can
//! assert which calls the engine made ([`FakeApi::requests`]).

mod http;
pub(crate) mod store;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::sync::watch;

pub(crate) use store::Res;
use store::Store;

/// One request the fake received.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) query: String,
}

impl Request {
    /// A long-running watch (the caches' streams), as opposed to a one-off call.
    pub(crate) fn is_watch(&self) -> bool {
        self.query.split('&').any(|p| p == "watch=true")
    }
}

/// A scripted error answer: the next `times` requests with `method` whose `path?query`
/// contains every space-separated part of `target` get HTTP `code`.
#[derive(Debug, Clone)]
struct Fault {
    method: String,
    target: String,
    code: u16,
    times: usize,
    /// the `Status` message; `None`: a default one for the code
    message: Option<String>,
}

/// Everything behind the server, under one lock.
#[derive(Debug, Default)]
struct State {
    store: Store,
    requests: Vec<Request>,
    faults: Vec<Fault>,
    /// `pods/log` text per (namespace, pod, container)
    logs: BTreeMap<(String, String, String), String>,
    /// watches deliver nothing new while set
    hold_watches: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// bumped on every change a watch may care about (objects, holds)
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state, then wakes the watches.
    fn change<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let out = f(&mut self.lock());
        self.changed.send_modify(|v| *v += 1);
        out
    }
}

/// A running fake API server; dropping it stops accepting connections.
#[derive(Debug)]
pub(crate) struct FakeApi {
    shared: Arc<Shared>,
    url: String,
    server: tokio::task::AbortHandle,
}

impl Drop for FakeApi {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl FakeApi {
    /// Serves a fresh, empty API on an ephemeral port of 127.0.0.1.
    pub(crate) async fn start() -> Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake API server")?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changed: watch::channel(0).0,
        });
        let app = http::router(shared.clone());
        let server = tokio::spawn(async move {
            // Ends only when the test's runtime goes away.
            let _ = axum::serve(listener, app).await;
        })
        .abort_handle();
        Ok(Self {
            shared,
            url: format!("http://{addr}"),
            server,
        })
    }

    /// `http://127.0.0.1:PORT`
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Creates or replaces an object as a controller would; returns it as stored.
    pub(crate) fn put(&self, res: &Res, object: Value) -> Value {
        self.shared.change(|s| s.store.put(res, object))
    }

    /// Changes an existing object (a status written by a controller, a kubelet's report).
    pub(crate) fn update(
        &self,
        res: &Res,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        self.shared
            .change(|s| s.store.update(res, namespace, name, change))
    }

    /// Deletes an object at once, with its dependents (a person with `kubectl delete`).
    pub(crate) fn remove(&self, res: &Res, namespace: &str, name: &str) -> Option<Value> {
        self.shared.change(|s| s.store.remove(res, namespace, name))
    }

    /// The object, if it exists.
    pub(crate) fn get(&self, res: &Res, namespace: &str, name: &str) -> Option<Value> {
        self.shared.lock().store.get(res, namespace, name).cloned()
    }

    /// Every object of `res`, in every namespace.
    pub(crate) fn list(&self, res: &Res) -> Vec<Value> {
        let filter = store::Filter {
            res: res.clone(),
            namespace: None,
            labels: Vec::new(),
        };
        self.shared.lock().store.list(&filter)
    }

    /// What `pods/log` answers for a container.
    pub(crate) fn set_log(&self, namespace: &str, pod: &str, container: &str, text: &str) {
        self.shared.lock().logs.insert(
            (namespace.into(), pod.into(), container.into()),
            text.into(),
        );
    }

    /// The next `times` requests with `method` whose `path?query` contains every
    /// space-separated part of `target` are answered with HTTP `code` and a `Status`.
    pub(crate) fn fail(&self, method: &str, target: &str, code: u16, times: usize) {
        self.shared.lock().faults.push(Fault {
            method: method.into(),
            target: target.into(),
            code,
            times,
            message: None,
        });
    }

    /// [`FakeApi::fail`] with the `Status` message `message` (what an admission policy, a
    /// quota or validation would say).
    pub(crate) fn refuse_with(&self, method: &str, target: &str, code: u16, message: &str) {
        self.shared.lock().faults.push(Fault {
            method: method.into(),
            target: target.into(),
            code,
            times: 1,
            message: Some(message.into()),
        });
    }

    /// While `hold`, watches deliver no new event (they catch up when released): the window in
    /// which an object exists but the engine's caches have not seen it yet.
    pub(crate) fn hold_watches(&self, hold: bool) {
        self.shared.change(|s| s.hold_watches = hold);
    }

    /// While `hold`, foreground deletions stop after setting `deletionTimestamp`; releasing
    /// completes them.
    pub(crate) fn hold_deletions(&self, hold: bool) {
        self.shared.change(|s| {
            s.store.hold_deletions = hold;
            if !hold {
                s.store.finish_deletions();
            }
        });
    }

    /// Every request so far, in arrival order.
    pub(crate) fn requests(&self) -> Vec<Request> {
        self.shared.lock().requests.clone()
    }

    /// The one-off calls (not watches) so far whose method is `method` and whose path
    /// contains `path`.
    pub(crate) fn calls(&self, method: &str, path: &str) -> usize {
        self.requests()
            .iter()
            .filter(|r| r.method == method && r.path.contains(path) && !r.is_watch())
            .count()
    }
}
