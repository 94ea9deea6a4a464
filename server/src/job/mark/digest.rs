//! The digest under the Job mark: the whole pod template and the Job fields that decide how it
//! runs, in a canonical form that the API server's defaulting does not change.
//!
//! The server verifies the mark of a Job it finds (status, sweep, log view) with nothing but
//! that Job and its keys, so the digest must come out the same from the Job we sent and from the
//! Job the API server gives back. Three things differ between them, and each is undone here:
//!
//! * **Defaults.** The API server fills in fields we left out. A field equal to the value the API
//!   server would have filled in is dropped (on both sides), which changes nothing about what
//!   runs: absent, it gets that very value. The list is Kubernetes' own:
//!   `pkg/apis/core/v1/defaults.go` (`SetDefaults_PodSpec`, `SetDefaults_Container`,
//!   `SetDefaults_Probe`, `SetDefaults_HTTPGetAction`, the volume sources, `ObjectFieldSelector`,
//!   `ServiceAccountTokenProjection`, `PersistentVolumeClaimSpec`; `enableServiceLinks`, in
//!   `SetDefaults_PodSpec` before it moved to `SetDefaults_Pod`), the generated
//!   `zz_generated.defaults.go` (ports' `protocol: TCP`) and `pkg/apis/batch/v1/defaults.go`
//!   (`parallelism`, `completions`, `backoffLimit`, `completionMode`).
//! * **Serialization.** Go drops `omitempty` fields at their zero value (`""`, empty lists and
//!   maps, `false` of the plain booleans, `0` of the plain integers), writes value structs even
//!   when empty (`resources: {}`, `divisor: "0"`, a template's `creationTimestamp: null`), copies
//!   `serviceAccountName` into the deprecated `serviceAccount`, and writes quantities in their
//!   canonical form (`0.5` comes back as `500m`, requests and limits rounded up to milli-units).
//!   Empty values are dropped, the alias folded, quantities compared by value.
//! * **Reserved labels** on the template ([`RESERVED_LABEL_PREFIXES`]): the Job controller adds
//!   its own (`job-name`, `controller-uid` and their `batch.kubernetes.io/` forms,
//!   `generateSelector` in `pkg/registry/batch/job/strategy.go`), and ours name the run (which
//!   the mark binds anyway) and the destination, in a form that changed once (Jobs labelled with
//!   Argo's run-uid key before ours stay ours). `podsecurity` refuses them in a tenant's
//!   template, and they select nothing but our own Jobs.
//!
//! Everything else is digested as it is: every field of the pod spec (volumes, mounts,
//! security contexts, service account, scheduling, resources, images, commands, environment…),
//! the template's labels and annotations, and the Job's `parallelism`, `completions`,
//! `backoffLimit`, `backoffLimitPerIndex`, `maxFailedIndexes`, `activeDeadlineSeconds`,
//! `completionMode`, `podFailurePolicy` and `successPolicy` (which decide when the Job counts as
//! passed). A field unknown to this list is digested too: so a Kubernetes version that defaults
//! a new field, or a mutating webhook that edits Job templates, makes our Jobs fail the mark
//! (refused, the error says the template changed) rather than letting a changed Job pass.
//!
//! Why not "compare only the fields we set": the server's check has no spec of ours at hand
//! (a status call carries only the reference; the sweep has only the Jobs it lists), and
//! ignoring the fields we did not set would let through any field nobody thought of listing.

use serde_json::{json, Map, Value};

use crate::job::RESERVED_LABEL_PREFIXES;
use crate::quantity::Quantity;

/// The Job's own fields that decide how its pods run and when it passes.
const JOB_FIELDS: [&str; 9] = [
    "parallelism",
    "completions",
    "backoffLimit",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "activeDeadlineSeconds",
    "completionMode",
    "podFailurePolicy",
    "successPolicy",
];

/// Plain (non-pointer) `omitempty` booleans of the pod spec: `false` is never written back. A
/// pointer boolean keeps its `false`, which may differ from absent (`allowPrivilegeEscalation`,
/// `automountServiceAccountToken`), so only these lose it.
const PLAIN_BOOLS: [&str; 7] = [
    "hostNetwork",
    "hostPID",
    "hostIPC",
    "stdin",
    "stdinOnce",
    "tty",
    "readOnly",
];

