use serde_json::json;

use super::*;

const UID: &str = "0b3c4a9e-2f61-4c7d-9a57-1f2e3d4c5b6a";

/// A Job as `job::build` makes it: our labels on the Job and the pods, one init container and
/// one container, nothing about security.
pub(super) fn job() -> Value {
    json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j", "namespace": "verify", "labels": {
            LABEL_RUN_UID: UID, LABEL_MANAGED: "true", LABEL_DESTINATION: "a", "team": "x"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {LABEL_RUN_UID: UID, LABEL_MANAGED: "true", LABEL_DESTINATION: "a"}},
            "spec": {"restartPolicy": "Never",
                "initContainers": [{"name": "init", "image": "busybox"}],
                "containers": [{"name": "check", "image": "busybox", "ports": [{"containerPort": 80}]}]}}}
    })
}

/// The profile of a rule at `level`; any pod annotation is allowed, so that the standards'
/// annotation checks (AppArmor) are the ones that answer (the allowlists: `allowlist_tests.rs`).
fn profile(level: Level) -> Profile {
    Profile {
        level,
        allow: Allowlists {
            pod_annotations: vec!["*".into()],
            ..Allowlists::default()
        },
        ..Profile::restricted(Origin::Rules("policy.rules[0] in config file f".into()))
    }
}

pub(super) fn ours() -> Vec<(String, String)> {
    our_labels(UID, "a")
}

/// `job()` with the JSON pointer `at` set to `value` (parents created as objects).
pub(super) fn with(at: &str, value: Value) -> Value {
    let mut j = job();
    set(&mut j, at, value);
    j
}

pub(super) fn set(j: &mut Value, at: &str, value: Value) {
    let mut cur = j;
    let parts: Vec<&str> = at.trim_start_matches('/').split('/').collect();
    for p in &parts[..parts.len() - 1] {
        cur = match p.parse::<usize>() {
            Ok(i) => &mut cur[i],
            Err(_) => cur
                .as_object_mut()
                .unwrap()
                .entry(p.to_string())
                .or_insert_with(|| json!({})),
        };
    }
    let last = parts[parts.len() - 1];
    match last.parse::<usize>() {
        Ok(i) => cur[i] = value,
        Err(_) => {
            cur.as_object_mut().unwrap().insert(last.into(), value);
        }
    }
}

fn refused(j: &Value, level: Level) -> Option<Refused> {
    let mut j = j.clone();
    enforce(&mut j, &profile(level), &ours()).err()
}

const C0: &str = "/spec/template/spec/containers/0";
const I0: &str = "/spec/template/spec/initContainers/0";
const PS: &str = "/spec/template/spec";

