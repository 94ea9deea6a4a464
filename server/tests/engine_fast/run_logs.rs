//! The log API (`RunLogs::of_run`) on a fake destination: a run named
//! without its uid is found in the watch of AnalysisRuns, its Job in the destination's watch
//! cache, and its whole log arrives in order, labelled, with the values of the Secrets its
//! containers read redacted — or withheld when such a Secret cannot be read.

use std::sync::Arc;

use anyhow::{bail, Result};
use base64::Engine as _;
use dispatch_api::logs::{LogEvent, LogsQuery};
use dispatch_server::app::{Features, Options};
use dispatch_server::http::{DispatchError, RunName};
use dispatch_server::runs::Runs;
use dispatch_server::runtime::metrics::Metrics;
use dispatch_server::signing::Signer;
use futures::StreamExt;
use serde_json::json;

use crate::cluster_side::{pod_for, terminated};
use crate::fake_api::Res;
use crate::world::{block, request, run, runs_with, World, NS, PROJECT};

const PASSWORD: &str = "pa55-w0rd-from-a-secret";

fn dispatcher(w: &World, runs: Option<Runs>) -> Result<Features> {
    let signer = Signer::new(&[b"run-logs-test-key-0123456789abcdef0123".to_vec()])?;
    let options = Options {
        runs,
        ..Options::default()
    };
    Ok(Features::new(
        w.engine.clone(),
        Arc::new(Metrics::new()),
        Arc::new(signer),
        options,
    ))
}

async fn read(d: &Features, n: u32, query: LogsQuery) -> Result<Vec<LogEvent>, DispatchError> {
    let run = RunName {
        namespace: PROJECT.into(),
        name: run(n).name,
    };
    Ok(d.logs.of_run(run, query).await?.collect().await)
}

/// Run `n`'s Job on `a`, whose container `check` reads Secret `db` and whose pod printed
/// `lines` numbered lines (line 7 prints the password) and a sidecar two lines.
async fn job_with_log(w: &World, n: u32, lines: usize) -> Result<String> {
    let spec = json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never",
    "containers": [
        {"name": "check", "image": "example.invalid/check:1",
         "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]},
        {"name": "sidecar", "image": "example.invalid/side:1"}
    ]}}});
    let ensured = w
        .engine
        .ensure(&request(
            &run(n),
            "smoke",
            1,
            block(json!({"destination": "a", "spec": spec}))?,
        ))
        .await?;
    let job = ensured.job.name;
    w.cached("a", &job, true).await?;
    let api = w.api("a");
    let pod = pod_for(api, &job, terminated(1, None), true)?;
    api.update(&Res::new("v1", "pods"), NS, &pod, |p| {
        p["metadata"]["labels"]["job-name"] = json!(job);
        p["spec"] = json!({"containers": [{"name": "check", "image": "x"}, {"name": "sidecar", "image": "x"}]});
    });
    let text: String = (1..=lines)
        .map(|i| {
            let extra = if i == 7 { PASSWORD } else { "" };
            format!("line {i} {extra}\n")
        })
        .collect();
    api.set_log(NS, &pod, "check", &text);
    api.set_log(NS, &pod, "sidecar", "side 1\nside 2\n");
    Ok(pod)
}

/// Every project everywhere, and the Jobs' pods may read Secret `db` (the policy allows no
/// Secret by default).
const READS_DB: &str =
    "policy: {rules: [{projects: ['*'], destinations: ['*'], namespaces: ['*'], secrets: [db]}]}";

fn put_db_secret(w: &World) {
    let b64 = base64::engine::general_purpose::STANDARD.encode(PASSWORD);
    w.api("a").put(
        &Res::new("v1", "secrets"),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "db", "namespace": NS}, "data": {"password": b64}}),
    );
}

