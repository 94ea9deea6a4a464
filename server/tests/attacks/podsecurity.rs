//! Pod security: a tenant's template that would escalate on the destination (privileged, host
//! namespaces, hostPath, node pinning, another service account, an API token, pods that pass for
//! another Job's) is refused through the API with the field's path, and no destination API call;
//! a policy without rules refuses everything. Controls: a plain template is created with the
//! restricted defaults filled in, a `privileged` rule lets the privileged template through, and
//! `allowAll` dispatches. Then the agent: it refuses, with its own flags, what the server (or a
//! forged record) sends.

use anyhow::{Context, Result};
use dispatch_api::v1;
use dispatch_server::agent::Guard;
use dispatch_server::podsecurity::{Origin, Profile};
use dispatch_server::store::record_name;
use serde_json::{json, Value};

use crate::fake_api::Res;
use crate::scene::{token, Reply, Scene};
use crate::tally::{self, Outcome};
use crate::world::NS;

/// team-a may run on `a` and `b` in `verify`, at the default level (restricted).
const POLICY: &str =
    "policy: {rules: [{projects: [team-a], destinations: [a, b], namespaces: [verify]}]}";

const UID: &str = "7e1f0c2a-5b3d-4c6e-8f90-a1b2c3d4e5f6";

/// A plugin block for destination `a` whose template is patched at the JSON `pointer`s (parents
/// created as objects).
fn block(patches: &[(&str, Value)]) -> Value {
    let mut b = json!({
        "destination": "a",
        "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "check", "image": "example.invalid/check:1"}]
        }}}
    });
    for (pointer, value) in patches {
        let mut cur = &mut b;
        let parts: Vec<String> = pointer
            .trim_start_matches('/')
            .split('/')
            .map(|p| p.replace("~1", "/"))
            .collect();
        for p in &parts[..parts.len() - 1] {
            cur = match p.parse::<usize>() {
                Ok(i) => &mut cur[i],
                Err(_) => cur
                    .as_object_mut()
                    .expect("an object on the path")
                    .entry(p.clone())
                    .or_insert_with(|| json!({})),
            };
        }
        cur[parts[parts.len() - 1].as_str()] = value.clone();
    }
    b
}

/// An ensure of measurement 1 of metric `m` of a run of `project` with `block`.
fn ensure_body(project: &str, block: Value) -> Value {
    json!({
        "run": {"name": "uat.verify.1", "namespace": project, "uid": UID},
        "metric": "m",
        "index": 1,
        "block": block,
    })
}

async fn ensure(scene: &Scene, project: &str, block: Value) -> Result<Reply> {
    let plugin = token("argo-rollouts-controller", |_| {});
    scene
        .call(
            "POST",
            v1::ENSURE,
            Some(&plugin),
            &ensure_body(project, block),
        )
        .await
}

/// The stored Job of the measurement on destination `a`.
fn stored_job(scene: &Scene, reply: &Reply) -> Result<Value> {
    let name = reply.body["jobName"].as_str().context("a job name")?;
    scene
        .world
        .clusters
        .a
        .get(&Res::new("batch/v1", "jobs"), NS, name)
        .with_context(|| format!("job {NS}/{name} on a"))
}

const C0: &str = "/spec/template/spec/containers/0";
const POD: &str = "/spec/template/spec";

/// JSON pointers into the plugin block and the values to put there.
type Patches = Vec<(String, Value)>;

