//! What a pod may reference in its namespace (issue #27): Secrets, ConfigMaps,
//! PersistentVolumeClaims, CSI drivers and image pull Secrets, each against its allowlist.
//!
//! Job pods are created with the server's (or the agent's) credentials, so any object the pod
//! spec names in the target namespace is reachable, whoever wrote the template: another tenant's
//! Secret in a shared `verification` namespace, `argocd-secret`, a legacy service-account token.
//! Every place a pod spec can name one is checked: volumes (`secret`, `configMap`,
//! `persistentVolumeClaim`, `csi` with its `nodePublishSecretRef`, `projected` sources, the
//! secret refs of the in-tree network volumes), `ephemeral` volumes and the claim they would be
//! filled from, `env[].valueFrom` and `envFrom[]` of init, regular and ephemeral containers, and
//! `imagePullSecrets`.
//!
//! Legacy service-account token Secrets (`type: kubernetes.io/service-account-token`) hold the
//! API token of a service account, so mounting one bypasses `serviceAccounts` and
//! `automountServiceAccountToken`. Their type is not in the pod spec, and this check reads
//! nothing from the cluster: it is pure, runs alike on the server and on the agent before any API
//! call, and a Secret read now could be replaced before the kubelet mounts it (reading types
//! would also need `get secrets` wherever Jobs run, a grant the chart does not give). So a Secret
//! name of the form the token controller gives them, `<service account>-token-<suffix>`, is
//! refused unless an allowlist entry names it exactly (a glob is not enough); a token Secret
//! created by hand under another name is only stopped by not allowlisting its name.

use serde_json::{Map, Value};

use super::allowlists::Allowlists;
use super::{list, shown, violation, yaml_scalar, Needs, Violation};
use crate::glob::glob_match;

const POD: &str = "spec.template.spec";
const CONTAINER_LISTS: [&str; 3] = ["initContainers", "containers", "ephemeralContainers"];

/// What a reference names, with its allowlist's rule key and agent flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Secret,
    ConfigMap,
    Claim,
    CsiDriver,
    PullSecret,
}

impl Kind {
    fn noun(self) -> &'static str {
        match self {
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::Claim => "PersistentVolumeClaim",
            Kind::CsiDriver => "CSI driver",
            Kind::PullSecret => "image pull Secret",
        }
    }

    /// The rule key (and, hyphenated, the agent flag).
    fn key(self) -> (&'static str, &'static str) {
        match self {
            Kind::Secret => ("secrets", "secrets"),
            Kind::ConfigMap => ("configMaps", "config-maps"),
            Kind::Claim => ("persistentVolumeClaims", "persistent-volume-claims"),
            Kind::CsiDriver => ("csiDrivers", "csi-drivers"),
            Kind::PullSecret => ("imagePullSecrets", "image-pull-secrets"),
        }
    }

    fn allowed(self, allow: &Allowlists) -> &[String] {
        match self {
            Kind::Secret => &allow.secrets,
            Kind::ConfigMap => &allow.config_maps,
            Kind::Claim => &allow.persistent_volume_claims,
            Kind::CsiDriver => &allow.csi_drivers,
            Kind::PullSecret => &allow.image_pull_secrets,
        }
    }
}

/// In-tree volume types that name a Secret of the namespace (their credentials), with where.
/// Restricted refuses these volume types anyway; baseline and privileged allow them.
const VOLUME_SECRET_REFS: &[(&str, &str, &str)] = &[
    ("azureFile", "/secretName", "secretName"),
    ("cephfs", "/secretRef/name", "secretRef.name"),
    ("cinder", "/secretRef/name", "secretRef.name"),
    ("flexVolume", "/secretRef/name", "secretRef.name"),
    ("iscsi", "/secretRef/name", "secretRef.name"),
    ("rbd", "/secretRef/name", "secretRef.name"),
    ("scaleIO", "/secretRef/name", "secretRef.name"),
    ("storageos", "/secretRef/name", "secretRef.name"),
];

