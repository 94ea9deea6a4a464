//! A new engine adopts our Jobs and refuses foreign ones; an unreachable destination fails fast.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use dispatch_server::engine::Outcome;
use dispatch_server::job::{self};
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::engine_support::*;
use crate::fixture::*;

#[test]
#[ignore = "needs clusters: make test-engine"]
fn a_new_engine_adopts_existing_jobs_and_refuses_foreign_ones() -> Result<()> {
    let f = fixture()?;
    run(async {
        let yaml = static_yaml(f, "");
        let run = run_context("team-a", None);
        let req = request(&run, "adopt", 1, block(dest("a,b"), 0, "30s", json!({}))?);
        let first = engine(&yaml).await?;
        let created = first.ensure(&req).await?;
        ensure!(
            created.outcomes.iter().all(|(_, o)| *o == Outcome::Created),
            "{:?}",
            created.outcomes
        );
        drop(first);

        // Cold caches: the API answers AlreadyExists and the Job is adopted.
        let second = engine(&yaml).await?;
        let adopted = second.ensure(&req).await?;
        ensure!(
            adopted.outcomes.iter().all(|(_, o)| *o == Outcome::Adopted),
            "{:?}",
            adopted.outcomes
        );
        // The same Jobs; the deadline counts from each ensure.
        ensure!(
            adopted.job
                == dispatch_server::engine::JobRef {
                    deadline: adopted.job.deadline,
                    ..created.job.clone()
                }
        );
        // Warm caches: adopted without a create call.
        let third = engine(&yaml).await?;
        ensure!(third.wait_synced(Duration::from_secs(30)).await.is_empty());
        // After the first list each watch sends its WATCH request: let them settle.
        let before = settled_requests(&third).await?;
        let again = third.ensure(&req).await?;
        ensure!(
            again.outcomes.iter().all(|(_, o)| *o == Outcome::Adopted),
            "{:?}",
            again.outcomes
        );
        ensure!(
            third.api_requests() == before,
            "adoption from the cache costs no request"
        );
        let v = third.status(&created.job, &Redactor::default()).await;
        ensure!(v.phase == Phase::Running, "{v:?}");
        for cl in [&f.a, &f.b] {
            ensure!(
                jobs_of(cl, &run.uid).await?.len() == 1,
                "no duplicate on {}",
                cl.name
            );
        }
        third.terminate(&created.job).await;

        // A Job with our name that we did not create is never touched.
        let other = run_context("team-a", None);
        let name = job::job_name(&other.uid, "adopt", 1);
        let foreign: Job = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"owner": "someone-else"}},
            "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "x", "image": "example.invalid/x:1"}]}}}
        }))?;
        let jobs: Api<Job> = Api::namespaced(f.a.client().await?, "default");
        jobs.create(&PostParams::default(), &foreign).await?;
        let req = request(&other, "adopt", 1, block(dest("a"), 0, "1s", json!({}))?);
        let refused = third.ensure(&req).await?;
        ensure!(
            refused.verdict.phase == Phase::Error,
            "{:?}",
            refused.verdict
        );
        ensure!(
            refused
                .verdict
                .message
                .contains("already exists and is not ours"),
            "{}",
            refused.verdict.message
        );
        let report = third.terminate(&refused.job).await;
        ensure!(
            report.failed.len() == 1 && report.failed[0].1.contains("refusing to delete"),
            "{report:?}"
        );
        let still = jobs.get(&name).await?;
        ensure!(
            still
                .metadata
                .labels
                .unwrap_or_default()
                .get("owner")
                .map(String::as_str)
                == Some("someone-else")
        );
        jobs.delete(&name, &DeleteParams::background()).await?;

        // A Job made to look like ours (our labels, the run's uid) is refused without our mark.
        let victim = run_context("team-a", None);
        let hijack_req = request(&victim, "adopt", 1, block(dest("a"), 0, "1s", json!({}))?);
        let name = job::job_name(&victim.uid, "adopt", 1);
        let lookalike: Job = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {
                job::LABEL_MANAGED: "true", job::LABEL_RUN_UID: victim.uid}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "x", "image": "example.invalid/x:1",
                                     "command": ["true"]}]}}}
        }))?;
        jobs.create(&PostParams::default(), &lookalike).await?;
        let refused = third.ensure(&hijack_req).await?;
        ensure!(
            refused.verdict.phase == Phase::Error
                && refused.verdict.message.contains(job::mark::ANN_MARK),
            "a look-alike without our mark is refused: {:?}",
            refused.verdict
        );
        jobs.delete(&name, &DeleteParams::background()).await?;
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn a_copied_mark_on_a_replaced_spec_is_refused_and_ours_read_back_is_adopted() -> Result<()> {
    let f = fixture()?;
    run(async {
        let yaml = static_yaml(f, "");
        let run = run_context("team-a", None);
        let req = request(&run, "mark", 1, block(dest("a"), 0, "30s", json!({}))?);
        let first = engine(&yaml).await?;
        ensure!(first.ensure(&req).await?.outcomes[0].1 == Outcome::Created);
        let jobs: Api<Job> = Api::namespaced(f.a.client().await?, "default");
        let name = job::job_name(&run.uid, "mark", 1);
        let ours = jobs.get(&name).await?;
        // The API server's defaults (pull policy, termination path, fieldRef apiVersion, …) do
        // not change the digest: the Job read back is ours.
        let found = serde_json::to_value(&ours)?;
        ensure!(
            job::mark::of(&found).is_some_and(|m| m.starts_with("v1.")),
            "{found}"
        );

        // Replace it: same name, labels and mark, another command.
        jobs.delete(&name, &DeleteParams::background()).await?;
        wait_gone(&jobs, &name).await?;
        let mut forged = found.clone();
        for k in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "managedFields",
        ] {
            forged["metadata"].as_object_mut().map(|m| m.remove(k));
        }
        forged.as_object_mut().map(|o| o.remove("status"));
        let spec = forged["spec"].as_object_mut().expect("a Job has a spec");
        spec.remove("selector");
        for k in ["controller-uid", "batch.kubernetes.io/controller-uid"] {
            forged["spec"]["template"]["metadata"]["labels"]
                .as_object_mut()
                .map(|l| l.remove(k));
        }
        forged["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["true"]);
        jobs.create(
            &PostParams::default(),
            &serde_json::from_value::<Job>(forged)?,
        )
        .await?;
        let second = engine(&yaml).await?;
        let refused = second.ensure(&req).await?;
        ensure!(
            refused.verdict.phase == Phase::Error
                && refused.verdict.message.contains("pod template"),
            "a copied mark on another spec is refused: {:?}",
            refused.verdict
        );
        jobs.delete(&name, &DeleteParams::background()).await?;
        Ok(())
    })
}

