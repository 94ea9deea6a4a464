//! The Kubernetes backend of [`Store`](super::Store): `DispatchJob` resources in the server's
//! namespace on the control plane, read through one informer (a [`crate::watch::watch`]
//! feeding the [`Index`]).
//!
//! Kubernetes is the shared state of the replicas, so there is no consensus of our own: `create`
//! is the API server's create (409 → the record is already there), status goes through the
//! status subresource, and every write is also applied to the local index at once (guarded by
//! resource version), so the replica that wrote sees its write before the watch event arrives.
//!
//! The informer's watch lists again after a `410 Gone` or a stall (open, silent past
//! [`crate::watch::STALL`]), with one line of its own. Until that list ends the index may miss
//! what other replicas wrote meanwhile — an agent's final report among them —, so the store is
//! not authoritative ([`KubeStore::is_authoritative`]) and [`KubeStore::get_current`] reads a
//! record from the API server instead: a verdict the index has not caught up with is neither
//! lost nor, past the deadline, turned into an `Error`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::time::Duration;
use tracing::Instrument;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher::Event;
use serde_json::{json, Value};
use tokio::sync::watch;

use super::{Created, DispatchJob, DispatchJobStatus, Index, StoreError};
use super::{GROUP, KIND, PLURAL, VERSION};
use crate::watch::{self as watches, Source, Watched};

/// `DispatchJob` resources in one namespace.
pub struct KubeStore {
    index: Arc<Index>,
    api: Api<DynamicObject>,
    client: kube::Client,
    namespace: String,
    timeout: Duration,
    freshness: Arc<Freshness>,
    task: tokio::task::AbortHandle,
}

/// How far the index can be trusted, as the informer leaves it.
#[derive(Debug)]
struct Freshness {
    /// the first full list has arrived
    synced: watch::Sender<bool>,
    /// a list after the first is under way (a 410 or a stall started it): the index may be stale
    relisting: AtomicBool,
}

impl Default for Freshness {
    fn default() -> Self {
        Self {
            synced: watch::channel(false).0,
            relisting: AtomicBool::new(false),
        }
    }
}

impl Freshness {
    fn is_authoritative(&self) -> bool {
        *self.synced.borrow() && !self.relisting.load(Ordering::Acquire)
    }
}

impl Drop for KubeStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `DispatchJob` resource, for dynamic API calls.
pub fn api_resource() -> ApiResource {
    super::api_resource_of(KIND, PLURAL)
}

/// The record in a resource; `None` (and a warning) when it is not one of ours.
fn from_object(obj: DynamicObject) -> Option<DispatchJob> {
    let name = obj.metadata.name.clone()?;
    let mut value = obj.data;
    let spec = value.get_mut("spec").map(Value::take);
    let status = value.get_mut("status").map(Value::take);
    let parsed = spec
        .ok_or_else(|| "no spec".to_string())
        .and_then(|s| serde_json::from_value(s).map_err(|e| e.to_string()))
        .and_then(|spec| {
            let status = match status {
                None | Some(Value::Null) => None,
                Some(s) => Some(serde_json::from_value(s).map_err(|e| format!("status: {e}"))?),
            };
            Ok((spec, status))
        });
    match parsed {
        Ok((spec, status)) => Some(DispatchJob {
            name,
            spec,
            status,
            resource_version: obj.metadata.resource_version,
        }),
        Err(e) => {
            tracing::warn!(dispatchjob = %name, error = %e, "ignoring a malformed DispatchJob; delete it");
            None
        }
    }
}

fn to_object(job: &DispatchJob) -> Result<DynamicObject, StoreError> {
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": job.name,
            "labels": {
                "app.kubernetes.io/managed-by": "rollouts-dispatch",
                crate::job::LABEL_DESTINATION: crate::job::destination_label_value(&job.spec.destination),
            },
        },
        "spec": job.spec,
    }))
    .map_err(|e| StoreError::backend_from(format!("encoding dispatchjob {}: {e}", job.name), e))
}

