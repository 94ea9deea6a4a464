//! The live watch of Argo CD cluster Secrets: keeps the registry in step with the Secrets of
//! every Argo CD instance's namespace, on the cluster that instance runs on, one destination per
//! distinct `name`.
//!
//! A name that several Secrets claim registers no usable destination: Argo CD refuses an
//! Application destination whose name several clusters carry ("there are %d clusters with the
//! same name", util/argo/argo.go:1116 at 37ee0097cf), and so does this server, with a
//! [`Broken`](crate::destinations::Broken) entry whose message names every claiming Secret.
//! Silently keeping one of them would let whoever can create a Secret in the Argo CD namespace
//! redirect a destination's Jobs (and its credentials' reach) to a cluster of their choosing.
//! The claims of all instances are kept together ([`Claims`], shared by their watches), so the
//! same holds across instances: a Secret of one instance never takes over a name another's
//! Secret registered. A Secret that claims `in-cluster`, or describes
//! `https://kubernetes.default.svc`, is ignored, whatever its instance (#27): the cluster an
//! instance runs on is its implicit `in-cluster` (on the control plane, with this server's
//! credentials and `argocd.inClusterNamespaces`) or its own cluster's destination, never a
//! Secret's; whoever may write Secrets in the Argo CD namespace could otherwise reach the
//! control plane with the server's credentials, or shadow `in-cluster`. Applications naming
//! `in-cluster` go to the instance's own cluster (`destinations::stage`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher::Event;

use super::{
    destination_name, in_cluster_spec, spec_from_secret, SecretError, SecretProblem,
    CLUSTER_SELECTOR, NAMESPACE_ANNOTATION,
};
use crate::config::{Access, ArgoCdConfig, DEFAULT_ARGOCD_INSTANCE};
use crate::destinations::{
    DestinationSpec, Registry, Source, SpecError, IN_CLUSTER_NAME, IN_CLUSTER_SERVER,
};
use crate::job::fnv1a;
use crate::watch::{self, Watched};

/// An Argo CD instance as its watch needs it.
#[derive(Debug, Clone)]
pub struct WatchedInstance {
    /// its settings (`argocd[]`)
    pub settings: ArgoCdConfig,
    /// the client config of the cluster it runs on (the implicit `in-cluster`'s, on the control
    /// plane; never lent to a Secret)
    pub cluster: kube::Config,
    /// whether that cluster is the control plane (the implicit `in-cluster` is registered only
    /// there)
    pub on_control_plane: bool,
    /// the control plane's access when it runs there: the implicit `in-cluster` destination's
    /// client follows its credential files (`client::client_of`)
    pub control_plane: Option<Access>,
}

/// What the watches of all instances know: the latest version of every cluster Secret, and
/// what they registered. Shared by the watches ([`SharedClaims`]), so that a name claimed by
/// Secrets of two instances is a duplicate like one claimed twice in one instance.
pub struct Claims {
    registry: Arc<Registry>,
    /// instance name → the instance
    instances: BTreeMap<String, WatchedInstance>,
    /// (instance, Secret name) → the destination name it claims, and the Secret
    secrets: BTreeMap<(String, String), (String, Secret)>,
    /// destination name → the source of the entry registered for it
    registered: HashMap<String, Source>,
    /// the instances whose Secrets were listed once
    listed: BTreeSet<String>,
}

/// [`Claims`] shared by the watches of every instance.
pub type SharedClaims = Arc<tokio::sync::Mutex<Claims>>;

/// The claims of `instances`, empty, for their [`watch()`]es.
pub fn claims(registry: Arc<Registry>, instances: Vec<WatchedInstance>) -> SharedClaims {
    let instances = instances
        .into_iter()
        .map(|i| (i.settings.name.clone(), i))
        .collect();
    Arc::new(tokio::sync::Mutex::new(Claims {
        registry,
        instances,
        secrets: BTreeMap::new(),
        registered: HashMap::new(),
        listed: BTreeSet::new(),
    }))
}

