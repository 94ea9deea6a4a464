//! Resume hints (`GET /v1/measurements/hints`, #30): an agent token is refused; a caller bound
//! to a project sees only that project's hints; and a hint whose namespace a tenant forged on
//! its own Job (the annotation a hint is read from) reaches nobody, because with `confirmRuns`
//! the server shows a hint only for a run the control plane has in the namespace it names. A
//! hint is never a verdict either way: the plugin asks `status` for that.

use anyhow::{ensure, Result};
use dispatch_api::block::PLUGIN_NAME;
use dispatch_api::v1::{self, HintPage};
use dispatch_server::job::{job_name, ANN_RUN_NAMESPACE};
use serde_json::{json, Value};

use crate::cluster_side::finish_job;
use crate::fake_api::Res;
use crate::scene::{agent_token, measurement, plugin_token, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};
use crate::world::{World, NS};

const RUN_A: (&str, &str, &str) = ("team-a", "uat.hints.a", "0b7c6f1e-hint-uid-000a");
const RUN_B: (&str, &str, &str) = ("team-b", "uat.hints.b", "0b7c6f1e-hint-uid-000b");

/// The runs on the fake control plane, as the Rollouts controller sees them.
fn create_runs(world: &World) {
    for (namespace, name, uid) in [RUN_A, RUN_B] {
        world.clusters.cp.put(
            &Res::new("argoproj.io/v1alpha1", "analysisruns"),
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "spec": {"metrics": [
                    {"name": "smoke", "provider": {"plugin": {PLUGIN_NAME: {"destination": "a"}}}}
                ]}
            }),
        );
    }
}

/// The hints route as `token` reads it after `page` (none: a first call), waiting `wait` s.
async fn read(scene: &Scene, token: &str, page: Option<&HintPage>, wait: u32) -> Result<Value> {
    let query = match page {
        Some(p) => format!("?epoch={}&after={}&waitSeconds={wait}", p.epoch, p.cursor),
        None => String::new(),
    };
    let reply = scene
        .call(
            "GET",
            &format!("{}{query}", v1::HINTS),
            Some(token),
            &Value::Null,
        )
        .await?;
    ensure!(reply.status == 200, "{} {:?}", reply.status, reply.body);
    Ok(reply.body)
}

fn jobs_of(page: &Value) -> Vec<String> {
    page["hints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["job"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn hints_reach_only_their_project_and_a_forged_namespace_reaches_nobody() -> Result<()> {
    let world = World::start(TENANTS_POLICY).await?;
    create_runs(&world);
    let scene = Scene::serve_confirming(world, TENANTS_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let (team_a, team_b) = (
        plugin_token("ci-team-a", Some(&["team-a"])),
        plugin_token("ci-team-b", Some(&["team-b"])),
    );
    for (run, destination) in [(RUN_A, "a"), (RUN_B, "b")] {
        let reply = scene
            .post(
                v1::ENSURE,
                &controller,
                &measurement(run, "smoke", 1, destination),
            )
            .await?;
        ensure!(reply.status == 200, "{:?}", reply.body);
    }
    let (job_a, job_b) = (job_name(RUN_A.2, "smoke", 1), job_name(RUN_B.2, "smoke", 1));

    // An agent token is refused, reaching nothing.
    let before = scene.calls_mark();
    let agent = scene
        .call("GET", v1::HINTS, Some(&agent_token("edge")), &Value::Null)
        .await?;
    let case = "hints: an agent token reads the hints";
    let outcome = Outcome {
        refused: agent.status == 403 && scene.calls_since(before).is_empty(),
        ..Outcome::default()
    };
    tally::record(case, &outcome);
    ensure!(outcome == Outcome::refused(), "{case}: {agent:?}");

    let mut pages = Vec::new();
    for token in [&controller, &team_a, &team_b] {
        let first: HintPage = serde_json::from_value(read(&scene, token, None, 0).await?)?;
        ensure!(first.reset && first.hints.is_empty(), "{first:?}");
        pages.push(first);
    }
    // Team b, which may edit Jobs in its namespace on b, says its Job is team-a's, then both
    // Jobs finish.
    scene
        .world
        .clusters
        .b
        .update(&Res::new("batch/v1", "jobs"), NS, &job_b, |j| {
            j["metadata"]["annotations"][ANN_RUN_NAMESPACE] = json!("team-a")
        });
    finish_job(&scene.world.clusters.b, &job_b, "Complete", "Completed", "");
    finish_job(&scene.world.clusters.a, &job_a, "Complete", "Completed", "");

    let seen_by_a = jobs_of(&read(&scene, &team_a, Some(&pages[1]), 5).await?);
    let seen_by_all = jobs_of(&read(&scene, &controller, Some(&pages[0]), 5).await?);
    let seen_by_b = jobs_of(&read(&scene, &team_b, Some(&pages[2]), 1).await?);
    let case = "hints: a Job's forged run namespace carries its hint to another project";
    let outcome = Outcome {
        refused: !seen_by_a.contains(&job_b) && !seen_by_all.contains(&job_b),
        cross_tenant_read: seen_by_a.contains(&job_b) || seen_by_b.contains(&job_a),
        ..Outcome::default()
    };
    tally::record(case, &outcome);
    ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
    ensure!(
        seen_by_a == vec![job_a.clone()]
            && seen_by_all == vec![job_a.clone()]
            && seen_by_b.is_empty(),
        "team a saw {seen_by_a:?}, every project {seen_by_all:?}, team b {seen_by_b:?}"
    );
    Ok(())
}
