//! Issue #29: the agent's `application:` check and sync trigger against a **real** Argo CD,
//! nothing played. The agent scene (`World::start_with_agent_options`: two server replicas on
//! the Kubernetes store, the real Argo Rollouts controller on `control` with our plugin,
//! cluster-b reachable only through its agent, with `--namespaces argocd --argocd-sync`), and on
//! cluster-b Argo CD v3.2.6's application controller, repo-server and Redis
//! (`dispatch_tests::cluster::argocd_real`), syncing plain manifests (a Deployment and a
//! Service, whose pods kwok runs) from local Git repositories the tests commit and push to.
//!
//! Here: the `application:` check Healthy and Degraded; `sync.rs`: the sync trigger to pushed
//! commits, to a missing one, and while a sync runs; `airgapped.rs`: the air-gapped Stage's
//! `http` steps and verification (`config/kargo-stage-airgapped.yaml`); `deleted.rs`: an
//! Application deleted while a check waits for it; `refresh.rs`: a pushed commit nobody syncs;
//! `stage.rs`: `destination: stage` through two more real Argo CDs, on the control plane and on
//! cluster-a (the servers' `argocd:` instances, [`stage::INSTANCES`]).
//!
//! Each scenario has its own repository and Application (Argo CD moves an Application's
//! revision to its branch's newest commit, so sharing a branch would mix their revisions) and
//! records what it observed; once every key of the summary has a value, the last line
//! `argocd: version=… app_healthy=… app_degraded=… sync_trigger=… synced_revision=…
//! missing_revision=… stage=… airgapped_flow=…` is written (`make e2e-argocd` prints it
//! last). `#[ignore]`d for plain `cargo test`.

mod airgapped;
mod deleted;
mod refresh;
mod stage;
mod sync;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_tests::analysis::{self, measurement_message, phase};
use dispatch_tests::cluster::argocd::{self, APP_STAGE};
use dispatch_tests::cluster::argocd_real::{self, text, AppSpec, ArgoCd, ArgoCdOptions, GitRepo};
use dispatch_tests::kargo::Verification;
use dispatch_tests::shared::{block_on, Shared};
use dispatch_tests::summary;
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::world::agents::Agents;
use dispatch_tests::world::World;
use kube::api::DynamicObject;
use serde_json::{json, Value};

/// Set to run the controller with `--persist-resource-health` (not Argo CD 3's default).
pub const PERSIST_ENV: &str = "E2E_ARGOCD_PERSIST_RESOURCE_HEALTH";

/// How long the real controller may take to sync and judge an Application.
pub const ARGOCD_TIMEOUT: Duration = Duration::from_secs(120);

/// The scene: the real Argo CD first, so that it stops before cluster-b does.
pub struct Scene {
    /// Argo CD on cluster-b.
    pub argocd: ArgoCd,
    /// A client of cluster-b (admin), to read what Argo CD wrote.
    pub b: kube::Client,
    /// The agent World.
    pub w: World<Agents>,
}

static SCENE: Shared<Scene> = Shared::new();

impl Scene {
    async fn start() -> Result<Self> {
        let sync_yaml = format!(
            "applicationSync:\n  destinations: [\"cluster-b\"]\n{}",
            stage::INSTANCES
        );
        let agent_args = ["--namespaces", argocd::NAMESPACE, "--argocd-sync"];
        let w = World::start_with_agent_options(&[], &sync_yaml, &agent_args).await?;
        let options = ArgoCdOptions {
            persist_resource_health: std::env::var_os(PERSIST_ENV).is_some(),
        };
        let argocd = ArgoCd::start_with(&w.b, options)
            .await
            .context("the real Argo CD on cluster-b")?;
        let b = w.b.client().await?;
        let version = argocd.version()?;
        record("version", version.split('+').next().unwrap_or_default())?;
        println!(
            "e2e-argocd: Argo CD {version} on cluster-b ({}), {options:?}",
            argocd.dir.display()
        );
        Ok(Self { argocd, b, w })
    }

    /// What a failed expectation shows: the Application as Argo CD wrote it and its logs.
    pub async fn report(&self, app: &str) -> String {
        let seen = argocd::applications(&self.b)
            .get(app)
            .await
            .map_or_else(|e| format!("(cannot read: {e})"), |a| a.data.to_string());
        format!("Application {app}: {seen}\n{}", self.argocd.log_tail(15))
    }
}

/// Runs `scenario` on the shared scene.
pub fn on_scene(scenario: impl AsyncFnOnce(&Scene) -> Result<()>) -> Result<()> {
    let scene = SCENE.get_or_start(Scene::start)?;
    block_on(scenario(scene))
}

static OUTCOMES: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());
/// The summary's keys, in its order.
const SUMMARY_KEYS: [&str; 9] = [
    "version",
    "app_healthy",
    "app_degraded",
    "sync_trigger",
    "synced_revision",
    "missing_revision",
    "stage",
    "airgapped_flow",
    "sync_while_running",
];

