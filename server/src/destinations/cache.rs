//! A label-selected watch cache of one resource kind on one destination, with a secondary index.
//!
//! It is a reflector store (kube-runtime's `watcher` feeds it) that also indexes objects by a
//! group key — Jobs by run UID (for GC), Pods by their Job (for image-pull reasons and log
//! tails) — so that every lookup is a hash-map read. It tracks whether the first list finished
//! ([`Cache::is_ready`]) and whether the watch is failing ([`Cache::failing_for`]), so that the
//! engine knows when the cache is authoritative and when it must ask the API server instead.
//!
//! A cache is fed by one watch over every namespace, or — for a destination limited to
//! namespaces (`namespaces` of a config destination, the agent's `--namespaces`) — by one watch
//! per namespace, so that its credentials need no cluster-wide list or watch. Each watch relists
//! its own namespace only; the cache is ready when every watch has listed once, and a failing
//! watch of any namespace makes the whole cache non-authoritative.
//!
//! The watches are [`watch::watch`]es: a watch ended by `410 Gone` or stalled (open, silent past
//! [`watch::STALL`]) lists again, with one line of its own; from then until that relist ends,
//! the cache is not authoritative, so the engine reads the API server instead of what may be
//! stale (a Job that ended while its watch was stalled).

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::Api;
use kube::core::NamespaceResourceScope;
use kube::runtime::watcher::Event;
use kube::Resource;
use serde::de::DeserializeOwned;

use crate::watch::{self, Source, WatchError, Watched};

/// `(namespace, name)`
pub type Key = (String, String);

/// Computes the group key of an object (`None`: in no group).
pub type GroupFn<K> = fn(&K) -> Option<String>;

/// Called with the object before (`None`: new to the cache) and after each change the watch
/// delivers — live events and, after a reconnect, what its relist changed; not for the first
/// list (that is the state the cache starts from, not a change). Outside the cache's lock.
pub type ChangeHook<K> = Arc<dyn Fn(Option<&K>, &K) + Send + Sync>;

struct State<K> {
    objects: HashMap<Key, Arc<K>>,
    groups: HashMap<String, HashSet<Key>>,
    /// per watch: objects of a relist in progress; swapped in at its `InitDone`
    relists: Vec<Option<HashMap<Key, Arc<K>>>>,
    /// per watch: whether its first list finished
    listed: Vec<bool>,
}

/// A watch whose last error is older than this is considered healthy again: a failing watch
/// retries (and fails) at least every ~40 s (the backoff is capped at 37.5 s with its jitter,
/// plus the connect timeout), while a watch that recovered quietly emits no event until
/// something changes.
const FAILING_WINDOW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Health {
    failing_since: Option<Instant>,
    last_error_at: Option<Instant>,
    last_error: Option<String>,
    /// "watch failing" was logged for this streak (a 410 or a stall logs its own line)
    announced: bool,
    /// a 410 or a stall started a relist that has not ended: failing however long it takes
    relisting: bool,
}

/// The cache. Cheap to share (`Arc`); each watch task holds one reference.
pub struct Cache<K> {
    kind: &'static str,
    destination: String,
    /// what each watch covers: one namespace, or `None` for all of them
    scopes: Vec<Option<String>>,
    state: RwLock<State<K>>,
    /// per watch
    health: Mutex<Vec<Health>>,
    ready: tokio::sync::watch::Sender<bool>,
    group_of: GroupFn<K>,
    on_change: Option<ChangeHook<K>>,
}

impl<K> Debug for Cache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("kind", &self.kind)
            .field("destination", &self.destination)
            .field("ready", &*self.ready.borrow())
            .finish_non_exhaustive()
    }
}

