//! The verification Job: deterministic name, labels, annotations, injected context and spec (pure).
//!
//! A Job is built from the validated plugin block ([`JobConfig`]) and the AnalysisRun it
//! measures ([`RunContext`]). The spec stays JSON so that fields this build of `k8s-openapi`
//! does not know survive the trip to the destination's API server.

use std::collections::BTreeMap;

use dispatch_api::block::{Check, JobConfig};
use dispatch_api::names::{is_dns_subdomain, is_label_value};
use k8s_openapi::api::batch::v1::Job;
use serde_json::{json, Map, Value};

pub mod lifecycle;
pub mod mark;

/// Label: the AnalysisRun's UID. Our own key, not Argo Rollouts': the controller's built-in job
/// provider lists every Job carrying its `analysisrun.argoproj.io/uid` label with that run's UID
/// in `GarbageCollect` and deletes all but the newest `limit` of them, whatever their metric
/// (argo-rollouts metricproviders/job/job.go:334-352, its informer selects on the key alone:
/// cmd/rollouts-controller/main.go:186), so on the controller's cluster it would count and
/// delete our Jobs too.
pub const LABEL_RUN_UID: &str = "rollouts-dispatch.io/run-uid";
/// Label: the AnalysisRun's UID under Argo Rollouts' key, which Jobs created before
/// [`LABEL_RUN_UID`] carry. Read (never written) so that those Jobs stay ours: adopted, deleted
/// by terminate, gc and the sweep ([`run_uid_of`]).
pub const LABEL_ARGO_RUN_UID: &str = "analysisrun.argoproj.io/uid";
/// Label: `true` on every Job and Pod this project creates; the watch caches select on it.
pub const LABEL_MANAGED: &str = "rollouts-dispatch.io/managed";
/// Label: the destination name, made label-safe (see [`destination_label_value`]).
pub const LABEL_DESTINATION: &str = "rollouts-dispatch.io/destination";
/// Label prefixes (and whole keys) that belong to rollouts-dispatch and the Job controller: a pod
/// carrying them could pass for one of ours, or for another Job's pod (and match its Services).
/// Argo Rollouts' run-uid key is reserved too: its job provider's `GarbageCollect` would count a
/// Job carrying it as one of that run's and delete it (see [`LABEL_RUN_UID`]). `podsecurity`
/// refuses them in a tenant's template; the mark's digest leaves them out (`mark`).
pub const RESERVED_LABEL_PREFIXES: &[&str] = &[
    "rollouts-dispatch.io/",
    LABEL_ARGO_RUN_UID,
    "batch.kubernetes.io/",
    "controller-uid",
    "job-name",
];
/// The label selector of the watch caches.
pub const MANAGED_SELECTOR: &str = "rollouts-dispatch.io/managed=true";

/// Annotation: the AnalysisRun's name.
pub const ANN_RUN_NAME: &str = "analysisrun.argoproj.io/name";
/// Annotation: the AnalysisRun's namespace (the Kargo project).
pub const ANN_RUN_NAMESPACE: &str = "analysisrun.argoproj.io/namespace";
/// Annotation: the metric name.
pub const ANN_METRIC: &str = "analysisrun.argoproj.io/metric-name";
/// Annotation: the measurement index `n` of the Job name.
pub const ANN_MEASUREMENT: &str = "rollouts-dispatch.io/measurement";
/// Annotation: the full destination name.
pub const ANN_DESTINATION: &str = "rollouts-dispatch.io/destination";
/// Annotation: the Kargo project.
pub const ANN_KARGO_PROJECT: &str = "rollouts-dispatch.io/kargo-project";
/// Annotation: the Kargo Stage.
pub const ANN_KARGO_STAGE: &str = "rollouts-dispatch.io/kargo-stage";
/// Annotation: the Kargo freight collection.
pub const ANN_KARGO_FREIGHT_COLLECTION: &str = "rollouts-dispatch.io/kargo-freight-collection";
/// Annotation: the Kargo Promotion.
pub const ANN_KARGO_PROMOTION: &str = "rollouts-dispatch.io/kargo-promotion";

