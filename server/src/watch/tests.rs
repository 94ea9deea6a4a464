//! The watch against a scripted API, in paused time: a stall and a 410 each end in a relist
//! with one line, a quiet watch kept alive by BOOKMARKs is left alone, 410s in a row back off.

use k8s_openapi::api::core::v1::ConfigMap;

use super::script::{after, bookmark, error_event, object, Beat, Logs, Script};
use super::*;

fn watched() -> Watched {
    Watched {
        destination: "edge".into(),
        resource: "configmaps".into(),
        namespace: None,
    }
}

fn cm(name: &str, version: &str) -> ConfigMap {
    object("ns", name, version, "g")
}

fn show(item: &Result<Event<ConfigMap>, WatchError>) -> String {
    let name = |o: &ConfigMap| o.metadata.name.clone().unwrap_or_default();
    match item {
        Ok(Event::Init) => "Init".into(),
        Ok(Event::InitApply(o)) => format!("InitApply {}", name(o)),
        Ok(Event::InitDone) => "InitDone".into(),
        Ok(Event::Apply(o)) => format!("Apply {}", name(o)),
        Ok(Event::Delete(o)) => format!("Delete {}", name(o)),
        Err(e) => format!("Err {e}"),
    }
}

/// The next `n` items, shown; each must come within an hour (of paused time).
async fn take(
    stream: &mut BoxStream<'static, Result<Event<ConfigMap>, WatchError>>,
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let item = tokio::time::timeout(Duration::from_secs(3600), stream.next())
            .await
            .unwrap_or_else(|_| panic!("nothing for an hour after {out:?}"))
            .expect("the watch never ends");
        out.push(show(&item));
    }
    out
}

/// Polls for a second, expecting nothing (the watch makes its next request meanwhile).
async fn settle(stream: &mut BoxStream<'static, Result<Event<ConfigMap>, WatchError>>) {
    let next = tokio::time::timeout(Duration::from_secs(1), stream.next()).await;
    assert!(next.is_err(), "{:?}", next.map(|i| i.map(|i| show(&i))));
}

fn calls(script: &Script) -> Vec<String> {
    script.calls().into_iter().map(|(_, c)| c).collect()
}

