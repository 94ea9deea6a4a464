//! A tenant's check prints a destination Secret it can read (env, a mounted volume) and fails:
//! the verdict that comes back through the API (into the AnalysisRun, readable by the project
//! and the control plane) never carries the value — redacted, or the tail withheld.

use anyhow::Result;
use base64::Engine as _;
use dispatch_api::v1;
use serde_json::{json, Value};

use crate::fake_api::Res;
use crate::scene::{token, Scene};
use crate::tally::{self, Outcome};
use crate::world::NS;

const VALUE: &str = "destination-admin-password-9f8e7d";

fn measurement(uid: &str, metadata: &Value) -> Value {
    json!({
        "run": {"name": "uat.x.1", "namespace": "team-a", "uid": uid,
                "labels": {"kargo.akuity.io/stage": "uat"}},
        "metric": "check", "index": 1,
        "block": {"destination": "a", "logTail": 20, "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "check", "image": "example.invalid/check:1"}]}}}},
        "metadata": metadata,
    })
}

#[tokio::test]
async fn a_failed_check_printing_a_secret_leaks_nothing_through_the_verdict() -> Result<()> {
    let scene = Scene::start(
        "policy: {rules: [{projects: ['*'], destinations: ['*'], namespaces: ['*']}]}",
    )
    .await?;
    let plugin = token("plugin", |_| {});
    let api = scene.world.api("a");
    let b64 = base64::engine::general_purpose::STANDARD.encode(VALUE);
    api.put(
        &Res::new("v1", "secrets"),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "admin", "namespace": NS}, "data": {"password": b64}}),
    );
    for (case, readable) in [
        ("readable Secret → redacted", true),
        ("unreadable Secret → withheld", false),
    ] {
        let uid = format!("0000000{}-aaaa-4bbb-8ccc-000000000001", u8::from(readable));
        let ensured = scene
            .call(
                "POST",
                v1::ENSURE,
                Some(&plugin),
                &measurement(&uid, &json!({})),
            )
            .await?;
        assert_eq!(ensured.status, 200, "{case}: {:?}", ensured.body);
        let job_name = ensured.body["jobName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        scene.world.cached("a", &job_name, true).await?;
        failed_pod_printing(api, &job_name, VALUE)?;
        if !readable {
            api.fail("GET", "/secrets/admin", 403, 100);
        }
        let metadata = ensured.body["metadata"].clone();
        let mut leaked = false;
        let mut verdict = Value::Null;
        for _ in 0..500 {
            let reply = scene
                .call(
                    "POST",
                    v1::STATUS,
                    Some(&plugin),
                    &measurement(&uid, &metadata),
                )
                .await?;
            leaked |= reply.body.to_string().contains(VALUE);
            if reply.body["phase"] == "Failed" {
                verdict = reply.body;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let message = verdict["message"].as_str().unwrap_or_default().to_string();
        assert!(!message.is_empty(), "{case}: no Failed verdict");
        let outcome = Outcome {
            refused: !leaked,
            secret_leak: leaked,
            ..Outcome::default()
        };
        tally::record(&format!("log tail: {case}"), &outcome);
        assert!(
            !leaked,
            "{case}: the Secret value reached a reply: {message}"
        );
        if readable {
            assert!(message.contains("password=*****"), "{case}: {message}");
        } else {
            assert!(message.contains("withheld"), "{case}: {message}");
        }
    }
    Ok(())
}

/// The Pod of Job `job_name` on a fake destination: container `check` reads Secret `admin`
/// through env, printed `password=<value>` and exited 1; the Job is marked Failed.
fn failed_pod_printing(
    api: &crate::fake_api::FakeApi,
    job_name: &str,
    value: &str,
) -> Result<String> {
    let jobs = Res::new("batch/v1", "jobs");
    let job = api
        .get(&jobs, NS, job_name)
        .ok_or_else(|| anyhow::anyhow!("job {job_name} not created"))?;
    let uid = job["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let labels = job["spec"]["template"]["metadata"]["labels"].clone();
    let mut labels = labels.as_object().cloned().unwrap_or_default();
    labels.insert("batch.kubernetes.io/controller-uid".into(), json!(uid));
    labels.insert("batch.kubernetes.io/job-name".into(), json!(job_name));
    let name = format!("{job_name}-p0d");
    api.put(
        &Res::new("v1", "pods"),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS, "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                     "uid": uid, "controller": true}]},
            "spec": {"containers": [{"name": "check", "image": "example.invalid/check:1",
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "admin", "key": "password"}}}]}]},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "check", "ready": false,
                "restartCount": 0, "image": "example.invalid/check:1", "imageID": "",
                "state": {"terminated": {"exitCode": 1, "reason": "Error",
                                         "message": format!("password={value}\n")}}}]},
        }),
    );
    api.update(&jobs, NS, job_name, |j| {
        j["status"] = json!({"failed": 1, "conditions": [
            {"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "x"}]});
    });
    Ok(name)
}