/// The containers of a pod spec.
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// The canonical form of `job` (a Job object, built or read back) that the mark digests.
pub(super) fn canonical(job: &Value) -> Value {
    let spec = &job["spec"];
    let mut fields = Map::new();
    for f in JOB_FIELDS {
        if let Some(v) = spec.get(f) {
            fields.insert(f.to_string(), v.clone());
        }
    }
    undo_job_defaults(&mut fields);
    let template = &spec["template"];
    let mut labels = template["metadata"]["labels"].clone();
    if let Some(l) = labels.as_object_mut() {
        l.retain(|k, _| !RESERVED_LABEL_PREFIXES.iter().any(|p| k.starts_with(p)));
    }
    let mut pod = template["spec"].clone();
    if let Some(p) = pod.as_object_mut() {
        undo_pod_defaults(p);
    }
    let mut out = json!({
        "job": fields,
        "labels": labels,
        "annotations": template["metadata"]["annotations"],
        "pod": pod,
    });
    prune(&mut out);
    out
}

/// The hex SHA-256 of [`canonical`] written with sorted keys.
pub(super) fn digest(job: &Value) -> String {
    let mut text = String::new();
    write_sorted(&canonical(job), &mut text);
    let d = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The JSON path of the first place where the canonical forms of `a` and `b` differ (for the
/// error that says what was changed), `None` when they are the same.
pub(super) fn first_difference(a: &Value, b: &Value) -> Option<String> {
    difference(&canonical(a), &canonical(b), String::new())
}

fn difference(a: &Value, b: &Value, at: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            keys.into_iter().find_map(|k| {
                let (u, v) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                difference(u, v, format!("{at}.{k}"))
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (u, v))| difference(u, v, format!("{at}[{i}]"))),
        _ => (a != b).then(|| if at.is_empty() { ".".to_string() } else { at }),
    }
}

/// JSON with the keys of every object in order, whatever map the build of `serde_json` uses.
fn write_sorted(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_sorted(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_sorted(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Removes `key` from `m` when its value is one of `defaults`.
fn drop_default(m: &mut Map<String, Value>, key: &str, defaults: &[Value]) {
    if m.get(key).is_some_and(|v| defaults.contains(v)) {
        m.remove(key);
    }
}

/// The objects in list `key` of `m`.
fn each<'a>(
    m: &'a mut Map<String, Value>,
    key: &str,
) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    m.get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
        .filter_map(Value::as_object_mut)
}

/// Object `key` of `m`, if it is one.
fn object<'a>(m: &'a mut Map<String, Value>, key: &str) -> Option<&'a mut Map<String, Value>> {
    m.get_mut(key).and_then(Value::as_object_mut)
}

fn undo_job_defaults(m: &mut Map<String, Value>) {
    let per_index = m.get("backoffLimitPerIndex").is_some_and(|v| !v.is_null());
    // With `backoffLimitPerIndex`, the default is MaxInt32 instead of 6.
    let backoff = if per_index { json!(i32::MAX) } else { json!(6) };
    drop_default(m, "backoffLimit", &[backoff]);
    drop_default(m, "completionMode", &[json!("NonIndexed")]);
    drop_default(m, "parallelism", &[json!(1)]);
    // Both unset become 1; `completions` alone stays unset when `parallelism` is given.
    if !m.contains_key("parallelism") {
        drop_default(m, "completions", &[json!(1)]);
    }
    if let Some(policy) = object(m, "podFailurePolicy") {
        for rule in each(policy, "rules") {
            for pattern in each(rule, "onPodConditions") {
                drop_default(pattern, "status", &[json!("True")]);
            }
        }
    }
}

fn undo_pod_defaults(p: &mut Map<String, Value>) {
    drop_default(p, "dnsPolicy", &[json!("ClusterFirst")]);
    drop_default(p, "restartPolicy", &[json!("Always")]);
    drop_default(p, "terminationGracePeriodSeconds", &[json!(30)]);
    drop_default(p, "schedulerName", &[json!("default-scheduler")]);
    drop_default(p, "enableServiceLinks", &[json!(true)]);
    // `serviceAccount` is the deprecated alias the API server writes back.
    if let Some(alias) = p.remove("serviceAccount") {
        let named = p
            .get("serviceAccountName")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if !named {
            p.insert("serviceAccountName".into(), alias);
        }
    }
    let host_network = p.get("hostNetwork") == Some(&Value::Bool(true));
    for list in CONTAINER_LISTS {
        for c in each(p, list) {
            undo_container_defaults(c, host_network);
        }
    }
    for v in each(p, "volumes") {
        undo_volume_defaults(v);
    }
    if let Some(r) = object(p, "resources") {
        resource_lists(r);
    }
    if let Some(o) = object(p, "overhead") {
        quantities(o, true);
    }
}

