//! Kargo topologies for `destination: stage`: several Argo CD instances, each on its own
//! cluster and serving its Kargo shards. The control plane holds the Stages and the instance
//! `main` (the Stages without a shard); instance `far` runs on destination `b` (its cluster
//! Secrets and Applications live there) and serves shard `far`. A Stage's shard picks the
//! instance, its Applications are read there, `kubernetes.default.svc` is that instance's own
//! cluster, and a shard nobody serves is refused without reading anything else.

use anyhow::Result;
use dispatch_server::destinations::Entry;
use dispatch_server::engine::Outcome;
use serde_json::{json, Value};

use crate::cluster_side::jobs;
use crate::fake_api::{FakeApi, Res};
use crate::stage::{cluster_secret, secrets};
use crate::world::{block, eventually, request, run, Clusters, PROJECT};

const ARGOCD: &str = "argocd:
- {name: main, inCluster: false, defaultNamespace: verify}
- {name: far, destination: b, shards: [far], defaultNamespace: verify}";

fn applications() -> Res {
    Res::new("argoproj.io/v1alpha1", "applications")
}

fn stages() -> Res {
    Res::new("kargo.akuity.io/v1alpha1", "stages")
}

/// Stage `name` of [`PROJECT`] with `shard` (none when empty), last promoted through `apps`
/// (Applications of namespace `argocd`).
fn stage(cp: &FakeApi, name: &str, shard: &str, apps: &[&str]) {
    let context: Vec<Value> = apps
        .iter()
        .map(|a| json!({"name": a, "namespace": "argocd"}))
        .collect();
    let mut obj = json!({
        "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
        "metadata": {"name": name, "namespace": PROJECT, "annotations": {
            "kargo.akuity.io/argocd-context": Value::Array(context).to_string()
        }},
        "spec": {}
    });
    if !shard.is_empty() {
        obj["spec"]["shard"] = shard.into();
        obj["metadata"]["labels"] = json!({"kargo.akuity.io/shard": shard});
    }
    cp.put(&stages(), obj);
}

/// Application `argocd/name` on `api` deploying to `destination`.
fn application(api: &FakeApi, name: &str, destination: Value) {
    api.put(
        &applications(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": "argocd"},
            "spec": {"destination": destination}
        }),
    );
}

/// A run of Stage `stage`.
fn run_of(n: u32, stage: &str) -> dispatch_server::job::RunContext {
    let mut r = run(n);
    r.labels
        .insert("kargo.akuity.io/stage".into(), stage.into());
    r
}

/// The destinations `destination: stage` resolves for a run of `stage`, and the outcomes.
async fn resolve(
    w: &crate::world::World,
    n: u32,
    stage: &str,
) -> Result<Vec<(String, Outcome)>, dispatch_server::EngineError> {
    let config = block(json!({"destination": "stage"})).expect("block");
    let ensured = w
        .engine
        .ensure(&request(&run_of(n, stage), "smoke", 1, config))
        .await?;
    Ok(ensured.outcomes)
}