/// Kargo's label (and, when the label was shortened, annotation) with the Stage name.
pub const KARGO_STAGE: &str = "kargo.akuity.io/stage";
/// Kargo's label with the freight collection ID.
pub const KARGO_FREIGHT_COLLECTION: &str = "kargo.akuity.io/freight-collection";
/// Kargo's annotation with the Promotion name.
pub const KARGO_PROMOTION: &str = "kargo.akuity.io/promotion";

/// Kubernetes' limit on a Job name that also becomes a pod label value.
pub const MAX_NAME: usize = 63;

/// The AnalysisRun a measurement belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunContext {
    /// `metadata.name`
    pub name: String,
    /// `metadata.namespace` (the Kargo project)
    pub namespace: String,
    /// `metadata.uid`
    pub uid: String,
    /// `metadata.labels`
    pub labels: BTreeMap<String, String>,
    /// `metadata.annotations`
    pub annotations: BTreeMap<String, String>,
}

/// What Kargo recorded on the AnalysisRun.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KargoContext {
    /// the project (the run's namespace)
    pub project: String,
    /// the Stage, full name
    pub stage: String,
    /// the freight collection ID, if labelled
    pub freight_collection: Option<String>,
    /// the Promotion, if annotated: Kargo v1.11 annotates the first verification of a freight
    /// collection and a reverify through its API, never a reverify requested by annotating the
    /// Stage (akuity/kargo v1.11.2 pkg/controller/stages/regular_stages.go:1540-1546)
    pub promotion: Option<String>,
}

impl RunContext {
    /// The Stage name: Kargo's annotation (present when the label was shortened), else the label.
    pub fn kargo_stage(&self) -> Option<&str> {
        self.annotations
            .get(KARGO_STAGE)
            .or_else(|| self.labels.get(KARGO_STAGE))
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    /// The Kargo context, when Kargo created this run (it carries the stage label).
    pub fn kargo(&self) -> Option<KargoContext> {
        let stage = self.kargo_stage()?.to_string();
        Some(KargoContext {
            project: self.namespace.clone(),
            stage,
            freight_collection: self.labels.get(KARGO_FREIGHT_COLLECTION).cloned(),
            promotion: self.annotations.get(KARGO_PROMOTION).cloned(),
        })
    }
}

/// Why a Job could not be built from the plugin block: each message names the field to fix.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A field that must be an object is something else.
    #[error("invalid job spec: `{field}` must be an object")]
    NotAnObject {
        /// the field's path, e.g. `spec.template.metadata`
        field: String,
    },
    /// A field that must be a list is something else.
    #[error("invalid job spec: `{field}` must be a list")]
    NotAList {
        /// the field's path, e.g. `spec.template.spec.containers[0].env`
        field: String,
    },
    /// The template has no pod spec.
    #[error("invalid job spec: `spec.template.spec` is missing: add the pod spec")]
    NoPodSpec,
    /// The pod spec has no container.
    #[error(
        "invalid job spec: `spec.template.spec.containers` is empty: add at least one container"
    )]
    NoContainers,
    /// The block observes a Rollout or an Application: it has no Job to build.
    #[error("the block has no `spec`: a `{0}` check creates no Job")]
    ObserveCheck(&'static str),
    /// The whole object is not a `batch/v1` Job (a field of the wrong type).
    #[error("invalid job spec: {0}; compare the spec with batch/v1 JobSpec")]
    NotAJob(#[source] serde_json::Error),
}

impl BuildError {
    fn not_an_object(field: impl Into<String>) -> Self {
        Self::NotAnObject {
            field: field.into(),
        }
    }
}

/// Everything [`build`] needs.
#[derive(Debug, Clone, Copy)]
pub struct JobInput<'a> {
    /// the run being measured
    pub run: &'a RunContext,
    /// the metric name
    pub metric: &'a str,
    /// the measurement index `n` (count + error + 1)
    pub measurement: u32,
    /// the validated plugin block
    pub config: &'a JobConfig,
    /// the destination name
    pub destination: &'a str,
    /// the namespace on the destination
    pub namespace: &'a str,
}