impl KubeStore {
    /// Starts the informer on `namespace` (without waiting for it); `timeout` bounds each write.
    pub fn start(client: kube::Client, namespace: &str, timeout: Duration) -> Self {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &api_resource());
        Self::start_from(api.clone(), api, client, namespace, timeout)
    }

    /// [`KubeStore::start`] with the informer fed by `source` (a scripted API in tests), the
    /// calls made through `api`.
    fn start_from<S: Source<DynamicObject>>(
        source: S,
        api: Api<DynamicObject>,
        client: kube::Client,
        namespace: &str,
        timeout: Duration,
    ) -> Self {
        let index = Arc::new(Index::default());
        let freshness = Arc::new(Freshness::default());
        let task = tokio::spawn(
            informer(
                source,
                index.clone(),
                freshness.clone(),
                namespace.to_string(),
            )
            .instrument(tracing::info_span!("dispatchjob_informer", %namespace)),
        )
        .abort_handle();
        Self {
            index,
            api,
            client,
            namespace: namespace.to_string(),
            timeout,
            freshness,
            task,
        }
    }

    async fn call<T>(
        &self,
        what: String,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => Err(StoreError::NotFound(what)),
            Ok(Err(e)) => Err(self.failure(&what, Some(e))),
            Err(_) => Err(self.failure(&what, None)),
        }
    }

    /// A failed call (`None`: no answer in time), naming the namespace.
    fn failure(&self, what: &str, error: Option<kube::Error>) -> StoreError {
        match error {
            Some(e) => StoreError::backend_from(
                format!(
                    "{what} in namespace {}: {}",
                    self.namespace,
                    crate::destinations::client::describe(&e)
                ),
                e,
            ),
            None => StoreError::backend(format!(
                "{what} in namespace {}: no answer within {}s",
                self.namespace,
                self.timeout.as_secs()
            )),
        }
    }

    fn applied(&self, obj: DynamicObject) {
        if let Some(job) = from_object(obj) {
            self.index.upsert(job);
        }
    }

    async fn patch(&self, name: &str, body: Value, status: bool) -> Result<(), StoreError> {
        self.send(name, Patch::Merge(body), status).await
    }

    async fn send(&self, name: &str, patch: Patch<Value>, status: bool) -> Result<(), StoreError> {
        let params = PatchParams::default();
        let obj = if status {
            self.call(
                format!("dispatchjob {name}"),
                self.api.patch_status(name, &params, &patch),
            )
            .await
        } else {
            self.call(
                format!("dispatchjob {name}"),
                self.api.patch(name, &params, &patch),
            )
            .await
        }
        .map_err(|e| match e {
            StoreError::NotFound(_) => StoreError::NotFound(name.to_string()),
            e => e,
        })?;
        self.applied(obj);
        Ok(())
    }
}

/// A JSON patch that replaces the whole status with `status`. Not a merge patch: that keeps
/// what it does not mention, so a `Running` state's `detail` would outlive it into a
/// `Succeeded` one, which then no longer parses and the verdict is lost (seen with a real Argo
/// CD: an Application Progressing, then Healthy); the same for notes and Application fields
/// that go away.
fn status_patch(status: &DispatchJobStatus) -> Result<json_patch::Patch, StoreError> {
    let value = serde_json::to_value(status)
        .map_err(|e| StoreError::backend_from(format!("encoding the status: {e}"), e))?;
    serde_json::from_value(json!([{"op": "add", "path": "/status", "value": value}]))
        .map_err(|e| StoreError::backend_from(format!("encoding the status patch: {e}"), e))
}

