//! Argo CD cluster Secret abuse: whoever can write Secrets in the Argo CD namespace tries to
//! take over a destination name, run a command inside the server, or turn TLS verification off
//! unnoticed. The engine watches the Secrets on the fake control plane live.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use dispatch_server::destinations::Entry;
use serde_json::{json, Value};

use crate::budgets::{measurement, POLICY};
use crate::fake_api::Res;
use crate::scene::{token, Scene};
use crate::tally::{self, Outcome};
use crate::world::WAIT;

const ARGOCD: &str = "argocd: {namespace: argocd, inCluster: false, defaultNamespace: verify, \
                      execProviders: [/usr/local/bin/approved-helper]}";

/// Puts the cluster Secret `secret` (data `name`, `server`, `config`) on the control plane.
fn put_secret(scene: &Scene, secret: &str, name: &str, server: &str, config: &Value) {
    let b64 = |s: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let data: BTreeMap<&str, String> = [
        ("name", b64(name)),
        ("server", b64(server)),
        ("config", b64(&config.to_string())),
    ]
    .into();
    scene.world.clusters.cp.put(
        &Res::new("v1", "secrets"),
        json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret, "namespace": "argocd",
                         "labels": {"argocd.argoproj.io/secret-type": "cluster", "tier": "argo"}},
            "data": data,
        }),
    );
}

/// Waits until destination `name` is registered and `accept` holds.
async fn registered(scene: &Scene, name: &str, accept: impl Fn(&Entry) -> bool) -> Result<Entry> {
    scene
        .world
        .engine
        .registry()
        .wait_for(name, WAIT, accept)
        .await
        .with_context(|| format!("destination {name} not registered as expected"))
}

/// Ensures a measurement on `destination`; returns the status code and the reply as text.
async fn ensure_on(scene: &Scene, n: u32, destination: &str) -> Result<(u16, String)> {
    let reply = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&token("plugin", |_| {})),
            &measurement(n, json!({"destination": destination})),
        )
        .await?;
    Ok((reply.status, reply.body.to_string()))
}

/// `GET /v1/destinations` as the plugin.
async fn destination_rows(scene: &Scene) -> Result<crate::scene::Reply> {
    scene
        .call(
            "GET",
            dispatch_api::v1::DESTINATIONS,
            Some(&token("plugin", |_| {})),
            &json!({}),
        )
        .await
}

/// Job creations on the fake destinations: none may go through a broken destination.
pub(crate) fn job_creations(scene: &Scene) -> Vec<String> {
    scene
        .destination_calls()
        .into_iter()
        .filter(|c| c.contains("POST") && c.contains("/jobs"))
        .collect()
}

