//! The allowlists of a profile (#27) through [`enforce`]: every reference kind, the legacy token
//! names, scheduling fields, resources and Job caps, pod labels and annotations; refused with
//! the path, the value and the fix, allowed when listed, defaults filled in.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::tests::{job, ours, set, with};
use super::*;

const PS: &str = "/spec/template/spec";
const C0: &str = "/spec/template/spec/containers/0";

fn rules() -> Origin {
    Origin::Rules("policy.rules[0] in config file f".into())
}

/// A profile with `allow`, at baseline (so that the in-tree volumes pass the level).
fn allowing(allow: Allowlists) -> Profile {
    Profile {
        allow,
        level: Level::Baseline,
        ..Profile::restricted(rules())
    }
}

fn enforced(j: &Value, profile: &Profile) -> Result<Value, Refused> {
    let mut j = j.clone();
    enforce(&mut j, profile, &ours()).map(|()| j)
}

/// Every reference a pod spec can make: the patch, the path refused, the name, and the
/// allowlist that lets it through.
fn references() -> Vec<(&'static str, Value, &'static str, &'static str, Allowlists)> {
    let secrets = |n: &str| Allowlists {
        secrets: vec![n.into()],
        ..Allowlists::default()
    };
    let config_maps = Allowlists {
        config_maps: vec!["cm-*".into()],
        ..Allowlists::default()
    };
    let claims = Allowlists {
        persistent_volume_claims: vec!["cache".into()],
        ..Allowlists::default()
    };
    let vol = |v: Value| json!([v]);
    vec![
        (
            "/volumes",
            vol(json!({"name": "s", "secret": {"secretName": "team-b-db"}})),
            "spec.template.spec.volumes[0].secret.secretName",
            "team-b-db",
            secrets("team-*"),
        ),
        (
            "/volumes",
            vol(json!({"name": "c", "configMap": {"name": "cm-x"}})),
            "spec.template.spec.volumes[0].configMap.name",
            "cm-x",
            config_maps.clone(),
        ),
        (
            "/volumes",
            vol(json!({"name": "p", "persistentVolumeClaim": {"claimName": "cache"}})),
            "spec.template.spec.volumes[0].persistentVolumeClaim.claimName",
            "cache",
            claims,
        ),
        (
            "/volumes",
            vol(json!({"name": "v", "csi": {"driver": "secrets-store.csi.k8s.io"}})),
            "spec.template.spec.volumes[0].csi.driver",
            "secrets-store.csi.k8s.io",
            Allowlists {
                csi_drivers: vec!["secrets-store.csi.k8s.io".into()],
                ..Allowlists::default()
            },
        ),
        (
            "/volumes",
            vol(
                json!({"name": "v", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "argocd-secret"}}}),
            ),
            "spec.template.spec.volumes[0].csi.nodePublishSecretRef.name",
            "argocd-secret",
            Allowlists {
                csi_drivers: vec!["d".into()],
                secrets: vec!["argocd-secret".into()],
                ..Allowlists::default()
            },
        ),
        (
            "/volumes",
            vol(
                json!({"name": "v", "projected": {"sources": [{"downwardAPI": {}}, {"secret": {"name": "db"}}]}}),
            ),
            "spec.template.spec.volumes[0].projected.sources[1].secret.name",
            "db",
            secrets("db"),
        ),
        (
            "/volumes",
            vol(json!({"name": "v", "projected": {"sources": [{"configMap": {"name": "cm-1"}}]}})),
            "spec.template.spec.volumes[0].projected.sources[0].configMap.name",
            "cm-1",
            config_maps.clone(),
        ),
        (
            "/volumes",
            vol(
                json!({"name": "v", "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "ceph"}}}),
            ),
            "spec.template.spec.volumes[0].rbd.secretRef.name",
            "ceph",
            secrets("ceph"),
        ),
        (
            "/containers/0/env",
            json!([{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "k"}}}]),
            "spec.template.spec.containers[0].env[0].valueFrom.secretKeyRef.name",
            "db",
            secrets("db"),
        ),
        (
            "/initContainers/0/env",
            json!([{"name": "P", "valueFrom": {"configMapKeyRef": {"name": "cm-2", "key": "k"}}}]),
            "spec.template.spec.initContainers[0].env[0].valueFrom.configMapKeyRef.name",
            "cm-2",
            config_maps.clone(),
        ),
        (
            "/containers/0/envFrom",
            json!([{"secretRef": {"name": "db"}}]),
            "spec.template.spec.containers[0].envFrom[0].secretRef.name",
            "db",
            secrets("db"),
        ),
        (
            "/containers/0/envFrom",
            json!([{"prefix": "X_", "configMapRef": {"name": "cm-3"}}]),
            "spec.template.spec.containers[0].envFrom[0].configMapRef.name",
            "cm-3",
            config_maps,
        ),
        (
            "/imagePullSecrets",
            json!([{"name": "regcred"}]),
            "spec.template.spec.imagePullSecrets[0].name",
            "regcred",
            Allowlists {
                image_pull_secrets: vec!["reg*".into()],
                ..Allowlists::default()
            },
        ),
    ]
}

