//! A destination limited to namespaces (`destinations[].namespaces`): its Job and Pod caches
//! list and watch each of its namespaces and never the whole cluster, they see the Jobs of every
//! namespace they watch (and none of the others), a failing namespace shows in the cache's
//! health, and a measurement placed in another namespace is refused before any call to it.

use anyhow::{ensure, Context, Result};
use dispatch_server::engine::EngineError;
use serde_json::{json, Value};

use crate::cluster_side::{jobs, pods};
use crate::fake_api::{FakeApi, Request};
use crate::world::{block, eventually, request, run, Clusters, World};

/// Destination `c`, on its own fake cluster, limited to `verify` and `smoke`.
fn limited(c: &FakeApi) -> String {
    format!(
        "- {{name: c, server: \"{}\", token: c-token, namespaces: [verify, smoke]}}",
        c.url()
    )
}

/// A Job of ours (the managed label the caches select) in `namespace`.
fn managed_job(namespace: &str, name: &str) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "rollouts-dispatch.io/managed": "true",
            "analysisrun.argoproj.io/uid": "0000aaaa-aaaa-4bbb-8ccc-000000000001"
        }},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
    })
}

/// The list and watch requests the caches made for `plural` under `api_root`.
fn reads_of<'a>(requests: &'a [Request], api_root: &str, plural: &str) -> Vec<&'a Request> {
    requests
        .iter()
        .filter(|r| r.method == "GET" && r.path.starts_with(api_root) && r.path.ends_with(plural))
        .collect()
}

async fn world_with_c(c: &FakeApi, extra: &str, synced: bool) -> Result<World> {
    Clusters::start()
        .await?
        .engine(&limited(c), extra, synced)
        .await
}

#[tokio::test]
async fn caches_list_and_watch_each_namespace_never_the_cluster() -> Result<()> {
    let c = FakeApi::start().await?;
    c.put(&jobs(), managed_job("verify", "in-verify"));
    c.put(&jobs(), managed_job("smoke", "in-smoke"));
    c.put(&jobs(), managed_job("kube-system", "elsewhere"));
    let world = world_with_c(&c, "", true).await?;
    let d = world.destination("c")?;
    ensure!(d.namespaces == Some(vec!["verify".into(), "smoke".into()]));
    ensure!(d.namespace == "verify", "the first listed is the default");

    // The cache sees the Jobs of each namespace it watches, and nothing elsewhere.
    ensure!(d.jobs().get("verify", "in-verify").is_some());
    ensure!(d.jobs().get("smoke", "in-smoke").is_some());
    ensure!(d.jobs().get("kube-system", "elsewhere").is_none());
    // Its watches keep it current, in every namespace.
    c.put(&jobs(), managed_job("smoke", "later"));
    eventually("a Job created in smoke later is cached", || {
        let seen = d.jobs().get("smoke", "later").is_some();
        async move { Ok(seen.then_some(())) }
    })
    .await?;

    let requests = c.requests();
    for (root, plural) in [("/apis/batch/v1/", "/jobs"), ("/api/v1/", "/pods")] {
        let reads = reads_of(&requests, root, plural);
        let paths: Vec<&str> = reads.iter().map(|r| r.path.as_str()).collect();
        for ns in ["verify", "smoke"] {
            let path = format!("{root}namespaces/{ns}{plural}");
            ensure!(
                reads.iter().any(|r| r.path == path && !r.is_watch()),
                "no list of {path}: {paths:?}"
            );
            ensure!(
                reads.iter().any(|r| r.path == path && r.is_watch()),
                "no watch of {path}: {paths:?}"
            );
        }
        let cluster_wide = format!("{root}{}", plural.trim_start_matches('/'));
        ensure!(
            reads.iter().all(|r| r.path != cluster_wide),
            "a cluster-wide read of {cluster_wide}: {paths:?}"
        );
        ensure!(
            reads
                .iter()
                .all(|r| r.path.contains("/namespaces/verify/")
                    || r.path.contains("/namespaces/smoke/")),
            "a read outside verify and smoke: {paths:?}"
        );
    }
    // The unlimited destination `a` still watches the whole cluster.
    let a = world.clusters.a.requests();
    ensure!(
        a.iter()
            .any(|r| r.path == "/apis/batch/v1/jobs" && r.is_watch()),
        "destination a should watch jobs cluster-wide"
    );
    Ok(())
}

#[tokio::test]
async fn a_failing_namespace_shows_in_the_cache_health() -> Result<()> {
    let c = FakeApi::start().await?;
    // The credentials may read `verify` but not `smoke`.
    c.fail("GET", "/namespaces/smoke/pods", 403, usize::MAX);
    let world = world_with_c(&c, "", false).await?;
    let d = world.destination("c")?;
    let problem = eventually("the pod watch of smoke fails", || {
        let p = d.cache_problem();
        async move {
            Ok(p.filter(|p| p.contains("watch of pods failing") && p.contains("namespace smoke")))
        }
    })
    .await?;
    ensure!(!d.is_authoritative(), "{problem}");
    ensure!(
        d.jobs().is_ready(),
        "the job watches of both namespaces listed"
    );
    ensure!(
        !d.pods().is_ready(),
        "pods of smoke never listed: {problem}"
    );
    Ok(())
}

#[tokio::test]
async fn a_placement_outside_the_namespaces_is_refused_before_any_call() -> Result<()> {
    let c = FakeApi::start().await?;
    let world = world_with_c(&c, "", true).await?;
    let before = c.requests().len();
    let outside = request(
        &run(1),
        "m",
        1,
        block(json!({"destination": "c", "namespace": "kube-system"}))?,
    );
    let e = world.engine.ensure(&outside).await.unwrap_err();
    ensure!(matches!(e, EngineError::OutsideNamespaces { .. }), "{e:?}");
    let text = e.to_string();
    for needle in [
        "destination \"c\"",
        "namespace \"kube-system\"",
        "`destinations[2].namespaces`",
        "config file engine-fast.yaml",
    ] {
        ensure!(text.contains(needle), "{needle} missing from: {text}");
    }
    ensure!(
        world.engine.locate(&outside).await.is_err(),
        "locate refuses it too"
    );
    let calls: Vec<Request> = c
        .requests()
        .into_iter()
        .skip(before)
        .filter(|r| !r.is_watch())
        .collect();
    ensure!(calls.is_empty(), "calls on c: {calls:?}");

    // Its default namespace and the other listed one work.
    let inside = request(&run(2), "m", 1, block(json!({"destination": "c"}))?);
    let ensured = world
        .engine
        .ensure(&inside)
        .await
        .context("ensure in verify")?;
    ensure!(ensured.job.placements[0].namespace == "verify");
    let smoke = request(
        &run(3),
        "m",
        1,
        block(json!({"destination": "c", "namespace": "smoke"}))?,
    );
    world
        .engine
        .ensure(&smoke)
        .await
        .context("ensure in smoke")?;
    ensure!(c.calls("POST", "/apis/batch/v1/namespaces/verify/jobs") == 1);
    ensure!(c.calls("POST", "/apis/batch/v1/namespaces/smoke/jobs") == 1);
    ensure!(c.list(&pods()).is_empty());
    Ok(())
}
