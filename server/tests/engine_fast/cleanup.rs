//! What removes Jobs: `Engine::terminate` (foreground deletion on every destination),
//! `Engine::gc` (the newest `limit` Jobs of a run are kept) and `Engine::sweep_orphans` (Jobs
//! whose AnalysisRun is gone from the control plane; runs completed long ago: `lifecycle`).

use anyhow::Result;
use dispatch_server::engine::SweepReason::{DeletedRun, RunCompleted};
use dispatch_server::engine::{JobRef, RUNS_PAGE};
use dispatch_server::job::{self, RunContext, LABEL_MANAGED, LABEL_RUN_UID};
use dispatch_server::logs::Redactor;
use dispatch_server::runs::Runs;
use dispatch_server::Phase;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::json;

use crate::cluster_side::{analysis_run, foreign_job, job_names, jobs, pod_for, pods};
use crate::world::{block, request, run, World, NS, PROJECT};

#[tokio::test]
async fn terminate_deletes_the_jobs_in_the_foreground_everywhere() -> Result<()> {
    let w = World::start("").await?;
    let req = request(&run(1), "smoke", 1, block(json!({"destination": "a,b"}))?);
    let job = w.engine.ensure(&req).await?.job;
    for d in ["a", "b"] {
        w.cached(d, &job.name, true).await?;
        pod_for(w.api(d), &job.name, json!({"phase": "Running"}), true)?;
    }
    // b's garbage collector is slow: the Job waits for its Pod with a deletionTimestamp.
    w.api("b").hold_deletions(true);
    let report = w.engine.terminate(&job).await;
    assert_eq!(report.deleted, vec!["a", "b"], "{report:?}");
    assert!(
        report.absent.is_empty() && report.failed.is_empty(),
        "{report:?}"
    );
    assert!(job_names(w.api("a")).is_empty());
    assert!(
        w.api("a").list(&pods()).is_empty(),
        "the Pod went with its Job"
    );
    let held = w
        .api("b")
        .get(&jobs(), NS, &job.name)
        .expect("held by the collector");
    assert!(held["metadata"]["deletionTimestamp"].is_string(), "{held}");
    assert_eq!(
        held["metadata"]["finalizers"],
        json!(["foregroundDeletion"]),
        "foreground"
    );
    assert_eq!(w.api("b").list(&pods()).len(), 1);
    w.api("b").hold_deletions(false);
    assert!(job_names(w.api("b")).is_empty() && w.api("b").list(&pods()).is_empty());

    for d in ["a", "b"] {
        w.cached(d, &job.name, false).await?;
    }
    let again = w.engine.terminate(&job).await;
    assert_eq!(again.absent, vec!["a", "b"], "{again:?}");
    let v = w.engine.status(&job, &Redactor::default()).await;
    assert_eq!(v.phase, Phase::Error);
    assert!(v.message.contains("does not exist"), "{}", v.message);
    Ok(())
}

#[tokio::test]
async fn gc_keeps_the_newest_jobs_of_a_run_per_metric_or_overall() -> Result<()> {
    let w = World::start("").await?;
    let (mine, other_run) = (run(2), run(3));
    let config = block(json!({"destination": "a"}))?;
    let mut names = Vec::new();
    // Created oldest first: `other.1`, then `m.1` … `m.4`; and one Job of another run.
    for (metric, n) in [("other", 1), ("m", 1), ("m", 2), ("m", 3), ("m", 4)] {
        let job = w
            .engine
            .ensure(&request(&mine, metric, n, config.clone()))
            .await?
            .job;
        names.push(job.name);
    }
    let foreign = w
        .engine
        .ensure(&request(&other_run, "m", 1, config.clone()))
        .await?
        .job;
    for n in names.iter().chain([&foreign.name]) {
        w.cached("a", n, true).await?;
    }
    let at = |name: &String| ("a".to_string(), format!("{NS}/{name}"));

    let placements = foreign.placements.clone();
    let report = w.engine.gc(&mine.uid, Some("m"), &placements, 2).await;
    assert_eq!(
        report.deleted,
        vec![at(&names[1]), at(&names[2])],
        "{report:?}"
    );
    assert!(report.failed.is_empty(), "{report:?}");
    for n in &names[1..3] {
        w.cached("a", n, false).await?;
    }
    let nothing = w.engine.gc(&mine.uid, Some("m"), &placements, 2).await;
    assert!(nothing.deleted.is_empty(), "{nothing:?}");

    let overall = w.engine.gc_everywhere(&mine.uid, None, 1).await;
    assert_eq!(
        overall.deleted,
        vec![at(&names[0]), at(&names[3])],
        "{overall:?}"
    );
    let mut left = vec![names[4].clone(), foreign.name.clone()];
    left.sort();
    assert_eq!(
        job_names(w.api("a")),
        left,
        "the newest Job and the other run's"
    );
    Ok(())
}

