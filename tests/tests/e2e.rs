//! End to end, nothing mocked: the real Argo Rollouts controller loads `rollouts-dispatch-plugin`
//! (configured through `argo-rollouts-config` args), the plugin forwards to a real
//! `rollouts-dispatch serve` (in this process), whose engine runs the Job on the destination
//! cluster; the verdict lands in the AnalysisRun exactly where Kargo reads it.
//!
//! AnalysisRuns are shaped as Kargo creates them: name `<stage>.<ulid>.<freight7>`, the Kargo
//! labels and promotion annotation, a Freight owner reference, and the `destination` arg that a
//! Stage's `verification.args` provides.
//!
//! `#[ignore]`d for plain `cargo test`; `make e2e` runs it.

mod e2e_support;

use std::time::Duration;

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::argo;
use e2e_support::*;
use kube::api::PostParams;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries and the release plugin: run `make e2e`"]
async fn kargo_verification_runs_on_the_destination_cluster() -> Result<()> {
    let World {
        mut control,
        a,
        b,
        server,
        rollouts,
        client,
        freight,
        ..
    } = World::start().await?;
    let templates = create_example_templates(&client, PROJECT).await?;
    println!(
        "e2e: the {templates} example AnalysisTemplates in config/ are accepted by the real CRD"
    );
    let runs = argo::analysis_runs(&client, PROJECT);
    let post = PostParams::default();
    let ok = runs
        .create(
            &post,
            &kargo_run(
                "uat",
                "01jabcdefghjkmnpqrstvwxyz0",
                &freight,
                "cluster-a",
                0,
            )?,
        )
        .await?;
    let bad = runs
        .create(
            &post,
            &kargo_run(
                "prod",
                "01jabcdefghjkmnpqrstvwxyz1",
                &freight,
                "cluster-b",
                1,
            )?,
        )
        .await?;
    let lost = runs
        .create(
            &post,
            &kargo_run("edge", "01jabcdefghjkmnpqrstvwxyz2", &freight, "nowhere", 0)?,
        )
        .await?;

    let ok = wait_done(&runs, ok.metadata.name.as_deref().unwrap_or_default()).await?;
    let bad = wait_done(&runs, bad.metadata.name.as_deref().unwrap_or_default()).await?;
    let lost = wait_done(&runs, lost.metadata.name.as_deref().unwrap_or_default()).await?;
    let message = measurement_message;
    let report = format!(
        "ok={} {:?} | bad={} {:?} | lost={} {:?}\ncontroller log tail:\n{}",
        phase(&ok),
        message(&ok),
        phase(&bad),
        message(&bad),
        phase(&lost),
        message(&lost),
        rollouts
            .log_text()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("{report}");
    if phase(&ok) != "Successful" || phase(&bad) != "Failed" {
        bail!("want uat Successful and prod Failed: {report}");
    }
    if !message(&bad).contains("cluster-b") {
        bail!("the failure message does not name the destination: {report}");
    }
    if !message(&bad).contains("check failed: svc is not healthy") {
        bail!("the failure message lacks the failed container's log tail: {report}");
    }
    // `nowhere` is not a destination: Error naming it and listing the known ones.
    let lost_msg = lost
        .data
        .pointer("/status/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
        + &message(&lost);
    if phase(&lost) != "Error" || !lost_msg.contains("nowhere") || !lost_msg.contains("cluster-a") {
        bail!("want an Error naming `nowhere` and the known destinations: {report}");
    }
    // The Job ran on the destination the Stage asked for, and only there.
    let uid = ok.metadata.uid.clone().unwrap_or_default();
    let (on_a, on_b, on_control) = (
        jobs_of(&a, &uid).await?,
        jobs_of(&b, &uid).await?,
        jobs_of(&control, &uid).await?,
    );
    if on_a.len() != 1 || !on_b.is_empty() || !on_control.is_empty() {
        bail!(
            "jobs of run {uid}: {} on a, {} on b, {} on control; want 1/0/0",
            on_a.len(),
            on_b.len(),
            on_control.len()
        );
    }
    let env = on_a[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    let stage = env
        .iter()
        .find(|e| e.name == "KARGO_STAGE")
        .and_then(|e| e.value.clone());
    if stage.as_deref() != Some("uat") {
        bail!("the Job lacks KARGO_STAGE=uat: {env:?}");
    }
    println!("e2e: uat=Successful (Job on cluster-a only), prod=Failed on cluster-b, unknown destination=Error");

    // Policy: only project kargo-demo may use cluster-*; another project is denied, by name.
    argo::apply_namespace(&client, "intruder").await?;
    let intruder_runs = argo::analysis_runs(&client, "intruder");
    let mut denied = kargo_run(
        "intruder",
        "01jabcdefghjkmnpqrstvwxyz6",
        &freight,
        "cluster-a",
        0,
    )?;
    denied.metadata.namespace = Some("intruder".into());
    denied.metadata.owner_references = None;
    let denied = intruder_runs.create(&post, &denied).await?;
    let denied = wait_done(
        &intruder_runs,
        denied.metadata.name.as_deref().unwrap_or_default(),
    )
    .await?;
    let denied_msg = message(&denied);
    if phase(&denied) != "Error"
        || !denied_msg.contains("intruder")
        || !denied_msg.contains("cluster-a")
        || !denied_msg.contains("policy")
    {
        bail!(
            "want a policy Error naming project intruder and cluster-a: {} {denied_msg:?}",
            phase(&denied)
        );
    }
    if !jobs_of(&a, denied.metadata.uid.as_deref().unwrap_or_default())
        .await?
        .is_empty()
    {
        bail!("a denied verification created a Job");
    }
    println!("e2e: policy denies project intruder on cluster-a: {denied_msg}");

    // Two destinations by selector, `require: all`: a Job on each, Successful.
    let multi = runs
        .create(
            &post,
            &kargo_run_with(
                "multi",
                "01jabcdefghjkmnpqrstvwxyz3",
                &freight,
                "unused",
                json!({"destinationSelector": "env=e2e", "require": "all"}),
                0,
                "2s",
            )?,
        )
        .await?;
    // Kargo's abort: `spec.terminate: true` while the Job runs.
    let abort = runs
        .create(
            &post,
            &kargo_run_with(
                "abort",
                "01jabcdefghjkmnpqrstvwxyz4",
                &freight,
                "cluster-a",
                json!({"destination": "{{args.destination}}"}),
                0,
                "10m",
            )?,
        )
        .await?;
    // The server killed and restarted while the Job runs.
    let restart = runs
        .create(
            &post,
            &kargo_run_with(
                "restart",
                "01jabcdefghjkmnpqrstvwxyz5",
                &freight,
                "cluster-b",
                json!({"destination": "{{args.destination}}"}),
                0,
                "20s",
            )?,
        )
        .await?;
    // The Rollouts controller killed and restarted while the Job runs: the plugin is relaunched.
    let ctrl = runs
        .create(
            &post,
            &kargo_run_with(
                "ctrl",
                "01jabcdefghjkmnpqrstvwxyz7",
                &freight,
                "cluster-a",
                json!({"destination": "{{args.destination}}"}),
                0,
                "20s",
            )?,
        )
        .await?;
    let ctrl_uid = ctrl.metadata.uid.clone().unwrap_or_default();
    let (abort_uid, restart_uid) = (
        abort.metadata.uid.clone().unwrap_or_default(),
        restart.metadata.uid.clone().unwrap_or_default(),
    );
    eventually("the abort Job on cluster-a", || async {
        Ok(!jobs_of(&a, &abort_uid).await?.is_empty())
    })
    .await?;
    eventually("the restart Job on cluster-b", || async {
        Ok(!jobs_of(&b, &restart_uid).await?.is_empty())
    })
    .await?;
    eventually("the ctrl Job on cluster-a", || async {
        Ok(!jobs_of(&a, &ctrl_uid).await?.is_empty())
    })
    .await?;
    rollouts.restart(&mut control).await?;
    let server = server.restart(Duration::from_secs(3)).await?;
    runs.patch(
        abort.metadata.name.as_deref().unwrap_or_default(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"spec": {"terminate": true}})),
    )
    .await
    .context("aborting the verification")?;

    let multi = wait_done(&runs, multi.metadata.name.as_deref().unwrap_or_default()).await?;
    let multi_uid = multi.metadata.uid.clone().unwrap_or_default();
    let (multi_a, multi_b) = (
        jobs_of(&a, &multi_uid).await?.len(),
        jobs_of(&b, &multi_uid).await?.len(),
    );
    if phase(&multi) != "Successful" || multi_a != 1 || multi_b != 1 {
        bail!("selector env=e2e, require all: phase {} with {multi_a} Job(s) on a and {multi_b} on b; want Successful, 1 and 1 ({})", phase(&multi), message(&multi));
    }
    let abort = wait_done(&runs, abort.metadata.name.as_deref().unwrap_or_default()).await?;
    eventually("the aborted Job deleted from cluster-a", || async {
        Ok(jobs_of(&a, &abort_uid).await?.is_empty())
    })
    .await?;
    let restart = wait_done(&runs, restart.metadata.name.as_deref().unwrap_or_default()).await?;
    let restart_jobs = jobs_of(&b, &restart_uid).await?.len();
    if phase(&restart) != "Successful" || restart_jobs != 1 {
        bail!("after a server restart mid-Job: phase {} ({}), {restart_jobs} Job(s) on b; want Successful and exactly 1", phase(&restart), message(&restart));
    }
    let ctrl = wait_done(&runs, ctrl.metadata.name.as_deref().unwrap_or_default()).await?;
    let ctrl_jobs = jobs_of(&a, &ctrl_uid).await?.len();
    let launches = rollouts
        .log_text()
        .matches("rollouts-dispatch-plugin started")
        .count();
    if phase(&ctrl) != "Successful" || ctrl_jobs != 1 || launches < 2 {
        bail!(
            "after a controller restart mid-Job: phase {} ({}), {ctrl_jobs} Job(s) on a, plugin launched {launches} time(s); \
             want Successful, exactly 1 Job, at least 2 launches",
            phase(&ctrl),
            message(&ctrl)
        );
    }
    println!("e2e: controller killed mid-Job -> plugin relaunched ({launches} launches), verdict Successful, 1 Job");
    // The admin port reports what happened: Jobs per destination and phase, verdict latency.
    let admin = server.args.admin.admin_listen.port();
    let last = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let seen = eventually("Job and verdict metrics on the admin port", || {
        let last = last.clone();
        async move {
            let m = http_get(admin, "/metrics").await.unwrap_or_default();
            let ok = m
                .contains(r#"rollouts_dispatch_jobs{destination="cluster-a",phase="succeeded"}"#)
                && m.contains("rollouts_dispatch_verdict_latency_seconds_count")
                && !m.contains("rollouts_dispatch_verdict_latency_seconds_count 0");
            *last.lock().expect("lock") = m;
            Ok(ok)
        }
    })
    .await;
    if let Err(e) = seen {
        bail!("{e}; /metrics:\n{}", last.lock().expect("lock"));
    }
    println!("e2e: /metrics has rollouts_dispatch_jobs per destination/phase and verdict latency");
    drop(server);
    println!(
        "e2e: selector+require all=Successful (1 Job on each), abort={} (Job deleted), server restart mid-Job=Successful (1 Job)",
        phase(&abort)
    );
    Ok(())
}

/// The Rollouts controller's projected ServiceAccount token (audience `rollouts-dispatch`) is
/// accepted through a real TokenReview; other audiences, other users and garbage are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Go-built cluster binaries: run `make e2e`"]
async fn service_account_tokens_are_checked_by_token_review() -> Result<()> {
    use dispatch_server::http::auth::Authenticator;
    use dispatch_server::http::tokenreview::TokenReviewAuthenticator;
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::Api;

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
    let auth = TokenReviewAuthenticator::new(
        client.clone(),
        Vec::new(),
        vec!["system:serviceaccount:argo-rollouts:argo-rollouts".into()],
    );
    let ok = auth
        .authenticate(&token("argo-rollouts", "rollouts-dispatch").await?)
        .await;
    if ok.as_ref().map(|p| p.subject.as_str())
        != Ok("system:serviceaccount:argo-rollouts:argo-rollouts")
    {
        bail!("the controller's token was not accepted: {ok:?}");
    }
    let wrong_audience = auth
        .authenticate(&token("argo-rollouts", "kubernetes").await?)
        .await;
    let other_user = auth
        .authenticate(&token("someone-else", "rollouts-dispatch").await?)
        .await;
    let garbage = auth.authenticate("not-a-token").await;
    match (&wrong_audience, &other_user, &garbage) {
        (Err(a), Err(b), Err(c))
            if a.to_string().contains("rejected") && b.to_string().contains("not allowed") && c.to_string().contains("rejected") => {}
        _ => bail!("want refusals: audience {wrong_audience:?}, other user {other_user:?}, garbage {garbage:?}"),
    }
    println!("e2e: TokenReview accepts the controller's projected token, refuses other audiences/users/garbage");
    Ok(())
}
