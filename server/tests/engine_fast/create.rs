//! `Engine::ensure`: the Job it creates on each destination (name, labels, annotations,
//! injected context), adoption of our own Job (from the cache, or after a 409), refusal of a
//! foreign Job of the same name, target resolution (names, selector, policy) and invalid blocks.

use anyhow::Result;
use dispatch_server::engine::{JobRef, Outcome};
use dispatch_server::job::{self, LABEL_DESTINATION, LABEL_MANAGED, LABEL_RUN_UID};
use dispatch_server::verdict::DestState;
use dispatch_server::{EngineError, Phase};
use serde_json::json;

use crate::cluster_side::{foreign_job, job, job_names, jobs};
use crate::world::{
    as_another_replica_builds_it, block, request, run, World, FREIGHT_COLLECTION, NS, PROJECT,
    PROMOTION,
};
use dispatch_server::signing::Signer;

#[tokio::test]
async fn ensure_creates_the_job_with_its_identity_and_context_on_every_destination() -> Result<()> {
    let w = World::start("").await?;
    let run = run(1);
    let req = request(&run, "smoke", 1, block(json!({"destination": "a,b"}))?);
    let ensured = w.engine.ensure(&req).await?;

    let name = job::job_name(&run.uid, "smoke", 1);
    assert_eq!(ensured.job.name, name);
    assert_eq!(
        ensured.outcomes,
        vec![
            ("a".into(), Outcome::Created),
            ("b".into(), Outcome::Created)
        ]
    );
    assert_eq!(ensured.verdict.phase, Phase::Running);
    assert_eq!(ensured.verdict.metadata["job-name"], name);
    assert_eq!(ensured.verdict.metadata["job-namespace"], NS);
    for d in ["a", "b"] {
        let api = w.api(d);
        assert_eq!(
            api.calls("POST", "/apis/batch/v1/namespaces/verify/jobs"),
            1
        );
        let j = job(api, &name)?;
        let labels = j.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels[LABEL_MANAGED], "true");
        assert_eq!(labels[LABEL_RUN_UID], run.uid);
        assert_eq!(labels[LABEL_DESTINATION], d);
        let ann = j.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(ann[job::ANN_METRIC], "smoke");
        assert_eq!(ann[job::ANN_MEASUREMENT], "1");
        assert_eq!(ann[job::ANN_RUN_NAME], run.name);
        assert_eq!(ann[job::ANN_KARGO_STAGE], "uat");
        let pod = j.spec.unwrap_or_default().template;
        let tlabels = pod.metadata.unwrap_or_default().labels.unwrap_or_default();
        assert_eq!(
            tlabels[LABEL_MANAGED], "true",
            "pods must be selectable by the cache"
        );
        let env: Vec<(String, String)> = pod.spec.unwrap_or_default().containers[0]
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value.unwrap_or_default()))
            .collect();
        let value = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(value("KARGO_PROJECT"), Some(PROJECT));
        assert_eq!(value("KARGO_STAGE"), Some("uat"));
        assert_eq!(value("KARGO_FREIGHT_COLLECTION"), Some(FREIGHT_COLLECTION));
        assert_eq!(value("KARGO_PROMOTION"), Some(PROMOTION));
        assert_eq!(value("DISPATCH_DESTINATION"), Some(d));
        assert_eq!(value("ANALYSIS_RUN_UID"), Some(run.uid.as_str()));
        assert_eq!(
            value("ANALYSIS_METRIC"),
            Some("set-by-user"),
            "user env wins"
        );
    }
    // `locate` finds the same Jobs without creating anything (it does not know when they were
    // created, so it gives no deadline).
    let located = w.engine.locate(&req).await?;
    assert_eq!(
        located,
        JobRef {
            deadline: 0,
            ..ensured.job.clone()
        }
    );
    assert_eq!(w.api("a").calls("POST", "/jobs"), 1);
    Ok(())
}

/// A re-verification requested by annotating the Stage carries no annotation at all (Kargo
/// v1.11 adds `kargo.akuity.io/promotion` only to a collection's first verification and to a
/// reverify through its API: akuity/kargo v1.11.2 pkg/controller/stages/regular_stages.go:1540-1546):
/// its Job has the Stage and the collection, and no promotion.
#[tokio::test]
async fn a_reverification_without_annotations_gets_its_job_without_a_promotion() -> Result<()> {
    let w = World::start("").await?;
    let mut run = run(7);
    run.annotations.clear();
    let req = request(&run, "smoke", 1, block(json!({"destination": "a"}))?);
    let ensured = w.engine.ensure(&req).await?;
    assert_eq!(ensured.outcomes, vec![("a".into(), Outcome::Created)]);
    let j = job(w.api("a"), &ensured.job.name)?;
    let ann = j.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(ann[job::ANN_KARGO_STAGE], "uat");
    assert_eq!(ann[job::ANN_KARGO_FREIGHT_COLLECTION], FREIGHT_COLLECTION);
    assert!(!ann.contains_key(job::ANN_KARGO_PROMOTION), "{ann:?}");
    let env = j
        .spec
        .unwrap_or_default()
        .template
        .spec
        .unwrap_or_default()
        .containers[0]
        .env
        .clone()
        .unwrap_or_default();
    let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
    assert!(
        names.contains(&"KARGO_STAGE") && names.contains(&"KARGO_FREIGHT_COLLECTION"),
        "{names:?}"
    );
    assert!(!names.contains(&"KARGO_PROMOTION"), "{names:?}");
    Ok(())
}

