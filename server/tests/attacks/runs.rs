//! Requests about runs that do not exist: with `confirmRuns`, the server serves a measurement
//! request only for an AnalysisRun of the control plane with that namespace, name and uid and
//! that metric with our plugin (a watch cache, `runs`). A run that does not exist, another uid,
//! or a metric that is not ours is `403` on every measurement route with no destination API
//! call; before the watch has listed the runs the answer is `503` (a retry), never a verdict.

use anyhow::{ensure, Result};
use dispatch_api::block::PLUGIN_NAME;
use dispatch_api::v1::{self, Ensured, GcRequest, MeasurementRef};
use serde_json::{json, Value};

use crate::fake_api::Res;
use crate::scene::{measurement, plugin_token, Reply, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};
use crate::world::World;

/// The run that exists: project `team-a`, metric `smoke` with our plugin, `web` without.
const RUN: (&str, &str, &str) = ("team-a", "uat.verify.1", "0b7c6f1e-run-uid-0001");

fn analysis_runs() -> Res {
    Res::new("argoproj.io/v1alpha1", "analysisruns")
}

/// AnalysisRun [`RUN`] on the fake control plane, as the Rollouts controller sees it.
fn create_run(world: &World) {
    let (namespace, name, uid) = RUN;
    world.clusters.cp.put(
        &analysis_runs(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"metrics": [
                {"name": "smoke", "provider": {"plugin": {PLUGIN_NAME: {"destination": "a"}}}},
                {"name": "web", "provider": {"web": {"url": "https://example.invalid"}}}
            ]}
        }),
    );
}

/// `m` as the body of `route` (gc takes a `GcRequest`).
fn body(route: &str, m: &MeasurementRef) -> Result<Value> {
    Ok(if route == v1::GC {
        serde_json::to_value(GcRequest {
            run: m.run.clone(),
            metric: m.metric.clone(),
            limit: 5,
            block: m.block.clone(),
        })?
    } else {
        serde_json::to_value(m)?
    })
}

const ROUTES: [&str; 4] = [v1::ENSURE, v1::STATUS, v1::TERMINATE, v1::GC];

