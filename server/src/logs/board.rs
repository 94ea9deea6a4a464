//! Log requests published to every server replica (`agents.store: kubernetes`): one short-lived
//! `DispatchLogRequest` resource per pending request for a Job's full log on an agent
//! destination, read by every replica through one informer (`docs/architecture.md`, "Logs on
//! agent destinations").
//!
//! The replica holding the reader publishes the request with its own address (`owner`); whichever
//! replica the destination's agent long-polls hands it out, and whichever replica the agent
//! uploads to forwards the upload to the owner. The board only carries the request: the owner
//! alone holds the reader, and it accepts an upload only for an id it is waiting for, with the
//! destination's agent token. A resource that does not parse (a name that is not `logs-<id>`, an
//! id that is not 32 hex digits, an owner that is not `ip:port`) is ignored with a warning.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use dispatch_api::logs::LogRequest;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, PostParams};
use kube::runtime::watcher::Event;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;
use tracing::Instrument;

use crate::store::{api_resource_of, StoreError, GROUP, VERSION};
use crate::watch::{self as watches, Watched};

/// Kind of the resource.
pub const KIND: &str = "DispatchLogRequest";
/// Plural (the resource name in URLs and RBAC).
pub const PLURAL: &str = "dispatchlogrequests";
/// A published request older than this is stale whatever happened to its owner (it gives up
/// after 30 s without an upload, and withdraws it when the upload starts): any replica's sweep
/// deletes it. Generous, since `creationTimestamp` is the API server's clock, not ours.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// One published request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedLog {
    /// the agent destination asked for the log
    pub destination: String,
    /// the request as the agent receives it (`request.id` is the id)
    pub request: LogRequest,
    /// the replica holding the reader
    pub owner: SocketAddr,
    /// when the API server created it (`None` before that, on the publishing side)
    pub created: Option<Timestamp>,
}

/// The spec of a `DispatchLogRequest`, as the CRD declares it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    destination: String,
    id: String,
    namespace: String,
    job: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    container: Option<String>,
    #[serde(default)]
    follow: bool,
    owner: String,
}

/// The `DispatchLogRequest` resource, for dynamic API calls.
pub fn api_resource() -> ApiResource {
    api_resource_of(KIND, PLURAL)
}

/// The resource name of request `id`.
pub fn object_name(id: &str) -> String {
    format!("logs-{id}")
}

/// Whether `id` is one of ours: 32 lowercase hex digits (128 random bits).
pub fn is_request_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Why a `DispatchLogRequest` is not one of ours.
#[derive(Debug, thiserror::Error)]
pub enum Malformed {
    /// `spec` is missing or does not parse.
    #[error("spec: {0}")]
    Spec(#[source] serde_json::Error),
    /// The id is not 32 hex digits, or the name is not `logs-<id>`.
    #[error("spec.id {0:?} is not 32 lowercase hex digits, or the name is not logs-<id>")]
    Id(String),
    /// The owner is not `ip:port`.
    #[error("spec.owner {owner:?} is not ip:port")]
    Owner {
        /// what it says
        owner: String,
        /// why it does not parse
        #[source]
        source: std::net::AddrParseError,
    },
}

/// The request in a resource, or why it is not one.
fn from_object(obj: DynamicObject) -> Result<PublishedLog, Malformed> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let spec = obj.data.get("spec").cloned().unwrap_or_default();
    let spec: Spec = serde_json::from_value(spec).map_err(Malformed::Spec)?;
    if !is_request_id(&spec.id) || name != object_name(&spec.id) {
        return Err(Malformed::Id(spec.id));
    }
    let owner = spec
        .owner
        .parse::<SocketAddr>()
        .map_err(|source| Malformed::Owner {
            owner: spec.owner.clone(),
            source,
        })?;
    let created = obj.metadata.creation_timestamp.as_ref().map(|t| t.0);
    Ok(PublishedLog {
        destination: spec.destination,
        request: LogRequest {
            id: spec.id,
            namespace: spec.namespace,
            job: spec.job,
            container: spec.container,
            follow: spec.follow,
        },
        owner,
        created,
    })
}

fn to_object(log: &PublishedLog) -> Result<DynamicObject, StoreError> {
    let r = &log.request;
    let spec = Spec {
        destination: log.destination.clone(),
        id: r.id.clone(),
        namespace: r.namespace.clone(),
        job: r.job.clone(),
        container: r.container.clone(),
        follow: r.follow,
        owner: log.owner.to_string(),
    };
    serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": KIND,
        "metadata": {
            "name": object_name(&r.id),
            "labels": {
                "app.kubernetes.io/managed-by": "rollouts-dispatch",
                crate::job::LABEL_DESTINATION: crate::job::destination_label_value(&log.destination),
            },
        },
        "spec": spec,
    }))
    .map_err(|e| StoreError::backend_from(format!("encoding dispatchlogrequest {}: {e}", r.id), e))
}