#[tokio::test]
async fn the_whole_log_arrives_in_order_labelled_and_redacted() -> Result<()> {
    let w = World::start(READS_DB).await?;
    put_db_secret(&w);
    let pod = job_with_log(&w, 51, 3000).await?;
    let d = dispatcher(&w, Some(runs_with(51)?))?;
    let events = read(&d, 51, LogsQuery::default()).await?;
    let mut check = Vec::new();
    let mut side = Vec::new();
    for e in &events {
        match e {
            LogEvent::Line {
                destination,
                pod: p,
                container,
                text,
            } => {
                assert_eq!((destination.as_str(), p.as_str()), ("a", pod.as_str()));
                assert!(!text.contains(PASSWORD), "leaked: {text}");
                match container.as_str() {
                    "check" => check.push(text.clone()),
                    "sidecar" => side.push(text.clone()),
                    other => bail!("container {other}"),
                }
            }
            LogEvent::Note { text, .. } => bail!("unexpected note: {text}"),
        }
    }
    assert_eq!(check.len(), 3000);
    for (i, line) in check.iter().enumerate() {
        assert!(line.starts_with(&format!("line {} ", i + 1)), "{i}: {line}");
    }
    assert!(
        check[6].contains(dispatch_server::logs::REDACTED),
        "{}",
        check[6]
    );
    assert_eq!(side, ["side 1", "side 2"]);
    // The containers come one after the other: every check line before the sidecar's.
    let first_side = events
        .iter()
        .position(|e| matches!(e, LogEvent::Line { container, .. } if container == "sidecar"));
    assert_eq!(first_side, Some(3000));
    // Narrowed to the sidecar.
    let only = read(
        &d,
        51,
        LogsQuery {
            container: Some("sidecar".into()),
            ..LogsQuery::default()
        },
    )
    .await?;
    assert_eq!(only.len(), 2, "{only:?}");
    Ok(())
}

#[tokio::test]
async fn a_container_whose_secret_cannot_be_read_is_withheld_not_leaked() -> Result<()> {
    let w = World::start(READS_DB).await?;
    // No Secret `db`: the server cannot know what to redact from `check`.
    job_with_log(&w, 52, 20).await?;
    let d = dispatcher(&w, Some(runs_with(52)?))?;
    let events = read(&d, 52, LogsQuery::default()).await?;
    let texts: Vec<String> = events.iter().map(LogEvent::to_text).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.contains("container check: log withheld") && t.contains("db")),
        "{texts:?}"
    );
    assert!(!texts.iter().any(|t| t.contains("/check]")), "{texts:?}");
    assert!(!texts.iter().any(|t| t.contains(PASSWORD)), "{texts:?}");
    assert!(
        texts.iter().any(|t| t.ends_with("/sidecar] side 2")),
        "{texts:?}"
    );
    Ok(())
}

#[tokio::test]
async fn unknown_runs_other_metrics_and_no_control_plane_say_why() -> Result<()> {
    let w = World::start(READS_DB).await?;
    put_db_secret(&w);
    job_with_log(&w, 53, 5).await?;
    let d = dispatcher(&w, Some(runs_with(53)?))?;
    let other_metric = read(
        &d,
        53,
        LogsQuery {
            metric: Some("other".into()),
            ..LogsQuery::default()
        },
    )
    .await?;
    assert!(
        matches!(&other_metric[..], [LogEvent::Note { text, .. }] if text.contains("jobs.ttlAfterFinished")),
        "{other_metric:?}"
    );
    let e = read(&d, 54, LogsQuery::default()).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::NotFound(m) if m.message().contains("no AnalysisRun")),
        "{e:?}"
    );
    let e = read(
        &d,
        53,
        LogsQuery {
            destination: Some("nowhere".into()),
            ..LogsQuery::default()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(e, DispatchError::UnknownDestination(_)), "{e:?}");
    let without = dispatcher(&w, None)?;
    let e = read(&without, 53, LogsQuery::default()).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::NotFound(m) if m.message().contains("controlPlane")),
        "{e:?}"
    );
    Ok(())
}
