//! A destination whose API server refuses the Job — here a ValidatingAdmissionPolicy, evaluated
//! by the real kube-apiserver — ends the measurement at creation, quoting the API's reason, not
//! after the error limit with "job does not exist".

use anyhow::{ensure, Result};
use dispatch_tests::admission::{deny_latest_images, LATEST_IMAGE, REASON};
use k8s_openapi::api::batch::v1::Job;
use kube::api::Api;
use serde_json::json;

use crate::engine_support::*;
use crate::fixture::*;

/// The namespace the policy applies to (no other test uses it).
const REFUSING: &str = "refusing";

#[test]
#[ignore = "needs clusters: make test-engine"]
fn an_admission_policy_denial_ends_the_first_measurement_with_its_reason() -> Result<()> {
    let f = fixture()?;
    run(async {
        deny_latest_images(f.a.client().await?, REFUSING).await?;
        let yaml = static_yaml(f, "");
        let engine = engine(&yaml).await?;
        let run = run_context("team-a", None);
        let routing = json!({"destination": "a", "namespace": REFUSING});
        let config = block(routing, 0, "1s", json!({}))?;
        let mut req = request(&run, "refused", 1, config);
        req.config.job_spec_mut().expect("a spec block")["template"]["spec"]["containers"][0]
            ["image"] = json!(LATEST_IMAGE);
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
