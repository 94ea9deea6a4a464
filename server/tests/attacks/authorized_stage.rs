//! Applications are authorized the way Kargo authorizes them (`kargo.akuity.io/authorized-stage`
//! must list the caller's `<project>:<stage>`): a tenant whose policy grants the Applications'
//! namespace tries to read or sync an Application that is not its Stage's — one with no
//! annotation, another project's, another Stage of its own project, one that names it only by
//! a glob Kargo rejects — or to use a namespace granted for Jobs only, or forges an agent record
//! that the agent must refuse on its own. Every refusal is `403` naming the annotation and the
//! entry to add, says nothing of the Application (not its annotation, not whether it exists),
//! and patches nothing; a case that got through records `cross_tenant_sync`.

use std::sync::Arc;

use anyhow::{Context, Result};
use dispatch_api::agent::{self as agent_api, ReportRequest, SyncOrder, WorkItem};
use dispatch_api::observe::StageRef;
use dispatch_server::agent::{Guard, Worker};
use dispatch_server::applications::api_record;
use dispatch_server::podsecurity::{Origin, Profile};
use serde_json::{json, Value};

use crate::scene::{agent_token, plugin_token, Reply, Scene};
use crate::tally::{self, Outcome};

/// `team-a` may read and sync the Applications of `argocd` on `a` and on the agent destination
/// `edge`, and place Jobs in `verify` (which holds Applications too: granted for Jobs only).
const POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a, edge], namespaces: [verify], applicationNamespaces: [argocd]}]}\n\
    applicationSync: {destinations: [a, edge]}\n\
    agents: {store: memory, destinations: [{name: edge, namespace: verify}]}";

const ANN: &str = "kargo.akuity.io/authorized-stage";

fn applications() -> crate::fake_api::Res {
    crate::fake_api::Res::new("argoproj.io/v1alpha1", "applications")
}

/// Application `ns/name`, with the annotation `authorized` (none: `None`).
fn application(ns: &str, name: &str, authorized: Option<&str>) -> Value {
    let annotations = match authorized {
        Some(v) => json!({ ANN: v }),
        None => json!({}),
    };
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "status": {"sync": {"status": "Synced", "revision": "old"}, "health": {"status": "Healthy"}}
    })
}

/// The Applications on `a` (the direct destination, also the agent's own cluster): `mine` is
/// team-a's `prod`; the others are not, each in its own way.
const APPS: &[(&str, Option<&str>)] = &[
    ("mine", Some("team-a:prod")),
    ("bare", None),
    ("foreign", Some("team-b:prod")),
    ("uat-only", Some("team-a:uat")),
    ("glob-stage", Some("team-a:*")),
    ("glob-all", Some("*:*")),
    ("glob-bare", Some("*")),
    ("glob-prefix", Some("team-a:pro*")),
    ("glob-in-list", Some("team-a:prod,team-a:*")),
    ("empty", Some("")),
    ("case", Some("Team-A:Prod")),
];

async fn scene() -> Result<Scene> {
    let scene = Scene::start(POLICY).await?;
    for (name, ann) in APPS {
        let app = application("argocd", name, *ann);
        scene.world.clusters.a.put(&applications(), app);
    }
    let verify = application("verify", "mine", Some("team-a:prod"));
    scene.world.clusters.a.put(&applications(), verify);
    Ok(scene)
}

fn get(dest: &str, ns: &str, name: &str, stage: &str) -> String {
    format!("/v1/destinations/{dest}/applications/{ns}/{name}?stage={stage}")
}

/// `GET` of Application `ns/name` on `dest` for Stage `stage`, with `token`.
async fn read(
    scene: &Scene,
    token: &str,
    dest: &str,
    ns: &str,
    name: &str,
    stage: &str,
) -> Result<Reply> {
    let path = get(dest, ns, name, stage);
    scene.call("GET", &path, Some(token), &Value::Null).await
}

fn sync(dest: &str, ns: &str, name: &str) -> String {
    format!("/v1/destinations/{dest}/applications/{ns}/{name}:sync")
}

/// The PATCHes of Applications on `a` so far.
fn patches(scene: &Scene) -> usize {
    scene.world.clusters.a.calls("PATCH", "/applications/")
}