/// The Job name: `<run-uid>.<metric>.<n>` like Argo Rollouts' built-in provider; when that is
/// longer than 63 characters or not a valid name, the metric part is cut (and lowercased, invalid
/// characters replaced) and a short hash of the full metric name keeps names distinct.
pub fn job_name(run_uid: &str, metric: &str, measurement: u32) -> String {
    let plain = format!("{run_uid}.{metric}.{measurement}");
    if plain.len() <= MAX_NAME && is_dns_subdomain(&plain) {
        return plain;
    }
    let hash = format!("{:08x}", fnv1a(metric.as_bytes()) as u32);
    let n = measurement.to_string();
    let uid = sanitize(run_uid);
    // <uid>.<metric-part>-<hash>.<n>
    let budget = MAX_NAME.saturating_sub(uid.len() + n.len() + hash.len() + 3);
    let mut part: String = sanitize(metric).chars().take(budget).collect();
    while part.ends_with(['-', '.']) {
        part.pop();
    }
    let middle = if part.is_empty() {
        hash
    } else {
        format!("{part}-{hash}")
    };
    let mut name = format!("{uid}.{middle}.{n}");
    if name.len() > MAX_NAME {
        // Only a run UID far longer than Kubernetes' 36-character UIDs gets here.
        let h = format!("{:016x}", fnv1a(plain.as_bytes()));
        name = format!("rd-{h}.{n}");
    }
    name
}

/// A destination name as a label value: itself when valid, else a cleaned prefix plus a hash.
pub fn destination_label_value(name: &str) -> String {
    if is_label_value(name) {
        return name.to_string();
    }
    let hash = format!("{:08x}", fnv1a(name.as_bytes()) as u32);
    let mut part: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63 - 9)
        .collect();
    while part.ends_with(['-', '_', '.']) {
        part.pop();
    }
    while part.starts_with(['-', '_', '.']) {
        part.remove(0);
    }
    if part.is_empty() {
        hash
    } else {
        format!("{part}-{hash}")
    }
}

/// The env vars injected into every container (unless a container already sets one).
pub fn context_env(
    run: &RunContext,
    metric: &str,
    destination: &str,
) -> Vec<(&'static str, String)> {
    let mut env = Vec::new();
    if let Some(k) = run.kargo() {
        env.push(("KARGO_PROJECT", k.project));
        env.push(("KARGO_STAGE", k.stage));
        if let Some(f) = k.freight_collection {
            env.push(("KARGO_FREIGHT_COLLECTION", f));
        }
        if let Some(p) = k.promotion {
            env.push(("KARGO_PROMOTION", p));
        }
    }
    env.push(("ANALYSIS_RUN_NAME", run.name.clone()));
    env.push(("ANALYSIS_RUN_NAMESPACE", run.namespace.clone()));
    env.push(("ANALYSIS_RUN_UID", run.uid.clone()));
    env.push(("ANALYSIS_METRIC", metric.to_string()));
    env.push(("DISPATCH_DESTINATION", destination.to_string()));
    env
}

