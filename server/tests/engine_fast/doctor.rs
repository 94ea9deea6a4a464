//! `doctor`'s lines on Jobs left behind (`cmd::leftovers`), from a real engine's Job caches: per
//! destination, our Jobs finished (or created, if never finished) longer ago than
//! `jobs.retention`, and the oldest; an agent destination with the in-memory store says the
//! doctor cannot see its records.

use anyhow::Result;
use dispatch_server::cmd::leftovers;
use serde_json::json;

use crate::cluster_side::finish_job;
use crate::world::{block, request, run, Clusters, NS};

#[tokio::test]
async fn doctor_counts_jobs_older_than_the_retention_per_destination() -> Result<()> {
    let w = Clusters::start()
        .await?
        .engine(
            "",
            "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}",
            true,
        )
        .await?;
    let config = block(json!({"destination": "a"}))?;
    let old = w
        .engine
        .ensure(&request(&run(1), "smoke", 1, config.clone()))
        .await?
        .job;
    let fresh = w
        .engine
        .ensure(&request(&run(2), "smoke", 1, config))
        .await?
        .job;
    w.cached("a", &fresh.name, true).await?;
    // Finished at 2026-01-01 (the fake's Job controller), longer ago than 24h.
    finish_job(w.api("a"), &old.name, "Complete", "Completed", "");
    let lines = crate::world::eventually("the cache shows the finished Job", || {
        let engine = w.engine.clone();
        async move {
            let lines = leftovers::lines(
                &engine,
                Some(dispatch_server::config::StoreKind::Memory),
                std::time::Duration::from_secs(1),
            )
            .await;
            Ok(lines
                .iter()
                .any(|l| l.starts_with("retention a: 1 Job(s) of 2"))
                .then_some(lines))
        }
    })
    .await?;
    let line = |d: &str| {
        lines
            .iter()
            .find(|l| l.starts_with(&format!("retention {d}: ")))
            .cloned()
            .unwrap_or_default()
    };
    assert!(
        line("a").contains(&format!("oldest {NS}/{}", old.name)),
        "{lines:?}"
    );
    assert_eq!(
        line("b"),
        "retention b: OK, no Job older than 24h (0 in all)"
    );
    assert!(
        line("edge")
            .starts_with("retention edge: cannot see: its records are in the server's memory"),
        "{lines:?}"
    );
    assert_eq!(lines.len(), 3, "one line per destination: {lines:?}");
    Ok(())
}
