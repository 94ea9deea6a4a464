//! The `rollout:` check's judgement (pure): an Argo Rollout and the AnalysisRuns of its current
//! revision, as JSON, → the destination's state and the notes for the measurement's metadata.
//!
//! Every field read is cited from argo-rollouts (mirror HEAD 9f8d111d8)
//! `pkg/apis/rollouts/v1alpha1/types.go` (`types.go`) and `analysis_types.go`:
//! `spec.template` (types.go:52), `spec.strategy.blueGreen` (types.go:66, :167),
//! `status.abort` (:932), `status.currentPodHash` (:952), `status.observedGeneration` (:980, a
//! *string*), `status.blueGreen.activeSelector` (:989, :1149), `status.stableRS` (:998),
//! `status.phase` (:1004, values :920-926) and `status.message` (:1006); the revision annotation
//! `rollout.argoproj.io/revision` (utils/annotations/annotations.go:22); an AnalysisRun's
//! `status.phase` (analysis_types.go:462, values :208-213), `status.message` (:464),
//! `status.metricResults[].name/phase/message` (:495-501) and `measurements[].message` (:532).

use std::collections::BTreeMap;

use dispatch_api::observe::RolloutCheck;
use dispatch_api::DestState;
use serde_json::Value;

/// The label of a Rollout's ReplicaSets, Pods and AnalysisRuns of one revision
/// (types.go:150, `DefaultRolloutUniqueLabelKey`).
pub const POD_TEMPLATE_HASH_LABEL: &str = "rollouts-pod-template-hash";
/// The Rollout's revision number (utils/annotations/annotations.go:22).
pub const REVISION_ANNOTATION: &str = "rollout.argoproj.io/revision";
/// Note: comma-separated names of the AnalysisRuns of the observed revision.
pub const NOTE_ANALYSISRUNS: &str = "analysisruns";
/// Note: the observed revision's pod-template hash.
pub const NOTE_REVISION: &str = "revision";

/// A destination's state for an observe check, and the facts for the measurement's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judged {
    /// the state, combined across destinations like a Job's
    pub state: DestState,
    /// e.g. `analysisruns`, `revision` (prefixed with the destination in the metadata)
    pub notes: BTreeMap<String, String>,
}

fn text<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn running(why: String) -> DestState {
    DestState::Running(Some(why))
}

/// Judges Rollout `object` (`namespace/name`; `rollout` `None`: not found) against `check`,
/// with `runs`, the AnalysisRuns labelled with its current pod-template hash (those not owned
/// by this Rollout are ignored).
pub fn judge(
    check: &RolloutCheck,
    object: &str,
    rollout: Option<&Value>,
    runs: &[Value],
) -> Judged {
    let mut notes = BTreeMap::new();
    let Some(r) = rollout else {
        return Judged {
            state: running(format!("rollout {object} not found")),
            notes,
        };
    };
    let status = &r["status"];
    let hash = text(status, "/currentPodHash");
    if !hash.is_empty() {
        notes.insert(NOTE_REVISION.to_string(), hash.to_string());
    }
    let mut ours: Vec<&Value> = runs.iter().filter(|run| owned_by(run, r)).collect();
    ours.sort_by_key(|run| text(run, "/metadata/name"));
    if !ours.is_empty() {
        let names: Vec<&str> = ours.iter().map(|run| text(run, "/metadata/name")).collect();
        notes.insert(NOTE_ANALYSISRUNS.to_string(), names.join(","));
    }
    let state = judge_state(check, object, r, hash, &ours);
    Judged { state, notes }
}