#[tokio::test]
async fn a_retry_adopts_our_job_from_the_cache_without_an_api_call() -> Result<()> {
    let w = World::start("").await?;
    let req = request(&run(2), "smoke", 1, block(json!({"destination": "a"}))?);
    let first = w.engine.ensure(&req).await?;
    w.cached("a", &first.job.name, true).await?;
    // Creates and reads of this Job; the caches' own lists and watches (which a loaded machine
    // may still be starting) are not the engine asking.
    let job_calls = || {
        w.api("a")
            .requests()
            .iter()
            .filter(|r| r.method != "GET" || r.path.ends_with(&first.job.name))
            .count()
    };
    let before = job_calls();
    let again = w.engine.ensure(&req).await?;
    assert_eq!(again.outcomes, vec![("a".into(), Outcome::Adopted)]);
    assert_eq!(
        again.job,
        dispatch_server::engine::JobRef {
            deadline: again.job.deadline,
            ..first.job.clone()
        }
    );
    assert_eq!(job_calls(), before, "the cache answered");
    assert_eq!(job_names(w.api("a")), vec![first.job.name.clone()]);
    Ok(())
}

#[tokio::test]
async fn a_job_another_replica_just_created_is_adopted_after_the_conflict() -> Result<()> {
    let w = World::start("").await?;
    let run = run(3);
    let req = request(&run, "smoke", 1, block(json!({"destination": "a"}))?);
    // The other replica's Job is there, but its watch event has not reached our cache yet.
    w.api("a").hold_watches(true);
    w.api("a")
        .put(&jobs(), as_another_replica_builds_it(&w, &req)?);
    let ensured = w.engine.ensure(&req).await?;
    assert_eq!(ensured.outcomes, vec![("a".into(), Outcome::Adopted)]);
    let name = &ensured.job.name;
    assert_eq!(
        w.api("a").calls("POST", "/jobs"),
        1,
        "tried to create first"
    );
    assert_eq!(
        w.api("a").calls("GET", &format!("/jobs/{name}")),
        1,
        "then read it"
    );
    w.api("a").hold_watches(false);
    w.cached("a", name, true).await?;
    Ok(())
}

#[tokio::test]
async fn a_job_with_our_labels_but_another_key_s_mark_is_refused_not_adopted() -> Result<()> {
    let w = World::start("").await?;
    let req = request(&run(31), "smoke", 1, block(json!({"destination": "a"}))?);
    let mut theirs = as_another_replica_builds_it(&w, &req)?;
    // What a replica with another key (or a forger) writes.
    let other = Signer::new(&[b"not-the-replicas-key-0123456789abcdef".to_vec()])?;
    job::mark::stamp(&mut theirs, &other, &req.run.uid);
    w.api("a").put(&jobs(), theirs);
    w.cached("a", &job::job_name(&req.run.uid, "smoke", 1), true)
        .await?;
    let ensured = w.engine.ensure(&req).await?;
    assert!(
        matches!(&ensured.outcomes[0].1, Outcome::NotCreated(DestState::Error(m)) if m.contains("does not verify")),
        "{:?}",
        ensured.outcomes
    );
    assert_eq!(
        w.api("a").calls("POST", "/jobs"),
        0,
        "nothing created over it"
    );
    Ok(())
}

#[tokio::test]
async fn a_job_being_deleted_is_created_again_on_the_next_attempt() -> Result<()> {
    let w = World::start("").await?;
    let run = run(4);
    let req = request(&run, "smoke", 1, block(json!({"destination": "a"}))?);
    let name = job::job_name(&run.uid, "smoke", 1);
    // The name is taken (409), and the Job is gone by the time the engine reads it (404).
    w.api("a").hold_watches(true);
    foreign_job(w.api("a"), &name, json!({}));
    w.api("a").fail("GET", &format!("/jobs/{name}"), 404, 1);
    let ensured = w.engine.ensure(&req).await?;
    let Outcome::NotCreated(DestState::Unavailable(m)) = &ensured.outcomes[0].1 else {
        panic!("expected Unavailable, got {:?}", ensured.outcomes);
    };
    assert!(m.contains("is being deleted"), "{m}");
    assert!(ensured.verdict.retryable, "{:?}", ensured.verdict);
    Ok(())
}

