//! Attacks on the JWT check; every one must be refused with a reason that says what to fix.
//! (Replaying an agent token for another destination is refused where the destination is
//! known: the agent API.)

use base64::Engine as _;
use serde_json::json;

use super::*;

const KEY: &[u8] = b"the-signing-key-of-this-server-0123456789";
const OTHER_KEY: &[u8] = b"a-key-this-server-does-not-know-0123456789";

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

fn auth() -> JwtAuthenticator {
    JwtAuthenticator::new(&[KEY.to_vec()], ["revoked-id".to_string()])
}

fn claims() -> serde_json::Value {
    json!({"sub": "plugin", "aud": AUDIENCE, "exp": now() + 600, "iat": now(), "jti": "t1",
           "projects": ["*"]})
}

/// Any header and claims, signed with `key` under `alg` (an HMAC algorithm).
fn raw(
    header: serde_json::Value,
    claims: &serde_json::Value,
    key: &[u8],
    alg: Algorithm,
) -> String {
    let b64 = |v: &serde_json::Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
    };
    let input = format!("{}.{}", b64(&header), b64(claims));
    let sig =
        jsonwebtoken::crypto::sign(input.as_bytes(), &EncodingKey::from_secret(key), alg).unwrap();
    format!("{input}.{sig}")
}

fn hs256(claims: &serde_json::Value) -> String {
    raw(
        json!({"alg": "HS256", "typ": "JWT"}),
        claims,
        KEY,
        Algorithm::HS256,
    )
}

fn with(field: &str, value: serde_json::Value) -> serde_json::Value {
    let mut c = claims();
    c[field] = value;
    c
}

fn refused(token: &str) -> AuthError {
    auth()
        .authenticate(token)
        .expect_err("the token must be refused")
}

#[test]
fn a_well_formed_token_is_accepted() {
    let p = auth().authenticate(&hs256(&claims())).unwrap();
    assert_eq!(p.subject, "plugin");
    assert_eq!(p.destination, None);
    assert_eq!(p.projects, Projects::claimed(vec!["*".into()]));
    assert!(p.projects.allows("any-project"));
}

/// Fail closed (#27): no `projects` claim once meant every project.
#[test]
fn a_plugin_token_without_projects_is_refused_and_an_agent_token_acts_for_none() {
    let mut c = claims();
    c.as_object_mut().unwrap().remove("projects");
    let e = refused(&hs256(&c));
    assert_eq!(e, AuthError::NoProjects("plugin".into()));
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    let message = e.to_string();
    assert!(
        message.contains("no `projects` claim")
            && message.contains("token issue --project team-a")
            && message.contains("--project '*' for the Rollouts controller"),
        "{message}"
    );
    c["destination"] = json!("edge");
    let agent = auth().authenticate(&hs256(&c)).unwrap();
    assert_eq!(agent.destination.as_deref(), Some("edge"));
    assert!(agent.projects.globs.is_empty() && !agent.projects.allows("team-a"));
    // `null` is no claim either.
    let null = hs256(&with("projects", json!(null)));
    assert!(matches!(refused(&null), AuthError::NoProjects(_)));
}

#[test]
fn the_projects_claim_binds_the_token() {
    let p = auth()
        .authenticate(&hs256(&with("projects", json!(["team-a", "shared-*"]))))
        .unwrap();
    assert!(p.projects.allows("team-a") && p.projects.allows("shared-x"));
    assert!(!p.projects.allows("team-b") && !p.projects.allows("team-a2"));
    assert_eq!(p.projects.bound_by, ScopeSource::TokenClaim);
    // An empty list binds the token to no project at all.
    let none = auth()
        .authenticate(&hs256(&with("projects", json!([]))))
        .unwrap();
    assert!(!none.projects.allows("team-a"));
    // A claim that is not a list of strings is not ignored.
    assert!(matches!(
        refused(&hs256(&with("projects", json!("team-a")))),
        AuthError::Invalid(_)
    ));
}