/// Builds the Job as JSON (apiVersion, kind, metadata, spec) for `input`.
pub fn build(input: &JobInput<'_>) -> Result<Value, BuildError> {
    let JobInput {
        run,
        metric,
        measurement,
        config,
        destination,
        namespace,
    } = *input;
    let name = job_name(&run.uid, metric, measurement);
    let dest_label = destination_label_value(destination);

    let mut labels: Map<String, Value> = config
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let ours = [
        (LABEL_RUN_UID, run.uid.as_str()),
        (LABEL_MANAGED, "true"),
        (LABEL_DESTINATION, dest_label.as_str()),
    ];
    for (k, v) in ours {
        labels.insert(k.into(), v.into());
    }

    let mut annotations: Map<String, Value> = config
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let measurement_s = measurement.to_string();
    for (k, v) in [
        (ANN_RUN_NAME, run.name.as_str()),
        (ANN_RUN_NAMESPACE, run.namespace.as_str()),
        (ANN_METRIC, metric),
        (ANN_MEASUREMENT, measurement_s.as_str()),
        (ANN_DESTINATION, destination),
    ] {
        annotations.insert(k.into(), v.into());
    }
    if let Some(k) = run.kargo() {
        annotations.insert(ANN_KARGO_PROJECT.into(), k.project.into());
        annotations.insert(ANN_KARGO_STAGE.into(), k.stage.into());
        if let Some(f) = k.freight_collection {
            annotations.insert(ANN_KARGO_FREIGHT_COLLECTION.into(), f.into());
        }
        if let Some(p) = k.promotion {
            annotations.insert(ANN_KARGO_PROMOTION.into(), p.into());
        }
    }

    let mut spec = match &config.check {
        Check::Job(spec) => spec.clone(),
        Check::Observe(o) => return Err(BuildError::ObserveCheck(o.kind())),
    };
    if let Some(deadline) = config.active_deadline {
        let secs = deadline.as_secs() + u64::from(deadline.subsec_nanos() > 0);
        let secs = secs.max(1);
        let current = spec.get("activeDeadlineSeconds").and_then(Value::as_u64);
        let effective = current.map_or(secs, |c| c.min(secs));
        spec.insert("activeDeadlineSeconds".into(), effective.into());
    }
    let template = spec
        .get_mut("template")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| BuildError::not_an_object("spec.template"))?;

    // Pods carry our labels too: the pod watch cache selects on them.
    let tmeta = template
        .entry("metadata")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| BuildError::not_an_object("spec.template.metadata"))?;
    let tlabels = tmeta
        .entry("labels")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or_else(|| BuildError::not_an_object("spec.template.metadata.labels"))?;
    for (k, v) in ours {
        tlabels.insert(k.into(), v.into());
    }

    let pod_spec = template
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or(BuildError::NoPodSpec)?;
    let env = context_env(run, metric, destination);
    let mut containers = 0;
    for list in ["initContainers", "containers"] {
        let Some(items) = pod_spec.get_mut(list) else {
            continue;
        };
        let items = items.as_array_mut().ok_or_else(|| BuildError::NotAList {
            field: format!("spec.template.spec.{list}"),
        })?;
        for (i, c) in items.iter_mut().enumerate() {
            let c = c.as_object_mut().ok_or_else(|| {
                BuildError::not_an_object(format!("spec.template.spec.{list}[{i}]"))
            })?;
            inject_env(c, &env, || format!("spec.template.spec.{list}[{i}].env"))?;
            // Real kubelets then put the log tail of a failed container into its
            // `state.terminated.message`, which costs no log API call to read.
            c.entry("terminationMessagePolicy")
                .or_insert_with(|| "FallbackToLogsOnError".into());
            if list == "containers" {
                containers += 1;
            }
        }
    }
    if containers == 0 {
        return Err(BuildError::NoContainers);
    }

    let job = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    });
    // Type-check the whole object once, so a wrong type is reported with its field here
    // instead of as an opaque API error.
    serde_json::from_value::<Job>(job.clone()).map_err(BuildError::NotAJob)?;
    Ok(job)
}

/// Adds the vars of `env` the container does not set; `field` is the path of its `env`, for
/// the error when that is not a list.
fn inject_env(
    container: &mut Map<String, Value>,
    env: &[(&str, String)],
    field: impl FnOnce() -> String,
) -> Result<(), BuildError> {
    let list = container.entry("env").or_insert_with(|| json!([]));
    if list.is_null() {
        *list = json!([]);
    }
    let list = list
        .as_array_mut()
        .ok_or_else(|| BuildError::NotAList { field: field() })?;
    for (name, value) in env {
        let present = list
            .iter()
            .any(|e| e.get("name").and_then(Value::as_str) == Some(name));
        if !present {
            list.push(json!({"name": name, "value": value}));
        }
    }
    Ok(())
}

/// The name of the Job that controls `pod` (its controller owner reference of kind `Job`).
pub fn controlling_job(pod: &k8s_openapi::api::core::v1::Pod) -> Option<&str> {
    pod.metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.kind == "Job" && o.controller == Some(true))
        .map(|o| o.name.as_str())
}

/// Whether an existing Job with our name belongs to this run and was created by us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// ours: adopt it
    Ours,
    /// someone else's: never touch it; the reason says whose
    Foreign(String),
}

