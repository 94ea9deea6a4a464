//! Forged Job references: what a tenant with `edit` on its namespace can write into its
//! AnalysisRun's status (the CRD has no status subresource), which the Rollouts controller then
//! sends with its own, all-projects token on Resume and Terminate. Every forged reference is
//! refused with `403 forbidden` (an `Error` measurement) naming the problem, and no destination
//! is written to, deleted from or read logs from. The genuine path still works.

use anyhow::{ensure, Result};
use dispatch_api::v1::{self, Ensured, MeasurementRef};
use dispatch_server::engine::{JobRef, Placement, REF_KEY};
use dispatch_server::signing::Signer;

use crate::scene::{measurement, plugin_token, signer, Reply, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};

/// Two runs of project `team-a` on destination `a`, one of `team-b` on `b`, each ensured by
/// the controller, so each holds the genuine reference the server handed out.
struct Tenants {
    scene: Scene,
    /// the Rollouts controller's token: every project
    controller: String,
    a1: MeasurementRef,
    a2: MeasurementRef,
    b1: MeasurementRef,
}

async fn tenants() -> Result<Tenants> {
    let scene = Scene::start(TENANTS_POLICY).await?;
    let controller = plugin_token("argo-rollouts", Some(&["*"]));
    let mut runs = Vec::new();
    for (run, dest) in [
        (("team-a", "run-a1", "uid-a1"), "a"),
        (("team-a", "run-a2", "uid-a2"), "a"),
        (("team-b", "run-b1", "uid-b1"), "b"),
    ] {
        let mut req = measurement(run, "smoke", 1, dest);
        let reply = scene.post(v1::ENSURE, &controller, &req).await?;
        ensure!(reply.status == 200, "ensure {run:?}: {:?}", reply.body);
        let ensured: Ensured = serde_json::from_value(reply.body)?;
        req.metadata = ensured.metadata;
        runs.push(req);
    }
    let [a1, a2, b1] = <[MeasurementRef; 3]>::try_from(runs).expect("three runs");
    Ok(Tenants {
        scene,
        controller,
        a1,
        a2,
        b1,
    })
}

/// The reference in a measurement's metadata, as the server wrote it.
fn reference(m: &MeasurementRef) -> JobRef {
    JobRef::from_metadata(&m.metadata).expect("a reference")
}

/// `m` with `r` (as is: signed or not) in its metadata.
fn with_ref(m: &MeasurementRef, r: &JobRef) -> MeasurementRef {
    let mut out = m.clone();
    out.metadata
        .insert(REF_KEY.into(), serde_json::to_string(r).expect("json"));
    out
}

/// A reference of run `a1` re-signed after `edit`, with the scene server's own key: what a
/// leaked key (or a server bug) would allow; the checks after the signature must still hold.
fn signed_by_server(t: &Tenants, edit: impl FnOnce(&mut JobRef)) -> MeasurementRef {
    let mut r = reference(&t.a1);
    edit(&mut r);
    with_ref(&t.a1, &r.signed(&signer()))
}

