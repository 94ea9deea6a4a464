//! Kargo topologies (`argocd:` as a list of instances, `destination: stage` by shard): a tenant
//! who writes its Stage picks a shard no Argo CD instance serves, hoping for the control plane's
//! Argo CD; whoever writes Secrets in a remote Argo CD's namespace claims a destination name of
//! the control plane's Argo CD, or `in-cluster`. Instance `main` runs on the fake control plane,
//! instance `far` on fake cluster `b`.

use anyhow::Result;
use dispatch_server::destinations::{Entry, Source};
use serde_json::{json, Value};

use crate::argocd::job_creations;
use crate::budgets::{measurement, POLICY};
use crate::fake_api::{FakeApi, Res};
use crate::scene::{token, Scene};
use crate::tally::{self, Outcome};
use crate::world::{eventually, PROJECT};

const ARGOCD: &str = "argocd:
- {name: main, defaultNamespace: verify}
- {name: far, destination: b, shards: [far], defaultNamespace: verify}";

/// Cluster Secret `cluster-{name}` in namespace `argocd` of `api`, registering `server`.
fn put_secret(api: &FakeApi, name: &str, server: &str) {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    api.put(
        &Res::new("v1", "secrets"),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("cluster-{name}"), "namespace": "argocd",
                         "labels": {"argocd.argoproj.io/secret-type": "cluster"}},
            "data": {"name": b64(name), "server": b64(server),
                     "config": b64(r#"{"bearerToken": "t"}"#)},
        }),
    );
}

/// `destination: stage` for run `n` of Stage `stage`.
async fn ensure_stage(scene: &Scene, n: u32, stage: &str) -> Result<(u16, String)> {
    ensure(scene, n, json!({"destination": "stage"}), stage).await
}

/// Ensures measurement `n` with `routing`, of a run of Stage `stage`: status and reply.
async fn ensure(scene: &Scene, n: u32, routing: Value, stage: &str) -> Result<(u16, String)> {
    let mut m: Value = measurement(n, routing);
    m["run"]["labels"] = json!({"kargo.akuity.io/stage": stage});
    let reply = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&token("plugin", |_| {})),
            &m,
        )
        .await?;
    Ok((reply.status, reply.body.to_string()))
}

#[tokio::test]
async fn a_stage_of_a_shard_no_instance_serves_never_falls_back_to_the_control_plane() -> Result<()>
{
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD}")).await?;
    let clusters = &scene.world.clusters;
    let a = clusters.a.url().to_string();
    put_secret(&clusters.cp, "prod-a", &a);
    // What the control plane's Argo CD would resolve the Stage to, if it were asked.
    clusters.cp.put(
        &Res::new("argoproj.io/v1alpha1", "applications"),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
               "metadata": {"name": "app", "namespace": "argocd"},
               "spec": {"destination": {"server": a}}}),
    );
    for (stage, shard) in [("mars", "mars"), ("unlabelled", "")] {
        let mut obj = json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
            "metadata": {"name": stage, "namespace": PROJECT, "annotations": {
                "kargo.akuity.io/argocd-context": r#"[{"name": "app", "namespace": "argocd"}]"#}},
            "spec": {"shard": shard}
        });
        // The unlabelled one carries the label of a served shard, contradicting spec.shard.
        if shard.is_empty() {
            obj["spec"]["shard"] = "mars".into();
            obj["metadata"]["labels"] = json!({"kargo.akuity.io/shard": "far"});
        }
        clusters
            .cp
            .put(&Res::new("kargo.akuity.io/v1alpha1", "stages"), obj);
    }
    let (status, reply) = ensure_stage(&scene, 1, "mars").await?;
    let (status2, reply2) = ensure_stage(&scene, 2, "unlabelled").await?;
    let created = job_creations(&scene);
    let read = clusters.cp.calls("GET", "/applications/app")
        + clusters.b.calls("GET", "/applications/app");
    let refused = status >= 400
        && reply.contains("belongs to shard \\\"mars\\\"")
        && status2 >= 400
        && reply2
            .contains("label kargo.akuity.io/shard is \\\"far\\\" but spec.shard is \\\"mars\\\"")
        && created.is_empty()
        && read == 0;
    tally::refused(
        "topologies: a Stage whose shard no Argo CD instance serves (or whose label contradicts it) → refused, no Application read, no Job",
        Outcome {
            refused,
            ..Outcome::default()
        },
    );
    assert!(
        refused,
        "{status} {reply}\n{status2} {reply2}\n{created:?} reads={read}"
    );
    Ok(())
}

#[tokio::test]
async fn a_remote_instance_secret_cannot_take_a_name_or_in_cluster() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD}")).await?;
    let clusters = &scene.world.clusters;
    let (a, b) = (clusters.a.url().to_string(), clusters.b.url().to_string());
    put_secret(&clusters.cp, "prod", &a);
    // Whoever writes Secrets in far's namespace (on b) claims `prod` and `in-cluster`.
    put_secret(&clusters.b, "prod", &b);
    put_secret(&clusters.b, "in-cluster", &b);
    let registry = scene.world.engine.registry();
    eventually("prod broken", || {
        let broken = matches!(registry.get("prod"), Some(Entry::Broken(_)));
        async move { Ok(broken.then_some(())) }
    })
    .await?;
    let (status, body) = ensure(&scene, 3, json!({"destination": "prod"}), "uat").await?;
    let in_cluster_kept = matches!(registry.get("in-cluster"),
        Some(Entry::Ready(d)) if matches!(d.source, Source::ArgoCdInCluster { .. }));
    let created = job_creations(&scene);
    let refused = status >= 400
        && body.contains("Argo CD instance far")
        && in_cluster_kept
        && created.is_empty();
    tally::refused(
        "topologies: a remote Argo CD's Secret claiming the control plane Argo CD's destination name, or in-cluster → name broken naming both, in-cluster kept, no Job",
        Outcome {
            refused,
            ..Outcome::default()
        },
    );
    assert!(
        refused,
        "{status}: {body}\nin-cluster kept: {in_cluster_kept}\n{created:?}"
    );
    Ok(())
}
