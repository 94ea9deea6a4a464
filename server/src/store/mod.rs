//! The work of agent destinations: one [`DispatchJob`] record per Job an agent must run.
//!
//! A direct destination's Job *is* its state. An agent destination cannot be reached, so the
//! server writes a record instead (spec: the Job to create, or a request to delete it) and the
//! agent writes the record's status (the [`DestState`] it observed in its cluster). Two
//! backends behind one [`Store`], an enum of them (`docs/architecture.md`):
//!
//! * [`memory::MemoryStore`]: the embedded default for one replica (laptop, tests);
//! * [`kubernetes::KubeStore`]: `DispatchJob` resources (`rollouts-dispatch.io/v1alpha1`) in the
//!   server's namespace, read through one informer, so that any replica serves any agent and a
//!   restarted replica loses nothing.
//!
//! Beside the Kubernetes backend's records, in its namespace ([`SharedSite`]), the log feature
//! publishes the log requests of every replica (`logs::board`: one short-lived
//! `DispatchLogRequest` each), so that any replica's long poll hands them out.
//!
//! Reads are synchronous hash-map lookups on the [`Index`] both backends keep; writes are async.
//! Every change wakes the long polls of the destination it belongs to, and only those.

pub mod kubernetes;
pub mod memory;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::hints::Hints;
use crate::verdict::DestState;
use dispatch_api::observe::ApplicationState;
use dispatch_api::v1::ResumeHint;

/// API group of the `DispatchJob` resource.
pub const GROUP: &str = "rollouts-dispatch.io";
/// API version of the `DispatchJob` resource.
pub const VERSION: &str = "v1alpha1";
/// Kind of the resource.
pub const KIND: &str = "DispatchJob";
/// Plural (the resource name in URLs and RBAC).
pub const PLURAL: &str = "dispatchjobs";

pub use dispatch_api::agent::DispatchJobSpec;

/// A resource of our API group (`DispatchJob`, `DispatchLogRequest`), for dynamic API calls.
pub fn api_resource_of(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: GROUP.into(),
        version: VERSION.into(),
        api_version: format!("{GROUP}/{VERSION}"),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// What the agent last reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchJobStatus {
    /// for `kubectl get dispatchjobs`: Running, Succeeded, Failed, ImagePull, Error,
    /// Unavailable or Deleted
    pub phase: String,
    /// the Job's state as the engine reads it; `None` once deleted
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<DestState>,
    /// the Job is gone after a delete request
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deleted: bool,
    /// one line for people
    #[serde(default)]
    pub message: String,
    /// RFC 3339 time of the agent's observation
    #[serde(default)]
    pub observed_at: String,
    /// the agent (its token subject)
    #[serde(default)]
    pub agent: String,
    /// facts for the measurement's metadata (observe records: e.g. `analysisruns`)
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// the observed Application as Argo CD reports it (`application` records)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application: Option<ApplicationState>,
}

impl DispatchJobStatus {
    /// The status for `state`, observed now by `agent`.
    pub fn observed(state: Option<DestState>, agent: &str) -> Self {
        let (phase, message) = match &state {
            None => ("Deleted".to_string(), "the Job is deleted".to_string()),
            Some(s) => (phase_name(s).to_string(), summary(s)),
        };
        Self {
            phase,
            deleted: state.is_none(),
            state,
            message,
            observed_at: k8s_openapi::jiff::Timestamp::now()
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string(),
            agent: agent.to_string(),
            notes: BTreeMap::new(),
            application: None,
        }
    }
}

fn phase_name(s: &DestState) -> &'static str {
    match s {
        DestState::Running(_) => "Running",
        DestState::Succeeded => "Succeeded",
        DestState::Failed { .. } => "Failed",
        DestState::ImagePull { .. } => "ImagePull",
        DestState::Unavailable(_) => "Unavailable",
        DestState::Error(_) => "Error",
    }
}