fn judge_state(
    check: &RolloutCheck,
    object: &str,
    r: &Value,
    hash: &str,
    runs: &[&Value],
) -> DestState {
    let status = &r["status"];
    // observedGeneration is a string in the Rollout status (types.go:980), generation a number.
    let generation = r.pointer("/metadata/generation").and_then(Value::as_i64);
    let observed = text(status, "/observedGeneration");
    if let Some(g) = generation {
        if observed != g.to_string() {
            return running(format!(
                "rollout {object}: the controller has not yet observed generation {g} (observed {:?})",
                observed
            ));
        }
    }
    let images: Vec<&str> = r
        .pointer("/spec/template/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| text(c, "/image"))
        .collect();
    let now = format!("runs {} (revision {hash:?})", images.join(", "));
    if let Some(image) = &check.image {
        if !images.contains(&image.as_str()) {
            return running(format!("rollout {object} {now}, not yet image {image}"));
        }
    }
    if let Some(rev) = &check.revision {
        let annotated = text(
            r,
            &format!(
                "/metadata/annotations/{}",
                REVISION_ANNOTATION.replace('/', "~1")
            ),
        );
        if hash != rev && annotated != rev {
            return running(format!("rollout {object} {now}, not yet revision {rev}"));
        }
    }
    if hash.is_empty() {
        return running(format!(
            "rollout {object}: the controller has not reported its current revision yet"
        ));
    }
    for run in runs {
        let phase = text(run, "/status/phase");
        if phase == "Failed" || phase == "Error" {
            return DestState::Failed {
                reason: format!("Analysis{phase}"),
                detail: failed_run(object, run),
                log: None,
            };
        }
    }
    let rollout_phase = text(status, "/phase");
    let message = text(status, "/message");
    if status["abort"].as_bool() == Some(true) || rollout_phase == "Degraded" {
        let reason = if status["abort"].as_bool() == Some(true) {
            "RolloutAborted"
        } else {
            "RolloutDegraded"
        };
        return DestState::Failed {
            reason: reason.to_string(),
            detail: format!("rollout {object} (revision {hash}): {message}"),
            log: None,
        };
    }
    if let Some(run) = runs
        .iter()
        .find(|run| text(run, "/status/phase") == "Inconclusive")
    {
        return running(format!(
            "rollout {object} is paused by an Inconclusive analysis ({}): a person must promote or abort",
            text(run, "/metadata/name")
        ));
    }
    // Fully promoted: the stable ReplicaSet is the current one (canary), or the active Service
    // selects it (blueGreen).
    let promoted = if r
        .pointer("/spec/strategy/blueGreen")
        .is_some_and(Value::is_object)
    {
        text(status, "/blueGreen/activeSelector") == hash
    } else {
        text(status, "/stableRS") == hash
    };
    let pending: Vec<String> = runs
        .iter()
        .filter(|run| text(run, "/status/phase") != "Successful")
        .map(|run| {
            let phase = text(run, "/status/phase");
            format!(
                "{} {}",
                text(run, "/metadata/name"),
                if phase.is_empty() { "Pending" } else { phase }
            )
        })
        .collect();
    // A background run still going when the Rollout completes is terminated by the controller
    // (rollout/analysis.go:448-460, cancelAnalysisRuns sets spec.terminate) and then ends
    // Successful unless a metric failed (analysis/analysis.go:560-564, :650-653): wait for it.
    if rollout_phase == "Healthy" && promoted && pending.is_empty() {
        return DestState::Succeeded;
    }
    let mut why = format!(
        "rollout {object} (revision {hash}) is {}",
        if rollout_phase.is_empty() {
            "not yet assessed"
        } else {
            rollout_phase
        }
    );
    if !message.is_empty() {
        why.push_str(&format!(": {message}"));
    }
    if rollout_phase == "Healthy" && !promoted {
        why.push_str("; not yet fully promoted");
    }
    if !pending.is_empty() {
        why.push_str(&format!("; analysis {}", pending.join(", ")));
    }
    running(why)
}

/// Whether AnalysisRun `run` is owned by Rollout `r` (its controller reference:
/// rollout/analysis.go:504), by uid when both have one.
fn owned_by(run: &Value, r: &Value) -> bool {
    let name = text(r, "/metadata/name");
    let uid = text(r, "/metadata/uid");
    run.pointer("/metadata/ownerReferences")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .any(|o| {
            text(o, "/kind") == "Rollout"
                && text(o, "/name") == name
                && (uid.is_empty() || text(o, "/uid").is_empty() || text(o, "/uid") == uid)
        })
}

/// `analysisrun <name> <phase>: metric <m>: <message>; last measurement: <message>`.
fn failed_run(object: &str, run: &Value) -> String {
    let name = text(run, "/metadata/name");
    let phase = text(run, "/status/phase");
    let mut out = format!("rollout {object}: analysisrun {name} {phase}");
    let metric = run
        .pointer("/status/metricResults")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|m| matches!(text(m, "/phase"), "Failed" | "Error"));
    match metric {
        Some(m) => {
            out.push_str(&format!(
                ": metric {:?} {}",
                text(m, "/name"),
                text(m, "/phase")
            ));
            // A built-in `job` metric leaves its own message empty; the run's
            // `status.message` then says why ("Metric \"x\" assessed Failed due to failed (1) >
            // failureLimit (0)", argo-rollouts analysis/analysis.go).
            let message = Some(text(m, "/message"))
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| text(run, "/status/message"));
            if !message.is_empty() {
                out.push_str(&format!(": {message}"));
            }
            let last = m
                .pointer("/measurements")
                .and_then(Value::as_array)
                .and_then(|ms| ms.last())
                .map(|l| text(l, "/message"))
                .filter(|s| !s.is_empty());
            if let Some(l) = last {
                out.push_str(&format!("; last measurement: {l}"));
            }
        }
        None => {
            let message = text(run, "/status/message");
            if !message.is_empty() {
                out.push_str(&format!(": {message}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(image: Option<&str>, revision: Option<&str>) -> RolloutCheck {
        RolloutCheck {
            name: "web".into(),
            namespace: None,
            image: image.map(String::from),
            revision: revision.map(String::from),
        }
    }

    /// A canary Rollout shaped like one the controller wrote.
    fn rollout(image: &str, hash: &str, stable: &str, phase: &str) -> Value {
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": "web", "namespace": "shop", "uid": "r-uid", "generation": 3,
                         "annotations": {"rollout.argoproj.io/revision": "2"}},
            "spec": {"strategy": {"canary": {"steps": [{"setWeight": 50}]}},
                     "template": {"spec": {"containers": [{"name": "web", "image": image}]}}},
            "status": {"currentPodHash": hash, "stableRS": stable, "observedGeneration": "3",
                       "phase": phase, "message": ""}
        })
    }

    fn run(name: &str, phase: &str, metrics: Value) -> Value {
        json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"rollouts-pod-template-hash": "abc123"},
                         "ownerReferences": [{"kind": "Rollout", "name": "web", "uid": "r-uid", "controller": true}]},
            "status": {"phase": phase, "metricResults": metrics}
        })
    }

    #[test]
    fn an_old_image_keeps_it_running_and_says_what_runs() {
        let r = rollout("shop/web:1", "old111", "old111", "Healthy");
        let j = judge(&check(Some("shop/web:2"), None), "shop/web", Some(&r), &[]);
        let DestState::Running(Some(why)) = &j.state else {
            panic!("{j:?}")
        };
        assert!(
            why.contains("runs shop/web:1") && why.contains("not yet image shop/web:2"),
            "{why}"
        );
        assert_eq!(j.notes[NOTE_REVISION], "old111");
        // The same by revision: neither the hash nor the annotation.
        let j = judge(&check(None, Some("3")), "shop/web", Some(&r), &[]);
        assert!(matches!(j.state, DestState::Running(_)), "{j:?}");
        // The annotation is accepted, as is the hash.
        let j = judge(&check(None, Some("2")), "shop/web", Some(&r), &[]);
        assert_eq!(j.state, DestState::Succeeded);
        let j = judge(&check(None, Some("old111")), "shop/web", Some(&r), &[]);
        assert_eq!(j.state, DestState::Succeeded);
    }

    #[test]
    fn a_generation_not_yet_observed_is_running_even_with_the_new_image() {
        let mut r = rollout("shop/web:2", "old111", "old111", "Healthy");
        r["metadata"]["generation"] = json!(4);
        let j = judge(&check(Some("shop/web:2"), None), "shop/web", Some(&r), &[]);
        let DestState::Running(Some(why)) = &j.state else {
            panic!("{j:?}")
        };
        assert!(why.contains("generation 4"), "{why}");
    }

    #[test]
    fn successful_analysis_and_full_promotion_are_successful() {
        let r = rollout("shop/web:2", "abc123", "abc123", "Healthy");
        let runs = [
            run("web-abc123-2", "Successful", json!([])),
            run("web-abc123-2-1", "Successful", json!([])),
        ];
        let j = judge(
            &check(Some("shop/web:2"), None),
            "shop/web",
            Some(&r),
            &runs,
        );
        assert_eq!(j.state, DestState::Succeeded);
        assert_eq!(j.notes[NOTE_ANALYSISRUNS], "web-abc123-2,web-abc123-2-1");
        // A background run being terminated (still Running) is waited for.
        let runs = [run("web-abc123-2", "Running", json!([]))];
        let j = judge(
            &check(Some("shop/web:2"), None),
            "shop/web",
            Some(&r),
            &runs,
        );
        let DestState::Running(Some(why)) = &j.state else {
            panic!("{j:?}")
        };
        assert!(why.contains("web-abc123-2 Running"), "{why}");
        // Healthy but not fully promoted (canary mid-way, stable still the old hash).
        let r = rollout("shop/web:2", "abc123", "old111", "Healthy");
        let j = judge(&check(None, None), "shop/web", Some(&r), &[]);
        assert!(
            matches!(&j.state, DestState::Running(Some(w)) if w.contains("not yet fully promoted")),
            "{j:?}"
        );
    }

    #[test]
    fn blue_green_is_promoted_when_the_active_service_selects_the_revision() {
        let mut r = rollout("shop/web:2", "abc123", "", "Healthy");
        r["spec"]["strategy"] = json!({"blueGreen": {"activeService": "web"}});
        r["status"]["blueGreen"] = json!({"activeSelector": "old111"});
        let j = judge(&check(None, None), "shop/web", Some(&r), &[]);
        assert!(matches!(j.state, DestState::Running(_)), "{j:?}");
        r["status"]["blueGreen"] = json!({"activeSelector": "abc123"});
        assert_eq!(
            judge(&check(None, None), "shop/web", Some(&r), &[]).state,
            DestState::Succeeded
        );
    }

    #[test]
    fn failing_analysis_names_the_run_metric_and_messages() {
        let r = rollout("shop/web:2", "abc123", "old111", "Degraded");
        let runs = [run(
            "web-abc123-2-1",
            "Failed",
            json!([{"name": "success-rate", "phase": "Failed", "message": "failed (1) > failureLimit (0)",
                    "measurements": [{"phase": "Successful", "message": "ok"},
                                     {"phase": "Failed", "message": "error rate 12%"}]}]),
        )];
        let j = judge(&check(None, None), "shop/web", Some(&r), &runs);
        let DestState::Failed { reason, detail, .. } = &j.state else {
            panic!("{j:?}")
        };
        assert_eq!(reason, "AnalysisFailed");
        for part in [
            "web-abc123-2-1",
            "\"success-rate\"",
            "failureLimit (0)",
            "last measurement: error rate 12%",
        ] {
            assert!(detail.contains(part), "{part}: {detail}");
        }
    }

    #[test]
    fn a_job_metric_without_its_own_message_quotes_the_runs() {
        // The shape the real controller writes for a failed built-in `job` metric (seen in
        // `make e2e-observe`): no metric message, the reason in the run's status.message.
        let r = rollout("shop/web:2", "abc123", "old111", "Degraded");
        let mut failed = run(
            "web-abc123-2",
            "Failed",
            json!([{"name": "shop-health", "phase": "Failed", "failed": 1,
                    "measurements": [{"phase": "Failed"}]}]),
        );
        failed["status"]["message"] =
            json!("Metric \"shop-health\" assessed Failed due to failed (1) > failureLimit (0)");
        let j = judge(&check(None, None), "shop/web", Some(&r), &[failed]);
        let DestState::Failed { detail, .. } = &j.state else {
            panic!("{j:?}")
        };
        assert!(
            detail.contains("\"shop-health\" Failed: Metric \"shop-health\" assessed Failed"),
            "{detail}"
        );
    }

    #[test]
    fn aborted_or_degraded_is_failed_with_the_rollouts_message() {
        let mut r = rollout("shop/web:2", "abc123", "old111", "Degraded");
        r["status"]["abort"] = json!(true);
        r["status"]["message"] = json!("RolloutAborted: Rollout aborted update to revision 2");
        let j = judge(&check(None, None), "shop/web", Some(&r), &[]);
        let DestState::Failed { reason, detail, .. } = &j.state else {
            panic!("{j:?}")
        };
        assert_eq!(reason, "RolloutAborted");
        assert!(detail.contains("aborted update to revision 2"), "{detail}");
        r["status"]["abort"] = json!(false);
        let j = judge(&check(None, None), "shop/web", Some(&r), &[]);
        assert!(
            matches!(&j.state, DestState::Failed { reason, .. } if reason == "RolloutDegraded"),
            "{j:?}"
        );
    }

    #[test]
    fn inconclusive_analysis_waits_for_a_person() {
        let r = rollout("shop/web:2", "abc123", "old111", "Paused");
        let runs = [run("web-abc123-2-1", "Inconclusive", json!([]))];
        let j = judge(&check(None, None), "shop/web", Some(&r), &runs);
        let DestState::Running(Some(why)) = &j.state else {
            panic!("{j:?}")
        };
        assert!(why.contains("a person must promote or abort"), "{why}");
    }

    #[test]
    fn runs_of_another_owner_and_a_missing_rollout() {
        let r = rollout("shop/web:2", "abc123", "abc123", "Healthy");
        let mut foreign = run("other-abc123", "Failed", json!([]));
        foreign["metadata"]["ownerReferences"][0]["name"] = json!("other");
        let j = judge(&check(None, None), "shop/web", Some(&r), &[foreign]);
        assert_eq!(j.state, DestState::Succeeded);
        assert!(!j.notes.contains_key(NOTE_ANALYSISRUNS));
        let j = judge(&check(None, None), "shop/web", None, &[]);
        assert_eq!(
            j.state,
            DestState::Running(Some("rollout shop/web not found".into()))
        );
    }
}