/// Every violation: the patch, the path the refusal names, and the most restrictive level that
/// allows it (`None`: no level does).
fn cases() -> Vec<(Value, &'static str, Option<Level>)> {
    let c = |p: &str| format!("{C0}{p}");
    let pod = |p: &str| format!("{PS}{p}");
    vec![
        (with(&c("/securityContext/privileged"), json!(true)), "spec.template.spec.containers[0].securityContext.privileged", Some(Level::Privileged)),
        (with(&format!("{I0}/securityContext/privileged"), json!(true)), "spec.template.spec.initContainers[0].securityContext.privileged", Some(Level::Privileged)),
        (with(&pod("/hostNetwork"), json!(true)), "spec.template.spec.hostNetwork", Some(Level::Privileged)),
        (with(&pod("/hostPID"), json!(true)), "spec.template.spec.hostPID", Some(Level::Privileged)),
        (with(&pod("/hostIPC"), json!(true)), "spec.template.spec.hostIPC", Some(Level::Privileged)),
        (with(&pod("/volumes"), json!([{"name": "root", "hostPath": {"path": "/"}}])), "spec.template.spec.volumes[0].hostPath", Some(Level::Privileged)),
        (with(&c("/ports/0/hostPort"), json!(8080)), "spec.template.spec.containers[0].ports[0].hostPort", Some(Level::Privileged)),
        (with(&c("/securityContext/capabilities"), json!({"add": ["SYS_ADMIN"], "drop": ["ALL"]})), "spec.template.spec.containers[0].securityContext.capabilities.add[0]", Some(Level::Privileged)),
        (with(&c("/securityContext/appArmorProfile"), json!({"type": "Unconfined"})), "spec.template.spec.containers[0].securityContext.appArmorProfile.type", Some(Level::Privileged)),
        (with("/spec/template/metadata/annotations", json!({"container.apparmor.security.beta.kubernetes.io/check": "unconfined"})), "spec.template.metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/check\"]", Some(Level::Privileged)),
        (with(&pod("/securityContext/seLinuxOptions"), json!({"type": "spc_t"})), "spec.template.spec.securityContext.seLinuxOptions.type", Some(Level::Privileged)),
        (with(&c("/securityContext/seLinuxOptions"), json!({"user": "system_u"})), "spec.template.spec.containers[0].securityContext.seLinuxOptions.user", Some(Level::Privileged)),
        (with(&c("/securityContext/procMount"), json!("Unmasked")), "spec.template.spec.containers[0].securityContext.procMount", Some(Level::Privileged)),
        (with(&pod("/securityContext/sysctls"), json!([{"name": "kernel.msgmax", "value": "1"}])), "spec.template.spec.securityContext.sysctls[0].name", Some(Level::Privileged)),
        (with(&pod("/securityContext/seccompProfile"), json!({"type": "Unconfined"})), "spec.template.spec.securityContext.seccompProfile.type", Some(Level::Privileged)),
        (with(&c("/securityContext/seccompProfile"), json!({"type": "Unconfined"})), "spec.template.spec.containers[0].securityContext.seccompProfile.type", Some(Level::Privileged)),
        (with(&c("/securityContext/windowsOptions"), json!({"hostProcess": true})), "spec.template.spec.containers[0].securityContext.windowsOptions.hostProcess", Some(Level::Privileged)),
        (with(&c("/livenessProbe"), json!({"httpGet": {"host": "10.0.0.1", "port": 80}})), "spec.template.spec.containers[0].livenessProbe.httpGet.host", Some(Level::Privileged)),
        (with(&c("/lifecycle"), json!({"preStop": {"tcpSocket": {"host": "10.0.0.1", "port": 80}}})), "spec.template.spec.containers[0].lifecycle.preStop.tcpSocket.host", Some(Level::Privileged)),
        (with(&pod("/nodeName"), json!("node-1")), "spec.template.spec.nodeName", Some(Level::Privileged)),
        (with("/spec/manualSelector", json!(true)), "spec.manualSelector", Some(Level::Privileged)),
        (with("/spec/selector", json!({"matchLabels": {"app": "web"}})), "spec.selector", Some(Level::Privileged)),
        // restricted only
        (with(&c("/securityContext/runAsUser"), json!(0)), "spec.template.spec.containers[0].securityContext.runAsUser", Some(Level::Baseline)),
        (with(&pod("/securityContext/runAsUser"), json!(0)), "spec.template.spec.securityContext.runAsUser", Some(Level::Baseline)),
        (with(&pod("/securityContext/runAsNonRoot"), json!(false)), "spec.template.spec.securityContext.runAsNonRoot", Some(Level::Baseline)),
        (with(&c("/securityContext/runAsNonRoot"), json!(false)), "spec.template.spec.containers[0].securityContext.runAsNonRoot", Some(Level::Baseline)),
        (with(&c("/securityContext/allowPrivilegeEscalation"), json!(true)), "spec.template.spec.containers[0].securityContext.allowPrivilegeEscalation", Some(Level::Baseline)),
        (with(&c("/securityContext/capabilities"), json!({"drop": ["NET_RAW"]})), "spec.template.spec.containers[0].securityContext.capabilities.drop", Some(Level::Baseline)),
        (with(&c("/securityContext/capabilities"), json!({"add": ["CHOWN"]})), "spec.template.spec.containers[0].securityContext.capabilities.add[0]", Some(Level::Baseline)),
        (with(&pod("/volumes"), json!([{"name": "n", "nfs": {"server": "s", "path": "/"}}])), "spec.template.spec.volumes[0].nfs", Some(Level::Baseline)),
        // every level
        (with(&pod("/serviceAccountName"), json!("argocd-application-controller")), "spec.template.spec.serviceAccountName", None),
        (with(&pod("/serviceAccount"), json!("admin")), "spec.template.spec.serviceAccount", None),
        (with(&pod("/automountServiceAccountToken"), json!(true)), "spec.template.spec.automountServiceAccountToken", None),
        (with(&pod("/volumes"), json!([{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}])), "spec.template.spec.volumes[0].projected.sources[0].serviceAccountToken", None),
        (with("/spec/template/metadata/labels/job-name", json!("other-job")), "spec.template.metadata.labels[\"job-name\"]", None),
        (with("/spec/template/metadata/labels/controller-uid", json!("x")), "spec.template.metadata.labels[\"controller-uid\"]", None),
        (with("/spec/template/metadata/labels/batch.kubernetes.io~1job-name", json!("x")), "spec.template.metadata.labels[\"batch.kubernetes.io/job-name\"]", None),
        (with("/spec/template/metadata/labels/rollouts-dispatch.io~1extra", json!("x")), "spec.template.metadata.labels[\"rollouts-dispatch.io/extra\"]", None),
        (with("/spec/template/metadata/labels/rollouts-dispatch.io~1destination", json!("b")), "spec.template.metadata.labels[\"rollouts-dispatch.io/destination\"]", None),
        (with("/metadata/labels/analysisrun.argoproj.io~1uid", json!("other-run")), "metadata.labels[\"analysisrun.argoproj.io/uid\"]", None),
        (with("/metadata/labels/analysisrun.argoproj.io~1uid", json!(UID)), "metadata.labels[\"analysisrun.argoproj.io/uid\"]", None),
        (with("/spec/template/metadata/labels/analysisrun.argoproj.io~1uid", json!(UID)), "spec.template.metadata.labels[\"analysisrun.argoproj.io/uid\"]", None),
        (with("/metadata/labels/rollouts-dispatch.io~1run-uid", json!("other-run")), "metadata.labels[\"rollouts-dispatch.io/run-uid\"]", None),
        (with("/spec/template/metadata/labels/rollouts-dispatch.io~1run-uid", json!("other-run")), "spec.template.metadata.labels[\"rollouts-dispatch.io/run-uid\"]", None),
    ]
}

