//! The adoption mark: an annotation on every Job we create that nobody without the server's
//! signing key can produce, so that a Job found under our name is adopted only when we made it.
//!
//! Job names are predictable (run uid, metric, measurement) and our labels are public, so a
//! tenant who may create Jobs in a shared verification namespace could create the next Job
//! first, with our labels and a command that exits 0, and have it adopted as the verification.
//! The mark is `HMAC(key, "job-mark", run uid, namespace, name, digest of the pod template)`
//! (`signing::JOB_MARK`): it cannot be guessed before we create the Job, and copying the mark of
//! a Job we did create onto another spec fails the digest.
//!
//! The digest covers the whole pod template (every field of the pod spec: volumes, mounts,
//! security contexts, service account, scheduling, resources, containers; the template's labels
//! and annotations) and the Job fields that decide how it runs and when it passes
//! (`parallelism`, `completions`, `backoffLimit`, `activeDeadlineSeconds`, `podFailurePolicy`,
//! `successPolicy` …), canonicalised so that the Job the API server gives back, defaults filled
//! in, digests like the one we sent ([`digest`] says how and why that design). A Job whose
//! template an admission webhook edits is therefore not ours: refused, never adopted.
//!
//! The agent holds no signing key: it compares the mark the server sent with the record against
//! the Job it finds, and the digest of both, which is the same check without the key.

use serde_json::{Map, Value};

use crate::signing::{self, SignatureError, Signer};

mod digest;

/// Annotation: the adoption mark.
pub const ANN_MARK: &str = "rollouts-dispatch.io/mark";

/// Why a Job found under our name is not ours even though it carries our labels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MarkMismatch {
    /// no mark at all: created by someone else (or by a version before marks)
    #[error("it carries no {ANN_MARK} annotation, so it was not created by this server")]
    Missing,
    /// a mark, but not the one this measurement's Job gets
    #[error(
        "its {ANN_MARK} annotation is not the one this server gives this Job (another server's \
         key, a key rotated since, or a mark copied from another Job)"
    )]
    Different,
    /// our mark, on a pod template that is not the one we created
    #[error(
        "its pod template is not the one this measurement asks for (`{0}` differs): it was \
         replaced after we created it, or edited on its way in (a mutating admission webhook)"
    )]
    SpecChanged(String),
    /// a mark that does not verify with the server's keys for this run and this pod template
    #[error(
        "its {ANN_MARK} annotation does not verify for this run and this pod template: {0} \
         (made by someone else, for another run, or the Job was replaced after we created it)"
    )]
    Invalid(#[source] SignatureError),
    /// the agent has no spec from the server to compare the Job with
    #[error("the server sent no Job spec to compare it with")]
    NothingToCompare,
}

/// The digest of `job`'s whole pod template and the Job fields that decide how it runs, in the
/// canonical form the API server's defaulting does not change (hex SHA-256; see [`digest`]).
pub fn spec_digest(job: &Value) -> String {
    digest::digest(job)
}

/// An absent string and an empty one are the same (`omitempty`).
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// The bytes under the mark's MAC.
fn message(run_uid: &str, namespace: &str, name: &str, digest: &str) -> Vec<u8> {
    [run_uid, namespace, name, digest].join("\n").into_bytes()
}

/// Puts the mark on `job` (a built Job, after pod security filled it in) for run `run_uid`.
pub fn stamp(job: &mut Value, signer: &Signer, run_uid: &str) {
    let meta = &job["metadata"];
    let (namespace, name) = (
        text(&meta["namespace"]).to_string(),
        text(&meta["name"]).to_string(),
    );
    let mark = signer.sign(
        signing::JOB_MARK,
        &message(run_uid, &namespace, &name, &spec_digest(job)),
    );
    if let Some(meta) = job.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(a) = annotations.as_object_mut() {
            a.insert(ANN_MARK.into(), Value::String(mark));
        }
    }
}

/// Whether `found` carries a mark `signer` made for run `run_uid`, its namespace, name and pod
/// template: the server's check (any key in force verifies, so a rotation keeps our Jobs ours).
pub fn verify(found: &Value, signer: &Signer, run_uid: &str) -> Result<(), MarkMismatch> {
    let mark = of(found).ok_or(MarkMismatch::Missing)?;
    let meta = &found["metadata"];
    let msg = message(
        run_uid,
        text(&meta["namespace"]),
        text(&meta["name"]),
        &spec_digest(found),
    );
    signer
        .verify(signing::JOB_MARK, &msg, mark)
        .map_err(MarkMismatch::Invalid)
}

/// The mark on a Job (built or read back), if any.
pub fn of(job: &Value) -> Option<&str> {
    job["metadata"]["annotations"][ANN_MARK].as_str()
}

