//! The runs' watch: confirmation, refusals, relists and stalls, against scripted events.

use super::*;
use crate::watch::script::{after, error_event, Beat, Logs, Script};
use crate::watch::{EXPIRED_LOG, STALL, STALLED_LOG};
use serde_json::json;

fn run(ns: &str, name: &str, uid: &str, metrics: serde_json::Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"metrics": metrics}
    }))
    .unwrap()
}

fn ours(name: &str) -> serde_json::Value {
    json!({"name": name, "provider": {"plugin": {PLUGIN_NAME: {"destination": "a"}}}})
}

fn synced(objects: Vec<DynamicObject>) -> Runs {
    let runs = Runs::default();
    runs.apply(Event::Init);
    for o in objects {
        runs.apply(Event::InitApply(o));
    }
    runs.apply(Event::InitDone);
    runs
}

#[test]
fn only_a_real_run_with_our_metric_is_confirmed() {
    let runs = synced(vec![run(
        "team-a",
        "uat.1",
        "uid-1",
        json!([ours("smoke"), {"name": "builtin", "provider": {"job": {}}}]),
    )]);
    assert_eq!(runs.check("team-a", "uat.1", "uid-1", "smoke"), Ok(()));
    assert!(matches!(
        runs.check("team-a", "uat.1", "uid-2", "smoke"),
        Err(RunError::OtherUid { .. })
    ));
    assert!(matches!(
        runs.check("team-b", "uat.1", "uid-1", "smoke"),
        Err(RunError::NoSuchRun { .. })
    ));
    let e = runs
        .check("team-a", "uat.1", "uid-1", "builtin")
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("no metric \"builtin\" whose provider is the rollouts-dispatch/job plugin"),
        "{e}"
    );
}

#[test]
fn a_runs_namespace_is_known_by_its_uid_through_recreation_delete_and_relist() {
    let runs = synced(vec![run(
        "team-a",
        "uat.1",
        "uid-1",
        json!([ours("smoke")]),
    )]);
    assert!(runs.is_run_in("team-a", "uid-1"));
    assert!(
        !runs.is_run_in("team-b", "uid-1"),
        "a uid is in one namespace"
    );
    runs.apply(Event::Apply(run("team-a", "uat.1", "uid-2", json!([]))));
    assert!(!runs.is_run_in("team-a", "uid-1") && runs.is_run_in("team-a", "uid-2"));
    runs.apply(Event::Delete(run("team-a", "uat.1", "uid-2", json!([]))));
    assert!(!runs.is_run_in("team-a", "uid-2"));
    runs.apply(Event::Init);
    runs.apply(Event::InitApply(run("team-b", "x", "uid-3", json!([]))));
    runs.apply(Event::InitDone);
    assert!(runs.is_run_in("team-b", "uid-3"));
}

