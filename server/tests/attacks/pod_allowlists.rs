//! Pod allowlists attacked (group `foreign_mounts`): a Job pod is created with the server's (or
//! the agent's) credentials, so what it mounts, references, where it is scheduled and what it
//! claims is the server's to allow, not the tenant's. A rule without allowlists refuses every
//! Secret, ConfigMap, claim, CSI driver and pull Secret, every scheduling field, resources over
//! the built-in caps, retries and parallelism over the caps and pod labels or annotations outside
//! the allowlist — with the field's path and no destination call; a legacy service-account token
//! Secret is refused even where `secrets: ["*"]` is written. Controls: what a rule names passes,
//! and the agent refuses, from its own flags, a forged record that mounts a Secret.

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

/// team-a may run on `a` in `verify` with the default allowlists (nothing referenced).
const POLICY: &str =
    "policy: {rules: [{projects: [team-a], destinations: [a], namespaces: [verify]}]}";

const UID: &str = "5a0d2c1e-7b3f-4e6a-9c80-b1c2d3e4f5a6";

/// The pod template spec of a plain check, with `pod` merged into it and `container` into its
/// one container.
fn block_with(pod: Value, container: Value, job: Value, meta: Value) -> Value {
    let mut c = json!({"name": "check", "image": "example.invalid/check:1"});
    merge(&mut c, container);
    let mut spec = json!({"restartPolicy": "Never", "containers": [c]});
    merge(&mut spec, pod);
    let mut job_spec = json!({"backoffLimit": 0, "template": {"metadata": meta, "spec": spec}});
    merge(&mut job_spec, job);
    json!({"destination": "a", "spec": job_spec})
}

fn merge(to: &mut Value, from: Value) {
    if let (Some(to), Value::Object(from)) = (to.as_object_mut(), from) {
        to.extend(from);
    }
}

fn pod(p: Value) -> Value {
    block_with(p, json!({}), json!({}), json!({}))
}

fn container(c: Value) -> Value {
    block_with(json!({}), c, json!({}), json!({}))
}

async fn ensure(scene: &Scene, index: u32, block: Value) -> Result<Reply> {
    let plugin = token("argo-rollouts-controller", |_| {});
    let body = json!({
        "run": {"name": "uat.verify.1", "namespace": "team-a", "uid": UID},
        "metric": "m",
        "index": index,
        "block": block,
    });
    scene.call("POST", v1::ENSURE, Some(&plugin), &body).await
}