#[test]
fn a_healthy_watch_never_reaches_the_stall_bound() {
    // Ended by the API server after `timeoutSeconds` even without BOOKMARKs, with time to spare.
    let timeout = Duration::from_secs(WATCH_TIMEOUT_SECS.into());
    assert!(timeout + Duration::from_secs(15) < STALL);
    // Three BOOKMARK periods (one minute, k8s.io/apiserver cacher.go:76-78) fit in the bound.
    assert!(STALL >= Duration::from_secs(3 * 60));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_watch_is_dropped_and_relisted_with_one_warning() {
    let (logs, _guard) = Logs::capture();
    let script = Script::default();
    script
        .list(vec![cm("a", "1")], "1")
        .watch(vec![
            after(Duration::from_secs(10), WatchEvent::Modified(cm("a", "2"))),
            Beat::Hang,
        ])
        .list(vec![cm("a", "2"), cm("b", "3")], "3")
        .watch(vec![Beat::Hang]);
    let start = Instant::now();
    let mut stream = watch(script.clone(), Some("app=x"), watched());
    assert_eq!(
        take(&mut stream, 4).await,
        ["Init", "InitApply a", "InitDone", "Apply a"]
    );
    let stalled = take(&mut stream, 1).await;
    assert_eq!(
        stalled,
        ["Err stalled: nothing from the API server for 180s during the watch; relisting"]
    );
    assert_eq!(start.elapsed(), Duration::from_secs(10) + STALL);
    assert_eq!(
        take(&mut stream, 4).await,
        ["Init", "InitApply a", "InitApply b", "InitDone"]
    );
    assert!(
        start.elapsed() < Duration::from_secs(11) + STALL,
        "relisted after one short backoff"
    );
    settle(&mut stream).await;
    assert_eq!(calls(&script), ["list", "watch 1", "list", "watch 3"]);

    let lines = logs.lines();
    let warned: Vec<&String> = lines.iter().filter(|l| l.contains(STALLED_LOG)).collect();
    assert_eq!(warned.len(), 1, "{lines:?}");
    for part in [
        " WARN ",
        "destination=edge",
        "resource=configmaps",
        "namespace=*",
        "step=watch",
        "silent_for=180s",
    ] {
        assert!(warned[0].contains(part), "{part} in {}", warned[0]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_list_or_a_watch_request_without_answer_is_a_stall_too() {
    let script = Script::default();
    script
        .hang_list()
        .list(vec![cm("a", "1")], "1")
        .watch(vec![Beat::End]);
    let mut stream = watch(script.clone(), None, watched());
    assert_eq!(
        take(&mut stream, 4).await,
        [
            "Err stalled: nothing from the API server for 180s during the list; relisting",
            "Init",
            "InitApply a",
            "InitDone"
        ]
    );
    // The first watch ends at once; the second request gets no answer.
    assert_eq!(
        take(&mut stream, 1).await,
        ["Err stalled: nothing from the API server for 180s during the watch request; relisting"]
    );
    assert_eq!(calls(&script), ["list", "list", "watch 1", "watch 1"]);
}

#[tokio::test(start_paused = true)]
async fn bookmarks_keep_a_quiet_watch_alive_and_its_version_recent() {
    let script = Script::default();
    let minute = Duration::from_secs(60);
    let close = |bookmarks: [&str; 3]| {
        vec![
            after(minute, bookmark(bookmarks[0])),
            after(minute, bookmark(bookmarks[1])),
            // the last one just before `timeoutSeconds` (cache_watcher.go:261-263), then the end
            after(Duration::from_secs(28), bookmark(bookmarks[2])),
            Beat::End,
        ]
    };
    script
        .list(vec![cm("a", "1")], "1")
        .watch(close(["2", "3", "4"]))
        .watch(close(["5", "6", "7"]))
        .watch(vec![Beat::Hang]);
    let mut stream = watch(script.clone(), None, watched());
    assert_eq!(
        take(&mut stream, 3).await,
        ["Init", "InitApply a", "InitDone"]
    );
    // 400 s: two whole watches of 148 s, and 104 s of the third (a stall is 180 s).
    let quiet = tokio::time::timeout(Duration::from_secs(400), stream.next()).await;
    assert!(
        quiet.is_err(),
        "nothing to yield: {:?}",
        quiet.map(|i| i.map(|i| show(&i)))
    );
    assert_eq!(calls(&script), ["list", "watch 1", "watch 4", "watch 7"]);
}

#[tokio::test(start_paused = true)]
async fn a_410_event_relists_after_a_backoff_with_one_info_line() {
    let (logs, _guard) = Logs::capture();
    let script = Script::default();
    script
        .list(vec![cm("a", "1")], "1")
        .watch(vec![
            after(
                Duration::from_secs(5),
                error_event(410, "too old resource version: 1 (7)"),
            ),
            Beat::End,
        ])
        .list(vec![cm("a", "1"), cm("b", "8")], "9")
        .watch(vec![Beat::Hang]);
    let mut stream = watch(script.clone(), None, watched());
    assert_eq!(
        take(&mut stream, 4).await,
        [
            "Init",
            "InitApply a",
            "InitDone",
            "Err resourceVersion expired (410 Gone) during the watch: too old resource version: 1 (7); relisting"
        ]
    );
    assert_eq!(
        take(&mut stream, 4).await,
        ["Init", "InitApply a", "InitApply b", "InitDone"]
    );
    let when = script.calls();
    let gap = when[2].0 - when[1].0 - Duration::from_secs(5);
    assert!(
        gap >= Duration::from_millis(600) && gap <= Duration::from_millis(1000),
        "{gap:?}"
    );
    settle(&mut stream).await;
    assert_eq!(calls(&script), ["list", "watch 1", "list", "watch 9"]);

    let lines = logs.lines();
    assert_eq!(lines.len(), 1, "one line, and nothing else: {lines:?}");
    for part in [
        " INFO ",
        EXPIRED_LOG,
        "destination=edge",
        "resource=configmaps",
        "step=watch",
        "reason=too old resource version: 1 (7)",
    ] {
        assert!(lines[0].contains(part), "{part} in {}", lines[0]);
    }
}

#[tokio::test(start_paused = true)]
async fn a_410_answer_to_the_watch_request_relists() {
    // kube-runtime's watcher would ask again from the same resourceVersion for ever.
    let script = Script::default();
    script
        .list(vec![cm("a", "1")], "1")
        .refuse_watch(410)
        .list(vec![cm("a", "1")], "8")
        .watch(vec![Beat::Hang]);
    let mut stream = watch(script.clone(), None, watched());
    let items = take(&mut stream, 7).await;
    assert_eq!(
        items[3],
        "Err resourceVersion expired (410 Gone) during the watch request: scripted refusal; relisting"
    );
    assert_eq!(items[4..], ["Init", "InitApply a", "InitDone"]);
    settle(&mut stream).await;
    assert_eq!(calls(&script), ["list", "watch 1", "list", "watch 8"]);
}

#[tokio::test(start_paused = true)]
async fn expired_again_and_again_backs_off_instead_of_looping() {
    let script = Script::default();
    for _ in 0..100 {
        script.list(vec![cm("a", "1")], "1").watch(vec![
            after(Duration::ZERO, error_event(410, "gone")),
            Beat::End,
        ]);
    }
    let mut stream = watch(script.clone(), None, watched());
    let end = Instant::now() + Duration::from_secs(300);
    while tokio::time::timeout_at(end, stream.next()).await.is_ok() {}
    let lists: Vec<Instant> = script
        .calls()
        .into_iter()
        .filter(|(_, c)| c == "list")
        .map(|(t, _)| t)
        .collect();
    // 0.8 s doubling to 30 s: about 15 lists in 5 minutes, not one every second.
    assert!((8..=20).contains(&lists.len()), "{} lists", lists.len());
    let last_gap = lists[lists.len() - 1] - lists[lists.len() - 2];
    assert!(last_gap >= Duration::from_secs(22), "{last_gap:?}");
}

#[tokio::test(start_paused = true)]
async fn other_errors_back_off_and_watch_again_from_the_same_version() {
    let script = Script::default();
    script
        .list(vec![cm("a", "1")], "1")
        .refuse_watch(500)
        .watch(vec![
            after(Duration::from_secs(1), error_event(500, "etcd hiccup")),
            Beat::End,
        ])
        .watch(vec![
            after(Duration::from_secs(1), WatchEvent::Deleted(cm("a", "5"))),
            Beat::Hang,
        ]);
    let mut stream = watch(script.clone(), None, watched());
    let items = take(&mut stream, 6).await;
    assert!(
        items[3].starts_with("Err watch request failed: "),
        "{}",
        items[3]
    );
    assert_eq!(
        items[4],
        "Err the API server ended the watch: etcd hiccup (500)"
    );
    assert_eq!(items[5], "Delete a");
    assert_eq!(calls(&script), ["list", "watch 1", "watch 1", "watch 1"]);
    assert_eq!(script.lists(), 1);
}