#[test]
fn a_forged_signature_is_refused() {
    let forged = raw(
        json!({"alg": "HS256"}),
        &claims(),
        OTHER_KEY,
        Algorithm::HS256,
    );
    assert_eq!(
        refused(&forged),
        AuthError::Invalid("signature does not match any configured key".into())
    );
    // Claims swapped under a genuine signature.
    let genuine = hs256(&claims());
    let (head, rest) = genuine.split_once('.').unwrap();
    let sig = rest.rsplit_once('.').unwrap().1;
    let elevated = with("sub", json!("admin"));
    let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&elevated).unwrap());
    assert!(matches!(
        refused(&format!("{head}.{body}.{sig}")),
        AuthError::Invalid(m) if m.contains("signature")
    ));
    // No signature at all.
    let unsigned = genuine.rsplit_once('.').unwrap().0.to_string() + ".";
    assert!(matches!(refused(&unsigned), AuthError::Invalid(_)));
}

#[test]
fn another_audience_is_refused() {
    for aud in [
        "kubernetes",
        "rollouts-dispatch-dev",
        "Rollouts-Dispatch",
        "",
    ] {
        let e = refused(&hs256(&with("aud", json!(aud))));
        assert_eq!(e, AuthError::WrongAudience, "{aud:?}");
    }
    assert!(auth()
        .authenticate(&hs256(&with("aud", json!(["other"]))))
        .is_err());
    // A list that includes ours is not a token for us alone: the claims do not parse.
    assert!(matches!(
        refused(&hs256(&with("aud", json!([AUDIENCE, "other"])))),
        AuthError::Invalid(_)
    ));
}

#[test]
fn expiry_is_enforced_beyond_the_leeway_only() {
    let late = hs256(&with("exp", json!(now() - CLOCK_LEEWAY_SECS - 5)));
    assert_eq!(refused(&late), AuthError::Expired);
    assert!(AuthError::Expired.to_string().contains("check the clocks"));
    let day_old = hs256(&with("exp", json!(now() - 86_400)));
    assert_eq!(refused(&day_old), AuthError::Expired);
    // Within the leeway: a clock a little behind the issuer's is tolerated.
    let just = hs256(&with("exp", json!(now() - CLOCK_LEEWAY_SECS + 10)));
    assert!(auth().authenticate(&just).is_ok());
}

#[test]
fn a_token_not_valid_before_a_future_time_is_refused() {
    let later = hs256(&with("nbf", json!(now() + 3600)));
    let e = refused(&later);
    assert!(matches!(e, AuthError::NotYetValid(_)), "{e:?}");
    assert!(e.to_string().contains("`nbf`"), "{e}");
    assert!(e.to_string().contains("check the clocks"), "{e}");
    // Within the leeway, and in the past: fine.
    let soon = hs256(&with("nbf", json!(now() + CLOCK_LEEWAY_SECS - 10)));
    assert!(auth().authenticate(&soon).is_ok());
    assert!(auth()
        .authenticate(&hs256(&with("nbf", json!(now() - 10))))
        .is_ok());
    // An `nbf` that is not a number is not skipped.
    assert!(matches!(
        refused(&hs256(&with("nbf", json!("tomorrow")))),
        AuthError::Invalid(_)
    ));
}

#[test]
fn a_token_issued_tomorrow_is_a_clock_skew_attack() {
    let tomorrow = now() + 86_400;
    let token = hs256(&with("iat", json!(tomorrow)).tap(|c| c["exp"] = json!(tomorrow + 600)));
    let e = refused(&token);
    assert!(matches!(e, AuthError::NotYetValid(_)), "{e:?}");
    let message = e.to_string();
    assert!(
        message.contains("`iat`") && message.contains("check the clocks"),
        "{message}"
    );
    assert!(
        message.contains(&format!("at most {CLOCK_LEEWAY_SECS}s")),
        "{message}"
    );
    // Just beyond the leeway: refused; within it: a clock slightly ahead is tolerated.
    let ahead = hs256(&with("iat", json!(now() + CLOCK_LEEWAY_SECS + 30)));
    assert!(matches!(refused(&ahead), AuthError::NotYetValid(_)));
    let slightly = hs256(&with("iat", json!(now() + CLOCK_LEEWAY_SECS - 10)));
    assert!(auth().authenticate(&slightly).is_ok());
}

#[test]
fn the_leeway_is_one_minute() {
    assert_eq!(CLOCK_LEEWAY_SECS, 60);
    assert_eq!(auth().validation.leeway, CLOCK_LEEWAY_SECS);
    assert!(auth().validation.validate_nbf);
}

