//! The Kubernetes Pod Security Standards, check by check, over a pod template as JSON.
//!
//! Each check mirrors the newest version of one check of the Pod Security Admission library,
//! `github.com/kubernetes/pod-security-admission` at commit 8f84a87, `policy/check_*.go` (cited
//! per check as file:line of the function). Like PSA, the checks visit init, regular and
//! ephemeral containers (`policy/visitor.go:27`), and a field is allowed only with one of the
//! values the standard lists: a value of another type counts as a violation.
//!
//! [`fill_restricted`] sets the fields the restricted standard requires when the template
//! leaves them unset, and a numeric user the kubelet can check `runAsNonRoot` against
//! ([`fill_user`]); [`check`] then refuses the first field whose value the level does not allow.

use serde_json::{json, Map, Value};

use super::{is_set, list, truthy, violation, DefaultUser, Level, Needs, Violation};

const POD: &str = "spec.template.spec";
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// Capabilities a baseline container may add (`check_capabilities_baseline.go:62`).
const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls a baseline pod may set: the newest set, `sysctlsAllowedV1Dot37`
/// (`check_sysctls.go:90-115`).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

/// SELinux types a baseline pod may set, `selinuxAllowedTypes1_31` (`check_seLinuxOptions.go:79`).
const SELINUX_TYPES: &[&str] = &[
    "",
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// Volume sources a restricted pod may use (`check_restrictedVolumes.go:88`).
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "image",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// A Windows pod: PSA exempts it from the checks Windows cannot honour (seccomp, capabilities,
/// allowPrivilegeEscalation; e.g. `check_seccompProfile_restricted.go:148`).
fn windows(pod: &Map<String, Value>) -> bool {
    pod.get("os")
        .and_then(|o| o.get("name"))
        .and_then(Value::as_str)
        == Some("windows")
}

/// A pod in a user namespace (`hostUsers: false`): PSA relaxes runAsNonRoot, runAsUser and the
/// baseline procMount check for it (`helpers.go:41`).
fn user_namespace(pod: &Map<String, Value>) -> bool {
    pod.get("hostUsers") == Some(&Value::Bool(false))
}

/// Every container with its path (`spec.template.spec.containers[0]`).
fn containers(pod: &Map<String, Value>) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for l in CONTAINER_LISTS {
        for (i, c) in list(pod.get(l)).iter().enumerate() {
            out.push((format!("{POD}.{l}[{i}]"), c));
        }
    }
    out
}

/// `obj[key]` as an object, created when absent or null; `Err` when it is something else.
fn object_at<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
) -> Result<&'a mut Map<String, Value>, ()> {
    let slot = obj.entry(key).or_insert_with(|| json!({}));
    if slot.is_null() {
        *slot = json!({});
    }
    slot.as_object_mut().ok_or(())
}

/// Sets the restricted fields the pod template leaves unset, and the user `user` names when the
/// template names none ([`fill_user`]); a `securityContext` (or container) that is not an object
/// is refused.
pub(super) fn fill_restricted(
    pod: &mut Map<String, Value>,
    user: DefaultUser,
) -> Result<(), Violation> {
    let not_object =
        |at: String| violation(format!("{POD}.{at}"), "must be an object", Needs::Nothing);
    let windows = windows(pod);
    let sc =
        object_at(pod, "securityContext").map_err(|()| not_object("securityContext".into()))?;
    if !windows && !is_set(sc.get("seccompProfile")) {
        sc.insert("seccompProfile".into(), json!({"type": "RuntimeDefault"}));
    }
    if !is_set(sc.get("runAsNonRoot")) {
        sc.insert("runAsNonRoot".into(), json!(true));
    }
    if windows {
        return Ok(());
    }
    for l in CONTAINER_LISTS {
        let Some(items) = pod.get_mut(l).and_then(Value::as_array_mut) else {
            continue;
        };
        for (i, c) in items.iter_mut().enumerate() {
            let at = format!("{l}[{i}].securityContext");
            let Some(c) = c.as_object_mut() else {
                return Err(not_object(format!("{l}[{i}]")));
            };
            let sc = object_at(c, "securityContext").map_err(|()| not_object(at.clone()))?;
            if !is_set(sc.get("allowPrivilegeEscalation")) {
                sc.insert("allowPrivilegeEscalation".into(), json!(false));
            }
            let caps = object_at(sc, "capabilities")
                .map_err(|()| not_object(format!("{at}.capabilities")))?;
            if !is_set(caps.get("drop")) {
                caps.insert("drop".into(), json!(["ALL"]));
            }
        }
    }
    fill_user(pod, user);
    Ok(())
}

