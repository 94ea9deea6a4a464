//! The live watch of Argo CD cluster Secrets: keeps the registry in step with the Secrets of the
//! Argo CD namespace, one destination per distinct `name`.
//!
//! A name that several Secrets claim registers no usable destination: Argo CD refuses an
//! Application destination whose name several clusters carry ("there are %d clusters with the
//! same name", util/argo/argo.go:1116 at 37ee0097cf), and so does this server, with a
//! [`Broken`](crate::destinations::Broken) entry whose message names every claiming Secret.
//! Silently keeping one of them would let whoever can create a Secret in the Argo CD namespace
//! redirect a destination's Jobs (and its credentials' reach) to a cluster of their choosing.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;

use super::{
    destination_name, in_cluster_spec, spec_from_secret, SecretError, SecretProblem,
    CLUSTER_SELECTOR, NAMESPACE_ANNOTATION,
};
use crate::config::ArgoCdConfig;
use crate::destinations::{
    DestinationSpec, Registry, Source, SpecError, IN_CLUSTER_NAME, IN_CLUSTER_SERVER,
};
use crate::job::fnv1a;

/// What the watcher knows: the latest version of every cluster Secret, and what it registered.
struct Claims<'a> {
    registry: &'a Registry,
    settings: &'a ArgoCdConfig,
    control_plane: &'a kube::Config,
    /// Secret name → the Secret and the destination name it claims
    secrets: BTreeMap<String, (String, Secret)>,
    /// destination name → the source of the entry registered for it
    registered: HashMap<String, Source>,
}

impl Claims<'_> {
    /// Records `secret`; returns the destination names whose claimants changed.
    fn apply(&mut self, secret: Secret) -> Vec<String> {
        let Some(secret_name) = secret.metadata.name.clone() else {
            return Vec::new();
        };
        let name = destination_name(&secret);
        let mut dirty = vec![name.clone()];
        if let Some((old, _)) = self.secrets.insert(secret_name, (name.clone(), secret)) {
            if old != name {
                dirty.push(old);
            }
        }
        dirty
    }

    /// Forgets Secret `secret_name`; returns the destination name it claimed.
    fn delete(&mut self, secret_name: &str) -> Option<String> {
        self.secrets.remove(secret_name).map(|(name, _)| name)
    }

    /// Registers what the Secrets claiming `name` define: nothing, the one Secret's destination,
    /// or a broken entry naming every claimant.
    async fn reconcile(&mut self, name: &str) {
        let claimants: Vec<&Secret> = self
            .secrets
            .values()
            .filter(|(n, _)| n == name)
            .map(|(_, s)| s)
            .collect();
        let spec = match claimants.as_slice() {
            [] => {
                if let Some(source) = self.registered.remove(name) {
                    self.registry.remove(name, &source);
                }
                return;
            }
            [one] => spec_from_secret(one, self.settings, self.control_plane).await,
            many => duplicate_spec(name, many, self.settings),
        };
        if let Some(old) = self.registered.get(name) {
            // Another Secret now holds the name: its entry replaces the old one's.
            if *old != spec.source {
                self.registry.remove(name, old);
            }
        }
        self.registered
            .insert(name.to_string(), spec.source.clone());
        self.registry.insert(spec);
    }

    /// Whether a Secret registers the control plane's own server.
    fn has_in_cluster_server(&self) -> bool {
        self.secrets.values().any(|(_, s)| {
            s.data
                .as_ref()
                .and_then(|d| d.get("server"))
                .and_then(|b| std::str::from_utf8(&b.0).ok())
                .is_some_and(|v| v.trim().trim_end_matches('/') == IN_CLUSTER_SERVER)
        })
    }
}

