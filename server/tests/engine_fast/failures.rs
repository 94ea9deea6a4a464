//! Trouble on a destination: API errors (403, 401, 500) that become states naming the fix, a
//! Job watch that keeps failing (the engine asks the API instead of its cache), a closed API
//! server, a destination whose credentials cannot be used, and failing log and delete calls.

use anyhow::Result;
use dispatch_server::engine::Outcome;
use dispatch_server::logs::Redactor;
use dispatch_server::verdict::DestState;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{finish_job, job_names, pod_for, terminated};
use crate::world::{block, eventually, request, run, Clusters, World, NS};

fn state(outcome: &Outcome) -> DestState {
    match outcome {
        Outcome::NotCreated(s) => s.clone(),
        other => panic!("expected no Job, got {other:?}"),
    }
}

#[tokio::test]
async fn api_errors_on_create_name_the_fix_and_a_500_is_retryable() -> Result<()> {
    let w = World::start("").await?;
    w.api("a").fail("POST", "/jobs", 403, 1);
    w.api("b").fail("POST", "/jobs", 401, 1);
    let config = block(json!({"destination": "a,b"}))?;
    let ensured = w
        .engine
        .ensure(&request(&run(1), "smoke", 1, config.clone()))
        .await?;
    let DestState::Error(forbidden) = state(&ensured.outcomes[0].1) else {
        panic!("{:?}", ensured.outcomes);
    };
    assert!(forbidden.contains("forbidden to create job"), "{forbidden}");
    assert!(
        forbidden.contains("grant the server's credentials"),
        "{forbidden}"
    );
    let DestState::Error(rejected) = state(&ensured.outcomes[1].1) else {
        panic!("{:?}", ensured.outcomes);
    };
    assert!(
        rejected.contains(&format!(
            "credentials for {} are rejected",
            w.api("b").url()
        )),
        "{rejected}"
    );
    assert_eq!(ensured.verdict.phase, Phase::Error);
    assert!(!ensured.verdict.retryable);

    // A 500 is a blip: retryable, and the next attempt creates the Job. (The kube client itself
    // retries 429, 503 and 504 with backoff, so those would not reach the engine once.)
    w.api("a").fail("POST", "/jobs", 500, 1);
    let req = request(&run(2), "smoke", 1, block(json!({"destination": "a"}))?);
    let blip = w.engine.ensure(&req).await?;
    let DestState::Unavailable(m) = state(&blip.outcomes[0].1) else {
        panic!("{:?}", blip.outcomes);
    };
    assert!(
        m.contains("destination unreachable: cannot create job"),
        "{m}"
    );
    assert!(blip.verdict.retryable);
    let retry = w.engine.ensure(&req).await?;
    assert_eq!(retry.outcomes, vec![("a".into(), Outcome::Created)]);
    Ok(())
}

#[tokio::test]
async fn with_a_failing_job_watch_the_engine_asks_the_api() -> Result<()> {
    let clusters = Clusters::start().await?;
    // Every list of the Job watch fails; one-off calls (create, get, GC's list) do not. The
    // watch's lists are the paged ones (kube-runtime's watcher pages by 500, as client-go).
    clusters
        .a
        .fail("GET", "/apis/batch/v1/jobs? limit=500", 500, usize::MAX);
    let w = clusters.engine("", "", false).await?;
    let a = w.destination("a")?;
    eventually("the job watch of a fails", || {
        let failing = a.jobs().failing_for().is_some();
        async move { Ok(failing.then_some(())) }
    })
    .await?;
    assert!(!a.is_authoritative());
    let cache_problem = a.cache_problem().unwrap_or_default();
    assert!(
        cache_problem.contains("watch of jobs failing"),
        "{cache_problem}"
    );

    let run = run(3);
    let config = block(json!({"destination": "a"}))?;
    let mut jobs = Vec::new();
    for n in 1..=2 {
        let e = w
            .engine
            .ensure(&request(&run, "m", n, config.clone()))
            .await?;
        assert_eq!(e.outcomes, vec![("a".into(), Outcome::Created)]);
        jobs.push(e.job);
    }
    finish_job(
        w.api("a"),
        &jobs[1].name,
        "Complete",
        "CompletionsReached",
        "",
    );
    let v = w.engine.status(&jobs[1], &Redactor::default()).await;
    assert_eq!(v.phase, Phase::Successful, "{}", v.message);
    let get = format!("/namespaces/{NS}/jobs/{}", jobs[1].name);
    assert_eq!(w.api("a").calls("GET", &get), 1, "read from the API");

    // GC lists the run's Jobs from the API; the sweep skips a destination it cannot see whole.
    let gc = w.engine.gc(&run.uid, None, &jobs[0].placements, 1).await;
    assert_eq!(
        gc.deleted,
        vec![("a".into(), format!("{NS}/{}", jobs[0].name))],
        "{gc:?}"
    );
    let sweep = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    assert!(sweep.deleted.is_empty(), "{sweep:?}");
    assert_eq!(job_names(w.api("a")), vec![jobs[1].name.clone()]);
    Ok(())
}