/// Sets the pod's `runAsUser` (and `runAsGroup`, unless one is set anywhere) to `user` when
/// some container must run as non-root and neither the pod nor any container names a user.
/// Without a numeric user the kubelet checks `runAsNonRoot` against the image's own user and
/// refuses to start a container whose image runs as root (busybox) or as a named user it cannot
/// verify (curlimages/curl's `curl_user`): `CreateContainerConfigError` (kubernetes
/// pkg/kubelet/kuberuntime/security_context_others.go:34-67, `verifyRunAsNonRoot`). A user the
/// template names, anywhere, is its author's choice and left alone. Not on Windows, where the
/// API server refuses both fields (pkg/apis/core/validation/validation.go:5043-5047); the caller
/// returns before that.
fn fill_user(pod: &mut Map<String, Value>, user: DefaultUser) {
    let DefaultUser::Id(id) = user else { return };
    let psc = pod.get("securityContext");
    let pod_field = |f: &str| psc.and_then(|s| s.get(f));
    let anywhere = |f: &str| {
        is_set(pod_field(f))
            || containers(pod)
                .iter()
                .any(|(_, c)| is_set(c.pointer(&format!("/securityContext/{f}"))))
    };
    let pod_non_root = pod_field("runAsNonRoot") == Some(&Value::Bool(true));
    let non_root =
        containers(pod)
            .iter()
            .any(|(_, c)| match c.pointer("/securityContext/runAsNonRoot") {
                None | Some(Value::Null) => pod_non_root,
                Some(v) => v == &Value::Bool(true),
            });
    if !non_root || anywhere("runAsUser") {
        return;
    }
    let group = !anywhere("runAsGroup");
    let Some(sc) = pod
        .get_mut("securityContext")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    sc.insert("runAsUser".into(), json!(id));
    if group {
        sc.insert("runAsGroup".into(), json!(id));
    }
}

/// The first field of the pod template (`meta`: its metadata, `pod`: its spec) that `level`
/// does not allow.
pub(super) fn check(meta: &Value, pod: &Map<String, Value>, level: Level) -> Result<(), Violation> {
    if level == Level::Privileged {
        return Ok(());
    }
    baseline(meta, pod, level)?;
    if level == Level::Restricted {
        restricted(pod)?;
    }
    Ok(())
}

/// The baseline standard (a violation here needs `privileged`).
fn baseline(meta: &Value, pod: &Map<String, Value>, level: Level) -> Result<(), Violation> {
    let deny = |path: String, problem: String| {
        Err(violation(path, problem, Needs::Level(Level::Privileged)))
    };
    let psc = pod.get("securityContext");
    // check_hostNamespaces.go:58
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if truthy(pod.get(field)) {
            return deny(
                format!("{POD}.{field}"),
                "host namespaces are not allowed".into(),
            );
        }
    }
    // check_hostPathVolumes.go:58
    for (i, v) in list(pod.get("volumes")).iter().enumerate() {
        if is_set(v.get("hostPath")) {
            return deny(
                format!("{POD}.volumes[{i}].hostPath"),
                "hostPath volumes are not allowed".into(),
            );
        }
    }
    // check_sysctls.go:138 (pod level only)
    for (i, s) in list(psc.and_then(|s| s.get("sysctls"))).iter().enumerate() {
        let name = s.get("name").and_then(Value::as_str).unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&name) {
            return deny(
                format!("{POD}.securityContext.sysctls[{i}].name"),
                format!(
                    "sysctl {name:?} is not in the safe set ({})",
                    SAFE_SYSCTLS.join(", ")
                ),
            );
        }
    }
    // The pod-level security context fields that containers have too.
    if let Some(sc) = psc {
        security_context(sc, &format!("{POD}.securityContext"))?;
    }
    // check_appArmorProfile.go:67,83: the deprecated per-container annotations
    let prefix = "container.apparmor.security.beta.kubernetes.io/";
    if let Some(annotations) = meta.get("annotations").and_then(Value::as_object) {
        for (k, v) in annotations {
            let value = v.as_str().unwrap_or("?");
            let allowed =
                value.is_empty() || value == "runtime/default" || value.starts_with("localhost/");
            if k.starts_with(prefix) && !allowed {
                return deny(
                    format!("spec.template.metadata.annotations[{k:?}]"),
                    format!("AppArmor profile {v} is not allowed (runtime/default, localhost/*)"),
                );
            }
        }
    }
    let userns = user_namespace(pod);
    for (at, c) in containers(pod) {
        let sc = c.get("securityContext");
        // check_privileged.go:56
        if truthy(sc.and_then(|s| s.get("privileged"))) {
            return deny(
                format!("{at}.securityContext.privileged"),
                "privileged containers are not allowed".into(),
            );
        }
        if let Some(sc) = sc {
            security_context(sc, &format!("{at}.securityContext"))?;
        }
        // check_capabilities_baseline.go:79 (at restricted, capabilities_restricted overrides it)
        if level == Level::Baseline {
            for (j, cap) in list(sc.and_then(|s| s.pointer("/capabilities/add")))
                .iter()
                .enumerate()
            {
                if !cap
                    .as_str()
                    .is_some_and(|c| BASELINE_CAPABILITIES.contains(&c))
                {
                    return deny(
                        format!("{at}.securityContext.capabilities.add[{j}]"),
                        format!(
                            "capability {cap} is not in the default set ({})",
                            BASELINE_CAPABILITIES.join(", ")
                        ),
                    );
                }
            }
        }
        // check_procMount_baseline.go:100 (relaxed in a user namespace)
        let proc_mount = sc.and_then(|s| s.get("procMount"));
        if is_set(proc_mount) && proc_mount != Some(&json!("Default")) && !userns {
            return deny(
                format!("{at}.securityContext.procMount"),
                format!(
                    "procMount {} unmasks /proc",
                    proc_mount.unwrap_or(&Value::Null)
                ),
            );
        }
        // check_hostPorts.go:60
        for (j, p) in list(c.get("ports")).iter().enumerate() {
            if !matches!(p.get("hostPort"), None | Some(Value::Null))
                && p.get("hostPort") != Some(&json!(0))
            {
                return deny(
                    format!("{at}.ports[{j}].hostPort"),
                    "host ports are not allowed".into(),
                );
            }
        }
        // check_hostProbesAndhostLifecycle.go:76
        for handler in [
            "livenessProbe",
            "readinessProbe",
            "startupProbe",
            "lifecycle/postStart",
            "lifecycle/preStop",
        ] {
            for kind in ["httpGet", "tcpSocket"] {
                let host = c.pointer(&format!("/{handler}/{kind}/host"));
                if host.is_some_and(|h| !h.is_null() && h != "") {
                    return deny(
                        format!("{at}.{}.{kind}.host", handler.replace('/', ".")),
                        "probes and lifecycle handlers must not name a host".into(),
                    );
                }
            }
        }
    }
    Ok(())
}

