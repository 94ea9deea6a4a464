//! Starting the Argo CD instances of the config: for each, the client of the cluster it runs
//! on (the control plane, its `kubeconfig`, or its `destination`'s credentials), the
//! destination of that cluster (an instance with `kubeconfig`), the watch of its cluster
//! Secrets, and what `destination: stage` needs to read its Applications ([`StageInstance`]).

use std::sync::Arc;

use tracing::Instrument;

use super::{claims, home_spec, watch, WatchedInstance};
use crate::config::{
    Access, ArgoCdConfig, ArgoCdLocation, DestinationConfig, EngineSettings, KubeconfigContexts,
};
use crate::destinations::client::{self, AccessError, RequestCounter};
use crate::destinations::stage::{Home, InstanceCluster, StageInstance};
use crate::destinations::Registry;

/// The started instances.
pub struct Started {
    /// what `destination: stage` reads, in config order
    pub stage: Vec<StageInstance>,
    /// the Secret watches, stopped with the engine
    pub tasks: Vec<tokio::task::AbortHandle>,
    /// the control plane's client, when an instance runs there
    pub control_plane: Option<kube::Client>,
}

/// Why the instances cannot start at all: the control plane, which an instance runs on, has
/// no usable credentials. (An instance elsewhere whose credentials fail is started unusable:
/// its Stages are refused with the error.)
#[derive(Debug, thiserror::Error)]
#[error("`argocd` needs the control plane (`controlPlane` in {origin}): {source}")]
pub struct ControlPlaneNeeded {
    /// the config file, for the message
    pub origin: String,
    /// why it cannot be reached
    #[source]
    pub source: AccessError,
}

/// The config's sources of direct destinations, where an instance's `destination` is found.
pub struct DirectSources<'a> {
    /// `destinations[]`
    pub destinations: &'a [DestinationConfig],
    /// `kubeconfigContexts`
    pub kubeconfig_contexts: Option<&'a KubeconfigContexts>,
}

/// Starts `instances` (registering the clusters of those with `kubeconfig` in `registry`) and
/// the watches of their Secrets; marks the registry's live sources synced at once when none
/// can be watched.
pub async fn start(
    registry: &Arc<Registry>,
    instances: Vec<ArgoCdConfig>,
    control_plane: &Access,
    direct: &DirectSources<'_>,
    settings: &EngineSettings,
    origin: &str,
) -> Result<Started, ControlPlaneNeeded> {
    let mut cp: Option<(kube::Config, kube::Client)> = None;
    let mut stage = Vec::new();
    let mut watched = Vec::new();
    for instance in instances {
        let on_control_plane = instance.location == ArgoCdLocation::ControlPlane;
        let cluster = if on_control_plane {
            let pair = match &cp {
                Some(pair) => pair.clone(),
                None => {
                    let needed = |source| ControlPlaneNeeded {
                        origin: origin.to_string(),
                        source,
                    };
                    let config = client::config_for(control_plane, "control-plane")
                        .await
                        .map_err(needed)?;
                    let c = client::client_of(
                        control_plane,
                        "control-plane",
                        config.clone(),
                        settings,
                        &RequestCounter::default(),
                    )
                    .map_err(needed)?;
                    cp.insert((config, c)).clone()
                }
            };
            Ok(pair)
        } else {
            remote_cluster(&instance, direct, settings).await
        };
        let home = match (&instance.location, instance.in_cluster) {
            (ArgoCdLocation::ControlPlane, _) => Home::InCluster,
            (_, false) => Home::Disabled,
            (ArgoCdLocation::Kubeconfig { .. }, true) => {
                let config = cluster.as_ref().map(|(c, _)| c.clone()).map_err(Arc::clone);
                registry.insert(home_spec(&instance, config));
                Home::Destination(instance.name.clone())
            }
            (ArgoCdLocation::Destination(d), true) => Home::Destination(d.clone()),
        };
        let stage_cluster = match &cluster {
            Ok(_) if on_control_plane => InstanceCluster::ControlPlane,
            Ok((_, c)) => InstanceCluster::Client(c.clone()),
            Err(e) => {
                tracing::error!(instance = %instance.name, error = %e,
                                "Argo CD instance unusable: its Secrets are not watched and its Stages are refused");
                InstanceCluster::Unusable(e.to_string())
            }
        };
        stage.push(StageInstance {
            name: instance.name.clone(),
            namespace: instance.namespace.clone(),
            shards: instance.shards.clone(),
            on_control_plane,
            home,
            cluster: stage_cluster,
        });
        if let Ok((config, c)) = cluster {
            watched.push((
                WatchedInstance {
                    settings: instance,
                    cluster: config,
                    on_control_plane,
                    control_plane: on_control_plane.then(|| control_plane.clone()),
                },
                c,
            ));
        }
    }
    if watched.is_empty() {
        registry.mark_synced();
    }
    let clients: Vec<(String, kube::Client)> = watched
        .iter()
        .map(|(w, c)| (w.settings.name.clone(), c.clone()))
        .collect();
    let shared = claims(
        registry.clone(),
        watched.into_iter().map(|(w, _)| w).collect(),
    );
    let tasks = clients
        .into_iter()
        .map(|(name, c)| {
            let span = tracing::info_span!("argocd_watch", instance = %name);
            tokio::spawn(watch(shared.clone(), name, c).instrument(span)).abort_handle()
        })
        .collect();
    Ok(Started {
        stage,
        tasks,
        control_plane: cp.map(|(_, c)| c),
    })
}

/// The config and client of the cluster an instance off the control plane runs on.
async fn remote_cluster(
    instance: &ArgoCdConfig,
    direct: &DirectSources<'_>,
    settings: &EngineSettings,
) -> Result<(kube::Config, kube::Client), Arc<AccessError>> {
    let access = match &instance.location {
        ArgoCdLocation::ControlPlane => Access::Infer,
        ArgoCdLocation::Kubeconfig { path, context } => Access::Kubeconfig {
            path: path.clone(),
            context: context.clone(),
        },
        ArgoCdLocation::Destination(d) => match direct.destinations.iter().find(|c| &c.name == d) {
            Some(c) => c.access.clone(),
            None => Access::Kubeconfig {
                path: direct.kubeconfig_contexts.and_then(|k| k.path.clone()),
                context: Some(d.clone()),
            },
        },
    };
    let config = client::config_for(&access, &instance.name)
        .await
        .map_err(Arc::new)?;
    // Its kubeconfig rewritten (a new token), the watch of its Secrets reconnects with it.
    let c = client::client_of(
        &access,
        &instance.name,
        config.clone(),
        settings,
        &RequestCounter::default(),
    )
    .map_err(Arc::new)?;
    Ok((config, c))
}