#[test]
fn nothing_is_confirmed_before_the_first_list_and_a_relist_replaces_everything() {
    let runs = Runs::default();
    let e = runs.check("ns", "r", "u", "m").unwrap_err();
    assert!(matches!(e, RunError::NotSynced { .. }), "{e}");
    runs.set_problem("analysisruns.argoproj.io is forbidden".into());
    let e = runs.check("ns", "r", "u", "m").unwrap_err().to_string();
    assert!(
        e.contains("not synced: analysisruns.argoproj.io is forbidden"),
        "{e}"
    );
    assert!(e.contains("`confirmRuns: false`"), "{e}");
    assert_eq!(
        runs.problem().as_deref(),
        Some("analysisruns.argoproj.io is forbidden")
    );

    let runs = synced(vec![run("ns", "old", "u0", json!([ours("m")]))]);
    runs.apply(Event::Apply(run("ns", "r", "u", json!([ours("m")]))));
    assert_eq!(runs.check("ns", "r", "u", "m"), Ok(()));
    runs.apply(Event::Init);
    runs.apply(Event::InitApply(run("ns", "r", "u", json!([ours("m")]))));
    // Until the re-list is done, the old view answers.
    assert_eq!(runs.check("ns", "old", "u0", "m"), Ok(()));
    runs.apply(Event::InitDone);
    assert!(
        runs.check("ns", "old", "u0", "m").is_err(),
        "deleted while the watch was down"
    );
    runs.apply(Event::Delete(run("ns", "r", "u", json!([]))));
    assert!(matches!(
        runs.check("ns", "r", "u", "m"),
        Err(RunError::NoSuchRun { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_watch_is_relisted_and_refuses_nothing_meanwhile() {
    let (logs, _guard) = Logs::capture();
    let script: Script<DynamicObject> = Script::default();
    let old = run("ns", "old", "u0", json!([ours("m")]));
    script
        .list(vec![old.clone()], "1")
        .watch(vec![Beat::Hang])
        // The relist takes 10 s to answer; it has the run created while the watch stalled.
        .list_after(
            Duration::from_secs(10),
            vec![old, run("ns", "new", "u1", json!([ours("m")]))],
            "5",
        )
        .watch(vec![Beat::Hang]);
    let runs = Runs::watch_from(script.clone(), None);
    assert!(runs.wait_synced(Duration::from_secs(1)).await);
    assert!(runs.is_authoritative());

    // Within the bound a silent watch is a quiet one: what it lacks does not exist.
    tokio::time::sleep(STALL - Duration::from_secs(2)).await;
    assert_eq!(script.lists(), 1);
    assert!(matches!(
        runs.check("ns", "new", "u1", "m"),
        Err(RunError::NoSuchRun { .. })
    ));

    // Past it the watch is dropped and lists again; until that list ends, no refusal.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(script.lists(), 2);
    assert!(!runs.is_authoritative());
    let e = runs.check("ns", "new", "u1", "m").unwrap_err();
    assert!(matches!(e, RunError::NotSynced { .. }), "{e}");
    assert!(e.to_string().contains("not synced: stalled: "), "{e}");
    assert!(matches!(
        runs.check("ns", "old", "u9", "m"),
        Err(RunError::NotSynced { .. })
    ));
    assert_eq!(runs.check("ns", "old", "u0", "m"), Ok(()), "still true");

    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(runs.is_authoritative() && runs.problem().is_none());
    assert_eq!(runs.check("ns", "new", "u1", "m"), Ok(()));
    assert!(matches!(
        runs.check("ns", "old", "u9", "m"),
        Err(RunError::OtherUid { .. })
    ));

    let lines = logs.lines();
    assert_eq!(lines.len(), 1, "the stall's line only: {lines:?}");
    for part in [
        " WARN ",
        STALLED_LOG,
        "destination=control-plane",
        "resource=analysisruns",
        "namespace=*",
    ] {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_410_relists_with_one_info_line() {
    let (logs, _guard) = Logs::capture();
    let script: Script<DynamicObject> = Script::default();
    script
        .list(vec![], "1")
        .watch(vec![
            after(
                Duration::from_secs(5),
                error_event(410, "too old resource version"),
            ),
            Beat::End,
        ])
        .list(vec![run("ns", "new", "u1", json!([ours("m")]))], "9")
        .watch(vec![Beat::Hang]);
    let runs = Runs::watch_from(script.clone(), None);
    assert!(runs.wait_synced(Duration::from_secs(1)).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(script.lists(), 2);
    assert_eq!(runs.check("ns", "new", "u1", "m"), Ok(()));

    let lines = logs.lines();
    assert_eq!(lines.len(), 1, "the 410's line only: {lines:?}");
    for part in [
        " INFO ",
        EXPIRED_LOG,
        "destination=control-plane",
        "resource=analysisruns",
    ] {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
}

#[tokio::test]
async fn confirm_waits_for_a_run_the_watch_has_not_delivered_yet() {
    let runs = synced(vec![]);
    let feed = runs.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        feed.apply(Event::Apply(run("ns", "new", "u", json!([ours("m")]))));
    });
    assert_eq!(
        runs.confirm("ns", "new", "u", "m", Duration::from_secs(5))
            .await,
        Ok(())
    );
    let started = tokio::time::Instant::now();
    let e = runs
        .confirm("ns", "never", "u", "m", Duration::from_millis(100))
        .await;
    assert!(matches!(e, Err(RunError::NoSuchRun { .. })));
    assert!(started.elapsed() >= Duration::from_millis(100));
}

/// The watch holds one hash-map bucket per run the control plane keeps (Kargo keeps them until
/// the Freight goes), summary or not: the summary is boxed so that a run without one costs a
/// pointer, not 192 bytes. `make soak`'s replicas grew 2 MiB in one step when the map of 3 584
/// runs (then about 310 bytes a bucket) doubled.
#[test]
fn a_run_without_a_summary_stays_small() {
    let bucket = std::mem::size_of::<((String, String), RunFacts)>();
    assert!(bucket <= 160, "{bucket} bytes per run");
}
