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
//! The digest covers what decides what the Job runs and that the API server does not default
//! (so the Job read back hashes like the one we sent): every container's and init container's
//! name, image, command, args and environment (plain values and the sources of `valueFrom`), the
//! service account, and the host namespaces. Security context fields are left out: the agent
//! fills the same restricted defaults in again (`podsecurity`), and they do not change what runs.
//!
//! The agent holds no signing key: it compares the mark the server sent with the record against
//! the Job it finds, and the digest of both, which is the same check without the key.

use serde_json::{json, Map, Value};

use crate::signing::{self, SignatureError, Signer};

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
        "its pod template (containers, images, commands, environment, service account) is not \
         the one this measurement asks for: it was replaced after we created it"
    )]
    SpecChanged,
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

/// The digest of the parts of `job`'s pod template that decide what runs (hex SHA-256).
pub fn spec_digest(job: &Value) -> String {
    let pod = &job["spec"]["template"]["spec"];
    let containers = |field: &str| -> Vec<Value> {
        pod[field]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                json!({
                    "name": c["name"],
                    "image": c["image"],
                    "command": non_empty(&c["command"]),
                    "args": non_empty(&c["args"]),
                    "env": c["env"].as_array().into_iter().flatten().map(env_var).collect::<Vec<_>>(),
                    "envFrom": c["envFrom"].as_array().into_iter().flatten().map(env_from).collect::<Vec<_>>(),
                })
            })
            .collect()
    };
    let projection = json!({
        "initContainers": containers("initContainers"),
        "containers": containers("containers"),
        "serviceAccountName": text(&pod["serviceAccountName"]),
        "hostNetwork": pod["hostNetwork"].as_bool().unwrap_or(false),
        "hostPID": pod["hostPID"].as_bool().unwrap_or(false),
        "hostIPC": pod["hostIPC"].as_bool().unwrap_or(false),
    });
    let d = ring::digest::digest(&ring::digest::SHA256, projection.to_string().as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// An absent list and an empty one are the same to the API server (it drops empty lists).
fn non_empty(v: &Value) -> Value {
    match v.as_array() {
        Some(a) if !a.is_empty() => v.clone(),
        _ => Value::Null,
    }
}

/// An absent string and an empty one are the same (`omitempty`).
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// One `env` entry: its name, plain value and where `valueFrom` reads (without the defaulted
/// `fieldRef.apiVersion` and `optional`).
fn env_var(e: &Value) -> Value {
    let from = &e["valueFrom"];
    json!({
        "name": e["name"],
        "value": text(&e["value"]),
        "secret": [text(&from["secretKeyRef"]["name"]), text(&from["secretKeyRef"]["key"])],
        "configMap": [text(&from["configMapKeyRef"]["name"]), text(&from["configMapKeyRef"]["key"])],
        "field": text(&from["fieldRef"]["fieldPath"]),
        "resource": [text(&from["resourceFieldRef"]["containerName"]), text(&from["resourceFieldRef"]["resource"])],
    })
}

/// One `envFrom` entry: its prefix and source.
fn env_from(e: &Value) -> Value {
    json!({
        "prefix": text(&e["prefix"]),
        "secret": text(&e["secretRef"]["name"]),
        "configMap": text(&e["configMapRef"]["name"]),
    })
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
    if spec_digest(existing) != spec_digest(ours) {
        return Err(MarkMismatch::SpecChanged);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &[u8] = b"mark-key-0123456789abcdef0123456789abcdef";

    fn job() -> Value {
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "j-1", "namespace": "verify", "labels": {"rollouts-dispatch.io/managed": "true"}},
            "spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "smoke", "image": "busybox:1.36", "command": ["sh", "-c", "exit 0"],
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

    /// What the API server gives back: defaults filled in, empty fields dropped.
    fn as_read_back(mut j: Value) -> Value {
        let c = &mut j["spec"]["template"]["spec"]["containers"][0];
        c["imagePullPolicy"] = json!("IfNotPresent");
        c["terminationMessagePath"] = json!("/dev/termination-log");
        c["resources"] = json!({});
        c["env"][1]["valueFrom"]["fieldRef"]["apiVersion"] = json!("v1");
        c["securityContext"] = json!({"runAsNonRoot": true});
        j["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
        j["spec"]["backoffLimit"] = json!(6);
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

    #[test]
    fn a_copied_mark_on_another_spec_is_refused() {
        let signer = Signer::new(&[KEY.to_vec()]).unwrap();
        let ours = marked(&signer);
        type Edit = fn(&mut Value);
        let edits: [(&str, Edit); 6] = [
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
        ];
        for (what, edit) in edits {
            let mut forged = ours.clone();
            edit(&mut forged);
            assert_eq!(
                check(&forged, &ours),
                Err(MarkMismatch::SpecChanged),
                "{what}"
            );
        }
    }
}
