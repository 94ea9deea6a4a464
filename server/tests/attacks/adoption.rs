//! Adoption hijack: a tenant who may create Jobs in a shared verification namespace writes the
//! Job of another project's next measurement first (its name is predictable, our labels are
//! public) with a command that passes, or replaces our Job after we created it. The Job is
//! never adopted and its result never becomes the other project's verdict: only a Job with the
//! server's mark (`job::mark`) for that run and pod template is ours. A planted Job ends the
//! victim's measurement at `ensure` (`422 refused_by_destination`); a replaced one at `status`.

use anyhow::{ensure, Result};
use dispatch_api::v1::{self, Ensured, MeasurementRef};
use dispatch_server::job::{self, mark::ANN_MARK, LABEL_RUN_UID};
use serde_json::{json, Value};

use crate::cluster_side::{finish_job, job as stored_job, jobs};
use crate::scene::{measurement, plugin_token, Scene};
use crate::tally::{self, Outcome};

/// Both projects may run Jobs in namespace `verify` of destination `a`.
const SHARED_NAMESPACE: &str = "policy: {rules: [\
    {projects: [team-a, team-b], destinations: [a], namespaces: [verify]}]}";

const VICTIM: (&str, &str, &str) = ("team-a", "run-a1", "uid-a1");
const ATTACKER: (&str, &str, &str) = ("team-b", "run-b1", "uid-b1");

/// Ensures `m` with the controller's token; the reply's metadata goes into `m`.
async fn ensure_as_controller(scene: &Scene, m: &mut MeasurementRef) -> Result<()> {
    let reply = scene
        .post(v1::ENSURE, &plugin_token("argo-rollouts", Some(&["*"])), m)
        .await?;
    ensure!(reply.status == 200, "ensure: {:?}", reply.body);
    let ensured: Ensured = serde_json::from_value(reply.body)?;
    m.metadata = ensured.metadata;
    Ok(())
}

/// The victim's call on `route` after the attack, with the controller's token. Refused: an
/// `ensure` after a Job was planted under its name fails at once (`422
/// refused_by_destination`); a `status` after our Job was replaced is `Error`; either names the
/// mark (`expect`). A planted Job's result read as the victim's verdict is a cross-tenant read.
async fn judge(
    scene: &Scene,
    route: &str,
    case: &str,
    victim: &MeasurementRef,
    expect: &str,
) -> Result<()> {
    let reply = scene
        .post(route, &plugin_token("argo-rollouts", Some(&["*"])), victim)
        .await?;
    let text = |k: &str| reply.body[k].as_str().unwrap_or_default().to_string();
    let (phase, message) = (text("phase"), text("message"));
    let refused = if route == v1::ENSURE {
        reply.status == 422 && text("code") == "refused_by_destination"
    } else {
        reply.status == 200 && phase == "Error"
    };
    let case = format!("adoption: {case}");
    let outcome = Outcome {
        refused: refused && message.contains(expect),
        cross_tenant_read: (route == v1::ENSURE && reply.status == 200) || phase == "Successful",
        ..Outcome::default()
    };
    tally::record(&case, &outcome);
    ensure!(
        outcome == Outcome::refused(),
        "{case}: {} {:?}",
        reply.status,
        reply.body
    );
    Ok(())
}

/// A Job as the Job controller leaves it after it passed.
fn passed(mut job: Value) -> Value {
    job["status"] = json!({"succeeded": 1, "conditions": [{
        "type": "Complete", "status": "True", "reason": "Completed", "message": "",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "lastProbeTime": "2026-01-01T00:00:00Z"}]});
    job
}

#[tokio::test]
async fn a_look_alike_job_without_our_mark_is_never_the_verdict() -> Result<()> {
    let scene = Scene::start(SHARED_NAMESPACE).await?;
    let victim = measurement(VICTIM, "smoke", 1, "a");
    let name = job::job_name(VICTIM.2, "smoke", 1);
    scene.world.api("a").put(
        &jobs(),
        passed(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "verify", "labels": {
                job::LABEL_MANAGED: "true", LABEL_RUN_UID: VICTIM.2}},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "x", "command": ["true"]}]}}}
        })),
    );
    scene.world.cached("a", &name, true).await?;
    judge(
        &scene,
        v1::ENSURE,
        "a look-alike Job without a mark",
        &victim,
        ANN_MARK,
    )
    .await
}