#[test]
fn every_reference_is_refused_by_default_and_allowed_by_its_list() {
    for (at, value, path, name, allow) in references() {
        let j = with(&format!("{PS}{at}"), value);
        let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
        assert_eq!(e.path, path, "{e}");
        assert!(e.problem.contains(&format!("{name:?}")), "{at}: {e}");
        assert!(
            e.fix.contains("on policy.rules[0] in config file f"),
            "{at}: {e}"
        );
        // A profile of another name does not allow it either …
        let other = Allowlists {
            secrets: vec!["other".into()],
            config_maps: vec!["other".into()],
            persistent_volume_claims: vec!["other".into()],
            csi_drivers: vec!["other".into()],
            image_pull_secrets: vec!["other".into()],
            ephemeral_volumes: true,
            ..Allowlists::default()
        };
        assert_eq!(enforced(&j, &allowing(other)).unwrap_err().path, path);
        // … its own list does.
        if let Err(e) = enforced(&j, &allowing(allow)) {
            panic!("{at}: allowed, yet {e}");
        }
    }
}

#[test]
fn fixes_name_the_rule_key_or_the_agent_flag() {
    let j = with(
        &format!("{PS}/volumes"),
        json!([{"name": "s", "secret": {"secretName": "argocd-secret"}}]),
    );
    let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
    assert!(
        e.to_string().contains(
            "Secret \"argocd-secret\" is not in the profile's `secrets` (none is allowed)"
        ) && e
            .fix
            .contains("`secrets: [argocd-secret]` on policy.rules[0]"),
        "{e}"
    );
    let e = enforced(&j, &Profile::restricted(Origin::Agent)).unwrap_err();
    assert!(
        e.fix
            .contains("`rollouts-dispatch agent --secrets argocd-secret`"),
        "{e}"
    );
    let e = enforced(
        &j,
        &allowing(Allowlists {
            secrets: vec!["db".into(), "tls-*".into()],
            ..Allowlists::default()
        }),
    )
    .unwrap_err();
    assert!(e.problem.contains("(allowed: db, tls-*)"), "{e}");
}

#[test]
fn legacy_token_secret_names_need_an_exact_entry() {
    let glob = allowing(Allowlists {
        secrets: vec!["*".into()],
        image_pull_secrets: vec!["*".into()],
        ..Allowlists::default()
    });
    for (at, value, path) in [
        (
            "/volumes",
            json!([{"name": "t", "secret": {"secretName": "default-token-abcde"}}]),
            "spec.template.spec.volumes[0].secret.secretName",
        ),
        (
            "/containers/0/envFrom",
            json!([{"secretRef": {"name": "argocd-manager-token-x7k2p"}}]),
            "spec.template.spec.containers[0].envFrom[0].secretRef.name",
        ),
        (
            "/imagePullSecrets",
            json!([{"name": "builder-token-q2w3e"}]),
            "spec.template.spec.imagePullSecrets[0].name",
        ),
    ] {
        let j = with(&format!("{PS}{at}"), value);
        let e = enforced(&j, &glob).unwrap_err();
        assert_eq!(e.path, path);
        assert!(e.problem.contains("legacy service-account token"), "{e}");
    }
    let exact = allowing(Allowlists {
        secrets: vec!["default-token-abcde".into()],
        ..Allowlists::default()
    });
    let j = with(
        &format!("{PS}/volumes"),
        json!([{"name": "t", "secret": {"secretName": "default-token-abcde"}}]),
    );
    assert!(enforced(&j, &exact).is_ok());
    // Other names still pass the glob.
    let j = with(
        &format!("{PS}/volumes"),
        json!([{"name": "s", "secret": {"secretName": "db"}}]),
    );
    assert!(enforced(&j, &glob).is_ok());
}

