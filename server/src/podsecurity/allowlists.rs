//! What a profile allows a Job's pods beyond the Pod Security Standards (issue #27): the Secrets,
//! ConfigMaps, claims, CSI drivers and pull Secrets they may reference, the scheduling fields
//! they may set, the resources they may use, how many pods and retries the Job may have, and the
//! pod labels and annotations they may carry.
//!
//! Job pods run with the server's (or the agent's) credentials, so whatever a pod spec names in
//! the target namespace becomes reachable to the tenant who wrote the template: another tenant's
//! Secret, a legacy service-account token, the nodes reserved for the control plane. The
//! defaults ([`Allowlists::default`]) therefore allow nothing beyond what a plain Job needs: no
//! references, no scheduling fields, [`BUILTIN_DEFAULT`] resources filled in and capped at
//! [`BUILTIN_MAX`], one pod, the Kubernetes default of 6 retries, no labels or annotations of the
//! template's own. A policy rule (`config`) or the agent's flags widen them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::quantity::Quantity;

/// A pod spec field that decides where a pod runs (or with what priority or runtime): refused
/// unless the profile lists it, because it lets a tenant's check land on nodes it was not meant
/// for (control-plane taints tolerated, a node picked by label) or push other pods aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SchedulingField {
    /// `tolerations`
    Tolerations,
    /// `nodeSelector`
    NodeSelector,
    /// `affinity`
    Affinity,
    /// `priorityClassName` (and `priority`, which only admission derives from it)
    PriorityClassName,
    /// `runtimeClassName`
    RuntimeClassName,
    /// `hostAliases`
    HostAliases,
    /// `dnsConfig`
    DnsConfig,
    /// `dnsPolicy` other than the default `ClusterFirst`
    DnsPolicy,
    /// `schedulerName`
    SchedulerName,
    /// `topologySpreadConstraints`
    TopologySpreadConstraints,
    /// `overhead`
    Overhead,
    /// `preemptionPolicy`
    PreemptionPolicy,
    /// `resourceClaims` (dynamic resource allocation: devices, and claims of the namespace)
    ResourceClaims,
}

impl SchedulingField {
    /// Every field, in the order of the documentation.
    pub const ALL: [SchedulingField; 13] = [
        Self::Tolerations,
        Self::NodeSelector,
        Self::Affinity,
        Self::PriorityClassName,
        Self::RuntimeClassName,
        Self::HostAliases,
        Self::DnsConfig,
        Self::DnsPolicy,
        Self::SchedulerName,
        Self::TopologySpreadConstraints,
        Self::Overhead,
        Self::PreemptionPolicy,
        Self::ResourceClaims,
    ];

    /// The field's name in the pod spec, in the config file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tolerations => "tolerations",
            Self::NodeSelector => "nodeSelector",
            Self::Affinity => "affinity",
            Self::PriorityClassName => "priorityClassName",
            Self::RuntimeClassName => "runtimeClassName",
            Self::HostAliases => "hostAliases",
            Self::DnsConfig => "dnsConfig",
            Self::DnsPolicy => "dnsPolicy",
            Self::SchedulerName => "schedulerName",
            Self::TopologySpreadConstraints => "topologySpreadConstraints",
            Self::Overhead => "overhead",
            Self::PreemptionPolicy => "preemptionPolicy",
            Self::ResourceClaims => "resourceClaims",
        }
    }
}

impl fmt::Display for SchedulingField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a [`SchedulingField`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a scheduling field; use one of {list}", list = scheduling_names())]
pub struct UnknownSchedulingField(pub String);

fn scheduling_names() -> String {
    let names: Vec<&str> = SchedulingField::ALL.iter().map(|f| f.as_str()).collect();
    names.join(", ")
}

impl FromStr for SchedulingField {
    type Err = UnknownSchedulingField;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| UnknownSchedulingField(s.to_string()))
    }
}

/// The requests and limits a container gets when it sets none, by resource name.
pub const BUILTIN_DEFAULT: &[(&str, &str)] = &[("cpu", "100m"), ("memory", "128Mi")];

/// The most a container may request or limit, by resource name; a resource not named here (a
/// GPU, hugepages) is refused until a rule or flag names it.
pub const BUILTIN_MAX: &[(&str, &str)] = &[
    ("cpu", "2"),
    ("memory", "2Gi"),
    ("ephemeral-storage", "4Gi"),
];