impl<K> Cache<K>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static,
{
    /// An empty, not yet ready cache fed by one watch per namespace of `namespaces`, or by one
    /// watch over every namespace (`None`).
    pub fn new(
        kind: &'static str,
        destination: &str,
        group_of: GroupFn<K>,
        namespaces: Option<&[String]>,
    ) -> Self {
        let scopes: Vec<Option<String>> = match namespaces {
            None => vec![None],
            Some(list) => list.iter().map(|ns| Some(ns.clone())).collect(),
        };
        let watches = scopes.len();
        Self {
            kind,
            destination: destination.to_string(),
            scopes,
            state: RwLock::new(State {
                objects: HashMap::new(),
                groups: HashMap::new(),
                relists: (0..watches).map(|_| None).collect(),
                listed: vec![false; watches],
            }),
            health: Mutex::new((0..watches).map(|_| Health::default()).collect()),
            // No namespace to watch: nothing to wait for.
            ready: tokio::sync::watch::channel(watches == 0).0,
            group_of,
            on_change: None,
        }
    }

    /// The cache, calling `hook` on every change ([`ChangeHook`]).
    pub fn with_hook(mut self, hook: ChangeHook<K>) -> Self {
        self.on_change = Some(hook);
        self
    }

    /// Starts the watches (one per namespace, or one over all) with `selector`; the caller
    /// aborts the tasks to stop them.
    pub fn spawn(
        self: &Arc<Self>,
        client: &kube::Client,
        selector: &str,
    ) -> Vec<tokio::task::AbortHandle> {
        self.scopes
            .iter()
            .enumerate()
            .map(|(i, scope)| {
                let api: Api<K> = match scope {
                    Some(ns) => Api::namespaced(client.clone(), ns),
                    None => Api::all(client.clone()),
                };
                tokio::spawn(self.clone().run(i, api, selector.to_string())).abort_handle()
            })
            .collect()
    }

    /// Whether a Job or Pod in `namespace` would be seen by this cache.
    pub fn watches(&self, namespace: &str) -> bool {
        self.scopes
            .iter()
            .any(|s| s.as_deref().is_none_or(|ns| ns == namespace))
    }