fn summary(s: &DestState) -> String {
    let text = match s {
        DestState::Running(d) => d.clone().unwrap_or_default(),
        DestState::Succeeded => String::new(),
        DestState::Failed { reason, detail, .. } => format!("{reason}: {detail}"),
        DestState::ImagePull {
            container, reason, ..
        } => format!("{container}: {reason}"),
        DestState::Unavailable(m) | DestState::Error(m) => m.clone(),
    };
    text.chars().take(256).collect()
}

/// One record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchJob {
    /// the record's name: [`record_name`]
    pub name: String,
    /// what the server asks
    pub spec: DispatchJobSpec,
    /// what the agent reported
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DispatchJobStatus>,
    /// the Kubernetes store's `metadata.resourceVersion` (unused in memory)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

impl DispatchJob {
    /// Whether the agent reported on the Job: it was created (or refused for good) and is never
    /// created again. A transient create failure (5xx, timeout, 429) is not such a report: the
    /// agent tries again.
    pub fn is_reported(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| !s.state.as_ref().is_some_and(DestState::is_retryable))
    }

    /// The record as its agent receives it in the work reply.
    pub fn into_work_item(self) -> dispatch_api::agent::WorkItem {
        dispatch_api::agent::WorkItem {
            reported: self.is_reported(),
            name: self.name,
            spec: self.spec,
        }
    }
}

/// The record of Job `job_name` on `destination`: the Job name plus a hash of the destination,
/// so that the records of a multi-destination measurement do not collide.
pub fn record_name(job_name: &str, destination: &str) -> String {
    format!(
        "{job_name}.{:08x}",
        crate::job::fnv1a(destination.as_bytes()) as u32
    )
}

/// What [`Store::create`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// the record is new
    New,
    /// a record of that name was already there (a retry, or another replica)
    Existing(Box<DispatchJob>),
}

/// A store operation that failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// no such record
    #[error("dispatchjob {0} does not exist")]
    NotFound(String),
    /// the backend could not be reached or refused (retryable)
    #[error("dispatchjob store: {message}")]
    Backend {
        /// what failed, and why
        message: String,
        /// the error it came from (the API's, the encoder's), if any; shared, so that the
        /// error stays `Clone`
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
}

impl StoreError {
    /// The backend failed without an error value (no answer in time, a malformed record).
    pub fn backend(message: String) -> Self {
        Self::Backend {
            message,
            source: None,
        }
    }

    /// The backend failed with `source`; `message` says what was asked and why it failed.
    pub fn backend_from(
        message: String,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Backend {
            message,
            source: Some(Arc::new(source)),
        }
    }
}

/// Where the records live: one of the two backends. Reads come from the backend's [`Index`];
/// writes go to the backend.
pub enum Store {
    /// records in this process only ([`memory::MemoryStore`]); boxed, like the other, so that
    /// a `Store` is a pointer whichever it is
    Memory(Box<memory::MemoryStore>),
    /// `DispatchJob` resources on the control plane ([`kubernetes::KubeStore`]), boxed
    Kubernetes(Box<kubernetes::KubeStore>),
}