/// Each container's resources: what an unset request or limit becomes, and the cap of both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resources {
    /// an unset request (at most the limit) and an unset limit (at least the request), by name
    pub default: BTreeMap<String, Quantity>,
    /// the most a request or limit may be, by name; other resources are refused
    pub max: BTreeMap<String, Quantity>,
}

/// Resources whose default is above their cap, or that have a default and no cap.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourcesError {
    /// `default.cpu` > `max.cpu`
    #[error(
        "the default {resource} ({default}) is more than its max ({max}); lower the default or \
         raise the max"
    )]
    DefaultOverMax {
        /// the resource name
        resource: String,
        /// its default
        default: String,
        /// its cap
        max: String,
    },
    /// a default for a resource with no cap
    #[error("{0:?} has a default and no max; give it a max too")]
    NoMax(String),
}

fn builtin(list: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    list.iter()
        .map(|(name, q)| {
            let q = q.parse().expect("the built-in quantities parse");
            (name.to_string(), q)
        })
        .collect()
}

impl Default for Resources {
    fn default() -> Self {
        Self {
            default: builtin(BUILTIN_DEFAULT),
            max: builtin(BUILTIN_MAX),
        }
    }
}

impl Resources {
    /// The built-ins with `default` and `max` laid over them (resource by resource), checked.
    pub fn over_builtins(
        default: BTreeMap<String, Quantity>,
        max: BTreeMap<String, Quantity>,
    ) -> Result<Self, ResourcesError> {
        let mut r = Self::default();
        r.default.extend(default);
        r.max.extend(max);
        for (name, d) in &r.default {
            let Some(m) = r.max.get(name) else {
                return Err(ResourcesError::NoMax(name.clone()));
            };
            if d > m {
                return Err(ResourcesError::DefaultOverMax {
                    resource: name.clone(),
                    default: d.to_string(),
                    max: m.to_string(),
                });
            }
        }
        Ok(r)
    }
}

/// Caps on the Job's own fields: how many pods at once, how many completions, how many retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLimits {
    /// the most `spec.parallelism` may be
    pub parallelism: u32,
    /// the most `spec.completions` may be
    pub completions: u32,
    /// the most `spec.backoffLimit` (and `backoffLimitPerIndex`) may be; an unset
    /// `backoffLimit` is set to the Kubernetes default 6, or this when lower
    pub backoff_limit: u32,
}

impl JobLimits {
    /// The built-in caps: one pod, one completion (what a plain Job has), the Kubernetes
    /// default of 6 retries (so an unset `backoffLimit` stays within).
    pub const BUILTIN: JobLimits = JobLimits {
        parallelism: 1,
        completions: 1,
        backoff_limit: KUBERNETES_BACKOFF_LIMIT,
    };
}

/// What the Job controller uses when `backoffLimit` is unset (and no `backoffLimitPerIndex`).
pub const KUBERNETES_BACKOFF_LIMIT: u32 = 6;

impl Default for JobLimits {
    fn default() -> Self {
        Self::BUILTIN
    }
}

/// What the pods of a profile may reference, set and use beyond the Pod Security Standards.
/// Names and label keys are globs (`*`, `?`); the defaults allow nothing (see the module).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allowlists {
    /// Secrets a pod may read: volumes, projected sources, `secretKeyRef`, `envFrom`, the
    /// `nodePublishSecretRef` of CSI volumes and the secret refs of in-tree volumes
    pub secrets: Vec<String>,
    /// ConfigMaps: volumes, projected sources, `configMapKeyRef`, `envFrom`
    pub config_maps: Vec<String>,
    /// PersistentVolumeClaims: volumes, and the data source of ephemeral volumes
    pub persistent_volume_claims: Vec<String>,
    /// CSI drivers of inline `csi` volumes
    pub csi_drivers: Vec<String>,
    /// `imagePullSecrets`
    pub image_pull_secrets: Vec<String>,
    /// whether `ephemeral` volumes (a claim created for the pod) are allowed
    pub ephemeral_volumes: bool,
    /// the scheduling fields a pod may set
    pub scheduling: Vec<SchedulingField>,
    /// each container's resource defaults and caps
    pub resources: Resources,
    /// the caps on the Job's parallelism, completions and retries
    pub job_limits: JobLimits,
    /// pod template label keys (besides ours)
    pub pod_labels: Vec<String>,
    /// pod template annotation keys
    pub pod_annotations: Vec<String>,
}