/// The published requests of every replica, kept in step by an informer.
pub struct LogBoard {
    api: Api<DynamicObject>,
    timeout: Duration,
    by_id: Arc<RwLock<HashMap<String, PublishedLog>>>,
    changed: watch::Sender<u64>,
    task: tokio::task::AbortHandle,
}

impl Drop for LogBoard {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LogBoard {
    /// Starts the informer of the requests in `namespace`; `timeout` bounds each write.
    pub fn start(client: kube::Client, namespace: &str, timeout: Duration) -> Self {
        let api: Api<DynamicObject> = Api::namespaced_with(client, namespace, &api_resource());
        let by_id = Arc::new(RwLock::new(HashMap::new()));
        let changed = watch::channel(0).0;
        let task = tokio::spawn(
            informer(
                api.clone(),
                namespace.to_string(),
                by_id.clone(),
                changed.clone(),
            )
            .instrument(tracing::info_span!("dispatchlogrequest_informer", %namespace)),
        )
        .abort_handle();
        Self {
            api,
            timeout,
            by_id,
            changed,
            task,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, PublishedLog>> {
        self.by_id.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes whenever a request appears or goes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The published request `id`.
    pub fn get(&self, id: &str) -> Option<PublishedLog> {
        self.read().get(id).cloned()
    }

    /// The published requests of `destination`.
    pub fn for_destination(&self, destination: &str) -> Vec<PublishedLog> {
        self.read()
            .values()
            .filter(|p| p.destination == destination)
            .cloned()
            .collect()
    }

    /// Whether request `id` is published.
    pub fn contains(&self, id: &str) -> bool {
        self.read().contains_key(id)
    }

    /// Number of published requests.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Whether none is published.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `fut`, a call about `what`, within the write timeout.
    async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {
                Err(StoreError::NotFound(what.to_string()))
            }
            Ok(Err(e)) => Err(StoreError::backend_from(
                format!("{what}: {}", crate::destinations::client::describe(&e)),
                e,
            )),
            Err(_) => Err(StoreError::backend(format!(
                "{what}: no answer within {}s",
                self.timeout.as_secs()
            ))),
        }
    }

    /// Publishes `log` for every replica.
    pub async fn publish(&self, log: PublishedLog) -> Result<(), StoreError> {
        let obj = to_object(&log)?;
        let what = format!("create dispatchlogrequest {}", log.request.id);
        self.call(&what, self.api.create(&PostParams::default(), &obj))
            .await?;
        upsert(&self.by_id, &self.changed, log);
        Ok(())
    }

    /// Deletes request `id` (served, given up, or stale); absent is fine.
    pub async fn withdraw(&self, id: &str) -> Result<(), StoreError> {
        remove(&self.by_id, &self.changed, id);
        let name = object_name(id);
        let what = format!("delete dispatchlogrequest {id}");
        match self
            .call(&what, self.api.delete(&name, &DeleteParams::default()))
            .await
        {
            Ok(_) | Err(StoreError::NotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The ids of the requests created longer than `older_than` ago by the API server's clock
    /// (as of `now`).
    pub fn stale(&self, older_than: Duration, now: Timestamp) -> Vec<String> {
        stale_in(&self.read(), older_than, now)
    }

    /// Deletes every request older than [`STALE_AFTER`] (an owner that died before withdrawing
    /// it, a delete that failed); returns how many.
    pub async fn sweep(&self) -> usize {
        let mut removed = 0;
        for id in self.stale(STALE_AFTER, Timestamp::now()) {
            match self.withdraw(&id).await {
                Ok(()) => removed += 1,
                Err(e) => {
                    tracing::warn!(id, error = %e, "a stale log request could not be deleted")
                }
            }
        }
        removed
    }
}

fn stale_in(
    map: &HashMap<String, PublishedLog>,
    older_than: Duration,
    now: Timestamp,
) -> Vec<String> {
    map.values()
        .filter(|p| {
            p.created
                .is_some_and(|c| c < now && now.duration_since(c).unsigned_abs() >= older_than)
        })
        .map(|p| p.request.id.clone())
        .collect()
}

fn upsert(
    by_id: &RwLock<HashMap<String, PublishedLog>>,
    changed: &watch::Sender<u64>,
    log: PublishedLog,
) {
    let mut map = by_id.write().unwrap_or_else(|e| e.into_inner());
    let id = log.request.id.clone();
    // The publishing side has no creation time yet: keep the API server's once known.
    let created = log.created.or_else(|| map.get(&id).and_then(|p| p.created));
    if map.get(&id).is_some_and(|p| *p == log) {
        return;
    }
    map.insert(id, PublishedLog { created, ..log });
    changed.send_modify(|n| *n = n.wrapping_add(1));
}

fn remove(by_id: &RwLock<HashMap<String, PublishedLog>>, changed: &watch::Sender<u64>, id: &str) {
    let mut map = by_id.write().unwrap_or_else(|e| e.into_inner());
    if map.remove(id).is_some() {
        changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

fn parsed(obj: DynamicObject) -> Option<PublishedLog> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    from_object(obj)
        .map_err(|e| {
            tracing::warn!(dispatchlogrequest = %name, error = %e,
                           "ignoring a malformed DispatchLogRequest; delete it")
        })
        .ok()
}

async fn informer(
    api: Api<DynamicObject>,
    namespace: String,
    by_id: Arc<RwLock<HashMap<String, PublishedLog>>>,
    changed: watch::Sender<u64>,
) {
    let watched = Watched {
        destination: "store".into(),
        resource: PLURAL.into(),
        namespace: Some(namespace),
    };
    // A 410 or a stall lists again (`crate::watch`), and says so in its own line.
    let mut stream = watches::watch(api, None, watched);
    let mut relist: Option<HashMap<String, PublishedLog>> = None;
    let mut failing = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Init) => relist = Some(HashMap::new()),
            Ok(Event::InitApply(obj)) => {
                if let (Some(list), Some(log)) = (relist.as_mut(), parsed(obj)) {
                    list.insert(log.request.id.clone(), log);
                }
            }
            Ok(Event::InitDone) => {
                let all = relist.take().unwrap_or_default();
                *by_id.write().unwrap_or_else(|e| e.into_inner()) = all;
                changed.send_modify(|n| *n = n.wrapping_add(1));
                failing = false;
            }
            Ok(Event::Apply(obj)) => {
                if let Some(log) = parsed(obj) {
                    upsert(&by_id, &changed, log);
                }
            }
            Ok(Event::Delete(obj)) => {
                if let Some(log) = parsed(obj) {
                    remove(&by_id, &changed, &log.request.id);
                }
            }
            // A 410 or a stall logged its own line.
            Err(e) if e.relists() => {}
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e,
                                   "dispatchlogrequest watch failing (is the CRD installed and the server allowed to list dispatchlogrequests?)");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(id: &str) -> PublishedLog {
        PublishedLog {
            destination: "edge".into(),
            request: LogRequest {
                id: id.into(),
                namespace: "verify".into(),
                job: "j".into(),
                container: Some("check".into()),
                follow: true,
            },
            owner: "10.1.2.3:8443".parse().unwrap(),
            created: None,
        }
    }

    const ID: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn requests_round_trip_and_malformed_ones_are_refused() {
        let obj = to_object(&log(ID)).unwrap();
        assert_eq!(
            obj.metadata.name.as_deref(),
            Some("logs-0123456789abcdef0123456789abcdef")
        );
        assert_eq!(from_object(obj.clone()).unwrap(), log(ID));
        for (field, value) in [
            ("owner", json!("rollouts-dispatch.example:8443")),
            ("owner", json!("10.1.2.3")),
            ("id", json!("../../x")),
            ("id", json!("0123456789ABCDEF0123456789ABCDEF")),
        ] {
            let mut bad = obj.clone();
            bad.data["spec"][field] = value;
            assert!(from_object(bad).is_err(), "{field}");
        }
        let mut renamed = obj;
        renamed.metadata.name = Some("logs-ffffffffffffffffffffffffffffffff".into());
        assert!(from_object(renamed).is_err(), "a name that is not its id");
    }

    #[test]
    fn the_crd_declares_every_field_and_the_chart_ships_it() {
        let crd: serde_json::Value = serde_saphyr::from_str(include_str!(
            "../../../config/crds/dispatchlogrequests.yaml"
        ))
        .unwrap();
        let declared = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["spec"]["properties"];
        let value = serde_json::to_value(&to_object(&log(ID)).unwrap().data["spec"]).unwrap();
        for field in value.as_object().unwrap().keys() {
            assert!(
                declared.get(field).is_some(),
                "spec.{field} is not in the CRD"
            );
        }
        assert_eq!(crd["spec"]["names"]["plural"], PLURAL);
        assert_eq!(
            crd,
            serde_saphyr::from_str::<serde_json::Value>(include_str!(
                "../../../charts/rollouts-dispatch/files/crds/dispatchlogrequests.yaml"
            ))
            .unwrap(),
            "the chart ships the same CRD as config/crds"
        );
    }

    #[test]
    fn only_requests_older_than_the_bound_are_stale() {
        let map = RwLock::new(HashMap::new());
        let tx = watch::channel(0).0;
        let now = Timestamp::now();
        let mut old = log(ID);
        old.created = Some(now - Duration::from_secs(300));
        let mut fresh = log("ffffffffffffffffffffffffffffffff");
        fresh.created = Some(now - Duration::from_secs(5));
        upsert(&map, &tx, old);
        upsert(&map, &tx, fresh);
        upsert(&map, &tx, log("00000000000000000000000000000000"));
        assert_eq!(
            stale_in(&map.read().unwrap(), STALE_AFTER, now),
            vec![ID.to_string()],
            "the one without a creation time is not stale: the informer fills it in"
        );
    }
}