#[tokio::test]
async fn a_closed_api_server_and_unusable_credentials_are_named() -> Result<()> {
    // Port 1 of the loopback: refused at once, and never handed to another test's server (a
    // fake stopped here could see its port reused by a test running in parallel).
    const CLOSED: &str = "http://127.0.0.1:1";
    let more = format!(
        "- {{name: down, server: \"{CLOSED}\", token: t, namespace: {NS}}}\n\
         - {{name: broken, kubeconfig: /nonexistent/kubeconfig}}"
    );
    let w = Clusters::start().await?.engine(&more, "", false).await?;
    let down = w.destination("down")?;
    eventually("the watches of down fail", || {
        let failing = down.jobs().failing_for().is_some();
        async move { Ok(failing.then_some(())) }
    })
    .await?;
    let req = request(
        &run(4),
        "smoke",
        1,
        block(json!({"destination": "down,broken"}))?,
    );
    let ensured = w.engine.ensure(&req).await?;
    let DestState::Unavailable(down) = state(&ensured.outcomes[0].1) else {
        panic!("{:?}", ensured.outcomes);
    };
    assert!(
        down.contains(&format!("destination unreachable: cannot create job {NS}/")),
        "{down}"
    );
    assert!(down.contains(CLOSED), "{down}");
    let DestState::Error(unusable) = state(&ensured.outcomes[1].1) else {
        panic!("{:?}", ensured.outcomes);
    };
    assert!(unusable.contains("destination is unusable"), "{unusable}");
    assert!(unusable.contains("/nonexistent/kubeconfig"), "{unusable}");

    let v = w.engine.status(&ensured.job, &Redactor::default()).await;
    assert_eq!(v.phase, Phase::Error);
    assert!(
        v.message.contains("(watch of jobs"),
        "the cache's trouble is named: {}",
        v.message
    );
    // Neither can delete now: both deletions are kept pending, retried by the server.
    let t = w.engine.terminate(&ensured.job).await;
    assert_eq!(t.pending.len(), 2, "{t:?}");
    Ok(())
}

#[tokio::test]
async fn failing_log_and_delete_calls_are_reported_not_hidden() -> Result<()> {
    let w = World::start("").await?;
    let run = run(5);
    let req = request(
        &run,
        "smoke",
        1,
        block(json!({"destination": "a", "logTail": 3}))?,
    );
    let job = w.engine.ensure(&req).await?.job;
    w.cached("a", &job.name, true).await?;
    let api = w.api("a");
    let pod = pod_for(api, &job.name, terminated(1, None), true)?;
    api.fail("GET", "/log", 500, 1);
    finish_job(api, &job.name, "Failed", "BackoffLimitExceeded", "");
    let none = Redactor::default();
    let v = w.verdict(&job, &none, |v| v.phase.is_terminal()).await?;
    assert!(
        v.message.contains(&format!(
            "no log of container \"check\" exited with code 1 (Error) (pod {pod})"
        )),
        "{}",
        v.message
    );
    w.engine.status(&job, &none).await;
    assert_eq!(
        api.calls("GET", "/log"),
        1,
        "a failed log read is remembered too"
    );

    api.fail("DELETE", "/jobs/", 403, 2);
    let t = w.engine.terminate(&job).await;
    assert_eq!(t.pending.len(), 1, "{t:?}");
    assert!(t.pending[0].1.contains("forbidden to delete job"), "{t:?}");
    let gc = w.engine.gc(&run.uid, None, &job.placements, 0).await;
    assert_eq!(gc.failed.len(), 1, "{gc:?}");
    assert_eq!(job_names(api), vec![job.name.clone()], "still there");
    Ok(())
}