/// Every reference, placement and claim a tenant could try: name, block, the path the refusal
/// names.
fn foreign() -> Vec<(&'static str, Value, &'static str)> {
    vec![
        (
            "Secret volume argocd-secret",
            pod(json!({"volumes": [{"name": "s", "secret": {"secretName": "argocd-secret"}}]})),
            "spec.template.spec.volumes[0].secret.secretName",
        ),
        (
            "secretKeyRef of another tenant's Secret",
            container(json!({"env": [{"name": "DB", "valueFrom":
                {"secretKeyRef": {"name": "team-b-db", "key": "password"}}}]})),
            "spec.template.spec.containers[0].env[0].valueFrom.secretKeyRef.name",
        ),
        (
            "envFrom a Secret",
            container(json!({"envFrom": [{"secretRef": {"name": "team-b-db"}}]})),
            "spec.template.spec.containers[0].envFrom[0].secretRef.name",
        ),
        (
            "projected Secret source",
            pod(json!({"volumes": [{"name": "p", "projected": {"sources":
                [{"secret": {"name": "argocd-secret"}}]}}]})),
            "spec.template.spec.volumes[0].projected.sources[0].secret.name",
        ),
        (
            "ConfigMap volume",
            pod(json!({"volumes": [{"name": "c", "configMap": {"name": "argocd-cm"}}]})),
            "spec.template.spec.volumes[0].configMap.name",
        ),
        (
            "configMapKeyRef",
            container(json!({"env": [{"name": "X", "valueFrom":
                {"configMapKeyRef": {"name": "argocd-cm", "key": "url"}}}]})),
            "spec.template.spec.containers[0].env[0].valueFrom.configMapKeyRef.name",
        ),
        (
            "PersistentVolumeClaim of another tenant",
            pod(
                json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "team-b-data"}}]}),
            ),
            "spec.template.spec.volumes[0].persistentVolumeClaim.claimName",
        ),
        (
            "inline CSI volume (secrets-store driver)",
            pod(json!({"volumes": [{"name": "v", "csi": {"driver": "secrets-store.csi.k8s.io"}}]})),
            "spec.template.spec.volumes[0].csi.driver",
        ),
        (
            "imagePullSecrets",
            pod(json!({"imagePullSecrets": [{"name": "team-b-registry"}]})),
            "spec.template.spec.imagePullSecrets[0].name",
        ),
        (
            "control-plane toleration",
            pod(
                json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                "operator": "Exists", "effect": "NoSchedule"}]}),
            ),
            "spec.template.spec.tolerations",
        ),
        (
            "nodeSelector for the control plane",
            pod(json!({"nodeSelector": {"node-role.kubernetes.io/control-plane": ""}})),
            "spec.template.spec.nodeSelector",
        ),
        (
            "node affinity",
            pod(
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname",
                "operator": "In", "values": ["control-plane-1"]}]}]}}}}),
            ),
            "spec.template.spec.affinity",
        ),
        (
            "priorityClassName system-node-critical",
            pod(json!({"priorityClassName": "system-node-critical"})),
            "spec.template.spec.priorityClassName",
        ),
        (
            "priority set directly",
            pod(json!({"priority": 2000001000})),
            "spec.template.spec.priority",
        ),
        (
            "runtimeClassName",
            pod(json!({"runtimeClassName": "unsandboxed"})),
            "spec.template.spec.runtimeClassName",
        ),
        (
            "hostAliases",
            pod(json!({"hostAliases": [{"ip": "10.0.0.1", "hostnames": ["vault.internal"]}]})),
            "spec.template.spec.hostAliases",
        ),
        (
            "dnsConfig",
            pod(json!({"dnsConfig": {"nameservers": ["10.0.0.53"]}})),
            "spec.template.spec.dnsConfig",
        ),
        (
            "a cpu limit over the cap",
            container(json!({"resources": {"limits": {"cpu": "64"}}})),
            "spec.template.spec.containers[0]",
        ),
        (
            "a memory request over the cap",
            container(json!({"resources": {"requests": {"memory": "512Gi"}}})),
            "spec.template.spec.containers[0]",
        ),
        (
            "parallelism over the cap",
            block_with(
                json!({}),
                json!({}),
                json!({"parallelism": 1000}),
                json!({}),
            ),
            "spec.parallelism",
        ),
        (
            "completions over the cap",
            block_with(
                json!({}),
                json!({}),
                json!({"completions": 1000}),
                json!({}),
            ),
            "spec.completions",
        ),
        (
            "backoffLimit over the cap",
            block_with(
                json!({}),
                json!({}),
                json!({"backoffLimit": 100000}),
                json!({}),
            ),
            "spec.backoffLimit",
        ),
        (
            "a pod label joining another Service",
            block_with(
                json!({}),
                json!({}),
                json!({}),
                json!({"labels": {"app": "payments"}}),
            ),
            "spec.template.metadata.labels[\"app\"]",
        ),
        (
            "an annotation asking an injector for secrets",
            block_with(
                json!({}),
                json!({}),
                json!({}),
                json!({"annotations": {"vault.hashicorp.com/agent-inject": "true"}}),
            ),
            "spec.template.metadata.annotations[\"vault.hashicorp.com/agent-inject\"]",
        ),
    ]
}

/// Records `name`: refused when 403 with no destination call beyond the first `before`; a 200
/// is a foreign mount.
fn record_refusal(scene: &Scene, before: usize, name: &str, reply: &Reply, path: &str) {
    let calls = scene.destination_calls().split_off(before);
    let message = reply.body["message"].as_str().unwrap_or_default();
    let outcome = Outcome {
        refused: reply.status == 403 && calls.is_empty(),
        foreign_mount: reply.status == 200,
        ..Outcome::default()
    };
    tally::record(name, &outcome);
    assert_eq!(reply.status, 403, "{name}: {:?}", reply.body);
    assert!(
        message.contains(&format!("`{path}")),
        "{name}: the refusal must name `{path}`: {message}"
    );
    assert!(
        message.contains("policy.rules[0] in config file engine-fast.yaml"),
        "{name}: the refusal must name the rule: {message}"
    );
    assert!(calls.is_empty(), "{name}: destination calls {calls:?}");
}

#[tokio::test]
async fn what_a_rule_does_not_allow_is_refused_with_the_field_and_no_destination_call() -> Result<()>
{
    let scene = Scene::start(POLICY).await?;
    for (i, (what, block, path)) in foreign().into_iter().enumerate() {
        let reply = ensure(&scene, i as u32 + 1, block).await?;
        record_refusal(&scene, 0, &format!("foreign_mounts: {what}"), &reply, path);
    }
    Ok(())
}

#[tokio::test]
async fn a_legacy_token_secret_is_refused_even_under_a_secrets_glob() -> Result<()> {
    let scene = Scene::start(
        "policy: {rules: [{projects: [team-a], destinations: [a], namespaces: [verify], \
         secrets: [\"*\"]}]}",
    )
    .await?;
    // Control: the glob lets an ordinary Secret through.
    let ok = ensure(
        &scene,
        1,
        pod(json!({"volumes": [{"name": "s", "secret": {"secretName": "check-config"}}]})),
    )
    .await?;
    assert_eq!(ok.status, 200, "the rule's glob allows it: {:?}", ok.body);
    let before = scene.destination_calls().len();
    // A `<sa>-token-<5>` Secret holds a service account's API token: it would bypass
    // `serviceAccounts` and `automountServiceAccountToken`.
    let reply = ensure(
        &scene,
        2,
        pod(json!({"volumes": [{"name": "t", "secret": {"secretName": "argocd-manager-token-x7k2p"}}]})),
    )
    .await?;
    record_refusal(
        &scene,
        before,
        "foreign_mounts: legacy service-account token Secret under secrets: [\"*\"]",
        &reply,
        "spec.template.spec.volumes[0].secret.secretName",
    );
    Ok(())
}

