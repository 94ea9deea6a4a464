//! Deadlines: a tenant's block asks for a deadline long enough to hold its Stage for days (Argo
//! Rollouts has no timeout on a metric, and Kargo refuses promotions of a Stage while its
//! verification runs). Refused at ensure with `activeDeadline`, its value, the limit and the key
//! to raise it; no destination call, no agent record.

use anyhow::Result;
use serde_json::json;

use crate::budgets::{measurement, POLICY};
use crate::scene::{token, Scene};
use crate::tally::{self, Outcome};

const AGENTS: &str = "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}";

#[tokio::test]
async fn a_thirty_day_deadline_is_refused_before_any_destination_call() -> Result<()> {
    let scene = Scene::start(&format!("{POLICY}\n{AGENTS}")).await?;
    let plugin = token("plugin", |_| {});
    let store = scene
        .world
        .engine
        .store()
        .expect("the scene has agents")
        .clone();
    let mut refused = true;
    for (n, destination) in [(1, "a"), (2, "edge"), (3, "a,b")] {
        let reply = scene
            .call(
                "POST",
                dispatch_api::v1::ENSURE,
                Some(&plugin),
                &measurement(
                    n,
                    json!({"destination": destination, "activeDeadline": "720h"}),
                ),
            )
            .await?;
        let message = reply.body["message"].as_str().unwrap_or_default();
        let named = [
            "`activeDeadline` is 720h",
            "6h",
            "engine.maxMeasurementDeadline",
        ]
        .iter()
        .all(|needle| message.contains(needle));
        assert!(
            (400..500).contains(&reply.status) && named,
            "{destination}: {} {message}",
            reply.status
        );
        refused &= (400..500).contains(&reply.status) && named;
    }
    let calls = scene.destination_calls();
    let records = store.len();
    tally::refused(
        "deadlines: activeDeadline 720h (direct, agent, both) → 4xx naming the key, 0 destination calls, 0 records",
        Outcome {
            refused: refused && calls.is_empty() && records == 0,
            ..Outcome::default()
        },
    );
    assert!(calls.is_empty(), "{calls:?}");
    assert_eq!(records, 0);

    // The limit itself is allowed: the refusal is the cap, not the field.
    let at_limit = scene
        .call(
            "POST",
            dispatch_api::v1::ENSURE,
            Some(&plugin),
            &measurement(4, json!({"destination": "a", "activeDeadline": "6h"})),
        )
        .await?;
    assert_eq!(at_limit.status, 200, "{:?}", at_limit.body);
    assert!(!scene.destination_calls().is_empty());
    Ok(())
}
