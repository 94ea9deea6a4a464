//! Argo CD on a destination cluster, for the `application:` check and the sync trigger: the real
//! Application CRD (argo-cd v3.6.1 `manifests/crds/application-crd.yaml`, copied by
//! `make k8s-bin`), Applications whose `status` the test writes, and [`ArgoCdPlayer`], a task that
//! plays Argo CD's application controller for what the sync trigger needs.
//!
//! Why not the real `argocd-application-controller`: it needs a repo-server (and Redis) to
//! compare anything, i.e. a Git repository served to it and three more processes, and building
//! `github.com/argoproj/argo-cd/v3/cmd` pulls its whole dependency tree (several GB of modules,
//! a Go 1.27.3 toolchain) onto the 2-core machine; it was not tried. What we test is our side:
//! that the agent reads the Application the way Argo CD writes it, and that a sync request
//! lands where Argo CD reads it. The player writes exactly what the controller writes (fields
//! cited below), so a real controller would behave the same at that boundary.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::ByteString;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::Client;
use serde_json::{json, Value};

use super::argo::apply_crd_file;
use super::binaries::argo_cd_crds;
use crate::objects::wait_established;

/// The namespace of the Applications (Argo CD's default install namespace, what an
/// `application:` block means when it names none).
pub const NAMESPACE: &str = "argocd";
/// `argocd.argoproj.io/refresh`: asks for a refresh; the controller removes it
/// (argo-cd v3.6.1 pkg/apis/application/v1alpha1/application_annotations.go:4-6).
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";
/// How often the player looks for sync operations.
const PLAYER_POLL: Duration = Duration::from_millis(500);

/// The `Application` resource (argoproj.io/v1alpha1).
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    )
}

/// `Api` for Applications in [`NAMESPACE`].
pub fn applications(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NAMESPACE, &application_resource())
}

/// Applies Argo CD's Application CRD and creates [`NAMESPACE`].
pub async fn install(client: &Client) -> Result<()> {
    let path = argo_cd_crds()?.join("application-crd.yaml");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = apply_crd_file(&crds, &path).await?;
    wait_established(client, &name).await?;
    super::argo::apply_namespace(client, NAMESPACE).await
}

/// Argo CD's `config` JSON of a cluster Secret: a bearer token and the CA (base64, as Go encodes
/// `[]byte`), the shape `argocd cluster add` writes (argo-cd v3.6.1
/// pkg/apis/application/v1alpha1/types.go `ClusterConfig`).
pub fn cluster_config(token: &str, ca_pem: &str) -> Value {
    let ca_b64 = serde_json::to_value(ByteString(ca_pem.as_bytes().to_vec())).unwrap_or_default();
    json!({"bearerToken": token, "tlsClientConfig": {"insecure": false, "caData": ca_b64}})
}

/// Creates Argo CD cluster Secret `secret` in [`NAMESPACE`] (label
/// `argocd.argoproj.io/secret-type: cluster`, plus `labels`) for cluster `name` at `server`
/// with `config` ([`cluster_config`]).
pub async fn apply_cluster_secret(
    client: &Client,
    secret: &str,
    name: &str,
    server: &str,
    config: &Value,
    labels: &[(&str, &str)],
) -> Result<()> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("argocd.argoproj.io/secret-type".into(), "cluster".into());
    let obj: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret, "namespace": NAMESPACE, "labels": l},
        "type": "Opaque",
        "stringData": {"name": name, "server": server, "config": config.to_string()}
    }))?;
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating Argo CD cluster secret {secret}"))?;
    Ok(())
}

/// The Kargo Stage of [`crate::kargo::PROJECT`] the test Applications are authorized for: the
/// Application routes name it (`stage`, `?stage=`) and the server and the agent check it against
/// the annotation [`AUTHORIZED_STAGE`] (as Kargo's own argocd-update step does).
pub const APP_STAGE: &str = "shop";

/// Kargo's annotation naming the Stages that may manage an Application.
pub const AUTHORIZED_STAGE: &str = "kargo.akuity.io/authorized-stage";

/// The rule key of the scenes' policy that lets the project use the Applications of
/// [`NAMESPACE`] (their own grant, apart from the Jobs' `namespaces`), as YAML (flow style).
pub const RULE_APPLICATIONS: &str = "applicationNamespaces: [\"argocd\"]";