impl Claims {
    /// Records `secret` of `instance`; returns the destination names whose claimants changed.
    fn apply(&mut self, instance: &str, secret: Secret) -> Vec<String> {
        let Some(secret_name) = secret.metadata.name.clone() else {
            return Vec::new();
        };
        let key = (instance.to_string(), secret_name);
        let name = destination_name(&secret);
        if name == IN_CLUSTER_NAME || secret_server(&secret) == IN_CLUSTER_SERVER {
            tracing::warn!(instance, secret = %key.1, destination = %name,
                           server = %secret_server(&secret),
                           "cluster Secret claims `in-cluster` or https://kubernetes.default.svc, the cluster Argo CD runs on; ignored: that cluster is the implicit in-cluster destination (argocd.inCluster, argocd.inClusterNamespaces) or the instance's own, never a Secret's");
            return self
                .secrets
                .remove(&key)
                .map(|(old, _)| old)
                .into_iter()
                .collect();
        }
        let mut dirty = vec![name.clone()];
        if let Some((old, _)) = self.secrets.insert(key, (name.clone(), secret)) {
            if old != name {
                dirty.push(old);
            }
        }
        dirty
    }

    /// Forgets Secret `secret_name` of `instance`; returns the destination name it claimed.
    fn delete(&mut self, instance: &str, secret_name: &str) -> Option<String> {
        let key = (instance.to_string(), secret_name.to_string());
        self.secrets.remove(&key).map(|(name, _)| name)
    }

    /// Registers what the Secrets claiming `name` define: nothing, the one Secret's destination,
    /// or a broken entry naming every claimant.
    async fn reconcile(&mut self, name: &str) {
        let claimants: Vec<(&WatchedInstance, &Secret)> = self
            .secrets
            .iter()
            .filter(|(_, (n, _))| n == name)
            .filter_map(|((i, _), (_, s))| Some((self.instances.get(i)?, s)))
            .collect();
        let spec = match claimants.as_slice() {
            [] => {
                if let Some(source) = self.registered.remove(name) {
                    self.registry.remove(name, &source);
                }
                return;
            }
            [(instance, one)] => spec_from_secret(one, &instance.settings).await,
            many => duplicate_spec(name, many),
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

    /// Records that `instance` listed its Secrets; the registry's live sources are synced once
    /// every instance did.
    fn listed(&mut self, instance: &str) {
        self.listed.insert(instance.to_string());
        if self.listed.len() == self.instances.len() {
            self.registry.mark_synced();
        }
    }

    /// Registers the implicit `in-cluster` of `instance` (only on the control plane, with
    /// `inCluster`). No Secret replaces it: those for its server are ignored ([`Self::apply`]).
    fn implicit_in_cluster(&self, instance: &str) {
        let Some(i) = self.instances.get(instance) else {
            return;
        };
        if i.on_control_plane
            && i.settings.in_cluster
            && self.registry.get(IN_CLUSTER_NAME).is_none()
        {
            let mut spec = in_cluster_spec(&i.settings, &i.cluster);
            spec.follows = i.control_plane.clone();
            self.registry.insert(spec);
        }
    }
}

/// The `data.server` of a Secret, without a trailing `/` ("" when absent).
fn secret_server(secret: &Secret) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get("server"))
        .and_then(|b| std::str::from_utf8(&b.0).ok())
        .map(|v| v.trim().trim_end_matches('/').to_string())
        .unwrap_or_default()
}

/// `namespace/name` of a Secret of `instance`, for messages.
fn secret_shown(instance: &WatchedInstance, s: &Secret) -> String {
    let settings = &instance.settings;
    let shown = format!(
        "{}/{}",
        s.metadata
            .namespace
            .as_deref()
            .unwrap_or(&settings.namespace),
        s.metadata.name.as_deref().unwrap_or_default()
    );
    if settings.name == DEFAULT_ARGOCD_INSTANCE {
        shown
    } else {
        format!("{shown} (Argo CD instance {})", settings.name)
    }
}

