//! A destination whose API server refuses the Job — here a ValidatingAdmissionPolicy, evaluated
//! by the real kube-apiserver — ends the measurement at creation, quoting the API's reason, not
//! after the error limit with "job does not exist".

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::json;

use crate::engine_support::*;
use crate::fixture::*;
use dispatch_tests::objects::dry_run_job;

/// The namespace the policy applies to (no other test uses it).
const REFUSING: &str = "refusing";
/// What the policy says when it denies.
const REASON: &str = "images must be pinned by digest or version, not :latest";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// A policy (and its binding) denying Jobs with a `:latest` image in namespace [`REFUSING`].
async fn deny_latest_images(client: kube::Client) -> Result<()> {
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(
        json!({"metadata": {"name": REFUSING, "labels": {"refusing": "true"}}}),
    )?;
    ignore_exists(namespaces.create(&pp, &ns).await)?;
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource("ValidatingAdmissionPolicy", "validatingadmissionpolicies"),
    );
    let policy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-latest"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["jobs"]}]},
            "validations": [{
                "expression": "object.spec.template.spec.containers.all(c, !c.image.endsWith(':latest'))",
                "message": REASON
            }]
        }
    }))?;
    ignore_exists(policies.create(&pp, &policy).await)?;
    let bindings: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &resource(
            "ValidatingAdmissionPolicyBinding",
            "validatingadmissionpolicybindings",
        ),
    );
    let binding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "no-latest"},
        "spec": {"policyName": "no-latest", "validationActions": ["Deny"],
                 "matchResources": {"namespaceSelector": {"matchLabels": {"refusing": "true"}}}}
    }))?;
    ignore_exists(bindings.create(&pp, &binding).await)?;

    // The API server loads policies from its own informer: wait until a dry run is denied.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match dry_run_job(&client, REFUSING, "example.invalid/c:latest").await {
            Err(kube::Error::Api(s)) if s.message.contains(REASON) => return Ok(()),
            other => ensure!(
                Instant::now() < deadline,
                "the policy is not in force after 30s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn ignore_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn an_admission_policy_denial_ends_the_first_measurement_with_its_reason() -> Result<()> {
    let f = fixture()?;
    run(async {
        deny_latest_images(f.a.client().await?).await?;
        let yaml = static_yaml(f, "");
        let engine = engine(&yaml).await?;
        let run = run_context("team-a", None);
        let routing = json!({"destination": "a", "namespace": REFUSING});
        let config = block(routing, 0, "1s", json!({}))?;
        let mut req = request(&run, "refused", 1, config);
        req.config.spec["template"]["spec"]["containers"][0]["image"] =
            json!("example.invalid/check:latest");
        let ensured = engine.ensure(&req).await?;
        ensure!(
            ensured.verdict.phase == dispatch_server::Phase::Error && !ensured.verdict.retryable,
            "{:?}",
            ensured.verdict
        );
        ensure!(
            ensured.verdict.message.contains(REASON)
                && !ensured
                    .verdict
                    .message
                    .contains("grant the server's credentials"),
            "the API's reason, not RBAC advice: {}",
            ensured.verdict.message
        );
        let jobs: Api<Job> = Api::namespaced(f.a.client().await?, REFUSING);
        ensure!(
            jobs.list(&Default::default()).await?.items.is_empty(),
            "nothing was created"
        );
        Ok(())
    })
}