#[tokio::test]
async fn each_shard_reads_its_own_argo_cd() -> Result<()> {
    let clusters = Clusters::start().await?;
    let (a_url, b_url) = (clusters.a.url().to_string(), clusters.b.url().to_string());
    // main (control plane): a Secret for a; far (on b): a Secret for a too, under another name.
    cluster_secret(&clusters.cp, "main-a", &a_url)?;
    cluster_secret(&clusters.b, "far-a", &a_url)?;
    application(&clusters.cp, "app-uat", json!({"server": a_url}));
    // The same Application name on both instances: each Stage reads its own instance's.
    application(&clusters.b, "app-uat", json!({"name": "far-a"}));
    application(
        &clusters.b,
        "app-far-local",
        json!({"server": "https://kubernetes.default.svc"}),
    );
    application(
        &clusters.b,
        "app-far-in-cluster",
        json!({"name": "in-cluster"}),
    );
    stage(&clusters.cp, "uat", "", &["app-uat"]);
    stage(
        &clusters.cp,
        "far",
        "far",
        &["app-uat", "app-far-local", "app-far-in-cluster"],
    );
    let w = clusters.engine("", ARGOCD, true).await?;

    // By server: configured `a` wins over the Secret main-a for the same server (#27).
    assert_eq!(
        resolve(&w, 1, "uat").await?,
        vec![("a".into(), Outcome::Created)]
    );
    // Shard far: its Secret, and kubernetes.default.svc / in-cluster are b, where far runs —
    // not the control plane.
    assert_eq!(
        resolve(&w, 2, "far").await?,
        vec![
            ("far-a".into(), Outcome::Created),
            ("b".into(), Outcome::Created)
        ]
    );
    assert_eq!(w.api("a").list(&jobs()).len(), 2);
    assert_eq!(w.api("b").list(&jobs()).len(), 1);
    assert!(w.clusters.cp.list(&jobs()).is_empty());
    // far's Applications were read on b only.
    assert_eq!(w.clusters.cp.calls("GET", "/applications/app-uat"), 1);
    assert_eq!(w.clusters.b.calls("GET", "/applications/app-uat"), 1);
    assert_eq!(w.clusters.cp.calls("GET", "/applications/app-far-local"), 0);
    let b_server = match w.engine.registry().get("far-a") {
        Some(Entry::Ready(d)) => d.server.clone(),
        other => panic!("far-a: {other:?}"),
    };
    assert_eq!(b_server, a_url.trim_end_matches('/'));
    let _ = b_url;
    Ok(())
}

#[tokio::test]
async fn a_shard_no_instance_serves_is_refused_never_read_elsewhere() -> Result<()> {
    let clusters = Clusters::start().await?;
    let a_url = clusters.a.url().to_string();
    cluster_secret(&clusters.cp, "main-a", &a_url)?;
    // The Applications it names exist on the control plane's Argo CD: a fallback would run
    // Jobs on a.
    application(&clusters.cp, "app-mars", json!({"server": a_url}));
    stage(&clusters.cp, "mars", "mars", &["app-mars"]);
    let w = clusters.engine("", ARGOCD, true).await?;

    let e = resolve(&w, 1, "mars").await.unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "Stage {PROJECT}/mars belongs to shard \"mars\" (spec.shard)"
        )) && e.contains("add it to the `shards` of the `argocd[]` instance")
            && e.contains("main: \"\"; far: \"far\""),
        "{e}"
    );
    assert_eq!(w.clusters.cp.calls("GET", "/applications/app-mars"), 0);
    assert_eq!(w.clusters.b.calls("GET", "/applications/app-mars"), 0);
    assert!(w.api("a").list(&jobs()).is_empty());

    // A label that contradicts spec.shard (Kargo's webhook keeps them equal): refused.
    let mut forged = w
        .clusters
        .cp
        .get(&stages(), PROJECT, "mars")
        .expect("stage");
    forged["metadata"]["name"] = "forged".into();
    forged["spec"]["shard"] = "far".into();
    forged["metadata"]["labels"] = json!({"kargo.akuity.io/shard": "mars"});
    w.clusters.cp.put(&stages(), forged);
    let e = resolve(&w, 2, "forged").await.unwrap_err().to_string();
    assert!(
        e.contains("label kargo.akuity.io/shard is \"mars\" but spec.shard is \"far\""),
        "{e}"
    );

    // The remote instance's Application naming another instance's destination is refused.
    application(&w.clusters.b, "app-steal", json!({"name": "main-a"}));
    stage(&w.clusters.cp, "steal", "far", &["app-steal"]);
    let e = resolve(&w, 3, "steal").await.unwrap_err().to_string();
    assert!(
        e.contains("comes from Argo CD instance main, not from far"),
        "{e}"
    );
    assert!(w.api("a").list(&jobs()).is_empty());
    Ok(())
}