/// The run UID in `labels`: [`LABEL_RUN_UID`], else (a Job created before it) Argo's
/// [`LABEL_ARGO_RUN_UID`]. Never Argo's when ours is there, whatever it says: a template cannot
/// move one of our Jobs to another run with it.
pub fn run_uid_of(labels: &BTreeMap<String, String>) -> Option<(&'static str, &str)> {
    [LABEL_RUN_UID, LABEL_ARGO_RUN_UID]
        .into_iter()
        .find_map(|k| labels.get(k).map(|v| (k, v.as_str())))
}

/// Decides [`Ownership`] of `job` for the run `run_uid`.
pub fn ownership(job: &Job, run_uid: &str) -> Ownership {
    let labels = job.metadata.labels.as_ref();
    let managed = labels
        .and_then(|l| l.get(LABEL_MANAGED))
        .map(String::as_str);
    match (managed, labels.and_then(run_uid_of)) {
        (Some("true"), Some((_, uid))) if uid == run_uid => Ownership::Ours,
        (Some("true"), Some((key, uid))) => Ownership::Foreign(format!(
            "it belongs to another AnalysisRun (label {key}={uid})"
        )),
        _ => Ownership::Foreign(format!(
            "it was not created by rollouts-dispatch (no label {MANAGED_SELECTOR})"
        )),
    }
}