#[tokio::test]
async fn two_secrets_with_one_name_break_the_destination_for_both() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD}")).await?;
    let (a, b) = (
        scene.world.clusters.a.url().to_string(),
        scene.world.clusters.b.url().to_string(),
    );
    put_secret(
        &scene,
        "cluster-prod",
        "prod",
        &a,
        &json!({"bearerToken": "a-token"}),
    );
    registered(&scene, "prod", |e| matches!(e, Entry::Ready(_))).await?;
    // A second Secret claims the name, pointing at another cluster.
    put_secret(
        &scene,
        "cluster-prod-evil",
        "prod",
        &b,
        &json!({"bearerToken": "b-token"}),
    );
    let entry = registered(&scene, "prod", |e| matches!(e, Entry::Broken(_))).await?;
    let Entry::Broken(broken) = entry else {
        unreachable!("waited for a broken entry")
    };
    assert!(
        broken.error.contains("argocd/cluster-prod,")
            || broken.error.contains("argocd/cluster-prod "),
        "{}",
        broken.error
    );
    assert!(
        broken.error.contains("argocd/cluster-prod-evil"),
        "{}",
        broken.error
    );
    let (status, reply) = ensure_on(&scene, 10, "prod").await?;
    assert!(reply.contains("cluster-prod-evil"), "{status}: {reply}");
    let rows = destination_rows(&scene).await?;
    let row = rows
        .body
        .as_array()
        .and_then(|r| r.iter().find(|r| r["name"] == "prod"))
        .cloned();
    assert_eq!(
        row.as_ref().map(|r| r["connected"].clone()),
        Some(json!(false)),
        "{row:?}"
    );
    let created = job_creations(&scene);
    tally::refused(
        "argocd: a second Secret named like an existing destination → both refused, no Job",
        Outcome {
            refused: created.is_empty(),
            ..Outcome::default()
        },
    );
    assert!(created.is_empty(), "{created:?}");
    // The extra Secret goes: the first one's destination is usable again.
    scene
        .world
        .clusters
        .cp
        .remove(&Res::new("v1", "secrets"), "argocd", "cluster-prod-evil");
    registered(
        &scene,
        "prod",
        |e| matches!(e, Entry::Ready(d) if d.server == a),
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn an_exec_provider_outside_the_allowlist_is_refused() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD}")).await?;
    let marker =
        std::env::temp_dir().join(format!("rollouts-dispatch-pwned-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let exec = json!({"execProviderConfig": {
        "command": "/bin/sh",
        "args": ["-c", format!("touch {}", marker.display())],
        "apiVersion": "client.authentication.k8s.io/v1beta1"
    }});
    put_secret(
        &scene,
        "cluster-exec",
        "exec",
        scene.world.clusters.a.url(),
        &exec,
    );
    let entry = registered(&scene, "exec", |e| matches!(e, Entry::Broken(_))).await?;
    let Entry::Broken(broken) = entry else {
        unreachable!("waited for a broken entry")
    };
    assert!(broken.error.contains("\"/bin/sh\""), "{}", broken.error);
    assert!(
        broken.error.contains("argocd.execProviders"),
        "{}",
        broken.error
    );
    let (_, reply) = ensure_on(&scene, 11, "exec").await?;
    assert!(reply.contains("argocd.execProviders"), "{reply}");
    let created = job_creations(&scene);
    let ran = marker.exists();
    tally::refused(
        "argocd: execProviderConfig running /bin/sh (not allowlisted) → destination broken, nothing run",
        Outcome {
            refused: created.is_empty() && !ran,
            ..Outcome::default()
        },
    );
    assert!(!ran, "the exec provider ran");
    Ok(())
}

#[tokio::test]
async fn an_insecure_secret_is_shown_wherever_destinations_are_listed() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD}")).await?;
    let config = json!({"bearerToken": "a-token", "tlsClientConfig": {"insecure": true}});
    put_secret(
        &scene,
        "cluster-lax",
        "lax",
        scene.world.clusters.a.url(),
        &config,
    );
    registered(&scene, "lax", |e| matches!(e, Entry::Ready(_))).await?;
    let rows = destination_rows(&scene).await?;
    let warnings = |name: &str| {
        rows.body
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == name))
            .map(|r| r["warnings"].clone())
    };
    let lax = warnings("lax").unwrap_or_default();
    let shown = lax
        .to_string()
        .contains("insecure: TLS certificates are not verified");
    assert!(shown, "{:?}", rows.body);
    // A verified destination has no warning (old clients see no new field).
    assert_eq!(warnings("a"), Some(Value::Null), "{:?}", rows.body);
    let doctor_row = scene
        .world
        .engine
        .registry()
        .get("lax")
        .map(|e| e.warnings())
        .unwrap_or_default();
    tally::refused(
        "argocd: tlsClientConfig.insecure → shown in /v1/destinations and doctor, not silent",
        Outcome {
            refused: shown && !doctor_row.is_empty(),
            ..Outcome::default()
        },
    );
    Ok(())
}

/// What whoever writes Argo CD cluster Secrets tries against the names the platform team owns
/// (#27): `in-cluster` on.
const ARGOCD_IN_CLUSTER: &str =
    "argocd: {namespace: argocd, inCluster: true, defaultNamespace: verify}";

/// Puts the Secret of a destination `sentinel` and waits for it: the watch applies Secrets in
/// order, so every Secret put before it has been seen.
async fn seen(scene: &Scene, n: u32) -> Result<()> {
    let name = format!("sentinel-{n}");
    let b = scene.world.clusters.b.url().to_string();
    put_secret(scene, &name, &name, &b, &json!({"bearerToken": "b-token"}));
    registered(scene, &name, |e| matches!(e, Entry::Ready(_))).await?;
    Ok(())
}

/// Job creations on every fake cluster, the control plane included.
fn all_job_creations(scene: &Scene) -> Vec<String> {
    let on_cp = scene.world.clusters.cp.calls("POST", "/jobs");
    let mut created = job_creations(scene);
    created.extend((0..on_cp).map(|_| "cp: POST jobs".to_string()));
    created
}