fn undo_container_defaults(c: &mut Map<String, Value>, host_network: bool) {
    let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
    let pull = json!(default_pull_policy(image));
    drop_default(c, "imagePullPolicy", &[pull]);
    drop_default(
        c,
        "terminationMessagePath",
        &[json!("/dev/termination-log")],
    );
    drop_default(c, "terminationMessagePolicy", &[json!("File")]);
    for port in each(c, "ports") {
        drop_default(port, "protocol", &[json!("TCP")]);
        // With the host's network, a port's `hostPort` defaults to its `containerPort`.
        let container_port = port.get("containerPort").cloned().unwrap_or_default();
        if host_network {
            drop_default(port, "hostPort", &[container_port]);
        }
        drop_default(port, "hostPort", &[json!(0)]);
    }
    for env in each(c, "env") {
        if let Some(from) = object(env, "valueFrom") {
            field_and_resource_refs(from);
        }
    }
    if let Some(r) = object(c, "resources") {
        resource_lists(r);
    }
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        if let Some(p) = object(c, probe) {
            drop_default(p, "timeoutSeconds", &[json!(0), json!(1)]);
            drop_default(p, "periodSeconds", &[json!(0), json!(10)]);
            drop_default(p, "successThreshold", &[json!(0), json!(1)]);
            drop_default(p, "failureThreshold", &[json!(0), json!(3)]);
            drop_default(p, "initialDelaySeconds", &[json!(0)]);
            http_get(p);
        }
    }
    if let Some(l) = object(c, "lifecycle") {
        for hook in ["postStart", "preStop"] {
            if let Some(h) = object(l, hook) {
                http_get(h);
            }
        }
    }
}

fn http_get(handler: &mut Map<String, Value>) {
    if let Some(h) = object(handler, "httpGet") {
        drop_default(h, "path", &[json!("/")]);
        drop_default(h, "scheme", &[json!("HTTP")]);
    }
}

/// An env `valueFrom` or a downward API item: `fieldRef.apiVersion` defaults to `v1`, a zero
/// `resourceFieldRef.divisor` is written back as `"0"`.
fn field_and_resource_refs(m: &mut Map<String, Value>) {
    if let Some(f) = object(m, "fieldRef") {
        drop_default(f, "apiVersion", &[json!("v1")]);
    }
    if let Some(r) = object(m, "resourceFieldRef") {
        let zero = r
            .get("divisor")
            .and_then(|d| Quantity::from_json(d).ok())
            .is_some_and(|q| q.nanos() == 0);
        if zero {
            r.remove("divisor");
        }
        if let Some(d) = r.get_mut("divisor") {
            quantity(d, false);
        }
    }
}

fn undo_volume_defaults(v: &mut Map<String, Value>) {
    for source in ["secret", "configMap", "downwardAPI", "projected"] {
        if let Some(s) = object(v, source) {
            drop_default(s, "defaultMode", &[json!(0o644)]);
        }
    }
    if let Some(d) = object(v, "downwardAPI") {
        for item in each(d, "items") {
            field_and_resource_refs(item);
        }
    }
    if let Some(p) = object(v, "projected") {
        for source in each(p, "sources") {
            if let Some(d) = object(source, "downwardAPI") {
                for item in each(d, "items") {
                    field_and_resource_refs(item);
                }
            }
            if let Some(t) = object(source, "serviceAccountToken") {
                drop_default(t, "expirationSeconds", &[json!(3600)]);
            }
        }
    }
    let fixed: [(&str, &str, &str); 10] = [
        ("iscsi", "iscsiInterface", "default"),
        ("rbd", "pool", "rbd"),
        ("rbd", "user", "admin"),
        ("rbd", "keyring", "/etc/ceph/keyring"),
        ("azureDisk", "cachingMode", "ReadWrite"),
        ("azureDisk", "fsType", "ext4"),
        ("azureDisk", "kind", "Shared"),
        ("scaleIO", "storageMode", "ThinProvisioned"),
        ("scaleIO", "fsType", "xfs"),
        ("image", "pullPolicy", ""),
    ];
    for (source, key, default) in fixed {
        let Some(s) = object(v, source) else { continue };
        let default = if source == "image" {
            let reference = s.get("reference").and_then(Value::as_str).unwrap_or("");
            default_pull_policy(reference)
        } else {
            default
        };
        drop_default(s, key, &[json!(default)]);
    }
    if let Some(e) = object(v, "emptyDir") {
        if let Some(q) = e.get_mut("sizeLimit") {
            quantity(q, false);
        }
    }
    let claim = object(v, "ephemeral")
        .and_then(|e| object(e, "volumeClaimTemplate"))
        .and_then(|t| object(t, "spec"));
    if let Some(spec) = claim {
        drop_default(spec, "volumeMode", &[json!("Filesystem")]);
        if let Some(r) = object(spec, "resources") {
            resource_lists(r);
        }
    }
}