impl Allowlists {
    /// Adds what `other` allows (any matching rule allows): the union of the lists, the larger
    /// of each default and cap.
    pub fn widen(&mut self, other: &Allowlists) {
        fn union<T: Clone + PartialEq>(to: &mut Vec<T>, from: &[T]) {
            for x in from {
                if !to.contains(x) {
                    to.push(x.clone());
                }
            }
        }
        fn larger(to: &mut BTreeMap<String, Quantity>, from: &BTreeMap<String, Quantity>) {
            for (name, q) in from {
                match to.get(name) {
                    Some(have) if have >= q => {}
                    _ => {
                        to.insert(name.clone(), q.clone());
                    }
                }
            }
        }
        union(&mut self.secrets, &other.secrets);
        union(&mut self.config_maps, &other.config_maps);
        union(
            &mut self.persistent_volume_claims,
            &other.persistent_volume_claims,
        );
        union(&mut self.csi_drivers, &other.csi_drivers);
        union(&mut self.image_pull_secrets, &other.image_pull_secrets);
        self.ephemeral_volumes |= other.ephemeral_volumes;
        union(&mut self.scheduling, &other.scheduling);
        self.scheduling.sort();
        larger(&mut self.resources.default, &other.resources.default);
        larger(&mut self.resources.max, &other.resources.max);
        let (mine, theirs) = (&mut self.job_limits, other.job_limits);
        mine.parallelism = mine.parallelism.max(theirs.parallelism);
        mine.completions = mine.completions.max(theirs.completions);
        mine.backoff_limit = mine.backoff_limit.max(theirs.backoff_limit);
        union(&mut self.pod_labels, &other.pod_labels);
        union(&mut self.pod_annotations, &other.pod_annotations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap()
    }

    #[test]
    fn scheduling_fields_read_back_their_names() {
        for f in SchedulingField::ALL {
            assert_eq!(f.as_str().parse::<SchedulingField>(), Ok(f));
        }
        let e = "nodeName"
            .parse::<SchedulingField>()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"nodeName\"") && e.contains("tolerations, nodeSelector"),
            "{e}"
        );
    }

    #[test]
    fn resources_lay_over_the_builtins_and_keep_defaults_under_the_caps() {
        let r = Resources::over_builtins(
            BTreeMap::from([("memory".into(), q("256Mi"))]),
            BTreeMap::from([("nvidia.com/gpu".into(), q("1"))]),
        )
        .unwrap();
        assert_eq!(r.default["memory"], q("256Mi"));
        assert_eq!(r.default["cpu"], q("100m"));
        assert_eq!(r.max["nvidia.com/gpu"], q("1"));
        assert_eq!(r.max["cpu"], q("2"));
        let e = Resources::over_builtins(BTreeMap::from([("cpu".into(), q("4"))]), BTreeMap::new())
            .unwrap_err();
        assert_eq!(
            e,
            ResourcesError::DefaultOverMax {
                resource: "cpu".into(),
                default: "4".into(),
                max: "2".into()
            }
        );
        let e = Resources::over_builtins(
            BTreeMap::from([("example.com/dongle".into(), q("1"))]),
            BTreeMap::new(),
        )
        .unwrap_err();
        assert_eq!(e, ResourcesError::NoMax("example.com/dongle".into()));
    }

    #[test]
    fn widening_takes_the_union_and_the_larger_caps() {
        let mut a = Allowlists {
            secrets: vec!["a".into()],
            scheduling: vec![SchedulingField::NodeSelector],
            ..Allowlists::default()
        };
        let b = Allowlists {
            secrets: vec!["b".into(), "a".into()],
            ephemeral_volumes: true,
            scheduling: vec![SchedulingField::Tolerations],
            resources: Resources::over_builtins(
                BTreeMap::from([("cpu".into(), q("50m"))]),
                BTreeMap::from([("cpu".into(), q("4"))]),
            )
            .unwrap(),
            job_limits: JobLimits {
                parallelism: 3,
                ..JobLimits::BUILTIN
            },
            ..Allowlists::default()
        };
        a.widen(&b);
        assert_eq!(a.secrets, vec!["a", "b"]);
        assert!(a.ephemeral_volumes);
        assert_eq!(
            a.scheduling,
            vec![SchedulingField::Tolerations, SchedulingField::NodeSelector]
        );
        assert_eq!(a.resources.max["cpu"], q("4"));
        assert_eq!(a.resources.default["cpu"], q("100m"), "the larger default");
        assert_eq!(a.job_limits.parallelism, 3);
        assert_eq!(a.job_limits.backoff_limit, 6);
    }
}
