//! End to end, nothing mocked: the real Argo Rollouts controller loads `rollouts-dispatch-plugin`
//! (configured through `argo-rollouts-config` args), the plugin forwards to a real
//! `rollouts-dispatch serve` (in this process), whose engine runs the Job on the destination
//! cluster; the verdict lands in the AnalysisRun exactly where Kargo reads it.
//!
//! Every scenario is one test on one shared World (three clusters, the controller, the server;
//! see `dispatch_tests::world`), started by the first scenario that runs. Scenarios that kill a
//! component take the World alone; the others run side by side, each with its own runs
//! (AnalysisRuns are shaped as Kargo creates them, see `dispatch_tests::kargo`). A failure
//! names the scenario (the test) and what it saw; the clusters' logs stay in their directories.
//!
//! The scene's server also has `argocd:` (`DirectOptions`), for `destination: stage`
//! (`stage.rs`); `sharding.rs` starts a second controller with `--instance-id` beside the
//! scene's own; `long_stage.rs` verifies a Stage of the longest name with two metrics.
//!
//! `#[ignore]`d for plain `cargo test`; `make e2e` runs it (`cargo test … -- --ignored NAME`
//! runs one scenario).

mod long_stage;
mod sharding;
mod stage;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use dispatch_tests::analysis::{self, all_messages, measurement_message, phase, wait_finished};
use dispatch_tests::artifacts::example_analysis_templates;
use dispatch_tests::cluster::argo;
use dispatch_tests::kargo::{Verification, PROJECT, TENANT_B};
use dispatch_tests::objects::{job_env, jobs_of, the_one_job};
use dispatch_tests::shared::{block_on, Shared};
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::world::{Direct, DirectOptions, World};
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;
use tokio::sync::RwLock;

/// How long a Job that a scenario waits for may take to appear on its destination.
const JOB_TIMEOUT: Duration = Duration::from_secs(90);

static WORLD: Shared<RwLock<World<Direct>>> = Shared::new();

/// The shared World, started by the first scenario that runs.
fn world() -> Result<&'static RwLock<World<Direct>>> {
    WORLD.get_or_start(|| async {
        let options = DirectOptions {
            argocd: true,
            ..DirectOptions::default()
        };
        Ok(RwLock::new(World::start_with(options).await?))
    })
}

/// Runs `scenario` on the shared World next to other side-by-side scenarios.
fn side_by_side(scenario: impl AsyncFnOnce(&World<Direct>) -> Result<()>) -> Result<()> {
    let world = world()?;
    block_on(async { scenario(&*world.read().await).await })
}

/// Runs `scenario` with the World to itself: it kills and restarts components.
fn alone(scenario: impl AsyncFnOnce(&mut World<Direct>) -> Result<()>) -> Result<()> {
    let world = world()?;
    block_on(async { scenario(&mut *world.write().await).await })
}

/// The one Job of `run`, on cluster-a; none may be on cluster-b or the control plane.
async fn the_one_job_on_a(w: &World<Direct>, run: &DynamicObject) -> Result<Job> {
    the_one_job(&w.a, &[&w.b, &w.control], &analysis::uid(run)).await
}