#[tokio::test]
async fn requests_about_runs_that_do_not_exist_are_refused_before_any_destination() -> Result<()> {
    let world = World::start(TENANTS_POLICY).await?;
    create_run(&world);
    let scene = Scene::serve_confirming(world, TENANTS_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let (ns, name, uid) = RUN;
    let cases = [
        (
            "a run that does not exist",
            measurement((ns, "uat.verify.ghost", uid), "smoke", 1, "a"),
            format!("AnalysisRun {ns}/uat.verify.ghost does not exist on the control plane"),
        ),
        (
            "the run's name with another uid",
            measurement((ns, name, "another-uid"), "smoke", 1, "a"),
            format!("AnalysisRun {ns}/{name} has uid {uid}, not another-uid"),
        ),
        (
            "a metric that does not use the plugin",
            measurement(RUN, "web", 1, "a"),
            format!("AnalysisRun {ns}/{name} has no metric \"web\" whose provider is the {PLUGIN_NAME} plugin"),
        ),
        (
            "a metric the run does not have",
            measurement(RUN, "smoke-2", 1, "a"),
            format!("AnalysisRun {ns}/{name} has no metric \"smoke-2\""),
        ),
    ];
    // All at once: a run the watch does not know is refused only after `runs::CONFIRM_WAIT`.
    let mut calls = Vec::new();
    for (what, m, _) in &cases {
        for route in ROUTES {
            let (scene, controller) = (&scene, &controller);
            let body = body(route, m)?;
            calls.push(async move {
                let reply = scene.call("POST", route, Some(controller), &body).await;
                (format!("runs: {what} → {route}"), reply)
            });
        }
    }
    let replies = futures::future::join_all(calls).await;
    let destination_calls = scene.destination_calls();
    for ((case, reply), expect) in replies.into_iter().zip(
        cases
            .iter()
            .flat_map(|(_, _, e)| std::iter::repeat_n(e, ROUTES.len())),
    ) {
        let reply: Reply = reply?;
        let message = reply.body["message"].as_str().unwrap_or_default();
        tally::record(
            &case,
            &Outcome {
                refused: reply.status == 403 && destination_calls.is_empty(),
                ..Outcome::default()
            },
        );
        ensure!(
            reply.status == 403 && message.contains(expect.as_str()),
            "{case}: {} {:?}, want 403 with {expect:?}",
            reply.status,
            reply.body
        );
    }
    ensure!(
        destination_calls.is_empty(),
        "refused requests reached destinations: {destination_calls:?}"
    );
    // Confirmed from the watch cache: its one list; a refusal because the watch holds no such
    // run (or another uid) is read once from the control plane first (`runs/read.rs`: a
    // silent watch must not turn a real run into an `Error`), so a caller's refused request
    // costs at most one read, never more (the two first cases, on each route).
    let reads = scene.world.clusters.cp.calls("GET", "/analysisruns");
    let read_before_refusing = 2 * ROUTES.len();
    ensure!(
        reads == 1 + read_before_refusing,
        "{reads} reads of analysisruns for {} requests (want the watch's one list and one read \
         per refusal of an unknown run or uid: {})",
        ROUTES.len() * cases.len(),
        1 + read_before_refusing
    );

    // The run that exists is served, on every route: the refusals above are about the run.
    let mut m = measurement(RUN, "smoke", 1, "a");
    let ensured = scene.post(v1::ENSURE, &controller, &m).await?;
    ensure!(ensured.status == 200, "ensure: {:?}", ensured.body);
    m.metadata = serde_json::from_value::<Ensured>(ensured.body)?.metadata;
    for route in [v1::STATUS, v1::GC, v1::TERMINATE] {
        let reply = scene
            .call("POST", route, Some(&controller), &body(route, &m)?)
            .await?;
        ensure!(reply.status == 200, "{route}: {:?}", reply.body);
    }
    ensure!(
        scene
            .destination_calls()
            .iter()
            .any(|c| c.starts_with("a: POST") && c.contains("/jobs")),
        "the genuine run created no Job: {:?}",
        scene.destination_calls()
    );
    Ok(())
}

#[tokio::test]
async fn before_the_runs_are_listed_every_request_is_retried_not_decided() -> Result<()> {
    let world = World::start(TENANTS_POLICY).await?;
    create_run(&world);
    // The server may not list analysisruns (its RBAC lacks them): the watch never syncs.
    world.clusters.cp.fail("GET", "/analysisruns", 403, 100_000);
    let scene = Scene::serve_confirming(world, TENANTS_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let m = measurement(RUN, "smoke", 1, "a");
    // All at once: each waits `runs::CONFIRM_WAIT` for the watch before it answers.
    let replies = futures::future::join_all(ROUTES.map(|route| {
        let (scene, controller, m) = (&scene, &controller, &m);
        async move {
            let reply = match body(route, m) {
                Ok(body) => scene.call("POST", route, Some(controller), &body).await,
                Err(e) => Err(e),
            };
            (route, reply)
        }
    }))
    .await;
    for (route, reply) in replies {
        let reply = reply?;
        let message = reply.body["message"].as_str().unwrap_or_default();
        let case = format!("runs: a request before the watch of analysisruns synced → {route}");
        let calls = scene.destination_calls();
        // 503 is a retry for the plugin (`CallError::Transient`): no verdict is written.
        tally::refused(
            &case,
            Outcome {
                refused: reply.status == 503 && calls.is_empty(),
                ..Outcome::default()
            },
        );
        ensure!(
            message.contains("is not synced")
                && message.contains("list and watch on analysisruns.argoproj.io"),
            "{case}: {message}"
        );
    }
    Ok(())
}
