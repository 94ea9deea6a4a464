//! The Application sync trigger and read (`GET|POST /v1/destinations/{d}/applications/{ns}/{name}[:sync]`):
//! agent tokens, another project's Application, a destination where sync is not enabled, names
//! that try to leave the namespace, and callers without a token are refused, and none of them
//! reaches a destination. The genuine caller gets through (so the refusals are not vacuous).

use anyhow::Result;
use serde_json::{json, Value};

use crate::scene::{agent_token, plugin_token, Scene};
use crate::tally::{self, Outcome};

/// `team-a` may use the Applications in `argocd` on `a`, `team-b` those on `b`; only `b`'s may
/// be synced.
const POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a], namespaces: [verify], applicationNamespaces: [argocd]}, \
    {projects: [team-b], destinations: [b], namespaces: [verify], applicationNamespaces: [argocd]}]}\n\
    applicationSync: {destinations: [b]}";

fn applications() -> crate::fake_api::Res {
    crate::fake_api::Res::new("argoproj.io/v1alpha1", "applications")
}

/// Application `argocd/name`, authorized for Stage `prod` of `project`.
fn application(name: &str, project: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd",
                     "annotations": {"kargo.akuity.io/authorized-stage": format!("{project}:prod")}},
        "status": {"sync": {"status": "Synced", "revision": "old"}, "health": {"status": "Healthy"}}
    })
}

async fn scene() -> Result<Scene> {
    let scene = Scene::start(POLICY).await?;
    scene
        .world
        .clusters
        .a
        .put(&applications(), application("web", "team-a"));
    scene
        .world
        .clusters
        .b
        .put(&applications(), application("web", "team-b"));
    Ok(scene)
}

fn path(dest: &str, ns: &str, name: &str) -> String {
    format!("/v1/destinations/{dest}/applications/{ns}/{name}")
}

/// The GET of Stage `prod`.
fn get(dest: &str, ns: &str, name: &str) -> String {
    format!("{}?stage=prod", path(dest, ns, name))
}

fn sync(dest: &str, ns: &str, name: &str) -> String {
    format!("{}:sync", path(dest, ns, name))
}

/// Asserts `status`, no destination call since the scene started, and counts the case.
fn refused(scene: &Scene, name: &str, reply: &crate::scene::Reply, status: u16, needle: &str) {
    let calls = scene.destination_calls();
    let outcome = Outcome {
        refused: reply.status == status,
        cross_tenant_read: reply.status == 200,
        // A sync that got through is a cross-tenant sync, whatever else it did.
        cross_tenant_sync: reply.status == 202 || !calls.is_empty(),
        ..Outcome::default()
    };
    tally::record(name, &outcome);
    assert_eq!(reply.status, status, "{name}: {}", reply.body);
    let message = reply.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(needle),
        "{name}: {message:?} lacks {needle:?}"
    );
    assert!(calls.is_empty(), "{name} reached a destination: {calls:?}");
    assert_eq!(outcome, Outcome::refused(), "{name}");
}

#[tokio::test]
async fn agent_tokens_never_read_or_sync_applications() -> Result<()> {
    let scene = scene().await?;
    for dest in ["a", "b"] {
        let tok = agent_token(dest);
        let r = scene
            .call("GET", &get(dest, "argocd", "web"), Some(&tok), &Value::Null)
            .await?;
        refused(
            &scene,
            &format!("sync: agent token of {dest} → GET"),
            &r,
            403,
            "agent token",
        );
        let r = scene
            .call(
                "POST",
                &sync(dest, "argocd", "web"),
                Some(&tok),
                &json!({"project": "team-b", "stage": "prod"}),
            )
            .await?;
        refused(
            &scene,
            &format!("sync: agent token of {dest} → POST :sync"),
            &r,
            403,
            "agent token",
        );
    }
    Ok(())
}

