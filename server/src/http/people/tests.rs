//! People against a scripted control plane: who the reviews say they are, what the access
//! reviews allow, what is cached, and that a proxy's headers count only from its addresses.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::{HeaderMap, HeaderValue};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use super::*;
use crate::config::AddressRange;

/// What the scripted apiserver saw.
#[derive(Default)]
struct Seen {
    token_reviews: AtomicUsize,
    access_reviews: AtomicUsize,
    /// the `spec` of every review, in order
    specs: Mutex<Vec<Value>>,
}

/// An apiserver that knows `alice-token` (user alice, groups team-a) and `bob-token` (bob),
/// and allows `get analysisruns.argoproj.io` in namespace `team-a` to group `team-a` only.
async fn apiserver() -> (kube::Client, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let (tr, sar) = (seen.clone(), seen.clone());
    let app = Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(move |Json(review): Json<Value>| {
                tr.token_reviews.fetch_add(1, Ordering::SeqCst);
                tr.specs.lock().unwrap().push(review["spec"].clone());
                let mut answer = review.clone();
                answer["status"] = match review["spec"]["token"].as_str() {
                    Some("alice-token") => json!({"authenticated": true,
                        "user": {"username": "alice", "groups": ["team-a", "system:authenticated"]}}),
                    Some("bob-token") => json!({"authenticated": true, "user": {"username": "bob"}}),
                    _ => json!({"authenticated": false, "error": "invalid bearer token"}),
                };
                async move { Json(answer) }
            }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(move |Json(review): Json<Value>| {
                sar.access_reviews.fetch_add(1, Ordering::SeqCst);
                sar.specs.lock().unwrap().push(review["spec"].clone());
                let spec = &review["spec"];
                let attrs = &spec["resourceAttributes"];
                let allowed = attrs["namespace"] == "team-a"
                    && attrs["verb"] == "get"
                    && attrs["group"] == "argoproj.io"
                    && attrs["resource"] == "analysisruns"
                    && spec["groups"]
                        .as_array()
                        .is_some_and(|g| g.iter().any(|g| g == "team-a"));
                let mut answer = review.clone();
                answer["status"] = json!({"allowed": allowed});
                async move { Json(answer) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    (client, seen)
}

fn proxy() -> ProxyConfig {
    ProxyConfig {
        trusted_addresses: vec![AddressRange::parse("10.9.0.0/16").unwrap()],
        user_header: "x-forwarded-user".into(),
        groups_header: "x-forwarded-groups".into(),
    }
}

fn people(client: kube::Client, token_review: bool) -> ControlPlanePeople {
    ControlPlanePeople::new(
        client,
        PeopleConfig {
            token_review,
            proxy: Some(proxy()),
        },
    )
}

#[tokio::test]
async fn a_token_is_reviewed_without_audiences_once_and_names_the_person() {
    let (client, seen) = apiserver().await;
    let p = people(client, true);
    let alice = p.by_token("alice-token").await.unwrap().unwrap();
    assert_eq!(alice.user, "alice");
    assert_eq!(alice.groups, ["team-a", "system:authenticated"]);
    assert_eq!(alice.via, PersonSource::Token);
    let spec = seen.specs.lock().unwrap()[0].clone();
    assert!(
        spec.get("audiences").is_none_or(Value::is_null),
        "a person's token is the apiserver's own: no audiences, got {spec}"
    );
    // cached: no second review
    assert_eq!(p.by_token("alice-token").await.unwrap().unwrap(), alice);
    assert_eq!(seen.token_reviews.load(Ordering::SeqCst), 1);
    // a refused token is remembered too
    for _ in 0..3 {
        let e = p.by_token("stolen").await.unwrap_err();
        assert!(
            matches!(&e, AuthError::Invalid(m) if m.contains("invalid bearer token")),
            "{e:?}"
        );
    }
    assert_eq!(seen.token_reviews.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn our_jwts_and_a_server_without_token_review_cost_no_review() {
    let (client, seen) = apiserver().await;
    let hs256 = "eyJhbGciOiJIUzI1NiJ9.e30.c2ln";
    assert_eq!(
        people(client.clone(), true).by_token(hs256).await.unwrap(),
        None
    );
    assert_eq!(
        people(client, false).by_token("alice-token").await.unwrap(),
        None
    );
    assert_eq!(seen.token_reviews.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn access_is_what_the_subject_access_review_says_cached_per_namespace() {
    let (client, seen) = apiserver().await;
    let p = people(client, true);
    let alice = p.by_token("alice-token").await.unwrap().unwrap();
    let bob = p.by_token("bob-token").await.unwrap().unwrap();
    assert!(p.may_see(&alice, "team-a").await.unwrap());
    assert!(!p.may_see(&alice, "team-b").await.unwrap());
    assert!(!p.may_see(&bob, "team-a").await.unwrap());
    assert_eq!(seen.access_reviews.load(Ordering::SeqCst), 3);
    let specs = seen.specs.lock().unwrap().clone();
    let first_sar = specs
        .iter()
        .find(|s| s.get("resourceAttributes").is_some())
        .unwrap();
    assert_eq!(first_sar["user"], "alice");
    assert_eq!(
        first_sar["resourceAttributes"],
        json!({"namespace": "team-a", "verb": "get", "group": "argoproj.io", "resource": "analysisruns"})
    );
    // every answer is reused for ACCESS_TTL: a page of many runs costs one review a namespace
    for _ in 0..10 {
        assert!(p.may_see(&alice, "team-a").await.unwrap());
        assert!(!p.may_see(&alice, "team-b").await.unwrap());
    }
    assert_eq!(seen.access_reviews.load(Ordering::SeqCst), 3);
    // the same user with other groups is another subject
    let alice_alone = Person {
        groups: Vec::new(),
        ..alice.clone()
    };
    assert!(!p.may_see(&alice_alone, "team-a").await.unwrap());
    assert_eq!(seen.access_reviews.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn an_apiserver_that_cannot_answer_is_unavailable_and_not_remembered() {
    let client =
        kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let p = people(client, true);
    let e = p.by_token("alice-token").await.unwrap_err();
    assert!(matches!(e, AuthError::Unavailable(_)), "{e:?}");
    let alice = Person {
        user: "alice".into(),
        groups: vec!["team-a".into()],
        via: PersonSource::Token,
    };
    let e = p.may_see(&alice, "team-a").await.unwrap_err();
    assert!(matches!(e, AuthError::Unavailable(_)), "{e:?}");
    assert_eq!(p.cached(), 0);
}

#[tokio::test]
async fn the_access_cache_is_bounded() {
    let (client, seen) = apiserver().await;
    let p = people(client, true);
    let alice = p.by_token("alice-token").await.unwrap().unwrap();
    for i in 0..ACCESS_MAX + 50 {
        p.may_see(&alice, &format!("ns-{i}")).await.unwrap();
        assert!(p.access_cached() <= ACCESS_MAX);
    }
    assert_eq!(seen.access_reviews.load(Ordering::SeqCst), ACCESS_MAX + 50);
}

fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.insert(*k, HeaderValue::from_str(v).unwrap());
    }
    h
}

#[tokio::test]
async fn proxy_headers_count_only_from_the_proxy() {
    let (client, seen) = apiserver().await;
    let p = people(client.clone(), true);
    let peer = |s: &str| Some(s.parse::<SocketAddr>().unwrap());
    let h = headers(&[
        ("x-forwarded-user", "carol@example.com"),
        ("x-forwarded-groups", "team-a, ops,,"),
    ]);
    let carol = p.by_proxy(&h, peer("10.9.3.4:5000")).unwrap().unwrap();
    assert_eq!(carol.user, "carol@example.com");
    assert_eq!(carol.groups, ["team-a", "ops"]);
    assert_eq!(carol.via, PersonSource::Proxy);
    // the same headers from anyone else: nobody
    assert_eq!(p.by_proxy(&h, peer("10.8.3.4:5000")).unwrap(), None);
    assert_eq!(p.by_proxy(&h, peer("127.0.0.1:5000")).unwrap(), None);
    assert_eq!(p.by_proxy(&h, None).unwrap(), None);
    // from the proxy, but without a user: nobody
    let no_user = headers(&[("x-forwarded-user", " "), ("x-forwarded-groups", "team-a")]);
    assert_eq!(p.by_proxy(&no_user, peer("10.9.0.1:1")).unwrap(), None);
    // no proxy configured: never
    let none = ControlPlanePeople::new(
        client,
        PeopleConfig {
            token_review: true,
            proxy: None,
        },
    );
    assert_eq!(none.by_proxy(&h, peer("10.9.3.4:5000")).unwrap(), None);
    assert_eq!(seen.token_reviews.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_proxy_never_vouches_for_system_users_or_groups() {
    let (client, _) = apiserver().await;
    let p = people(client, true);
    let from_proxy = Some("10.9.3.4:5000".parse::<SocketAddr>().unwrap());
    let h = headers(&[
        ("x-forwarded-user", "dave"),
        ("x-forwarded-groups", "system:masters, team-a,system:nodes"),
    ]);
    let dave = p.by_proxy(&h, from_proxy).unwrap().unwrap();
    assert_eq!(dave.groups, ["team-a"], "system: groups are dropped");
    let root = headers(&[("x-forwarded-user", "system:admin")]);
    let e = p.by_proxy(&root, from_proxy).unwrap_err();
    assert_eq!(e, AuthError::SystemIdentity("system:admin".into()));
    assert!(e.to_string().contains("reserved `system:` prefix"), "{e}");
}