    /// The object `namespace/name`, if cached.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state
            .objects
            .get(&(namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// Every cached object of `group`.
    pub fn group(&self, group: &str) -> Vec<Arc<K>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state
            .groups
            .get(group)
            .map(|keys| {
                keys.iter()
                    .filter_map(|k| state.objects.get(k).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many cached objects fall in each class of `classify` (for metrics).
    pub fn count_by(
        &self,
        classify: impl Fn(&K) -> &'static str,
    ) -> std::collections::BTreeMap<&'static str, usize> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        let mut counts = std::collections::BTreeMap::new();
        for o in state.objects.values() {
            *counts.entry(classify(o)).or_insert(0) += 1;
        }
        counts
    }

    /// Every cached object.
    pub fn all(&self) -> Vec<Arc<K>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state.objects.values().cloned().collect()
    }

    /// How many objects are cached.
    pub fn len(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .objects
            .len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the first list finished.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits up to `timeout` for the first list; returns whether it finished.
    pub async fn wait_ready(&self, timeout: Duration) -> bool {
        let mut rx = self.ready.subscribe();
        let ok = matches!(
            tokio::time::timeout(timeout, rx.wait_for(|r| *r)).await,
            Ok(Ok(_))
        );
        ok
    }

    /// How long a watch has been failing, and its last error (`None`: every watch healthy).
    /// With several watches, the one failing longest, its error prefixed with its namespace.
    pub fn failing_for(&self) -> Option<(Duration, String)> {
        let health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        health
            .iter()
            .zip(&self.scopes)
            .filter_map(|(h, scope)| match (h.failing_since, h.last_error_at) {
                (Some(since), Some(last)) if h.relisting || last.elapsed() < FAILING_WINDOW => {
                    let error = h.last_error.clone().unwrap_or_default();
                    Some((
                        since.elapsed(),
                        match scope {
                            Some(ns) => format!("namespace {ns}: {error}"),
                            None => error,
                        },
                    ))
                }
                _ => None,
            })
            .max_by_key(|(d, _)| *d)
    }

    /// Ready, and the watch is not failing: a miss means the object does not exist (or was
    /// created so recently that its event is still on the way).
    pub fn is_authoritative(&self) -> bool {
        self.is_ready() && self.failing_for().is_none()
    }

    /// Feeds the cache from watch `index` (label-selected) until the task is aborted.
    async fn run<S: Source<K>>(self: Arc<Self>, index: usize, source: S, selector: String) {
        let watched = Watched {
            destination: self.destination.clone(),
            resource: K::plural(&()).into_owned(),
            namespace: self.scopes.get(index).cloned().flatten(),
        };
        let mut stream = watch::watch(source, Some(&selector), watched);
        while let Some(item) = stream.next().await {
            match item {
                Ok(event) => {
                    // Healthy again once the watch delivers: not at the start of a relist,
                    // which after a 410 or a stall replaces what may be stale only at its end.
                    if matches!(event, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
                        self.recovered(index);
                    }
                    self.handle(index, event);
                }
                Err(e) => self.failed(index, &e),
            }
        }
    }

    fn namespace_of(&self, index: usize) -> &str {
        self.scopes
            .get(index)
            .and_then(|s| s.as_deref())
            .unwrap_or("*")
    }

    fn recovered(&self, index: usize) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let Some(h) = health.get_mut(index) else {
            return;
        };
        if let Some(since) = h.failing_since.take() {
            if std::mem::take(&mut h.announced) {
                tracing::info!(destination = %self.destination, kind = self.kind,
                               namespace = self.namespace_of(index),
                               failed_for = ?since.elapsed(), "watch recovered");
            }
        }
        h.last_error = None;
        h.last_error_at = None;
        h.relisting = false;
    }

    /// Marks watch `index` failing: the cache is not authoritative until it delivers again.
    fn failed(&self, index: usize, error: &WatchError) {
        let mut health = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let Some(h) = health.get_mut(index) else {
            return;
        };
        let stale = h
            .last_error_at
            .is_none_or(|t| t.elapsed() >= FAILING_WINDOW);
        if h.failing_since.is_none() || stale {
            h.failing_since = Some(Instant::now());
            h.announced = false;
        }
        // A 410 or a stall said so in its own line; anything else once per streak.
        if !h.announced && !error.relists() {
            tracing::warn!(destination = %self.destination, kind = self.kind,
                           namespace = self.namespace_of(index), %error,
                           "watch failing; retrying with backoff");
            h.announced = true;
        }
        h.relisting |= error.relists();
        h.last_error = Some(error.to_string());
        h.last_error_at = Some(Instant::now());
    }

    /// Applies one event of watch `index`.
    pub fn handle(&self, index: usize, event: Event<K>) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Apply(obj) => {
                if let Some(key) = key_of(&obj) {
                    let obj = Arc::new(slim(obj));
                    let old = state.objects.get(&key).cloned();
                    insert(&mut state, self.group_of, key, obj.clone());
                    drop(state);
                    if let Some(hook) = &self.on_change {
                        hook(old.as_deref(), &obj);
                    }
                }
            }
            Event::Delete(obj) => {
                if let Some(key) = key_of(&obj) {
                    remove(&mut state, self.group_of, &key);
                }
            }
            Event::Init => {
                if let Some(r) = state.relists.get_mut(index) {
                    *r = Some(HashMap::new());
                }
            }
            Event::InitApply(obj) => {
                let key = key_of(&obj);
                if let (Some(key), Some(Some(relist))) = (key, state.relists.get_mut(index)) {
                    relist.insert(key, Arc::new(slim(obj)));
                }
            }
            Event::InitDone => {
                let fresh = state
                    .relists
                    .get_mut(index)
                    .and_then(Option::take)
                    .unwrap_or_default();
                // What the relist changed, for the hook: not on the first list.
                let relisted = state.listed.get(index).copied().unwrap_or(false);
                let changes: Vec<(Option<Arc<K>>, Arc<K>)> = match &self.on_change {
                    Some(_) if relisted => fresh
                        .iter()
                        .map(|(key, obj)| (state.objects.get(key).cloned(), obj.clone()))
                        .collect(),
                    _ => Vec::new(),
                };
                // A relist replaces what this watch covers, and nothing the others cover.
                match self.scopes.get(index).and_then(|s| s.as_deref()) {
                    None => state.objects = fresh,
                    Some(ns) => {
                        state.objects.retain(|(o, _), _| o != ns);
                        state.objects.extend(fresh);
                    }
                }
                let mut groups: HashMap<String, HashSet<Key>> = HashMap::new();
                for (key, obj) in &state.objects {
                    if let Some(g) = (self.group_of)(obj) {
                        groups.entry(g).or_default().insert(key.clone());
                    }
                }
                state.groups = groups;
                if let Some(l) = state.listed.get_mut(index) {
                    *l = true;
                }
                let all_listed = state.listed.iter().all(|l| *l);
                drop(state);
                if all_listed {
                    self.ready.send_replace(true);
                }
                if let Some(hook) = &self.on_change {
                    for (old, new) in &changes {
                        hook(old.as_deref(), new);
                    }
                }
            }
        }
    }
}

fn key_of<K: Resource>(obj: &K) -> Option<Key> {
    let meta = obj.meta();
    Some((
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone()?,
    ))
}

/// Drops what the engine never reads, to keep 10 000s of objects small.
fn slim<K: Resource>(mut obj: K) -> K {
    obj.meta_mut().managed_fields = None;
    obj
}

fn insert<K>(state: &mut State<K>, group_of: GroupFn<K>, key: Key, obj: Arc<K>) {
    let group = group_of(&obj);
    if let Some(old) = state.objects.insert(key.clone(), obj) {
        let old_group = group_of(&old);
        if old_group != group {
            if let Some(g) = old_group {
                unlink(state, &g, &key);
            }
        }
    }
    if let Some(g) = group {
        state.groups.entry(g).or_default().insert(key);
    }
}

fn remove<K>(state: &mut State<K>, group_of: GroupFn<K>, key: &Key) {
    if let Some(old) = state.objects.remove(key) {
        if let Some(g) = group_of(&old) {
            unlink(state, &g, key);
        }
    }
}

fn unlink<K>(state: &mut State<K>, group: &str, key: &Key) {
    if let Some(set) = state.groups.get_mut(group) {
        set.remove(key);
        if set.is_empty() {
            state.groups.remove(group);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::script::{object, Beat, Logs, Script};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use kube::core::Status;
    use std::collections::BTreeMap;

    fn cm(ns: &str, name: &str, group: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                labels: Some(BTreeMap::from([("g".to_string(), group.to_string())])),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn group_of(c: &ConfigMap) -> Option<String> {
        c.metadata.labels.as_ref()?.get("g").cloned()
    }

    #[test]
    fn the_hook_sees_changes_and_relists_but_not_the_first_list() {
        type Seen = Vec<(Option<String>, String)>;
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let log = seen.clone();
        let hook: ChangeHook<ConfigMap> = Arc::new(move |old, new| {
            let g = |c: &ConfigMap| group_of(c).unwrap_or_default();
            log.lock().unwrap().push((old.map(g), g(new)));
        });
        let cache = Cache::new("ConfigMap", "d", group_of, None).with_hook(hook);
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("a", "x", "g1")));
        cache.handle(0, Event::InitDone);
        assert!(
            seen.lock().unwrap().is_empty(),
            "the first list is no change"
        );
        cache.handle(0, Event::Apply(cm("a", "x", "g2")));
        cache.handle(0, Event::Apply(cm("a", "y", "g1")));
        // A reconnect: the relist brings x as it is now.
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("a", "x", "g3")));
        cache.handle(0, Event::InitDone);
        assert_eq!(
            *seen.lock().unwrap(),
            vec![
                (Some("g1".to_string()), "g2".to_string()),
                (None, "g1".to_string()),
                (Some("g2".to_string()), "g3".to_string()),
            ]
        );
    }