/// The baseline checks of fields that a pod and a container `securityContext` (at `at`) share.
fn security_context(sc: &Value, at: &str) -> Result<(), Violation> {
    let deny = |path: String, problem: String| {
        Err(violation(path, problem, Needs::Level(Level::Privileged)))
    };
    // check_appArmorProfile.go:83 and check_seccompProfile_baseline.go:75,121: the same rule
    // (only the runtime's default or a node-local profile) for both.
    for (field, what) in [
        ("appArmorProfile", "AppArmor"),
        ("seccompProfile", "seccomp"),
    ] {
        let Some(profile) = sc.get(field).filter(|p| !p.is_null()) else {
            continue;
        };
        let t = profile.get("type").unwrap_or(&Value::Null);
        if !matches!(t.as_str(), Some("RuntimeDefault" | "Localhost")) {
            return deny(
                format!("{at}.{field}.type"),
                format!("{what} profile type {t} is not allowed (RuntimeDefault, Localhost)"),
            );
        }
    }
    // check_seLinuxOptions.go:90
    if let Some(se) = sc.get("seLinuxOptions").filter(|p| !p.is_null()) {
        let t = se
            .get("type")
            .filter(|t| !t.is_null())
            .unwrap_or(&Value::Null);
        if !(t.is_null() || t.as_str().is_some_and(|t| SELINUX_TYPES.contains(&t))) {
            return deny(
                format!("{at}.seLinuxOptions.type"),
                format!(
                    "SELinux type {t} is not allowed ({})",
                    SELINUX_TYPES[1..].join(", ")
                ),
            );
        }
        for field in ["user", "role"] {
            if se.get(field).is_some_and(|v| !v.is_null() && v != "") {
                return deny(
                    format!("{at}.seLinuxOptions.{field}"),
                    format!("a custom SELinux {field} is not allowed"),
                );
            }
        }
    }
    // check_windowsHostProcess.go:59
    if truthy(sc.pointer("/windowsOptions/hostProcess")) {
        return deny(
            format!("{at}.windowsOptions.hostProcess"),
            "Windows host processes are not allowed".into(),
        );
    }
    Ok(())
}

