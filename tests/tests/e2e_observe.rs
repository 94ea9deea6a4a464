//! Issue #16 end to end, nothing mocked on our side: verifying what is already deployed.
//!
//! The agent scene (`World::start_with_agent`: two server replicas on the Kubernetes store, the
//! real Argo Rollouts controller on `control` with our plugin), plus:
//!
//! * on destination `cluster-a` (direct), a second real Argo Rollouts controller (no plugins)
//!   deploying canary Rollouts whose pods kwok runs, each with a background analysis: an
//!   AnalysisTemplate whose built-in `job` metric passes or fails
//!   (`dispatch_tests::cluster::rollout`);
//! * on destination `cluster-b` (only through its agent), Argo CD's real Application CRD and
//!   `ArgoCdPlayer`, a task playing Argo CD's application controller: the tests write the
//!   Applications' status, the player honours sync operations (`dispatch_tests::cluster::argocd`
//!   says why the real controller is not run).
//!
//! Kargo-shaped AnalysisRuns on `control` carry `rollout:` and `application:` blocks; the sync
//! trigger is called as Kargo's `http` step would. Scenarios run side by side on the one scene;
//! each records its outcome, and once all five of the summary have, the line
//! `observe: rollout_pass=… rollout_fail=… app_healthy=… app_degraded=… sync_trigger=…` is
//! written (`make e2e-observe` prints it last).
//!
//! `#[ignore]`d for plain `cargo test`; `make e2e-observe` runs it.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_api::observe::ApplicationState;
use dispatch_tests::analysis::{self, last_measurement, measurement_message, phase};
use dispatch_tests::cluster::argo::{self, ArgoRollouts};
use dispatch_tests::cluster::argocd::{self, ArgoCdPlayer};
use dispatch_tests::cluster::rollout::{self, image, text, Analysis, Rollout, METRIC};
use dispatch_tests::kargo::{Verification, PROJECT};
use dispatch_tests::shared::{block_on, Shared};
use dispatch_tests::summary;
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::world::agents::Agents;
use dispatch_tests::world::World;
use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::{json, Value};

/// The namespace of the Rollouts on cluster-a.
const SHOP: &str = "shop";
/// How long a run whose image the Rollout does not run yet must stay Running.
const NOT_YET: Duration = Duration::from_secs(20);
/// The revision an Application is synced to before the sync trigger.
const OLD_SHA: &str = "1111111111111111111111111111111111111111";
/// The revision the sync trigger asks for.
const NEW_SHA: &str = "2f0c1e5d9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d";
/// How long the Application may take to reach the requested revision.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

/// The scene: the agent World, the Rollouts controller on cluster-a, the Argo CD player on b.
struct Scene {
    w: World<Agents>,
    a: kube::Client,
    b: kube::Client,
    _rollouts_a: ArgoRollouts,
    _player: ArgoCdPlayer,
}

static SCENE: Shared<Scene> = Shared::new();

impl Scene {
    async fn start() -> Result<Self> {
        // B's agent observes Applications in `argocd` (it refuses any namespace not in its
        // --namespaces) and carries out sync orders (--argocd-sync, with the RBAC of
        // config/agent-rbac-argocd-sync.yaml), which the servers allow for cluster-b only
        // through `applicationSync.destinations`.
        let sync_yaml = "applicationSync:\n  destinations: [\"cluster-b\"]\n";
        let agent_args = ["--namespaces", argocd::NAMESPACE, "--argocd-sync"];
        let mut w = World::start_with_agent_options(&[], sync_yaml, &agent_args).await?;
        let rollouts_a = ArgoRollouts::install(&mut w.a, &[])
            .await
            .context("the Argo Rollouts controller on cluster-a")?;
        let (a, b) = (w.a.client().await?, w.b.client().await?);
        argo::apply_namespace(&a, SHOP).await?;
        rollout::apply_analysis_templates(&a, SHOP).await?;
        argocd::install(&b).await?;
        let player = ArgoCdPlayer::spawn(b.clone());
        Ok(Self {
            w,
            a,
            b,
            _rollouts_a: rollouts_a,
            _player: player,
        })
    }
}