/// Records the outcome of `name`: refused with `status` and `needle`, nothing patched, and no
/// foreign annotation value in the reply; then asserts it.
fn refused(scene: &Scene, name: &str, reply: &Reply, status: u16, needle: &str, secret: &str) {
    let message = reply.body["message"].as_str().unwrap_or_default();
    let leaked = !secret.is_empty() && reply.body.to_string().contains(secret);
    let outcome = Outcome {
        refused: reply.status == status && message.contains(needle),
        cross_tenant_read: reply.status == 200 || leaked,
        cross_tenant_sync: reply.status == 202 || patches(scene) > 0,
        ..Outcome::default()
    };
    tally::record(name, &outcome);
    assert_eq!(reply.status, status, "{name}: {}", reply.body);
    assert!(
        message.contains(needle),
        "{name}: {message:?} lacks {needle:?}"
    );
    assert!(!leaked, "{name}: the reply shows {secret:?}: {message}");
    assert_eq!(patches(scene), 0, "{name} patched an Application");
    assert_eq!(outcome, Outcome::refused(), "{name}");
}

#[tokio::test]
async fn applications_not_authorized_for_the_stage_are_neither_read_nor_synced() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    let mut seen = Vec::new();
    for (app, ann) in APPS.iter().filter(|(n, _)| *n != "mine") {
        // The annotation's own value must not come back (`team-b:prod`, `*:*` …); the
        // caller's own `team-a:prod` is in the fix, so it is no secret.
        // (`team-a:*` is the fix's own example of a glob, `*` too short to look for: the
        // word-for-word comparison below covers them.)
        let secret = ann
            .filter(|v| !["", "*", "team-a:prod", "team-a:*"].contains(v))
            .unwrap_or("");
        let r = read(&scene, &team_a, "a", "argocd", app, "prod").await?;
        let name = format!("stage: GET {app} (annotation {ann:?}) as team-a:prod");
        refused(&scene, &name, &r, 403, ANN, secret);
        // Word for word the refusal of an Application without annotation.
        let text = r.body["message"].as_str().unwrap_or_default();
        let bare = text.replace(&format!("argocd/{app} "), "argocd/bare ");
        seen.push((app.to_string(), bare));
        assert!(r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("\"team-a:prod\""));
        let body = json!({"revision": "evil", "stage": "prod"});
        let r = scene
            .post(&sync("a", "argocd", app), &team_a, &body)
            .await?;
        let name = format!("stage: POST {app}:sync (annotation {ann:?}) as team-a:prod");
        refused(&scene, &name, &r, 403, ANN, secret);
    }
    for (app, text) in &seen {
        assert_eq!(
            text, &seen[0].1,
            "{app} is refused in other words than bare"
        );
    }
    // Another Stage of its own project than the Application lists: `mine` is prod's only.
    for stage in ["uat", "prod2", "pro", "Prod"] {
        let r = read(&scene, &team_a, "a", "argocd", "mine", stage).await;
        let r = r?;
        let status = if stage == "Prod" { 400 } else { 403 };
        let needle = if stage == "Prod" { "stage" } else { ANN };
        refused(
            &scene,
            &format!("stage: GET mine as team-a:{stage}"),
            &r,
            status,
            needle,
            "",
        );
        let body = json!({"stage": stage});
        let r = scene
            .post(&sync("a", "argocd", "mine"), &team_a, &body)
            .await?;
        refused(
            &scene,
            &format!("stage: POST mine:sync as team-a:{stage}"),
            &r,
            status,
            needle,
            "",
        );
    }
    // A missing Application gets the very same answer as one not authorized: no oracle.
    let missing = read(&scene, &team_a, "a", "argocd", "nope", "prod").await?;
    refused(
        &scene,
        "stage: GET a missing Application",
        &missing,
        403,
        ANN,
        "",
    );
    let foreign = read(&scene, &team_a, "a", "argocd", "foreign", "prod").await?;
    let words = |r: &Reply| {
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .replace("nope", "foreign")
    };
    assert_eq!(words(&missing), words(&foreign));

    // The genuine Stage: read, then synced once, named in Argo CD's audit trail.
    let r = read(&scene, &team_a, "a", "argocd", "mine", "prod").await?;
    assert_eq!(r.status, 200, "{}", r.body);
    let body = json!({"revision": "abc", "stage": "prod"});
    let r = scene
        .post(&sync("a", "argocd", "mine"), &team_a, &body)
        .await?;
    assert_eq!(r.status, 202, "{}", r.body);
    assert_eq!(patches(&scene), 1);
    let stored = scene
        .world
        .clusters
        .a
        .get(&applications(), "argocd", "mine")
        .context("mine")?;
    assert_eq!(
        stored["operation"]["initiatedBy"]["username"],
        "rollouts-dispatch:team-a/prod"
    );
    Ok(())
}