/// The broken entry of a destination name that several Secrets claim (`claimants`, sorted by
/// instance and Secret name): the first one's labels and server, an error naming them all.
fn duplicate_spec(name: &str, claimants: &[(&WatchedInstance, &Secret)]) -> DestinationSpec {
    let (instance, first) = claimants[0];
    let settings = &instance.settings;
    let secret_names: Vec<String> = claimants.iter().map(|(i, s)| secret_shown(i, s)).collect();
    let source = Source::ArgoCd {
        instance: settings.name.clone(),
        namespace: settings.namespace.clone(),
        secret: first.metadata.name.clone().unwrap_or_default(),
    };
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
        follows: None,
    }
}

/// Watches the cluster Secrets in the namespace of Argo CD instance `instance` with `client` (of
/// the cluster it runs on) and keeps the registry in step through `claims`, until aborted. Once
/// every instance listed its Secrets, calls [`Registry::mark_synced`]. During a (re)list,
/// changes are applied at its end, when every Secret is known: a name two Secrets claim is
/// never registered as one of them in between.
pub async fn watch(claims: SharedClaims, instance: String, client: kube::Client) {
    let namespace = {
        let c = claims.lock().await;
        let Some(i) = c.instances.get(&instance) else {
            tracing::error!(
                instance,
                "no such Argo CD instance; its Secrets are not watched"
            );
            return;
        };
        c.implicit_in_cluster(&instance);
        i.settings.namespace.clone()
    };
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let watched = Watched {
        destination: format!("argocd:{instance}"),
        resource: "secrets".into(),
        namespace: Some(namespace.clone()),
    };
    // A 410 or a stall lists again (`crate::watch`); the relist reconciles at its end.
    let mut stream = watch::watch(api, Some(CLUSTER_SELECTOR), watched);
    // Set during a (re)list: the Secrets seen so far, and the names to reconcile at its end.
    let mut relist: Option<(BTreeSet<String>, BTreeSet<String>)> = None;
    let mut failing = false;
    while let Some(item) = stream.next().await {
        let event = match item {
            Ok(e) => {
                failing = false;
                e
            }
            Err(e) => {
                // A 410 or a stall logged its own line.
                if !failing && !e.relists() {
                    tracing::warn!(%namespace, error = %e,
                                   "watch of Argo CD cluster Secrets failing; retrying with backoff");
                    failing = true;
                }
                continue;
            }
        };
        let mut c = claims.lock().await;
        let mut dirty = Vec::new();
        let mut listed = false;
        match event {
            Event::Init => relist = Some((BTreeSet::new(), BTreeSet::new())),
            Event::InitApply(secret) => {
                let secret_name = secret.metadata.name.clone();
                let changed = c.apply(&instance, secret);
                if let Some((seen, pending)) = relist.as_mut() {
                    seen.extend(secret_name);
                    pending.extend(changed);
                } else {
                    dirty = changed;
                }
            }
            Event::Apply(secret) => dirty = c.apply(&instance, secret),
            Event::Delete(secret) => {
                dirty.extend(
                    secret
                        .metadata
                        .name
                        .as_deref()
                        .and_then(|n| c.delete(&instance, n)),
                );
            }
            Event::InitDone => {
                let (seen, pending) = relist.take().unwrap_or_default();
                let gone: Vec<String> = c
                    .secrets
                    .keys()
                    .filter(|(i, k)| *i == instance && !seen.contains(k))
                    .map(|(_, k)| k.clone())
                    .collect();
                dirty.extend(pending);
                dirty.extend(gone.iter().filter_map(|k| c.delete(&instance, k)));
                listed = true;
            }
        }
        dirty.sort();
        dirty.dedup();
        for name in dirty {
            c.reconcile(&name).await;
        }
        if listed {
            c.listed(&instance);
        }
        c.implicit_in_cluster(&instance);
    }
}