#[tokio::test]
async fn what_a_rule_names_passes_with_the_resource_defaults_filled_in() -> Result<()> {
    let scene = Scene::start(
        "policy: {rules: [{projects: [team-a], destinations: [a], namespaces: [verify], \
         secrets: [check-config], configMaps: [\"check-*\"], imagePullSecrets: [registry], \
         scheduling: [nodeSelector], podLabels: [app], podAnnotations: [\"example.com/*\"]}]}",
    )
    .await?;
    let block = block_with(
        json!({
            "volumes": [{"name": "s", "secret": {"secretName": "check-config"}},
                        {"name": "c", "configMap": {"name": "check-scripts"}}],
            "imagePullSecrets": [{"name": "registry"}],
            "nodeSelector": {"pool": "verification"},
        }),
        json!({}),
        json!({}),
        json!({"labels": {"app": "smoke"}, "annotations": {"example.com/owner": "team-a"}}),
    );
    let reply = ensure(&scene, 1, block).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let name = reply.body["jobName"].as_str().context("a job name")?;
    let job = scene
        .world
        .clusters
        .a
        .get(&Res::new("batch/v1", "jobs"), NS, name)
        .context("the Job on a")?;
    let spec = &job["spec"]["template"]["spec"];
    assert_eq!(spec["volumes"][0]["secret"]["secretName"], "check-config");
    assert_eq!(spec["nodeSelector"]["pool"], "verification");
    let resources = &spec["containers"][0]["resources"];
    assert!(
        resources["requests"].is_object() && resources["limits"].is_object(),
        "the rule's resource defaults are filled in: {resources}"
    );
    Ok(())
}

#[tokio::test]
async fn the_agent_refuses_a_forged_record_mounting_a_secret() -> Result<()> {
    let scene = Scene::start(
        "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}\n\
         policy: {rules: [{projects: [team-a], destinations: [edge], namespaces: [verify]}]}",
    )
    .await?;
    let mut plain = container(json!({}));
    plain["destination"] = json!("edge");
    let reply = ensure(&scene, 1, plain).await?;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    let name = reply.body["jobName"].as_str().context("a job name")?;
    let store = scene.world.engine.store().context("an agent store")?;
    let record = store
        .get(&record_name(name, "edge"))
        .context("the record of edge")?;
    // The agent as `rollouts-dispatch agent --namespaces verify` starts it: no `--secrets`.
    let guard = Guard {
        namespaces: vec![NS.to_string()],
        profile: Profile::restricted(Origin::Agent),
        work_keys: scene.world.engine.work_keys(),
    };
    // Control: the record as the server wrote it passes.
    guard.admit("edge", &record.spec)?.context("a Job")?;
    let forgeries: [(&str, &str, Value); 3] = [
        (
            "Secret volume",
            "volumes",
            json!([{"name": "s", "secret": {"secretName": "argocd-secret"}}]),
        ),
        (
            "imagePullSecrets",
            "imagePullSecrets",
            json!([{"name": "team-b-registry"}]),
        ),
        (
            "control-plane toleration",
            "tolerations",
            json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]),
        ),
    ];
    for (what, field, value) in forgeries {
        let name = format!("foreign_mounts: agent refuses a forged record's {what}");
        let mut forged = record.spec.clone();
        forged.job.as_mut().context("a Job")?["spec"]["template"]["spec"][field] = value;
        // Edited in the store, the record's signature no longer holds.
        let unsigned = guard.admit("edge", &forged).map(|_| ());
        let signature = unsigned.as_ref().err().map(ToString::to_string);
        tally::record(
            &format!("{name} (edited in the store)"),
            &Outcome {
                refused: unsigned.is_err(),
                foreign_mount: unsigned.is_ok(),
                ..Outcome::default()
            },
        );
        assert!(
            signature.is_some_and(|e| e.contains("does not match its content")),
            "{name}: an edited record must fail its signature"
        );
        // Signed again, as a compromised server replica could: the agent's flags still hold.
        scene.world.engine.sign_work(&mut forged);
        let verdict = guard.admit("edge", &forged);
        let outcome = Outcome {
            refused: verdict.is_err(),
            foreign_mount: verdict.is_ok(),
            ..Outcome::default()
        };
        tally::record(&name, &outcome);
        let e = verdict.expect_err(&name).to_string();
        assert!(
            e.starts_with("the agent refused it: ")
                && e.contains(&format!("spec.template.spec.{field}")),
            "{name}: {e}"
        );
    }
    Ok(())
}
