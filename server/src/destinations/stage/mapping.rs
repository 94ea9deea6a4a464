//! An Application's `spec.destination` → a registered destination, among those of the Argo CD
//! instance the Application lives in.
//!
//! * `server: https://kubernetes.default.svc` / `name: in-cluster` is the cluster that instance
//!   runs on: its [`Home`] — the implicit `in-cluster` on the control plane, the instance's
//!   `destination`, or the destination named after an instance with `kubeconfig` (a cluster
//!   Secret for that server or name is never registered, #27). Never a configured destination
//!   whose server happens to be `kubernetes.default.svc` for an instance off the control plane
//!   (that URL means the cluster of whoever reads it).
//! * another server or name: a destination not from Argo CD (`destinations`, agents, then
//!   `kubeconfigContexts`: what the platform team configured wins, #27), else one of that
//!   instance's Secrets; another instance's
//!   destination is refused ([`StageError::OtherInstance`], with that destination's own error
//!   when it is broken, e.g. a name two instances' Secrets claim).

use serde_json::Value;

use super::{Home, StageError, StageInstance};
use crate::destinations::{Entry, Registry, Source, IN_CLUSTER_NAME, IN_CLUSTER_SERVER};

/// Whether `entry` may stand for a cluster an Application of `instance` names.
fn belongs(entry: &Entry, instance: &StageInstance) -> bool {
    match entry.source() {
        // The control plane's implicit in-cluster is the same cluster for every instance there.
        Source::ArgoCdInCluster { .. } => instance.on_control_plane,
        s => s.argocd_instance().is_none_or(|i| i == instance.name),
    }
}

/// Maps an Application's `spec.destination` to a registered destination name; `app_ref` names
/// the Application in messages.
pub fn destination_of(
    registry: &Registry,
    app: &Value,
    app_ref: &str,
    instance: &StageInstance,
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
            let local = server == IN_CLUSTER_SERVER;
            let found = registry.by_server(server).into_iter().find(|e| {
                if local && !instance.on_control_plane {
                    e.source().argocd_instance() == Some(instance.name.as_str())
                } else {
                    belongs(e, instance)
                }
            });
            match found {
                Some(e) => Ok(e.name().to_string()),
                None if local => home(registry, instance, application),
                None => match registry.by_server(server).first() {
                    Some(e) => Err(other_instance(e, server, instance, application)),
                    None => Err(StageError::UnknownServer {
                        application,
                        server: server.to_string(),
                    }),
                },
            }
        }
        (None, Some(name)) if name == IN_CLUSTER_NAME && !instance.on_control_plane => {
            home(registry, instance, application)
        }
        (None, Some(name)) => match registry.get(name) {
            Some(e) if belongs(&e, instance) => Ok(name.to_string()),
            Some(e) => Err(other_instance(&e, name, instance, application)),
            None => Err(StageError::UnknownCluster {
                application,
                cluster: name.to_string(),
            }),
        },
    }
}

/// The destination of an Application on the cluster `instance` runs on.
fn home(
    registry: &Registry,
    instance: &StageInstance,
    application: String,
) -> Result<String, StageError> {
    let disabled = || StageError::InClusterDisabled {
        application: application.clone(),
        key: instance.in_cluster_key(),
    };
    match &instance.home {
        Home::InCluster => match registry.get(IN_CLUSTER_NAME) {
            Some(e) if belongs(&e, instance) => Ok(IN_CLUSTER_NAME.to_string()),
            _ => Err(disabled()),
        },
        Home::Destination(d) => Ok(d.clone()),
        Home::Disabled => Err(disabled()),
    }
}