impl Store {
    /// An empty store in this process only.
    pub fn memory() -> Self {
        Store::Memory(Box::new(memory::MemoryStore::new()))
    }
    /// The in-memory view of the records.
    pub fn index(&self) -> &Index {
        match self {
            Store::Memory(s) => s.index(),
            Store::Kubernetes(s) => s.index(),
        }
    }
    /// The record called `name`.
    pub fn get(&self, name: &str) -> Option<DispatchJob> {
        self.index().get(name)
    }
    /// The record called `name` as the backend has it now: [`Store::get`], unless the index
    /// may be stale (the Kubernetes store relisting after a 410 or a stall, or not listed yet),
    /// then read from the backend ([`kubernetes::KubeStore::get_current`]). For reads a verdict
    /// or a deletion depends on.
    pub async fn get_current(&self, name: &str) -> Result<Option<DispatchJob>, StoreError> {
        match self {
            Store::Memory(s) => Ok(s.index().get(name)),
            Store::Kubernetes(s) => s.get_current(name).await,
        }
    }
    /// Every record of `destination`, by name.
    pub fn for_destination(&self, destination: &str) -> Vec<DispatchJob> {
        self.index().for_destination(destination)
    }
    /// Every record of AnalysisRun `run_uid`.
    pub fn for_run(&self, run_uid: &str) -> Vec<DispatchJob> {
        self.index().for_run(run_uid)
    }
    /// Every record.
    pub fn all(&self) -> Vec<DispatchJob> {
        self.index().all()
    }
    /// Every record that asks for its Job's deletion, copying no other.
    pub fn deleting(&self) -> Vec<DispatchJob> {
        self.index().deleting()
    }
    /// Number of records.
    pub fn len(&self) -> usize {
        self.index().len()
    }
    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// [`work_fingerprint`] of `destination`'s records, without copying them.
    pub fn fingerprint(&self, destination: &str) -> String {
        self.index().fingerprint(destination)
    }
    /// Changes whenever a record of `destination` changes.
    pub fn subscribe(&self, destination: &str) -> watch::Receiver<u64> {
        self.index().subscribe(destination)
    }
    /// Creates `job` unless a record of that name exists.
    pub async fn create(&self, job: DispatchJob) -> Result<Created, StoreError> {
        match self {
            Store::Memory(s) => s.create(job),
            Store::Kubernetes(s) => s.create(job).await,
        }
    }
    /// Replaces the status of record `name`.
    pub async fn set_status(
        &self,
        name: &str,
        status: DispatchJobStatus,
    ) -> Result<(), StoreError> {
        match self {
            Store::Memory(s) => s.set_status(name, status),
            Store::Kubernetes(s) => s.set_status(name, status).await,
        }
    }
    /// Asks the agent to delete the Job of record `name`.
    pub async fn request_delete(&self, name: &str) -> Result<(), StoreError> {
        match self {
            Store::Memory(s) => s.request_delete(name),
            Store::Kubernetes(s) => s.request_delete(name).await,
        }
    }
    /// Removes record `name` (after the agent reported the Job deleted); absent is fine.
    pub async fn remove(&self, name: &str) -> Result<(), StoreError> {
        match self {
            Store::Memory(s) => {
                s.remove(name);
                Ok(())
            }
            Store::Kubernetes(s) => s.remove(name).await,
        }
    }
    /// Where the log requests of every replica can be published beside the records (the log
    /// board, `logs::board`), for a backend shared by several replicas; `None` when this
    /// replica is the only one (memory).
    pub fn shared_site(&self) -> Option<SharedSite> {
        match self {
            Store::Memory(_) => None,
            Store::Kubernetes(s) => Some(s.shared_site()),
        }
    }
    /// Waits up to `timeout` for the first full read of the backend; returns whether it happened.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        match self {
            // Memory is the backend: there is nothing to read first.
            Store::Memory(_) => true,
            Store::Kubernetes(s) => s.wait_synced(timeout).await,
        }
    }
}

/// The in-memory view both backends keep: records by name, indexed by destination and run, and
/// one change counter per destination for the long polls.
#[derive(Default)]
pub struct Index {
    state: RwLock<IndexState>,
}

#[derive(Default)]
struct IndexState {
    by_name: HashMap<String, DispatchJob>,
    by_destination: HashMap<String, BTreeSet<String>>,
    by_run: HashMap<String, BTreeSet<String>>,
    notify: HashMap<String, watch::Sender<u64>>,
    /// where a record of a measurement that gets its final state emits a resume hint
    hints: Option<Hints>,
}

impl IndexState {
    fn unlink(&mut self, job: &DispatchJob) {
        for (map, key) in [
            (&mut self.by_destination, &job.spec.destination),
            (&mut self.by_run, &job.spec.run_uid),
        ] {
            if let Some(set) = map.get_mut(key) {
                set.remove(&job.name);
                if set.is_empty() {
                    map.remove(key);
                }
            }
        }
    }

    /// The records called `names`, in name order.
    fn named(&self, names: Option<&BTreeSet<String>>) -> Vec<DispatchJob> {
        names
            .into_iter()
            .flatten()
            .filter_map(|n| self.by_name.get(n).cloned())
            .collect()
    }

