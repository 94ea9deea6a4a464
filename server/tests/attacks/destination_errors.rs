//! Errors name what the caller may see, nothing more: a measurement naming a destination that
//! does not exist, a selector matching nothing, or a destination of another tenant, is refused
//! with an error that names only the destinations the caller's project may use (by the policy)
//! — never another tenant's destination names or labels, nor whether another tenant's
//! destination exists.

use anyhow::{ensure, Result};
use dispatch_api::v1;
use serde_json::json;

use crate::scene::{measurement, plugin_token, Scene};
use crate::tally::{self, Outcome};

/// Project `team-a` may use `a` (and any `a-*`), `team-b` may use `b`. `b` is labelled
/// `region: us`, `a` `region: eu` (`world.rs`).
const POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a, 'a-*'], namespaces: [verify]}, \
    {projects: [team-b], destinations: [b], namespaces: [verify]}]}";

/// What of team-b's destination `b` an error must never show to team-a: its label value
/// `us` (`region: us`), and the name itself where team-a did not write it (quoted, or in a
/// list of known destinations: `known: a, b)`, `b {"env": …}`).
fn leaks_b(message: &str, typed_b: bool) -> bool {
    let named = ["\"b\"", " b,", " b)", " b {", ": b"]
        .iter()
        .any(|p| message.contains(p));
    message.contains("\"us\"") || (!typed_b && named)
}

#[tokio::test]
async fn refusals_name_only_the_callers_destinations() -> Result<()> {
    let scene = Scene::start(POLICY).await?;
    // A caller acting for team-a only.
    let caller = plugin_token("ci-a", Some(&["team-a"]));
    let run = ("team-a", "run-a1", "uid-a1");
    let cases: [(&str, serde_json::Value, u16, bool); 4] = [
        (
            "an unknown destination the project may name",
            json!("a-missing"),
            404,
            false,
        ),
        (
            "a selector matching only another tenant's destination",
            json!({"destinationSelector": "region=us"}),
            404,
            false,
        ),
        (
            "another tenant's destination, by name",
            json!("b"),
            403,
            true,
        ),
        (
            "a destination that exists nowhere, which no rule lists",
            json!("c"),
            403,
            false,
        ),
    ];
    let mut refusals = Vec::new();
    for (case, target, status, typed_b) in cases {
        let mut m = measurement(run, "smoke", 1, "a");
        match target {
            serde_json::Value::String(name) => m.block["destination"] = json!(name),
            other => {
                m.block.as_object_mut().map(|b| b.remove("destination"));
                for (k, v) in other.as_object().into_iter().flatten() {
                    m.block[k] = v.clone();
                }
            }
        }
        let before = scene.calls_mark();
        let reply = scene.post(v1::ENSURE, &caller, &m).await?;
        let message = reply.body["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let leaked = leaks_b(&message, typed_b);
        let name = format!("destination errors: {case}");
        tally::refused(
            &name,
            Outcome {
                refused: reply.status == status && scene.calls_since(before).is_empty(),
                cross_tenant_read: leaked || reply.status == 200,
                ..Outcome::default()
            },
        );
        ensure!(!leaked, "{name}: {message}");
        refusals.push(message);
    }
    // The unknown name lists the project's own destination, with its labels for the selector.
    ensure!(
        refusals[0].contains("known: a)") && refusals[1].contains("known: a {"),
        "{refusals:?}"
    );
    // Another tenant's destination and one that exists nowhere read alike: the error is no
    // way to learn which of team-b's names exist.
    ensure!(
        refusals[2].replace("\"b\"", "\"c\"") == refusals[3],
        "{refusals:?}"
    );
    Ok(())
}

/// `GET /v1/destinations` lists to a caller bound to projects only the destinations one of them
/// may use, to an agent only its own; the Rollouts controller (every project) sees them all.
#[tokio::test]
async fn the_destination_list_shows_only_the_callers_destinations() -> Result<()> {
    let scene = Scene::start(POLICY).await?;
    let names = |reply: &crate::scene::Reply| -> Vec<String> {
        reply
            .body
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| d["name"].as_str().map(String::from))
            .collect()
    };
    for (who, token, expected) in [
        (
            "a caller bound to team-a",
            plugin_token("ci-a", Some(&["team-a"])),
            vec!["a"],
        ),
        (
            "a caller bound to team-*",
            plugin_token("ci", Some(&["team-*"])),
            vec!["a", "b"],
        ),
        ("agent a", crate::scene::agent_token("a"), vec!["a"]),
        (
            "the controller",
            plugin_token("argo-rollouts", Some(&["*"])),
            vec!["a", "b"],
        ),
    ] {
        let reply = scene
            .call(
                "GET",
                v1::DESTINATIONS,
                Some(&token),
                &serde_json::Value::Null,
            )
            .await?;
        let listed = names(&reply);
        let foreign = listed.iter().any(|n| !expected.contains(&n.as_str()));
        tally::refused(
            &format!("destination list: {who}"),
            Outcome {
                refused: reply.status == 200 && listed == expected,
                cross_tenant_read: foreign,
                ..Outcome::default()
            },
        );
    }
    Ok(())
}