/// What a run ended as, with the controller's last log lines: the report of a failed check.
fn report(w: &World<Direct>, run: &DynamicObject) -> String {
    format!(
        "run {} is {} with message {:?}; status {}\ncontroller log tail:\n{}",
        analysis::name(run),
        phase(run),
        measurement_message(run),
        run.data["status"],
        w.controller_log_tail(30)
    )
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn the_example_analysis_templates_are_accepted_by_the_real_crd() -> Result<()> {
    side_by_side(async |w| {
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisTemplate"),
            "analysistemplates",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(w.client.clone(), PROJECT, &resource);
        let templates = example_analysis_templates()?;
        ensure!(
            !templates.is_empty(),
            "config/analysis-templates holds no template"
        );
        for (path, template) in &templates {
            let object: DynamicObject = serde_json::from_value(template.clone())?;
            api.create(&PostParams::default(), &object)
                .await
                .with_context(|| format!("the AnalysisTemplate CRD refuses {}", path.display()))?;
        }
        println!(
            "e2e: the {} example AnalysisTemplates in config/ are accepted by the real CRD",
            templates.len()
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_passing_check_succeeds_with_one_job_on_its_destination_only() -> Result<()> {
    side_by_side(async |w| {
        let run = w
            .submit(&Verification::new(
                "uat",
                "01jabcdefghjkmnpqrstvwxyz0",
                "cluster-a",
            ))
            .await?;
        let run = w.finished(&run).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful: {}",
            report(w, &run)
        );
        let job = the_one_job_on_a(w, &run).await?;
        let env = job_env(&job);
        ensure!(
            env.iter().any(|(k, v)| k == "KARGO_STAGE" && v == "uat"),
            "the Job lacks KARGO_STAGE=uat: {env:?}"
        );
        println!("e2e: uat=Successful, its Job on cluster-a only, with the Kargo context");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_failing_check_fails_naming_the_destination_and_quoting_its_log() -> Result<()> {
    side_by_side(async |w| {
        let failing = Verification::new("prod", "01jabcdefghjkmnpqrstvwxyz1", "cluster-b").exits(1);
        let run = w.finished(&w.submit(&failing).await?).await?;
        let message = measurement_message(&run);
        ensure!(phase(&run) == "Failed", "want Failed: {}", report(w, &run));
        ensure!(
            message.contains("cluster-b"),
            "the failure message does not name the destination: {}",
            report(w, &run)
        );
        ensure!(
            message.contains("check failed: svc is not healthy"),
            "the failure message lacks the failed container's log tail: {}",
            report(w, &run)
        );
        println!("e2e: prod=Failed on cluster-b, with its log tail: {message:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn an_unknown_destination_is_an_error_naming_it_and_the_known_ones() -> Result<()> {
    side_by_side(async |w| {
        let lost = Verification::new("edge", "01jabcdefghjkmnpqrstvwxyz2", "nowhere");
        let run = w.finished(&w.submit(&lost).await?).await?;
        let messages = all_messages(&run);
        // No rule of the project lists it: refused as the policy's (whether it exists or not),
        // naming the destinations the project's rules allow (`cluster-*`).
        ensure!(
            phase(&run) == "Error"
                && messages.contains("nowhere")
                && (messages.contains("cluster-a") || messages.contains("cluster-*")),
            "want an Error naming `nowhere` and the destinations the project may use: {}",
            report(w, &run)
        );
        println!("e2e: unknown destination=Error: {messages:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn policy_refuses_another_project_by_name_and_creates_no_job() -> Result<()> {
    side_by_side(async |w| {
        // Policy: only project kargo-demo may use cluster-*.
        argo::apply_namespace(&w.client, "intruder").await?;
        let runs = argo::analysis_runs(&w.client, "intruder");
        let mut denied = Verification::new("intruder", "01jabcdefghjkmnpqrstvwxyz6", "cluster-a")
            .analysis_run(&w.freight)?;
        denied.metadata.namespace = Some("intruder".into());
        denied.metadata.owner_references = None;
        let denied = runs.create(&PostParams::default(), &denied).await?;
        let denied = wait_finished(&runs, analysis::name(&denied)).await?;
        let message = measurement_message(&denied);
        ensure!(
            phase(&denied) == "Error"
                && message.contains("intruder")
                && message.contains("cluster-a")
                && message.contains("policy"),
            "want a policy Error naming project intruder and cluster-a: {}",
            report(w, &denied)
        );
        let jobs = jobs_of(&w.a, &analysis::uid(&denied)).await?;
        ensure!(
            jobs.is_empty(),
            "a denied verification created {} Job(s) on cluster-a",
            jobs.len()
        );
        println!("e2e: policy denies project intruder on cluster-a: {message}");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_selector_with_require_all_runs_one_job_on_each_destination() -> Result<()> {
    side_by_side(async |w| {
        let multi = Verification::new("multi", "01jabcdefghjkmnpqrstvwxyz3", "unused")
            .routed(json!({"destinationSelector": "env=e2e", "require": "all"}));
        let run = w.finished(&w.submit(&multi).await?).await?;
        let uid = analysis::uid(&run);
        let (on_a, on_b) = (
            jobs_of(&w.a, &uid).await?.len(),
            jobs_of(&w.b, &uid).await?.len(),
        );
        ensure!(
            phase(&run) == "Successful" && on_a == 1 && on_b == 1,
            "selector env=e2e, require all: {on_a} Job(s) on a and {on_b} on b; want Successful, 1 and 1: {}",
            report(w, &run)
        );
        println!("e2e: selector + require all=Successful, one Job on each destination");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_server_restart_mid_job_loses_no_job_and_duplicates_none() -> Result<()> {
    alone(async |w| {
        // One Job running across the restart, one aborted (Kargo's `spec.terminate: true`)
        // through the restarted server.
        let restart =
            Verification::new("restart", "01jabcdefghjkmnpqrstvwxyz5", "cluster-b").runs_for("20s");
        let abort =
            Verification::new("abort", "01jabcdefghjkmnpqrstvwxyz4", "cluster-a").runs_for("10m");
        let restart = w.submit(&restart).await?;
        let abort = w.submit(&abort).await?;
        let (restart_uid, abort_uid) = (analysis::uid(&restart), analysis::uid(&abort));
        eventually(
            "the restart run's Job on cluster-b",
            JOB_TIMEOUT,
            || async { Ok(!jobs_of(&w.b, &restart_uid).await?.is_empty()) },
        )
        .await?;
        eventually("the abort run's Job on cluster-a", JOB_TIMEOUT, || async {
            Ok(!jobs_of(&w.a, &abort_uid).await?.is_empty())
        })
        .await?;
        w.dispatch.server.restart(Duration::from_secs(3)).await?;
        w.runs()
            .patch(
                analysis::name(&abort),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"terminate": true}})),
            )
            .await
            .context("aborting the verification")?;

        let restart = w.finished(&restart).await?;
        let restart_jobs = jobs_of(&w.b, &restart_uid).await?.len();
        ensure!(
            phase(&restart) == "Successful" && restart_jobs == 1,
            "after a server restart mid-Job: {restart_jobs} Job(s) on b; want Successful and exactly 1: {}",
            report(w, &restart)
        );
        let abort = w.finished(&abort).await?;
        eventually(
            "the aborted Job deleted from cluster-a",
            JOB_TIMEOUT,
            || async { Ok(jobs_of(&w.a, &abort_uid).await?.is_empty()) },
        )
        .await
        .with_context(|| format!("the abort after a server restart: {}", report(w, &abort)))?;
        println!(
            "e2e: server restart mid-Job=Successful (1 Job); abort after it={} (Job deleted)",
            phase(&abort)
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_controller_restart_mid_job_relaunches_the_plugin_and_keeps_one_job() -> Result<()> {
    alone(async |w| {
        let launches = || {
            w.rollouts
                .log_text()
                .matches("rollouts-dispatch-plugin started")
                .count()
        };
        let ctrl =
            Verification::new("ctrl", "01jabcdefghjkmnpqrstvwxyz7", "cluster-a").runs_for("20s");
        let ctrl = w.submit(&ctrl).await?;
        let uid = analysis::uid(&ctrl);
        eventually("the ctrl run's Job on cluster-a", JOB_TIMEOUT, || async {
            Ok(!jobs_of(&w.a, &uid).await?.is_empty())
        })
        .await?;
        let before = launches();
        w.rollouts.restart(&mut w.control).await?;
        let ctrl = w.finished(&ctrl).await?;
        let jobs = jobs_of(&w.a, &uid).await?.len();
        let after = launches();
        ensure!(
            phase(&ctrl) == "Successful" && jobs == 1 && after > before && after >= 2,
            "after a controller restart mid-Job: {jobs} Job(s) on a, plugin launched {before} time(s) \
             before the restart and {after} after; want Successful, exactly 1 Job, a new launch: {}",
            report(w, &ctrl)
        );
        println!("e2e: controller killed mid-Job -> plugin relaunched ({after} launches), Successful, 1 Job");
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn the_admin_port_reports_jobs_per_destination_and_verdict_latency() -> Result<()> {
    side_by_side(async |w| {
        let run = w
            .submit(&Verification::new(
                "metrics",
                "01jabcdefghjkmnpqrstvwxyz8",
                "cluster-a",
            ))
            .await?;
        let run = w.finished(&run).await?;
        ensure!(
            phase(&run) == "Successful",
            "want Successful: {}",
            report(w, &run)
        );
        let admin = w.dispatch.server.admin_port;
        eventually(
            "Job and verdict metrics on the admin port",
            JOB_TIMEOUT,
            || async {
                let metrics = dispatch_tests::admin::get_body(admin, "/metrics")
                    .await
                    .unwrap_or_default();
                let complete = metrics.contains(
                    r#"rollouts_dispatch_jobs{destination="cluster-a",phase="succeeded"}"#,
                ) && metrics
                    .contains("rollouts_dispatch_verdict_latency_seconds_count")
                    && !metrics.contains("rollouts_dispatch_verdict_latency_seconds_count 0");
                Ok(if complete {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!("/metrics:\n{metrics}"))
                })
            },
        )
        .await?;
        println!(
            "e2e: /metrics has rollouts_dispatch_jobs per destination/phase and verdict latency"
        );
        Ok(())
    })
}

/// The Rollouts controller's projected ServiceAccount token (audience `rollouts-dispatch`) is
/// accepted through a real TokenReview; other audiences, other users and garbage are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Go-built cluster binaries: run `make e2e`"]
async fn service_account_tokens_are_checked_by_token_review() -> Result<()> {
    use dispatch_server::http::tokenreview::TokenReviewAuthenticator;
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;

    let cluster = dispatch_tests::cluster::Cluster::start("auth").await?;
    let client = cluster.client().await?;
    argo::apply_namespace(&client, "argo-rollouts").await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "argo-rollouts");
    for name in ["argo-rollouts", "someone-else"] {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        sas.create(&PostParams::default(), &sa).await?;
    }
    let token = |sa: &'static str, audience: &'static str| {
        let sas = sas.clone();
        async move {
            let req = TokenRequest {
                spec: Some(TokenRequestSpec {
                    audiences: Some(vec![audience.to_string()]),
                    expiration_seconds: Some(600),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let created = sas
                .create_token_request(sa, &PostParams::default(), &req)
                .await?;
            anyhow::Ok(created.status.and_then(|s| s.token).unwrap_or_default())
        }
    };
    // Callers fail closed: the controller needs its `policy.callers` entry (every project).
    let auth = TokenReviewAuthenticator::new(
        client.clone(),
        Vec::new(),
        vec!["system:serviceaccount:argo-rollouts:argo-rollouts".into()],
    )
    .with_callers(
        vec![dispatch_server::config::CallerBinding {
            subject: "system:serviceaccount:argo-rollouts:argo-rollouts".into(),
            projects: vec!["*".into()],
        }],
        "e2e",
    );
    let ok = auth
        .authenticate(&token("argo-rollouts", "rollouts-dispatch").await?)
        .await;
    ensure!(
        ok.as_ref().map(|p| p.subject.as_str())
            == Ok("system:serviceaccount:argo-rollouts:argo-rollouts"),
        "the controller's token was not accepted: {ok:?}"
    );
    let wrong_audience = auth
        .authenticate(&token("argo-rollouts", "kubernetes").await?)
        .await;
    let other_user = auth
        .authenticate(&token("someone-else", "rollouts-dispatch").await?)
        .await;
    let garbage = auth.authenticate("not-a-token").await;
    match (&wrong_audience, &other_user, &garbage) {
        (Err(a), Err(b), Err(c))
            if a.to_string().contains("rejected")
                && b.to_string().contains("not allowed")
                && c.to_string().contains("rejected") => {}
        _ => anyhow::bail!(
            "want refusals: audience {wrong_audience:?}, other user {other_user:?}, garbage {garbage:?}"
        ),
    }
    println!("e2e: TokenReview accepts the controller's projected token, refuses other audiences/users/garbage");
    Ok(())
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn the_api_answers_nothing_in_plain_http() -> Result<()> {
    side_by_side(async |w| {
        ensure!(
            w.url.starts_with("https://"),
            "the scene's API is {}",
            w.url
        );
        let token = w.plugin_token()?;
        dispatch_tests::tls::plain_http_is_refused(w.dispatch.server.port, &token).await?;
        println!("e2e: plain HTTP with a valid token to the API port: no answer");
        Ok(())
    })
}

/// The measurements of a run's first metric, as the controller wrote them.
fn measurements(run: &DynamicObject) -> Vec<serde_json::Value> {
    run.data["status"]["metricResults"][0]["measurements"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
fn a_tenant_that_forges_another_projects_job_reference_only_ends_its_own_run() -> Result<()> {
    // A tenant with `edit` on its own project namespace can write its AnalysisRun's status (the
    // CRD has no status subresource): it copies the Job reference of another project's running
    // measurement into its own and aborts, so that the controller calls Terminate with it.
    alone(async |w| {
        let victim =
            Verification::new("victim", "01jabcdefghjkmnpqrstvwxyz8", "cluster-a").runs_for("40s");
        let victim = w.submit(&victim).await?;
        let victim_uid = analysis::uid(&victim);

        argo::apply_namespace(&w.client, TENANT_B).await?;
        let tenant_runs = argo::analysis_runs(&w.client, TENANT_B);
        let mut forger = Verification::new("forger", "01jabcdefghjkmnpqrstvwxyz9", "cluster-a")
            .runs_for("10m")
            .analysis_run(&w.freight)?;
        forger.metadata.namespace = Some(TENANT_B.into());
        forger.metadata.owner_references = None;
        // One Error measurement ends the metric (Argo's default allows 4 in a row).
        forger.data["spec"]["metrics"][0]["consecutiveErrorLimit"] = json!(0);
        let forger = tenant_runs.create(&PostParams::default(), &forger).await?;
        let forger_name = analysis::name(&forger).to_string();

        // Both measurements running, each with the reference the server signed.
        let with_ref = |run: &DynamicObject| {
            measurements(run)
                .first()
                .and_then(|m| m["metadata"]["dispatch-ref"].as_str().map(String::from))
        };
        let victim_ref = eventually("the victim's signed reference", JOB_TIMEOUT, || async {
            let run = w.runs().get(analysis::name(&victim)).await?;
            Ok(with_ref(&run))
        })
        .await?;
        eventually("the forger's own reference", JOB_TIMEOUT, || async {
            Ok(with_ref(&tenant_runs.get(&forger_name).await?).is_some())
        })
        .await?;
        ensure!(
            !jobs_of(&w.a, &victim_uid).await?.is_empty(),
            "the victim's Job is not on cluster-a"
        );

        // Stop the controller, so that it sees the forged status and the abort together and
        // none of its own status writes comes between them. (Freezing it raced: thawed, it
        // could resume the forger on a timer from its stale cache and write the real
        // reference back over the forged one.)
        w.rollouts.stop(&mut w.control)?;
        let forged = async {
            let current = tenant_runs.get(&forger_name).await?;
            let mut results = current.data["status"]["metricResults"].clone();
            let victim_run = w.runs().get(analysis::name(&victim)).await?;
            let victim_metadata = measurements(&victim_run)
                .first()
                .map(|m| m["metadata"].clone())
                .unwrap_or_default();
            results[0]["measurements"][0]["metadata"] = victim_metadata;
            tenant_runs
                .patch(
                    &forger_name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "spec": {"terminate": true},
                        "status": {"metricResults": results}
                    })),
                )
                .await
                .context("writing the forged reference and the abort")
        }
        .await;
        w.rollouts.start(&mut w.control).await?;
        forged?;

        let forger = wait_finished(&tenant_runs, &forger_name).await?;
        let message = all_messages(&forger);
        let refused = phase(&forger) == "Error"
            && message.contains("refusing the measurement's dispatch-ref");
        if controller_terminates_between_resumes() {
            ensure!(
                refused,
                "want the forger's run in Error naming the forged reference: {}",
                report(w, &forger)
            );
        } else {
            // Argo Rollouts v1.9 and older complete a run aborted before its measurement's
            // resumeAt without calling Terminate (analysis/analysis.go:189 in v1.9.1), so the
            // forged reference never reaches the plugin: the run ends "Run Terminated". When the
            // restarted controller reconciles only after that resumeAt (a loaded machine), v1.9
            // does call Terminate, and the forged reference is refused as on v1.10.
            let terminated_without_call = forger.data["status"]["message"] == "Run Terminated"
                && !message.contains("Metric Terminated");
            ensure!(
                terminated_without_call || refused,
                "want the forger's run terminated by the controller without a Terminate call, or \
                 in Error naming the forged reference: {}",
                report(w, &forger)
            );
        }
        ensure!(
            !jobs_of(&w.a, &victim_uid).await?.is_empty(),
            "the forged abort deleted the victim's Job: {}",
            report(w, &forger)
        );
        let victim = w.finished(&victim).await?;
        ensure!(
            phase(&victim) == "Successful" && jobs_of(&w.a, &victim_uid).await?.len() == 1,
            "the victim's verdict changed after the forged abort: {}",
            report(w, &victim)
        );
        ensure!(
            victim_ref.contains(&victim_uid),
            "the victim's reference does not name its run: {victim_ref}"
        );
        println!(
            "e2e: a forged cross-project reference + abort: forger={} ({}), victim's Job kept, victim=Successful",
            phase(&forger),
            message.lines().next().unwrap_or_default()
        );
        Ok(())
    })
}

/// Whether the controller under test calls Terminate on a measurement whose `resumeAt` is still
/// ahead when its run is aborted: Argo Rollouts v1.10 and newer (`!terminating &&` in
/// `generateMetricTasks`, analysis/analysis.go:189), not v1.9 and older. `make e2e` names the
/// version in `E2E_ARGO_ROLLOUTS_VERSION` (default: the newest, which does).
fn controller_terminates_between_resumes() -> bool {
    let version = std::env::var("E2E_ARGO_ROLLOUTS_VERSION").unwrap_or_default();
    let minor = version
        .trim_start_matches('v')
        .split('.')
        .nth(1)
        .and_then(|m| m.parse::<u32>().ok());
    minor.is_none_or(|m| m >= 10)
}