    fn touch(&mut self, destination: &str) {
        self.notify
            .entry(destination.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .send_modify(|v| *v += 1);
    }
}

/// Resource versions are opaque, but the API server's are integers that grow; an event older
/// than what a write already put into the index must not win.
fn is_older(new: Option<&str>, old: Option<&str>) -> bool {
    match (
        new.and_then(|v| v.parse::<u64>().ok()),
        old.and_then(|v| v.parse::<u64>().ok()),
    ) {
        (Some(n), Some(o)) => n < o,
        _ => false,
    }
}

/// The resume hint of `new`, a measurement's record whose state has just become final: it had
/// a record before (`old`) without one. A record new to this process is not a change (the first
/// list of the store, or a record made final at once); neither are the Application routes'
/// records, which are no measurement.
fn finished_hint(old: Option<&DispatchJob>, new: &DispatchJob) -> Option<ResumeHint> {
    let is_final = |j: &DispatchJob| {
        j.status
            .as_ref()
            .and_then(|st| st.state.as_ref())
            .is_some_and(DestState::is_final)
    };
    let measurement = new.spec.for_stage.is_none() && new.spec.sync.is_none();
    (measurement && is_final(new) && !is_final(old?)).then(|| ResumeHint {
        namespace: new.spec.project.clone(),
        run_uid: new.spec.run_uid.clone(),
        job: new.spec.job_name.clone(),
    })
}

fn upsert_locked(s: &mut IndexState, job: DispatchJob) -> bool {
    let hint = s
        .hints
        .as_ref()
        .and_then(|_| finished_hint(s.by_name.get(&job.name), &job));
    if let Some(old) = s.by_name.get(&job.name) {
        if *old == job
            || is_older(
                job.resource_version.as_deref(),
                old.resource_version.as_deref(),
            )
        {
            return false;
        }
        let old = old.clone();
        s.unlink(&old);
        if old.spec.destination != job.spec.destination {
            s.touch(&old.spec.destination);
        }
    }
    s.by_destination
        .entry(job.spec.destination.clone())
        .or_default()
        .insert(job.name.clone());
    s.by_run
        .entry(job.spec.run_uid.clone())
        .or_default()
        .insert(job.name.clone());
    let destination = job.spec.destination.clone();
    s.by_name.insert(job.name.clone(), job);
    s.touch(&destination);
    if let (Some(hint), Some(hints)) = (hint, &s.hints) {
        hints.emit(hint);
    }
    true
}

impl Index {
    /// From now on, a measurement's record that gets its final state emits a resume hint into
    /// `hints` ([`finished_hint`]).
    pub fn set_hints(&self, hints: Hints) {
        self.write().hints = Some(hints);
    }