#[tokio::test]
async fn a_secret_never_shadows_a_configured_destination_or_in_cluster() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD_IN_CLUSTER}")).await?;
    let (a, b) = (
        scene.world.clusters.a.url().to_string(),
        scene.world.clusters.b.url().to_string(),
    );
    let b_token = json!({"bearerToken": "b-token"});
    // Configured `a` and the implicit in-cluster, claimed by Secrets pointing at cluster b.
    put_secret(&scene, "cluster-a-evil", "a", &b, &b_token);
    put_secret(
        &scene,
        "cluster-in-cluster-evil",
        "in-cluster",
        &b,
        &b_token,
    );
    seen(&scene, 1).await?;
    let a_kept = scene
        .world
        .engine
        .registry()
        .get("a")
        .is_some_and(|e| e.server() == a && !e.source().is_argocd());
    let in_cluster = scene.world.engine.registry().get("in-cluster");
    let in_cluster_kept = in_cluster.as_ref().is_some_and(|e| {
        matches!(
            e.source(),
            dispatch_server::destinations::Source::ArgoCdInCluster { .. }
        )
    });
    let (status, reply) = ensure_on(&scene, 20, "a").await?;
    let on_b = job_creations(&scene)
        .iter()
        .filter(|c| c.starts_with("b:"))
        .count();
    tally::refused(
        "argocd: a Secret named like configured destination `a`, pointing elsewhere → ignored, a's Jobs stay on a",
        Outcome {
            refused: a_kept && status == 200 && on_b == 0,
            ..Outcome::default()
        },
    );
    assert!(a_kept && status == 200 && on_b == 0, "{status}: {reply}");
    tally::refused(
        "argocd: a Secret named `in-cluster` → ignored, in-cluster stays the implicit one",
        Outcome {
            refused: in_cluster_kept,
            ..Outcome::default()
        },
    );
    assert!(
        in_cluster_kept,
        "{:?}",
        in_cluster.map(|e| e.source().clone())
    );
    Ok(())
}

#[tokio::test]
async fn a_secret_without_credentials_never_gets_the_servers_own() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{ARGOCD_IN_CLUSTER}")).await?;
    let b = scene.world.clusters.b.url().to_string();
    // The cluster Argo CD runs on, under a name of the tenant's choosing and no namespace
    // limit: once the control plane with the server's own credentials.
    put_secret(
        &scene,
        "cluster-local",
        "local",
        "https://kubernetes.default.svc",
        &json!({}),
    );
    let with_token = json!({"bearerToken": "stolen-or-not"});
    put_secret(
        &scene,
        "cluster-local-token",
        "local-2",
        "https://kubernetes.default.svc/",
        &with_token,
    );
    // Another server, no credentials at all.
    put_secret(&scene, "cluster-anon", "anon", &b, &json!({}));
    seen(&scene, 2).await?;
    let registry = scene.world.engine.registry();
    for (n, name) in [(21, "local"), (22, "local-2")] {
        let absent = registry.get(name).is_none();
        let (status, reply) = ensure_on(&scene, n, name).await?;
        let created = all_job_creations(&scene);
        let case = format!(
            "argocd: a Secret `{name}` for https://kubernetes.default.svc → never a destination, no Job"
        );
        let outcome = Outcome {
            refused: absent && status != 200 && created.is_empty(),
            ..Outcome::default()
        };
        tally::record(&case, &outcome);
        assert!(outcome.refused, "{case}: {status} {reply} {created:?}");
    }
    let anon = registered(&scene, "anon", |e| matches!(e, Entry::Broken(_))).await?;
    let Entry::Broken(broken) = anon else {
        unreachable!("waited for a broken entry")
    };
    let (status, reply) = ensure_on(&scene, 23, "anon").await?;
    let created = all_job_creations(&scene);
    let refused = broken.error.contains("gives no credentials")
        && reply.contains("never reaches a cluster Secret's server with its own credentials")
        && created.is_empty();
    tally::refused(
        "argocd: a Secret with no credentials → destination broken, never the server's own, no Job",
        Outcome {
            refused,
            ..Outcome::default()
        },
    );
    assert!(refused, "{}: {status} {reply} {created:?}", broken.error);
    Ok(())
}