/// Refuses the first reference `pod` makes that `allow` does not list.
pub(super) fn check(pod: &Map<String, Value>, allow: &Allowlists) -> Result<(), Violation> {
    for (i, volume) in list(pod.get("volumes")).iter().enumerate() {
        check_volume(&format!("{POD}.volumes[{i}]"), volume, allow)?;
    }
    for l in CONTAINER_LISTS {
        for (i, c) in list(pod.get(l)).iter().enumerate() {
            let at = format!("{POD}.{l}[{i}]");
            for (e, var) in list(c.get("env")).iter().enumerate() {
                for (source, kind) in [
                    ("secretKeyRef", Kind::Secret),
                    ("configMapKeyRef", Kind::ConfigMap),
                ] {
                    if let Some(r) = var.pointer(&format!("/valueFrom/{source}")) {
                        let path = format!("{at}.env[{e}].valueFrom.{source}.name");
                        named(&path, r.get("name"), kind, allow)?;
                    }
                }
            }
            for (e, from) in list(c.get("envFrom")).iter().enumerate() {
                for (source, kind) in [
                    ("secretRef", Kind::Secret),
                    ("configMapRef", Kind::ConfigMap),
                ] {
                    if let Some(r) = from.get(source).filter(|r| !r.is_null()) {
                        let path = format!("{at}.envFrom[{e}].{source}.name");
                        named(&path, r.get("name"), kind, allow)?;
                    }
                }
            }
        }
    }
    for (i, s) in list(pod.get("imagePullSecrets")).iter().enumerate() {
        let path = format!("{POD}.imagePullSecrets[{i}].name");
        named(&path, s.get("name"), Kind::PullSecret, allow)?;
    }
    Ok(())
}

fn check_volume(at: &str, volume: &Value, allow: &Allowlists) -> Result<(), Violation> {
    let source = |field: &str| volume.get(field).filter(|v| !v.is_null());
    if let Some(s) = source("secret") {
        let path = format!("{at}.secret.secretName");
        named(&path, s.get("secretName"), Kind::Secret, allow)?;
    }
    if let Some(c) = source("configMap") {
        named(
            &format!("{at}.configMap.name"),
            c.get("name"),
            Kind::ConfigMap,
            allow,
        )?;
    }
    if let Some(c) = source("persistentVolumeClaim") {
        let path = format!("{at}.persistentVolumeClaim.claimName");
        named(&path, c.get("claimName"), Kind::Claim, allow)?;
    }
    if let Some(c) = source("csi") {
        // The Secret first: it is what the driver would be handed, whichever driver it is.
        if let Some(r) = c.get("nodePublishSecretRef").filter(|r| !r.is_null()) {
            let path = format!("{at}.csi.nodePublishSecretRef.name");
            named(&path, r.get("name"), Kind::Secret, allow)?;
        }
        named(
            &format!("{at}.csi.driver"),
            c.get("driver"),
            Kind::CsiDriver,
            allow,
        )?;
    }
    if let Some(p) = source("projected") {
        for (j, s) in list(p.get("sources")).iter().enumerate() {
            let at = format!("{at}.projected.sources[{j}]");
            if let Some(r) = s.get("secret").filter(|r| !r.is_null()) {
                named(
                    &format!("{at}.secret.name"),
                    r.get("name"),
                    Kind::Secret,
                    allow,
                )?;
            }
            if let Some(r) = s.get("configMap").filter(|r| !r.is_null()) {
                named(
                    &format!("{at}.configMap.name"),
                    r.get("name"),
                    Kind::ConfigMap,
                    allow,
                )?;
            }
            // `serviceAccountToken` is the identity check's (`automountServiceAccountToken`).
        }
    }
    if let Some(e) = source("ephemeral") {
        check_ephemeral(&format!("{at}.ephemeral"), e, allow)?;
    }
    for (kind, pointer, field) in VOLUME_SECRET_REFS {
        if let Some(name) = source(kind).and_then(|v| v.pointer(pointer)) {
            named(
                &format!("{at}.{kind}.{field}"),
                Some(name),
                Kind::Secret,
                allow,
            )?;
        }
    }
    Ok(())
}