/// Creates Application `name` (a Git source, an in-cluster destination) with `status`,
/// authorized for [`APP_STAGE`] of the project; the CRD has no status subresource, so Argo CD
/// writes `status` with the object, as here.
pub async fn create_application(
    client: &Client,
    name: &str,
    status: Value,
) -> Result<DynamicObject> {
    let authorized = format!("{}:{APP_STAGE}", crate::kargo::PROJECT);
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": NAMESPACE,
                     "annotations": {AUTHORIZED_STAGE: authorized}},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://git.example.invalid/shop.git", "path": "deploy", "targetRevision": "main"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "shop"}
        },
        "status": status
    }))?;
    applications(client)
        .create(&PostParams::default(), &app)
        .await
        .with_context(|| format!("creating Application {NAMESPACE}/{name}"))
}

/// A `status` as Argo CD writes it after a comparison: `sync` (SyncStatus, argo-cd v3.6.1
/// types.go:1950-1956), `health`, `resources` (ResourceStatus :2237, each with its health) and
/// `reconciledAt` (ApplicationStatus :1218-1248).
pub fn status(sync: &str, revision: &str, health: &str, resources: Value) -> Value {
    json!({
        "sync": {"status": sync, "revision": revision},
        "health": {"status": health},
        "resources": resources,
        "reconciledAt": now(),
    })
}

/// One entry of `status.resources`.
pub fn resource(kind: &str, name: &str, health: &str, message: &str) -> Value {
    let group = if kind == "Deployment" { "apps" } else { "" };
    json!({
        "group": group, "version": "v1", "kind": kind, "namespace": "shop", "name": name,
        "status": "Synced", "health": {"status": health, "message": message}
    })
}

/// The test's stand-in for Argo CD's application controller on one cluster: every
/// [`PLAYER_POLL`] it honours the sync operations and refresh requests of the Applications in
/// [`NAMESPACE`] as the controller does: on `operation.sync`, the app is synced to
/// `operation.sync.revision` (`status.sync`), `status.operationState` says `Succeeded` with
/// `syncResult.revision`, and `operation` is removed (argo-cd v3.6.1
/// controller/appcontroller.go:1795-1816, `setOperationState`: completed → `operation: nil`);
/// on the refresh annotation, `reconciledAt` moves and the annotation goes.
pub struct ArgoCdPlayer {
    task: tokio::task::JoinHandle<()>,
}

impl ArgoCdPlayer {
    /// Starts the player on `client`'s cluster.
    pub fn spawn(client: Client) -> Self {
        let task = tokio::spawn(async move {
            let apps = applications(&client);
            loop {
                if let Err(e) = play_once(&apps).await {
                    eprintln!("argo-cd player: {e:#}");
                }
                tokio::time::sleep(PLAYER_POLL).await;
            }
        });
        Self { task }
    }
}

impl Drop for ArgoCdPlayer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn play_once(apps: &Api<DynamicObject>) -> Result<()> {
    for app in apps.list(&ListParams::default()).await?.items {
        let name = app.metadata.name.clone().unwrap_or_default();
        let refresh = app
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(REFRESH_ANNOTATION));
        let patch = match app.data.pointer("/operation/sync") {
            Some(sync) => {
                let revision = sync["revision"].as_str().unwrap_or_default();
                let now = now();
                json!({
                    "metadata": {"annotations": {REFRESH_ANNOTATION: null}},
                    "operation": null,
                    "status": {
                        "sync": {"status": "Synced", "revision": revision},
                        "health": {"status": "Healthy"},
                        "reconciledAt": now,
                        "operationState": {
                            "operation": app.data["operation"],
                            "phase": "Succeeded",
                            "message": "successfully synced (all tasks run)",
                            "syncResult": {"revision": revision, "resources": []},
                            "startedAt": now, "finishedAt": now
                        }
                    }
                })
            }
            None if refresh => json!({
                "metadata": {"annotations": {REFRESH_ANNOTATION: null}},
                "status": {"reconciledAt": now()}
            }),
            None => continue,
        };
        apps.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("playing Argo CD on Application {name}"))?;
        println!(
            "argo-cd player: Application {NAMESPACE}/{name}: {}",
            patch["status"]
        );
    }
    Ok(())
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}
