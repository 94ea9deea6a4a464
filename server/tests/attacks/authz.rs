//! Authorization: every route × every kind of authenticated caller gets exactly the status code
//! its token allows (a table; TokenReview users through the real authenticator against a fake
//! TokenReview API), and no request, whatever its block, reference or caller, reaches a
//! placement the policy denies its project (a seeded property over random requests).

use anyhow::{ensure, Result};
use dispatch_api::v1::{self, Ensured, MeasurementRef};
use dispatch_server::engine::{JobRef, Placement, REF_KEY};
use serde_json::{json, Value};

use crate::scene::{agent_token, measurement, plugin_token, signer, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};

/// Agent destinations `edge` and `edge2` besides the direct `a` and `b`.
const AGENTS: &str =
    "agents: {destinations: [{name: edge, namespace: verify}, {name: edge2, namespace: verify}]}";

/// The callers, in the order of the columns of [`MATRIX`].
const PRINCIPALS: [&str; 6] = [
    "plugin JWT of project A",
    "plugin JWT of project B",
    "plugin JWT of every project",
    "agent of its own destination",
    "agent of another destination",
    "agent of an unknown destination",
];

/// Each route (about run `team-a/run-a1` on destination `a`; the agent routes of `edge`) and
/// the status code of each caller of [`PRINCIPALS`]. Terminate comes last: it deletes the Job.
const MATRIX: &[(&str, &str, [u16; 6])] = &[
    ("POST", v1::ENSURE, [200, 403, 200, 403, 403, 403]),
    ("POST", v1::STATUS, [200, 403, 200, 403, 403, 403]),
    ("POST", v1::GC, [200, 403, 200, 403, 403, 403]),
    ("GET", v1::DESTINATIONS, [200, 200, 200, 200, 200, 200]),
    (
        "POST",
        "/v1/agents/edge/work",
        [403, 403, 403, 200, 403, 403],
    ),
    (
        "POST",
        "/v1/agents/edge/report",
        [403, 403, 403, 200, 403, 403],
    ),
    ("POST", v1::TERMINATE, [200, 403, 200, 403, 403, 403]),
];

fn tokens() -> [String; 6] {
    [
        plugin_token("ci-team-a", Some(&["team-a"])),
        plugin_token("ci-team-b", Some(&["team-b", "team-b-*"])),
        plugin_token("argo-rollouts", Some(&["*"])),
        agent_token("edge"),
        agent_token("edge2"),
        agent_token("nowhere"),
    ]
}

#[tokio::test]
async fn every_route_answers_each_caller_as_its_token_allows() -> Result<()> {
    let scene = Scene::start(&format!("{TENANTS_POLICY}\n{AGENTS}")).await?;
    let tokens = tokens();
    let run = ("team-a", "run-a1", "uid-a1");
    // The measurement as the controller holds it after ensure: with its signed reference.
    let mut m = measurement(run, "smoke", 1, "a");
    let ensured = scene.post(v1::ENSURE, &tokens[2], &m).await?;
    ensure!(ensured.status == 200, "{:?}", ensured.body);
    m.metadata = serde_json::from_value::<Ensured>(ensured.body)?.metadata;
    let gc = v1::GcRequest {
        run: m.run.clone(),
        metric: m.metric.clone(),
        limit: 5,
        block: m.block.clone(),
    };
    for (method, route, codes) in MATRIX {
        let body: Value = match *route {
            v1::GC => serde_json::to_value(&gc)?,
            r if r.ends_with("/work") => json!({}),
            r if r.ends_with("/report") => json!({"reports": []}),
            _ => serde_json::to_value(&m)?,
        };
        for (i, who) in PRINCIPALS.iter().enumerate() {
            let before = scene.calls_mark();
            let reply = scene.call(method, route, Some(&tokens[i]), &body).await?;
            let calls = scene.calls_since(before);
            let case = format!("authz: {who} → {method} {route}");
            let want = codes[i];
            ensure!(
                reply.status == want,
                "{case}: want {want}, got {} {:?}",
                reply.status,
                reply.body
            );
            if want == 200 {
                continue;
            }
            // A refused cell is an attack: it reached nothing.
            let not_for_team_a = i != 0 && i != 2;
            let got_through = reply.status == 200;
            let outcome = Outcome {
                refused: !got_through && calls.is_empty(),
                cross_tenant_read: got_through && not_for_team_a && *route == v1::STATUS,
                cross_tenant_delete: got_through
                    && not_for_team_a
                    && (*route == v1::TERMINATE || *route == v1::GC),
                secret_leak: false,
                ..Outcome::default()
            };
            tally::record(&case, &outcome);
            ensure!(
                reply.body["code"] == "forbidden",
                "{case}: {:?}",
                reply.body
            );
            ensure!(calls.is_empty(), "{case}: destination calls {calls:?}");
            ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
        }
    }
    // The refusals say what to change.
    let as_b = scene.post(v1::STATUS, &tokens[1], &m).await?;
    let message = as_b.body["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("project \"team-a\"") && message.contains("token issue --project team-a"),
        "{message}"
    );
    let as_agent = scene.post(v1::ENSURE, &tokens[3], &m).await?;
    let message = as_agent.body["message"].as_str().unwrap_or_default();
    ensure!(
        message.contains("agent token for destination \"edge\""),
        "{message}"
    );
    Ok(())
}