#[test]
fn every_violation_is_refused_with_its_path_below_the_level_that_allows_it() {
    for (j, path, allowed_at) in cases() {
        for level in [Level::Restricted, Level::Baseline, Level::Privileged] {
            // `set` cannot escape "~1"; the label cases write the key with it: unescape.
            let j = unescape_labels(j.clone());
            let got = refused(&j, level);
            let should_pass = allowed_at.is_some_and(|a| level >= a);
            match got {
                None => assert!(should_pass, "{path} passed at {level}"),
                Some(r) => {
                    assert!(!should_pass, "{path} refused at {level}: {r}");
                    assert_eq!(r.path, path, "at {level}: {r}");
                    assert_eq!(r.level, level);
                    let text = r.to_string();
                    assert!(
                        text.contains(&format!("`{path}`")) && text.contains("policy.rules[0]"),
                        "{text}"
                    );
                }
            }
        }
    }
}

fn unescape_labels(mut j: Value) -> Value {
    for at in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(labels) = j.pointer_mut(at).and_then(Value::as_object_mut) {
            let fixed: Map<String, Value> = labels
                .iter()
                .map(|(k, v)| (k.replace("~1", "/"), v.clone()))
                .collect();
            *labels = fixed;
        }
    }
    j
}

#[test]
fn a_plain_job_gets_the_restricted_fields_filled_in() {
    let mut j = job();
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    let pod = &j["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], json!(false));
    assert_eq!(
        pod["securityContext"]["seccompProfile"],
        json!({"type": "RuntimeDefault"})
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], json!(true));
    for c in [&pod["containers"][0], &pod["initContainers"][0]] {
        assert_eq!(
            c["securityContext"]["allowPrivilegeEscalation"],
            json!(false),
            "{c}"
        );
        assert_eq!(
            c["securityContext"]["capabilities"]["drop"],
            json!(["ALL"]),
            "{c}"
        );
    }
    // Idempotent: the agent enforces again what the server filled.
    let before = j.clone();
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    assert_eq!(j, before);
    // Fields already set to allowed values are kept.
    let mut j = with(
        &format!("{C0}/securityContext"),
        json!({"capabilities": {"drop": ["ALL", "NET_RAW"], "add": ["NET_BIND_SERVICE"]}, "runAsUser": 1000, "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}),
    );
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    let sc = &j["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL", "NET_RAW"]));
    assert_eq!(sc["seccompProfile"]["type"], "Localhost");
}

