//! Destinations limited to namespaces (`destinations[].namespaces`): a tenant whose policy
//! allows every namespace still cannot place a Job outside the destination's namespaces — by
//! the block's `namespace`, by a selector, or by the `locate` route — the reply is 403 naming
//! the destination, the namespace and the key, and the destination gets no call. Control: the
//! destination's own namespace works.

use anyhow::Result;
use dispatch_api::v1;
use serde_json::{json, Value};

use crate::fake_api::FakeApi;
use crate::scene::{token, Reply, Scene};
use crate::tally::{self, Outcome};

/// team-a may use `a` and `c` in every namespace: only `c`'s own limit stands in the way.
const POLICY: &str =
    "policy: {rules: [{projects: [team-a], destinations: [a, c], namespaces: [\"*\"]}]}";

const UID: &str = "5a1d0c2a-5b3d-4c6e-8f90-a1b2c3d4e5f6";

/// Destination `c` on `fake`, labelled `tier: limited`, limited to namespace `verify`.
fn limited(fake: &FakeApi) -> String {
    format!(
        "- {{name: c, server: \"{}\", token: c-token, labels: {{tier: limited}}, namespaces: [verify]}}",
        fake.url()
    )
}

/// The calls an attack could cause on `fake`: writes, deletes and log reads.
fn calls_on(fake: &FakeApi) -> Vec<String> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method != "GET" || r.path.ends_with("/log"))
        .map(|r| format!("c: {} {}?{}", r.method, r.path, r.query))
        .collect()
}

fn body(index: u32, routing: Value) -> Value {
    let mut block = json!({
        "spec": {"template": {"spec": {"containers": [{"name": "check", "image": "x"}]}}}
    });
    for (k, v) in routing.as_object().into_iter().flatten() {
        block[k] = v.clone();
    }
    json!({
        "run": {"name": "uat.verify.1", "namespace": "team-a", "uid": UID},
        "metric": "m",
        "index": index,
        "block": block,
    })
}

async fn call(scene: &Scene, route: &str, body: &Value) -> Result<Reply> {
    let plugin = token("argo-rollouts-controller", |_| {});
    scene.call("POST", route, Some(&plugin), body).await
}

#[tokio::test]
async fn a_placement_outside_a_destinations_namespaces_is_refused_with_no_call() -> Result<()> {
    let fake = FakeApi::start().await?;
    let scene = Scene::start_with_destinations(&limited(&fake), POLICY).await?;
    for (what, route, routing) in [
        (
            "the block's namespace",
            v1::ENSURE,
            json!({"destination": "c", "namespace": "kube-system"}),
        ),
        (
            "a selector matching only the limited destination",
            v1::ENSURE,
            json!({"destinationSelector": "tier=limited", "namespace": "kube-system"}),
        ),
        (
            "the status route (locate)",
            v1::STATUS,
            json!({"destination": "c", "namespace": "kube-system"}),
        ),
    ] {
        let reply = call(&scene, route, &body(1, routing)).await?;
        let message = reply.body.to_string();
        let named = [
            "\\\"c\\\"",
            "\\\"kube-system\\\"",
            "`destinations[2].namespaces`",
        ]
        .iter()
        .all(|n| message.contains(n));
        let calls: Vec<String> = calls_on(&fake)
            .into_iter()
            .chain(scene.destination_calls())
            .collect();
        let outcome = Outcome {
            refused: reply.status == 403 && named && calls.is_empty(),
            ..Outcome::default()
        };
        tally::record(
            &format!("namespaces: outside the destination's namespaces by {what}"),
            &outcome,
        );
        assert_eq!(reply.status, 403, "{what}: {message}");
        assert!(
            named,
            "{what}: the refusal names the destination, namespace and key: {message}"
        );
        assert!(calls.is_empty(), "{what}: destination calls: {calls:?}");
        assert_eq!(outcome, Outcome::refused());
    }
    // Control: the destination's own namespace is dispatched there.
    let reply = call(&scene, v1::ENSURE, &body(2, json!({"destination": "c"}))).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let calls = calls_on(&fake);
    assert!(
        calls.len() == 1 && calls[0].starts_with("c: POST /apis/batch/v1/namespaces/verify/jobs"),
        "{calls:?}"
    );
    Ok(())
}