/// Whether `existing` (found under our Job's name) is the Job `ours` (what we would create now,
/// with its mark) describes: the same mark and the same pod template digest.
pub fn check(existing: &Value, ours: &Value) -> Result<(), MarkMismatch> {
    let found = of(existing).ok_or(MarkMismatch::Missing)?;
    if Some(found) != of(ours) {
        return Err(MarkMismatch::Different);
    }
    if let Some(at) = digest::first_difference(existing, ours) {
        return Err(MarkMismatch::SpecChanged(at));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &[u8] = b"mark-key-0123456789abcdef0123456789abcdef";

    fn job() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j-1", "namespace": "verify", "labels": {"rollouts-dispatch.io/managed": "true"}},
            "spec": {"activeDeadlineSeconds": 600, "template": {
                "metadata": {"labels": {"rollouts-dispatch.io/managed": "true"}},
                "spec": {
                "restartPolicy": "Never",
                "serviceAccountName": "smoke",
                "hostNetwork": false,
                "volumes": [{"name": "cfg", "secret": {"secretName": "smoke-config"}},
                            {"name": "scratch"}],
                "containers": [{"name": "smoke", "image": "busybox:1.36", "command": ["sh", "-c", "exit 0"],
                                "args": [],
                                "resources": {"limits": {"cpu": "0.5"}},
                                "ports": [{"containerPort": 8080}],
                                "readinessProbe": {"httpGet": {"path": "/", "port": 8080}},
                                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg", "readOnly": false}],
                                "securityContext": {"allowPrivilegeEscalation": false,
                                                    "capabilities": {"drop": ["ALL"]}},
                                "env": [{"name": "A", "value": "1"},
                                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}],
            }}}
        })
    }

    fn marked(signer: &Signer) -> Value {
        let mut j = job();
        stamp(&mut j, signer, "uid-1");
        j
    }

    /// What the API server gives back: defaults filled in, empty fields dropped, value structs
    /// written empty, the service account alias, quantities canonical, the Job controller's
    /// labels on the template (`digest` cites where each comes from).
    fn as_read_back(mut j: Value) -> Value {
        let t = &mut j["spec"]["template"];
        t["metadata"]["creationTimestamp"] = Value::Null;
        t["metadata"]["labels"]["batch.kubernetes.io/controller-uid"] = json!("0f1e");
        t["metadata"]["labels"]["job-name"] = json!("j-1");
        let p = &mut t["spec"];
        p["dnsPolicy"] = json!("ClusterFirst");
        p["schedulerName"] = json!("default-scheduler");
        p["terminationGracePeriodSeconds"] = json!(30);
        p["securityContext"] = json!({});
        p["enableServiceLinks"] = json!(true);
        p["serviceAccount"] = p["serviceAccountName"].clone();
        p["volumes"][0]["secret"]["defaultMode"] = json!(420);
        p["volumes"][1]["emptyDir"] = json!({});
        if let Some(a) = p.as_object_mut() {
            a.remove("hostNetwork");
        }
        let c = &mut p["containers"][0];
        c["imagePullPolicy"] = json!("IfNotPresent");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["terminationMessagePolicy"] = json!("File");
        c["resources"]["limits"]["cpu"] = json!("500m");
        c["env"][1]["valueFrom"]["fieldRef"]["apiVersion"] = json!("v1");
        c["ports"][0]["protocol"] = json!("TCP");
        c["readinessProbe"]["timeoutSeconds"] = json!(1);
        c["readinessProbe"]["periodSeconds"] = json!(10);
        c["readinessProbe"]["successThreshold"] = json!(1);
        c["readinessProbe"]["failureThreshold"] = json!(3);
        c["readinessProbe"]["httpGet"]["scheme"] = json!("HTTP");
        c["volumeMounts"][0]
            .as_object_mut()
            .map(|m| m.remove("readOnly"));
        c.as_object_mut().map(|m| m.remove("args"));
        c["securityContext"]["capabilities"]["add"] = json!([]);
        j["spec"]["backoffLimit"] = json!(6);
        j["spec"]["completions"] = json!(1);
        j["spec"]["parallelism"] = json!(1);
        j["spec"]["completionMode"] = json!("NonIndexed");
        j["spec"]["suspend"] = json!(false);
        j
    }

    #[test]
    fn our_job_read_back_with_defaults_is_ours() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let ours = marked(&signer);
        assert!(of(&ours).unwrap().starts_with("v1."));
        assert_eq!(check(&as_read_back(ours.clone()), &ours), Ok(()));
    }

    #[test]
    fn the_server_verifies_marks_with_every_key_in_force() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let ours = as_read_back(marked(&signer));
        assert_eq!(verify(&ours, &signer, "uid-1"), Ok(()));
        assert!(matches!(
            verify(&ours, &signer, "uid-2"),
            Err(MarkMismatch::Invalid(_))
        ));
        assert_eq!(verify(&job(), &signer, "uid-1"), Err(MarkMismatch::Missing));
        let mut replaced = ours.clone();
        replaced["spec"]["template"]["spec"]["containers"][0]["args"] = json!(["--pass"]);
        assert!(matches!(
            verify(&replaced, &signer, "uid-1"),
            Err(MarkMismatch::Invalid(_))
        ));
        // After a rotation the old key still verifies what it marked.
        let rotated = Signer::new(&[
            b"new-key-0123456789abcdef0123456789abcd".to_vec(),
            KEY.to_vec(),
        ])
        .unwrap();
        assert_eq!(verify(&ours, &rotated, "uid-1"), Ok(()));
    }

    #[test]
    fn a_job_without_our_mark_is_not_ours() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        assert_eq!(check(&job(), &marked(&signer)), Err(MarkMismatch::Missing));
        // A mark made with another key (another server, or a guess) differs.
        let other = Signer::new(&[b"another-key-0123456789abcdef0123456789".to_vec()]).unwrap();
        assert_eq!(
            check(&marked(&other), &marked(&signer)),
            Err(MarkMismatch::Different)
        );
        // The mark binds the run: the same Job of another run gets another mark.
        let mut other_run = job();
        stamp(&mut other_run, &signer, "uid-2");
        assert_eq!(
            check(&other_run, &marked(&signer)),
            Err(MarkMismatch::Different)
        );
    }

    fn push(list: &mut Value, item: Value) {
        list.as_array_mut().expect("a list").push(item);
    }

    #[test]
    fn a_copied_mark_on_another_spec_is_refused() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let ours = marked(&signer);
        type Edit = fn(&mut Value);
        let edits: [(&str, Edit); 16] = [
            ("command", |j| {
                j["spec"]["template"]["spec"]["containers"][0]["command"] = json!(["true"])
            }),
            ("image", |j| {
                j["spec"]["template"]["spec"]["containers"][0]["image"] = json!("evil:1")
            }),
            ("env", |j| {
                j["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = json!("2")
            }),
            ("serviceAccount", |j| {
                j["spec"]["template"]["spec"]["serviceAccountName"] = json!("admin")
            }),
            ("hostPID", |j| {
                j["spec"]["template"]["spec"]["hostPID"] = json!(true)
            }),
            ("initContainer", |j| {
                j["spec"]["template"]["spec"]["initContainers"] =
                    json!([{"name": "x", "image": "evil:1"}])
            }),
            ("a volume", |j| {
                push(
                    &mut j["spec"]["template"]["spec"]["volumes"],
                    json!({"name": "host", "hostPath": {"path": "/"}}),
                )
            }),
            ("a volume's source", |j| {
                j["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"] =
                    json!("argocd-secret")
            }),
            ("a mount", |j| {
                push(
                    &mut j["spec"]["template"]["spec"]["containers"][0]["volumeMounts"],
                    json!({"name": "scratch", "mountPath": "/var/run"}),
                )
            }),
            ("a mount made writable elsewhere", |j| {
                j["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["subPath"] =
                    json!("..")
            }),
            ("allowPrivilegeEscalation dropped", |j| {
                let sc = &mut j["spec"]["template"]["spec"]["containers"][0]["securityContext"];
                sc.as_object_mut()
                    .map(|m| m.remove("allowPrivilegeEscalation"));
            }),
            ("privileged", |j| {
                j["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] =
                    json!(true)
            }),
            ("a pod security context", |j| {
                j["spec"]["template"]["spec"]["securityContext"] = json!({"runAsUser": 0})
            }),
            ("a toleration", |j| {
                j["spec"]["template"]["spec"]["tolerations"] = json!([{"operator": "Exists"}])
            }),
            ("a pod label", |j| {
                j["spec"]["template"]["metadata"]["labels"]["app"] = json!("payments")
            }),
            ("parallelism", |j| j["spec"]["parallelism"] = json!(50)),
        ];
        for (what, edit) in edits {
            let mut forged = ours.clone();
            edit(&mut forged);
            assert!(
                matches!(check(&forged, &ours), Err(MarkMismatch::SpecChanged(_))),
                "{what}"
            );
            // The server's check, with no spec of ours at hand, refuses it too.
            assert!(
                matches!(
                    verify(&forged, &signer, "uid-1"),
                    Err(MarkMismatch::Invalid(_))
                ),
                "{what}"
            );
        }
    }
}