#[test]
fn a_restricted_pod_without_a_user_gets_the_default_user_and_group() {
    let sc = |j: &Value| j["spec"]["template"]["spec"]["securityContext"].clone();
    let mut j = job();
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    assert_eq!(sc(&j)["runAsUser"], json!(DEFAULT_RUN_AS_USER));
    assert_eq!(sc(&j)["runAsGroup"], json!(65532));
    // Another id, or none (the image's own user).
    for (user, want) in [
        (DefaultUser::Id(1000), json!(1000)),
        (DefaultUser::Image, Value::Null),
    ] {
        let p = Profile {
            default_user: user,
            ..profile(Level::Restricted)
        };
        let mut j = job();
        enforce(&mut j, &p, &ours()).unwrap();
        assert_eq!(sc(&j)["runAsUser"], want, "{user}");
        assert_eq!(sc(&j)["runAsGroup"], want, "{user}");
    }
    // A user the template names anywhere is left alone, and no group is added to it; a group
    // it names alone stays, and the default user joins it.
    for at in [
        format!("{PS}/securityContext"),
        format!("{I0}/securityContext"),
    ] {
        let mut j = with(&format!("{at}/runAsUser"), json!(1001));
        enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
        assert!(sc(&j).get("runAsGroup").is_none(), "{at}: {}", sc(&j));
        if !at.starts_with(I0) {
            assert_eq!(sc(&j)["runAsUser"], json!(1001));
        } else {
            assert!(sc(&j).get("runAsUser").is_none(), "{at}: {}", sc(&j));
        }
    }
    let mut j = with(&format!("{C0}/securityContext/runAsGroup"), json!(3000));
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    assert_eq!(sc(&j)["runAsUser"], json!(65532));
    assert!(sc(&j).get("runAsGroup").is_none(), "{}", sc(&j));
    // Only where runAsNonRoot applies: not at baseline or privileged (nothing is filled there),
    // not in a user namespace whose template turned it off, never on Windows (the API server
    // refuses both fields there).
    for level in [Level::Baseline, Level::Privileged] {
        let mut j = job();
        enforce(&mut j, &profile(level), &ours()).unwrap();
        assert!(sc(&j).is_null(), "{level}");
    }
    let mut j = with(&format!("{PS}/hostUsers"), json!(false));
    set(
        &mut j,
        &format!("{PS}/securityContext/runAsNonRoot"),
        json!(false),
    );
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    assert!(sc(&j).get("runAsUser").is_none(), "{}", sc(&j));
    let mut j = with(&format!("{PS}/os"), json!({"name": "windows"}));
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    assert!(sc(&j).get("runAsUser").is_none(), "{}", sc(&j));
    // The agent enforces again what the server filled: nothing changes.
    let mut j = job();
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    let before = j.clone();
    let agent = Profile {
        default_user: DefaultUser::Id(4242),
        ..Profile::restricted(Origin::Agent)
    };
    enforce(&mut j, &agent, &ours()).unwrap();
    assert_eq!(j, before);
}

#[test]
fn default_users_parse() {
    assert_eq!("65532".parse(), Ok(DefaultUser::Id(65532)));
    assert_eq!(" none ".parse(), Ok(DefaultUser::Image));
    assert_eq!("2147483647".parse(), Ok(DefaultUser::Id(i32::MAX as u32)));
    for bad in ["0", "-1", "2147483648", "nobody", ""] {
        let e = bad.parse::<DefaultUser>().unwrap_err().to_string();
        assert!(e.contains("from 1 to 2147483647"), "{bad}: {e}");
    }
    assert_eq!(DefaultUser::default().to_string(), "65532");
    assert_eq!(DefaultUser::Image.to_string(), "none");
}

#[test]
fn baseline_and_privileged_fill_only_the_token() {
    for level in [Level::Baseline, Level::Privileged] {
        let mut j = job();
        enforce(&mut j, &profile(level), &ours()).unwrap();
        let pod = &j["spec"]["template"]["spec"];
        assert_eq!(pod["automountServiceAccountToken"], json!(false));
        assert!(pod.get("securityContext").is_none(), "{level}: {pod}");
    }
    // A profile that allows tokens leaves the field alone, and lets `true` through.
    let tokens = Profile {
        automount_service_account_token: true,
        ..profile(Level::Restricted)
    };
    let mut j = job();
    enforce(&mut j, &tokens, &ours()).unwrap();
    assert!(j["spec"]["template"]["spec"]
        .get("automountServiceAccountToken")
        .is_none());
    let mut j = with(&format!("{PS}/automountServiceAccountToken"), json!(true));
    enforce(&mut j, &tokens, &ours()).unwrap();
}

