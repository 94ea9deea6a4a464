//! Reading an Argo CD Application and asking Argo CD to sync it, with one destination's kube
//! client: the server does it on a direct destination, the agent on its own cluster
//! (`agent/sync.rs`), so both write the same patch.
//!
//! The sync is requested the way Argo CD's own API does it (argo-cd v3.6.1
//! `server/application/application.go:2177-2190` builds an `Operation{Sync, InitiatedBy}`,
//! `util/argo/argo.go:1002-1026` `SetAppOperation` writes it): refuse when an operation is
//! already set (argo.go:1009-1011, `ErrAnotherOperationInProgress`), else set `operation` and
//! clear `status.operationState` (argo.go:1012-1013; the CRD has no status subresource,
//! `manifests/crds/application-crd.yaml:7229`), so that a reader never takes the previous sync's
//! `Succeeded` for this one. We write it as one JSON merge patch carrying the resourceVersion we
//! read (a concurrent writer makes it fail with 409 instead of being overwritten), plus the
//! refresh annotation `argocd.argoproj.io/refresh: normal|hard`
//! (`pkg/apis/application/v1alpha1/application_annotations.go:4-6`, values `RefreshTypeNormal`,
//! `RefreshTypeHard`, types.go:543-544) and our `rollouts-dispatch.io/sync-id`, which lets the
//! agent carry out each order once.
//!
//! On an agent destination the routes keep a record per Application instead (`records`).

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::StageRef;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

use crate::destinations::client;
use crate::observe::application_resource;

/// Our annotation on an Application: the id of the last sync we requested.
pub const ANN_SYNC_ID: &str = "rollouts-dispatch.io/sync-id";
/// Argo CD's refresh annotation (`AnnotationKeyRefresh`).
pub const ANN_REFRESH: &str = "argocd.argoproj.io/refresh";
/// The prefix of `operation.initiatedBy.username` of our syncs, as Argo CD shows it in the UI
/// and history: [`initiated_by`] adds the caller's `<project>/<stage>`.
pub const INITIATED_BY: &str = "rollouts-dispatch";
/// The `operation.info` names of our syncs: who asked, and which order it was.
pub const INFO_PROJECT: &str = "rollouts-dispatch.io/project";
/// …
pub const INFO_STAGE: &str = "rollouts-dispatch.io/stage";
/// …
pub const INFO_SYNC_ID: &str = "rollouts-dispatch.io/sync-id";

/// `initiatedBy.username` of a sync asked by `stage`: `rollouts-dispatch:<project>/<stage>`.
/// Argo CD's `OperationInitiator` has only `username` and `automated`, and `Operation.info` is
/// a list of `{name, value}` (argo-cd `pkg/apis/application/v1alpha1/types.go:1346-1363,
/// 1474-1477` at 37ee0097), so the caller goes into both. `automated` stays unset, as for a
/// person's sync: Argo CD's sync windows then treat it as manual (`controller/sync.go:732`).
pub fn initiated_by(stage: &StageRef) -> String {
    format!("{INITIATED_BY}:{}/{}", stage.project, stage.stage)
}

/// Why an Application could not be read or its sync requested.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// there is no such Application
    #[error("Application {namespace}/{name} does not exist on destination {destination:?}")]
    NotFound {
        /// the destination
        destination: String,
        /// its namespace
        namespace: String,
        /// its name
        name: String,
    },
    /// a sync operation is running or requested already
    #[error(
        "Application {namespace}/{name} on destination {destination:?}: {why}; ask again once \
         it has finished (GET the Application: operation.phase)"
    )]
    Busy {
        /// the destination
        destination: String,
        /// its namespace
        namespace: String,
        /// its name
        name: String,
        /// what is running
        why: String,
    },
    /// the destination's API did not answer within the request timeout
    #[error(
        "{what} Application {namespace}/{name} on destination {destination:?}: no answer within \
         {}s (engine.requestTimeout)", .after.as_secs()
    )]
    TimedOut {
        /// `reading` or `patching`
        what: &'static str,
        /// the destination
        destination: String,
        /// its namespace
        namespace: String,
        /// its name
        name: String,
        /// the timeout
        after: std::time::Duration,
    },
    /// the destination's API refused or failed the call
    #[error("{what} Application {namespace}/{name} on destination {destination:?}: {detail}")]
    Api {
        /// `reading` or `patching`
        what: &'static str,
        /// the destination
        destination: String,
        /// its namespace
        namespace: String,
        /// its name
        name: String,
        /// the API's answer, described
        detail: String,
        /// the error
        #[source]
        source: kube::Error,
    },
}