/// Records what a scenario observed under `key`; once every key of the summary has a value,
/// writes the summary (`sync_while_running` is printed before it, not part of the line).
pub fn record(key: &'static str, outcome: &str) -> Result<()> {
    let line = {
        let mut outcomes = OUTCOMES.lock().unwrap_or_else(|e| e.into_inner());
        outcomes.insert(key, outcome.to_string());
        if !SUMMARY_KEYS.iter().all(|k| outcomes.contains_key(k)) {
            return Ok(());
        }
        println!(
            "e2e-argocd: sync_while_running={}",
            outcomes["sync_while_running"]
        );
        let parts: Vec<String> = SUMMARY_KEYS[..8]
            .iter()
            .map(|k| format!("{k}={}", outcomes[k]))
            .collect();
        format!("argocd: {}", parts.join(" "))
    };
    summary::report(&line)
}

/// The plain manifests of the shop: Deployment and Service `web`, 2 pods at image tag `tag`;
/// `deployment` and `pod` are more fields of the Deployment's and of its pods' spec.
pub fn shop_manifests(tag: &str, deployment: Value, pod: Value) -> Vec<(&'static str, String)> {
    let mut pod_spec = json!({"containers": [{"name": "web",
        "image": format!("example.invalid/shop:{tag}"), "ports": [{"containerPort": 8080}]}]});
    merge(&mut pod_spec, pod);
    let mut spec = json!({
        "replicas": 2,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}
    });
    merge(&mut spec, deployment);
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "labels": {"app": "web"}},
        "spec": spec
    });
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
    });
    vec![
        ("deploy/deployment.yaml", deployment.to_string()),
        ("deploy/service.yaml", service.to_string()),
    ]
}

/// Adds the fields of `extra` (an object) to `into`.
fn merge(into: &mut Value, extra: Value) {
    if let (Some(into), Value::Object(extra)) = (into.as_object_mut(), extra) {
        into.extend(extra);
    }
}

/// A repository for Application `name` with the shop at `tag`, and its first commit.
pub fn repo_with_shop(s: &Scene, name: &str, tag: &str) -> Result<(GitRepo, String)> {
    let repo = s.argocd.repo(name)?;
    let sha = repo.commit(
        &shop_manifests(tag, json!({}), json!({})),
        &format!("shop {tag}"),
    )?;
    Ok((repo, sha))
}

/// The spec of Application `name` on `repo`, deploying into namespace `name`, which its sync
/// creates (`CreateNamespace=true`).
pub fn app_spec<'a>(name: &'a str, repo: &GitRepo, automated: bool) -> AppSpec<'a> {
    AppSpec {
        name,
        repo_url: repo.url(),
        path: "deploy",
        server: argocd_real::IN_CLUSTER,
        namespace: name,
        automated,
        create_namespace: true,
    }
}

/// Waits until the real controller has Application `name` Synced and Healthy at `sha`.
pub async fn wait_synced_healthy(s: &Scene, name: &str, sha: &str) -> Result<DynamicObject> {
    let apps = argocd::applications(&s.b);
    eventually(
        &format!("Argo CD has {name} Synced and Healthy at {sha}"),
        ARGOCD_TIMEOUT,
        || async {
            let app = apps.get(name).await?;
            let d = &app.data;
            let done = argocd_real::synced_healthy_at(d, sha);
            Ok(if done {
                Progress::Done(app)
            } else {
                Progress::Waiting(format!(
                    "sync={:?} health={:?} operationState={} conditions={}",
                    d.pointer("/status/sync"),
                    d.pointer("/status/health"),
                    d.pointer("/status/operationState/phase")
                        .unwrap_or(&Value::Null),
                    d.pointer("/status/conditions").unwrap_or(&Value::Null)
                ))
            })
        },
    )
    .await
}

/// A verification of Application `argocd/<name>` on cluster-b at `revision`, if given.
pub fn application_check(
    stage: &str,
    ulid: &str,
    name: &str,
    revision: Option<&str>,
) -> Verification {
    let mut check = json!({"name": name});
    if let Some(rev) = revision {
        check["revision"] = json!(rev);
    }
    Verification::new(stage, ulid, "cluster-b").observes(json!({"application": check}))
}

/// Runs `v` to its verdict; records its phase under `key` (`error` when it got none).
pub async fn verdict(
    s: &Scene,
    key: Option<&'static str>,
    v: &Verification,
) -> Result<DynamicObject> {
    let run = async { s.w.finished(&s.w.submit(v).await?).await }.await;
    if let Some(key) = key {
        record(
            key,
            &run.as_ref().map_or_else(|_| "error".to_string(), phase),
        )?;
    }
    run
}

/// Waits until the measurement message of `run` contains `needle` (what the check says while it
/// waits, `what` for the timeout's message); returns the message.
pub async fn saying(s: &Scene, run: &DynamicObject, what: &str, needle: &str) -> Result<String> {
    let runs = s.w.runs();
    eventually(what, ARGOCD_TIMEOUT, || async {
        let now = runs.get(analysis::name(run)).await?;
        let message = measurement_message(&now);
        Ok(message.contains(needle).then_some(message))
    })
    .await
}

