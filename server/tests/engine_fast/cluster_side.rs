//! The cluster's side of a test, played on a [`FakeApi`]: what the Job controller and the
//! kubelet would write (a Pod for a Job, container states, Job conditions), objects that someone
//! else created (a foreign Job, an AnalysisRun), and typed reads of what the engine wrote.

use anyhow::{anyhow, Context, Result};
use k8s_openapi::api::batch::v1::Job;
use serde_json::{json, Value};

use crate::fake_api::{FakeApi, Res};
use crate::world::NS;

pub(crate) fn jobs() -> Res {
    Res::new("batch/v1", "jobs")
}

pub(crate) fn pods() -> Res {
    Res::new("v1", "pods")
}

pub(crate) fn analysis_runs() -> Res {
    Res::new("argoproj.io/v1alpha1", "analysisruns")
}

/// Job `NS/name` as stored, typed.
pub(crate) fn job(api: &FakeApi, name: &str) -> Result<Job> {
    let raw = api
        .get(&jobs(), NS, name)
        .ok_or_else(|| anyhow!("job {NS}/{name} does not exist on {}", api.url()))?;
    serde_json::from_value(raw).context("the stored job is not a batch/v1 Job")
}

/// Every Job name on `api`, sorted.
pub(crate) fn job_names(api: &FakeApi) -> Vec<String> {
    let mut names: Vec<String> = api
        .list(&jobs())
        .iter()
        .filter_map(|j| j["metadata"]["name"].as_str().map(String::from))
        .collect();
    names.sort();
    names
}

/// The Job controller's verdict: condition `type_` (`Complete` or `Failed`) with `reason`.
pub(crate) fn finish_job(api: &FakeApi, name: &str, type_: &str, reason: &str, message: &str) {
    let done = api.update(&jobs(), NS, name, |j| {
        j["status"]["conditions"] = json!([{
            "type": type_, "status": "True", "reason": reason, "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastProbeTime": "2026-01-01T00:00:00Z"
        }]);
        let counter = if type_ == "Complete" {
            "succeeded"
        } else {
            "failed"
        };
        j["status"][counter] = 1.into();
    });
    assert!(done.is_some(), "job {name} to finish does not exist");
}

/// The Pod the Job controller creates for Job `name` (labels of the template plus the
/// controller's, owned by the Job), with `status` as the kubelet reports it. `managed: false`
/// drops our label, so that the engine's Pod cache never sees it (only an API list does).
pub(crate) fn pod_for(
    api: &FakeApi,
    job_name: &str,
    status: Value,
    managed: bool,
) -> Result<String> {
    let job = job(api, job_name)?;
    let uid = job.metadata.uid.clone().unwrap_or_default();
    let mut labels = job
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    if !managed {
        labels.remove(dispatch_server::job::LABEL_MANAGED);
    }
    labels.insert("batch.kubernetes.io/controller-uid".into(), uid.clone());
    labels.insert("batch.kubernetes.io/job-name".into(), job_name.into());
    let name = format!("{job_name}-x7k2p");
    api.put(
        &pods(),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": NS, "labels": labels,
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job_name,
                                     "uid": uid, "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {"containers": [{"name": "check", "image": "example.invalid/check:1"}]},
            "status": status,
        }),
    );
    Ok(name)
}

/// Pod status: container `check` terminated with `exit_code`, and `message` as its
/// termination message.
pub(crate) fn terminated(exit_code: i32, message: Option<&str>) -> Value {
    let mut t = json!({"exitCode": exit_code, "reason": if exit_code == 0 { "Completed" } else { "Error" }});
    if let Some(m) = message {
        t["message"] = m.into();
    }
    json!({
        "phase": if exit_code == 0 { "Succeeded" } else { "Failed" },
        "containerStatuses": [{"name": "check", "ready": false, "restartCount": 0,
                               "image": "example.invalid/check:1", "imageID": "",
                               "state": {"terminated": t}}]
    })
}

/// Pod status: container `check` waiting with `reason` (e.g. `ErrImagePull`).
pub(crate) fn waiting(reason: &str, message: &str) -> Value {
    json!({
        "phase": "Pending",
        "containerStatuses": [{"name": "check", "ready": false, "restartCount": 0,
                               "image": "example.invalid/check:1", "imageID": "",
                               "state": {"waiting": {"reason": reason, "message": message}}}]
    })
}

/// Pod status: the kubelet took the pod at `since` (RFC 3339), and container `check` waits
/// with `reason` (e.g. `CreateContainerConfigError`) and the kubelet's `message`.
pub(crate) fn waiting_since(reason: &str, message: &str, since: &str) -> Value {
    let mut status = waiting(reason, message);
    status["startTime"] = since.into();
    status
}

/// Pod status: container `check` exited with `exit_code` (termination message `message`) and
/// waits for its restart in CrashLoopBackOff, after `restarts` restarts.
pub(crate) fn crash_looping(exit_code: i32, message: &str, restarts: u32) -> Value {
    json!({
        "phase": "Running",
        "containerStatuses": [{"name": "check", "ready": false, "restartCount": restarts,
                               "image": "example.invalid/check:1", "imageID": "",
                               "state": {"waiting": {"reason": "CrashLoopBackOff",
                                   "message": "back-off 20s restarting failed container=check"}},
                               "lastState": {"terminated": {"exitCode": exit_code,
                                   "reason": "Error", "message": message}}}]
    })
}

/// Pod status: not scheduled since `since` (RFC 3339), with the scheduler's `message`.
pub(crate) fn unschedulable(message: &str, since: &str) -> Value {
    json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
        "reason": "Unschedulable", "message": message, "lastTransitionTime": since}]})
}

/// A Job called `name` that someone else created, with `labels`.
pub(crate) fn foreign_job(api: &FakeApi, name: &str, labels: Value) -> Value {
    api.put(
        &jobs(),
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": NS, "labels": labels},
            "spec": {"template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "theirs", "image": "example.invalid/theirs:1"}]}}}
        }),
    )
}

/// An AnalysisRun with `uid` on the control plane.
pub(crate) fn analysis_run(cp: &FakeApi, namespace: &str, name: &str, uid: &str) {
    cp.put(
        &analysis_runs(),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"metrics": []}
        }),
    );
}

/// Job `job` (a marked Job of an agent record) relabelled for destination `a`, the fake cluster
/// an agent under test runs in: what the server would have written for `a`.
pub(crate) fn relabel_for_a(job: &mut Value) {
    for labels in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(l) = job.pointer_mut(labels) {
            l[dispatch_server::job::LABEL_DESTINATION] = json!("a");
        }
    }
}

/// Ensures measurement 1 of metric `smoke` of `run` on agent destination `edge` of `w` and
/// returns the record the server wrote for its agent.
pub(crate) async fn edge_record(
    w: &crate::world::World,
    run: &dispatch_server::job::RunContext,
) -> Result<dispatch_server::store::DispatchJob> {
    use crate::world::{block, request};
    let ensured = w
        .engine
        .ensure(&request(
            run,
            "smoke",
            1,
            block(json!({"destination": "edge"}))?,
        ))
        .await?;
    w.engine
        .store()
        .context("agents")?
        .get(&dispatch_server::store::record_name(
            &ensured.job.name,
            "edge",
        ))
        .context("the record")
}