#[test]
fn service_accounts_come_from_the_allowlist() {
    let ci = Profile {
        service_accounts: vec!["ci-bot".into()],
        ..profile(Level::Privileged)
    };
    let mut j = with(&format!("{PS}/serviceAccountName"), json!("ci-bot"));
    enforce(&mut j, &ci, &ours()).unwrap();
    // Unset means `default`, which this allowlist does not hold.
    let e = enforce(&mut job(), &ci, &ours()).unwrap_err();
    assert_eq!(e.path, "spec.template.spec.serviceAccountName");
    assert!(
        e.fix
            .contains("`serviceAccounts: [ci-bot, default]` on policy.rules[0]"),
        "{e}"
    );
}

#[test]
fn user_namespaces_and_windows_relax_what_psa_relaxes() {
    // helpers.go:41: hostUsers false relaxes runAsNonRoot / runAsUser.
    let mut j = with(&format!("{C0}/securityContext/runAsUser"), json!(0));
    set(&mut j, &format!("{PS}/hostUsers"), json!(false));
    assert!(refused(&j, Level::Restricted).is_none());
    // …but not the restricted procMount check.
    set(
        &mut j,
        &format!("{C0}/securityContext/procMount"),
        json!("Unmasked"),
    );
    let e = refused(&j, Level::Restricted).unwrap();
    assert!(
        e.path.ends_with("procMount") && e.fix.contains("podSecurity: baseline"),
        "{e}"
    );
    assert!(refused(&j, Level::Baseline).is_none());
    // A Windows pod gets no seccomp / capabilities / allowPrivilegeEscalation filled or checked.
    let mut j = with(&format!("{PS}/os"), json!({"name": "windows"}));
    enforce(&mut j, &profile(Level::Restricted), &ours()).unwrap();
    let pod = &j["spec"]["template"]["spec"];
    assert!(pod["securityContext"].get("seccompProfile").is_none());
    assert!(pod["containers"][0].get("securityContext").is_none());
}

#[test]
fn fixes_name_the_knob_of_where_the_profile_comes_from() {
    let j = with(&format!("{C0}/securityContext/privileged"), json!(true));
    let agent = Profile::restricted(Origin::Agent);
    let e = enforce(&mut j.clone(), &agent, &ours())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("from the agent's flags") && e.contains("--pod-security privileged"),
        "{e}"
    );
    let all = Profile::restricted(Origin::AllowAll("config file f".into()));
    let e = enforce(&mut j.clone(), &all, &ours())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`policy.allowAll` in config file f") && e.contains("instead of `allowAll`"),
        "{e}"
    );
    let e = refused(
        &with(&format!("{PS}/automountServiceAccountToken"), json!(true)),
        Level::Privileged,
    )
    .unwrap();
    assert!(
        e.fix
            .contains("`automountServiceAccountToken: true` on policy.rules[0]"),
        "{e}"
    );
}

#[test]
fn values_of_the_wrong_type_are_not_allowed_values() {
    for (at, v) in [
        (format!("{C0}/securityContext/privileged"), json!("true")),
        (format!("{PS}/hostNetwork"), json!(1)),
        (format!("{C0}/ports/0/hostPort"), json!("8080")),
        (format!("{PS}/securityContext"), json!("privileged")),
    ] {
        assert!(
            refused(&with(&at, v.clone()), Level::Restricted).is_some(),
            "{at} = {v}"
        );
    }
    // Not a Job at all.
    for bad in [
        json!([]),
        json!({"spec": 1}),
        json!({"spec": {"template": {}}}),
    ] {
        let e = enforce(&mut bad.clone(), &profile(Level::Privileged), &ours()).unwrap_err();
        assert!(e.problem.contains("must be an object"), "{bad}: {e}");
    }
}

#[test]
fn levels_parse_and_order() {
    assert!(Level::Restricted < Level::Baseline && Level::Baseline < Level::Privileged);
    for l in [Level::Restricted, Level::Baseline, Level::Privileged] {
        assert_eq!(l.as_str().parse::<Level>().unwrap(), l);
    }
    assert!("Privileged"
        .parse::<Level>()
        .unwrap_err()
        .to_string()
        .contains("restricted, baseline or privileged"));
    assert_eq!(Level::default(), Level::Restricted);
}