#[tokio::test]
async fn gc_touches_only_the_placements_it_is_given() -> Result<()> {
    let w = World::start("").await?;
    let mine = run(6);
    // Two measurements on a and b, then the block moved to a only.
    let both = block(json!({"destination": "a,b"}))?;
    let mut names = Vec::new();
    for n in 1..=2 {
        let job = w
            .engine
            .ensure(&request(&mine, "m", n, both.clone()))
            .await?
            .job;
        for d in ["a", "b"] {
            w.cached(d, &job.name, true).await?;
        }
        names.push(job.name);
    }
    let on_a = w
        .engine
        .locate(&request(&mine, "m", 3, block(json!({"destination": "a"}))?))
        .await?;
    let before_b = w.api("b").requests().len();
    let report = w.engine.gc(&mine.uid, Some("m"), &on_a.placements, 1).await;
    assert_eq!(
        report.deleted,
        vec![("a".to_string(), format!("{NS}/{}", names[0]))],
        "{report:?}"
    );
    assert_eq!(
        job_names(w.api("b")).len(),
        2,
        "b is not a placement: untouched"
    );
    let on_b: Vec<_> = w.api("b").requests()[before_b..]
        .iter()
        .filter(|r| r.method != "GET")
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(on_b.is_empty(), "no write on b: {on_b:?}");
    // A namespace that is not the placement's is not touched either.
    let elsewhere = [dispatch_server::engine::Placement {
        destination: "b".into(),
        namespace: "other-namespace".into(),
    }];
    let report = w.engine.gc(&mine.uid, Some("m"), &elsewhere, 0).await;
    assert!(report.deleted.is_empty(), "{report:?}");
    assert_eq!(job_names(w.api("b")).len(), 2);
    Ok(())
}

// Each run of a page is parsed whole: pages of 500 grew each server replica by 28 MiB in
// `make soak`, pages of 50 by 3 MiB.
const _: () = assert!(
    RUNS_PAGE <= 100,
    "the sweep's pages of AnalysisRuns are too long"
);

#[tokio::test]
async fn the_sweep_reads_the_runs_page_by_page() -> Result<()> {
    let w = World::start("").await?;
    // More runs than two pages; the one with a Job sorts last, so it is only on the last page.
    let pages = 2 * RUNS_PAGE as usize + 1;
    let runs: Vec<_> = (0..pages as u32).map(|i| run(1000 + i)).collect();
    for r in &runs {
        analysis_run(&w.clusters.cp, PROJECT, &r.name, &r.uid);
    }
    let config = block(json!({"destination": "a"}))?;
    let last = runs.last().expect("runs");
    let kept = w
        .engine
        .ensure(&request(last, "m", 1, config.clone()))
        .await?
        .job;
    let orphan = w
        .engine
        .ensure(&request(&run(7), "m", 1, config))
        .await?
        .job;
    w.cached("a", &kept.name, true).await?;
    w.cached("a", &orphan.name, true).await?;

    let report = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    let want = vec![("a".to_string(), format!("{NS}/{}", orphan.name), DeletedRun)];
    assert_eq!(report.deleted, want, "{report:?}");
    assert_eq!(job_names(w.api("a")), vec![kept.name.clone()]);
    // One request per page, none longer than a page: what bounds the sweep's memory.
    let lists: Vec<_> = w
        .clusters
        .cp
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/analysisruns") && !r.is_watch())
        .collect();
    assert_eq!(lists.len(), 3, "{lists:?}");
    for r in &lists {
        assert!(r.query.contains(&format!("limit={RUNS_PAGE}")), "{r:?}");
    }
    Ok(())
}

/// Two runs' Jobs on `destination`: one whose AnalysisRun is on the control plane (kept), one
/// whose run is not (the orphan), after the two runs (live, gone).
async fn kept_and_orphan(
    w: &World,
    destination: &str,
) -> Result<(RunContext, RunContext, JobRef, JobRef)> {
    let (live, gone) = (run(4), run(5));
    analysis_run(&w.clusters.cp, PROJECT, &live.name, &live.uid);
    let config = block(json!({ "destination": destination }))?;
    let kept = w
        .engine
        .ensure(&request(&live, "m", 1, config.clone()))
        .await?
        .job;
    let orphan = w.engine.ensure(&request(&gone, "m", 1, config)).await?.job;
    Ok((live, gone, kept, orphan))
}