    /// The record called `name`.
    pub fn get(&self, name: &str) -> Option<DispatchJob> {
        self.read().by_name.get(name).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, IndexState> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, IndexState> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The records of `destination`.
    pub fn for_destination(&self, destination: &str) -> Vec<DispatchJob> {
        let s = self.read();
        s.named(s.by_destination.get(destination))
    }

    /// [`work_fingerprint`] of `destination`'s records, read in place: a long poll woken by a
    /// status report checks it without copying the records (and their Job specs).
    pub fn fingerprint(&self, destination: &str) -> String {
        let s = self.read();
        work_fingerprint(
            s.by_destination
                .get(destination)
                .into_iter()
                .flatten()
                .filter_map(|n| s.by_name.get(n)),
        )
    }

    /// The records of run `run_uid`.
    pub fn for_run(&self, run_uid: &str) -> Vec<DispatchJob> {
        let s = self.read();
        s.named(s.by_run.get(run_uid))
    }

    /// Every record.
    pub fn all(&self) -> Vec<DispatchJob> {
        self.read().by_name.values().cloned().collect()
    }

    /// Every record that asks for its Job's deletion (`spec.delete`).
    pub fn deleting(&self) -> Vec<DispatchJob> {
        self.read()
            .by_name
            .values()
            .filter(|r| r.spec.delete)
            .cloned()
            .collect()
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.read().by_name.len()
    }

    /// Whether there is no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The change counter of `destination`.
    pub fn subscribe(&self, destination: &str) -> watch::Receiver<u64> {
        if let Some(tx) = self.read().notify.get(destination) {
            return tx.subscribe();
        }
        self.write()
            .notify
            .entry(destination.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    /// Inserts or replaces `job` (unless it is older than the record held); returns whether the
    /// index changed.
    pub fn upsert(&self, job: DispatchJob) -> bool {
        upsert_locked(&mut self.write(), job)
    }

    /// Inserts `job` unless a record of that name exists (checked under the same lock);
    /// `Err`: the existing record.
    pub fn insert_new(&self, job: DispatchJob) -> Result<(), Box<DispatchJob>> {
        let mut s = self.write();
        if let Some(existing) = s.by_name.get(&job.name) {
            return Err(Box::new(existing.clone()));
        }
        upsert_locked(&mut s, job);
        Ok(())
    }

    /// Removes record `name`; returns it.
    pub fn remove(&self, name: &str) -> Option<DispatchJob> {
        let mut s = self.write();
        let old = s.by_name.remove(name)?;
        s.unlink(&old);
        s.touch(&old.spec.destination);
        Some(old)
    }

    /// Replaces every record with `jobs` (after a full list of the backend).
    pub fn replace_all(&self, jobs: Vec<DispatchJob>) {
        let keep: BTreeSet<String> = jobs.iter().map(|j| j.name.clone()).collect();
        let gone: Vec<String> = self
            .read()
            .by_name
            .keys()
            .filter(|n| !keep.contains(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
        for job in jobs {
            self.upsert(job);
        }
    }
}

/// A short digest of a destination's work (names, delete requests, whether the agent reported),
/// so that a long poll answers only when the work changed, not on every status update.
pub fn work_fingerprint<'a>(jobs: impl IntoIterator<Item = &'a DispatchJob>) -> String {
    let mut text = String::new();
    let mut count = 0;
    for j in jobs {
        count += 1;
        text.push_str(&j.name);
        text.push(if j.spec.delete { 'd' } else { '-' });
        text.push(if j.is_reported() { 'r' } else { '-' });
        text.push(if j.spec.job.is_some() { 'j' } else { '-' });
        text.push('\n');
    }
    format!("{:016x}-{count}", crate::job::fnv1a(text.as_bytes()))
}

/// Records of a run per `(destination, metric)`, oldest measurement first.
pub fn by_metric(jobs: Vec<DispatchJob>) -> BTreeMap<(String, String), Vec<DispatchJob>> {
    let mut groups: BTreeMap<(String, String), Vec<DispatchJob>> = BTreeMap::new();
    for j in jobs {
        groups
            .entry((j.spec.destination.clone(), j.spec.metric.clone()))
            .or_default()
            .push(j);
    }
    for list in groups.values_mut() {
        list.sort_by(|a, b| {
            a.spec
                .measurement
                .cmp(&b.spec.measurement)
                .then_with(|| a.name.cmp(&b.name))
        });
    }
    groups
}

/// Whether `spec` is a record of the Application routes: it observes an Application and belongs
/// to no AnalysisRun (an `application:` check's records carry their run's uid).
pub fn is_application_record(spec: &DispatchJobSpec) -> bool {
    spec.run_uid.is_empty()
        && matches!(
            spec.observe,
            Some(dispatch_api::observe::Observe::Application(_))
        )
}

/// Where a backend shared by replicas keeps its objects: the cluster, namespace and request
/// timeout of the Kubernetes store.
#[derive(Clone)]
pub struct SharedSite {
    /// the store's cluster
    pub client: kube::Client,
    /// the store's namespace
    pub namespace: String,
    /// how long one request may take
    pub timeout: Duration,
}

/// A fresh unguessable id (128 random bits, hex): of a sync order, of a log request.
pub fn random_id() -> String {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    // The system RNG fails only on a broken OS; an id from the clock is still unique enough
    // for "carry out once".
    if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        bytes = nanos.to_be_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn job(name: &str, destination: &str, run: &str, n: u32) -> DispatchJob {
        DispatchJob {
            name: name.into(),
            spec: DispatchJobSpec {
                destination: destination.into(),
                namespace: "default".into(),
                job_name: name.into(),
                run_uid: run.into(),
                run: "p/r".into(),
                metric: "m".into(),
                measurement: n,
                log_tail: 5,
                job: Some(serde_json::json!({"kind": "Job"})),
                delete: false,
                observe: None,
                sync: None,
                ..DispatchJobSpec::default()
            },
            status: None,
            resource_version: None,
        }
    }

    #[test]
    fn the_index_wakes_only_the_destination_that_changed() {
        let index = Index::default();
        let mut a = index.subscribe("a");
        let b = index.subscribe("b");
        assert!(index.upsert(job("j1", "a", "r1", 1)));
        assert!(a.has_changed().unwrap() && !b.has_changed().unwrap());
        a.mark_unchanged();
        assert!(!index.upsert(job("j1", "a", "r1", 1)), "no change");
        assert!(!a.has_changed().unwrap());
        index.upsert(job("j2", "b", "r1", 2));
        assert!(b.has_changed().unwrap() && !a.has_changed().unwrap());
        assert_eq!(index.for_run("r1").len(), 2);
        assert_eq!(index.for_destination("a").len(), 1);
        index.remove("j1");
        assert!(a.has_changed().unwrap());
        assert!(index.for_destination("a").is_empty());
        index.replace_all(vec![job("j3", "a", "r2", 1)]);
        assert_eq!(index.len(), 1);
        assert!(index.for_run("r1").is_empty());
    }

    #[test]
    fn older_resource_versions_do_not_overwrite_newer_ones() {
        let index = Index::default();
        let mut new = job("j", "a", "r", 1);
        new.resource_version = Some("20".into());
        new.spec.delete = true;
        index.upsert(new);
        let mut old = job("j", "a", "r", 1);
        old.resource_version = Some("19".into());
        assert!(!index.upsert(old));
        assert!(index.get("j").unwrap().spec.delete);
    }

    #[test]
    fn the_fingerprint_ignores_status_updates_after_the_first() {
        let mut j = job("j", "a", "r", 1);
        let before = work_fingerprint(std::slice::from_ref(&j));
        j.status = Some(DispatchJobStatus::observed(
            Some(DestState::Running(None)),
            "agent:a",
        ));
        let reported = work_fingerprint(std::slice::from_ref(&j));
        assert_ne!(before, reported);
        j.status = Some(DispatchJobStatus::observed(
            Some(DestState::Succeeded),
            "agent:a",
        ));
        assert_eq!(reported, work_fingerprint(std::slice::from_ref(&j)));
        j.spec.delete = true;
        assert_ne!(reported, work_fingerprint(std::slice::from_ref(&j)));
        let index = Index::default();
        index.upsert(j.clone());
        index.upsert(job("k", "a", "r", 2));
        assert_eq!(
            index.fingerprint("a"),
            work_fingerprint(&index.for_destination("a"))
        );
    }

    #[test]
    fn records_of_a_measurement_differ_per_destination_and_states_round_trip() {
        assert_ne!(record_name("u.m.1", "a"), record_name("u.m.1", "b"));
        assert!(dispatch_api::names::is_dns_subdomain(&record_name(
            "u.m.1", "a"
        )));
        let s = DispatchJobStatus::observed(
            Some(DestState::Failed {
                reason: "BackoffLimitExceeded".into(),
                detail: "exit 1".into(),
                log: Some("boom".into()),
            }),
            "agent:a",
        );
        assert_eq!(s.phase, "Failed");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["state"]["kind"], "failed");
        let back: DispatchJobStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, s);
        let gone = DispatchJobStatus::observed(None, "agent:a");
        assert!(gone.deleted && gone.phase == "Deleted");
    }
}