/// `IfNotPresent`, or `Always` for an image without a tag or digest, or tagged `latest`
/// (`SetDefaults_Container` with `parsers.ParseImageName`).
fn default_pull_policy(image: &str) -> &'static str {
    let (name, digest) = image.split_once('@').unwrap_or((image, ""));
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.split_once(':').map(|(_, t)| t).unwrap_or("");
    match (tag, digest) {
        ("latest", _) | ("", "") => "Always",
        _ => "IfNotPresent",
    }
}

/// A `ResourceRequirements`: its `requests` and `limits` by value, rounded up to milli-units as
/// `SetDefaults_ResourceList` rounds them.
fn resource_lists(r: &mut Map<String, Value>) {
    for list in ["requests", "limits"] {
        if let Some(l) = object(r, list) {
            quantities(l, true);
        }
    }
}

fn quantities(m: &mut Map<String, Value>, milli: bool) {
    for v in m.values_mut() {
        quantity(v, milli);
    }
}

/// A quantity replaced by its value in nano-units; left as written when it is not one (the API
/// server refuses it anyway, and a forgery gains nothing from it).
fn quantity(v: &mut Value, milli: bool) {
    if let Ok(q) = Quantity::from_json(v) {
        let step = if milli { 1_000_000 } else { 1 };
        *v = Value::String(format!("{}n", q.nanos().div_ceil(step) * step));
    }
}

/// Drops what Go's `omitempty` drops, innermost first, so that a map emptied by the defaults
/// goes too. List entries stay (an empty toleration `{}` is not no toleration).
fn prune(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for child in m.values_mut() {
                prune(child);
            }
            m.retain(|k, child| match child {
                Value::Null => false,
                // `storageClassName: ""` asks for no class, absent for the default one.
                Value::String(s) => !s.is_empty() || k == "storageClassName",
                Value::Array(a) => !a.is_empty(),
                Value::Object(o) => !o.is_empty(),
                Value::Bool(false) => !PLAIN_BOOLS.contains(&k.as_str()),
                _ => true,
            });
        }
        Value::Array(a) => a.iter_mut().for_each(prune),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        for (image, policy) in [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("busybox:1.36", "IfNotPresent"),
            ("registry:5000/team/busybox", "Always"),
            ("registry:5000/team/busybox:1.36", "IfNotPresent"),
            ("busybox@sha256:abc", "IfNotPresent"),
            ("busybox:latest@sha256:abc", "Always"),
        ] {
            assert_eq!(default_pull_policy(image), policy, "{image}");
        }
    }

    #[test]
    fn only_plain_booleans_lose_false() {
        let mut v = json!({"hostPID": false, "allowPrivilegeEscalation": false, "x": ""});
        prune(&mut v);
        assert_eq!(v, json!({"allowPrivilegeEscalation": false}));
    }

    #[test]
    fn quantities_compare_by_value() {
        let job = |cpu: Value| {
            json!({"spec": {"template": {"spec": {"containers": [
                {"name": "c", "resources": {"limits": {"cpu": cpu}}}]}}}})
        };
        assert_eq!(digest(&job(json!("0.5"))), digest(&job(json!("500m"))));
        assert_eq!(digest(&job(json!(1))), digest(&job(json!("1000m"))));
        assert_ne!(digest(&job(json!("1"))), digest(&job(json!("2"))));
    }

    #[test]
    fn the_first_difference_names_the_field() {
        let a =
            json!({"spec": {"template": {"spec": {"volumes": [{"name": "v", "emptyDir": {}}]}}}});
        let mut b = a.clone();
        b["spec"]["template"]["spec"]["volumes"][0] =
            json!({"name": "v", "hostPath": {"path": "/"}});
        assert_eq!(
            first_difference(&a, &b).as_deref(),
            Some(".pod.volumes[0].hostPath")
        );
        assert_eq!(first_difference(&a, &a), None);
    }
}