async fn informer<S: Source<DynamicObject>>(
    source: S,
    index: Arc<Index>,
    freshness: Arc<Freshness>,
    namespace: String,
) {
    let watched = Watched {
        destination: "control-plane".into(),
        resource: PLURAL.into(),
        namespace: Some(namespace.clone()),
    };
    let mut stream = watches::watch(source, None, watched);
    let mut relist: Option<Vec<DispatchJob>> = None;
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => {
                relist = Some(Vec::new());
                freshness.relisting.store(true, Ordering::Release);
            }
            Ok(Event::InitApply(obj)) => {
                if let (Some(list), Some(job)) = (relist.as_mut(), from_object(obj)) {
                    list.push(job);
                }
            }
            Ok(Event::InitDone) => {
                let jobs = relist.take().unwrap_or_default();
                tracing::info!(namespace = %namespace, records = jobs.len(), "dispatchjob store synced");
                index.replace_all(jobs);
                // Only now: the index holds what the API server had at the list.
                freshness.relisting.store(false, Ordering::Release);
                freshness.synced.send_replace(true);
                failing = false;
            }
            Ok(Event::Apply(obj)) => {
                if let Some(job) = from_object(obj) {
                    index.upsert(job);
                }
            }
            Ok(Event::Delete(obj)) => {
                if let Some(name) = obj.metadata.name {
                    index.remove(&name);
                }
            }
            // A 410 or a stall said so in its own line (`crate::watch`), and lists again.
            Err(e) if e.relists() => freshness.relisting.store(true, Ordering::Release),
            Err(e) => {
                // Log the first failure of a streak; the backoff retries quietly after that.
                if !failing {
                    tracing::warn!(namespace = %namespace, error = %e,
                                   "dispatchjob watch failing (is the CRD installed and the server allowed to list dispatchjobs?)");
                }
                failing = true;
            }
        }
    }
}

impl KubeStore {
    /// The records, as the informer and this replica's own writes left them.
    pub fn index(&self) -> &Index {
        &self.index
    }

    /// Whether the index holds every record as the API server has it, give or take the watch's
    /// lag: the first list has arrived and no list after a 410 or a stall is under way.
    pub fn is_authoritative(&self) -> bool {
        self.freshness.is_authoritative()
    }