/// What a decided run shows, for a failed expectation.
pub fn run_report(run: &DynamicObject) -> String {
    format!(
        "run {} is {} with message {:?}",
        analysis::name(run),
        phase(run),
        measurement_message(run)
    )
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn app_healthy_succeeds_once_the_real_controller_synced_the_pushed_commit() -> Result<()> {
    on_scene(async |s| {
        let name = "shop-healthy";
        let (repo, sha) = repo_with_shop(s, name, "v1")?;
        argocd_real::create_application(&s.b, &app_spec(name, &repo, true)).await?;
        let app = wait_synced_healthy(s, name, &sha)
            .await
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        println!(
            "e2e-argocd: {name} as the real controller wrote it: status={}",
            app.data["status"]
        );
        let check = application_check(
            "app-healthy",
            "01jargocd00000000000000001",
            name,
            Some(&sha),
        );
        let run = verdict(s, Some("app_healthy"), &check).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful: {}\n{}",
            run_report(&run),
            s.report(name).await
        );
        println!(
            "e2e-argocd: app_healthy=Successful: {:?}",
            measurement_message(&run)
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn app_degraded_fails_naming_the_deployment_argo_cd_found_degraded() -> Result<()> {
    on_scene(async |s| {
        let name = "shop-degraded";
        // Pods no node can take: the Deployment controller gives up after the deadline
        // (Progressing=False, ProgressDeadlineExceeded), which Argo CD's health calls Degraded.
        let repo = s.argocd.repo(name)?;
        let files = shop_manifests(
            "v1",
            json!({"progressDeadlineSeconds": 10}),
            json!({"nodeSelector": {"test.rollouts-dispatch.io/no-such-node": "true"}}),
        );
        let sha = repo.commit(&files, "shop v1, unschedulable")?;
        argocd_real::create_application(&s.b, &app_spec(name, &repo, true)).await?;
        let check = application_check(
            "app-degraded",
            "01jargocd00000000000000002",
            name,
            Some(&sha),
        );
        let run = verdict(s, Some("app_degraded"), &check).await?;
        let message = measurement_message(&run);
        ensure!(
            phase(&run) == "Failed" && message.contains("Degraded") && message.contains(name),
            "want Failed, saying {name} is Degraded: {}\n{}",
            run_report(&run),
            s.report(name).await
        );
        // Argo CD 3 keeps each resource's health out of the Application unless
        // --persist-resource-health (`status.resourceHealthSource: appTree`): only then can the
        // check name the Deployment from the Application.
        let app = argocd::applications(&s.b).get(name).await?;
        let source = text(&app.data, "/status/resourceHealthSource");
        let named = message.contains("Deployment") && message.contains("progress deadline");
        ensure!(
            source == "appTree" || named,
            "resource health is in the Application ({source:?}), yet the failure does not name \
             the Degraded Deployment web and Argo CD's message: {}\n{}",
            run_report(&run),
            s.report(name).await
        );
        println!(
            "e2e-argocd: app_degraded: resourceHealthSource={source:?}, the Deployment named: {named}"
        );
        println!("e2e-argocd: app_degraded=Failed: {message:?}");
        Ok(())
    })
}

/// The Stage the Applications are authorized for, re-exported for `sync.rs`.
pub const STAGE: &str = APP_STAGE;

#[test]
#[ignore = "needs the Go-built cluster binaries and the real Argo CD (`make argocd-bin`): run `make e2e-argocd`"]
fn the_harness_alone_syncs_a_pushed_commit_on_one_cluster() -> Result<()> {
    // One cluster and Argo CD, no World: what every scenario stands on, in about a minute.
    block_on(async {
        let cluster = dispatch_tests::cluster::Cluster::start("argocd").await?;
        let argocd = ArgoCd::start(&cluster).await?;
        let client = cluster.client().await?;
        let repo = argocd.repo("alone")?;
        let sha = repo.commit(&shop_manifests("v1", json!({}), json!({})), "shop v1")?;
        let spec = AppSpec {
            name: "alone",
            repo_url: repo.url(),
            path: "deploy",
            server: argocd_real::IN_CLUSTER,
            namespace: "alone",
            automated: true,
            create_namespace: true,
        };
        argocd_real::create_application(&client, &spec).await?;
        let apps = argocd::applications(&client);
        let app = eventually("Argo CD syncs alone", ARGOCD_TIMEOUT, || async {
            let app = apps.get("alone").await?;
            let d = &app.data;
            let done = argocd_real::synced_healthy_at(d, &sha);
            Ok(if done {
                Progress::Done(app)
            } else {
                Progress::Waiting(d["status"].to_string())
            })
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", argocd.log_tail(30)))?;
        println!(
            "e2e-argocd: harness: Argo CD {} synced alone at {sha}: {}",
            argocd.version()?,
            app.data
        );
        Ok(())
    })
}