/// Every escalation: its name, the patch, and the path the refusal must name.
fn escalations() -> Vec<(&'static str, Patches, &'static str)> {
    let c = |p: &str| format!("{C0}{p}");
    let pod = |p: &str| format!("{POD}{p}");
    vec![
        (
            "privileged container",
            vec![(c("/securityContext/privileged"), json!(true))],
            "spec.template.spec.containers[0].securityContext.privileged",
        ),
        (
            "hostPath volume",
            vec![(
                pod("/volumes"),
                json!([{"name": "root", "hostPath": {"path": "/"}}]),
            )],
            "spec.template.spec.volumes[0].hostPath",
        ),
        (
            "hostNetwork",
            vec![(pod("/hostNetwork"), json!(true))],
            "spec.template.spec.hostNetwork",
        ),
        (
            "hostPID",
            vec![(pod("/hostPID"), json!(true))],
            "spec.template.spec.hostPID",
        ),
        (
            "hostIPC",
            vec![(pod("/hostIPC"), json!(true))],
            "spec.template.spec.hostIPC",
        ),
        (
            "hostPort",
            vec![(c("/ports"), json!([{"containerPort": 80, "hostPort": 80}]))],
            "spec.template.spec.containers[0].ports[0].hostPort",
        ),
        (
            "capabilities add SYS_ADMIN",
            vec![(
                c("/securityContext/capabilities"),
                json!({"add": ["SYS_ADMIN"]}),
            )],
            "spec.template.spec.containers[0].securityContext.capabilities.add[0]",
        ),
        (
            "runAsUser 0",
            vec![(c("/securityContext/runAsUser"), json!(0))],
            "spec.template.spec.containers[0].securityContext.runAsUser",
        ),
        (
            "allowPrivilegeEscalation true",
            vec![(c("/securityContext/allowPrivilegeEscalation"), json!(true))],
            "spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation",
        ),
        (
            "unconfined seccomp",
            vec![(
                pod("/securityContext"),
                json!({"seccompProfile": {"type": "Unconfined"}}),
            )],
            "spec.template.spec.securityContext.seccompProfile.type",
        ),
        (
            "nodeName",
            vec![(pod("/nodeName"), json!("control-plane-1"))],
            "spec.template.spec.nodeName",
        ),
        (
            "manualSelector",
            vec![
                ("/spec/manualSelector".into(), json!(true)),
                (
                    "/spec/selector".into(),
                    json!({"matchLabels": {"app": "web"}}),
                ),
            ],
            "spec.manualSelector",
        ),
        (
            "selector",
            vec![(
                "/spec/selector".into(),
                json!({"matchLabels": {"app": "web"}}),
            )],
            "spec.selector",
        ),
        (
            "serviceAccountName not allowed",
            vec![(pod("/serviceAccountName"), json!("argocd-manager"))],
            "spec.template.spec.serviceAccountName",
        ),
        (
            "automountServiceAccountToken true",
            vec![(pod("/automountServiceAccountToken"), json!(true))],
            "spec.template.spec.automountServiceAccountToken",
        ),
        (
            "projected service account token",
            vec![(
                pod("/volumes"),
                json!([{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}]),
            )],
            "spec.template.spec.volumes[0].projected.sources[0].serviceAccountToken",
        ),
        (
            "reserved label job-name",
            vec![(
                "/spec/template/metadata".into(),
                json!({"labels": {"job-name": "another-job"}}),
            )],
            "spec.template.metadata.labels[\"job-name\"]",
        ),
        (
            "reserved label controller-uid",
            vec![(
                "/spec/template/metadata".into(),
                json!({"labels": {"controller-uid": "x"}}),
            )],
            "spec.template.metadata.labels[\"controller-uid\"]",
        ),
        (
            "reserved label batch.kubernetes.io/",
            vec![(
                "/spec/template/metadata".into(),
                json!({"labels": {"batch.kubernetes.io/job-name": "another-job"}}),
            )],
            "spec.template.metadata.labels[\"batch.kubernetes.io/job-name\"]",
        ),
        (
            "reserved label rollouts-dispatch.io/",
            vec![(
                "/spec/template/metadata".into(),
                json!({"labels": {"rollouts-dispatch.io/kargo-project": "team-b"}}),
            )],
            "spec.template.metadata.labels[\"rollouts-dispatch.io/kargo-project\"]",
        ),
        (
            // Argo's job provider would count the pod's Job as the victim run's in its
            // GarbageCollect and delete the victim's oldest Jobs (job::LABEL_RUN_UID).
            "reserved label analysisrun.argoproj.io/uid of another run",
            vec![(
                "/spec/template/metadata".into(),
                json!({"labels": {"analysisrun.argoproj.io/uid": "victim-run-uid"}}),
            )],
            "spec.template.metadata.labels[\"analysisrun.argoproj.io/uid\"]",
        ),
        (
            "init container privileged",
            vec![(
                pod("/initContainers"),
                json!([{"name": "init", "image": "x", "securityContext": {"privileged": true}}]),
            )],
            "spec.template.spec.initContainers[0].securityContext.privileged",
        ),
    ]
}