fn other_instance(
    entry: &Entry,
    cluster: &str,
    instance: &StageInstance,
    application: String,
) -> StageError {
    let broken = match entry {
        Entry::Broken(b) => format!(" (and it is unusable: {})", b.error),
        _ => String::new(),
    };
    StageError::OtherInstance {
        application,
        cluster: cluster.to_string(),
        broken,
        owner: entry
            .source()
            .argocd_instance()
            .unwrap_or_default()
            .to_string(),
        instance: instance.name.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{EngineSettings, Shards};
    use crate::destinations::client::AccessError;
    use crate::destinations::DestinationSpec;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn argo(instance: &str, secret: &str) -> Source {
        Source::ArgoCd {
            instance: instance.into(),
            namespace: "argocd".into(),
            secret: secret.into(),
        }
    }

    /// `prod` (Secret of the single-map instance) and `static-prod` (config) on one server;
    /// `eu-prod` (Secret of instance `eu`, on the server of `prod` too), `eu-local` (Secret of
    /// `eu` for kubernetes.default.svc), `eu` (instance eu's own cluster), the control plane's
    /// implicit `in-cluster`, and `here` (config, server kubernetes.default.svc).
    fn registry() -> Registry {
        let r = Registry::new(EngineSettings::default(), false);
        for (name, server, source) in [
            ("prod", "https://10.0.0.1:6443", argo("argocd", "s")),
            (
                "static-prod",
                "https://10.0.0.1:6443",
                Source::Config { index: 0 },
            ),
            ("eu-prod", "https://10.0.0.1:6443", argo("eu", "p")),
            ("eu-local", IN_CLUSTER_SERVER, argo("eu", "l")),
            (
                "eu",
                "https://10.9.9.9:6443",
                Source::ArgoCdHome {
                    instance: "eu".into(),
                },
            ),
            (
                IN_CLUSTER_NAME,
                IN_CLUSTER_SERVER,
                Source::ArgoCdInCluster {
                    instance: "argocd".into(),
                },
            ),
            ("here", IN_CLUSTER_SERVER, Source::Config { index: 1 }),
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
                follows: None,
            });
        }
        r
    }

    fn instance(name: &str, on_control_plane: bool, home: Home) -> StageInstance {
        StageInstance {
            name: name.into(),
            namespace: "argocd".into(),
            shards: Shards::Every,
            on_control_plane,
            home,
            cluster: super::super::InstanceCluster::ControlPlane,
        }
    }

    fn app(d: Value) -> Value {
        json!({"spec": {"destination": d}})
    }

    #[tokio::test]
    async fn applications_map_to_destinations() {
        let r = registry();
        let main = instance("argocd", true, Home::InCluster);
        // A configured destination wins over the Argo CD cluster Secret with the same server
        // (#27: whoever writes Secrets never takes a cluster from the platform team's name).
        assert_eq!(
            destination_of(
                &r,
                &app(json!({"server": "https://10.0.0.1:6443/"})),
                "argocd/a",
                &main
            )
            .unwrap(),
            "static-prod"
        );
        assert_eq!(
            destination_of(&r, &app(json!({"name": "prod"})), "argocd/a", &main).unwrap(),
            "prod"
        );
        assert_eq!(
            destination_of(
                &r,
                &app(json!({"name": IN_CLUSTER_NAME})),
                "argocd/a",
                &main
            )
            .unwrap(),
            IN_CLUSTER_NAME
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
            // Another instance's Secret is not this instance's cluster.
            (json!({"name": "eu-prod"}), "comes from Argo CD instance eu (and it is unusable: exec credentials without a command), not from argocd"),
        ] {
            let e = destination_of(&r, &app(d), "argocd/a", &main)
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle) && e.contains("argocd/a"), "{e}");
        }
        let off = instance("argocd", true, Home::Disabled);
        let r2 = Registry::new(EngineSettings::default(), false);
        let e = destination_of(
            &r2,
            &app(json!({"server": IN_CLUSTER_SERVER})),
            "argocd/a",
            &off,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("argocd.inCluster is false"), "{e}");
    }

    #[tokio::test]
    async fn a_remote_instance_maps_its_own_cluster_and_its_own_secrets() {
        let r = registry();
        let eu = instance("eu", false, Home::Destination("eu".into()));
        let map = |d: Value| destination_of(&r, &app(d), "argocd/a (eu)", &eu);
        // The configured destination for the server first (#27), never the other instance's
        // Secret.
        assert_eq!(
            map(json!({"server": "https://10.0.0.1:6443"})).unwrap(),
            "static-prod"
        );
        // kubernetes.default.svc: its own Secret for that server, else its own cluster; never
        // the control plane's in-cluster nor `here`.
        assert_eq!(
            map(json!({"server": IN_CLUSTER_SERVER})).unwrap(),
            "eu-local"
        );
        assert_eq!(map(json!({"name": IN_CLUSTER_NAME})).unwrap(), "eu");
        let r2 = Registry::new(EngineSettings::default(), false);
        let home = destination_of(&r2, &app(json!({"server": IN_CLUSTER_SERVER})), "x", &eu);
        assert_eq!(home.unwrap(), "eu");
        let other = instance("us", false, Home::Destination("us-mgmt".into()));
        assert_eq!(
            destination_of(&r, &app(json!({"name": IN_CLUSTER_NAME})), "x", &other).unwrap(),
            "us-mgmt"
        );
        // Configured destinations are shared; other instances' are not.
        assert_eq!(map(json!({"name": "static-prod"})).unwrap(), "static-prod");
        let e = map(json!({"name": "prod"})).unwrap_err().to_string();
        assert!(e.contains("comes from Argo CD instance argocd (and it is unusable: exec credentials without a command), not from eu"), "{e}");
        let e = map(json!({"name": IN_CLUSTER_NAME}));
        assert_eq!(e.unwrap(), "eu");
        let off = instance("eu", false, Home::Disabled);
        let e = destination_of(&r2, &app(json!({"name": IN_CLUSTER_NAME})), "x", &off)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("argocd[].inCluster of instance eu is false"),
            "{e}"
        );
        // The control plane's instance does not get eu's cluster either.
        let main = instance("argocd", true, Home::InCluster);
        let e = destination_of(&r, &app(json!({"name": "eu"})), "x", &main)
            .unwrap_err()
            .to_string();
        assert!(e.contains("comes from Argo CD instance eu"), "{e}");
    }
}