#[tokio::test]
async fn the_mark_of_the_attackers_own_job_does_not_carry_over() -> Result<()> {
    let scene = Scene::start(SHARED_NAMESPACE).await?;
    let mut own = measurement(ATTACKER, "smoke", 1, "a");
    ensure_as_controller(&scene, &mut own).await?;
    let own_name = job::job_name(ATTACKER.2, "smoke", 1);
    let genuine = serde_json::to_value(stored_job(scene.world.api("a"), &own_name)?)?;
    ensure!(
        job::mark::of(&genuine).is_some(),
        "the attacker's own Job is marked: {genuine}"
    );

    // Same spec and mark, under the victim's next name and run uid.
    let name = job::job_name(VICTIM.2, "smoke", 1);
    let mut forged = genuine.clone();
    forged["metadata"] = json!({"name": name, "namespace": "verify",
        "labels": genuine["metadata"]["labels"], "annotations": genuine["metadata"]["annotations"]});
    forged["metadata"]["labels"][LABEL_RUN_UID] = json!(VICTIM.2);
    forged.as_object_mut().map(|o| o.remove("status"));
    scene.world.api("a").put(&jobs(), passed(forged));
    scene.world.cached("a", &name, true).await?;
    let victim = measurement(VICTIM, "smoke", 1, "a");
    judge(
        &scene,
        v1::ENSURE,
        "the mark of another run's Job",
        &victim,
        "does not verify",
    )
    .await
}

#[tokio::test]
async fn our_job_replaced_with_another_command_keeps_no_verdict() -> Result<()> {
    // Replaced under the same name, labels and mark: only the command differs.
    replaced_with(
        "our Job replaced with another command",
        v1::STATUS,
        |j| j["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["true"]),
        "\"command\":[\"true\"]",
    )
    .await
}

/// Replaces the victim's Job (same name, labels and mark) with `edit` applied, waits until the
/// cache holds the replacement (`shows` is in its JSON: the verdict is asked of what the cache
/// sees), then asks `route` as the victim's controller.
async fn replaced_with(case: &str, route: &str, edit: fn(&mut Value), shows: &str) -> Result<()> {
    let scene = Scene::start(SHARED_NAMESPACE).await?;
    let mut victim = measurement(VICTIM, "smoke", 1, "a");
    ensure_as_controller(&scene, &mut victim).await?;
    let name = job::job_name(VICTIM.2, "smoke", 1);
    let replaced = scene.world.api("a").update(&jobs(), "verify", &name, edit);
    ensure!(replaced.is_some(), "the victim's Job exists");
    finish_job(scene.world.api("a"), &name, "Complete", "Completed", "");
    let d = scene.world.destination("a")?;
    crate::world::eventually("the replaced Job in the cache", || {
        let cached = d.jobs().get("verify", &name);
        async move {
            let text = cached.map(|j| serde_json::to_string(&*j).unwrap_or_default());
            Ok(text.filter(|t| t.contains(shows)).map(|_| ()))
        }
    })
    .await?;
    judge(&scene, route, case, &victim, "does not verify").await
}

/// Our mark copied onto a spec that differs from ours only where the old digest did not look
/// (volumes, mounts, security contexts, the API token): neither reported (`status`) nor adopted
/// (`ensure`).
#[tokio::test]
async fn our_mark_on_a_spec_with_other_volumes_or_privileges_is_not_ours() -> Result<()> {
    type Case = (&'static str, &'static str, fn(&mut Value), &'static str);
    let cases: [Case; 3] = [
        (
            "our mark on a spec with an added hostPath volume",
            v1::STATUS,
            |j| {
                let pod = &mut j["spec"]["template"]["spec"];
                pod["volumes"] = json!([{"name": "host", "hostPath": {"path": "/var/run"}}]);
                pod["containers"][0]["volumeMounts"] =
                    json!([{"name": "host", "mountPath": "/host"}]);
            },
            "/var/run",
        ),
        (
            "our mark on a spec with a root securityContext",
            v1::ENSURE,
            |j| {
                j["spec"]["template"]["spec"]["securityContext"] =
                    json!({"runAsUser": 0, "runAsNonRoot": false});
            },
            "\"runAsUser\":0",
        ),
        (
            "our mark on a spec with the API token mounted",
            v1::ENSURE,
            |j| j["spec"]["template"]["spec"]["automountServiceAccountToken"] = json!(true),
            "\"automountServiceAccountToken\":true",
        ),
    ];
    for (case, route, edit, shows) in cases {
        replaced_with(case, route, edit, shows).await?;
    }
    Ok(())
}