#[tokio::test]
async fn the_stage_is_required_and_never_a_glob() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    let path = "/v1/destinations/a/applications/argocd/mine";
    let r = scene.call("GET", path, Some(&team_a), &Value::Null).await?;
    refused(
        &scene,
        "stage: GET without ?stage=",
        &r,
        400,
        "query parameter `stage` is required",
        "",
    );
    let r = scene
        .post(&sync("a", "argocd", "mine"), &team_a, &json!({}))
        .await?;
    refused(
        &scene,
        "stage: POST without stage",
        &r,
        400,
        "field `stage` is required",
        "",
    );
    for stage in ["*", "pro*", "prod,uat", "team-a:prod", "", "prod%20"] {
        let r = read(&scene, &team_a, "a", "argocd", "mine", stage).await?;
        refused(
            &scene,
            &format!("stage: GET as stage {stage:?}"),
            &r,
            400,
            "stage",
            "",
        );
        let body = json!({"stage": stage.replace("%20", " ")});
        let r = scene
            .post(&sync("a", "argocd", "mine"), &team_a, &body)
            .await?;
        refused(
            &scene,
            &format!("stage: POST as stage {stage:?}"),
            &r,
            400,
            "stage",
            "",
        );
    }
    Ok(())
}

#[tokio::test]
async fn a_namespace_granted_for_jobs_is_not_one_for_applications() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    // `verify` is in the rule's `namespaces`, and its Application is even annotated for
    // team-a:prod: still not an Application namespace.
    let r = read(&scene, &team_a, "a", "verify", "mine", "prod").await?;
    refused(
        &scene,
        "stage: GET in a Job namespace",
        &r,
        403,
        "applicationNamespaces",
        "",
    );
    let body = json!({"stage": "prod"});
    let r = scene
        .post(&sync("a", "verify", "mine"), &team_a, &body)
        .await?;
    refused(
        &scene,
        "stage: POST in a Job namespace",
        &r,
        403,
        "applicationNamespaces",
        "",
    );
    // And the other way round: `argocd` (Applications) is no place for Jobs.
    let mut m = crate::scene::measurement(("team-a", "run", "uid-1"), "m", 1, "a");
    m.block["namespace"] = json!("argocd");
    let placed = scene
        .post(
            dispatch_api::v1::ENSURE,
            &plugin_token("plugin", Some(&["team-a"])),
            &m,
        )
        .await?;
    let calls = scene.destination_calls();
    let outcome = Outcome {
        refused: placed.status == 403,
        cross_tenant_delete: !calls.is_empty(),
        ..Outcome::default()
    };
    tally::record("stage: a Job placed in the Application namespace", &outcome);
    assert_eq!(placed.status, 403, "{}", placed.body);
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(outcome, Outcome::refused());
    Ok(())
}