/// Runs `scenario` on the shared scene.
fn on_scene(scenario: impl AsyncFnOnce(&Scene) -> Result<()>) -> Result<()> {
    let scene = SCENE.get_or_start(Scene::start)?;
    block_on(scenario(scene))
}

/// The outcomes of the summary's scenarios so far.
static OUTCOMES: Mutex<BTreeMap<&'static str, String>> = Mutex::new(BTreeMap::new());
/// The summary's keys, in its order.
const SUMMARY_KEYS: [&str; 5] = [
    "rollout_pass",
    "rollout_fail",
    "app_healthy",
    "app_degraded",
    "sync_trigger",
];

/// Records `outcome` for `key`; the last of [`SUMMARY_KEYS`] to be recorded writes the summary.
fn record(key: &'static str, outcome: &str) -> Result<()> {
    let line = {
        let mut outcomes = OUTCOMES.lock().unwrap_or_else(|e| e.into_inner());
        outcomes.insert(key, outcome.to_string());
        if !SUMMARY_KEYS.iter().all(|k| outcomes.contains_key(k)) {
            return Ok(());
        }
        let parts: Vec<String> = SUMMARY_KEYS
            .iter()
            .map(|k| format!("{k}={}", outcomes[k]))
            .collect();
        format!("observe: {}", parts.join(" "))
    };
    summary::report(&line)
}

/// Runs the verification `v` to its verdict and records its phase under `key` (`error` if it
/// never got one); returns the decided run.
async fn verdict(s: &Scene, key: Option<&'static str>, v: &Verification) -> Result<DynamicObject> {
    let run = async { s.w.finished(&s.w.submit(v).await?).await }.await;
    if let Some(key) = key {
        record(
            key,
            &run.as_ref().map_or_else(|_| "error".to_string(), phase),
        )?;
    }
    run
}

/// What a run ended as, for a failed expectation.
fn report(s: &Scene, run: &DynamicObject) -> String {
    format!(
        "run {} is {} with message {:?}; status {}\ncontroller log tail:\n{}",
        analysis::name(run),
        phase(run),
        measurement_message(run),
        run.data["status"],
        s.w.controller_log_tail(20)
    )
}

/// A verification of Rollout `shop/<name>` at `tag` on cluster-a.
fn rollout_check(stage: &str, ulid: &str, name: &str, tag: &str) -> Verification {
    Verification::new(stage, ulid, "cluster-a").observes(json!({
        "rollout": {"name": name, "namespace": SHOP, "image": image(tag)}
    }))
}