#[tokio::test]
async fn the_orphan_sweep_deletes_jobs_whose_analysis_run_is_gone() -> Result<()> {
    let w = World::start("").await?;
    let (_, gone, kept, orphan) = kept_and_orphan(&w, "a,b").await?;
    // Not ours: never touched, whatever its name.
    foreign_job(
        w.api("a"),
        "someone-elses",
        json!({LABEL_RUN_UID: gone.uid}),
    );
    // Our labels, of a run that never existed here, but not our mark: another control plane's
    // server (or a person) made it, and its run is not on our control plane: never swept.
    let stray = job::job_name("ghost", "m", 1);
    foreign_job(
        w.api("b"),
        &stray,
        json!({LABEL_MANAGED: "true", LABEL_RUN_UID: "ghost"}),
    );
    for d in ["a", "b"] {
        w.cached(d, &kept.name, true).await?;
        w.cached(d, &orphan.name, true).await?;
    }
    w.cached("b", &stray, true).await?;

    let report = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let at = |d: &str, name: &str| (d.to_string(), format!("{NS}/{name}"), DeletedRun);
    let want = vec![at("a", &orphan.name), at("b", &orphan.name)];
    assert_eq!(deleted, want, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    let mut on_a = vec![kept.name.clone(), "someone-elses".to_string()];
    on_a.sort();
    assert_eq!(job_names(w.api("a")), on_a);
    let mut on_b = vec![kept.name.clone(), stray.clone()];
    on_b.sort();
    assert_eq!(job_names(w.api("b")), on_b);
    assert_eq!(
        w.clusters
            .cp
            .calls("GET", "/apis/argoproj.io/v1alpha1/analysisruns"),
        1
    );

    for d in ["a", "b"] {
        w.cached(d, &orphan.name, false).await?;
    }
    let quiet = w.engine.sweep_orphans().await.map_err(anyhow::Error::msg)?;
    assert!(quiet.deleted.is_empty(), "{quiet:?}");

    // Without list on analysisruns the sweep deletes nothing and says what it needs.
    w.clusters.cp.fail("GET", "/analysisruns", 403, 1);
    let e = w.engine.sweep_orphans().await.unwrap_err();
    assert!(
        matches!(e, dispatch_server::engine::CleanupError::ListRuns(_)),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("needs list on analysisruns.argoproj.io"),
        "{e}"
    );
    assert_eq!(job_names(w.api("b")), on_b);
    Ok(())
}

/// An AnalysisRun object as the runs' watch delivers it.
fn watched(r: &RunContext, status: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": r.name, "namespace": r.namespace, "uid": r.uid},
        "spec": {"metrics": []},
        "status": status
    }))
    .expect("an AnalysisRun")
}

#[tokio::test]
async fn the_sweep_reads_the_runs_from_the_watch_and_lists_only_for_a_run_it_does_not_hold(
) -> Result<()> {
    let w = World::start("").await?;
    let lists = || {
        w.clusters
            .cp
            .calls("GET", "/apis/argoproj.io/v1alpha1/analysisruns")
    };
    let (live, _, kept, orphan) = kept_and_orphan(&w, "a").await?;
    let runs = Runs::default();
    runs.apply(Event::Init);
    runs.apply(Event::InitApply(watched(
        &live,
        json!({"phase": "Running"}),
    )));
    runs.apply(Event::InitDone);
    w.cached("a", &kept.name, true).await?;
    w.cached("a", &orphan.name, true).await?;

    // A Job whose run the watch does not hold: only a list may call it an orphan (the run may
    // be a moment too new for this replica's watch).
    let report = w.engine.sweep_orphans_with(Some(&runs)).await?;
    let want = vec![("a".to_string(), format!("{NS}/{}", orphan.name), DeletedRun)];
    assert_eq!(report.deleted, want, "{report:?}");
    assert_eq!(lists(), 1);

    // Every Job's run held: no request to the control plane, nothing deleted. A Job with our
    // labels but not our mark (another control plane's server shares the destination) has its
    // run elsewhere: the sweep never judges it, so it needs no list either.
    w.cached("a", &orphan.name, false).await?;
    let stray = job::job_name("ghost", "m", 1);
    foreign_job(
        w.api("a"),
        &stray,
        json!({LABEL_MANAGED: "true", LABEL_RUN_UID: "ghost"}),
    );
    w.cached("a", &stray, true).await?;
    let quiet = w.engine.sweep_orphans_with(Some(&runs)).await?;
    assert!(quiet.deleted.is_empty(), "{quiet:?}");
    assert_eq!(lists(), 1);

    // The watch says the run completed: its Job, still running, goes; still no list.
    let long_ago = json!({"phase": "Successful", "completedAt": "2020-01-01T00:00:00Z"});
    runs.apply(Event::Apply(watched(&live, long_ago)));
    let retained = w.engine.sweep_orphans_with(Some(&runs)).await?;
    let want = vec![("a".to_string(), format!("{NS}/{}", kept.name), RunCompleted)];
    assert_eq!(retained.deleted, want, "{retained:?}");
    assert_eq!(lists(), 1);

    // While the watch lists again (after a 410), it is not authoritative: the sweep lists.
    runs.apply(Event::Init);
    w.engine.sweep_orphans_with(Some(&runs)).await?;
    assert_eq!(lists(), 2);
    Ok(())
}