#[tokio::test]
async fn a_foreign_job_with_the_same_name_is_refused_and_left_alone() -> Result<()> {
    let w = World::start("").await?;
    let run = run(5);
    let name = job::job_name(&run.uid, "smoke", 1);
    // On a: not ours at all (the cache never sees it). On b: ours, but of another run.
    let on_a = foreign_job(w.api("a"), &name, json!({"app": "theirs"}));
    let on_b = foreign_job(
        w.api("b"),
        &name,
        json!({LABEL_MANAGED: "true", LABEL_RUN_UID: "another-run"}),
    );
    w.cached("b", &name, true).await?;
    let req = request(&run, "smoke", 1, block(json!({"destination": "a,b"}))?);
    let ensured = w.engine.ensure(&req).await?;
    let refusal = |i: usize| match &ensured.outcomes[i].1 {
        Outcome::NotCreated(DestState::Error(m)) => m.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(
        refusal(0).contains("already exists and is not ours"),
        "{}",
        refusal(0)
    );
    assert!(
        refusal(0).contains("not created by rollouts-dispatch"),
        "{}",
        refusal(0)
    );
    assert!(
        refusal(1).contains("belongs to another AnalysisRun"),
        "{}",
        refusal(1)
    );
    assert_eq!(ensured.verdict.phase, Phase::Error);
    assert_eq!(
        w.api("b").calls("POST", "/jobs"),
        0,
        "b's refusal came from the cache"
    );

    // Terminate must not delete them either.
    let report = w.engine.terminate(&ensured.job).await;
    assert_eq!(report.failed.len(), 2, "{report:?}");
    assert!(
        report
            .failed
            .iter()
            .all(|(_, e)| e.contains("refusing to delete")),
        "{report:?}"
    );
    assert_eq!(w.api("a").get(&jobs(), NS, &name), Some(on_a));
    assert_eq!(w.api("b").get(&jobs(), NS, &name), Some(on_b));
    Ok(())
}

#[tokio::test]
async fn targets_come_from_names_selectors_and_the_policy() -> Result<()> {
    let policy = format!(
        "policy: {{rules: [{{projects: [{PROJECT}], destinations: [a], namespaces: [{NS}, other]}}]}}"
    );
    let w = World::start(&policy).await?;
    let run = run(6);
    let ensure = |routing: serde_json::Value, n: u32| {
        let w = &w;
        let run = &run;
        async move {
            let req = request(run, "smoke", n, block(routing)?);
            Ok::<_, anyhow::Error>(w.engine.ensure(&req).await)
        }
    };
    // A selector over both destinations keeps the one the policy allows.
    let sel = ensure(json!({"destinationSelector": "env=prod"}), 1).await??;
    assert_eq!(sel.outcomes, vec![("a".into(), Outcome::Created)]);
    // A namespace of the block overrides the destination's.
    let other = ensure(json!({"destination": "a", "namespace": "other"}), 2).await??;
    assert_eq!(other.job.placements[0].namespace, "other");
    assert_eq!(w.api("a").calls("POST", "/namespaces/other/jobs"), 1);
    // Named, b is denied with the key to change (by name: a destination the project may use
    // nowhere is refused alike whether or not it exists).
    let denied = ensure(json!({"destination": "b"}), 3).await?.unwrap_err();
    assert!(
        matches!(denied, EngineError::DestinationDenied(_)),
        "{denied}"
    );
    assert!(denied.to_string().contains("policy.rules"), "{denied}");
    // A namespace the project's rule does not list is denied with the namespaces it does.
    let elsewhere = ensure(json!({"destination": "a", "namespace": "kube-system"}), 3)
        .await?
        .unwrap_err();
    assert!(matches!(elsewhere, EngineError::Denied(_)), "{elsewhere}");
    // A name no rule of the project lists, known or not, names the project's own rules only.
    let unknown = ensure(json!({"destination": "nowhere"}), 4)
        .await?
        .unwrap_err();
    assert!(
        matches!(unknown, EngineError::DestinationDenied(_))
            && unknown
                .to_string()
                .contains("the rules for this project allow destinations a;"),
        "{unknown}"
    );
    let none = ensure(json!({"destinationSelector": "env=dev"}), 5)
        .await?
        .unwrap_err();
    assert!(matches!(none, EngineError::NoMatch { .. }), "{none}");
    assert!(w.api("b").list(&jobs()).is_empty(), "nothing reached b");
    Ok(())
}

#[tokio::test]
async fn an_invalid_job_creates_nothing_anywhere() -> Result<()> {
    let w = World::start("").await?;
    let mut config = block(json!({"destination": "a,b"}))?;
    config
        .job_spec_mut()
        .expect("a spec block")
        .insert("completions".into(), json!("all of them"));
    let err = w
        .engine
        .ensure(&request(&run(7), "smoke", 1, config))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidJob { .. }), "{err}");
    assert!(err.to_string().contains("metric \"smoke\""), "{err}");
    for d in ["a", "b"] {
        assert_eq!(w.api(d).calls("POST", "/jobs"), 0);
    }
    Ok(())
}
