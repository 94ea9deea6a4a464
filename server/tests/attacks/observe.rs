//! Observe checks (`rollout:`, `application:`) redirected by a tenant: the block of a status
//! call names another Rollout than the one the measurement started on (the block is in the
//! AnalysisRun, which tenants can edit) → the verdict is still the signed reference's Rollout;
//! the reference edited to observe another Rollout → 403, no destination call; an observed
//! object in a namespace the policy does not give the project → 403 at ensure. None of them
//! writes or deletes anything on a destination.

use anyhow::{ensure, Result};
use dispatch_api::v1::{self, Ensured, MeasurementRef, Verdict};
use dispatch_server::engine::{JobRef, REF_KEY};
use serde_json::{json, Value};

use crate::fake_api::{FakeApi, Res};
use crate::scene::{measurement, plugin_token, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};
use crate::world::NS;

fn rollouts() -> Res {
    Res::new("argoproj.io/v1alpha1", "rollouts")
}

/// Rollout `NS/name` on `image`, fully promoted and Healthy, its generation observed.
fn put_rollout(api: &FakeApi, name: &str, image: &str) {
    api.put(
        &rollouts(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid")},
            "spec": {"strategy": {"canary": {}},
                     "template": {"spec": {"containers": [{"name": "app", "image": image}]}}},
            "status": {"currentPodHash": "h1", "stableRS": "h1", "phase": "Healthy"}
        }),
    );
    api.update(&rollouts(), NS, name, |r| {
        r["status"]["observedGeneration"] = json!(r["metadata"]["generation"].to_string());
    });
}

fn observing(run: (&str, &str, &str), rollout: Value) -> MeasurementRef {
    let mut m = measurement(run, "rollout", 1, "a");
    m.block = json!({"destination": "a", "rollout": rollout});
    m
}

/// Team `team-a` observes Rollout `web` (still on image `:1`, so `Running`) on `a`, where
/// Rollout `payments` is done on `:2`.
async fn started() -> Result<(Scene, String, MeasurementRef)> {
    let scene = Scene::start(TENANTS_POLICY).await?;
    let a = &scene.world.clusters.a;
    put_rollout(a, "web", "shop/web:1");
    put_rollout(a, "payments", "shop/web:2");
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let mut req = observing(
        ("team-a", "run-o1", "uid-o1"),
        json!({"name": "web", "image": "shop/web:2"}),
    );
    let reply = scene.post(v1::ENSURE, &controller, &req).await?;
    ensure!(reply.status == 200, "ensure: {:?}", reply.body);
    let ensured: Ensured = serde_json::from_value(reply.body)?;
    req.metadata = ensured.metadata;
    Ok((scene, controller, req))
}

/// A 403 with no destination call is a clean refusal; a 200 read what it should not.
fn forbidden(status: u16, calls: &[String]) -> Outcome {
    Outcome {
        refused: status == 403 && calls.is_empty(),
        cross_tenant_read: status == 200,
        cross_tenant_delete: !calls.is_empty(),
        secret_leak: false,
        ..Outcome::default()
    }
}

#[tokio::test]
async fn a_status_block_naming_another_rollout_still_observes_the_signed_one() -> Result<()> {
    let (scene, controller, genuine) = started().await?;
    let mut redirected = genuine.clone();
    redirected.block =
        json!({"destination": "a", "rollout": {"name": "payments", "image": "shop/web:2"}});
    let before = scene.calls_mark();
    let reply = scene.post(v1::STATUS, &controller, &redirected).await?;
    let calls = scene.calls_since(before);
    ensure!(reply.status == 200, "{:?}", reply.body);
    let v: Verdict = serde_json::from_value(reply.body)?;
    let observed_web = v.phase == "Running"
        && v.message.contains(&format!("{NS}/web"))
        && !v.message.contains("payments");
    let outcome = Outcome {
        refused: observed_web && calls.is_empty(),
        // Another Rollout's verdict handed to this measurement.
        cross_tenant_read: v.message.contains("payments") || v.phase == "Successful",
        cross_tenant_delete: !calls.is_empty(),
        secret_leak: false,
        ..Outcome::default()
    };
    tally::refused("observe: status block names another Rollout", outcome);
    Ok(())
}

#[tokio::test]
async fn a_reference_edited_to_observe_another_rollout_is_refused() -> Result<()> {
    let (scene, controller, genuine) = started().await?;
    let mut r = JobRef::from_metadata(&genuine.metadata)?;
    let Some(dispatch_api::observe::Observe::Rollout(check)) = r.observe.as_mut() else {
        anyhow::bail!("the reference carries no rollout check: {r:?}");
    };
    check.name = "payments".into();
    let mut forged = genuine.clone();
    forged
        .metadata
        .insert(REF_KEY.into(), serde_json::to_string(&r)?);
    for route in [v1::STATUS, v1::TERMINATE] {
        let before = scene.calls_mark();
        let reply = scene.post(route, &controller, &forged).await?;
        let calls = scene.calls_since(before);
        let message = reply.body["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains("not signed by this server"),
            "{route}: {message}"
        );
        tally::refused(
            &format!("observe: reference edited to observe another Rollout → {route}"),
            forbidden(reply.status, &calls),
        );
    }
    Ok(())
}

#[tokio::test]
async fn observing_a_namespace_the_policy_does_not_give_is_refused_at_ensure() -> Result<()> {
    let scene = Scene::start(TENANTS_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    for (case, check) in [
        (
            "rollout",
            json!({"rollout": {"name": "web", "namespace": "kube-system"}}),
        ),
        (
            "application",
            json!({"application": {"name": "prod", "namespace": "argocd"}}),
        ),
    ] {
        let mut req = measurement(("team-a", "run-o2", "uid-o2"), "rollout", 1, "a");
        let mut block = check;
        block["destination"] = json!("a");
        req.block = block;
        let before = scene.calls_mark();
        let reply = scene.post(v1::ENSURE, &controller, &req).await?;
        let calls = scene.calls_since(before);
        let message = reply.body["message"].as_str().unwrap_or_default();
        ensure!(
            reply.status != 200 && (message.contains("kube-system") || message.contains("argocd")),
            "{case}: {} {message}",
            reply.status
        );
        tally::refused(
            &format!("observe: {case} in a namespace outside the project's policy"),
            forbidden(reply.status, &calls),
        );
    }
    Ok(())
}
