//! `destination: stage`: the clusters a Kargo Stage promoted to, read from Kargo and Argo CD.
//!
//! The run's Stage (`kargo.akuity.io/stage` annotation, else label), read on the control plane
//! → its shard (`spec.shard`, kargo api/v1alpha1/stage_types.go:216-221 at 1c76476) → the Argo
//! CD instance serving that shard ([`StageInstance`], `argocd[].shards`; none: refused, never
//! another instance) → the Stage's `kargo.akuity.io/argocd-context` annotation (JSON list of
//! `{name, namespace}` of the Argo CD Applications of the last promotion) → each Application,
//! read on the cluster that instance runs on → its `spec.destination` (`server` xor `name`) →
//! a destination of that instance's cluster Secrets, or a configured one ([`mapping`]).
//!
//! Kargo's webhook keeps label `kargo.akuity.io/shard` equal to `spec.shard`
//! (stage_types.go:216-220), and its sharded controllers pick the Stages they promote by that
//! label (pkg/controller/predicates.go:56): a Stage whose label and `spec.shard` differ is
//! refused rather than guessed at; a label without `spec.shard` (a Kargo before the field) is
//! the shard.

mod error;
mod mapping;

use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use serde_json::Value;

use crate::config::{Shards, DEFAULT_ARGOCD_INSTANCE};
use crate::job::RunContext;
pub use error::{ReadError, StageError};
pub use mapping::destination_of;

/// Kargo's label of a Stage's shard (kargo api/v1alpha1/labels.go:46).
pub const SHARD_LABEL: &str = "kargo.akuity.io/shard";

/// An Argo CD instance as `destination: stage` reads it.
#[derive(Clone)]
pub struct StageInstance {
    /// `argocd[].name`
    pub name: String,
    /// where the Applications a Stage names without a namespace live
    pub namespace: String,
    /// the shards whose Stages promote through it
    pub shards: Shards,
    /// it runs on the control plane: its `in-cluster` is the implicit one
    pub on_control_plane: bool,
    /// the destination of Applications on `https://kubernetes.default.svc` or `in-cluster`
    pub home: Home,
    /// how the cluster it runs on is read
    pub cluster: InstanceCluster,
}

/// How `destination: stage` reads the cluster an Argo CD instance runs on.
#[derive(Clone)]
pub enum InstanceCluster {
    /// with the control plane's client, given to [`resolve`]
    ControlPlane,
    /// with this client
    Client(kube::Client),
    /// not at all: its credentials cannot be used (the error); its Stages are refused, never
    /// read elsewhere
    Unusable(String),
}

impl std::fmt::Debug for StageInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageInstance")
            .field("name", &self.name)
            .field("shards", &self.shards)
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

impl StageInstance {
    /// Without `argocd` in the config: Applications in namespace `argocd` of the control plane,
    /// for every Stage, and no implicit `in-cluster` (as before topologies).
    pub fn unconfigured() -> Self {
        Self {
            name: DEFAULT_ARGOCD_INSTANCE.into(),
            namespace: "argocd".into(),
            shards: Shards::Every,
            on_control_plane: true,
            home: Home::InCluster,
            cluster: InstanceCluster::ControlPlane,
        }
    }

    /// `" (Argo CD instance NAME)"`, or nothing for the single-map form, for messages.
    fn shown(&self) -> String {
        if self.name == DEFAULT_ARGOCD_INSTANCE {
            String::new()
        } else {
            format!(" (Argo CD instance {})", self.name)
        }
    }

    /// The config key that turns its own cluster on, for messages.
    fn in_cluster_key(&self) -> String {
        if self.name == DEFAULT_ARGOCD_INSTANCE {
            "argocd.inCluster".into()
        } else {
            format!("argocd[].inCluster of instance {}", self.name)
        }
    }
}

/// Where an instance's Applications on its own cluster (`https://kubernetes.default.svc`,
/// `in-cluster`) run their Jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Home {
    /// the implicit `in-cluster` destination of the control plane, when registered
    InCluster,
    /// this destination: the instance's `destination`, or its name with `kubeconfig`
    Destination(String),
    /// none: `inCluster: false` off the control plane
    Disabled,
}

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

/// The destination names of `run`'s Stage, in Application order, without duplicates: the
/// Stage read on `control_plane`, its Applications on the cluster of the instance of
/// `instances` that serves its shard.
pub async fn resolve(
    control_plane: &kube::Client,
    instances: &[StageInstance],
    run: &RunContext,
    registry: &super::Registry,
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
    let instance = instance_of(&obj, instances, at)?;
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
    let client = match &instance.cluster {
        InstanceCluster::ControlPlane => control_plane,
        InstanceCluster::Client(c) => c,
        InstanceCluster::Unusable(error) => {
            return Err(StageError::InstanceUnusable {
                instance: instance.name.clone(),
                error: error.clone(),
            })
        }
    };
    let mut names: Vec<String> = Vec::new();
    for app in apps {
        let app_name = app.name.filter(|n| !n.is_empty()).ok_or_else(|| {
            let (namespace, stage) = at();
            StageError::UnnamedApplication { namespace, stage }
        })?;
        let app_ns = app
            .namespace
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| instance.namespace.clone());
        let application = format!("{app_ns}/{app_name}{}", instance.shown());
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &app_ns, &application_resource());
        let obj = get(&api, &app_name, timeout)
            .await
            .map_err(|source| StageError::ReadApplication {
                application: application.clone(),
                source,
            })?
            .ok_or_else(|| StageError::NoApplication {
                application: application.clone(),
                stage: stage.to_string(),
            })?;
        let name = destination_of(registry, &obj.data, &application, instance)?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// The instance serving the shard of Stage `obj`: `spec.shard` (checked against Kargo's label).
fn instance_of<'a>(
    obj: &DynamicObject,
    instances: &'a [StageInstance],
    at: impl Fn() -> (String, String),
) -> Result<&'a StageInstance, StageError> {
    let shard = match obj.data.pointer("/spec/shard") {
        None | Some(Value::Null) => "",
        Some(Value::String(s)) => s.as_str(),
        Some(_) => {
            let (namespace, stage) = at();
            return Err(StageError::BadShard { namespace, stage });
        }
    };
    let label = obj
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SHARD_LABEL))
        .map_or("", String::as_str);
    // A label without spec.shard: a Kargo that predates the field, whose controllers pick
    // Stages by the label alone.
    if !shard.is_empty() && !label.is_empty() && label != shard {
        let (namespace, stage) = at();
        return Err(StageError::ShardMismatch {
            namespace,
            stage,
            shard: shard.to_string(),
            label: label.to_string(),
        });
    }
    let shard = if shard.is_empty() { label } else { shard };
    instances
        .iter()
        .find(|i| i.shards.serves(shard))
        .ok_or_else(|| {
            let (namespace, stage) = at();
            let served: Vec<String> = instances
                .iter()
                .map(|i| match &i.shards {
                    Shards::Every => format!("{}: every shard", i.name),
                    Shards::Only(set) => format!(
                        "{}: {}",
                        i.name,
                        set.iter()
                            .map(|s| format!("{s:?}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })
                .collect();
            StageError::NoInstance {
                namespace,
                stage,
                shard: shard.to_string(),
                served: served.join("; "),
            }
        })
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