/// The policy of the property: [`TENANTS_POLICY`] plus `team-c` on `a` and `b` in `verify` and
/// `ci-*`; `team-x` has no rule.
const PROPERTY_POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a], namespaces: [verify]}, \
    {projects: [team-b], destinations: [b], namespaces: [verify]}, \
    {projects: [team-c], destinations: [a, b], namespaces: [verify, 'ci-*']}]}";

/// The test's own reading of [`PROPERTY_POLICY`].
fn allowed(project: &str, destination: &str, namespace: &str) -> bool {
    match project {
        "team-a" => destination == "a" && namespace == "verify",
        "team-b" => destination == "b" && namespace == "verify",
        "team-c" => {
            matches!(destination, "a" | "b")
                && (namespace == "verify" || namespace.starts_with("ci-"))
        }
        _ => false,
    }
}

/// A small deterministic generator (64-bit LCG, Knuth's constants): the same cases every run.
struct Lcg(u64);

impl Lcg {
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        &items[((self.0 >> 33) as usize) % items.len()]
    }
}

/// `(destination, namespace)` of each call on `a` and `b` after `before` that names a namespace
/// (the watch caches' own lists and watches are cluster-wide and name none).
fn namespaced_calls(scene: &Scene, before: (usize, usize)) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (name, api, from) in [
        ("a", &scene.world.clusters.a, before.0),
        ("b", &scene.world.clusters.b, before.1),
    ] {
        for r in api.requests().into_iter().skip(from) {
            if let Some(rest) = r.path.split("/namespaces/").nth(1) {
                let ns = rest.split('/').next().unwrap_or_default().to_string();
                out.push((name.to_string(), ns, format!("{} {}", r.method, r.path)));
            }
        }
    }
    out
}

