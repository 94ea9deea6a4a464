//! Where a pod lands and what selects it (issue #27): the scheduling fields of the pod spec, and
//! the pod template's labels and annotations, each refused unless the profile allows it.
//!
//! Scheduling fields decide the node (tolerations for the control plane's taints with a
//! `nodeSelector` make the `nodeName` ban cosmetic), the priority (`system-node-critical`
//! preempts other pods), the runtime and name resolution (`hostAliases`, `dnsConfig`): a rule
//! lists the ones its Jobs may set (`scheduling`). Labels decide which Services send the pod
//! traffic and which NetworkPolicies apply to it, annotations which mutating webhooks act on it
//! (sidecar and secret injectors): the template's own keys must match `podLabels` /
//! `podAnnotations`. Our reserved labels stay ours (`check_labels` in `mod.rs`).

use serde_json::{Map, Value};

use super::allowlists::{Allowlists, SchedulingField};
use super::{is_set, meaningful, shown, violation, yaml_scalar, Needs, Violation};
use crate::glob::glob_match;

const POD: &str = "spec.template.spec";

/// What each scheduling field would let a tenant do, for the refusal.
fn why(field: SchedulingField) -> &'static str {
    match field {
        SchedulingField::Tolerations => {
            "lets the pod onto tainted nodes (the control plane's, dedicated pools)"
        }
        SchedulingField::NodeSelector | SchedulingField::Affinity => {
            "picks the nodes the pod runs on"
        }
        SchedulingField::PriorityClassName => {
            "sets the pod's priority, which can preempt other pods (system-node-critical)"
        }
        SchedulingField::RuntimeClassName => "picks the runtime the pod's containers run in",
        SchedulingField::HostAliases => "rewrites the pod's /etc/hosts (the names it calls)",
        SchedulingField::DnsConfig | SchedulingField::DnsPolicy => {
            "changes how the pod resolves names"
        }
        SchedulingField::SchedulerName => "hands the pod to another scheduler",
        SchedulingField::TopologySpreadConstraints => "places the pod by node topology",
        SchedulingField::Overhead => "declares runtime overhead, which a RuntimeClass sets",
        SchedulingField::PreemptionPolicy => "decides whether the pod preempts others",
        SchedulingField::ResourceClaims => {
            "claims devices, or a ResourceClaim of the namespace, for the pod"
        }
    }
}

fn allow_field(field: SchedulingField) -> Needs {
    Needs::Allow {
        remedy: "remove it from the AnalysisTemplate".into(),
        rule: format!("`scheduling: [{field}]`"),
        flag: format!("`rollouts-dispatch agent --scheduling {field}`"),
    }
}

/// Refuses the first scheduling field `pod` sets that `allow` does not list. Empty values
/// (`tolerations: []`) are what the API server drops, so they pass; so does `dnsPolicy:
/// ClusterFirst`, the default.
pub(super) fn check_scheduling(
    pod: &Map<String, Value>,
    allow: &Allowlists,
) -> Result<(), Violation> {
    for field in SchedulingField::ALL {
        let v = pod.get(field.as_str());
        if !meaningful(v) || allow.scheduling.contains(&field) {
            continue;
        }
        if field == SchedulingField::DnsPolicy && v.and_then(Value::as_str) == Some("ClusterFirst")
        {
            continue;
        }
        return Err(violation(
            format!("{POD}.{field}"),
            format!(
                "{} {}; the profile's `scheduling` does not list it",
                shown(v),
                why(field)
            ),
            allow_field(field),
        ));
    }
    // Admission derives `priority` from `priorityClassName`; a template setting it directly asks
    // for the same thing.
    let class = SchedulingField::PriorityClassName;
    if is_set(pod.get("priority")) && !allow.scheduling.contains(&class) {
        return Err(violation(
            format!("{POD}.priority"),
            format!(
                "{} {}; the profile's `scheduling` does not list {class}",
                shown(pod.get("priority")),
                why(class)
            ),
            allow_field(class),
        ));
    }
    Ok(())
}

/// Refuses the first label or annotation of the pod template (`meta`, its `metadata`) whose key
/// the profile does not allow; the labels of `ours` are ours and always pass.
pub(super) fn check_pod_metadata(
    meta: &Value,
    allow: &Allowlists,
    ours: &[(String, String)],
) -> Result<(), Violation> {
    const AT: &str = "spec.template.metadata";
    let keys = |field: &str| -> Vec<String> {
        meta.get(field)
            .and_then(Value::as_object)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    for key in keys("labels") {
        if ours.iter().any(|(k, _)| *k == key)
            || allow.pod_labels.iter().any(|g| glob_match(g, &key))
        {
            continue;
        }
        return Err(violation(
            format!("{AT}.labels[{key:?}]"),
            format!(
                "label {key:?} is not in the profile's `podLabels`: a pod's labels decide which \
                 Services send it traffic and which NetworkPolicies apply to it"
            ),
            Needs::Allow {
                remedy: "remove it from the pod template (labels of the Job itself, the block's `metadata`, are free)".into(),
                rule: format!("`podLabels: [{}]`", yaml_scalar(&key)),
                flag: format!("`rollouts-dispatch agent --pod-labels {key}`"),
            },
        ));
    }
    for key in keys("annotations") {
        if allow.pod_annotations.iter().any(|g| glob_match(g, &key)) {
            continue;
        }
        return Err(violation(
            format!("{AT}.annotations[{key:?}]"),
            format!(
                "annotation {key:?} is not in the profile's `podAnnotations`: a pod's annotations \
                 can trigger admission webhooks (sidecar, secret or credential injectors)"
            ),
            Needs::Allow {
                remedy: "remove it from the pod template".into(),
                rule: format!("`podAnnotations: [{}]`", yaml_scalar(&key)),
                flag: format!("`rollouts-dispatch agent --pod-annotations {key}`"),
            },
        ));
    }
    Ok(())
}