fn sanitize(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    while out.starts_with('-') {
        out.remove(0);
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// FNV-1a, 64 bit: a stable hash for name shortening (never changes between versions).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const UID: &str = "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a";

    fn set_spec(cfg: &mut JobConfig, field: &str, value: u64) {
        if let Check::Job(spec) = &mut cfg.check {
            spec.insert(field.into(), value.into());
        }
    }

    pub(crate) fn config(spec: Value) -> JobConfig {
        let mut block = json!({"destination": "a", "spec": spec});
        if let Some(o) = block.as_object_mut() {
            o.insert(
                "metadata".into(),
                json!({"labels": {"team": "x", LABEL_MANAGED: "false"}, "annotations": {"note": "n"}}),
            );
        }
        JobConfig::parse(block.to_string().as_bytes()).unwrap()
    }

    fn spec() -> Value {
        json!({"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "check", "image": "busybox", "env": [{"name": "ANALYSIS_METRIC", "value": "mine"}]},
            {"name": "side", "image": "busybox", "terminationMessagePolicy": "File"}
        ], "initContainers": [{"name": "init", "image": "busybox"}]}}})
    }

    fn kargo_run() -> RunContext {
        RunContext {
            name: "uat.01jjqaq7qacfn766tcp1nqz2zv.55d4523".into(),
            namespace: "kargo-demo".into(),
            uid: UID.into(),
            labels: BTreeMap::from([
                (KARGO_STAGE.into(), "uat-short".into()),
                (KARGO_FREIGHT_COLLECTION.into(), "55d4523abc".into()),
            ]),
            annotations: BTreeMap::from([
                (KARGO_STAGE.into(), "uat-full-name".into()),
                (KARGO_PROMOTION.into(), "uat.promo.1".into()),
            ]),
        }
    }

    fn env_of(job: &Value, container: usize) -> BTreeMap<String, String> {
        job["spec"]["template"]["spec"]["containers"][container]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["value"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn names_follow_the_builtin_provider() {
        assert_eq!(job_name(UID, "alb-e2e", 1), format!("{UID}.alb-e2e.1"));
        let long = job_name(UID, "a-very-long-metric-name-that-does-not-fit", 12);
        assert!(long.len() <= MAX_NAME, "{long}");
        assert!(is_dns_subdomain(&long), "{long}");
        assert!(
            long.starts_with(&format!("{UID}.a-very")) && long.ends_with(".12"),
            "{long}"
        );
        // Different long metrics with a shared prefix stay distinct; the same input is stable.
        let other = job_name(UID, "a-very-long-metric-name-that-does-not-fit-2", 12);
        assert_ne!(long, other);
        assert_eq!(
            long,
            job_name(UID, "a-very-long-metric-name-that-does-not-fit", 12)
        );
        // Invalid characters are replaced, not passed to the API server.
        let odd = job_name(UID, "Check_HTTP", 1);
        assert!(
            is_dns_subdomain(&odd) && odd.contains("check-http-"),
            "{odd}"
        );
        // A UID far longer than Kubernetes' still yields a valid name.
        let weird = job_name(&"x".repeat(80), "m", 1);
        assert!(
            weird.len() <= MAX_NAME && is_dns_subdomain(&weird),
            "{weird}"
        );
    }

    #[test]
    fn destination_labels_are_valid() {
        assert_eq!(destination_label_value("prod-eu"), "prod-eu");
        let arn = destination_label_value("arn:aws:eks:eu-west-1:123456789012:cluster/prod");
        assert!(is_label_value(&arn), "{arn}");
        assert!(arn.starts_with("arn-aws-eks"), "{arn}");
        assert!(is_label_value(&destination_label_value(&"x".repeat(100))));
        assert!(is_label_value(&destination_label_value("::")));
    }

    #[test]
    fn build_sets_identity_context_and_policy() {
        let cfg = config(spec());
        let run = kargo_run();
        let job = build(&JobInput {
            run: &run,
            metric: "alb-e2e",
            measurement: 3,
            config: &cfg,
            destination: "prod-eu",
            namespace: "verification",
        })
        .unwrap();
        let meta = &job["metadata"];
        assert_eq!(meta["name"], format!("{UID}.alb-e2e.3"));
        assert_eq!(meta["namespace"], "verification");
        assert_eq!(meta["labels"][LABEL_RUN_UID], UID);
        assert_eq!(LABEL_RUN_UID, "rollouts-dispatch.io/run-uid");
        // Never Argo's key: its job provider's GarbageCollect would count (and delete) the Job.
        assert!(meta["labels"].get(LABEL_ARGO_RUN_UID).is_none());
        assert!(job["spec"]["template"]["metadata"]["labels"]
            .get(LABEL_ARGO_RUN_UID)
            .is_none());
        // Our managed label wins over the user's.
        assert_eq!(meta["labels"][LABEL_MANAGED], "true");
        assert_eq!(meta["labels"][LABEL_DESTINATION], "prod-eu");
        assert_eq!(meta["labels"]["team"], "x");
        assert_eq!(meta["annotations"][ANN_MEASUREMENT], "3");
        assert_eq!(meta["annotations"][ANN_KARGO_STAGE], "uat-full-name");
        assert_eq!(meta["annotations"][ANN_KARGO_PROMOTION], "uat.promo.1");
        assert_eq!(meta["annotations"]["note"], "n");
        let tlabels = &job["spec"]["template"]["metadata"]["labels"];
        assert_eq!(tlabels[LABEL_MANAGED], "true");
        assert_eq!(tlabels[LABEL_RUN_UID], UID);

        let env = env_of(&job, 0);
        assert_eq!(env["KARGO_PROJECT"], "kargo-demo");
        assert_eq!(env["KARGO_STAGE"], "uat-full-name");
        assert_eq!(env["KARGO_FREIGHT_COLLECTION"], "55d4523abc");
        assert_eq!(env["KARGO_PROMOTION"], "uat.promo.1");
        assert_eq!(env["ANALYSIS_RUN_UID"], UID);
        assert_eq!(env["DISPATCH_DESTINATION"], "prod-eu");
        // The user's value is kept, and not duplicated.
        assert_eq!(env["ANALYSIS_METRIC"], "mine");
        let n = job["spec"]["template"]["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "ANALYSIS_METRIC")
            .count();
        assert_eq!(n, 1);
        assert_eq!(env_of(&job, 1)["ANALYSIS_METRIC"], "alb-e2e");
        let init_env = &job["spec"]["template"]["spec"]["initContainers"][0]["env"];
        assert!(init_env.as_array().unwrap().len() >= 5);

        let c = &job["spec"]["template"]["spec"]["containers"];
        assert_eq!(c[0]["terminationMessagePolicy"], "FallbackToLogsOnError");
        assert_eq!(c[1]["terminationMessagePolicy"], "File");
        assert!(job["spec"].get("activeDeadlineSeconds").is_none());
    }

    #[test]
    fn a_plain_run_gets_no_kargo_context() {
        let cfg = config(spec());
        let run = RunContext {
            name: "r".into(),
            namespace: "ns".into(),
            uid: UID.into(),
            ..RunContext::default()
        };
        let env = context_env(&run, "m", "d");
        assert!(env.iter().all(|(k, _)| !k.starts_with("KARGO_")));
        let job = build(&JobInput {
            run: &run,
            metric: "m",
            measurement: 1,
            config: &cfg,
            destination: "d",
            namespace: "ns",
        })
        .unwrap();
        assert!(job["metadata"]["annotations"]
            .get(ANN_KARGO_STAGE)
            .is_none());
    }

    #[test]
    fn active_deadline_sets_and_tightens() {
        let mut cfg = config(spec());
        cfg.active_deadline = Some(Duration::from_millis(1500));
        let run = kargo_run();
        let input = |cfg: &JobConfig| {
            build(&JobInput {
                run: &run,
                metric: "m",
                measurement: 1,
                config: cfg,
                destination: "d",
                namespace: "ns",
            })
            .unwrap()
        };
        assert_eq!(input(&cfg)["spec"]["activeDeadlineSeconds"], 2);
        set_spec(&mut cfg, "activeDeadlineSeconds", 1);
        assert_eq!(input(&cfg)["spec"]["activeDeadlineSeconds"], 1);
        set_spec(&mut cfg, "activeDeadlineSeconds", 600);
        assert_eq!(input(&cfg)["spec"]["activeDeadlineSeconds"], 2);
    }

    #[test]
    fn bad_specs_name_the_field() {
        let run = kargo_run();
        for (spec, needle) in [
            (
                json!({"template": {"spec": {"containers": []}}}),
                "containers` is empty",
            ),
            (
                json!({"template": {"metadata": 1, "spec": {}}}),
                "template.metadata",
            ),
            (json!({"template": {}}), "template.spec` is missing"),
            (
                json!({"template": {"spec": {"containers": [{"name": "c", "env": {}}]}}}),
                "containers[0].env",
            ),
            (
                json!({"backoffLimit": "zero", "template": {"spec": {"containers": [{"name": "c"}]}}}),
                "JobSpec",
            ),
        ] {
            let cfg = config(spec);
            let e = build(&JobInput {
                run: &run,
                metric: "m",
                measurement: 1,
                config: &cfg,
                destination: "d",
                namespace: "ns",
            })
            .unwrap_err();
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn ownership_is_by_label() {
        let mut job = Job::default();
        assert!(matches!(ownership(&job, UID), Ownership::Foreign(r) if r.contains("not created")));
        job.metadata.labels = Some(BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_RUN_UID.to_string(), "other".to_string()),
        ]));
        assert!(matches!(ownership(&job, UID), Ownership::Foreign(r) if r.contains("another")));
        job.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(LABEL_RUN_UID.into(), UID.into());
        assert_eq!(ownership(&job, UID), Ownership::Ours);
    }

    #[test]
    fn jobs_labelled_before_our_own_label_stay_ours() {
        let mut job = Job::default();
        let labels = |pairs: &[(&str, &str)]| {
            Some(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        // Created before the change: Argo's key only.
        job.metadata.labels = labels(&[(LABEL_MANAGED, "true"), (LABEL_ARGO_RUN_UID, UID)]);
        assert_eq!(ownership(&job, UID), Ownership::Ours);
        assert!(matches!(ownership(&job, "other"),
            Ownership::Foreign(r) if r.contains(LABEL_ARGO_RUN_UID)));
        // Ours decides when both are there: Argo's key cannot move a Job to another run.
        job.metadata.labels = labels(&[
            (LABEL_MANAGED, "true"),
            (LABEL_RUN_UID, UID),
            (LABEL_ARGO_RUN_UID, "victim"),
        ]);
        assert_eq!(ownership(&job, UID), Ownership::Ours);
        assert!(matches!(ownership(&job, "victim"),
            Ownership::Foreign(r) if r.contains(LABEL_RUN_UID)));
    }
}