/// The agent of `edge`, played by a [`Worker`] on destination `a` (its "own cluster"), with
/// `--namespaces argocd --argocd-sync`.
fn agent(scene: &Scene) -> Result<Worker> {
    let guard = Guard {
        namespaces: vec!["argocd".into()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: scene.world.engine.work_keys(),
    };
    Ok(Worker::new(scene.world.engine.clone(), "a", guard)
        .context("destination a")?
        .with_argocd_sync(true))
}

/// One pass of `worker` over edge's records, reported to the server as the agent does.
async fn pass(scene: &Scene, worker: &mut Worker) -> Result<Vec<agent_api::Report>> {
    let store = scene.world.engine.store().context("an agent store")?;
    let records = store.for_destination("edge");
    let work: Vec<WorkItem> = records.into_iter().map(|r| r.into_work_item()).collect();
    let reports = worker.pass(&Arc::new(work)).await;
    let body = ReportRequest {
        reports: reports.clone(),
    };
    let path = agent_api::path(agent_api::REPORT, "edge");
    let r = scene.post(&path, &agent_token("edge"), &body).await?;
    assert_eq!(r.status, 200, "{}", r.body);
    let unknown: Vec<String> = serde_json::from_value(r.body["unknown"].clone())?;
    worker.accepted(reports.clone(), &unknown);
    Ok(reports)
}

fn stage(project: &str, stage: &str) -> StageRef {
    StageRef {
        project: project.into(),
        stage: stage.into(),
    }
}

#[tokio::test]
async fn the_agent_refuses_forged_orders_on_its_own() -> Result<()> {
    let scene = scene().await?;
    let store = scene
        .world
        .engine
        .store()
        .context("an agent store")?
        .clone();
    let mut worker = agent(&scene)?;
    // Sync orders the server never checked: for an Application of another project, for another
    // Stage, and with no Stage at all. Signed, as a compromised server replica could (a record
    // merely written into the store fails its signature first: `signed_work`), so that what
    // refuses them here is the agent's own check of the live annotation.
    let order = |id: &str| SyncOrder {
        id: id.into(),
        revision: Some("evil".into()),
        refresh: "hard".into(),
    };
    let forge = |app: &str, id: &str| {
        let record = api_record(
            "edge",
            "argocd",
            app,
            &stage("team-a", "prod"),
            Some(order(id)),
        );
        (app.to_string(), record)
    };
    let mut forged = vec![
        forge("foreign", "f1"),
        forge("uat-only", "f2"),
        forge("glob-stage", "f3"),
        forge("nope", "f4"),
    ];
    let (_, mut stageless) = forge("mine", "f5");
    stageless.spec.for_stage = None;
    forged.push(("mine, no Stage".into(), stageless));
    for (_, r) in &mut forged {
        scene.world.engine.sign_work(&mut r.spec);
        store.create(r.clone()).await?;
    }
    let reports = pass(&scene, &mut worker).await?;
    for (what, record) in &forged {
        let report = reports
            .iter()
            .find(|r| r.name == record.name)
            .with_context(|| format!("a report on {what}"))?;
        let message = match &report.state {
            Some(dispatch_server::verdict::DestState::Error(m)) => m.clone(),
            other => format!("{other:?}"),
        };
        let outcome = Outcome {
            refused: message.contains(ANN) && report.notes.contains_key("authorization"),
            cross_tenant_read: report.application.is_some() || message.contains("team-b"),
            cross_tenant_sync: patches(&scene) > 0,
            ..Outcome::default()
        };
        tally::record(
            &format!("stage: agent, forged sync order on {what}"),
            &outcome,
        );
        assert!(report.application.is_none(), "{what}: {report:?}");
        assert!(message.contains(ANN), "{what}: {message}");
        assert_eq!(outcome, Outcome::refused(), "{what}: {message}");
    }
    assert_eq!(patches(&scene), 0, "no forged order was carried out");
    Ok(())
}

#[tokio::test]
async fn an_agent_destination_refuses_other_stages_through_the_server_too() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("kargo-team-a", Some(&["team-a"]));
    let mut worker = agent(&scene)?;
    // team-a's uat asks about prod's Application on edge: the agent's refusal comes back 403.
    let first = read(&scene, &team_a, "edge", "argocd", "mine", "uat").await?;
    assert_eq!(first.status, 503, "no report yet: {}", first.body);
    pass(&scene, &mut worker).await?;
    let r = read(&scene, &team_a, "edge", "argocd", "mine", "uat").await?;
    refused(
        &scene,
        "stage: agent, GET mine as team-a:uat",
        &r,
        403,
        ANN,
        "",
    );
    // Its sync is refused by the server before any order is placed (the agent last refused it).
    let body = json!({"stage": "uat", "revision": "evil"});
    let r = scene
        .post(&sync("edge", "argocd", "mine"), &team_a, &body)
        .await?;
    refused(
        &scene,
        "stage: agent, POST mine:sync as team-a:uat",
        &r,
        403,
        ANN,
        "",
    );
    let store = scene.world.engine.store().context("an agent store")?;
    assert!(
        store
            .for_destination("edge")
            .iter()
            .all(|r| r.spec.sync.is_none()),
        "no order placed"
    );
    pass(&scene, &mut worker).await?;
    assert_eq!(patches(&scene), 0);
    // prod's own record is apart from uat's: its GET and sync work, and only it patches.
    read(&scene, &team_a, "edge", "argocd", "mine", "prod").await?;
    let body = json!({"stage": "prod", "revision": "abc"});
    let r = scene
        .post(&sync("edge", "argocd", "mine"), &team_a, &body)
        .await?;
    assert_eq!(r.status, 202, "{}", r.body);
    pass(&scene, &mut worker).await?;
    assert_eq!(patches(&scene), 1);
    let r = read(&scene, &team_a, "edge", "argocd", "mine", "prod").await?;
    assert_eq!(r.status, 200, "{}", r.body);
    let r = read(&scene, &team_a, "edge", "argocd", "mine", "uat").await?;
    assert_eq!(r.status, 403, "uat still sees nothing: {}", r.body);
    Ok(())
}