#[tokio::test]
async fn escalating_templates_are_refused_with_the_field_and_no_destination_call() -> Result<()> {
    let scene = Scene::start(POLICY).await?;
    for (what, patches, path) in escalations() {
        let patches: Vec<(&str, Value)> = patches
            .iter()
            .map(|(p, v)| (p.as_str(), v.clone()))
            .collect();
        let reply = ensure(&scene, "team-a", block(&patches)).await?;
        let name = format!("podsecurity: {what}");
        let message = reply.body["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let calls = scene.destination_calls();
        let outcome = Outcome {
            refused: reply.status == 403 && calls.is_empty(),
            ..Outcome::default()
        };
        tally::record(&name, &outcome);
        assert_eq!(reply.status, 403, "{name}: {:?}", reply.body);
        assert_eq!(reply.body["code"], "forbidden", "{name}");
        assert!(
            message.contains(&format!("`{path}`"))
                && message.contains("level restricted")
                && message.contains("policy.rules[0] in config file engine-fast.yaml"),
            "{name}: the refusal must name the field, the level and the rule: {message}"
        );
        assert!(calls.is_empty(), "{name}: destination calls {calls:?}");
        assert!(outcome.refused, "{name}");
    }
    Ok(())
}

#[tokio::test]
async fn a_plain_template_is_created_with_the_restricted_defaults() -> Result<()> {
    let scene = Scene::start(POLICY).await?;
    let reply = ensure(&scene, "team-a", block(&[])).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let job = stored_job(&scene, &reply)?;
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], json!(false), "{pod}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], json!(true));
    let sc = &pod["containers"][0]["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false), "{sc}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{sc}");
    Ok(())
}

#[tokio::test]
async fn a_privileged_rule_lets_the_privileged_template_through_and_only_for_its_project(
) -> Result<()> {
    let scene = Scene::start(
        "policy: {rules: [{projects: [team-a], destinations: [a], namespaces: [verify]}, \
         {projects: [team-lab], destinations: [a], namespaces: [verify], podSecurity: privileged, \
          serviceAccounts: [default, node-debugger], automountServiceAccountToken: true}]}",
    )
    .await?;
    let privileged = block(&[
        (&format!("{C0}/securityContext/privileged"), json!(true)),
        (&format!("{POD}/hostPID"), json!(true)),
        (&format!("{POD}/serviceAccountName"), json!("node-debugger")),
        (&format!("{POD}/automountServiceAccountToken"), json!(true)),
    ]);
    // The same template from team-a: refused, nothing created.
    let refused = ensure(&scene, "team-a", privileged.clone()).await?;
    let outcome = Outcome {
        refused: refused.status == 403 && scene.destination_calls().is_empty(),
        ..Outcome::default()
    };
    tally::refused(
        "podsecurity: privileged template from a restricted project",
        outcome,
    );
    // From team-lab: created as written.
    let reply = ensure(&scene, "team-lab", privileged).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let job = stored_job(&scene, &reply)?;
    let pod = &job["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["securityContext"]["privileged"],
        json!(true)
    );
    assert_eq!(pod["hostPID"], json!(true));
    assert_eq!(pod["serviceAccountName"], "node-debugger");
    assert_eq!(pod["automountServiceAccountToken"], json!(true));
    assert!(
        pod.get("securityContext").is_none(),
        "nothing filled at privileged: {pod}"
    );
    Ok(())
}

#[tokio::test]
async fn no_policy_refuses_everything_and_allow_all_dispatches() -> Result<()> {
    // `# no policy:` keeps the test world from adding `allowAll` (world.rs): no policy block.
    for (config, what) in [
        ("# no policy: deny by default", "no policy block"),
        ("policy: {}", "an empty policy"),
    ] {
        let scene = Scene::start(config).await?;
        let reply = ensure(&scene, "team-a", block(&[])).await?;
        let message = reply.body["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let outcome = Outcome {
            refused: reply.status == 403 && scene.destination_calls().is_empty(),
            ..Outcome::default()
        };
        tally::record(&format!("podsecurity: {what}"), &outcome);
        assert_eq!(reply.status, 403, "{what}: {:?}", reply.body);
        assert!(
            message.contains("denies by default")
                && message.contains("policy.rules")
                && message.contains("allowAll"),
            "{what}: the refusal must name the config to add: {message}"
        );
        assert!(outcome.refused, "{what}");
    }
    let scene = Scene::start("policy: {allowAll: true}").await?;
    let reply = ensure(&scene, "any-project", block(&[])).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let job = stored_job(&scene, &reply)?;
    // allowAll applies the default profile.
    assert_eq!(
        job["spec"]["template"]["spec"]["automountServiceAccountToken"],
        json!(false)
    );
    let refused = ensure(
        &scene,
        "any-project",
        block(&[(&format!("{POD}/hostNetwork"), json!(true))]),
    )
    .await?;
    assert_eq!(refused.status, 403, "{:?}", refused.body);
    assert!(refused.body["message"]
        .as_str()
        .unwrap_or_default()
        .contains("`policy.allowAll`"));
    Ok(())
}

const AGENTS: &str = "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}";

/// The agent of `edge` as `rollouts-dispatch agent --namespaces verify` starts it (restricted),
/// pinning the work keys of `scene`'s server.
fn agent_guard(scene: &Scene) -> Guard {
    Guard {
        namespaces: vec![NS.to_string()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: scene.world.engine.work_keys(),
    }
}

/// The record the server wrote for an ensure on `edge`.
fn record(scene: &Scene, reply: &Reply) -> Result<dispatch_server::store::DispatchJob> {
    let name = reply.body["jobName"].as_str().context("a job name")?;
    let store = scene.world.engine.store().context("an agent store")?;
    store
        .get(&record_name(name, "edge"))
        .context("the record of edge")
}

#[tokio::test]
async fn the_agent_refuses_what_its_own_flags_do_not_allow() -> Result<()> {
    // The server's policy lets team-lab run privileged Jobs anywhere on edge.
    let scene = Scene::start(&format!(
        "{AGENTS}\npolicy: {{rules: [{{projects: [team-lab], destinations: [edge], namespaces: ['*'], podSecurity: privileged}}]}}"
    ))
    .await?;
    let guard = agent_guard(&scene);
    let on_edge = |patches: &[(&str, Value)]| {
        let mut b = block(patches);
        b["destination"] = json!("edge");
        b
    };
    // Control: a plain Job passes the agent and gets the restricted defaults.
    let plain = ensure(&scene, "team-lab", on_edge(&[])).await?;
    assert_eq!(plain.status, 200, "{:?}", plain.body);
    let admitted = guard
        .admit("edge", &record(&scene, &plain)?.spec)?
        .context("a Job")?;
    assert_eq!(
        admitted["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        json!(true)
    );

    let mut cases: Vec<(&str, dispatch_server::store::DispatchJobSpec, &str)> = Vec::new();
    // The server allowed a privileged Job: the agent, at restricted, does not.
    let privileged = on_edge(&[(&format!("{C0}/securityContext/privileged"), json!(true))]);
    let mut privileged = ensure_body("team-lab", privileged);
    privileged["index"] = json!(2);
    let plugin = token("argo-rollouts-controller", |_| {});
    let reply = scene
        .call("POST", v1::ENSURE, Some(&plugin), &privileged)
        .await?;
    assert_eq!(
        reply.status, 200,
        "the server's rule allows it: {:?}",
        reply.body
    );
    cases.push((
        "privileged job the server allowed",
        record(&scene, &reply)?.spec,
        "`spec.template.spec.containers[0].securityContext.privileged`",
    ));
    // A namespace outside the agent's.
    let mut other_ns = ensure_body("team-lab", on_edge(&[]));
    other_ns["block"]["namespace"] = json!("kube-system");
    other_ns["index"] = json!(3);
    let reply = scene
        .call("POST", v1::ENSURE, Some(&plugin), &other_ns)
        .await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    cases.push((
        "namespace outside the agent's",
        record(&scene, &reply)?.spec,
        "namespace \"kube-system\" is not one of its namespaces",
    ));
    // Someone who can write DispatchJobs edits a record the server wrote.
    let mut forged = record(&scene, &plain)?.spec;
    forged.job.as_mut().context("a Job")?["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "root", "hostPath": {"path": "/"}}]);
    cases.push((
        "forged record with hostPath",
        forged,
        "`spec.template.spec.volumes[0].hostPath`",
    ));
    let mut moved = record(&scene, &plain)?.spec;
    moved.job.as_mut().context("a Job")?["metadata"]["namespace"] = json!("kube-system");
    cases.push((
        "forged record whose Job names another namespace",
        moved,
        "`metadata.namespace` is \"kube-system\"",
    ));
    let mut delete_elsewhere = record(&scene, &plain)?.spec;
    delete_elsewhere.delete = true;
    delete_elsewhere.namespace = "kube-system".into();
    cases.push((
        "forged deletion in a namespace outside the agent's",
        delete_elsewhere,
        "namespace \"kube-system\" is not one of its namespaces",
    ));
    let mut other_run = record(&scene, &plain)?.spec;
    other_run.run_uid = "another-run".into();
    cases.push((
        "forged record of another run",
        other_run,
        "rollouts-dispatch.io/run-uid",
    ));

    for (what, spec, needle) in cases {
        if what.starts_with("forged") {
            // As written into the store, the edit breaks the server's signature.
            let name = format!("podsecurity: agent refuses {what} (unsigned)");
            let verdict = guard.admit("edge", &spec);
            tally::record(
                &name,
                &Outcome {
                    refused: verdict.is_err(),
                    ..Outcome::default()
                },
            );
            let e = verdict.expect_err(&name).to_string();
            assert!(e.contains("does not match its content"), "{name}: {e}");
        }
        // Signed again, as a compromised server replica could: the agent's own checks hold.
        let mut spec = spec;
        scene.world.engine.sign_work(&mut spec);
        let name = format!("podsecurity: agent refuses {what}");
        let verdict = guard.admit("edge", &spec);
        let outcome = Outcome {
            refused: verdict.is_err(),
            ..Outcome::default()
        };
        tally::record(&name, &outcome);
        let e = verdict.expect_err(&name).to_string();
        assert!(
            e.starts_with("the agent refused it: ") && e.contains(needle),
            "{name}: {e}"
        );
    }
    Ok(())
}
