//! Callers fail closed (#27): a caller nothing binds to a project acts for none. A JWT without a
//! `projects` claim (not an agent's) → 401 naming `token issue --project`; a TokenReview
//! identity on the allow-list with no `policy.callers` entry → 403 naming the entry to add; a
//! token the apiserver authenticates for its own audience, not ours → 401. None of them costs a
//! destination call; each records `unbound_caller` if it got through.

use std::sync::Arc;

use anyhow::{ensure, Result};
use dispatch_api::v1;
use dispatch_server::http::auth::{Chain, JwtAuthenticator};
use serde_json::Value;

use crate::authz::{callers_review, CALLERS_POLICY, USERS};
use crate::scene::{measurement, token, Scene};
use crate::tally::{self, Outcome};

/// The measurement routes, each about run `team-a/run-a` on destination `a`.
const ROUTES: [&str; 4] = [v1::ENSURE, v1::STATUS, v1::GC, v1::TERMINATE];

/// The body of `route` for `team-a/run-a`.
fn body(route: &str) -> Result<Value> {
    let m = measurement(("team-a", "run-a", "uid-a"), "smoke", 1, "a");
    Ok(if route == v1::GC {
        serde_json::to_value(v1::GcRequest {
            run: m.run,
            metric: m.metric,
            limit: 0,
            block: m.block,
        })?
    } else {
        serde_json::to_value(&m)?
    })
}

/// Sends `token` to every measurement route; each must answer `want` with `code` and a message
/// containing every `needle`, and reach no destination.
async fn refused_everywhere(
    scene: &Scene,
    who: &str,
    token: &str,
    (want, code): (u16, &str),
    needles: &[&str],
) -> Result<()> {
    for route in ROUTES {
        let before = scene.calls_mark();
        let reply = scene
            .call("POST", route, Some(token), &body(route)?)
            .await?;
        let calls = scene.calls_since(before);
        let case = format!("callers: {who} → POST {route}");
        let got_through = reply.status == 200;
        let outcome = Outcome {
            refused: reply.status == want && calls.is_empty(),
            unbound_caller: got_through,
            cross_tenant_read: got_through && route == v1::STATUS,
            cross_tenant_delete: got_through && (route == v1::TERMINATE || route == v1::GC),
            ..Outcome::default()
        };
        tally::record(&case, &outcome);
        ensure!(
            reply.status == want && reply.body["code"] == code,
            "{case}: {} {:?}",
            reply.status,
            reply.body
        );
        ensure!(calls.is_empty(), "{case}: {calls:?}");
        let message = reply.body["message"].as_str().unwrap_or_default();
        for needle in needles {
            ensure!(message.contains(needle), "{case}: {message}");
        }
        ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
    }
    Ok(())
}

#[tokio::test]
async fn a_jwt_without_projects_acts_for_no_project() -> Result<()> {
    let scene = Scene::start(CALLERS_POLICY).await?;
    // The control: the same token with `projects: ["*"]` is served.
    let every = token("argo-rollouts", |_| {});
    let ok = scene.post(v1::ENSURE, &every, &body(v1::ENSURE)?).await?;
    ensure!(ok.status == 200, "{:?}", ok.body);
    let unclaimed = token("argo-rollouts", |c| c.projects = None);
    refused_everywhere(
        &scene,
        "a plugin JWT without a `projects` claim",
        &unclaimed,
        (401, "unauthenticated"),
        &[
            "no `projects` claim",
            "token issue --project",
            "--project '*'",
        ],
    )
    .await
}

#[tokio::test]
async fn a_tokenreview_identity_without_a_callers_entry_or_our_audience_acts_for_none() -> Result<()>
{
    // Every user is allowed to authenticate; only the callers entries bind them to projects.
    let review = callers_review(USERS.len()).await?;
    ensure!(
        review.unbound()
            == [
                "system:serviceaccount:elsewhere:tool",
                "system:serviceaccount:tools:unbound"
            ],
        "{:?}",
        review.unbound()
    );
    let jwt = JwtAuthenticator::new(&[crate::scene::KEY.to_vec()], []);
    let scene = Scene::start_with_auth(
        CALLERS_POLICY,
        Arc::new(Chain(vec![review.into(), jwt.into()])),
    )
    .await?;
    // The control: the controller's entry (`projects: ['*']`) is served.
    let ok = scene
        .post(v1::ENSURE, "sa-controller", &body(v1::ENSURE)?)
        .await?;
    ensure!(ok.status == 200, "{:?}", ok.body);
    refused_everywhere(
        &scene,
        "a TokenReview identity with no policy.callers entry",
        "sa-unbound",
        (403, "forbidden"),
        &[
            "system:serviceaccount:tools:unbound matches no `policy.callers` entry in config \
             file attacks.yaml",
            "subject: \"system:serviceaccount:tools:unbound\"",
        ],
    )
    .await?;
    refused_everywhere(
        &scene,
        "the controller's identity in a token for the apiserver's audience",
        "sa-controller-apiserver-audience",
        (401, "unauthenticated"),
        &[
            "not for audience rollouts-dispatch",
            "status.audiences is https://kubernetes.default.svc",
        ],
    )
    .await
}