/// An `ephemeral` volume creates a claim for the pod: allowed only with `ephemeralVolumes`, and
/// never filled from data the allowlists do not cover (a cloned claim, a snapshot).
fn check_ephemeral(at: &str, e: &Value, allow: &Allowlists) -> Result<(), Violation> {
    if !allow.ephemeral_volumes {
        return Err(violation(
            at,
            "an ephemeral volume creates a PersistentVolumeClaim for the pod (storage the \
             profile does not allow)",
            Needs::Allow {
                remedy: "use an emptyDir instead".into(),
                rule: "`ephemeralVolumes: true`".into(),
                flag: "`rollouts-dispatch agent --ephemeral-volumes`".into(),
            },
        ));
    }
    for field in ["dataSource", "dataSourceRef"] {
        let Some(src) = e
            .pointer(&format!("/volumeClaimTemplate/spec/{field}"))
            .filter(|s| !s.is_null())
        else {
            continue;
        };
        let path = format!("{at}.volumeClaimTemplate.spec.{field}");
        let kind = src.get("kind").and_then(Value::as_str).unwrap_or_default();
        let core = src
            .get("apiGroup")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .is_empty();
        if kind == "PersistentVolumeClaim" && core {
            named(&format!("{path}.name"), src.get("name"), Kind::Claim, allow)?;
        } else {
            return Err(violation(
                path,
                format!(
                    "the claim would be filled from {kind} {}, data of the namespace that no \
                     allowlist covers",
                    shown(src.get("name"))
                ),
                Needs::Nothing,
            ));
        }
    }
    Ok(())
}

/// The name at `path` (`value`) must match an entry of `kind`'s allowlist.
fn named(
    path: &str,
    value: Option<&Value>,
    kind: Kind,
    allow: &Allowlists,
) -> Result<(), Violation> {
    let noun = kind.noun();
    let (key, flag) = kind.key();
    let Some(name) = value.and_then(Value::as_str).filter(|n| !n.is_empty()) else {
        return Err(violation(
            path,
            format!("{} names no {noun}", shown(value)),
            Needs::Nothing,
        ));
    };
    let allowed = kind.allowed(allow);
    let needs = || Needs::Allow {
        remedy: "remove the reference from the AnalysisTemplate".into(),
        rule: format!("`{key}: [{}]`", yaml_scalar(name)),
        flag: format!("`rollouts-dispatch agent --{flag} {name}`"),
    };
    let secret = matches!(kind, Kind::Secret | Kind::PullSecret);
    if secret && legacy_token_name(name) && !allowed.iter().any(|a| a == name) {
        return Err(violation(
            path,
            format!(
                "{noun} {name:?} is named like a legacy service-account token Secret \
                 (`<service account>-token-<suffix>`), which would hand the pod that service \
                 account's API token whatever `serviceAccounts` says; only an entry naming it \
                 exactly allows it (Secret types are not read)"
            ),
            needs(),
        ));
    }
    if allowed.iter().any(|g| glob_match(g, name)) {
        return Ok(());
    }
    let listed = if allowed.is_empty() {
        "none is allowed".to_string()
    } else {
        format!("allowed: {}", allowed.join(", "))
    };
    Err(violation(
        path,
        format!("{noun} {name:?} is not in the profile's `{key}` ({listed})"),
        needs(),
    ))
}

/// `<service account>-token-<suffix>`: the names the legacy token controller gave its Secrets
/// (`kubernetes/pkg/controller/serviceaccount/tokens_controller.go`, `secret.Strategy.GenerateName`).
fn legacy_token_name(name: &str) -> bool {
    name.match_indices("-token-")
        .any(|(i, m)| i > 0 && i + m.len() < name.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn legacy_token_names_are_recognised() {
        for name in [
            "default-token-abcde",
            "argocd-manager-token-x7k2p",
            "a-token-b",
        ] {
            assert!(legacy_token_name(name), "{name}");
        }
        for name in [
            "token",
            "-token-abc",
            "default-token-",
            "tokens",
            "my-tokens-x",
            "db",
        ] {
            assert!(!legacy_token_name(name), "{name}");
        }
    }
}
