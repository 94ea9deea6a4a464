//! The log route (`GET /v1/runs/{namespace}/{name}/logs`), which people reach too: every
//! caller who may not see the run's namespace is refused before the dispatcher, so no refused
//! request costs a destination call, and a proxy's headers count only from its addresses.

use std::sync::Arc;

use anyhow::Result;
use axum::routing::post;
use axum::{Json, Router};
use dispatch_server::config::{AddressRange, PeopleConfig, ProxyConfig};
use dispatch_server::http::people::ControlPlanePeople;
use serde_json::{json, Value};

use crate::scene::{agent_token, plugin_token, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};
use crate::world::World;

/// A control plane whose apiserver knows `alice-token` (user alice, group team-a) and
/// `bob-token` (bob, no group), and allows `get analysisruns.argoproj.io` in namespace team-a
/// to group team-a, and everything to group system:masters.
pub(crate) async fn control_plane() -> Result<kube::Client> {
    let app = Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(|Json(mut review): Json<Value>| async move {
                review["status"] = match review["spec"]["token"].as_str() {
                    Some("alice-token") => json!({"authenticated": true,
                        "user": {"username": "alice", "groups": ["team-a"]}}),
                    Some("bob-token") => {
                        json!({"authenticated": true, "user": {"username": "bob"}})
                    }
                    _ => json!({"authenticated": false, "error": "invalid bearer token"}),
                };
                Json(review)
            }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(|Json(mut review): Json<Value>| async move {
                let spec = &review["spec"];
                let in_group = |name: &str| {
                    spec["groups"]
                        .as_array()
                        .is_some_and(|g| g.iter().any(|g| g == name))
                };
                // system:masters passes every authorization check, as in Kubernetes.
                let allowed = in_group("system:masters")
                    || (spec["resourceAttributes"]["namespace"] == "team-a"
                        && spec["resourceAttributes"]["resource"] == "analysisruns"
                        && in_group("team-a"));
                review["status"] = json!({"allowed": allowed});
                Json(review)
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(kube::Client::try_from(kube::Config::new(url.parse()?))?)
}

/// The tenancy scene with people of [`control_plane`], and a proxy trusted from `trusted`.
async fn scene(trusted: &str) -> Result<Scene> {
    let people = ControlPlanePeople::new(
        control_plane().await?,
        PeopleConfig {
            token_review: true,
            proxy: Some(ProxyConfig {
                trusted_addresses: vec![AddressRange::parse(trusted).expect("an address")],
                user_header: "x-forwarded-user".into(),
                groups_header: "x-forwarded-groups".into(),
            }),
        },
    );
    Scene::serve_with_people(World::start(TENANTS_POLICY).await?, Arc::new(people.into())).await
}

fn logs(namespace: &str) -> String {
    dispatch_api::logs::run_logs_path(namespace, "uat.abc")
}

#[tokio::test]
async fn nobody_reads_the_logs_of_a_namespace_they_may_not_see() -> Result<()> {
    let scene = scene("10.0.0.0/8").await?;
    let get = |path: String, token: Option<String>| {
        let scene = &scene;
        async move {
            scene
                .call("GET", &path, token.as_deref(), &Value::Null)
                .await
        }
    };
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        ("no token", logs("team-a"), None, 401, "unauthenticated"),
        (
            "garbage token",
            logs("team-a"),
            Some("garbage".into()),
            401,
            "unauthenticated",
        ),
        (
            "person without get analysisruns there (SubjectAccessReview says no)",
            logs("team-a"),
            Some("bob-token".into()),
            403,
            "forbidden",
        ),
        (
            "person of team-a reading team-b",
            logs("team-b"),
            Some("alice-token".into()),
            403,
            "forbidden",
        ),
        (
            "agent token",
            logs("team-a"),
            Some(agent_token("a")),
            403,
            "forbidden",
        ),
        (
            "plugin JWT bound to another project",
            logs("team-a"),
            Some(plugin_token("ci-b", Some(&["team-b"]))),
            403,
            "forbidden",
        ),
        (
            "%2F in the namespace",
            "/v1/runs/team-a%2F..%2Fteam-b/x/logs".into(),
            Some("alice-token".into()),
            400,
            "invalid_request",
        ),
        (
            "%2F in the name",
            "/v1/runs/team-a/x%2F..%2Fy/logs".into(),
            Some("alice-token".into()),
            400,
            "invalid_request",
        ),
        (
            "unknown query field (a typo must not widen what is shown)",
            format!("{}?destinations=b", logs("team-a")),
            Some("alice-token".into()),
            400,
            "invalid_request",
        ),
    ];
    for (who, path, token, status, code) in cases {
        let reply = get(path.clone(), token).await?;
        let name = format!("logs: {who} → GET {path}");
        let outcome = Outcome {
            refused: reply.status == status && reply.body["code"] == code,
            ..Outcome::default()
        };
        assert_eq!(
            (reply.status, reply.body["code"].as_str()),
            (status, Some(code)),
            "{name}: {:?}",
            reply.body
        );
        tally::refused(&name, outcome);
    }
    // The person refused is told what would allow them.
    let bob = get(logs("team-a"), Some("bob-token".into())).await?;
    let message = bob.body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("user bob may not get analysisruns in namespace team-a")
            && message.contains("RoleBinding"),
        "{message}"
    );
    // `..` as a path segment, sent as written (clients normalise it away).
    for path in [
        "/v1/runs/../team-b/logs",
        "/v1/runs/team-a/../logs",
        "/v1/runs/%2e%2e/x/logs",
    ] {
        let status = scene
            .raw_get(path, &[("Authorization", "Bearer alice-token")])
            .await?;
        let name = format!("logs: dot segments → GET {path}");
        // 400 from the route, or 404 from no route at all: never a log.
        let outcome = Outcome {
            refused: status == 400 || status == 404,
            ..Outcome::default()
        };
        assert!(outcome.refused, "{name}: {status}");
        tally::refused(&name, outcome);
    }
    // The control: alice may see team-a, so her request gets past every check (and finds no
    // run, since this scene watches none).
    let alice = get(logs("team-a"), Some("alice-token".into())).await?;
    assert_eq!(alice.status, 404, "{:?}", alice.body);
    assert!(
        alice.body["message"]
            .as_str()
            .is_some_and(|m| m.contains("controlPlane")),
        "{:?}",
        alice.body
    );
    let calls = scene.destination_calls();
    assert!(
        calls.is_empty(),
        "refused log requests reached a destination: {calls:?}"
    );
    Ok(())
}

#[tokio::test]
async fn proxy_headers_count_only_from_the_proxy() -> Result<()> {
    // The scene's peers are 127.0.0.1: not the proxy (10.0.0.0/8).
    let scene = scene("10.0.0.0/8").await?;
    let as_carol = [
        ("X-Forwarded-User", "carol"),
        ("X-Forwarded-Groups", "team-a,system:masters"),
    ];
    let status = scene.raw_get(&logs("team-a"), &as_carol).await?;
    let name = "logs: proxy headers from an untrusted address, no token → 401";
    let outcome = Outcome {
        refused: status == 401,
        ..Outcome::default()
    };
    assert_eq!(status, 401, "{name}");
    tally::refused(name, outcome);
    // Nor do they dress up someone else's token: bob stays bob.
    let mut with_token = as_carol.to_vec();
    with_token.push(("Authorization", "Bearer bob-token"));
    let status = scene.raw_get(&logs("team-a"), &with_token).await?;
    let name = "logs: proxy headers from an untrusted address beside bob's token → 403";
    let outcome = Outcome {
        refused: status == 403,
        ..Outcome::default()
    };
    assert_eq!(status, 403, "{name}");
    tally::refused(name, outcome);
    // From the proxy's address the same headers name carol, whose groups decide.
    let trusted = scene_from_loopback().await?;
    assert_eq!(trusted.raw_get(&logs("team-a"), &as_carol).await?, 404);
    let name = "logs: proxied person of team-a reading team-b → 403";
    let status = trusted.raw_get(&logs("team-b"), &as_carol).await?;
    let outcome = Outcome {
        refused: status == 403,
        ..Outcome::default()
    };
    assert_eq!(status, 403, "{name}");
    tally::refused(name, outcome);
    assert!(scene.destination_calls().is_empty() && trusted.destination_calls().is_empty());
    Ok(())
}

#[tokio::test]
async fn a_trusted_proxy_never_vouches_for_a_system_identity() -> Result<()> {
    let trusted = scene_from_loopback().await?;
    // A group under `system:` is dropped: mallory is reviewed without system:masters, which
    // would have passed every check.
    for groups in [
        "system:masters",
        "team-b, system:masters",
        "system:nodes,system:masters",
    ] {
        let headers = [
            ("X-Forwarded-User", "mallory"),
            ("X-Forwarded-Groups", groups),
        ];
        let (status, answer) = trusted.raw_get_text(&logs("team-b"), &headers).await?;
        let name = format!("logs: proxy asserts groups [{groups}] for mallory → 403");
        proxied(&name, (status, &answer), 403);
    }
    // A user under `system:` is refused outright, naming why.
    for user in [
        "system:admin",
        "system:serviceaccount:argo-rollouts:argo-rollouts",
        "system:kube-controller-manager",
    ] {
        let headers = [("X-Forwarded-User", user), ("X-Forwarded-Groups", "team-a")];
        let (status, answer) = trusted.raw_get_text(&logs("team-a"), &headers).await?;
        let name = format!("logs: proxy asserts user {user} → 401");
        proxied(&name, (status, &answer), 401);
        assert!(
            answer.contains("reserved `system:` prefix"),
            "{name}: {answer}"
        );
    }
    // The control: the same proxy's person of team-a gets past every check.
    let carol = [
        ("X-Forwarded-User", "carol"),
        ("X-Forwarded-Groups", "team-a"),
    ];
    assert_eq!(trusted.raw_get(&logs("team-a"), &carol).await?, 404);
    assert!(trusted.destination_calls().is_empty());
    Ok(())
}

/// Asserts a proxied request was answered `want` and records it as case `name`; a 404 (past
/// every check, to a run the scene does not have) or 200 is a cross-tenant read.
fn proxied(name: &str, (status, answer): (u16, &str), want: u16) {
    let outcome = Outcome {
        refused: status == want,
        cross_tenant_read: status == 404 || status == 200,
        ..Outcome::default()
    };
    assert_eq!(status, want, "{name}: {answer}");
    tally::refused(name, outcome);
}

/// A scene whose proxy is on loopback, where the test's requests come from.
async fn scene_from_loopback() -> Result<Scene> {
    scene("127.0.0.1/32").await
}

/// What a tenant's planted Job printed: never shown as the run's log.
const FORGED: &str = "all checks passed (forged)";

/// A tenant who may create Jobs and pods in the verification namespace puts the run's labels
/// (public) on Jobs of its own, whose pods print what it likes: without a mark, with the mark of
/// the run's Job copied on, and the run's own Job replaced with another spec under its mark.
/// The log view shows none of them as the run's: each is named in a note, its log unread.
#[tokio::test]
async fn jobs_with_the_runs_labels_but_not_our_mark_are_not_its_log() -> Result<()> {
    use crate::cluster_side::{job as stored_job, jobs, pod_for, terminated};
    use crate::world::{block, request, run, runs_with, NS};
    use dispatch_api::logs::{LogEvent, LogsQuery};
    use futures::StreamExt;

    type Plant = fn(&mut Value, &str);
    let cases: [(&str, Plant); 3] = [
        ("a Job with the run's labels and no mark", |j, name| {
            j["metadata"]["name"] = json!(format!("{name}-planted"));
            j["metadata"]["annotations"]
                .as_object_mut()
                .map(|a| a.remove(dispatch_server::job::mark::ANN_MARK));
        }),
        (
            "a Job with the mark of the run's Job copied on",
            |j, name| {
                j["metadata"]["name"] = json!(format!("{name}-copied"));
            },
        ),
        ("the run's Job replaced with a hostPath volume", |j, _| {
            j["spec"]["template"]["spec"]["volumes"] =
                json!([{"name": "host", "hostPath": {"path": "/"}}]);
        }),
    ];
    for (case, plant) in cases {
        let w = World::start("").await?;
        let r = run(61);
        let ensured = w
            .engine
            .ensure(&request(
                &r,
                "smoke",
                1,
                block(json!({"destination": "a"}))?,
            ))
            .await?;
        let name = ensured.job.name;
        w.cached("a", &name, true).await?;
        let api = w.api("a");
        let mut forged = serde_json::to_value(stored_job(api, &name)?)?;
        plant(&mut forged, &name);
        forged.as_object_mut().map(|o| o.remove("status"));
        let forged_name = forged["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.put(&jobs(), forged);
        let pod = pod_for(api, &forged_name, terminated(0, None), true)?;
        api.set_log(NS, &pod, "check", &format!("{FORGED}\n"));
        crate::world::eventually("the planted Job in the cache", || {
            let cached = w
                .destination("a")
                .ok()
                .and_then(|d| d.jobs().get(NS, &forged_name));
            let expect_volume = forged_name == name;
            async move {
                let seen = cached.is_some_and(|j| {
                    !expect_volume
                        || serde_json::to_string(&*j)
                            .unwrap_or_default()
                            .contains("hostPath")
                });
                Ok(seen.then_some(()))
            }
        })
        .await?;

        let features = dispatch_server::app::Features::new(
            w.engine.clone(),
            Arc::new(dispatch_server::runtime::metrics::Metrics::new()),
            Arc::new(crate::scene::signer()),
            dispatch_server::app::Options {
                runs: Some(runs_with(61)?),
                ..Default::default()
            },
        );
        let run_name = dispatch_server::http::RunName {
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        };
        let events: Vec<LogEvent> = features
            .logs
            .of_run(run_name, LogsQuery::default())
            .await?
            .collect()
            .await;
        let shown = events
            .iter()
            .any(|e| matches!(e, LogEvent::Line { text, .. } if text.contains(FORGED)));
        let named = events.iter().any(|e| {
            matches!(e, LogEvent::Note { text, .. }
                if text.contains(&forged_name) && text.contains("not this server's mark"))
        });
        tally::refused(
            &format!("log view: {case}"),
            Outcome {
                refused: named && !shown,
                ..Outcome::default()
            },
        );
        anyhow::ensure!(!shown, "{case}: forged log shown: {events:?}");
    }
    Ok(())
}
