//! An Argo CD Application's status, read into the [`ApplicationState`] of the API.
//!
//! Field names follow Argo CD v3.6.1 `pkg/apis/application/v1alpha1/types.go`:
//! `ApplicationStatus` (:1218), `SyncStatus` (:1950), `AppHealthStatus` (:1962),
//! `ResourceStatus` (:2237), `OperationState` (:1459), `SyncOperationResult.revision` (:1769),
//! and the requested `Operation` (:1356) in the Application's top-level `operation`.

use dispatch_api::observe::{HealthState, OperationState, ResourceHealth, SyncState};
use serde_json::Value;

use super::ApplicationState;

pub use dispatch_api::observe::MAX_UNHEALTHY;

/// Reads `app` (the whole Application object as JSON) on `destination`.
pub fn state_of(destination: &str, app: &Value) -> ApplicationState {
    let text = |v: &Value, pointer: &str| {
        v.pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let health = |v: &Value| HealthState {
        status: text(v, "/status"),
        message: text(v, "/message"),
    };
    let status = &app["status"];
    let operation = status
        .get("operationState")
        .filter(|o| o.is_object())
        .map(|o| OperationState {
            phase: text(o, "/phase"),
            message: text(o, "/message"),
            revision: text(o, "/syncResult/revision"),
            finished_at: o
                .get("finishedAt")
                .and_then(Value::as_str)
                .map(String::from),
        });
    let unhealthy = status["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let h = health(r.get("health")?);
            (!h.status.is_empty() && h.status != "Healthy").then(|| {
                let name = text(r, "/name");
                let namespace = text(r, "/namespace");
                ResourceHealth {
                    kind: text(r, "/kind"),
                    object: if namespace.is_empty() {
                        name
                    } else {
                        format!("{namespace}/{name}")
                    },
                    health: h,
                }
            })
        })
        .take(MAX_UNHEALTHY)
        .collect();
    ApplicationState {
        destination: destination.to_string(),
        namespace: text(app, "/metadata/namespace"),
        name: text(app, "/metadata/name"),
        sync: SyncState {
            status: text(status, "/sync/status"),
            revision: text(status, "/sync/revision"),
        },
        health: health(&status["health"]),
        operation,
        sync_requested: app.get("operation").is_some_and(Value::is_object),
        unhealthy,
        reconciled_at: status
            .get("reconciledAt")
            .and_then(Value::as_str)
            .map(String::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_degraded_application_names_its_unhealthy_resources() {
        let app = json!({
            "metadata": {"name": "web", "namespace": "argocd"},
            "operation": {"sync": {"revision": "abc"}},
            "status": {
                "sync": {"status": "Synced", "revision": "abc"},
                "health": {"status": "Degraded"},
                "reconciledAt": "2026-12-02T04:00:00Z",
                "operationState": {"phase": "Succeeded", "message": "successfully synced",
                                   "syncResult": {"revision": "abc"}},
                "resources": [
                    {"kind": "Service", "namespace": "shop", "name": "web", "health": {"status": "Healthy"}},
                    {"kind": "Deployment", "namespace": "shop", "name": "web",
                     "health": {"status": "Degraded", "message": "Deployment exceeded its progress deadline"}},
                    {"kind": "ConfigMap", "namespace": "shop", "name": "cfg"}
                ]
            }
        });
        let s = state_of("edge", &app);
        assert_eq!((s.namespace.as_str(), s.name.as_str()), ("argocd", "web"));
        assert_eq!(s.sync.status, "Synced");
        assert_eq!(s.health.status, "Degraded");
        assert!(s.sync_requested);
        assert_eq!(s.operation.as_ref().unwrap().revision, "abc");
        assert_eq!(s.unhealthy.len(), 1, "{:?}", s.unhealthy);
        assert_eq!(s.unhealthy[0].object, "shop/web");
        assert!(s.unhealthy[0].health.message.contains("progress deadline"));
    }

    #[test]
    fn an_application_argo_cd_has_not_looked_at_is_empty_not_an_error() {
        let s = state_of(
            "edge",
            &json!({"metadata": {"name": "web", "namespace": "argocd"}}),
        );
        assert_eq!(s.sync.status, "");
        assert!(s.operation.is_none() && !s.sync_requested && s.unhealthy.is_empty());
    }
}
