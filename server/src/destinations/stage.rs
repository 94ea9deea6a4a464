//! `destination: stage`: the clusters a Kargo Stage promoted to, read from Kargo and Argo CD.
//!
//! The run's Stage (`kargo.akuity.io/stage` annotation, else label) → its
//! `kargo.akuity.io/argocd-context` annotation (JSON list of `{name, namespace}` of the Argo CD
//! Applications of the last promotion) → each Application's `spec.destination` (`server` xor
//! `name`) → the destination registered from the matching Argo CD cluster Secret.

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use serde_json::Value;

use super::{Entry, Registry, IN_CLUSTER_NAME, IN_CLUSTER_SERVER};
use crate::job::{RunContext, KARGO_STAGE};

/// The Stage annotation with the Argo CD Applications of the last promotion.
pub const ARGOCD_CONTEXT: &str = "kargo.akuity.io/argocd-context";

#[derive(Debug, Deserialize)]
struct AppRef {
    name: Option<String>,
    namespace: Option<String>,
}

fn stage_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kargo.akuity.io", "v1alpha1", "Stage"),
        "stages",
    )
}

fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    )
}

/// The destination names of `run`'s Stage, in Application order, without duplicates.
/// `argocd_namespace` is where Applications without a namespace in the context live.
pub async fn resolve(
    control_plane: &kube::Client,
    run: &RunContext,
    argocd_namespace: &str,
    registry: &Registry,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let stage = run.kargo_stage().ok_or_else(|| {
        format!(
            "AnalysisRun {}/{} has no {KARGO_STAGE} label: only runs that Kargo creates for Stage \
             verification can use `destination: stage`; name the destination instead",
            run.namespace, run.name
        )
    })?;
    let stages: Api<DynamicObject> =
        Api::namespaced_with(control_plane.clone(), &run.namespace, &stage_resource());
    let obj = get(&stages, stage, timeout)
        .await
        .map_err(|e| format!("cannot read Stage {}/{stage}: {e}", run.namespace))?
        .ok_or_else(|| format!("Stage {}/{stage} does not exist", run.namespace))?;
    let context = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ARGOCD_CONTEXT))
        .ok_or_else(|| {
            format!(
                "Stage {}/{stage} has no {ARGOCD_CONTEXT} annotation: its last promotion updated no \
                 Argo CD Application (use the argocd-update step), or name the destination instead",
                run.namespace
            )
        })?;
    let apps: Vec<AppRef> = serde_json::from_str(context).map_err(|e| {
        format!(
            "Stage {}/{stage}: annotation {ARGOCD_CONTEXT} is not a JSON list of {{name, namespace}}: {e}",
            run.namespace
        )
    })?;
    if apps.is_empty() {
        return Err(format!(
            "Stage {}/{stage}: annotation {ARGOCD_CONTEXT} lists no Application",
            run.namespace
        ));
    }
    let mut names: Vec<String> = Vec::new();
    for app in apps {
        let app_name = app.name.filter(|n| !n.is_empty()).ok_or_else(|| {
            format!(
                "Stage {}/{stage}: an entry of {ARGOCD_CONTEXT} has no name",
                run.namespace
            )
        })?;
        let app_ns = app
            .namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| argocd_namespace.to_string());
        let api: Api<DynamicObject> =
            Api::namespaced_with(control_plane.clone(), &app_ns, &application_resource());
        let obj = get(&api, &app_name, timeout)
            .await
            .map_err(|e| format!("cannot read Application {app_ns}/{app_name}: {e}"))?
            .ok_or_else(|| {
                format!("Application {app_ns}/{app_name} (from Stage {stage}) does not exist")
            })?;
        let name = destination_of(registry, &obj.data, &format!("{app_ns}/{app_name}"))?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

async fn get(
    api: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
) -> Result<Option<DynamicObject>, String> {
    match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(super::client::describe(&e)),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Maps an Application's `spec.destination` to a registered destination name.
pub fn destination_of(registry: &Registry, app: &Value, app_ref: &str) -> Result<String, String> {
    let dest = app.pointer("/spec/destination").unwrap_or(&Value::Null);
    let server = dest
        .get("server")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    let name = dest
        .get("name")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    match (server, name) {
        (Some(_), Some(_)) => Err(format!(
            "Application {app_ref}: spec.destination has both server and name (Argo CD rejects that too)"
        )),
        (None, None) => Err(format!(
            "Application {app_ref}: spec.destination has neither server nor name"
        )),
        (Some(server), None) => {
            let server = server.trim_end_matches('/');
            let found = registry.by_server(server);
            match found.first() {
                Some(e) => Ok(e.name().to_string()),
                None if server == IN_CLUSTER_SERVER => Err(format!(
                    "Application {app_ref} deploys to {IN_CLUSTER_SERVER}, but the implicit {IN_CLUSTER_NAME} \
                     destination is disabled (argocd.inCluster) and no cluster Secret has that server"
                )),
                None => Err(format!(
                    "Application {app_ref} deploys to server {server}, and no Argo CD cluster Secret \
                     (or configured destination) has that server; register the cluster in Argo CD"
                )),
            }
        }
        (None, Some(name)) => match registry.get(name) {
            Some(Entry::Ready(_) | Entry::Broken(_) | Entry::Agent(_)) => Ok(name.to_string()),
            None => Err(format!(
                "Application {app_ref} deploys to cluster {name:?}, and there is no destination \
                 with that name (there are no clusters with this name)"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineSettings;
    use crate::destinations::{DestinationSpec, Source};
    use serde_json::json;
    use std::collections::BTreeMap;

    fn registry() -> Registry {
        let r = Registry::new(EngineSettings::default(), false);
        for (name, server, source) in [
            (
                "prod",
                "https://10.0.0.1:6443",
                Source::ArgoCd {
                    namespace: "argocd".into(),
                    secret: "s".into(),
                },
            ),
            (
                "static-prod",
                "https://10.0.0.1:6443",
                Source::Config { index: 0 },
            ),
        ] {
            r.insert(DestinationSpec {
                name: name.into(),
                labels: BTreeMap::new(),
                namespace: "default".into(),
                server: server.into(),
                source,
                fingerprint: 0,
                config: Err("offline".into()),
            });
        }
        r
    }

    #[tokio::test]
    async fn applications_map_to_destinations() {
        let r = registry();
        let app = |d: Value| json!({"spec": {"destination": d}});
        // The Argo CD cluster Secret wins over a configured destination with the same server.
        assert_eq!(
            destination_of(
                &r,
                &app(json!({"server": "https://10.0.0.1:6443/"})),
                "argocd/a"
            )
            .unwrap(),
            "prod"
        );
        assert_eq!(
            destination_of(&r, &app(json!({"name": "prod"})), "argocd/a").unwrap(),
            "prod"
        );
        for (d, needle) in [
            (
                json!({"server": "https://x", "name": "prod"}),
                "both server and name",
            ),
            (json!({}), "neither"),
            (
                json!({"server": "https://elsewhere"}),
                "no Argo CD cluster Secret",
            ),
            (json!({"name": "nope"}), "no destination with that name"),
            (json!({"server": IN_CLUSTER_SERVER}), "argocd.inCluster"),
        ] {
            let e = destination_of(&r, &app(d), "argocd/a").unwrap_err();
            assert!(e.contains(needle) && e.contains("argocd/a"), "{e}");
        }
    }
}
