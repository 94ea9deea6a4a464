//! The shared clusters of the engine tests and the helpers that read and write them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::argo;
pub(crate) use dispatch_tests::cluster::argocd::{
    apply_cluster_secret, cluster_config as argocd_config,
};
use dispatch_tests::cluster::{start_many, Cluster, FAKE_NODE};
use dispatch_tests::objects::{self, create_crd};
use dispatch_tests::shared::Shared;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::{json, Value};

use crate::engine_support::*;

/// Node label the fixture puts on each cluster's fake node (value: the cluster name).
pub(crate) const CLUSTER_LABEL: &str = "test.rollouts-dispatch.io/cluster";
/// The Argo CD cluster name (= destination name) of `b` registered on `a`.
pub(crate) const B_VIA_ARGOCD: &str = "b-argocd";
pub(crate) const VERDICT_TIMEOUT: Duration = Duration::from_secs(60);

pub(crate) struct Fixture {
    pub(crate) a: Cluster,
    pub(crate) b: Cluster,
    pub(crate) c: Cluster,
    /// token of ServiceAccount default/rollouts-dispatch on `b`
    pub(crate) b_token: String,
}

static FIXTURE: Shared<Fixture> = Shared::new();

/// The shared clusters (started by the first test that needs them).
pub(crate) fn fixture() -> Result<&'static Fixture> {
    FIXTURE.get_or_start(setup)
}

async fn setup() -> Result<Fixture> {
    let started = Instant::now();
    let mut clusters = start_many(&["a", "b", "c"]).await?;
    let c = clusters.pop().context("cluster c")?;
    let b = clusters.pop().context("cluster b")?;
    let a = clusters.pop().context("cluster a")?;
    for cl in [&a, &b, &c] {
        let nodes: Api<Node> = Api::all(cl.client().await?);
        let patch = json!({"metadata": {"labels": {CLUSTER_LABEL: cl.name}}});
        nodes
            .patch(FAKE_NODE, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("labelling the node of {}", cl.name))?;
    }
    let b_token = service_account_token(&b).await?;
    let ca = a.client().await?;
    for ns in ["argocd", "kargo-demo"] {
        argo::apply_namespace(&ca, ns).await?;
    }
    install_crds(&ca).await?;
    apply_cluster_secret(
        &ca,
        "cluster-b",
        B_VIA_ARGOCD,
        &b.server,
        &argocd_config(&b_token, &b.ca_pem),
        &[("env", "argocd-test")],
    )
    .await?;
    println!(
        "fixture: clusters a, b, c ready in {:.1}s (a={}, b={}, c={})",
        started.elapsed().as_secs_f64(),
        a.server,
        b.server,
        c.server
    );
    Ok(Fixture { a, b, c, b_token })
}

/// A real ServiceAccount token of `cluster` with RBAC for Jobs, Pods and logs.
pub(crate) async fn service_account_token(cluster: &Cluster) -> Result<String> {
    let client = cluster.client().await?;
    let post = PostParams::default();
    let sa: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": "rollouts-dispatch", "namespace": "default"}}),
    )?;
    Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .create(&post, &sa)
        .await
        .context("creating serviceaccount rollouts-dispatch")?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch"},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
        ]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&post, &role)
        .await
        .context("creating clusterrole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rollouts-dispatch"},
        "subjects": [{"kind": "ServiceAccount", "name": "rollouts-dispatch", "namespace": "default"}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&post, &binding)
        .await
        .context("creating clusterrolebinding")?;
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let token_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch-token", "namespace": "default",
                     "annotations": {"kubernetes.io/service-account.name": "rollouts-dispatch"}},
        "type": "kubernetes.io/service-account-token"
    }))?;
    secrets
        .create(&post, &token_secret)
        .await
        .context("creating the token secret")?;
    eventually(
        "the token controller fills the token secret",
        Duration::from_secs(30),
        || async {
            let s = secrets.get("rollouts-dispatch-token").await?;
            Ok(s.data
                .and_then(|d| d.get("token").cloned())
                .and_then(|t| String::from_utf8(t.0).ok()))
        },
    )
    .await
}

/// Minimal CRDs for Kargo's Stage and Argo CD's Application (schemas preserve every field).
async fn install_crds(client: &kube::Client) -> Result<()> {
    create_crd(client, "kargo.akuity.io", "Stage", "stages").await?;
    create_crd(client, "argoproj.io", "Application", "applications").await
}

/// Creates Application `argocd/name` on `client`'s cluster, deploying to `destination`.
pub(crate) async fn application(
    client: &kube::Client,
    name: &str,
    destination: Value,
) -> Result<()> {
    let apps = dynamic_api(
        client,
        "argocd",
        "argoproj.io",
        "Application",
        "applications",
    );
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd"},
        "spec": {"project": "default", "destination": destination,
                 "source": {"repoURL": "https://example.invalid/repo.git", "path": "guestbook"}}
    }))?;
    apps.create(&PostParams::default(), &app)
        .await
        .with_context(|| format!("creating application {name}"))?;
    Ok(())
}

pub(crate) fn dynamic_api(
    client: &kube::Client,
    ns: &str,
    group: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1alpha1", kind), plural);
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// An engine over `a`, `b` and `c` from config entries (labels: a, b `env=prod`, c `env=dev`).
pub(crate) fn static_yaml(f: &Fixture, extra: &str) -> String {
    format!(
        "{}engine: {{logTimeout: 2s, cacheWait: 3s}}\n{extra}",
        destinations_yaml(&[
            (&f.a, "{env: prod, region: eu}"),
            (&f.b, "{env: prod, region: us}"),
            (&f.c, "{env: dev}"),
        ])
    )
}

/// The Jobs of run `uid` on `cluster` (not being deleted).
pub(crate) async fn jobs_of(cluster: &Cluster, uid: &str) -> Result<Vec<Job>> {
    Ok(objects::jobs_of(cluster, uid)
        .await?
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The first pod of Job `name` in `default` once `ready` accepts it.
pub(crate) async fn pod_of(
    cluster: &Cluster,
    name: &str,
    ready: impl Fn(&Pod) -> bool,
) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await?, "default");
    eventually(
        &format!("pod of job {name} on {}", cluster.name),
        VERDICT_TIMEOUT,
        || async {
            let list = pods
                .list(
                    &ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")),
                )
                .await?;
            Ok(list.items.into_iter().find(|p| ready(p)))
        },
    )
    .await
}

pub(crate) fn env_of(job: &Job) -> BTreeMap<String, String> {
    objects::job_env(job).into_iter().collect()
}

/// The engine's request count once it has not changed for a while (the watches are open).
pub(crate) async fn settled_requests(engine: &dispatch_server::Engine) -> Result<u64> {
    let mut last = engine.api_requests();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = engine.api_requests();
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    bail!("the engine keeps sending API requests while idle")
}

pub(crate) async fn set_termination_message(
    cluster: &Cluster,
    pod: Pod,
    message: &str,
) -> Result<()> {
    dispatch_tests::cluster::kwok::set_termination_message(
        &cluster.client().await?,
        pod,
        "check",
        message,
    )
    .await
}

pub(crate) fn dest(names: &str) -> Value {
    json!({"destination": names})
}