#[tokio::test]
async fn no_request_reaches_a_placement_the_policy_denies() -> Result<()> {
    let scene = Scene::start(PROPERTY_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let mut rng = Lcg(0x5eed_0014);
    let projects = ["team-a", "team-b", "team-c", "team-x"];
    let targets = ["a", "b", "a,b"];
    let namespaces = [None, Some("verify"), Some("ci-1"), Some("kube-system")];
    let routes = [v1::ENSURE, v1::STATUS, v1::TERMINATE, v1::GC];
    let (mut reached, mut denied_asked) = (0, 0);
    for i in 0..240 {
        let project = *rng.pick(&projects);
        let target = *rng.pick(&targets);
        let namespace = *rng.pick(&namespaces);
        let route = *rng.pick(&routes);
        let uid = format!("uid-{project}-{}", rng.pick(&[1, 2, 3]));
        let mut m: MeasurementRef = measurement((project, "run", &uid), "m", 1, target);
        if let Some(ns) = namespace {
            m.block["namespace"] = json!(ns);
        }
        // Half the reads and deletes carry a reference signed with the server's own key (the
        // worst case: a leaked key) over random placements.
        let forged = (route == v1::STATUS || route == v1::TERMINATE) && *rng.pick(&[true, false]);
        let mut forged_denied = false;
        if forged {
            let placements: Vec<Placement> = (0..*rng.pick(&[1, 2, 3]))
                .map(|_| Placement {
                    destination: rng.pick(&["a", "b"]).to_string(),
                    namespace: rng.pick(&["verify", "ci-1", "kube-system"]).to_string(),
                })
                .collect();
            forged_denied = placements
                .iter()
                .any(|p| !allowed(project, &p.destination, &p.namespace));
            let r = JobRef {
                run_uid: uid.clone(),
                run_namespace: project.into(),
                run_name: "run".into(),
                metric: "m".into(),
                measurement: 1,
                name: dispatch_server::job::job_name(&uid, "m", 1),
                require: dispatch_api::Require::All,
                log_tail: 0,
                placements,
                deadline: 0,
                observe: None,
                sig: String::new(),
            }
            .signed(&signer());
            m.metadata
                .insert(REF_KEY.into(), serde_json::to_string(&r)?);
        }
        let asked_denied = if forged {
            forged_denied
        } else {
            target
                .split(',')
                .any(|d| !allowed(project, d, namespace.unwrap_or("verify")))
        };
        let before = (
            scene.world.clusters.a.requests().len(),
            scene.world.clusters.b.requests().len(),
        );
        let reply = if route == v1::GC {
            let gc = v1::GcRequest {
                run: m.run.clone(),
                metric: m.metric.clone(),
                limit: 0,
                block: m.block.clone(),
            };
            scene.post(route, &controller, &gc).await?
        } else {
            scene.post(route, &controller, &m).await?
        };
        let calls = namespaced_calls(&scene, before);
        let bad: Vec<_> = calls
            .iter()
            .filter(|(d, ns, _)| !allowed(project, d, ns))
            .collect();
        reached += calls.len();
        if asked_denied {
            denied_asked += 1;
            let case = format!(
                "authz property #{i}: {project} {route} target {target} namespace {namespace:?} \
                 forged reference {forged}"
            );
            let other_tenant = bad.iter().any(|(d, _, _)| {
                // a Job of a destination another project owns
                !allowed(project, d, "verify")
            });
            let outcome = Outcome {
                refused: bad.is_empty(),
                cross_tenant_read: other_tenant && route == v1::STATUS,
                cross_tenant_delete: other_tenant && route != v1::STATUS,
                secret_leak: false,
                ..Outcome::default()
            };
            tally::record(&case, &outcome);
            ensure!(
                bad.is_empty(),
                "{case}: reached denied placements {bad:?} ({} {:?})",
                reply.status,
                reply.body
            );
        }
        ensure!(bad.is_empty(), "#{i}: denied placements reached: {bad:?}");
    }
    // Not vacuous: allowed requests did reach their placements, and many asked for denied ones.
    ensure!(
        reached > 20,
        "only {reached} namespaced calls: the property tested nothing"
    );
    ensure!(
        denied_asked > 60,
        "only {denied_asked} requests asked for a denied placement"
    );
    Ok(())
}

/// [`TENANTS_POLICY`] plus `policy.callers` entries binding team-a's ServiceAccounts to team-a
/// and the Rollouts controller to every project (which it must be given: callers fail closed).
pub(crate) const CALLERS_POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a], namespaces: [verify]}, \
    {projects: [team-b], destinations: [b], namespaces: [verify]}], \
    callers: [{subject: 'system:serviceaccount:team-a:*', projects: [team-a]}, \
    {subject: 'system:serviceaccount:argo-rollouts:argo-rollouts', projects: ['*']}]}";

/// The Kubernetes users behind the bearer tokens the fake TokenReview API knows.
pub(crate) const USERS: &[(&str, &str)] = &[
    ("sa-team-a", "system:serviceaccount:team-a:ci"),
    (
        "sa-controller",
        "system:serviceaccount:argo-rollouts:argo-rollouts",
    ),
    ("sa-stranger", "system:serviceaccount:elsewhere:tool"),
    ("sa-unbound", "system:serviceaccount:tools:unbound"),
    // The controller's own identity, in a token made for the apiserver (a kubeconfig token):
    // the review answers with no audience of ours.
    (
        "sa-controller-apiserver-audience",
        "system:serviceaccount:argo-rollouts:argo-rollouts",
    ),
];

/// A control plane that answers TokenReviews from [`USERS`] (any other token: not
/// authenticated), for the real TokenReview authenticator. As an audience-aware apiserver does,
/// it answers with the audiences asked for in `status.audiences`, except for
/// `sa-controller-apiserver-audience`, valid for the apiserver's own audience only.
pub(crate) async fn token_review_api() -> Result<kube::Client> {
    async fn review(axum::Json(body): axum::Json<Value>) -> axum::Json<Value> {
        let token = body["spec"]["token"].as_str().unwrap_or_default();
        let audiences = if token == "sa-controller-apiserver-audience" {
            json!(["https://kubernetes.default.svc"])
        } else {
            body["spec"]["audiences"].clone()
        };
        let status = match USERS.iter().find(|(t, _)| *t == token) {
            Some((_, user)) => json!({"authenticated": true, "audiences": audiences,
                                      "user": {"username": user}}),
            None => json!({"authenticated": false, "error": "unknown token"}),
        };
        axum::Json(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "spec": body["spec"], "status": status
        }))
    }
    let app = axum::Router::new().route(
        "/apis/authentication.k8s.io/v1/tokenreviews",
        axum::routing::post(review),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(kube::Client::try_from(kube::Config::new(url.parse()?))?)
}