/// Sends `req` to status and to terminate with the controller's token; each must be refused
/// with a message containing `expect`, with no destination call. `victim`: the Job of another
/// project the forged reference aims at (a read or delete of it is a cross-tenant one).
async fn refused_everywhere(
    t: &Tenants,
    name: &str,
    req: &MeasurementRef,
    expect: &str,
    victim: Option<&str>,
) -> Result<()> {
    for route in [v1::STATUS, v1::TERMINATE] {
        let before = t.scene.calls_mark();
        let reply: Reply = t.scene.post(route, &t.controller, req).await?;
        let calls = t.scene.calls_since(before);
        let message = reply.body["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let case = format!("references: {name} → {route}");
        let outcome = Outcome {
            refused: reply.status == 403 && calls.is_empty(),
            cross_tenant_read: victim.is_some() && route == v1::STATUS && reply.status == 200,
            cross_tenant_delete: victim.is_some_and(|job| {
                calls
                    .iter()
                    .any(|c| c.contains("DELETE") && c.contains(job))
            }),
            secret_leak: false,
            ..Outcome::default()
        };
        tally::record(&case, &outcome);
        ensure!(calls.is_empty(), "{case}: destination calls {calls:?}");
        ensure!(
            reply.status == 403,
            "{case}: {} {:?}",
            reply.status,
            reply.body
        );
        ensure!(
            reply.body["code"] == "forbidden",
            "{case}: {:?}",
            reply.body
        );
        ensure!(
            message.contains(expect) && message.contains("No Job was read or deleted"),
            "{case}: the message must say {expect:?}: {message}"
        );
        ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
    }
    Ok(())
}

#[tokio::test]
async fn forged_references_are_refused_before_any_destination_call() -> Result<()> {
    let t = tenants().await?;
    let genuine = reference(&t.a1);
    let b1 = reference(&t.b1);
    let b1_job = b1.name.clone();
    ensure!(
        genuine.sig.starts_with("v1.") && b1.sig.starts_with("v1."),
        "ensure hands out signed references: {genuine:?}"
    );

    let unsigned = JobRef {
        sig: String::new(),
        ..genuine.clone()
    };
    let by_other_key = {
        let other = Signer::new(&[b"a-key-the-server-never-had-0123456789abcdef".to_vec()])?;
        unsigned.clone().signed(&other)
    };
    let other_destination = JobRef {
        name: b1_job.clone(),
        placements: b1.placements.clone(),
        ..genuine.clone()
    };
    let mut other_namespace = genuine.clone();
    other_namespace.placements[0].namespace = "kube-system".into();
    let mut foreign_name = genuine.clone();
    foreign_name.name = "kube-proxy-upgrade".into();
    let mut many = genuine.clone();
    many.placements = (0..10_000)
        .map(|i| Placement {
            destination: if i % 2 == 0 { "a" } else { "b" }.into(),
            namespace: format!("ns-{i}"),
        })
        .collect();

    let cases: Vec<(&str, MeasurementRef, &str, Option<&str>)> = vec![
        (
            "unsigned reference",
            with_ref(&t.a1, &unsigned),
            "carries no signature",
            None,
        ),
        (
            "reference signed by another key",
            with_ref(&t.a1, &by_other_key),
            "which this server does not hold",
            None,
        ),
        (
            "genuine reference of another run uid",
            with_ref(&t.a1, &reference(&t.a2)),
            "belongs to run team-a/run-a2 (uid uid-a2)",
            None,
        ),
        (
            "project B's genuine reference replayed in project A's run",
            with_ref(&t.a1, &b1),
            "belongs to run team-b/run-b1 (uid uid-b1)",
            Some(&b1_job),
        ),
        (
            "other destination and Job edited into a genuine reference",
            with_ref(&t.a1, &other_destination),
            "changed after it was signed",
            Some(&b1_job),
        ),
        (
            "other namespace edited into a genuine reference",
            with_ref(&t.a1, &other_namespace),
            "changed after it was signed",
            None,
        ),
        (
            "foreign Job name edited into a genuine reference",
            with_ref(&t.a1, &foreign_name),
            "changed after it was signed",
            None,
        ),
        (
            "10 000 placements edited into a genuine reference",
            with_ref(&t.a1, &many),
            "changed after it was signed",
            None,
        ),
        (
            "unreadable reference",
            {
                let mut m = t.a1.clone();
                m.metadata.insert(REF_KEY.into(), "{\"runUid\":".into());
                m
            },
            "unreadable",
            None,
        ),
        // Under the server's own key (a leaked key, a server bug): the other checks still hold.
        (
            "foreign Job name under the server's key",
            signed_by_server(&t, |r| r.name = b1_job.clone()),
            "is not the name of measurement 1 of this run and metric",
            Some(&b1_job),
        ),
        (
            "another project's destination under the server's key",
            signed_by_server(&t, |r| r.placements = b1.placements.clone()),
            "policy denies project \"team-a\" the destination \"b\"",
            None,
        ),
        (
            "10 000 placements under the server's key",
            signed_by_server(&t, |r| r.placements.extend(many.placements.clone())),
            "policy denies project \"team-a\"",
            None,
        ),
    ];
    for (name, req, expect, victim) in &cases {
        refused_everywhere(&t, name, req, expect, *victim).await?;
    }
    // The other project's Job is still there, and its own reference still reads it.
    let reply = t.scene.post(v1::STATUS, &t.controller, &t.b1).await?;
    ensure!(
        reply.status == 200 && reply.body["phase"] == "Running",
        "team-b's measurement is unaffected: {:?}",
        reply.body
    );
    Ok(())
}

#[tokio::test]
async fn gc_never_reaches_a_destination_the_policy_denies_the_run() -> Result<()> {
    let t = tenants().await?;
    let before = t.scene.calls_mark();
    // Project A's run, with a block naming project B's destination.
    let req = v1::GcRequest {
        run: t.a1.run.clone(),
        metric: "smoke".into(),
        limit: 0,
        block: measurement(("team-a", "run-a1", "uid-a1"), "smoke", 1, "b").block,
    };
    let reply = t.scene.post(v1::GC, &t.controller, &req).await?;
    let calls = t.scene.calls_since(before);
    let outcome = Outcome {
        refused: reply.status == 403 && calls.is_empty(),
        cross_tenant_delete: calls.iter().any(|c| c.starts_with("b:")),
        ..Outcome::default()
    };
    let case = "references: gc of project A's run on project B's destination";
    tally::record(case, &outcome);
    ensure!(calls.is_empty(), "{case}: {calls:?}");
    ensure!(
        reply.status == 403
            && reply.body["message"]
                .as_str()
                .is_some_and(|m| m.contains("policy denies project \"team-a\"")),
        "{case}: {} {:?}",
        reply.status,
        reply.body
    );
    ensure!(outcome == Outcome::refused(), "{case}: {outcome:?}");
    Ok(())
}

#[tokio::test]
async fn the_genuine_reference_still_reads_and_terminates_exactly_its_job() -> Result<()> {
    let t = tenants().await?;
    let before = t.scene.calls_mark();
    let status = t.scene.post(v1::STATUS, &t.controller, &t.a1).await?;
    ensure!(
        status.status == 200 && status.body["phase"] == "Running",
        "{:?}",
        status.body
    );
    // The reference that comes back is signed too: the next call accepts it.
    let verdict: v1::Verdict = serde_json::from_value(status.body)?;
    let mut next = t.a1.clone();
    next.metadata.extend(verdict.metadata);
    ensure!(reference(&next) == reference(&t.a1), "the same reference");
    // Without a reference the Jobs are located from the request (policy applied).
    let mut bare = t.a1.clone();
    bare.metadata.clear();
    let located = t.scene.post(v1::STATUS, &t.controller, &bare).await?;
    ensure!(located.status == 200, "{:?}", located.body);

    let a1_job = reference(&t.a1).name;
    let reply = t.scene.post(v1::TERMINATE, &t.controller, &next).await?;
    ensure!(reply.status == 200, "{:?}", reply.body);
    let calls = t.scene.calls_since(before);
    ensure!(
        calls.len() == 1
            && calls[0].starts_with("a: DELETE ")
            && calls[0].contains(&format!("/namespaces/verify/jobs/{a1_job}")),
        "terminate deletes exactly run a1's Job: {calls:?}"
    );
    let b1 = t.scene.post(v1::STATUS, &t.controller, &t.b1).await?;
    ensure!(b1.body["phase"] == "Running", "{:?}", b1.body);
    Ok(())
}

/// A tenant copies the signed reference of a measurement that passed into the next measurement
/// of the same metric (index 2), so that the later one reads the earlier Job's verdict instead of
/// running its own check. The reference names its measurement index, which is signed: refused.
#[tokio::test]
async fn a_passed_measurements_reference_is_no_later_measurements_verdict() -> Result<()> {
    let t = tenants().await?;
    let job = reference(&t.a1).name;
    crate::cluster_side::finish_job(t.scene.world.api("a"), &job, "Complete", "Completed", "");
    let d = t.scene.world.destination("a")?;
    crate::world::eventually("the passed Job in the cache", || {
        let done = d
            .jobs()
            .get("verify", &job)
            .is_some_and(|j| dispatch_server::job::lifecycle::has_ended(&j));
        async move { Ok(done.then_some(())) }
    })
    .await?;
    let first = t.scene.post(v1::STATUS, &t.controller, &t.a1).await?;
    ensure!(
        first.body["phase"] == "Successful",
        "measurement 1 passed: {:?}",
        first.body
    );
    let mut second = t.a1.clone();
    second.index = 2;
    refused_everywhere(
        &t,
        "measurement 1's genuine reference in measurement 2",
        &second,
        "metric \"smoke\", measurement 1 and not to this measurement's run team-a/run-a1 (uid uid-a1), metric \"smoke\", measurement 2",
        None,
    )
    .await
}