async fn wait_gone(jobs: &Api<Job>, name: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while jobs.get_opt(name).await?.is_some() {
        ensure!(
            Instant::now() < deadline,
            "job {name} still there after 30s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn an_unreachable_destination_fails_fast_with_its_name() -> Result<()> {
    // No cluster needed: one port nobody listens on, one server that accepts connections and
    // never answers (TLS handshake stalls).
    run(async {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let silent_port = silent.local_addr()?.port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = silent.accept().await {
                held.push(sock);
            }
        });
        let yaml = format!(
            "destinations:\n\
             - name: down\n  server: https://127.0.0.1:{closed}\n  token: t\n  insecure: true\n\
             - name: silent\n  server: https://127.0.0.1:{silent_port}\n  token: t\n  insecure: true\n\
             engine: {{connectTimeout: 2s, requestTimeout: 5s, cacheWait: 1s}}\n"
        );
        let engine = engine(&yaml).await?;
        for d in ["down", "silent"] {
            let run = run_context("team-a", None);
            let started = Instant::now();
            let ensured = engine
                .ensure(&request(&run, "u", 1, block(dest(d), 0, "1s", json!({}))?))
                .await?;
            let took = started.elapsed();
            let v = &ensured.verdict;
            ensure!(v.phase == Phase::Error && v.retryable, "{d}: {v:?}");
            ensure!(
                v.message
                    .starts_with(&format!("{d}: Error: destination unreachable")),
                "{d}: {}",
                v.message
            );
            ensure!(took < Duration::from_secs(10), "{d}: ensure took {took:?}");
            let started = Instant::now();
            let s = engine.status(&ensured.job, &Redactor::default()).await;
            ensure!(
                s.phase == Phase::Error && s.retryable && s.message.contains("unreachable"),
                "{d}: {s:?}"
            );
            ensure!(
                started.elapsed() < Duration::from_secs(10),
                "{d}: status took {:?}",
                started.elapsed()
            );
            println!(
                "{d}: ensure {took:?}, status {:?}: {}",
                started.elapsed(),
                s.message
            );
        }
        hold.abort();
        Ok(())
    })
}
