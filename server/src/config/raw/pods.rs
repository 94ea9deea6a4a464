//! The pod allowlist keys of a policy rule (issue #27) — `secrets`, `configMaps`,
//! `persistentVolumeClaims`, `csiDrivers`, `imagePullSecrets`, `ephemeralVolumes`,
//! `scheduling`, `resources`, `jobLimits`, `podLabels`, `podAnnotations` — validated into the
//! rule's [`Allowlists`]. They are fields of `RawRule` (serde cannot flatten a struct that
//! refuses unknown keys), kept in one block there and read here.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::{invalid, InvalidField, Problem, RawRule};
use crate::podsecurity::{
    Allowlists, BadQuantity, JobLimits, Quantity, Resources, ResourcesError, SchedulingField,
    UnknownSchedulingField,
};

/// What is wrong with an allowlist key of a rule.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PodsProblem {
    #[error(transparent)]
    Scheduling(#[from] UnknownSchedulingField),
    #[error(transparent)]
    Quantity(#[from] BadQuantity),
    #[error(transparent)]
    Resources(#[from] ResourcesError),
    #[error("empty resource name")]
    EmptyResource,
}

/// `resources: {default: {cpu: 100m}, max: {cpu: "2"}}`, each over the built-ins.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResources {
    #[serde(default)]
    default: BTreeMap<String, RawQuantity>,
    #[serde(default)]
    max: BTreeMap<String, RawQuantity>,
}

/// `jobLimits: {parallelism: 1, completions: 1, backoffLimit: 6}`, each over the built-in.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawJobLimits {
    parallelism: Option<u32>,
    completions: Option<u32>,
    backoff_limit: Option<u32>,
}

/// A quantity as YAML writes it: `128Mi`, `"2"`, or the number `2` / `0.5`.
pub(super) struct RawQuantity(String);

