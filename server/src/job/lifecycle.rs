//! How a Job of ours ends without anyone deleting it: `spec.ttlSecondsAfterFinished` (the
//! destination's TTL controller removes it once it is done), and, when it runs next to its
//! AnalysisRun, an owner reference to the run (Kubernetes' garbage collector removes it with
//! the run). Applied to the built Job (JSON) by the engine, after pod security and before the
//! adoption mark (neither field is part of the mark's digest).

use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobCondition};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use super::RunContext;

/// The API version of the AnalysisRun an owner reference points to.
pub const RUN_API_VERSION: &str = "argoproj.io/v1alpha1";
/// The kind of the AnalysisRun an owner reference points to.
pub const RUN_KIND: &str = "AnalysisRun";

/// The conditions the Job controller sets when a Job ends (`Complete` or `Failed`, true).
fn end_conditions(job: &Job) -> impl Iterator<Item = &JobCondition> {
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
}

/// Whether the Job has ended (it will run no more Pods).
pub fn has_ended(job: &Job) -> bool {
    end_conditions(job).next().is_some()
}

/// When the Job ended: the latest transition of its `Complete`/`Failed` condition.
pub fn ended_at(job: &Job) -> Option<Timestamp> {
    end_conditions(job)
        .filter_map(|c| Some(c.last_transition_time.as_ref()?.0))
        .max()
}

/// Sets `spec.ttlSecondsAfterFinished` to `ttl` (whole seconds, rounded up) unless the
/// template's spec sets it already: the template's value wins, whatever it is.
pub fn set_ttl(job: &mut Value, ttl: Duration) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let set = spec
        .get("ttlSecondsAfterFinished")
        .is_some_and(|v| !v.is_null());
    if !set {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        spec.insert("ttlSecondsAfterFinished".into(), secs.into());
    }
}

/// Whether a Job gets an owner reference to its run: only on the run's own cluster (the
/// destination is the control plane) and in the run's own namespace, as owner and dependent
/// must share a namespace. Anywhere else Kubernetes' garbage collector would look the owner up
/// where it does not exist and delete the Job at once.
pub fn owned_by_run(on_control_plane: bool, job_namespace: &str, run: &RunContext) -> bool {
    on_control_plane
        && job_namespace == run.namespace
        && !run.name.is_empty()
        && !run.uid.is_empty()
}

/// The owner reference to `run`. Argo Rollouts' own job provider sets a controller reference
/// (`metav1.NewControllerRef`: `controller` and `blockOwnerDeletion` true) and only in the run's
/// namespace (argo-rollouts metricproviders/job/job.go:126 and :136-137). Ours sets both false:
/// the run does not control our Job, and Argo's analysis controller follows the controller
/// reference of Jobs to enqueue their run (analysis/controller.go:204-210); and
/// `blockOwnerDeletion: true` needs update on the run's finalizers under the
/// OwnerReferencesPermissionEnforcement admission plugin (kubernetes
/// plugin/pkg/admission/gc/gc_admission.go) and would hold a foreground deletion of the run until
/// our Job is gone.
pub fn owner_reference(run: &RunContext) -> Value {
    json!({
        "apiVersion": RUN_API_VERSION,
        "kind": RUN_KIND,
        "name": run.name,
        "uid": run.uid,
        "controller": false,
        "blockOwnerDeletion": false,
    })
}

/// Adds [`owner_reference`] to `run` to the Job's `metadata.ownerReferences`.
pub fn set_owner(job: &mut Value, run: &RunContext) {
    let Some(meta) = job.get_mut("metadata").and_then(Value::as_object_mut) else {
        return;
    };
    let refs = meta.entry("ownerReferences").or_insert_with(|| json!([]));
    if !refs.is_array() {
        *refs = json!([]);
    }
    if let Some(list) = refs.as_array_mut() {
        if !list.iter().any(|r| r["uid"] == run.uid.as_str()) {
            list.push(owner_reference(run));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> RunContext {
        RunContext {
            name: "uat.01.abc".into(),
            namespace: "kargo-demo".into(),
            uid: "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a".into(),
            ..RunContext::default()
        }
    }

    fn job(spec: Value) -> Value {
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "j", "namespace": "kargo-demo"}, "spec": spec})
    }

    #[test]
    fn the_ttl_is_the_default_unless_the_template_sets_one() {
        let mut j = job(json!({"template": {}}));
        set_ttl(&mut j, Duration::from_secs(3600));
        assert_eq!(j["spec"]["ttlSecondsAfterFinished"], 3600);
        let mut j = job(json!({"template": {}}));
        set_ttl(&mut j, Duration::from_millis(60_500));
        assert_eq!(j["spec"]["ttlSecondsAfterFinished"], 61, "rounded up");
        // The template's value wins, even 0 (deleted as soon as it finishes).
        for given in [0, 7200] {
            let mut j = job(json!({"ttlSecondsAfterFinished": given, "template": {}}));
            set_ttl(&mut j, Duration::from_secs(3600));
            assert_eq!(j["spec"]["ttlSecondsAfterFinished"], given);
        }
        // An explicit null is no value.
        let mut j = job(json!({"ttlSecondsAfterFinished": null}));
        set_ttl(&mut j, Duration::from_secs(60));
        assert_eq!(j["spec"]["ttlSecondsAfterFinished"], 60);
    }

    #[test]
    fn only_a_job_beside_its_run_is_owned_by_it() {
        let r = run();
        assert!(owned_by_run(true, "kargo-demo", &r));
        assert!(!owned_by_run(true, "verification", &r), "another namespace");
        assert!(!owned_by_run(false, "kargo-demo", &r), "another cluster");
        let nameless = RunContext {
            name: String::new(),
            ..run()
        };
        assert!(!owned_by_run(true, "kargo-demo", &nameless));
    }

    #[test]
    fn the_owner_reference_neither_controls_nor_blocks() {
        let mut j = job(json!({}));
        set_owner(&mut j, &run());
        set_owner(&mut j, &run());
        assert_eq!(
            j["metadata"]["ownerReferences"],
            json!([{"apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
                     "name": "uat.01.abc", "uid": "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a",
                     "controller": false, "blockOwnerDeletion": false}]),
            "once, however often it is set"
        );
        // Still a batch/v1 Job.
        serde_json::from_value::<k8s_openapi::api::batch::v1::Job>(j).unwrap();
    }
}
