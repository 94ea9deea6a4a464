//! The live read before a refusal (and before the first list), against a scripted API (a
//! closure): found, absent, and no answer (paused time).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::FutureExt;
use kube::api::DynamicObject;
use kube::runtime::watcher::Event;
use serde_json::json;

use super::Reader;
use crate::runs::{RunError, Runs, CONFIRM_WAIT, PLUGIN_NAME};

fn run(uid: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": "r", "namespace": "ns", "uid": uid},
        "spec": {"metrics": [{"name": "m", "provider": {"plugin": {PLUGIN_NAME: {}}}}]}
    }))
    .unwrap()
}

/// Runs whose watch listed nothing (synced, silent), reading through `reader`.
fn silent_watch(reader: Option<Reader>) -> Runs {
    let runs = Runs::with_reader(reader);
    runs.apply(Event::Init);
    runs.apply(Event::InitDone);
    runs
}

#[tokio::test(start_paused = true)]
async fn a_run_the_watch_missed_is_read_and_confirmed_not_refused() {
    let reads = Arc::new(AtomicUsize::new(0));
    let counted = reads.clone();
    let reader = Reader::with(move |_, _| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok(Some(run("u-1"))) }.boxed()
    });
    let runs = silent_watch(Some(reader));
    runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT)
        .await
        .expect("the run the API server has is confirmed");
    // The cache took it: the next request needs no read.
    runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT)
        .await
        .unwrap();
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    // Without the read, the silent watch refuses a real run (an `Error` measurement).
    let blind = silent_watch(None);
    assert!(matches!(
        blind.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await,
        Err(RunError::NoSuchRun { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn what_the_api_server_does_not_have_is_still_refused() {
    let runs = silent_watch(Some(Reader::with(|_, _| async { Ok(None) }.boxed())));
    assert!(matches!(
        runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await,
        Err(RunError::NoSuchRun { .. })
    ));
    let other = silent_watch(Some(Reader::with(|_, _| {
        async { Ok(Some(run("u-2"))) }.boxed()
    })));
    assert!(matches!(
        other.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await,
        Err(RunError::OtherUid { .. })
    ));
    assert_eq!(runs.control_plane_unanswered_since(), None);
}

#[tokio::test(start_paused = true)]
async fn no_answer_is_a_retry_and_marks_the_control_plane_unanswered_until_heard() {
    let runs = silent_watch(Some(Reader::with(|_, _| {
        futures::future::pending::<Result<Option<DynamicObject>, kube::Error>>().boxed()
    })));
    let verdict = runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await;
    match verdict {
        Err(RunError::NotSynced { problem, .. }) => {
            assert!(problem.contains("did not answer"), "{problem}")
        }
        other => panic!("want NotSynced, got {other:?}"),
    }
    assert!(runs.control_plane_unanswered_since().is_some());
    // The watch's next event is an answer.
    runs.apply(Event::Apply(run("u-3")));
    assert_eq!(runs.control_plane_unanswered_since(), None);
}

/// A reader whose control plane answers every read slowly (under the bound), "no such run".
fn slow_reader() -> Reader {
    Reader::with(|_, _| {
        async {
            tokio::time::sleep(super::READ_TIMEOUT - std::time::Duration::from_millis(1)).await;
            Ok(None)
        }
        .boxed()
    })
}

#[tokio::test(start_paused = true)]
async fn reads_waiting_for_a_slot_do_not_make_the_control_plane_unanswered() {
    use super::READS_AT_ONCE;
    // Every slot is taken by slow reads; on a listed watch (before a refusal) and on one that
    // has not listed (a caller can ask about runs before the first list, too).
    for (scene, runs) in [
        ("listed", silent_watch(Some(slow_reader()))),
        ("unlisted", unlisted_watch(slow_reader())),
    ] {
        let asked: Vec<_> = (0..READS_AT_ONCE * 3)
            .map(|_| runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT))
            .collect();
        let verdicts = futures::future::join_all(asked).await;
        if scene == "listed" {
            assert!(verdicts.iter().any(|v| matches!(v, Err(RunError::NotSynced { problem, .. }) if problem.contains("already under way"))));
        }
        assert!(
            verdicts.iter().all(|v| matches!(
                v,
                Err(RunError::NoSuchRun { .. } | RunError::NotSynced { .. })
            )),
            "{scene}: {verdicts:?}"
        );
        // Busy slots are no silence of the control plane: the replica stays ready.
        assert_eq!(runs.control_plane_unanswered_since(), None, "{scene}");
    }
}

#[tokio::test(start_paused = true)]
async fn pages_of_old_runs_read_in_slots_of_their_own() {
    let reader = Reader::with(|_, name| {
        if name == "slow" {
            futures::future::pending().boxed()
        } else {
            async { Ok(Some(run("u-1"))) }.boxed()
        }
    });
    let pages = reader.beside(super::PAGE_READS_AT_ONCE);
    // Viewers opening old runs' pages hold every page slot, the control plane slow to answer.
    let held: Vec<_> = (0..super::PAGE_READS_AT_ONCE)
        .map(|_| {
            let pages = pages.clone();
            tokio::spawn(async move { pages.read("ns", "slow").await })
        })
        .collect();
    tokio::task::yield_now().await;
    assert_eq!(pages.permits.available_permits(), 0);
    // The read that confirms a run is not kept waiting behind them.
    assert_eq!(reader.permits.available_permits(), super::READS_AT_ONCE);
    let confirmed = reader.read("ns", "r").await.expect("answered");
    assert!(confirmed.is_some());
    // The page reads end unanswered, for both readers: it is one control plane.
    for h in held {
        assert!(matches!(
            h.await.unwrap(),
            Err(super::ReadError::Unanswered { cause: None })
        ));
    }
    assert!(reader.unanswered_since().is_some());
}

/// Runs whose watch has not listed yet (the control plane did not answer it), reading through
/// `reader`.
fn unlisted_watch(reader: Reader) -> Runs {
    Runs::with_reader(Some(reader))
}

#[tokio::test(start_paused = true)]
async fn before_the_first_list_a_read_confirms_and_no_answer_marks_the_control_plane_unanswered() {
    // No answer: still a retry, now saying why, and the replica goes unready (`serve`): a
    // replica cut from its control plane as it started stayed ready and took the agents' polls.
    let silent = unlisted_watch(Reader::with(|_, _| {
        futures::future::pending::<Result<Option<DynamicObject>, kube::Error>>().boxed()
    }));
    match silent.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await {
        Err(RunError::NotSynced { problem, .. }) => {
            assert!(problem.contains("did not answer"), "{problem}")
        }
        other => panic!("want NotSynced, got {other:?}"),
    }
    assert!(silent.control_plane_unanswered_since().is_some());

    // The run the API server has is confirmed by the read.
    let found = unlisted_watch(Reader::with(|_, _| async { Ok(Some(run("u-1"))) }.boxed()));
    found
        .confirm("ns", "r", "u-1", "m", CONFIRM_WAIT)
        .await
        .expect("confirmed by the read");
    // Refusals wait for the list: absent, or held with another uid, is a retry.
    for answer in [None, Some(run("u-2"))] {
        let runs = unlisted_watch(Reader::with(move |_, _| {
            let answer = answer.clone();
            async move { Ok(answer) }.boxed()
        }));
        assert!(matches!(
            runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await,
            Err(RunError::NotSynced { .. })
        ));
        assert_eq!(runs.control_plane_unanswered_since(), None);
    }
}

#[tokio::test(start_paused = true)]
async fn a_connection_that_fails_before_an_answer_is_no_answer() {
    // The client gives up first: its connect timeout (`engine.connectTimeout`, 5 s, as the
    // read's bound) or a refused connection. That is not the API server speaking: a replica
    // cut from its control plane that counted it as an answer stayed ready (`make faults`).
    let connect_failed = || {
        Reader::with(|_, _| {
            let e = std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out");
            async move { Err(kube::Error::Service(Box::new(e))) }.boxed()
        })
    };
    for (scene, runs) in [
        ("listed", silent_watch(Some(connect_failed()))),
        ("unlisted", unlisted_watch(connect_failed())),
    ] {
        match runs.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await {
            Err(RunError::NotSynced { problem, .. }) => assert!(
                problem.contains("did not answer") && problem.contains("connect timed out"),
                "{scene}: {problem}"
            ),
            other => panic!("{scene}: want NotSynced, got {other:?}"),
        }
        assert!(runs.control_plane_unanswered_since().is_some(), "{scene}");
    }
    // An error the API server answers (a 403, say) is an answer: the replica stays ready.
    let forbidden = silent_watch(Some(Reader::with(|_, _| {
        let status = kube::core::Status::failure("analysisruns is forbidden", "Forbidden")
            .with_code(403)
            .boxed();
        async move { Err(kube::Error::Api(status)) }.boxed()
    })));
    let verdict = forbidden.confirm("ns", "r", "u-1", "m", CONFIRM_WAIT).await;
    assert!(
        matches!(verdict, Err(RunError::NotSynced { .. })),
        "{verdict:?}"
    );
    assert_eq!(forbidden.control_plane_unanswered_since(), None);
}
