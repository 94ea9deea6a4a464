//! `destination: stage` and Argo CD destinations: the control plane holds an Argo CD cluster
//! Secret for cluster `a` (watched live), a Kargo Stage whose last promotion updated an
//! Application, and that Application; the engine must run the Job on the Secret's destination,
//! resolve the Stage once per run, and forget the destination when the Secret goes.

use std::collections::BTreeMap;

use anyhow::Result;
use dispatch_server::engine::Outcome;
use dispatch_server::job::LABEL_DESTINATION;
use dispatch_server::logs::Redactor;
use dispatch_server::{EngineError, Phase};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use serde_json::{json, Value};

use crate::cluster_side::job;
use crate::fake_api::{FakeApi, Res};
use crate::world::{block, eventually, request, run, Clusters, PROJECT};

const ARGOCD: &str = "argocd: {namespace: argocd, inCluster: false, defaultNamespace: verify}";

pub(crate) fn secrets() -> Res {
    Res::new("v1", "secrets")
}

/// The Argo CD cluster Secret that registers `server` as destination `name`.
pub(crate) fn cluster_secret(cp: &FakeApi, name: &str, server: &str) -> Result<()> {
    let data = |s: &str| ByteString(s.as_bytes().to_vec());
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("cluster-{name}")),
            namespace: Some("argocd".into()),
            labels: Some(BTreeMap::from([
                (
                    "argocd.argoproj.io/secret-type".to_string(),
                    "cluster".to_string(),
                ),
                ("env".to_string(), "prod".to_string()),
            ])),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("name".to_string(), data(name)),
            ("server".to_string(), data(server)),
            (
                "config".to_string(),
                data(r#"{"bearerToken": "argocd-token"}"#),
            ),
        ])),
        ..Default::default()
    };
    let mut value = serde_json::to_value(secret)?;
    value["apiVersion"] = "v1".into();
    value["kind"] = "Secret".into();
    cp.put(&secrets(), value);
    Ok(())
}

/// Stage `uat` of [`PROJECT`], last promoted through Application `argocd/app-uat`, which
/// deploys to `destination` (`{"server": …}` or `{"name": …}`).
fn stage_and_application(cp: &FakeApi, destination: Value) {
    cp.put(
        &Res::new("kargo.akuity.io/v1alpha1", "stages"),
        json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
            "metadata": {"name": "uat", "namespace": PROJECT, "annotations": {
                "kargo.akuity.io/argocd-context": r#"[{"name": "app-uat", "namespace": "argocd"}]"#
            }}
        }),
    );
    cp.put(
        &Res::new("argoproj.io/v1alpha1", "applications"),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "app-uat", "namespace": "argocd"},
            "spec": {"destination": destination}
        }),
    );
}

#[tokio::test]
async fn stage_runs_the_job_where_the_stage_promoted_to() -> Result<()> {
    let clusters = Clusters::start().await?;
    let a_url = clusters.a.url().to_string();
    cluster_secret(&clusters.cp, "prod-a", &a_url)?;
    // By name: by server, configured `a` (the same server) would win over the Secret (#27).
    stage_and_application(&clusters.cp, json!({"name": "prod-a", "namespace": "uat"}));
    let w = clusters.engine("", ARGOCD, true).await?;

    let run = run(1);
    let config = block(json!({"destination": "stage"}))?;
    let ensured = w
        .engine
        .ensure(&request(&run, "smoke", 1, config.clone()))
        .await?;
    assert_eq!(ensured.outcomes, vec![("prod-a".into(), Outcome::Created)]);
    let created = job(w.api("a"), &ensured.job.name)?;
    let labels = created.metadata.labels.unwrap_or_default();
    assert_eq!(labels[LABEL_DESTINATION], "prod-a");
    let stage_reads = w.clusters.cp.calls("GET", "/stages/uat");
    assert_eq!(stage_reads, 1);
    w.engine.ensure(&request(&run, "smoke", 2, config)).await?;
    assert_eq!(
        w.clusters.cp.calls("GET", "/stages/uat"),
        1,
        "resolved once per run"
    );

    // The Secret goes: so does the destination, live.
    w.clusters.cp.remove(&secrets(), "argocd", "cluster-prod-a");
    eventually("prod-a unregistered", || {
        let gone = w.engine.registry().get("prod-a").is_none();
        async move { Ok(gone.then_some(())) }
    })
    .await?;
    let v = w.engine.status(&ensured.job, &Redactor::default()).await;
    assert_eq!(v.phase, Phase::Error);
    assert!(v.message.contains("is no longer known"), "{}", v.message);
    Ok(())
}

#[tokio::test]
async fn a_stage_that_cannot_be_resolved_says_why() -> Result<()> {
    let clusters = Clusters::start().await?;
    let w = clusters.engine("", ARGOCD, true).await?;
    let config = block(json!({"destination": "stage"}))?;

    let mut manual = run(2);
    manual.labels.clear();
    let e = w
        .engine
        .ensure(&request(&manual, "smoke", 1, config.clone()))
        .await
        .unwrap_err();
    assert!(matches!(e, EngineError::Stage(_)), "{e}");
    assert!(
        e.to_string().contains("has no kargo.akuity.io/stage label"),
        "{e}"
    );

    let e = w
        .engine
        .ensure(&request(&run(3), "smoke", 1, config.clone()))
        .await
        .unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("Stage {PROJECT}/uat does not exist")),
        "{e}"
    );

    // Promoted to a cluster no Secret registers.
    stage_and_application(
        &w.clusters.cp,
        json!({"server": "https://elsewhere.example:6443", "namespace": "uat"}),
    );
    let e = w
        .engine
        .ensure(&request(&run(4), "smoke", 1, config))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("register the cluster in Argo CD"),
        "{e}"
    );
    assert!(w.api("a").list(&crate::cluster_side::jobs()).is_empty());
    Ok(())
}