/// Why Argo CD would refuse another operation now, if it would: an operation requested and not
/// picked up yet (`operation` set), or one running (`status.operationState.phase: Running`).
pub fn busy(app: &Value) -> Option<String> {
    if app.get("operation").is_some_and(|o| !o.is_null()) {
        return Some("a sync operation is already requested (`operation` is set)".into());
    }
    let phase = app
        .pointer("/status/operationState/phase")
        .and_then(Value::as_str)
        .unwrap_or_default();
    (phase == "Running" || phase == "Terminating").then(|| {
        format!(
            "a sync operation is {} (status.operationState.phase)",
            phase.to_lowercase()
        )
    })
}

/// The sync id we last wrote on `app`, if any.
pub fn sync_id_of(app: &Value) -> Option<&str> {
    app.pointer("/metadata/annotations")
        .and_then(|a| a.get(ANN_SYNC_ID))
        .and_then(Value::as_str)
}

/// The merge patch requesting `order`, asked by `stage`, on Application `app` as just read (its
/// `resourceVersion` guards the patch).
///
/// The operation carries the Application's own `spec.syncPolicy.syncOptions` and `retry`, as
/// Argo CD's API does for a sync it is asked for (argo-cd v3.2.6
/// server/application/application.go:2035-2046, :2087-2089) and its automated sync does
/// (controller/appcontroller.go:2147-2161): the controller reads them from the operation only,
/// so without them `CreateNamespace=true` or `ServerSideApply=true` would not apply to our sync.
/// Nothing else of the spec is copied: the source and revisions are the controller's to resolve.
pub fn sync_patch(order: &SyncOrder, stage: &StageRef, app: &Value) -> Value {
    let mut sync = json!({});
    if let Some(rev) = &order.revision {
        sync["revision"] = json!(rev);
    }
    let policy = app.pointer("/spec/syncPolicy");
    if let Some(options) = policy
        .and_then(|p| p.get("syncOptions"))
        .filter(|o| o.is_array())
    {
        sync["syncOptions"] = options.clone();
    }
    let mut metadata = json!({"annotations": {
        ANN_REFRESH: order.refresh,
        ANN_SYNC_ID: order.id,
    }});
    if let Some(rv) = app
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
    {
        metadata["resourceVersion"] = json!(rv);
    }
    let mut operation = json!({
        "sync": sync,
        "initiatedBy": {"username": initiated_by(stage)},
        "info": [
            {"name": "Reason", "value": format!(
                "Kargo Stage {} of project {} asked rollouts-dispatch to sync it",
                stage.stage, stage.project)},
            {"name": INFO_PROJECT, "value": stage.project},
            {"name": INFO_STAGE, "value": stage.stage},
            {"name": INFO_SYNC_ID, "value": order.id},
        ],
    });
    if let Some(retry) = policy
        .and_then(|p| p.get("retry"))
        .filter(|r| r.is_object())
    {
        operation["retry"] = retry.clone();
    }
    json!({
        "metadata": metadata,
        "operation": operation,
        "status": {"operationState": null},
    })
}

/// One Application on one destination.
pub struct AppTarget<'a> {
    /// the destination's client
    pub client: &'a kube::Client,
    /// the destination's name (messages)
    pub destination: &'a str,
    /// its namespace
    pub namespace: &'a str,
    /// its name
    pub name: &'a str,
    /// the longest a read or a patch may take (`engine.requestTimeout`): a destination that
    /// hangs must not hold the caller, nor its project's Application calls
    pub timeout: std::time::Duration,
}