    /// The record called `name` as it is now: from the index when it is authoritative, else
    /// read from the API server (and put into the index, where it wins over older versions).
    pub async fn get_current(&self, name: &str) -> Result<Option<DispatchJob>, StoreError> {
        if self.is_authoritative() {
            return Ok(self.index.get(name));
        }
        match self
            .call(format!("read dispatchjob {name}"), self.api.get(name))
            .await
        {
            Ok(obj) => {
                if let Some(job) = from_object(obj) {
                    self.index.upsert(job);
                }
                Ok(self.index.get(name))
            }
            // Not removed from the index: a create of this replica may have raced the read;
            // the relist removes what is gone.
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates `job` unless a resource of that name exists (the API server's 409).
    pub async fn create(&self, job: DispatchJob) -> Result<Created, StoreError> {
        let obj = to_object(&job)?;
        let what = format!("create dispatchjob {}", job.name);
        match tokio::time::timeout(self.timeout, self.api.create(&PostParams::default(), &obj))
            .await
        {
            Ok(Ok(created)) => {
                self.applied(created);
                Ok(Created::New)
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                let existing = self
                    .call(
                        format!("read dispatchjob {}", job.name),
                        self.api.get(&job.name),
                    )
                    .await?;
                let existing = from_object(existing).ok_or_else(|| {
                    StoreError::backend(format!("dispatchjob {} is malformed", job.name))
                })?;
                self.index.upsert(existing.clone());
                Ok(Created::Existing(Box::new(existing)))
            }
            Ok(Err(e)) => Err(self.failure(&what, Some(e))),
            Err(_) => Err(self.failure(&what, None)),
        }
    }

    /// Replaces the status of record `name` (the status subresource).
    pub async fn set_status(
        &self,
        name: &str,
        status: DispatchJobStatus,
    ) -> Result<(), StoreError> {
        self.send(name, Patch::Json(status_patch(&status)?), true)
            .await
    }

    /// Asks the agent to delete the Job of record `name` (`spec.delete`).
    pub async fn request_delete(&self, name: &str) -> Result<(), StoreError> {
        self.patch(name, json!({"spec": {"delete": true}}), false)
            .await
    }

    /// Deletes resource `name`; absent is fine.
    pub async fn remove(&self, name: &str) -> Result<(), StoreError> {
        match self
            .call(
                format!("delete dispatchjob {name}"),
                self.api.delete(name, &DeleteParams::default()),
            )
            .await
        {
            Ok(_) | Err(StoreError::NotFound(_)) => {
                self.index.remove(name);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// Its cluster, namespace and request timeout, for the log board beside it.
    pub fn shared_site(&self) -> super::SharedSite {
        super::SharedSite {
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            timeout: self.timeout,
        }
    }

    /// Waits up to `timeout` for the informer's first full list; returns whether it came.
    pub async fn wait_synced(&self, timeout: Duration) -> bool {
        let mut rx = self.freshness.synced.subscribe();
        let synced = tokio::time::timeout(timeout, rx.wait_for(|s| *s)).await;
        matches!(synced, Ok(Ok(_)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::job;
    use crate::verdict::DestState;
    use crate::watch::script::{Beat, Logs, Script};
    use crate::watch::{STALL, STALLED_LOG};
    use std::sync::atomic::AtomicUsize;

    /// A client whose API server answers every request with `body`, and the count of requests.
    fn answering(body: Value) -> (kube::Client, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let counter = calls.clone();
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = serde_json::to_vec(&body).expect("a JSON body");
            async move {
                Ok::<_, std::convert::Infallible>(http::Response::new(kube::client::Body::from(
                    body,
                )))
            }
        });
        (kube::Client::new(service, "ns"), calls)
    }

    /// Record `r.1` of destination `edge` as the API server has it at `version`.
    fn record(state: DestState, version: &str) -> DynamicObject {
        let mut obj = to_object(&job("r.1", "edge", "u", 1)).expect("an object");
        obj.data["status"] =
            serde_json::to_value(DispatchJobStatus::observed(Some(state), "agent:edge"))
                .expect("a status");
        obj.metadata.resource_version = Some(version.into());
        obj
    }

    fn state_of(record: Option<DispatchJob>) -> Option<DestState> {
        record?.status?.state
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_watch_is_relisted_and_records_are_read_from_the_api_meanwhile() {
        let (logs, _guard) = Logs::capture();
        // The agent's final report, written through another replica while the watch stalled.
        let reported = record(DestState::Succeeded, "4");
        let (client, calls) = answering(serde_json::to_value(&reported).expect("json"));
        let script: Script<DynamicObject> = Script::default();
        script
            .list(vec![record(DestState::Running(None), "2")], "2")
            .watch(vec![Beat::Hang])
            // The relist takes 10 s to answer.
            .list_after(Duration::from_secs(10), vec![reported], "5")
            .watch(vec![Beat::Hang]);
        let api = Api::namespaced_with(client.clone(), "ns", &api_resource());
        let store =
            KubeStore::start_from(script.clone(), api, client, "ns", Duration::from_secs(5));
        assert!(store.wait_synced(Duration::from_secs(1)).await);
        assert!(store.is_authoritative());
        let current = store.get_current("r.1").await.expect("read");
        assert_eq!(state_of(current), Some(DestState::Running(None)));
        assert_eq!(calls.load(Ordering::SeqCst), 0, "read from the index");

        // Within the bound a silent watch is a quiet one.
        tokio::time::sleep(STALL - Duration::from_secs(2)).await;
        assert_eq!(script.lists(), 1);
        assert!(store.is_authoritative());

        // Past it the watch is dropped and lists again; until that list ends, what the index
        // says may be stale, and a read asks the API server.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(script.lists(), 2);
        assert!(!store.is_authoritative());
        let stale = store.index().get("r.1");
        assert_eq!(state_of(stale), Some(DestState::Running(None)));
        let current = store.get_current("r.1").await.expect("read");
        assert_eq!(state_of(current), Some(DestState::Succeeded));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(
            state_of(store.index().get("r.1")),
            Some(DestState::Succeeded),
            "what was read is kept"
        );

        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(store.is_authoritative());
        let current = store.get_current("r.1").await.expect("read");
        assert_eq!(state_of(current), Some(DestState::Succeeded));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "the index again");

        let lines = logs.lines();
        let stalled: Vec<&String> = lines.iter().filter(|l| l.contains(STALLED_LOG)).collect();
        assert_eq!(stalled.len(), 1, "{lines:?}");
        for part in [
            " WARN ",
            "destination=control-plane",
            "resource=dispatchjobs",
            "namespace=ns",
        ] {
            assert!(stalled[0].contains(part), "{part} in {}", stalled[0]);
        }
        assert!(
            !lines.iter().any(|l| l.contains("watch failing")),
            "one line for the stall: {lines:?}"
        );
    }

    /// The API server prunes fields a structural schema does not declare: a field missing from
    /// the CRD would silently read back as its default (it happened to `logTail`).
    #[test]
    fn the_crd_declares_every_field_of_spec_and_status() {
        let crd: Value =
            serde_saphyr::from_str(include_str!("../../../config/crds/dispatchjobs.yaml")).unwrap();
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        let mut j = job("n", "d", "u", 1);
        j.spec.delete = true;
        j.spec.project = "team-a".into();
        j.spec.deadline = 1;
        j.spec.signature = Some("v1.k.s".into());
        j.spec.for_stage = Some(dispatch_api::observe::StageRef {
            project: "team-a".into(),
            stage: "uat".into(),
        });
        j.status = Some(DispatchJobStatus::observed(None, "agent:d"));
        let value = serde_json::to_value(&j).unwrap();
        for part in ["spec", "status"] {
            let declared = schema[part]["properties"].as_object().unwrap();
            for field in value[part].as_object().unwrap().keys() {
                assert!(
                    declared.contains_key(field),
                    "{part}.{field} is not in the CRD schema"
                );
            }
        }
        assert_eq!(
            crd,
            serde_saphyr::from_str::<Value>(include_str!(
                "../../../charts/rollouts-dispatch/files/crds/dispatchjobs.yaml"
            ))
            .unwrap(),
            "the chart ships the same CRD as config/crds"
        );
    }

    /// Every state after every other: what the API server stores after the patch reads back as
    /// exactly the new status (a merge patch kept the old `detail` and lost the verdict).
    #[test]
    fn a_status_patch_replaces_every_state_with_the_next() {
        use crate::verdict::DestState;
        let failed = DestState::Failed {
            reason: "BackoffLimitExceeded".into(),
            detail: "exit 1".into(),
            log: Some("boom".into()),
        };
        let states = [
            None,
            Some(DestState::Running(Some(
                "application argocd/a is Progressing".into(),
            ))),
            Some(DestState::Running(None)),
            Some(DestState::Succeeded),
            Some(failed),
        ];
        for before in &states {
            for after in &states {
                let mut old = DispatchJobStatus::observed(before.clone(), "agent:d");
                old.notes.insert("revision".into(), "abc".into());
                let mut j = job("n", "d", "u", 1);
                j.status = Some(old);
                let mut object = serde_json::to_value(to_object(&j).unwrap()).unwrap();
                object["status"] = serde_json::to_value(&j.status).unwrap();
                let new = DispatchJobStatus::observed(after.clone(), "agent:d");
                json_patch::patch(&mut object, &status_patch(&new).unwrap()).unwrap();
                let back: DispatchJobStatus = serde_json::from_value(object["status"].clone())
                    .unwrap_or_else(|e| panic!("{before:?} then {after:?}: {e}"));
                assert_eq!(back, new, "{before:?} then {after:?}");
            }
        }
    }

    #[test]
    fn records_round_trip_through_the_resource() {
        let mut j = job("u.m.1.abcd0123", "edge-1", "u", 1);
        j.status = Some(DispatchJobStatus::observed(
            Some(crate::verdict::DestState::Running(Some("pending".into()))),
            "agent:edge-1",
        ));
        let mut obj = to_object(&j).unwrap();
        assert_eq!(obj.types.as_ref().unwrap().kind, "DispatchJob");
        obj.data["status"] = serde_json::to_value(&j.status).unwrap();
        obj.metadata.resource_version = Some("7".into());
        let back = from_object(obj).unwrap();
        assert_eq!(back.spec, j.spec);
        assert_eq!(back.status, j.status);
        assert_eq!(back.resource_version.as_deref(), Some("7"));
        let mut bad = to_object(&j).unwrap();
        bad.data["spec"] = json!({"destination": 3});
        assert!(from_object(bad).is_none());
    }
}
