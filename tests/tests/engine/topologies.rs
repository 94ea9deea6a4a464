//! Kargo topologies for `destination: stage` on real clusters: Argo CD instance `main` on the
//! control plane `a` (Stages without a shard), and instance `far` on cluster `b` (reached with
//! b's kubeconfig; its Application CRD, cluster Secrets and Applications live on b), serving
//! shard `far`. The Stages live on `a`.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_server::destinations::{Entry, Source, IN_CLUSTER_NAME};
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use dispatch_tests::cluster::argo;
use dispatch_tests::objects::create_crd;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{json, Value};

use crate::engine_support::*;
use crate::fixture::*;

/// Creates Stage `kargo-demo/name` on the control plane `a`, of `shard` (none when empty),
/// last promoted through Applications `apps` (namespace `argocd` of the instance).
async fn stage(a: &kube::Client, name: &str, shard: &str, apps: &[&str]) -> Result<()> {
    let context: Vec<Value> = apps
        .iter()
        .map(|n| json!({"name": n, "namespace": "argocd"}))
        .collect();
    let mut obj = json!({
        "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
        "metadata": {"name": name, "namespace": "kargo-demo",
                     "annotations": {"kargo.akuity.io/argocd-context": Value::Array(context).to_string()}},
        "spec": {"requestedFreight": []}
    });
    if !shard.is_empty() {
        obj["spec"]["shard"] = shard.into();
        obj["metadata"]["labels"] = json!({"kargo.akuity.io/shard": shard});
    }
    let stages = dynamic_api(a, "kargo-demo", "kargo.akuity.io", "Stage", "stages");
    stages
        .create(&PostParams::default(), &serde_json::from_value(obj)?)
        .await
        .with_context(|| format!("creating stage {name}"))?;
    Ok(())
}

