//! Where Jobs go: `require`, label selectors, kubeconfig contexts and direct credentials, Argo CD
//! cluster Secrets, Kargo `stage` through Argo CD Applications, and the policy.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dispatch_server::destinations::{Entry, IN_CLUSTER_NAME};
use dispatch_server::logs::Redactor;
use dispatch_server::{EngineError, Phase};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;

use dispatch_tests::block::RULE_ALLOWS;

use crate::engine_support::*;
use crate::fixture::*;

#[test]
#[ignore = "needs clusters: make test-engine"]
fn require_all_fails_and_require_any_succeeds() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        // Schedulable only on a; on b the pod stays pending until the deadline fails the Job (10s:
        // room for a 1s Job on a loaded machine).
        let pod = json!({"nodeSelector": {CLUSTER_LABEL: "a"}});
        let mut verdicts = Vec::new();
        // `any` first: it is decided as soon as a completes, before b's deadline.
        for require in ["any", "all"] {
            let run = run_context("team-a", None);
            let routing =
                json!({"destination": "a,b", "require": require, "activeDeadline": "10s"});
            let req = request(&run, "multi", 1, block(routing, 0, "1s", pod.clone())?);
            let ensured = engine.ensure(&req).await?;
            ensure!(ensured.verdict.metadata["destinations"] == "a,b");
            verdicts.push((require, engine.clone(), ensured.job));
        }
        for (require, engine, job) in verdicts {
            let v = wait_verdict(&engine, &job, &Redactor::default(), VERDICT_TIMEOUT, |v| {
                v.phase.is_terminal()
            })
            .await?;
            let lines: Vec<&str> = v.message.lines().collect();
            match require {
                "all" => {
                    ensure!(v.phase == Phase::Failed, "all: {v:?}");
                    ensure!(lines[0] == "a: Successful", "{}", v.message);
                    ensure!(
                        lines[1].starts_with("b: Failed: DeadlineExceeded"),
                        "{}",
                        v.message
                    );
                    ensure!(
                        v.metadata["state.b"] == "Failed: DeadlineExceeded"
                            && v.metadata["require"] == "all"
                    );
                }
                _ => {
                    ensure!(v.phase == Phase::Successful, "any: {v:?}");
                    // b is still pending (or, on a slow machine, already past its deadline).
                    ensure!(
                        lines[0] == "a: Successful"
                            && (lines[1].starts_with("b: Running")
                                || lines[1].starts_with("b: Failed")),
                        "{}",
                        v.message
                    );
                    ensure!(v.metadata["require"] == "any");
                }
            }
            engine.terminate(&job).await;
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn selector_picks_the_labelled_destinations() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "sel",
            1,
            block(
                json!({"destinationSelector": "env=prod"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == ["a", "b"], "{names:?}");
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == "a: Successful\nb: Successful",
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.c, &run.uid).await?.is_empty(),
            "nothing on c (env=dev)"
        );
        let none = request(
            &run,
            "sel",
            2,
            block(
                json!({"destinationSelector": "env=staging"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let e = engine.ensure(&none).await.unwrap_err();
        ensure!(
            matches!(e, EngineError::NoMatch { .. })
                && e.to_string().contains("a {\"env\": \"prod\""),
            "{e}"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn kubeconfig_contexts_and_direct_credentials() -> Result<()> {
    let f = fixture()?;
    run(async {
        // One kubeconfig with contexts a and b (the embedded default reads ~/.kube/config the
        // same way), plus c by server URL, bearer token and CA from the config file.
        let merged = kube::config::Kubeconfig::read_from(&f.a.kubeconfig)?
            .merge(kube::config::Kubeconfig::read_from(&f.b.kubeconfig)?)?;
        let path = std::env::temp_dir().join(format!("engine-test-{}.kubeconfig", &run_uid()[..8]));
        // JSON is YAML: the kubeconfig reader takes it.
        std::fs::write(&path, serde_json::to_string(&merged)?)?;
        let ca = f.c.ca_pem.replace('\n', "\n    ");
        let yaml = format!(
            "kubeconfigContexts: {{path: {}, contexts: [\"a\", \"b*\"], labels: {{from: kubeconfig}}}}\n\
             destinations:\n\
             - name: c-direct\n  server: {}\n  token: {}\n  namespace: default\n  caData: |\n    {ca}\n",
            path.display(),
            f.c.server,
            f.c.token
        );
        let kc_engine = engine(&yaml).await?;
        ensure!(
            kc_engine.registry().names() == ["a", "b", "c-direct"],
            "{:?}",
            kc_engine.registry().names()
        );
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "kc",
            1,
            block(json!({"destination": "b,c-direct"}), 0, "1s", json!({}))?,
        );
        let ensured = kc_engine.ensure(&req).await?;
        let v = wait_verdict(
            &kc_engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == "b: Successful\nc-direct: Successful",
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.b, &run.uid).await?.len() == 1 && jobs_of(&f.c, &run.uid).await?.len() == 1
        );
        let sel = request(
            &run,
            "kc",
            2,
            block(
                json!({"destinationSelector": "from=kubeconfig"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let names: Vec<String> = kc_engine
            .ensure(&sel)
            .await?
            .job
            .placements
            .into_iter()
            .map(|p| p.destination)
            .collect();
        ensure!(names == ["a", "b"], "{names:?}");

        // A wrong token is a clear, permanent error.
        let bad = yaml.replace(&f.c.token, "wrong-token");
        let bad_engine = engine(&bad).await?;
        let e = bad_engine
            .ensure(&request(
                &run,
                "kc",
                3,
                block(json!({"destination": "c-direct"}), 0, "1s", json!({}))?,
            ))
            .await?;
        ensure!(
            e.verdict.phase == Phase::Error && !e.verdict.retryable,
            "{:?}",
            e.verdict
        );
        ensure!(
            e.verdict.message.contains("rejected (HTTP 401)"),
            "{}",
            e.verdict.message
        );
        let _ = std::fs::remove_file(&path);
        Ok(())
    })
}

/// The exec credential plugin the Argo CD test installs (a script printing c's token).
fn exec_script() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("exec-credential-{}.sh", std::process::id()))
}

fn argocd_yaml(f: &Fixture) -> String {
    // The exec providers are allowlisted, so that the Secrets below fail or work for the real
    // reason (the command is not installed; the script prints a token); a command outside the
    // list is refused before that (server/tests/attacks/argocd.rs).
    format!(
        "controlPlane: {{kubeconfig: {}}}\nargocd: {{namespace: argocd, execProviders: [argocd-k8s-auth-not-installed, \"{}\"]}}\nengine: {{logTimeout: 2s}}\n",
        f.a.kubeconfig.display(),
        exec_script().display()
    )
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn argocd_cluster_secret_with_a_service_account_token() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&argocd_yaml(f)).await?;
        let entry = engine
            .registry()
            .wait_for(B_VIA_ARGOCD, Duration::from_secs(30), |_| true)
            .await
            .context("destination from the Argo CD secret")?;
        let Entry::Ready(b_dest) = &entry else {
            bail!("{entry:?}")
        };
        ensure!(
            b_dest.server == f.b.server && b_dest.labels["env"] == "argocd-test",
            "{b_dest:?}"
        );
        ensure!(
            engine.registry().get(IN_CLUSTER_NAME).is_some(),
            "implicit in-cluster"
        );

        let run = run_context("team-a", None);
        let req = request(
            &run,
            "argocd",
            1,
            block(
                json!({"destinationSelector": "env=argocd-test"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == format!("{B_VIA_ARGOCD}: Successful"),
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.b, &run.uid).await?.len() == 1,
            "the Job ran on b"
        );

        // Live: a new Secret appears, with credentials this server cannot use; then it goes.
        let ca = f.a.client().await?;
        let exec = json!({"execProviderConfig": {"command": "argocd-k8s-auth-not-installed", "args": ["aws"],
                                                 "installHint": "install argocd-k8s-auth"}});
        apply_cluster_secret(
            &ca,
            "cluster-eks",
            "eks-prod",
            "https://eks.invalid",
            &exec,
            &[],
        )
        .await?;
        let broken = engine
            .registry()
            .wait_for("eks-prod", Duration::from_secs(30), |_| true)
            .await
            .context("destination from the exec secret")?;
        let Entry::Broken(b) = &broken else {
            bail!("{broken:?}")
        };
        ensure!(
            b.error
                .contains("\"argocd-k8s-auth-not-installed\" is not installed")
                && b.error.contains("argocd/cluster-eks"),
            "{}",
            b.error
        );
        let run2 = run_context("team-a", None);
        let e = engine
            .ensure(&request(
                &run2,
                "eks",
                1,
                block(dest("eks-prod"), 0, "1s", json!({}))?,
            ))
            .await?;
        ensure!(
            e.verdict.phase == Phase::Error && e.verdict.message.contains("not installed"),
            "{:?}",
            e.verdict
        );

        Api::<Secret>::namespaced(ca.clone(), "argocd")
            .delete("cluster-eks", &DeleteParams::default())
            .await?;
        eventually(
            "destination removed with its secret",
            Duration::from_secs(30),
            || async { Ok(engine.registry().get("eks-prod").is_none().then_some(())) },
        )
        .await?;
        // The token still works for b (the first destination is untouched).
        ensure!(matches!(
            engine.registry().get(B_VIA_ARGOCD),
            Some(Entry::Ready(_))
        ));
        let _ = &f.b_token;

        // An exec credential plugin that is installed works: it prints c's token.
        let script = exec_script();
        let credential = json!({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                                "status": {"token": f.c.token}});
        std::fs::write(
            &script,
            format!("#!/bin/sh\ncat <<'EOF'\n{credential}\nEOF\n"),
        )?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let mut exec_ok = argocd_config("unused", &f.c.ca_pem);
        if let Some(o) = exec_ok.as_object_mut() {
            o.remove("bearerToken");
            o.insert(
                "execProviderConfig".into(),
                json!({"command": script, "args": [],
                     "apiVersion": "client.authentication.k8s.io/v1beta1"}),
            );
        }
        apply_cluster_secret(&ca, "cluster-c-exec", "c-exec", &f.c.server, &exec_ok, &[]).await?;
        let c_exec = engine
            .registry()
            .wait_for("c-exec", Duration::from_secs(30), |_| true)
            .await;
        ensure!(matches!(c_exec, Some(Entry::Ready(_))), "{c_exec:?}");
        let run3 = run_context("team-a", None);
        let ensured = engine
            .ensure(&request(
                &run3,
                "exec",
                1,
                block(dest("c-exec"), 0, "1s", json!({}))?,
            ))
            .await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Successful, "{v:?}");
        ensure!(
            jobs_of(&f.c, &run3.uid).await?.len() == 1,
            "the Job ran on c"
        );
        Api::<Secret>::namespaced(ca, "argocd")
            .delete("cluster-c-exec", &DeleteParams::default())
            .await?;
        let _ = std::fs::remove_file(&script);
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn stage_resolves_through_argocd_applications() -> Result<()> {
    let f = fixture()?;
    run(async {
        let ca = f.a.client().await?;
        let stage = format!("uat-{}", &run_uid()[..6]);
        for (name, destination) in [
            (
                format!("{stage}-remote"),
                json!({"server": format!("{}/", f.b.server), "namespace": "guestbook"}),
            ),
            (
                format!("{stage}-local"),
                json!({"name": IN_CLUSTER_NAME, "namespace": "guestbook"}),
            ),
        ] {
            application(&ca, &name, destination).await?;
        }
        let context = json!([
            {"name": format!("{stage}-remote"), "namespace": "argocd"},
            {"name": format!("{stage}-local")}
        ]);
        let stages = dynamic_api(&ca, "kargo-demo", "kargo.akuity.io", "Stage", "stages");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
            "metadata": {"name": stage, "namespace": "kargo-demo",
                         "annotations": {"kargo.akuity.io/argocd-context": context.to_string()}},
            "spec": {"requestedFreight": []}
        }))?;
        stages
            .create(&PostParams::default(), &obj)
            .await
            .context("creating the stage")?;

        let engine = engine(&argocd_yaml(f)).await?;
        let run = run_context("kargo-demo", Some(&stage));
        let req = request(&run, "stage", 1, block(dest("stage"), 0, "1s", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == [B_VIA_ARGOCD, IN_CLUSTER_NAME], "{names:?}");
        // Later lookups of the run reuse the resolution: no Stage or Application reads.
        ensure!(
            engine.locate(&req).await?
                == dispatch_server::engine::JobRef {
                    deadline: 0,
                    ..ensured.job.clone()
                }
        );
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Successful, "{v:?}");
        for cl in [&f.b, &f.a] {
            let jobs = jobs_of(cl, &run.uid).await?;
            ensure!(jobs.len() == 1, "one job on {}", cl.name);
            ensure!(env_of(&jobs[0])["KARGO_STAGE"] == stage);
        }

        // A run without a Stage label, and a Stage without the annotation, say what is missing.
        let plain = run_context("kargo-demo", None);
        let e = engine
            .ensure(&request(
                &plain,
                "stage",
                1,
                block(dest("stage"), 0, "1s", json!({}))?,
            ))
            .await
            .unwrap_err();
        ensure!(
            e.to_string().contains("has no kargo.akuity.io/stage label"),
            "{e}"
        );
        let bare = run_context("kargo-demo", Some("no-such-stage"));
        let e = engine
            .ensure(&request(
                &bare,
                "stage",
                1,
                block(dest("stage"), 0, "1s", json!({}))?,
            ))
            .await
            .unwrap_err();
        ensure!(
            e.to_string()
                .contains("Stage kargo-demo/no-such-stage does not exist"),
            "{e}"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn policy_denies_with_the_config_key() -> Result<()> {
    let f = fixture()?;
    run(async {
        let policy = format!(
            "policy:\n  rules:\n  - projects: [team-a]\n    destinations: [a]\n    namespaces: [default]\n    {RULE_ALLOWS}\n"
        );
        let engine = engine(&static_yaml(f, &policy)).await?;
        ensure!(engine.policy().warning().is_none());
        let cases = [
            ("team-b", "a", None, "no rule lists this project"),
            ("team-a", "b", None, "allow destinations a"),
            ("team-a", "a", Some("other"), "allow namespaces default"),
        ];
        for (project, destination, namespace, why) in cases {
            let run = run_context(project, None);
            let mut routing = json!({"destination": destination});
            if let Some(ns) = namespace {
                routing["namespace"] = ns.into();
            }
            let e = engine
                .ensure(&request(&run, "p", 1, block(routing, 0, "1s", json!({}))?))
                .await
                .unwrap_err();
            let text = e.to_string();
            // A destination the project may not use is refused as such, before its namespace.
            ensure!(
                matches!(
                    e,
                    EngineError::Denied(_) | EngineError::DestinationDenied(_)
                ),
                "{text}"
            );
            ensure!(
                text.contains(&format!("project {project:?}"))
                    && text.contains(&format!("destination {destination:?}"))
                    && text.contains(why)
                    && text.contains("`policy.rules` in config file engine-test.yaml"),
                "{text}"
            );
            ensure!(
                jobs_of(&f.a, &run.uid).await?.is_empty()
                    && jobs_of(&f.b, &run.uid).await?.is_empty()
            );
        }
        // A selector keeps the allowed destinations only.
        let run = run_context("team-a", None);
        let ensured = engine
            .ensure(&request(
                &run,
                "p",
                1,
                block(
                    json!({"destinationSelector": "env=prod"}),
                    0,
                    "1s",
                    json!({}),
                )?,
            ))
            .await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == ["a"], "{names:?}");
        Ok(())
    })
}
