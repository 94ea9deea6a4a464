//! Kubernetes objects the scenes create or look up: CRDs (installed and waited for), and the
//! Jobs our server made (for one AnalysisRun, or all of them).

use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use serde_json::json;

use crate::cluster::Cluster;
use crate::wait::{eventually, Progress};

/// The label our Jobs carry: the UID of the AnalysisRun they measure for.
pub const RUN_UID_LABEL: &str = "rollouts-dispatch.io/run-uid";
/// Argo Rollouts' label with the run UID: on the built-in job provider's Jobs (ours no longer
/// carry it, see server/src/job.rs `LABEL_RUN_UID`).
pub const ARGO_RUN_UID_LABEL: &str = "analysisrun.argoproj.io/uid";

/// Every Job on `cluster` (any namespace) of the run with UID `uid`, including Jobs that are
/// being deleted.
pub async fn jobs_of(cluster: &Cluster, uid: &str) -> Result<Vec<Job>> {
    let api: Api<Job> = Api::all(cluster.client().await?);
    let selector = format!("{RUN_UID_LABEL}={uid}");
    Ok(api
        .list(&ListParams::default().labels(&selector))
        .await
        .with_context(|| format!("listing the Jobs of run {uid} on {}", cluster.name))?
        .items)
}

/// The one Job of the run with UID `uid`, on `on`; `elsewhere` must have none of it.
pub async fn the_one_job(on: &Cluster, elsewhere: &[&Cluster], uid: &str) -> Result<Job> {
    let mut here = jobs_of(on, uid).await?;
    let mut counts = vec![format!("{} on {}", here.len(), on.name)];
    let mut stray = false;
    for other in elsewhere {
        let there = jobs_of(other, uid).await?.len();
        stray |= there > 0;
        counts.push(format!("{there} on {}", other.name));
    }
    anyhow::ensure!(
        here.len() == 1 && !stray,
        "Jobs of run {uid}: {}; want 1 on {} only",
        counts.join(", "),
        on.name
    );
    Ok(here.remove(0))
}

/// The label of every Job our server creates (`server/src/job.rs`).
pub const MANAGED_LABEL: &str = "rollouts-dispatch.io/managed=true";

/// Every Job of ours on `cluster` (any namespace, any run), including Jobs being deleted.
pub async fn managed_jobs(cluster: &Cluster) -> Result<Vec<Job>> {
    let api: Api<Job> = Api::all(cluster.client().await?);
    Ok(api
        .list(&ListParams::default().labels(MANAGED_LABEL))
        .await
        .with_context(|| format!("listing our Jobs on {}", cluster.name))?
        .items)
}

/// Creates, as a dry run (nothing is stored), a minimal Job `probe` in `namespace` whose one
/// container runs `image`: how a test sees whether an admission policy or webhook is in force
/// yet (the API server loads them from its own informer, a moment after they are created).
pub async fn dry_run_job(client: &kube::Client, namespace: &str, image: &str) -> kube::Result<Job> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
    let probe: Job = serde_json::from_value(json!({
        "metadata": {"name": "probe"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
                 "containers": [{"name": "c", "image": image}]}}}
    }))
    .map_err(kube::Error::SerdeError)?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    jobs.create(&dry_run, &probe).await
}

/// The environment of a Job's first container, as (name, value) pairs.
pub fn job_env(job: &Job) -> Vec<(String, String)> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|p| p.containers.first())
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

/// Installs a namespaced `v1alpha1` CRD `<plural>.<group>` whose schema keeps every field (a
/// stand-in for Kargo's and Argo CD's kinds), and waits until it is Established.
pub async fn create_crd(
    client: &kube::Client,
    group: &str,
    kind: &str,
    plural: &str,
) -> Result<()> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))?;
    install_crd(client, &crd).await
}

/// Creates `crd` (an existing one is kept) and waits until it is Established.
pub async fn install_crd(client: &kube::Client, crd: &CustomResourceDefinition) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("creating CRD {name}")),
    }
    wait_established(client, &name).await
}

/// Creates `object` through `api`, retrying for up to 30 s while the API server refuses it: a
/// CRD that has just become Established can take a moment longer to be served for writes.
pub async fn create_when_served(
    api: &Api<DynamicObject>,
    object: &DynamicObject,
) -> Result<DynamicObject> {
    let what = format!(
        "{} {} created",
        object.types.as_ref().map_or("object", |t| t.kind.as_str()),
        object.metadata.name.as_deref().unwrap_or_default()
    );
    eventually(&what, Duration::from_secs(30), || async {
        Ok(match api.create(&PostParams::default(), object).await {
            Ok(created) => Progress::Done(created),
            Err(e) => Progress::Waiting(e.to_string()),
        })
    })
    .await
}

/// Waits up to 30 s until CRD `name` is Established (its kind is served).
pub async fn wait_established(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    eventually(
        &format!("CRD {name} Established"),
        Duration::from_secs(30),
        || {
            let (api, name) = (api.clone(), name.to_string());
            async move {
                let current = api
                    .get(&name)
                    .await
                    .with_context(|| format!("getting CRD {name}"))?;
                Ok(current
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True"))
            }
        },
    )
    .await
}
