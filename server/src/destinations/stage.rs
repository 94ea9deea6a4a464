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

/// Why the destinations of a run's Stage cannot be found. Each message names the object to
/// look at and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The run carries no Stage: Kargo did not create it.
    #[error(
        "AnalysisRun {namespace}/{run} has no {KARGO_STAGE} label: only runs that Kargo creates \
         for Stage verification can use `destination: stage`; name the destination instead"
    )]
    NotKargo {
        /// the run's namespace
        namespace: String,
        /// the run
        run: String,
    },
    /// The Stage cannot be read.
    #[error("cannot read Stage {namespace}/{stage}: {source}")]
    ReadStage {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// the API error or timeout
        #[source]
        source: ReadError,
    },
    /// The Stage is gone.
    #[error("Stage {namespace}/{stage} does not exist")]
    NoStage {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// The Stage's last promotion updated no Argo CD Application.
    #[error(
        "Stage {namespace}/{stage} has no {ARGOCD_CONTEXT} annotation: its last promotion \
         updated no Argo CD Application (use the argocd-update step), or name the destination \
         instead"
    )]
    NoContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// The annotation is not the JSON list Kargo writes.
    #[error(
        "Stage {namespace}/{stage}: annotation {ARGOCD_CONTEXT} is not a JSON list of \
         {{name, namespace}}: {source}"
    )]
    BadContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// the JSON error
        #[source]
        source: serde_json::Error,
    },
    /// The annotation is an empty list.
    #[error("Stage {namespace}/{stage}: annotation {ARGOCD_CONTEXT} lists no Application")]
    EmptyContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// An entry of the annotation has no Application name.
    #[error("Stage {namespace}/{stage}: an entry of {ARGOCD_CONTEXT} has no name")]
    UnnamedApplication {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// An Application cannot be read.
    #[error("cannot read Application {application}: {source}")]
    ReadApplication {
        /// `namespace/name`
        application: String,
        /// the API error or timeout
        #[source]
        source: ReadError,
    },
    /// An Application the Stage names is gone.
    #[error("Application {application} (from Stage {stage}) does not exist")]
    NoApplication {
        /// `namespace/name`
        application: String,
        /// the Stage
        stage: String,
    },
    /// `spec.destination` names a server and a cluster.
    #[error(
        "Application {application}: spec.destination has both server and name (Argo CD rejects \
         that too)"
    )]
    ServerAndName {
        /// `namespace/name`
        application: String,
    },
    /// `spec.destination` names no server and no cluster.
    #[error("Application {application}: spec.destination has neither server nor name")]
    NoServerNorName {
        /// `namespace/name`
        application: String,
    },
    /// The Application deploys to the local cluster, which is not a destination here.
    #[error(
        "Application {application} deploys to {IN_CLUSTER_SERVER}, but the implicit \
         {IN_CLUSTER_NAME} destination is disabled (argocd.inCluster) and no cluster Secret has \
         that server"
    )]
    InClusterDisabled {
        /// `namespace/name`
        application: String,
    },
    /// No destination has the Application's server.
    #[error(
        "Application {application} deploys to server {server}, and no Argo CD cluster Secret \
         (or configured destination) has that server; register the cluster in Argo CD"
    )]
    UnknownServer {
        /// `namespace/name`
        application: String,
        /// the server URL
        server: String,
    },
    /// No destination has the Application's cluster name.
    #[error(
        "Application {application} deploys to cluster {cluster:?}, and there is no destination \
         with that name (there are no clusters with this name)"
    )]
    UnknownCluster {
        /// `namespace/name`
        application: String,
        /// the cluster name
        cluster: String,
    },
}

/// Why an object could not be read from the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The API server answered with an error, or could not be reached.
    #[error("{}", super::client::describe(.0))]
    Api(#[source] kube::Error),
    /// No answer within the request timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

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
) -> Result<Vec<String>, StageError> {
    let stage = run.kargo_stage().ok_or_else(|| StageError::NotKargo {
        namespace: run.namespace.clone(),
        run: run.name.clone(),
    })?;
    // The Stage's namespace and name, for the errors below.
    let at = || (run.namespace.clone(), stage.to_string());
    let stages: Api<DynamicObject> =
        Api::namespaced_with(control_plane.clone(), &run.namespace, &stage_resource());
    let obj = get(&stages, stage, timeout)
        .await
        .map_err(|source| {
            let (namespace, stage) = at();
            StageError::ReadStage {
                namespace,
                stage,
                source,
            }
        })?
        .ok_or_else(|| {
            let (namespace, stage) = at();
            StageError::NoStage { namespace, stage }
        })?;
    let context = obj
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ARGOCD_CONTEXT))
        .ok_or_else(|| {
            let (namespace, stage) = at();
            StageError::NoContext { namespace, stage }
        })?;
    let apps: Vec<AppRef> = serde_json::from_str(context).map_err(|source| {
        let (namespace, stage) = at();
        StageError::BadContext {
            namespace,
            stage,
            source,
        }
    })?;
    if apps.is_empty() {
        let (namespace, stage) = at();
        return Err(StageError::EmptyContext { namespace, stage });
    }
    let mut names: Vec<String> = Vec::new();
    for app in apps {
        let app_name = app.name.filter(|n| !n.is_empty()).ok_or_else(|| {
            let (namespace, stage) = at();
            StageError::UnnamedApplication { namespace, stage }
        })?;
        let app_ns = app
            .namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| argocd_namespace.to_string());
        let api: Api<DynamicObject> =
            Api::namespaced_with(control_plane.clone(), &app_ns, &application_resource());
        let obj = get(&api, &app_name, timeout)
            .await
            .map_err(|source| StageError::ReadApplication {
                application: format!("{app_ns}/{app_name}"),
                source,
            })?
            .ok_or_else(|| StageError::NoApplication {
                application: format!("{app_ns}/{app_name}"),
                stage: stage.to_string(),
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
) -> Result<Option<DynamicObject>, ReadError> {
    match tokio::time::timeout(timeout, api.get_opt(name)).await {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(ReadError::Api(e)),
        Err(_) => Err(ReadError::Timeout(timeout)),
    }
}

/// Maps an Application's `spec.destination` to a registered destination name.
pub fn destination_of(
    registry: &Registry,
    app: &Value,
    app_ref: &str,
) -> Result<String, StageError> {
    let application = app_ref.to_string();
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
        (Some(_), Some(_)) => Err(StageError::ServerAndName { application }),
        (None, None) => Err(StageError::NoServerNorName { application }),
        (Some(server), None) => {
            let server = server.trim_end_matches('/');
            let found = registry.by_server(server);
            match found.first() {
                Some(e) => Ok(e.name().to_string()),
                None if server == IN_CLUSTER_SERVER => {
                    Err(StageError::InClusterDisabled { application })
                }
                None => Err(StageError::UnknownServer {
                    application,
                    server: server.to_string(),
                }),
            }
        }
        (None, Some(name)) => match registry.get(name) {
            Some(Entry::Ready(_) | Entry::Broken(_) | Entry::Agent(_)) => Ok(name.to_string()),
            None => Err(StageError::UnknownCluster {
                application,
                cluster: name.to_string(),
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EngineSettings;
    use crate::destinations::client::AccessError;
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
                namespaces: None,
                server: server.into(),
                source,
                fingerprint: 0,
                config: Err(AccessError::ExecWithoutCommand.into()),
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
            let e = destination_of(&r, &app(d), "argocd/a")
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle) && e.contains("argocd/a"), "{e}");
        }
    }
}