    #[tokio::test]
    async fn events_maintain_objects_and_groups() {
        let cache = Cache::new("ConfigMap", "d", group_of, None);
        assert!(!cache.is_ready() && !cache.is_authoritative());
        assert!(!cache.wait_ready(Duration::from_millis(10)).await);
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("a", "x", "g1")));
        assert!(
            cache.get("a", "x").is_none(),
            "a relist is invisible until InitDone"
        );
        cache.handle(0, Event::InitDone);
        assert!(cache.wait_ready(Duration::from_millis(10)).await);
        assert!(cache.is_authoritative());
        assert_eq!(cache.group("g1").len(), 1);

        cache.handle(0, Event::Apply(cm("a", "y", "g1")));
        cache.handle(0, Event::Apply(cm("b", "x", "g2")));
        assert_eq!(cache.group("g1").len(), 2);
        // An object that changes group moves.
        cache.handle(0, Event::Apply(cm("a", "y", "g2")));
        assert_eq!(cache.group("g1").len(), 1);
        assert_eq!(cache.group("g2").len(), 2);
        cache.handle(0, Event::Delete(cm("a", "y", "g2")));
        assert_eq!(cache.group("g2").len(), 1);
        assert_eq!(cache.len(), 2);

        // A relist replaces everything at once.
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("c", "z", "g3")));
        assert_eq!(cache.len(), 2);
        cache.handle(0, Event::InitDone);
        assert_eq!(cache.len(), 1);
        assert!(cache.group("g1").is_empty() && cache.group("g3").len() == 1);
        assert!(cache.get("c", "z").is_some());
    }

    /// What a watch says when the API server ends it with `message`.
    fn ended(message: &str) -> WatchError {
        WatchError::Status(Status::failure(message, "Test").with_code(500).boxed())
    }

    #[test]
    fn health_tracks_failures() {
        let cache: Cache<ConfigMap> = Cache::new("ConfigMap", "d", group_of, None);
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitDone);
        assert!(cache.is_authoritative());
        cache.failed(0, &ended("connection refused"));
        let (_, e) = cache.failing_for().unwrap();
        assert_eq!(
            e,
            "the API server ended the watch: connection refused (500)"
        );
        assert!(!cache.is_authoritative());
        cache.recovered(0);
        assert!(cache.is_authoritative());
    }

    #[test]
    fn a_relist_after_a_410_or_a_stall_is_untrusted_until_it_ends() {
        let cache: Cache<ConfigMap> = Cache::new("ConfigMap", "d", group_of, None);
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitDone);
        let age = |cache: &Cache<ConfigMap>| {
            let mut health = cache.health.lock().unwrap();
            health[0].last_error_at = Some(Instant::now() - 2 * FAILING_WINDOW);
        };
        // Another error ages out: the watch is deemed to have recovered quietly.
        cache.failed(0, &ended("hiccup"));
        age(&cache);
        assert!(cache.is_authoritative());
        // A stall's relist (its list slow, or stalled too) does not.
        cache.recovered(0);
        let stall = WatchError::Stalled {
            step: watch::Step::Watch,
        };
        cache.failed(0, &stall);
        age(&cache);
        assert!(!cache.is_authoritative());
        cache.handle(0, Event::Init);
        assert!(!cache.is_authoritative());
        cache.recovered(0);
        cache.handle(0, Event::InitDone);
        assert!(cache.is_authoritative());
    }

    #[tokio::test]
    async fn one_watch_per_namespace_each_relisting_its_own() {
        let namespaces = ["a".to_string(), "b".to_string()];
        let cache = Cache::new("ConfigMap", "d", group_of, Some(&namespaces));
        assert!(cache.watches("a") && cache.watches("b") && !cache.watches("c"));
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("a", "x", "g1")));
        cache.handle(0, Event::InitDone);
        assert!(
            !cache.is_ready() && !cache.is_authoritative(),
            "ready only when every namespace's watch has listed"
        );
        assert!(cache.get("a", "x").is_some(), "what is listed is visible");
        cache.handle(1, Event::Init);
        cache.handle(1, Event::InitApply(cm("b", "y", "g1")));
        cache.handle(1, Event::InitDone);
        assert!(cache.wait_ready(Duration::from_millis(10)).await);
        assert_eq!(cache.group("g1").len(), 2);

        // A relist of namespace a replaces a's objects and keeps b's.
        cache.handle(0, Event::Init);
        cache.handle(0, Event::InitApply(cm("a", "z", "g2")));
        cache.handle(0, Event::InitDone);
        assert!(cache.get("a", "x").is_none() && cache.get("a", "z").is_some());
        assert!(cache.get("b", "y").is_some());
        assert_eq!(cache.group("g1").len(), 1);

        // One namespace's failing watch shows, named, and the other's recovery does not hide it.
        cache.failed(1, &ended("forbidden"));
        cache.recovered(0);
        let (_, e) = cache.failing_for().unwrap();
        assert_eq!(
            e,
            "namespace b: the API server ended the watch: forbidden (500)"
        );
        assert!(!cache.is_authoritative());
        cache.recovered(1);
        assert!(cache.is_authoritative());
    }

    #[test]
    fn the_cluster_wide_watch_sees_every_namespace() {
        let cache: Cache<ConfigMap> = Cache::new("ConfigMap", "d", group_of, None);
        assert!(cache.watches("anything"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_is_relisted_and_the_cache_not_trusted_meanwhile() {
        let (logs, _guard) = Logs::capture();
        let changed: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = changed.clone();
        let hook: ChangeHook<ConfigMap> = Arc::new(move |_, new| {
            seen.lock()
                .unwrap()
                .push(new.metadata.name.clone().unwrap_or_default());
        });
        let cache = Arc::new(Cache::new("ConfigMap", "edge", group_of, None).with_hook(hook));
        let script = Script::default();
        script
            .list(vec![object("a", "x", "1", "g1")], "1")
            .watch(vec![Beat::Hang])
            // The relist takes 10 s to answer.
            .list_after(
                Duration::from_secs(10),
                vec![object("a", "x", "4", "g2"), object("a", "y", "5", "g1")],
                "5",
            )
            .watch(vec![Beat::Hang]);
        let task = tokio::spawn(cache.clone().run(0, script.clone(), "app=x".into()));
        assert!(cache.wait_ready(Duration::from_secs(1)).await);
        assert!(cache.is_authoritative());

        // Within the bound, a silent watch is a quiet one.
        tokio::time::sleep(watch::STALL - Duration::from_secs(1)).await;
        assert!(cache.is_authoritative());
        assert_eq!(script.lists(), 1);

        // Past it, the watch is dropped; until the relist ends, the cache is not trusted.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(script.lists(), 2);
        assert!(!cache.is_authoritative());
        let (_, why) = cache.failing_for().expect("failing while it relists");
        assert!(why.starts_with("stalled: "), "{why}");
        assert!(cache.get("a", "y").is_none());

        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(cache.is_authoritative());
        assert!(cache.get("a", "y").is_some());
        assert_eq!(cache.group("g2").len(), 1);
        // The relist's changes reach the hook (the resume hints of Jobs that ended meanwhile).
        let mut changes = changed.lock().unwrap().clone();
        changes.sort();
        assert_eq!(changes, ["x", "y"]);
        task.abort();

        let lines = logs.lines();
        assert_eq!(lines.len(), 1, "the stall's line only: {lines:?}");
        assert!(lines[0].contains(watch::STALLED_LOG) && lines[0].contains("destination=edge"));
    }
}