#[tokio::test]
async fn a_name_two_instances_claim_is_unusable_and_in_cluster_stays_the_control_planes(
) -> Result<()> {
    let clusters = Clusters::start().await?;
    let (a_url, b_url) = (clusters.a.url().to_string(), clusters.b.url().to_string());
    cluster_secret(&clusters.cp, "prod", &a_url)?;
    // far's Secrets try to take `prod` (pointing at b) and `in-cluster`.
    cluster_secret(&clusters.b, "prod", &b_url)?;
    cluster_secret(&clusters.b, "in-cluster", &b_url)?;
    let config = "argocd:
- {name: main, defaultNamespace: verify}
- {name: far, destination: b, shards: [far], defaultNamespace: verify}";
    let w = clusters.engine("", config, false).await?;
    let prod = eventually("prod broken", || {
        let e = w.engine.registry().get("prod");
        async move { Ok(e.filter(|e| matches!(e, Entry::Broken(_)))) }
    })
    .await?;
    let Entry::Broken(b) = prod else {
        unreachable!()
    };
    assert!(
        b.error
            .contains("2 Argo CD cluster Secrets define destination \"prod\"")
            && b.error
                .contains("argocd/cluster-prod (Argo CD instance far)"),
        "{}",
        b.error
    );
    // in-cluster is still the control plane's implicit destination.
    match w.engine.registry().get("in-cluster") {
        Some(Entry::Ready(d)) => {
            assert_eq!(d.server, "https://kubernetes.default.svc");
            assert!(matches!(
                d.source,
                dispatch_server::destinations::Source::ArgoCdInCluster { .. }
            ));
        }
        other => panic!("in-cluster: {other:?}"),
    }
    // far's Secret goes: prod is main's again.
    w.clusters.b.remove(&secrets(), "argocd", "cluster-prod");
    eventually("prod ready", || {
        let ready = matches!(w.engine.registry().get("prod"), Some(Entry::Ready(d)) if d.server == a_url.trim_end_matches('/'));
        async move { Ok(ready.then_some(())) }
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_instance_with_a_kubeconfig_is_its_own_destination() -> Result<()> {
    let clusters = Clusters::start().await?;
    let b_url = clusters.b.url().to_string();
    let kubeconfig = std::env::temp_dir().join(format!(
        "engine-fast-topologies-{}.kubeconfig",
        std::process::id()
    ));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: b\n\
             clusters: [{{name: b, cluster: {{server: \"{b_url}\"}}}}]\n\
             users: [{{name: b, user: {{token: b-token}}}}]\n\
             contexts: [{{name: b, context: {{cluster: b, user: b}}}}]\n"
        ),
    )?;
    application(
        &clusters.b,
        "app-local",
        json!({"server": "https://kubernetes.default.svc/"}),
    );
    stage(&clusters.cp, "far", "far", &["app-local"]);
    let config = format!(
        "argocd:\n- {{name: far, kubeconfig: {{path: \"{}\", context: b}}, shards: [far], \
         inClusterNamespaces: [verify]}}",
        kubeconfig.display()
    );
    let w = clusters.engine("", &config, true).await;
    let _ = std::fs::remove_file(&kubeconfig);
    let w = w?;
    match w.engine.registry().get("far") {
        Some(Entry::Ready(d)) => {
            assert_eq!(d.server, b_url.trim_end_matches('/'));
            assert_eq!(d.namespaces.as_deref(), Some(&["verify".to_string()][..]));
        }
        other => panic!("far: {other:?}"),
    }
    assert_eq!(
        resolve(&w, 1, "far").await?,
        vec![("far".into(), Outcome::Created)]
    );
    assert_eq!(w.api("b").list(&jobs()).len(), 1);
    // The Stages without a shard have no instance here.
    stage(&w.clusters.cp, "uat", "", &["app-local"]);
    let e = resolve(&w, 2, "uat").await.unwrap_err().to_string();
    assert!(
        e.contains("has no spec.shard (the default shard, \"\")"),
        "{e}"
    );
    Ok(())
}