impl<'de> Deserialize<'de> for RawQuantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RawQuantity;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Kubernetes quantity (100m, 2, 128Mi)")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<RawQuantity, E> {
                Ok(RawQuantity(s.to_string()))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(n.to_string()))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(n.to_string()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<RawQuantity, E> {
                Ok(RawQuantity(n.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl RawRule {
    /// The rule's allowlists (`at`: `policy.rules[0]`), or the first key that cannot be used.
    pub(super) fn allowlists(&self, at: &str) -> Result<Allowlists, InvalidField> {
        for (key, list) in [
            ("secrets", &self.secrets),
            ("configMaps", &self.config_maps),
            ("persistentVolumeClaims", &self.persistent_volume_claims),
            ("csiDrivers", &self.csi_drivers),
            ("imagePullSecrets", &self.image_pull_secrets),
            ("podLabels", &self.pod_labels),
            ("podAnnotations", &self.pod_annotations),
        ] {
            if let Some(j) = list.iter().position(|g| g.trim().is_empty()) {
                return Err(invalid(format!("{at}.{key}[{j}]"), Problem::EmptyGlob));
            }
        }
        let mut scheduling = Vec::new();
        for (j, name) in self.scheduling.iter().enumerate() {
            let field: SchedulingField = name
                .parse()
                .map_err(|e| pods(format!("{at}.scheduling[{j}]"), PodsProblem::Scheduling(e)))?;
            if !scheduling.contains(&field) {
                scheduling.push(field);
            }
        }
        scheduling.sort();
        let resources = match &self.resources {
            None => Resources::default(),
            Some(r) => {
                let at = format!("{at}.resources");
                let default = quantities(&r.default, &format!("{at}.default"))?;
                let max = quantities(&r.max, &format!("{at}.max"))?;
                Resources::over_builtins(default, max)
                    .map_err(|e| pods(at, PodsProblem::Resources(e)))?
            }
        };
        let mut job_limits = JobLimits::BUILTIN;
        if let Some(l) = &self.job_limits {
            for (key, value) in [
                ("parallelism", l.parallelism),
                ("completions", l.completions),
            ] {
                if value == Some(0) {
                    return Err(invalid(format!("{at}.jobLimits.{key}"), Problem::Zero));
                }
            }
            job_limits.parallelism = l.parallelism.unwrap_or(job_limits.parallelism);
            job_limits.completions = l.completions.unwrap_or(job_limits.completions);
            job_limits.backoff_limit = l.backoff_limit.unwrap_or(job_limits.backoff_limit);
        }
        Ok(Allowlists {
            secrets: self.secrets.clone(),
            config_maps: self.config_maps.clone(),
            persistent_volume_claims: self.persistent_volume_claims.clone(),
            csi_drivers: self.csi_drivers.clone(),
            image_pull_secrets: self.image_pull_secrets.clone(),
            ephemeral_volumes: self.ephemeral_volumes,
            scheduling,
            resources,
            job_limits,
            pod_labels: self.pod_labels.clone(),
            pod_annotations: self.pod_annotations.clone(),
        })
    }
}

fn pods(field: String, problem: PodsProblem) -> InvalidField {
    invalid(field, Problem::Pods(problem))
}

fn quantities(
    raw: &BTreeMap<String, RawQuantity>,
    at: &str,
) -> Result<BTreeMap<String, Quantity>, InvalidField> {
    let mut out = BTreeMap::new();
    for (name, RawQuantity(text)) in raw {
        if name.trim().is_empty() {
            return Err(pods(at.to_string(), PodsProblem::EmptyResource));
        }
        let q = text
            .parse()
            .map_err(|e| pods(format!("{at}.{name}"), PodsProblem::Quantity(e)))?;
        out.insert(name.clone(), q);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::ServerConfig;
    use crate::podsecurity::{Allowlists, JobLimits, Quantity, SchedulingField};

    fn rule(keys: &str) -> Result<Allowlists, String> {
        let text = format!(
            "policy: {{rules: [{{projects: [a], destinations: [b], namespaces: [n], {keys}}}]}}"
        );
        let c = ServerConfig::parse(&text, "config file t.yaml").map_err(|e| e.to_string())?;
        Ok(c.policy.unwrap().rules[0].allow.clone())
    }

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn a_rule_without_allowlist_keys_allows_nothing_more() {
        assert_eq!(rule("podLabels: []").unwrap(), Allowlists::default());
    }

    #[test]
    fn the_allowlist_keys_are_read() {
        let a = rule(
            "secrets: [db, 'team-a-*'], configMaps: [ca], persistentVolumeClaims: [cache], \
             csiDrivers: [d], imagePullSecrets: [regcred], ephemeralVolumes: true, \
             scheduling: [nodeSelector, tolerations, nodeSelector], \
             resources: {default: {memory: 256Mi}, max: {cpu: 4, memory: 0.5Ti, nvidia.com/gpu: '1'}}, \
             jobLimits: {parallelism: 3}, podLabels: ['app.kubernetes.io/*'], podAnnotations: [x/y]",
        )
        .unwrap();
        assert_eq!(a.secrets, vec!["db", "team-a-*"]);
        assert_eq!(a.image_pull_secrets, vec!["regcred"]);
        assert!(a.ephemeral_volumes);
        assert_eq!(
            a.scheduling,
            vec![SchedulingField::Tolerations, SchedulingField::NodeSelector]
        );
        assert_eq!(a.resources.default["memory"], q("256Mi"));
        assert_eq!(a.resources.default["cpu"], q("100m"));
        assert_eq!(a.resources.max["cpu"], q("4"));
        assert_eq!(a.resources.max["memory"], q("512Gi"));
        assert_eq!(a.resources.max["nvidia.com/gpu"], q("1"));
        assert_eq!(
            a.job_limits,
            JobLimits {
                parallelism: 3,
                ..JobLimits::BUILTIN
            }
        );
        assert_eq!(a.pod_labels, vec!["app.kubernetes.io/*"]);
    }

    #[test]
    fn every_mistake_names_the_key() {
        for (keys, needle) in [
            ("secrets: [db, '']", "policy.rules[0].secrets[1]: empty glob"),
            ("podAnnotations: [' ']", "policy.rules[0].podAnnotations[0]: empty glob"),
            ("scheduling: [nodeName]", "policy.rules[0].scheduling[0]: \"nodeName\" is not a scheduling field; use one of tolerations"),
            ("resources: {max: {cpu: lots}}", "policy.rules[0].resources.max.cpu: \"lots\" is not a Kubernetes quantity"),
            ("resources: {default: {cpu: 3}}", "policy.rules[0].resources: the default cpu (3) is more than its max (2)"),
            ("resources: {default: {x/y: 1}}", "policy.rules[0].resources: \"x/y\" has a default and no max"),
            ("resources: {limits: {}}", "unknown field `limits`"),
            ("jobLimits: {parallelism: 0}", "policy.rules[0].jobLimits.parallelism: must be more than 0"),
            ("jobLimits: {backoffLimit: -1}", "invalid u32"),
            ("jobLimits: {maxParallelism: 2}", "unknown field `maxParallelism`"),
        ] {
            let e = rule(keys).unwrap_err();
            assert!(e.contains(needle), "{keys}: {e}");
        }
    }
}