/// The broken entry of a destination name that several Secrets claim (`claimants`, sorted by
/// Secret name): the first one's labels and server, an error naming them all.
fn duplicate_spec(name: &str, claimants: &[&Secret], settings: &ArgoCdConfig) -> DestinationSpec {
    let first = claimants[0];
    let secret_names: Vec<String> = claimants
        .iter()
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata
                    .namespace
                    .as_deref()
                    .unwrap_or(&settings.namespace),
                s.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    let source = secret_source(settings, first.metadata.name.as_deref().unwrap_or_default());
    tracing::error!(destination = name, secrets = %secret_names.join(","),
                    "several Argo CD cluster Secrets define this destination; none is used");
    let server = first
        .data
        .as_ref()
        .and_then(|d| d.get("server"))
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
        .unwrap_or_default();
    DestinationSpec {
        name: name.to_string(),
        labels: first.metadata.labels.clone().unwrap_or_default(),
        namespace: first
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NAMESPACE_ANNOTATION))
            .cloned()
            .unwrap_or_else(|| settings.default_namespace.clone()),
        // Broken: nothing runs there, so no limit to tell.
        namespaces: None,
        server: server.trim().trim_end_matches('/').to_string(),
        fingerprint: fnv1a(secret_names.join(",").as_bytes()),
        config: Err(SpecError::from(SecretError {
            secret: source.clone(),
            problem: SecretProblem::DuplicateName {
                name: name.to_string(),
                secrets: secret_names,
            },
        })),
        source,
    }
}

/// Watches the cluster Secrets in `settings.namespace` of the control plane and keeps the
/// registry in step, until aborted. Calls [`Registry::mark_synced`] after the first full list.
/// During a (re)list, changes are applied at its end, when every Secret is known: a name two
/// Secrets claim is never registered as one of them in between.
pub async fn watch(
    registry: Arc<Registry>,
    control_plane: kube::Client,
    control_plane_config: kube::Config,
    settings: ArgoCdConfig,
) {
    let api: Api<Secret> = Api::namespaced(control_plane, &settings.namespace);
    let config = watcher::Config::default().labels(CLUSTER_SELECTOR);
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut claims = Claims {
        registry: &registry,
        settings: &settings,
        control_plane: &control_plane_config,
        secrets: BTreeMap::new(),
        registered: HashMap::new(),
    };
    // Set during a (re)list: the Secrets seen so far, and the names to reconcile at its end.
    let mut relist: Option<(BTreeSet<String>, BTreeSet<String>)> = None;
    let mut failing = false;
    if settings.in_cluster {
        registry.insert(in_cluster_spec(&settings, &control_plane_config));
    }
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(e) => {
                failing = false;
                e
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(namespace = %settings.namespace, error = %e,
                                   "watch of Argo CD cluster Secrets failing; retrying with backoff");
                    failing = true;
                }
                continue;
            }
        };
        let mut dirty = Vec::new();
        let mut listed = false;
        match event {
            Event::Init => relist = Some((BTreeSet::new(), BTreeSet::new())),
            Event::InitApply(secret) => {
                let secret_name = secret.metadata.name.clone();
                let changed = claims.apply(secret);
                if let Some((seen, pending)) = relist.as_mut() {
                    seen.extend(secret_name);
                    pending.extend(changed);
                } else {
                    dirty = changed;
                }
            }
            Event::Apply(secret) => dirty = claims.apply(secret),
            Event::Delete(secret) => {
                dirty.extend(
                    secret
                        .metadata
                        .name
                        .as_deref()
                        .and_then(|n| claims.delete(n)),
                );
            }
            Event::InitDone => {
                let (seen, pending) = relist.take().unwrap_or_default();
                let gone: Vec<String> = claims
                    .secrets
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                dirty.extend(pending);
                dirty.extend(gone.iter().filter_map(|k| claims.delete(k)));
                listed = true;
            }
        }
        dirty.sort();
        dirty.dedup();
        for name in dirty {
            claims.reconcile(&name).await;
        }
        if listed {
            registry.mark_synced();
        }
        // A Secret for the local server replaces the implicit in-cluster destination.
        if settings.in_cluster {
            if claims.has_in_cluster_server() {
                registry.remove(IN_CLUSTER_NAME, &Source::ArgoCdInCluster);
            } else if registry.get(IN_CLUSTER_NAME).is_none() {
                registry.insert(in_cluster_spec(&settings, &control_plane_config));
            }
        }
    }
}

fn secret_source(settings: &ArgoCdConfig, secret: &str) -> Source {
    Source::ArgoCd {
        namespace: settings.namespace.clone(),
        secret: secret.to_string(),
    }
}