/// The real TokenReview authenticator against [`token_review_api`], for the users of the first
/// `allowed` [`USERS`], bound by the `policy.callers` of [`CALLERS_POLICY`] (config file
/// `attacks.yaml`).
pub(crate) async fn callers_review(
    allowed: usize,
) -> Result<dispatch_server::http::tokenreview::TokenReviewAuthenticator> {
    let origin = "config file attacks.yaml";
    let config = dispatch_server::config::ServerConfig::parse(CALLERS_POLICY, origin)
        .map_err(anyhow::Error::msg)?;
    let callers = config.policy.map(|p| p.callers).unwrap_or_default();
    let allowed = USERS[..allowed]
        .iter()
        .map(|(_, u)| u.to_string())
        .collect();
    Ok(
        dispatch_server::http::tokenreview::TokenReviewAuthenticator::new(
            token_review_api().await?,
            Vec::new(),
            allowed,
        )
        .with_callers(callers, origin),
    )
}

#[tokio::test]
async fn tokenreview_identities_act_only_for_the_projects_policy_callers_gives_them() -> Result<()>
{
    use dispatch_server::http::auth::{Chain, JwtAuthenticator};
    use std::sync::Arc;

    let review = callers_review(2).await?;
    let jwt = JwtAuthenticator::new(&[crate::scene::KEY.to_vec()], []);
    let scene = Scene::start_with_auth(
        CALLERS_POLICY,
        Arc::new(Chain(vec![review.into(), jwt.into()])),
    )
    .await?;

    let team_a = measurement(("team-a", "run-a", "uid-a"), "smoke", 1, "a");
    let team_b = measurement(("team-b", "run-b", "uid-b"), "smoke", 1, "b");
    // Bound to team-a: its own project works.
    let own = scene.post(v1::ENSURE, "sa-team-a", &team_a).await?;
    ensure!(own.status == 200, "{:?}", own.body);
    // The controller's entry: every project.
    let controller = scene.post(v1::ENSURE, "sa-controller", &team_b).await?;
    ensure!(controller.status == 200, "{:?}", controller.body);
    let gc_b = v1::GcRequest {
        run: team_b.run.clone(),
        metric: team_b.metric.clone(),
        limit: 0,
        block: team_b.block.clone(),
    };
    let as_team_a = |route, body| ("team-a's ServiceAccount", route, "sa-team-a", body, 403);
    let b = serde_json::to_value(&team_b)?;
    let attacks: Vec<(&str, &str, &str, Value, u16)> = vec![
        as_team_a(v1::ENSURE, b.clone()),
        as_team_a(v1::STATUS, b.clone()),
        as_team_a(v1::TERMINATE, b),
        as_team_a(v1::GC, serde_json::to_value(&gc_b)?),
        (
            "an authenticated user not allowed",
            v1::STATUS,
            "sa-stranger",
            serde_json::to_value(&team_a)?,
            401,
        ),
    ];
    for (who, route, token, body, want) in attacks {
        let before = scene.calls_mark();
        let reply = scene.call("POST", route, Some(token), &body).await?;
        let calls = scene.calls_since(before);
        let case = format!("authz: TokenReview {who} → POST {route} of another project");
        let got_through = reply.status == 200;
        let outcome = Outcome {
            refused: reply.status == want && calls.is_empty(),
            cross_tenant_read: got_through && route == v1::STATUS,
            cross_tenant_delete: got_through && (route == v1::TERMINATE || route == v1::GC),
            secret_leak: false,
            ..Outcome::default()
        };
        tally::record(&case, &outcome);
        ensure!(
            reply.status == want,
            "{case}: {} {:?}",
            reply.status,
            reply.body
        );
        ensure!(calls.is_empty(), "{case}: {calls:?}");
        if want == 403 {
            let message = reply.body["message"].as_str().unwrap_or_default();
            ensure!(
                message.contains("project \"team-b\"")
                    && message.contains("policy.callers[0] in config file attacks.yaml"),
                "{case}: {message}"
            );
        }
        ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
    }
    Ok(())
}
