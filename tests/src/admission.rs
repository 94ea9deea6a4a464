//! Admission on a real API server: a ValidatingAdmissionPolicy that denies Jobs with a `:latest`
//! image in the namespaces labelled [`LABEL`], as a platform's policy would. The engine test and
//! the agent end-to-end test use it to prove a refused create ends the measurement with the
//! API's reason.

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::objects::dry_run_job;

/// The namespace label the policy's binding selects.
pub const LABEL: &str = "rollouts-dispatch.test/refusing";
/// What the policy says when it denies.
pub const REASON: &str = "images must be pinned by digest or version, not :latest";
/// An image the policy denies.
pub const LATEST_IMAGE: &str = "example.invalid/check:latest";

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "admissionregistration.k8s.io".into(),
        version: "v1".into(),
        api_version: "admissionregistration.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn ignore_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Labels `namespace` (created if missing) with [`LABEL`] and puts the policy in force there;
/// returns once the API server denies a dry-run Job with [`LATEST_IMAGE`]. Idempotent.
pub async fn deny_latest_images(client: kube::Client, namespace: &str) -> Result<()> {
    let pp = PostParams::default();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    ignore_exists(namespaces.create(&pp, &ns).await)?;
    namespaces
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {LABEL: "true"}}})),
        )
        .await?;
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
                 "matchResources": {"namespaceSelector": {"matchLabels": {LABEL: "true"}}}}
    }))?;
    ignore_exists(bindings.create(&pp, &binding).await)?;

    // The API server loads policies from its own informer: wait until a dry run is denied.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match dry_run_job(&client, namespace, LATEST_IMAGE).await {
            Err(kube::Error::Api(s)) if s.message.contains(REASON) => return Ok(()),
            other => ensure!(
                Instant::now() < deadline,
                "the policy is not in force after 30s: {other:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
