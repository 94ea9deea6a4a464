//! One Job through its life: created with the Kargo context; verdicts from success, failure (with
//! the redacted log tail), an image pull error, a pod that cannot be scheduled or start, and a
//! deadline; terminate and GC.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use dispatch_server::destinations::Entry;
use dispatch_server::engine::{JobRef, Outcome};
use dispatch_server::job::{self, LABEL_MANAGED};
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use dispatch_tests::kargo::{promotion_name, FREIGHT_COLLECTION_ID, FREIGHT_NAME};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::engine_support::*;
use crate::fixture::*;

#[test]
#[ignore = "needs clusters: make test-engine"]
fn success_carries_the_kargo_context() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("kargo-demo", Some("uat"));
        let req = request(&run, "smoke", 1, block(dest("a"), 0, "1s", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        ensure!(
            ensured.outcomes == vec![("a".to_string(), Outcome::Created)],
            "{:?}",
            ensured.outcomes
        );
        ensure!(
            ensured.verdict.phase == Phase::Running,
            "{:?}",
            ensured.verdict
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
        ensure!(v.message == "a: Successful", "{}", v.message);
        ensure!(v.metadata["job-name"] == job::job_name(&run.uid, "smoke", 1));
        ensure!(v.metadata["job-namespace"] == "default");
        ensure!(v.metadata["state.a"] == "Successful");

        let jobs = jobs_of(&f.a, &run.uid).await?;
        ensure!(jobs.len() == 1, "one Job on a, got {}", jobs.len());
        let j = &jobs[0];
        let labels = j.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels[LABEL_MANAGED] == "true" && labels["rollouts-dispatch.io/destination"] == "a"
        );
        let ann = j.metadata.annotations.clone().unwrap_or_default();
        ensure!(ann["analysisrun.argoproj.io/name"] == run.name);
        ensure!(ann["rollouts-dispatch.io/kargo-stage"] == "uat");
        let env = env_of(j);
        let promotion = promotion_name("uat", FREIGHT_NAME);
        for (k, want) in [
            ("KARGO_PROJECT", "kargo-demo"),
            ("KARGO_STAGE", "uat"),
            ("KARGO_FREIGHT_COLLECTION", FREIGHT_COLLECTION_ID),
            ("KARGO_PROMOTION", promotion.as_str()),
            ("ANALYSIS_RUN_UID", run.uid.as_str()),
            ("DISPATCH_DESTINATION", "a"),
            // the user's own value is kept
            ("ANALYSIS_METRIC", "set-by-user"),
        ] {
            ensure!(
                env.get(k).map(String::as_str) == Some(want),
                "env {k}: {:?}",
                env.get(k)
            );
        }
        // The reference can be found again from the request alone (the /v1 API's way).
        ensure!(
            engine.locate(&req).await?
                == JobRef {
                    deadline: 0,
                    ..ensured.job.clone()
                }
        );
        // Ensuring again is idempotent: the Job is adopted, not duplicated.
        let again = engine.ensure(&req).await?;
        ensure!(
            again.outcomes[0].1 == Outcome::Adopted,
            "{:?}",
            again.outcomes
        );
        ensure!(jobs_of(&f.a, &run.uid).await?.len() == 1);
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn failure_carries_the_redacted_log_tail() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let mut req = request(
            &run,
            "e2e",
            1,
            block(
                json!({"destination": "b", "logTail": 3}),
                1,
                "1s",
                json!({}),
            )?,
        );
        req.secrets = vec!["s3cret-value".into()];
        let ensured = engine.ensure(&req).await?;
        let name = ensured.job.name.clone();
        // What a kubelet writes under terminationMessagePolicy FallbackToLogsOnError; kwok
        // terminates the container but writes no message.
        let pod = pod_of(&f.b, &name, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .is_some()
                    })
                })
        })
        .await?;
        let log = "starting check\nGET https://svc/health\nusing token s3cret-value\nHTTP 503 from svc\nerror: check failed\n";
        set_termination_message(&f.b, pod, log).await?;
        let secrets = Redactor::new(req.secrets.clone());
        let v = wait_verdict(&engine, &ensured.job, &secrets, VERDICT_TIMEOUT, |v| {
            v.phase.is_terminal() && v.message.contains("termination message")
        })
        .await?;
        ensure!(v.phase == Phase::Failed, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        let lines: Vec<&str> = v.message.lines().collect();
        ensure!(
            lines[0].starts_with("b: Failed: BackoffLimitExceeded")
                && lines[0].contains("container \"check\" exited with code 1"),
            "{}",
            v.message
        );
        ensure!(
            lines[1].starts_with("--- b: last 3 log lines of container \"check\""),
            "{}",
            v.message
        );
        ensure!(
            lines[2..]
                == [
                    "using token *****",
                    "HTTP 503 from svc",
                    "error: check failed"
                ],
            "{}",
            v.message
        );
        ensure!(!v.message.contains("s3cret-value"));
        ensure!(v.metadata["state.b"] == "Failed: BackoffLimitExceeded");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn image_pull_error_is_inconclusive() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        // Unschedulable, so kwok leaves the pod alone and the test plays the kubelet.
        let req = request(
            &run,
            "pull",
            1,
            block(
                dest("c"),
                0,
                "1s",
                json!({"nodeSelector": {CLUSTER_LABEL: "none"}}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let pending = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.message.contains("Unschedulable"),
        )
        .await?;
        ensure!(pending.phase == Phase::Running, "{pending:?}");
        let pod = pod_of(&f.c, &ensured.job.name, |_| true).await?;
        let pods: Api<Pod> = Api::namespaced(f.c.client().await?, "default");
        let patch = json!({"status": {"containerStatuses": [{
            "name": "check", "image": "example.invalid/check:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied for example.invalid/check"}}
        }]}});
        pods.patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .context("writing the waiting state")?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Inconclusive, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(
            v.message
                == format!(
                    "c: Inconclusive: pod {} container \"check\" cannot pull its image: \
                     ErrImagePull: pull access denied for example.invalid/check",
                    pod.metadata.name.as_deref().unwrap_or_default()
                ),
            "{}",
            v.message
        );
        let report = engine.terminate(&ensured.job).await;
        ensure!(report.deleted == vec!["c".to_string()], "{report:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn a_pod_that_cannot_be_scheduled_or_start_is_an_error_once_its_grace_is_over() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let pods: Api<Pod> = Api::namespaced(f.c.client().await?, "default");
        let long_ago = "2020-01-01T00:00:00Z";
        // Unschedulable (no node has the label): the real scheduler says so, within
        // engine.schedulingGrace.
        let unschedulable = |metric: &str| {
            request(
                &run,
                metric,
                1,
                block(
                    dest("c"),
                    0,
                    "1s",
                    json!({"nodeSelector": {CLUSTER_LABEL: "none"}}),
                )
                .expect("a block"),
            )
        };
        let ensured = engine.ensure(&unschedulable("unschedulable")).await?;
        let pending = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.message.contains("Unschedulable"),
        )
        .await?;
        ensure!(pending.phase == Phase::Running, "{pending:?}");
        ensure!(
            pending
                .message
                .contains("an Error unless it is scheduled within"),
            "{}",
            pending.message
        );
        // Unschedulable since long ago: the scheduler keeps a condition's lastTransitionTime
        // while its status stays False.
        let pod = pod_of(&f.c, &ensured.job.name, |_| true).await?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
            "lastTransitionTime": long_ago
        }]}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .context("backdating the PodScheduled condition")?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(v.phase == Phase::Error, "{v:?}");
        ensure!(
            v.message.starts_with(&format!(
                "c: Error: pod {name} cannot be scheduled: Unschedulable: 0/1 nodes are available"
            )),
            "{}",
            v.message
        );

        // A container the kubelet cannot start (played here: kwok has no kubelet), since long
        // ago: an Error naming the pod, the container, the reason and the kubelet's message.
        let first = ensured.job;
        let ensured = engine.ensure(&unschedulable("unstartable")).await?;
        let pod = pod_of(&f.c, &ensured.job.name, |_| true).await?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let why = format!(
            "container has runAsNonRoot and image will run as root (pod: \"{name}_default(uid)\", \
             container: check)"
        );
        let patch = json!({"status": {"startTime": long_ago, "containerStatuses": [{
            "name": "check", "image": "example.invalid/check:1", "imageID": "", "ready": false,
            "restartCount": 0,
            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": why}}
        }]}});
        pods.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .context("writing the waiting state")?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(v.phase == Phase::Error, "{v:?}");
        ensure!(
            v.message.starts_with(&format!(
                "c: Error: pod {name} container \"check\" cannot start: \
                 CreateContainerConfigError: {why} (for "
            )),
            "{}",
            v.message
        );
        for job in [&first, &ensured.job] {
            let report = engine.terminate(job).await;
            ensure!(report.deleted == vec!["c".to_string()], "{report:?}");
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn active_deadline_fails_with_the_reason() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "slow",
            1,
            block(
                json!({"destination": "a", "activeDeadline": "2s"}),
                0,
                "5m",
                json!({}),
            )?,
        );
        let started = Instant::now();
        let ensured = engine.ensure(&req).await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Failed, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(
            v.message.starts_with("a: Failed: DeadlineExceeded")
                && v.message.contains("(activeDeadline 2s)"),
            "{}",
            v.message
        );
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "deadline took {:?}",
            started.elapsed()
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn terminate_deletes_the_jobs_everywhere() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(&run, "long", 1, block(dest("a,b"), 0, "5m", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        for cl in [&f.a, &f.b] {
            pod_of(cl, &ensured.job.name, |p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .await?;
        }
        let report = engine.terminate(&ensured.job).await;
        ensure!(
            report.deleted == vec!["a".to_string(), "b".to_string()] && report.failed.is_empty(),
            "{report:?}"
        );
        for cl in [&f.a, &f.b] {
            let jobs: Api<Job> = Api::namespaced(cl.client().await?, "default");
            let pods: Api<Pod> = Api::namespaced(cl.client().await?, "default");
            let name = ensured.job.name.clone();
            eventually(
                &format!("job and pods gone on {}", cl.name),
                VERDICT_TIMEOUT,
                || async {
                    let job_gone = jobs.get_opt(&name).await?.is_none();
                    let pods_gone = pods
                        .list(
                            &ListParams::default()
                                .labels(&format!("batch.kubernetes.io/job-name={name}")),
                        )
                        .await?
                        .items
                        .is_empty();
                    Ok((job_gone && pods_gone).then_some(()))
                },
            )
            .await?;
        }
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase == Phase::Error,
        )
        .await?;
        ensure!(v.message.contains("does not exist"), "{}", v.message);
        // A second terminate finds nothing left.
        let again = engine.terminate(&ensured.job).await;
        ensure!(again.absent.len() == 2, "{again:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn gc_keeps_the_newest_jobs_of_a_run() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let mut placements = Vec::new();
        for n in 1..=4 {
            let req = request(&run, "gc", n, block(dest("a,b"), 0, "1s", json!({}))?);
            placements = engine.ensure(&req).await?.job.placements;
        }
        // Another metric of the same run: GC of metric "gc" leaves it alone.
        let other = request(&run, "other", 1, block(dest("a,b"), 0, "1s", json!({}))?);
        engine.ensure(&other).await?;
        for d in ["a", "b"] {
            let Some(Entry::Ready(dest)) = engine.registry().get(d) else {
                bail!("destination {d}")
            };
            eventually(
                &format!("5 jobs cached on {d}"),
                VERDICT_TIMEOUT,
                || async { Ok((dest.jobs().group(&run.uid).len() == 5).then_some(())) },
            )
            .await?;
        }
        let report = engine.gc(&run.uid, Some("gc"), &placements, 2).await;
        ensure!(report.failed.is_empty(), "{report:?}");
        let mut deleted: Vec<String> = report
            .deleted
            .iter()
            .map(|(d, j)| format!("{d}:{j}"))
            .collect();
        deleted.sort();
        let name = |n| format!("default/{}", job::job_name(&run.uid, "gc", n));
        let mut want = vec![
            format!("a:{}", name(1)),
            format!("a:{}", name(2)),
            format!("b:{}", name(1)),
            format!("b:{}", name(2)),
        ];
        want.sort();
        ensure!(deleted == want, "deleted {deleted:?}");
        for cl in [&f.a, &f.b] {
            let uid = run.uid.clone();
            eventually(
                &format!("only the newest 2 jobs left on {}", cl.name),
                VERDICT_TIMEOUT,
                || async {
                    let mut names: Vec<String> = jobs_of(cl, &uid)
                        .await?
                        .into_iter()
                        .filter_map(|j| j.metadata.name)
                        .collect();
                    names.sort();
                    let want = vec![
                        job::job_name(&uid, "gc", 3),
                        job::job_name(&uid, "gc", 4),
                        job::job_name(&uid, "other", 1),
                    ];
                    Ok((names == want).then_some(()))
                },
            )
            .await?;
        }
        // Nothing more to collect.
        eventually("gc is idempotent", Duration::from_secs(20), || async {
            Ok(engine
                .gc(&run.uid, Some("gc"), &placements, 2)
                .await
                .deleted
                .is_empty()
                .then_some(()))
        })
        .await?;
        Ok(())
    })
}
