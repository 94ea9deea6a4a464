//! An Argo CD Application's status, read into the [`ApplicationState`] of the API.
//!
//! Field names follow Argo CD v3.6.1 `pkg/apis/application/v1alpha1/types.go`:
//! `ApplicationStatus` (:1218), `SyncStatus` (:1950), `AppHealthStatus` (:1962),
//! `ResourceStatus` (:2237), `OperationState` (:1459), `SyncOperationResult.revision` (:1769),
//! and the requested `Operation` (:1356) in the Application's top-level `operation`.

use std::collections::BTreeMap;

use dispatch_api::observe::{
    ApplicationCheck, HealthState, OperationState, ResourceHealth, SyncState,
};
use dispatch_api::DestState;
use serde_json::Value;

use super::rollout::Judged;
use super::ApplicationState;

/// Note: the revision the Application is synced to (`status.sync.revision`).
pub const NOTE_REVISION: &str = "revision";
/// Note: the Application's health (`status.health.status`).
pub const NOTE_HEALTH: &str = "health";

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

/// Whether `actual` (a full revision) is the `expected` one: equal, or `expected` is a prefix of
/// at least 7 hex characters (a short commit SHA).
pub fn revision_matches(expected: &str, actual: &str) -> bool {
    actual == expected
        || (expected.len() >= 7
            && expected.bytes().all(|b| b.is_ascii_hexdigit())
            && actual.starts_with(expected))
}

/// Judges Application `object` (`namespace/name`; `state` `None`: not found) against `check`:
/// Successful when Synced (to `revision`, if given), Healthy and no operation runs or is
/// requested; Failed when Degraded (naming the unhealthy resources) or the last sync operation
/// of that revision failed; Running otherwise, saying why.
pub fn judge(check: &ApplicationCheck, object: &str, state: Option<&ApplicationState>) -> Judged {
    let mut notes = BTreeMap::new();
    let Some(s) = state else {
        return Judged {
            state: DestState::Running(Some(format!("application {object} not found"))),
            notes,
        };
    };
    if !s.sync.revision.is_empty() {
        notes.insert(NOTE_REVISION.to_string(), s.sync.revision.clone());
    }
    if !s.health.status.is_empty() {
        notes.insert(NOTE_HEALTH.to_string(), s.health.status.clone());
    }
    Judged {
        state: judge_state(check, object, s),
        notes,
    }
}