/// A verification of Application `argocd/<name>` on cluster-b.
fn application_check(stage: &str, ulid: &str, name: &str) -> Verification {
    Verification::new(stage, ulid, "cluster-b").observes(json!({"application": {"name": name}}))
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn the_harness_rollouts_own_analysis_passes_and_fails_and_the_application_crd_is_served(
) -> Result<()> {
    on_scene(async |s| {
        let pass = Rollout::new(SHOP, "proof-pass", Analysis::Passes);
        let fail = Rollout::new(SHOP, "proof-fail", Analysis::Fails);
        let (passed, failed, ()) = tokio::try_join!(
            update_and_decide(s, &pass, "v2"),
            update_and_decide(s, &fail, "v2"),
            aborted_by_hand(s),
        )?;
        ensure!(
            phase(&passed) == "Successful",
            "the passing background analysis: {}",
            passed.data["status"]
        );
        let promoted = pass.wait_phase(&s.a, "Healthy").await?;
        ensure!(
            text(&promoted, "/status/stableRS") == text(&promoted, "/status/currentPodHash"),
            "Rollout proof-pass is not fully promoted: {}",
            promoted.data["status"]
        );
        ensure!(
            phase(&failed) == "Failed",
            "the failing background analysis: {}",
            failed.data["status"]
        );
        let aborted = fail.wait_phase(&s.a, "Degraded").await?;
        ensure!(
            aborted.data.pointer("/status/abort") == Some(&json!(true)),
            "the failed analysis did not abort Rollout proof-fail: {}",
            aborted.data["status"]
        );
        // Argo CD's Application CRD accepts an Application with a status, and keeps it.
        let app = argocd::create_application(
            &s.b,
            "proof-app",
            argocd::status("Synced", OLD_SHA, "Healthy", json!([])),
        )
        .await?;
        let read = argocd::applications(&s.b)
            .get(app.metadata.name.as_deref().unwrap_or_default())
            .await?;
        ensure!(
            read.data.pointer("/status/sync/revision") == Some(&json!(OLD_SHA)),
            "the Application CRD dropped the status: {}",
            read.data
        );
        // The player syncs as Argo CD does when an operation is written on the Application
        // (what the agent writes for the sync trigger).
        let operation = json!({"operation": {"sync": {"revision": NEW_SHA}, "initiatedBy": {"username": "e2e"}}});
        argocd::applications(&s.b)
            .patch(
                "proof-app",
                &PatchParams::default(),
                &Patch::Merge(&operation),
            )
            .await?;
        eventually("the player synced proof-app", SYNC_TIMEOUT, || async {
            let app = argocd::applications(&s.b).get("proof-app").await?;
            let synced = app.data.pointer("/status/sync/revision") == Some(&json!(NEW_SHA))
                && app.data.pointer("/status/operationState/phase") == Some(&json!("Succeeded"))
                && app
                    .data
                    .pointer("/status/operationState/syncResult/revision")
                    == Some(&json!(NEW_SHA))
                && app.data.get("operation").is_none_or(Value::is_null);
            Ok(if synced {
                Progress::Done(())
            } else {
                Progress::Waiting(app.data.to_string())
            })
        })
        .await?;
        println!(
            "e2e-observe: harness: {} Successful → proof-pass Healthy; {} Failed ({:?}) → proof-fail aborted; proof-abort aborted by hand; Application CRD on cluster-b keeps status, its sync operation played",
            analysis::name(&passed),
            analysis::name(&failed),
            text(&failed, "/status/message"),
        );
        Ok(())
    })
}

/// A paused canary aborted as `kubectl argo rollouts abort` does ends Degraded with
/// `status.abort`, its stable ReplicaSet back at every replica.
async fn aborted_by_hand(s: &Scene) -> Result<()> {
    let held = Rollout::new(SHOP, "proof-abort", Analysis::Passes).pausing();
    updated(s, &held, "v2").await?;
    held.wait_phase(&s.a, "Paused").await?;
    held.abort(&s.a).await?;
    let aborted = held.wait_phase(&s.a, "Degraded").await?;
    ensure!(
        aborted.data.pointer("/status/abort") == Some(&json!(true)),
        "the abort did not take: {}",
        aborted.data["status"]
    );
    Ok(())
}

/// Creates `rollout` at v1, updates it to `tag` and returns its own AnalysisRun, decided.
async fn update_and_decide(s: &Scene, rollout: &Rollout, tag: &str) -> Result<DynamicObject> {
    updated(s, rollout, tag).await?;
    rollout.decided_analysis_run(&s.a).await
}

/// Creates `rollout` at v1 (Healthy) and updates it to `tag`, as a promotion does.
async fn updated(s: &Scene, rollout: &Rollout, tag: &str) -> Result<()> {
    rollout.create(&s.a, &image("v1")).await?;
    rollout.set_image(&s.a, &image(tag)).await
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn rollout_pass_succeeds_with_the_rollouts_own_analysis_runs_in_metadata() -> Result<()> {
    on_scene(async |s| {
        let shop = Rollout::new(SHOP, "shop-pass", Analysis::Passes);
        updated(s, &shop, "v2").await?;
        let check = rollout_check(
            "rollout-pass",
            "01jobserve0000000000000001",
            "shop-pass",
            "v2",
        );
        let run = verdict(s, Some("rollout_pass"), &check).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful: {}",
            report(s, &run)
        );
        let own: Vec<String> = shop
            .analysis_runs(&s.a)
            .await?
            .iter()
            .map(|r| analysis::name(r).to_string())
            .collect();
        let named = last_measurement(&run)
            .and_then(|m| m.pointer("/metadata/analysisruns.cluster-a"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        ensure!(
            !own.is_empty() && own.iter().any(|name| named.contains(name.as_str())),
            "metadata analysisruns.cluster-a = {named:?} names none of the Rollout's AnalysisRuns {own:?}: {}",
            report(s, &run)
        );
        println!("e2e-observe: rollout_pass=Successful, analysisruns.cluster-a={named:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn rollout_fail_fails_quoting_the_rollouts_own_analysis() -> Result<()> {
    on_scene(async |s| {
        let shop = Rollout::new(SHOP, "shop-fail", Analysis::Fails);
        updated(s, &shop, "v2").await?;
        let check = rollout_check(
            "rollout-fail",
            "01jobserve0000000000000002",
            "shop-fail",
            "v2",
        );
        let run = verdict(s, Some("rollout_fail"), &check).await?;
        ensure!(phase(&run) == "Failed", "want Failed: {}", report(s, &run));
        let own = shop.decided_analysis_run(&s.a).await?;
        let message = measurement_message(&run);
        // The Rollout's own run by name, its metric, and the controller's reason (a `job`
        // metric has no message of its own: the run's status.message carries it).
        let reason = own.data["status"]["message"].as_str().unwrap_or_default();
        ensure!(
            message.contains(analysis::name(&own))
                && message.contains(METRIC)
                && !reason.is_empty()
                && message.contains(reason),
            "the failure does not quote the Rollout's AnalysisRun {}, its metric {METRIC} and its \
             message {reason:?}: {}",
            analysis::name(&own),
            report(s, &run)
        );
        println!("e2e-observe: rollout_fail=Failed: {message:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn an_aborted_rollout_fails_the_run() -> Result<()> {
    on_scene(async |s| {
        let shop = Rollout::new(SHOP, "shop-abort", Analysis::Passes).pausing();
        updated(s, &shop, "v2").await?;
        shop.wait_phase(&s.a, "Paused").await?;
        let check = rollout_check(
            "rollout-abort",
            "01jobserve0000000000000003",
            "shop-abort",
            "v2",
        );
        let run = s.w.submit(&check).await?;
        // The run follows the paused canary; then a person aborts it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        shop.abort(&s.a).await?;
        let run = s.w.finished(&run).await?;
        ensure!(
            phase(&run) == "Failed",
            "want Failed after the abort: {}",
            report(s, &run)
        );
        println!(
            "e2e-observe: aborted Rollout → Failed: {:?}",
            measurement_message(&run)
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn a_run_for_an_image_not_deployed_yet_waits_then_succeeds_once_the_rollout_runs_it() -> Result<()>
{
    on_scene(async |s| {
        let shop = Rollout::new(SHOP, "shop-later", Analysis::Passes);
        shop.create(&s.a, &image("v1")).await?;
        let check = rollout_check(
            "rollout-later",
            "01jobserve0000000000000004",
            "shop-later",
            "v3",
        );
        let run = s.w.submit(&check).await?;
        let name = analysis::name(&run).to_string();
        // Kargo started verifying before Argo CD applied the new image: the run must wait.
        let started = tokio::time::Instant::now();
        while started.elapsed() < NOT_YET {
            let now = s.w.runs().get(&name).await?;
            // Running, and so is its measurement: waiting is not an error the controller
            // counts towards consecutiveErrorLimit.
            let measuring = last_measurement(&now).is_none_or(|m| m["phase"] == "Running");
            ensure!(
                (phase(&now) == "Running" && measuring)
                    || (phase(&now).is_empty() && started.elapsed() < Duration::from_secs(5)),
                "the run for v3 while the Rollout runs v1 must stay Running: {}",
                report(s, &now)
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        shop.set_image(&s.a, &image("v3")).await?;
        let run = s.w.finished(&run).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful once the Rollout runs v3: {}",
            report(s, &run)
        );
        println!(
            "e2e-observe: v3 not deployed → Running for {NOT_YET:?}, then deployed → Successful"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn app_healthy_succeeds_through_the_agent() -> Result<()> {
    on_scene(async |s| {
        let resources = json!([argocd::resource("Deployment", "shop", "Healthy", "")]);
        argocd::create_application(
            &s.b,
            "shop-healthy",
            argocd::status("Synced", OLD_SHA, "Healthy", resources),
        )
        .await?;
        let check = application_check("app-healthy", "01jobserve0000000000000005", "shop-healthy");
        let run = verdict(s, Some("app_healthy"), &check).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful: {}",
            report(s, &run)
        );
        println!(
            "e2e-observe: app_healthy=Successful: {:?}",
            measurement_message(&run)
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn app_degraded_fails_naming_the_degraded_resource() -> Result<()> {
    on_scene(async |s| {
        let why = "Deployment \"shop\" exceeded its progress deadline";
        let resources = json!([
            argocd::resource("Service", "shop", "Healthy", ""),
            argocd::resource("Deployment", "shop", "Degraded", why),
        ]);
        argocd::create_application(
            &s.b,
            "shop-degraded",
            argocd::status("Synced", OLD_SHA, "Degraded", resources),
        )
        .await?;
        let check = application_check(
            "app-degraded",
            "01jobserve0000000000000006",
            "shop-degraded",
        );
        let run = verdict(s, Some("app_degraded"), &check).await?;
        let message = measurement_message(&run);
        ensure!(phase(&run) == "Failed", "want Failed: {}", report(s, &run));
        ensure!(
            message.contains("Deployment")
                && message.contains("shop")
                && message.contains("progress deadline"),
            "the failure does not name the Degraded Deployment shop and its message: {}",
            report(s, &run)
        );
        println!("e2e-observe: app_degraded=Failed: {message:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-observe`"]
fn sync_trigger_moves_the_application_to_the_requested_revision_through_the_agent() -> Result<()> {
    on_scene(async |s| {
        let outcome = sync_trigger(s).await;
        record(
            "sync_trigger",
            match &outcome {
                Ok(()) => "ok",
                Err(_) => "failed",
            },
        )?;
        outcome
    })
}

async fn sync_trigger(s: &Scene) -> Result<()> {
    use dispatch_api::client::{ClientConfig, ServerClient};
    let resources = json!([argocd::resource("Deployment", "shop", "Healthy", "")]);
    argocd::create_application(
        &s.b,
        "shop-sync",
        argocd::status("Synced", OLD_SHA, "Healthy", resources),
    )
    .await?;
    let client = ServerClient::new(&ClientConfig {
        server: s.w.url.clone(),
        token_file: Some(s.w.dispatch.plugin_token.clone()),
        ca_file: Some(s.w.dispatch.ca.clone()),
        ca_only: true,
        insecure_plaintext: false,
        timeout: Duration::from_secs(30),
    })?;
    let path = dispatch_api::observe::APPLICATION
        .replace("{destination}", "cluster-b")
        .replace("{namespace}", argocd::NAMESPACE)
        .replace("{name}", "shop-sync");
    let requested: ApplicationState = client
        .post(
            &format!("{path}:sync"),
            &json!({"revision": NEW_SHA, "refresh": "hard", "project": PROJECT,
                    "stage": argocd::APP_STAGE}),
        )
        .await
        .map_err(|e| anyhow::anyhow!("POST {path}:sync: {e}"))?;
    ensure!(
        requested.name == "shop-sync" && requested.destination == "cluster-b",
        "POST {path}:sync answered the state of another Application: {requested:?}"
    );
    // The agent wrote the operation; Argo CD (the player) syncs; the GET shows it.
    let state = eventually(
        "the Application synced to the requested revision",
        SYNC_TIMEOUT,
        || async {
            // The plugin's token may act for any project: name Kargo's (`?project=`), and
            // the Stage the Application is authorized for.
            let state: ApplicationState = client
                .get(&format!(
                    "{path}?project={PROJECT}&stage={}",
                    argocd::APP_STAGE
                ))
                .await
                .map_err(|e| anyhow::anyhow!("GET {path}: {e}"))?;
            let done = state.sync.revision == NEW_SHA
                && state
                    .operation
                    .as_ref()
                    .is_some_and(|op| op.phase == "Succeeded");
            Ok(if done {
                Progress::Done(state)
            } else {
                Progress::Waiting(format!("{state:?}"))
            })
        },
    )
    .await?;
    let app = argocd::applications(&s.b).get("shop-sync").await?;
    ensure!(
        app.data.get("operation").is_none_or(Value::is_null)
            && app
                .data
                .pointer("/status/operationState/syncResult/revision")
                == Some(&json!(NEW_SHA)),
        "the Application on cluster-b did not go through a sync to {NEW_SHA}: {}",
        app.data
    );
    println!("e2e-observe: sync_trigger=ok: {state:?}");
    Ok(())
}
