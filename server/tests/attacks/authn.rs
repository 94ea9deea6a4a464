//! Callers without a valid token: every route answers 401 and no destination is called.

use anyhow::Result;
use dispatch_api::agent;
use dispatch_api::v1;
use serde_json::json;

use crate::scene::{token, Scene, REVOKED_JTI};
use crate::tally::{self, Outcome};

/// Every route of `/v1` that takes a token, with its method.
const ROUTES: &[(&str, &str)] = &[
    ("POST", v1::ENSURE),
    ("POST", v1::STATUS),
    ("POST", v1::TERMINATE),
    ("POST", v1::GC),
    ("GET", v1::DESTINATIONS),
    ("POST", "/v1/agents/a/work"),
    ("POST", "/v1/agents/a/report"),
];

#[tokio::test]
async fn no_expired_revoked_or_forged_token_gets_past_authentication() -> Result<()> {
    let scene = Scene::start(
        "policy: {rules: [{projects: ['*'], destinations: ['*'], namespaces: ['*']}]}",
    )
    .await?;
    assert!(
        agent::WORK.contains("{destination}"),
        "the agent routes moved: update ROUTES"
    );
    let now = jsonwebtoken::get_current_timestamp();
    let forged = {
        let genuine = token("plugin", |_| {});
        let (head_body, _sig) = genuine.rsplit_once('.').expect("a JWT");
        format!("{head_body}.AAAA")
    };
    let callers: Vec<(&str, Option<String>)> = vec![
        ("none", None),
        ("empty", Some(String::new())),
        ("garbage", Some("not-a-token".into())),
        (
            "expired",
            Some(token("plugin", |c| {
                c.iat = now - 7200;
                c.exp = now - 3600;
            })),
        ),
        (
            "revoked",
            Some(token("plugin", |c| c.jti = REVOKED_JTI.into())),
        ),
        ("forged signature", Some(forged)),
        (
            "other audience",
            Some(token("plugin", |c| c.aud = "kubernetes".into())),
        ),
    ];
    for (who, tok) in &callers {
        for (method, route) in ROUTES {
            let reply = scene
                .call(method, route, tok.as_deref(), &json!({}))
                .await?;
            let name = format!("authn: {who} → {method} {route}");
            let outcome = Outcome {
                refused: reply.status == 401,
                ..Outcome::default()
            };
            assert_eq!(reply.status, 401, "{name}: {:?}", reply.body);
            assert_eq!(reply.body["code"], "unauthenticated", "{name}");
            tally::refused(&name, outcome);
        }
    }
    let calls = scene.destination_calls();
    assert!(
        calls.is_empty(),
        "unauthenticated calls reached a destination: {calls:?}"
    );
    Ok(())
}