/// The restricted standard on top of baseline (a violation here needs `baseline`, unless the
/// value is one baseline refuses too).
fn restricted(pod: &Map<String, Value>) -> Result<(), Violation> {
    let deny = |path: String, problem: String, needs: Level| {
        Err(violation(path, problem, Needs::Level(needs)))
    };
    // check_restrictedVolumes.go:88 (hostPath was refused by baseline already)
    for (i, v) in list(pod.get("volumes")).iter().enumerate() {
        let Some(v) = v.as_object() else {
            return deny(
                format!("{POD}.volumes[{i}]"),
                "must be an object".into(),
                Level::Baseline,
            );
        };
        let source = v
            .iter()
            .find(|(k, val)| *k != "name" && !val.is_null())
            .map(|(k, _)| k.as_str());
        if let Some(source) = source.filter(|s| !RESTRICTED_VOLUMES.contains(s)) {
            return deny(
                format!("{POD}.volumes[{i}].{source}"),
                format!(
                    "volume type {source} is not allowed (allowed: {})",
                    RESTRICTED_VOLUMES.join(", ")
                ),
                Level::Baseline,
            );
        }
    }
    let windows = windows(pod);
    let userns = user_namespace(pod);
    let psc = pod.get("securityContext");
    let pod_non_root = psc.and_then(|s| s.get("runAsNonRoot"));
    let pod_seccomp = psc
        .and_then(|s| s.pointer("/seccompProfile/type"))
        .and_then(Value::as_str);
    if !userns {
        // check_runAsNonRoot.go:67,78
        if is_set(pod_non_root) && pod_non_root != Some(&Value::Bool(true)) {
            return deny(
                format!("{POD}.securityContext.runAsNonRoot"),
                "must be true".into(),
                Level::Baseline,
            );
        }
        // check_runAsUser.go:68,79
        if psc.and_then(|s| s.get("runAsUser")) == Some(&json!(0)) {
            return deny(
                format!("{POD}.securityContext.runAsUser"),
                "must not be 0 (root)".into(),
                Level::Baseline,
            );
        }
    }
    for (at, c) in containers(pod) {
        let sc = c.get("securityContext");
        let field = |name: &str| sc.and_then(|s| s.get(name));
        if !userns {
            let non_root = field("runAsNonRoot");
            let ok = match non_root {
                None | Some(Value::Null) => pod_non_root == Some(&Value::Bool(true)),
                Some(v) => v == &Value::Bool(true),
            };
            if !ok {
                return deny(
                    format!("{at}.securityContext.runAsNonRoot"),
                    "must be true (here or in the pod's securityContext)".into(),
                    Level::Baseline,
                );
            }
            if field("runAsUser") == Some(&json!(0)) {
                return deny(
                    format!("{at}.securityContext.runAsUser"),
                    "must not be 0 (root)".into(),
                    Level::Baseline,
                );
            }
        }
        // check_procMount_restricted.go (procMount_1_0, unconditional since 1.35)
        let proc_mount = field("procMount");
        if is_set(proc_mount) && proc_mount != Some(&json!("Default")) {
            return deny(
                format!("{at}.securityContext.procMount"),
                "must be Default".into(),
                Level::Baseline,
            );
        }
        if windows {
            continue;
        }
        // check_allowPrivilegeEscalation.go:64,86
        if field("allowPrivilegeEscalation") != Some(&Value::Bool(false)) {
            return deny(
                format!("{at}.securityContext.allowPrivilegeEscalation"),
                "must be false".into(),
                Level::Baseline,
            );
        }
        // check_seccompProfile_restricted.go:69,148 (explicit bad values: baseline above)
        if !is_set(field("seccompProfile"))
            && !matches!(pod_seccomp, Some("RuntimeDefault" | "Localhost"))
        {
            return deny(
                format!("{at}.securityContext.seccompProfile"),
                "must be RuntimeDefault or Localhost (here or in the pod's securityContext)".into(),
                Level::Baseline,
            );
        }
        // check_capabilities_restricted.go:79,138
        let drop = list(sc.and_then(|s| s.pointer("/capabilities/drop")));
        if !drop.iter().any(|d| d == "ALL") {
            return deny(
                format!("{at}.securityContext.capabilities.drop"),
                "must include ALL".into(),
                Level::Baseline,
            );
        }
        for (j, cap) in list(sc.and_then(|s| s.pointer("/capabilities/add")))
            .iter()
            .enumerate()
        {
            if cap != "NET_BIND_SERVICE" {
                let needs = if cap
                    .as_str()
                    .is_some_and(|c| BASELINE_CAPABILITIES.contains(&c))
                {
                    Level::Baseline
                } else {
                    Level::Privileged
                };
                return deny(
                    format!("{at}.securityContext.capabilities.add[{j}]"),
                    format!("capability {cap} is not allowed (only NET_BIND_SERVICE)"),
                    needs,
                );
            }
        }
    }
    Ok(())
}