impl AppTarget<'_> {
    fn api(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), self.namespace, &application_resource())
    }

    fn api_error(&self, what: &'static str, source: kube::Error) -> AppError {
        if let kube::Error::Api(s) = &source {
            if s.code == 404 {
                return self.not_found();
            }
            if s.code == 409 {
                return AppError::Busy {
                    destination: self.destination.to_string(),
                    namespace: self.namespace.to_string(),
                    name: self.name.to_string(),
                    why: "it changed while the sync was requested".into(),
                };
            }
        }
        AppError::Api {
            what,
            destination: self.destination.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            detail: client::describe(&source),
            source,
        }
    }

    fn timed_out(&self, what: &'static str) -> AppError {
        AppError::TimedOut {
            what,
            destination: self.destination.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            after: self.timeout,
        }
    }

    fn not_found(&self) -> AppError {
        AppError::NotFound {
            destination: self.destination.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
        }
    }

    /// The Application as JSON.
    pub async fn read(&self) -> Result<Value, AppError> {
        let app = tokio::time::timeout(self.timeout, self.api().get(self.name))
            .await
            .map_err(|_| self.timed_out("reading"))?
            .map_err(|e| self.api_error("reading", e))?;
        serde_json::to_value(app).map_err(|e| AppError::Api {
            what: "reading",
            destination: self.destination.to_string(),
            namespace: self.namespace.to_string(),
            name: self.name.to_string(),
            detail: e.to_string(),
            source: kube::Error::SerdeError(e),
        })
    }

    /// Requests `order`, asked by `stage`, on the Application `app` (as just read, and
    /// authorized for `stage`): refused when Argo CD is busy with another operation; returns
    /// the Application as patched.
    pub async fn request_sync(
        &self,
        app: &Value,
        order: &SyncOrder,
        stage: &StageRef,
    ) -> Result<Value, AppError> {
        if let Some(why) = busy(app) {
            return Err(AppError::Busy {
                destination: self.destination.to_string(),
                namespace: self.namespace.to_string(),
                name: self.name.to_string(),
                why,
            });
        }
        let patch = Patch::Merge(sync_patch(order, stage, app));
        let api = self.api();
        let patched = tokio::time::timeout(
            self.timeout,
            api.patch(self.name, &PatchParams::default(), &patch),
        )
        .await
        .map_err(|_| self.timed_out("patching"))?
        .map_err(|e| self.api_error("patching", e))?;
        tracing::info!(destination = self.destination, namespace = self.namespace,
                       application = self.name, sync_id = %order.id, revision = ?order.revision,
                       refresh = %order.refresh, project = %stage.project, stage = %stage.stage,
                       "requested a sync of the application");
        serde_json::to_value(patched)
            .map_err(|e| self.api_error("patching", kube::Error::SerdeError(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An order for revision `0123abc` with refresh `refresh`, asked by Stage team-a/prod.
    fn order_of(refresh: &str) -> (SyncOrder, StageRef) {
        let order = SyncOrder {
            id: "abc".into(),
            revision: Some("0123abc".into()),
            refresh: refresh.into(),
        };
        let stage = StageRef {
            project: "team-a".into(),
            stage: "prod".into(),
        };
        (order, stage)
    }

    #[test]
    fn the_patch_is_argo_cds_operation_with_refresh_and_our_id() {
        let (order, stage) = order_of("hard");
        let p = sync_patch(
            &order,
            &stage,
            &json!({"metadata": {"resourceVersion": "42"}}),
        );
        assert_eq!(p["operation"]["sync"]["revision"], "0123abc");
        assert_eq!(
            p["operation"]["initiatedBy"]["username"],
            "rollouts-dispatch:team-a/prod"
        );
        let info = |name: &str| {
            p["operation"]["info"]
                .as_array()
                .and_then(|l| l.iter().find(|i| i["name"] == name))
                .map(|i| i["value"].clone())
        };
        assert_eq!(info(INFO_PROJECT), Some(json!("team-a")));
        assert_eq!(info(INFO_STAGE), Some(json!("prod")));
        assert_eq!(info(INFO_SYNC_ID), Some(json!("abc")));
        assert!(info("Reason").is_some_and(|r| r.as_str().is_some_and(|r| r.contains("prod"))));
        assert_eq!(p["metadata"]["annotations"][ANN_REFRESH], "hard");
        assert_eq!(p["metadata"]["annotations"][ANN_SYNC_ID], "abc");
        assert_eq!(p["metadata"]["resourceVersion"], "42");
        assert!(p["status"]["operationState"].is_null());
        let none = sync_patch(
            &SyncOrder {
                revision: None,
                ..order
            },
            &stage,
            &json!({}),
        );
        assert_eq!(none["operation"]["sync"], json!({}));
        assert!(none["operation"].get("retry").is_none());
        assert!(none["metadata"].get("resourceVersion").is_none());
    }

    /// The sync options and retry of the Application's policy go into the operation, where the
    /// controller reads them; nothing else of the spec does.
    #[test]
    fn the_operation_carries_the_applications_sync_options_and_retry() {
        let (order, stage) = order_of("normal");
        let app = json!({"spec": {
            "source": {"repoURL": "file:///repo", "path": "app"},
            "syncPolicy": {
                "automated": {"prune": true},
                "syncOptions": ["CreateNamespace=true", "ServerSideApply=true"],
                "retry": {"limit": 3, "backoff": {"duration": "5s"}},
            },
        }});
        let p = sync_patch(&order, &stage, &app);
        assert_eq!(
            p["operation"]["sync"]["syncOptions"],
            json!(["CreateNamespace=true", "ServerSideApply=true"])
        );
        assert_eq!(p["operation"]["retry"]["limit"], 3);
        assert_eq!(p["operation"]["sync"]["revision"], "0123abc");
        assert!(p["operation"]["sync"].get("source").is_none());
        assert!(p["operation"]["sync"].get("prune").is_none());
    }

    #[test]
    fn busy_when_an_operation_is_set_or_running() {
        assert!(busy(&json!({"status": {"operationState": {"phase": "Succeeded"}}})).is_none());
        let e = busy(&json!({"operation": {"sync": {}}})).unwrap();
        assert!(e.contains("already requested"), "{e}");
        let e = busy(&json!({"status": {"operationState": {"phase": "Running"}}})).unwrap();
        assert!(e.contains("running"), "{e}");
        assert_ne!(crate::store::random_id(), crate::store::random_id());
        assert_eq!(crate::store::random_id().len(), 32);
    }
}