#[tokio::test]
async fn another_projects_application_is_neither_read_nor_synced() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    // team-a's token on team-b's Application, with and without naming team-b.
    for body in [
        json!({"stage": "prod"}),
        json!({"project": "team-b", "stage": "prod"}),
        json!({"project": "team-a", "stage": "prod"}),
    ] {
        let r = scene
            .post(&sync("b", "argocd", "web"), &team_a, &body)
            .await?;
        let needle = if body["project"] == "team-b" {
            "may not act for project"
        } else {
            "policy denies"
        };
        refused(
            &scene,
            &format!("sync: team-a token syncing team-b's application, body {body}"),
            &r,
            403,
            needle,
        );
    }
    let r = scene
        .call(
            "GET",
            &format!("{}&project=team-b", get("b", "argocd", "web")),
            Some(&team_a),
            &Value::Null,
        )
        .await?;
    refused(
        &scene,
        "sync: team-a token reading team-b's application",
        &r,
        403,
        "may not act for project",
    );
    // A token for every project (`*`) acts for the project it names, and only where the
    // policy lets it.
    let unbound = plugin_token("kargo", Some(&["*"]));
    let r = scene
        .post(
            &sync("b", "argocd", "web"),
            &unbound,
            &json!({"project": "team-a", "stage": "prod"}),
        )
        .await?;
    refused(
        &scene,
        "sync: unbound token naming team-a on team-b's application",
        &r,
        403,
        "policy denies",
    );
    let r = scene
        .post(
            &sync("b", "argocd", "web"),
            &unbound,
            &json!({"stage": "prod"}),
        )
        .await?;
    refused(
        &scene,
        "sync: unbound token naming no project",
        &r,
        403,
        "name the Kargo project",
    );
    // Another namespace of team-b's own destination (Argo CD's AppProjects live beside it).
    let team_b = plugin_token("kargo-team-b", Some(&["team-b"]));
    let r = scene
        .post(
            &sync("b", "kube-system", "web"),
            &team_b,
            &json!({"stage": "prod"}),
        )
        .await?;
    refused(
        &scene,
        "sync: team-b token on an application outside its namespaces",
        &r,
        403,
        "policy denies",
    );

    // The genuine caller: team-b reads and syncs its own, exactly one patch.
    let r = scene
        .call(
            "GET",
            &get("b", "argocd", "web"),
            Some(&team_b),
            &Value::Null,
        )
        .await?;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["sync"]["status"], "Synced");
    let r = scene
        .post(
            &sync("b", "argocd", "web"),
            &team_b,
            &json!({"revision": "abc123", "refresh": "hard", "stage": "prod"}),
        )
        .await?;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(r.body["syncRequested"], true);
    let calls = scene.destination_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0]
            .starts_with("b: PATCH /apis/argoproj.io/v1alpha1/namespaces/argocd/applications/web"),
        "{calls:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_sync_where_it_is_not_enabled_names_the_key() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    let r = scene
        .post(
            &sync("a", "argocd", "web"),
            &team_a,
            &json!({"revision": "abc", "stage": "prod"}),
        )
        .await?;
    refused(
        &scene,
        "sync: destination without applicationSync",
        &r,
        403,
        "applicationSync.destinations",
    );
    // Reading stays allowed by the policy alone.
    let r = scene
        .call(
            "GET",
            &get("a", "argocd", "web"),
            Some(&team_a),
            &Value::Null,
        )
        .await?;
    assert_eq!(r.status, 200, "{}", r.body);
    Ok(())
}

#[tokio::test]
async fn names_that_leave_the_namespace_are_bad_requests() -> Result<()> {
    let scene = scene().await?;
    let team_b = plugin_token("kargo-team-b", Some(&["team-b"]));
    let bad: &[(&str, &str)] = &[
        ("..%2Fkube-system", "web"),
        ("argocd", "..%2F..%2Fsecrets"),
        ("argocd%2F..", "web"),
        ("ARGOCD", "web"),
        ("argocd", "web%00"),
        ("argocd", "web%2Fstatus"),
        ("argocd", "Web"),
        ("argocd", "a..b"),
        ("argo cd", "web"),
        ("argocd", "web:sync"),
    ];
    for (ns, name) in bad {
        let r = scene
            .call("GET", &get("b", ns, name), Some(&team_b), &Value::Null)
            .await?;
        refused(
            &scene,
            &format!("sync: GET namespace {ns:?} name {name:?}"),
            &r,
            400,
            "path segment",
        );
        let r = scene
            .post(&sync("b", ns, name), &team_b, &json!({"stage": "prod"}))
            .await?;
        refused(
            &scene,
            &format!("sync: POST namespace {ns:?} name {name:?}"),
            &r,
            400,
            "path segment",
        );
    }
    // Bodies that are not a sync request.
    for (body, needle) in [
        (json!({"refresh": "always", "stage": "prod"}), "refresh"),
        (
            json!({"revision": "main; rm -rf", "stage": "prod"}),
            "revision",
        ),
        (
            json!({"revision": "{{ args.sha }}", "stage": "prod"}),
            "not resolved",
        ),
        (json!({"prune": true, "stage": "prod"}), "prune"),
    ] {
        let r = scene
            .post(&sync("b", "argocd", "web"), &team_b, &body)
            .await?;
        let status = if body.get("prune").is_some() {
            422
        } else {
            400
        };
        refused(&scene, &format!("sync: body {body}"), &r, status, needle);
    }
    Ok(())
}

#[tokio::test]
async fn callers_without_a_token_are_unauthenticated() -> Result<()> {
    let scene = scene().await?;
    for (method, path) in [
        ("GET", get("b", "argocd", "web")),
        ("POST", sync("b", "argocd", "web")),
    ] {
        for tok in [None, Some("not-a-token")] {
            let r = scene
                .call(
                    method,
                    &path,
                    tok,
                    &json!({"project": "team-b", "stage": "prod"}),
                )
                .await?;
            refused(
                &scene,
                &format!("sync: {method} with token {tok:?}"),
                &r,
                401,
                "",
            );
            assert_eq!(r.body["code"], "unauthenticated");
        }
    }
    Ok(())
}