fn judge_state(check: &ApplicationCheck, object: &str, s: &ApplicationState) -> DestState {
    let running = |why: String| DestState::Running(Some(format!("application {object} {why}")));
    if s.health.status == "Degraded" {
        let resources: Vec<String> = s
            .unhealthy
            .iter()
            .map(|r| {
                let mut line = format!("{} {} {}", r.kind, r.object, r.health.status);
                if !r.health.message.is_empty() {
                    line.push_str(&format!(": {}", r.health.message));
                }
                line
            })
            .collect();
        let mut detail = format!("application {object} is Degraded");
        if !s.health.message.is_empty() {
            detail.push_str(&format!(": {}", s.health.message));
        }
        if !resources.is_empty() {
            detail.push_str(&format!("; {}", resources.join("; ")));
        }
        return DestState::Failed {
            reason: "Degraded".into(),
            detail,
            log: None,
        };
    }
    if let Some(op) = &s.operation {
        let of_revision = match &check.revision {
            Some(rev) => op.revision.is_empty() || revision_matches(rev, &op.revision),
            None => true,
        };
        if of_revision && matches!(op.phase.as_str(), "Failed" | "Error") {
            return DestState::Failed {
                reason: format!("Sync{}", op.phase),
                detail: format!(
                    "application {object}: the sync operation {}: {}",
                    op.phase.to_lowercase(),
                    op.message
                ),
                log: None,
            };
        }
        if matches!(op.phase.as_str(), "Running" | "Terminating") {
            return running(format!("is syncing ({}: {})", op.phase, op.message));
        }
    }
    if s.sync_requested {
        return running("has a sync requested that Argo CD has not started yet".into());
    }
    if s.sync.status.is_empty() && s.health.status.is_empty() {
        return running("has not been reconciled by Argo CD yet".into());
    }
    if let Some(rev) = &check.revision {
        if !revision_matches(rev, &s.sync.revision) {
            return running(format!(
                "is at revision {:?}, not yet {rev}",
                s.sync.revision
            ));
        }
    }
    if s.sync.status != "Synced" {
        return running(format!("is {}", or_unknown(&s.sync.status)));
    }
    if s.health.status != "Healthy" {
        let mut why = format!("is {}", or_unknown(&s.health.status));
        if !s.health.message.is_empty() {
            why.push_str(&format!(": {}", s.health.message));
        }
        return running(why);
    }
    DestState::Succeeded
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() {
        "Unknown"
    } else {
        s
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

    fn check(revision: Option<&str>) -> ApplicationCheck {
        ApplicationCheck {
            name: "web".into(),
            namespace: "argocd".into(),
            revision: revision.map(String::from),
        }
    }

    fn app(sync: &str, revision: &str, health: &str) -> Value {
        json!({
            "metadata": {"name": "web", "namespace": "argocd"},
            "status": {"sync": {"status": sync, "revision": revision},
                       "health": {"status": health},
                       "operationState": {"phase": "Succeeded", "message": "successfully synced",
                                          "syncResult": {"revision": revision}}}
        })
    }

    fn judged(c: &ApplicationCheck, v: &Value) -> DestState {
        judge(c, "argocd/web", Some(&state_of("edge", v))).state
    }

    #[test]
    fn synced_and_healthy_is_successful_at_the_revision_asked() {
        let sha = "0f3c9a1be5d4c3b2a1908172635445362718293a";
        let v = app("Synced", sha, "Healthy");
        assert_eq!(judged(&check(None), &v), DestState::Succeeded);
        assert_eq!(judged(&check(Some(sha)), &v), DestState::Succeeded);
        assert_eq!(judged(&check(Some("0f3c9a1")), &v), DestState::Succeeded);
        // Too short a prefix, or another revision: still waiting.
        for other in ["0f3c9a", "1234567"] {
            let s = judged(&check(Some(other)), &v);
            assert!(
                matches!(&s, DestState::Running(Some(w)) if w.contains("not yet")),
                "{s:?}"
            );
        }
        let j = judge(&check(None), "argocd/web", Some(&state_of("edge", &v)));
        assert_eq!(j.notes[NOTE_REVISION], sha);
        assert_eq!(j.notes[NOTE_HEALTH], "Healthy");
    }

    #[test]
    fn degraded_names_the_resources_and_a_failed_sync_its_message() {
        let mut v = app("Synced", "abc", "Degraded");
        v["status"]["resources"] = json!([{"kind": "Deployment", "namespace": "shop", "name": "web",
            "health": {"status": "Degraded", "message": "exceeded its progress deadline"}}]);
        let s = judged(&check(None), &v);
        let DestState::Failed { detail, .. } = &s else {
            panic!("{s:?}")
        };
        assert!(
            detail.contains("Deployment shop/web Degraded: exceeded its progress deadline"),
            "{detail}"
        );
        let mut v = app("OutOfSync", "abc", "Healthy");
        v["status"]["operationState"] = json!({"phase": "Failed", "message": "one or more objects failed to apply",
                                               "syncResult": {"revision": "abc"}});
        let s = judged(&check(None), &v);
        assert!(
            matches!(&s, DestState::Failed { reason, detail, .. }
            if reason == "SyncFailed" && detail.contains("failed to apply")),
            "{s:?}"
        );
        // A failed sync of another revision is not this one's verdict.
        let s = judged(&check(Some("def")), &v);
        assert!(matches!(s, DestState::Running(_)), "{s:?}");
    }

    #[test]
    fn progressing_out_of_sync_syncing_and_missing_are_running() {
        let s = judged(&check(None), &app("Synced", "abc", "Progressing"));
        assert!(
            matches!(&s, DestState::Running(Some(w)) if w.contains("Progressing")),
            "{s:?}"
        );
        let s = judged(&check(None), &app("OutOfSync", "abc", "Healthy"));
        assert!(
            matches!(&s, DestState::Running(Some(w)) if w.contains("OutOfSync")),
            "{s:?}"
        );
        let mut v = app("Synced", "abc", "Healthy");
        v["status"]["operationState"]["phase"] = json!("Running");
        assert!(matches!(judged(&check(None), &v), DestState::Running(_)));
        let mut v = app("Synced", "abc", "Healthy");
        v["operation"] = json!({"sync": {"revision": "abc"}});
        assert!(matches!(judged(&check(None), &v), DestState::Running(_)));
        assert_eq!(
            judge(&check(None), "argocd/web", None).state,
            DestState::Running(Some("application argocd/web not found".into()))
        );
    }
}