#[test]
fn alg_none_is_refused() {
    for alg in ["none", "None", "NONE"] {
        let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&json!({"alg": alg, "typ": "JWT"})).unwrap());
        let body = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&claims()).unwrap());
        for token in [format!("{header}.{body}."), format!("{header}.{body}")] {
            let e = refused(&token);
            assert!(
                matches!(&e, AuthError::Invalid(m) if m.contains(&format!("{alg:?} is not accepted"))),
                "{alg}: {e:?}"
            );
        }
    }
}

#[test]
fn other_algorithms_with_the_same_key_are_refused() {
    // HS512 with the right key: a valid signature, but not the algorithm we accept.
    let hs512 = raw(json!({"alg": "HS512"}), &claims(), KEY, Algorithm::HS512);
    assert!(
        matches!(refused(&hs512), AuthError::Invalid(m) if m.contains("\"HS512\" is not accepted"))
    );
    let via_jsonwebtoken = jsonwebtoken::encode(
        &Header::new(Algorithm::HS384),
        &claims(),
        &EncodingKey::from_secret(KEY),
    )
    .unwrap();
    assert!(matches!(refused(&via_jsonwebtoken), AuthError::Invalid(m) if m.contains("HS384")));
    // RS256 in the header, HMAC with our secret underneath: the key-confusion attack.
    let confused = raw(json!({"alg": "RS256"}), &claims(), KEY, Algorithm::HS256);
    assert!(
        matches!(refused(&confused), AuthError::Invalid(m) if m.contains("\"RS256\" is not accepted"))
    );
    // An HS256 signature labelled "hs256" (case games) is not HS256 either.
    let lower = raw(json!({"alg": "hs256"}), &claims(), KEY, Algorithm::HS256);
    assert!(matches!(refused(&lower), AuthError::Invalid(_)));
}

#[test]
fn required_claims_must_be_present() {
    for missing in ["exp", "sub", "aud", "iat"] {
        let mut c = claims();
        c.as_object_mut().unwrap().remove(missing);
        let e = refused(&hs256(&c));
        assert!(
            matches!(&e, AuthError::Invalid(m) if m.contains(missing)),
            "{missing}: {e:?}"
        );
    }
    // An `exp` that is not a number does not make the token eternal.
    assert!(matches!(
        refused(&hs256(&with("exp", json!("never")))),
        AuthError::Invalid(_)
    ));
    assert!(matches!(
        refused(&hs256(&with("exp", json!(null)))),
        AuthError::Invalid(_)
    ));
}

#[test]
fn revoked_ids_and_garbage_are_refused() {
    assert_eq!(
        refused(&hs256(&with("jti", json!("revoked-id")))),
        AuthError::Revoked("revoked-id".into())
    );
    for garbage in [
        "",
        ".",
        "..",
        "a.b.c",
        "not a token",
        "eyJhbGciOiJIUzI1NiJ9",
    ] {
        assert!(
            matches!(refused(garbage), AuthError::Invalid(_)),
            "{garbage:?}"
        );
    }
}

#[test]
fn a_revocations_file_holds_one_id_per_line_with_comments() {
    let ids = parse_revoked("# leaked 2026-11-30\nabc123\n\n  def456  # laptop stolen\n#ghi\n");
    assert_eq!(
        ids,
        ["abc123", "def456"].map(String::from).into_iter().collect()
    );
}

/// Whichever comes first, a JWT's specific refusal beats TokenReview's "not a Kubernetes
/// token" (an HS256 token: refused without asking the apiserver, which is never reached).
#[tokio::test]
async fn a_chain_answers_with_the_most_telling_refusal() {
    let unreachable = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
    let review =
        || TokenReviewAuthenticator::new(unreachable.clone().try_into().unwrap(), vec![], vec![]);
    let expired = hs256(&with("exp", json!(now() - 86_400)));
    for chain in [
        Chain(vec![review().into(), auth().into()]),
        Chain(vec![auth().into(), review().into()]),
    ] {
        assert_eq!(chain.authenticate(&expired).await, Err(AuthError::Expired));
        assert!(chain.authenticate(&hs256(&claims())).await.is_ok());
    }
    let none = Chain(Vec::new()).authenticate(&expired).await;
    assert!(matches!(none, Err(AuthError::Invalid(m)) if m.contains("no authenticator")));
}

/// `let x = v.tap(|x| …)`: change a value in an expression.
trait Tap: Sized {
    fn tap(mut self, f: impl FnOnce(&mut Self)) -> Self {
        f(&mut self);
        self
    }
}
impl Tap for serde_json::Value {}