/// `destination: stage` for `run`: the measurement's Job reference (or the engine's refusal).
async fn ensure_stage(
    engine: &dispatch_server::Engine,
    run: &dispatch_server::job::RunContext,
) -> Result<dispatch_server::engine::JobRef, dispatch_server::EngineError> {
    let config = block(dest("stage"), 0, "1s", json!({})).expect("a valid block");
    Ok(engine.ensure(&request(run, "stage", 1, config)).await?.job)
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn stages_of_two_shards_resolve_through_their_own_argo_cd() -> Result<()> {
    let f = fixture()?;
    run(async {
        let (ca, cb) = (f.a.client().await?, f.b.client().await?);
        let id = &run_uid()[..6];
        // Argo CD `far` on b: its namespace, Application CRD and a cluster Secret for c.
        argo::apply_namespace(&cb, "argocd").await?;
        create_crd(&cb, "argoproj.io", "Application", "applications").await?;
        let far_c = format!("far-c-{id}");
        let far_c_secret = format!("cluster-far-c-{id}");
        apply_cluster_secret(
            &cb,
            &far_c_secret,
            &far_c,
            &f.c.server,
            &argocd_config(&f.c.token, &f.c.ca_pem),
            &[],
        )
        .await?;
        let (app_main, app_far, app_far_c) = (
            format!("main-{id}"),
            format!("far-{id}"),
            format!("far-c-{id}"),
        );
        application(
            &ca,
            &app_main,
            json!({"name": IN_CLUSTER_NAME, "namespace": "guestbook"}),
        )
        .await?;
        // The same name as on a: read on b, it must not be a's.
        application(
            &cb,
            &app_main,
            json!({"server": "https://kubernetes.default.svc", "namespace": "guestbook"}),
        )
        .await?;
        application(
            &cb,
            &app_far,
            json!({"server": "https://kubernetes.default.svc/", "namespace": "guestbook"}),
        )
        .await?;
        application(
            &cb,
            &app_far_c,
            json!({"name": far_c, "namespace": "guestbook"}),
        )
        .await?;
        let (s_main, s_far, s_mars) = (
            format!("topo-main-{id}"),
            format!("topo-far-{id}"),
            format!("topo-mars-{id}"),
        );
        stage(&ca, &s_main, "", &[&app_main]).await?;
        stage(&ca, &s_far, "far", &[&app_far, &app_far_c, &app_main]).await?;
        stage(&ca, &s_mars, "mars", &[&app_main]).await?;

        let yaml = format!(
            "controlPlane: {{kubeconfig: {a}}}\n\
             argocd:\n\
             - {{name: main, namespace: argocd}}\n\
             - {{name: far, kubeconfig: {{path: {b}}}, namespace: argocd, shards: [far]}}\n\
             engine: {{logTimeout: 2s}}\n",
            a = f.a.kubeconfig.display(),
            b = f.b.kubeconfig.display(),
        );
        let engine = engine(&yaml).await?;
        let far = engine
            .registry()
            .wait_for("far", Duration::from_secs(30), |_| true)
            .await
            .context("destination far")?;
        ensure!(
            matches!(&far, Entry::Ready(d) if d.server == f.b.server.trim_end_matches('/')
                && matches!(d.source, Source::ArgoCdHome { .. })),
            "{far:?}"
        );
        let c_entry = engine
            .registry()
            .wait_for(&far_c, Duration::from_secs(30), |_| true)
            .await
            .context("destination from far's Secret on b")?;
        ensure!(matches!(c_entry, Entry::Ready(_)), "{c_entry:?}");

        let placements = |job: &dispatch_server::engine::JobRef| -> Vec<String> {
            job.placements
                .iter()
                .map(|p| p.destination.clone())
                .collect()
        };
        // The unsharded Stage: main, on the control plane.
        let run_main = run_context("kargo-demo", Some(&s_main));
        let main = ensure_stage(&engine, &run_main).await?;
        ensure!(placements(&main) == [IN_CLUSTER_NAME], "{main:?}");
        // Shard far: b (kubernetes.default.svc, twice) and c (far's Secret), read on b.
        let run_far = run_context("kargo-demo", Some(&s_far));
        let far_run = ensure_stage(&engine, &run_far).await?;
        ensure!(
            placements(&far_run) == ["far".to_string(), far_c.clone()],
            "{far_run:?}"
        );
        for (job, clusters) in [(&main, vec![&f.a]), (&far_run, vec![&f.b, &f.c])] {
            let v = wait_verdict(&engine, job, &Redactor::default(), VERDICT_TIMEOUT, |v| {
                v.phase.is_terminal()
            })
            .await?;
            ensure!(v.phase == Phase::Successful, "{v:?}");
            for cl in clusters {
                ensure!(
                    jobs_of(cl, &job.run_uid).await?.len() == 1,
                    "one job on {}",
                    cl.name
                );
            }
        }
        ensure!(
            jobs_of(&f.a, &run_far.uid).await?.is_empty(),
            "nothing of shard far on the control plane"
        );

        // A shard no instance serves: refused, nothing read or created elsewhere.
        let run_mars = run_context("kargo-demo", Some(&s_mars));
        let e = ensure_stage(&engine, &run_mars)
            .await
            .unwrap_err()
            .to_string();
        ensure!(
            e.contains(&format!(
                "Stage kargo-demo/{s_mars} belongs to shard \"mars\""
            )) && e.contains("`shards` of the `argocd[]` instance"),
            "{e}"
        );
        for cl in [&f.a, &f.b, &f.c] {
            ensure!(
                jobs_of(cl, &run_mars.uid).await?.is_empty(),
                "no job on {}",
                cl.name
            );
        }

        // Clean up what this test created (its Jobs go with their TTL and the sweep).
        let del = DeleteParams::default();
        Api::<Secret>::namespaced(cb.clone(), "argocd")
            .delete(&far_c_secret, &del)
            .await?;
        for (client, name) in [
            (&ca, &app_main),
            (&cb, &app_main),
            (&cb, &app_far),
            (&cb, &app_far_c),
        ] {
            dynamic_api(
                client,
                "argocd",
                "argoproj.io",
                "Application",
                "applications",
            )
            .delete(name, &del)
            .await?;
        }
        let stages = dynamic_api(&ca, "kargo-demo", "kargo.akuity.io", "Stage", "stages");
        for s in [&s_main, &s_far, &s_mars] {
            stages.delete(s, &del).await?;
        }
        Ok(())
    })
}