#[test]
fn ephemeral_volumes_need_their_switch_and_no_foreign_data_source() {
    let eph = |spec: Value| {
        with(
            &format!("{PS}/volumes"),
            json!([{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": spec}}}]),
        )
    };
    let plain = eph(json!({"accessModes": ["ReadWriteOnce"]}));
    let e = enforced(&plain, &Profile::restricted(rules())).unwrap_err();
    assert_eq!(e.path, "spec.template.spec.volumes[0].ephemeral");
    assert!(e.fix.contains("`ephemeralVolumes: true`"), "{e}");
    let on = allowing(Allowlists {
        ephemeral_volumes: true,
        persistent_volume_claims: vec!["*".into()],
        ..Allowlists::default()
    });
    assert!(enforced(&plain, &on).is_ok());
    let clone =
        eph(json!({"dataSource": {"kind": "PersistentVolumeClaim", "name": "team-b-data"}}));
    let only_cache = allowing(Allowlists {
        ephemeral_volumes: true,
        persistent_volume_claims: vec!["cache".into()],
        ..Allowlists::default()
    });
    let e = enforced(&clone, &only_cache).unwrap_err();
    assert_eq!(
        e.path,
        "spec.template.spec.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSource.name"
    );
    assert!(e.problem.contains("\"team-b-data\""), "{e}");
    assert!(enforced(&clone, &on).is_ok());
    let snapshot = eph(
        json!({"dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "team-b"}}),
    );
    let e = enforced(&snapshot, &on).unwrap_err();
    assert_eq!(
        e.path,
        "spec.template.spec.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSourceRef"
    );
    assert!(e.fix.contains("no setting allows it"), "{e}");
}

#[test]
fn scheduling_fields_are_refused_unless_listed() {
    let cases = [
        (
            "tolerations",
            json!([{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]),
        ),
        (
            "nodeSelector",
            json!({"node-role.kubernetes.io/control-plane": ""}),
        ),
        ("affinity", json!({"nodeAffinity": {}})),
        ("priorityClassName", json!("system-node-critical")),
        ("runtimeClassName", json!("runc-unconfined")),
        (
            "hostAliases",
            json!([{"ip": "10.0.0.1", "hostnames": ["vault"]}]),
        ),
        ("dnsConfig", json!({"nameservers": ["10.0.0.53"]})),
        ("dnsPolicy", json!("Default")),
        ("schedulerName", json!("my-scheduler")),
        ("topologySpreadConstraints", json!([{"maxSkew": 1}])),
        ("overhead", json!({"cpu": "10"})),
        ("preemptionPolicy", json!("PreemptLowerPriority")),
        (
            "resourceClaims",
            json!([{"name": "gpu", "resourceClaimName": "team-b-gpu"}]),
        ),
    ];
    for (field, value) in cases {
        let j = with(&format!("{PS}/{field}"), value);
        let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
        assert_eq!(e.path, format!("spec.template.spec.{field}"), "{e}");
        assert!(e.fix.contains(&format!("`scheduling: [{field}]`")), "{e}");
        let listed = allowing(Allowlists {
            scheduling: vec![field.parse().unwrap()],
            ..Allowlists::default()
        });
        if let Err(e) = enforced(&j, &listed) {
            panic!("{field} listed, yet {e}");
        }
    }
    // The default DNS policy and empty values pass; `priority` goes with priorityClassName.
    for (field, value) in [
        ("dnsPolicy", json!("ClusterFirst")),
        ("tolerations", json!([])),
        ("nodeSelector", json!({})),
    ] {
        assert!(
            enforced(
                &with(&format!("{PS}/{field}"), value),
                &Profile::restricted(rules())
            )
            .is_ok(),
            "{field}"
        );
    }
    let e = enforced(
        &with(&format!("{PS}/priority"), json!(2_000_001_000)),
        &Profile::restricted(rules()),
    )
    .unwrap_err();
    assert_eq!(e.path, "spec.template.spec.priority");
    assert!(e.fix.contains("`scheduling: [priorityClassName]`"), "{e}");
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

#[test]
fn resources_are_filled_in_and_capped() {
    let j = enforced(&job(), &Profile::restricted(rules())).unwrap();
    for c in ["containers", "initContainers"] {
        let r = &j["spec"]["template"]["spec"][c][0]["resources"];
        assert_eq!(
            r["requests"],
            json!({"cpu": "100m", "memory": "128Mi"}),
            "{c}"
        );
        assert_eq!(
            r["limits"],
            json!({"cpu": "100m", "memory": "128Mi"}),
            "{c}"
        );
    }
    // Idempotent: the agent enforces again what the server filled.
    assert_eq!(enforced(&j, &Profile::restricted(rules())).unwrap(), j);
    // A request above the default raises the filled limit; a limit below it lowers the request.
    let mut t = job();
    set(
        &mut t,
        &format!("{C0}/resources"),
        json!({"requests": {"memory": "1Gi"}, "limits": {"cpu": "50m"}}),
    );
    let j = enforced(&t, &Profile::restricted(rules())).unwrap();
    let r = &j["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(r["limits"], json!({"cpu": "50m", "memory": "1Gi"}));
    assert_eq!(r["requests"], json!({"cpu": "50m", "memory": "1Gi"}));

    for (resources, path, needle, fix) in [
        (
            json!({"limits": {"cpu": "4"}}),
            "containers[0].resources.limits.cpu",
            "container \"check\" asks for 4 of cpu, more than the cap 2",
            "`resources: {max: {cpu: 4}}`",
        ),
        (
            json!({"requests": {"memory": "3Gi"}}),
            "containers[0].resources.requests.memory",
            "more than the cap 2Gi",
            "--max-resources memory=3Gi",
        ),
        (
            json!({"limits": {"nvidia.com/gpu": 1}}),
            "containers[0].resources.limits.nvidia.com/gpu",
            "a resource the profile does not cap",
            "`resources: {max: {nvidia.com/gpu: 1}}`",
        ),
        (
            json!({"limits": {"cpu": "lots"}}),
            "containers[0].resources.limits.cpu",
            "is not a Kubernetes quantity",
            "no setting allows it",
        ),
    ] {
        let j = with(&format!("{C0}/resources"), resources);
        let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
        let agent = enforced(&j, &Profile::restricted(Origin::Agent)).unwrap_err();
        assert_eq!(e.path, format!("spec.template.spec.{path}"), "{e}");
        assert!(e.problem.contains(needle), "{e}");
        assert!(
            e.fix.contains(fix) || agent.fix.contains(fix),
            "{e} / {agent}"
        );
    }
    // The pod's own resources are capped too.
    let e = enforced(
        &with(
            &format!("{PS}/resources"),
            json!({"limits": {"memory": "64Gi"}}),
        ),
        &Profile::restricted(rules()),
    )
    .unwrap_err();
    assert_eq!(e.path, "spec.template.spec.resources.limits.memory");
    // A rule's own defaults and caps.
    let big = allowing(Allowlists {
        resources: Resources::over_builtins(
            BTreeMap::from([("cpu".into(), q("500m"))]),
            BTreeMap::from([("cpu".into(), q("8")), ("nvidia.com/gpu".into(), q("1"))]),
        )
        .unwrap(),
        ..Allowlists::default()
    });
    let j = enforced(
        &with(
            &format!("{C0}/resources"),
            json!({"limits": {"cpu": "4", "nvidia.com/gpu": "1"}}),
        ),
        &big,
    )
    .unwrap();
    let r = &j["spec"]["template"]["spec"]["containers"][0]["resources"];
    assert_eq!(r["requests"]["cpu"], "500m");
    assert_eq!(r["limits"]["nvidia.com/gpu"], "1");
}

#[test]
fn job_parallelism_completions_and_retries_are_capped() {
    let j = enforced(&job(), &Profile::restricted(rules())).unwrap();
    assert_eq!(j["spec"]["backoffLimit"], json!(0), "set values stay");
    let mut unset = job();
    unset["spec"]
        .as_object_mut()
        .unwrap()
        .remove("backoffLimit");
    let j = enforced(&unset, &Profile::restricted(rules())).unwrap();
    assert_eq!(j["spec"]["backoffLimit"], json!(6));
    for (field, value, fix) in [
        (
            "parallelism",
            json!(1000),
            "`jobLimits: {parallelism: 1000}`",
        ),
        ("completions", json!(50), "`jobLimits: {completions: 50}`"),
        (
            "backoffLimit",
            json!(100),
            "`jobLimits: {backoffLimit: 100}`",
        ),
        (
            "backoffLimitPerIndex",
            json!(7),
            "`jobLimits: {backoffLimit: 7}`",
        ),
        ("parallelism", json!(-1), "no setting allows it"),
    ] {
        let j = with(&format!("/spec/{field}"), value);
        let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
        assert_eq!(e.path, format!("spec.{field}"));
        assert!(e.fix.contains(fix), "{e}");
    }
    let wide = allowing(Allowlists {
        job_limits: JobLimits {
            parallelism: 4,
            completions: 8,
            backoff_limit: 2,
        },
        ..Allowlists::default()
    });
    let mut j = with("/spec/parallelism", json!(4));
    set(&mut j, "/spec/completions", json!(8));
    j["spec"].as_object_mut().unwrap().remove("backoffLimit");
    let j = enforced(&j, &wide).unwrap();
    assert_eq!(
        j["spec"]["backoffLimit"],
        json!(2),
        "an unset backoffLimit gets the lower cap"
    );
}

#[test]
fn pod_labels_and_annotations_need_allowed_keys() {
    let labelled = |labels: Value, annotations: Value| {
        let mut j = job();
        let meta = &mut j["spec"]["template"]["metadata"];
        for (k, v) in labels.as_object().unwrap() {
            meta["labels"][k] = v.clone();
        }
        meta["annotations"] = annotations;
        j
    };
    let j = labelled(json!({"app": "payments"}), json!({}));
    let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
    assert_eq!(e.path, "spec.template.metadata.labels[\"app\"]");
    assert!(e.fix.contains("`podLabels: [app]`"), "{e}");
    let j = labelled(
        json!({}),
        json!({"vault.hashicorp.com/agent-inject": "true"}),
    );
    let e = enforced(&j, &Profile::restricted(rules())).unwrap_err();
    assert_eq!(
        e.path,
        "spec.template.metadata.annotations[\"vault.hashicorp.com/agent-inject\"]"
    );
    assert!(
        e.fix
            .contains("`podAnnotations: [vault.hashicorp.com/agent-inject]`"),
        "{e}"
    );
    let allowed = allowing(Allowlists {
        pod_labels: vec!["app.kubernetes.io/*".into()],
        pod_annotations: vec!["test.example/*".into()],
        ..Allowlists::default()
    });
    let j = labelled(
        json!({"app.kubernetes.io/part-of": "verification"}),
        json!({"test.example/x": "1"}),
    );
    assert!(enforced(&j, &allowed).is_ok());
    // Ours are ours whatever the list says, and a glob never opens the reserved prefixes.
    assert!(enforced(&job(), &Profile::restricted(rules())).is_ok());
    let everything = allowing(Allowlists {
        pod_labels: vec!["*".into()],
        ..Allowlists::default()
    });
    let j = labelled(json!({"job-name": "another"}), json!({}));
    assert!(enforced(&j, &everything)
        .unwrap_err()
        .fix
        .contains("no setting allows it"));
}
