//! What an Argo CD install puts on the cluster before its components start, from the module's
//! own manifests (`make argocd-bin` copies them): the CRDs, namespace [`NAMESPACE`], argocd-cm,
//! argocd-rbac-cm and argocd-secret — and what `argocd-server` adds at its first start, which
//! is not run here: `server.secretkey` in argocd-secret and the `default` AppProject.

use std::path::Path;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::ByteString;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::Client;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};

use crate::cluster::argo::{apply_crds, apply_namespace};
use crate::cluster::argocd::NAMESPACE;

/// The field manager of what the harness applies.
const MANAGER: &str = "rollouts-dispatch-tests";

/// The `AppProject` resource (argoproj.io/v1alpha1).
pub fn app_project_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
        "appprojects",
    )
}

/// Applies the CRDs of `manifests/crds`, creates [`NAMESPACE`] and the settings of
/// `manifests/config` in it, then what argocd-server would add.
pub async fn install(client: &Client, manifests: &Path) -> Result<()> {
    apply_crds(client, &manifests.join("crds")).await?;
    apply_namespace(client, NAMESPACE).await?;
    let config = manifests.join("config");
    let params = PatchParams::apply(MANAGER).force();
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    for file in ["argocd-cm.yaml", "argocd-rbac-cm.yaml"] {
        let map: ConfigMap = serde_json::from_value(read(&config.join(file))?)?;
        let name = map.metadata.name.clone().unwrap_or_default();
        maps.patch(&name, &params, &Patch::Apply(&map))
            .await
            .with_context(|| format!("applying ConfigMap {NAMESPACE}/{name}"))?;
    }
    // The settings manager requires `server.secretkey` (argo-cd v3.2.6
    // util/settings/settings.go:1512-1515); argocd-server generates it into argocd-secret on its
    // first start (`InitializeSettings`, server/server.go:304).
    let mut secret: Secret = serde_json::from_value(read(&config.join("argocd-secret.yaml"))?)?;
    let key = Alphanumeric.sample_string(&mut rand::rng(), 32);
    secret.data = Some(
        [("server.secretkey".to_string(), ByteString(key.into_bytes()))]
            .into_iter()
            .collect(),
    );
    Api::<Secret>::namespaced(client.clone(), NAMESPACE)
        .patch("argocd-secret", &params, &Patch::Apply(&secret))
        .await
        .context("applying Secret argocd/argocd-secret")?;
    // The `default` project exactly as argocd-server creates it when missing
    // (`initializeDefaultProject`, server/server.go:281-299): any repository, any destination,
    // any cluster-scoped kind. Applications name it in `spec.project`.
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]
        }
    }))?;
    Api::<DynamicObject>::namespaced_with(client.clone(), NAMESPACE, &app_project_resource())
        .patch("default", &params, &Patch::Apply(&project))
        .await
        .context("applying AppProject argocd/default")?;
    Ok(())
}

/// The manifest at `path`, placed in [`NAMESPACE`].
fn read(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut object: Value =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    object["metadata"]["namespace"] = json!(NAMESPACE);
    Ok(object)
}
