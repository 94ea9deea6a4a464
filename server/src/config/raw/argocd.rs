//! The `argocd:` section: one Argo CD instance as a map (the control plane's, serving every
//! Stage: the form before topologies), or a list of instances, each on its own cluster
//! (`kubeconfig`, `destination`, else the control plane) serving the Kargo shards it lists.
//!
//! A Kargo controller serves the Stages whose shard label is its shard name, plus the unlabelled
//! ones when it is the default controller (kargo pkg/controller/predicates.go:56 at 1c76476);
//! `shards` says the same of an Argo CD instance, `""` standing for the unlabelled Stages.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::Problem;
use super::{check_destination_name, check_namespace, check_namespaces, invalid, InvalidField};
use crate::config::{ArgoCdConfig, ArgoCdLocation, Shards, DEFAULT_ARGOCD_INSTANCE};

/// Argo CD's implicit local cluster (`destinations::IN_CLUSTER_NAME`, which `config` may not
/// import: the module graph has destinations → config).
const IN_CLUSTER_NAME: &str = "in-cluster";

/// `argocd:` as written: one map, or a list of them.
pub(in crate::config) enum RawArgoCdSection {
    /// `argocd: {…}`
    One(RawArgoCd),
    /// `argocd: [{…}, …]`
    List(Vec<RawArgoCd>),
}

impl<'de> Deserialize<'de> for RawArgoCdSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // A visitor rather than `#[serde(untagged)]`, which would drop the field errors
        // (`unknown field`, a wrong type) behind "did not match any variant".
        struct Section;
        impl<'de> Visitor<'de> for Section {
            type Value = RawArgoCdSection;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an Argo CD instance (a map) or a list of them")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                RawArgoCd::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(RawArgoCdSection::One)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Vec::<RawArgoCd>::deserialize(de::value::SeqAccessDeserializer::new(seq))
                    .map(RawArgoCdSection::List)
            }
        }
        d.deserialize_any(Section)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(in crate::config) struct RawArgoCd {
    name: Option<String>,
    kubeconfig: Option<RawKubeconfigRef>,
    destination: Option<String>,
    shards: Option<Vec<String>>,
    namespace: Option<String>,
    in_cluster: Option<bool>,
    in_cluster_namespaces: Option<Vec<String>>,
    default_namespace: Option<String>,
    #[serde(default)]
    exec_providers: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKubeconfigRef {
    path: Option<PathBuf>,
    context: Option<String>,
}

/// What is wrong with a key of `argocd:`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ArgoCdProblem {
    #[error("empty list: give at least one Argo CD instance, or remove `argocd`")]
    NoInstance,
    #[error("required in a list of instances: name each Argo CD instance (unique)")]
    NoName,
    #[error("`kubeconfig` and `destination` are mutually exclusive: keep one (neither: the control plane)")]
    KubeconfigAndDestination,
    #[error(
        "{0:?} is an agent destination: the server cannot read an Argo CD behind an agent; \
         give the instance a direct destination (`destinations[]`) or a `kubeconfig`"
    )]
    AgentDestination(String),
    #[error(
        "there is no direct destination {0:?}: name one of `destinations[]` (or of \
         `kubeconfigContexts`), or give the instance a `kubeconfig`"
    )]
    UnknownDestination(String),
    #[error(
        "is the destination `{0}` itself: set `namespaces` on that destination instead \
         (the cluster this instance runs on is that destination)"
    )]
    InClusterNamespacesOfDestination(String),
    #[error(
        "{0:?} is also the name of a destination (`destinations[]` or `agents.destinations[]`); \
         with `kubeconfig` the instance's own cluster is registered under its name: rename one"
    )]
    NameTaken(String),
    #[error(
        "\"in-cluster\" is the control plane's implicit destination; with `kubeconfig` the \
         instance's own cluster is registered under its name: pick another"
    )]
    InClusterName,
    #[error(
        "{0:?} is not a shard name: Kargo copies spec.shard into the kargo.akuity.io/shard \
         label, so it is a label value (at most 63 letters, digits, '-', '_', '.')"
    )]
    BadShard(String),
    #[error(
        "empty list: list the shards (a Stage's spec.shard) this instance serves, \"\" for \
         Stages without one, or remove `shards` to serve those"
    )]
    NoShards,
    #[error(
        "{} is also served by {other}: a Stage's shard must pick one Argo CD instance",
        shown(.shard)
    )]
    ShardTwice { shard: String, other: String },
    #[error(
        "is also true for {other}, on the control plane too: only one instance there registers \
         the implicit `in-cluster` destination; set `inCluster: false` here"
    )]
    InClusterTwice { other: String },
}

/// A shard for messages: `""` is the Stages without `spec.shard`.
fn shown(shard: &str) -> String {
    if shard.is_empty() {
        "the default shard (Stages without spec.shard; an instance without `shards`, or \"\")"
            .to_string()
    } else {
        format!("shard {shard:?}")
    }
}

/// The direct and agent destination names of the file, which `destination` and the names of
/// `kubeconfig` instances are checked against.
pub(in crate::config) struct KnownDestinations<'a> {
    pub(in crate::config) direct: &'a BTreeSet<String>,
    pub(in crate::config) agents: BTreeSet<String>,
    pub(in crate::config) kubeconfig_contexts: bool,
}

/// The typed instances of `argocd:` (empty without it), or the first key that cannot be used.
pub(in crate::config) fn validate_argocd(
    raw: Option<RawArgoCdSection>,
    known: &KnownDestinations<'_>,
) -> Result<Vec<ArgoCdConfig>, InvalidField> {
    let (items, listed) = match raw {
        None => return Ok(Vec::new()),
        Some(RawArgoCdSection::One(one)) => (vec![(String::from("argocd"), one)], false),
        Some(RawArgoCdSection::List(list)) => {
            if list.is_empty() {
                return Err(invalid("argocd", ArgoCdProblem::NoInstance));
            }
            let items = list
                .into_iter()
                .enumerate()
                .map(|(i, a)| (format!("argocd[{i}]"), a))
                .collect();
            (items, true)
        }
    };
    let mut out: Vec<ArgoCdConfig> = Vec::new();
    for (at, a) in items {
        let instance = validate_instance(&at, a, listed, known)?;
        if out.iter().any(|o| o.name == instance.name) {
            return Err(invalid(
                format!("{at}.name"),
                Problem::Duplicate(instance.name),
            ));
        }
        if let Shards::Only(mine) = &instance.shards {
            for (j, other) in out.iter().enumerate() {
                if let Some(shard) = mine.iter().find(|s| other.shards.serves(s)) {
                    let problem = ArgoCdProblem::ShardTwice {
                        shard: shard.clone(),
                        other: format!("argocd[{j}] ({})", other.name),
                    };
                    return Err(invalid(format!("{at}.shards"), problem));
                }
            }
        }
        if instance.location == ArgoCdLocation::ControlPlane && instance.in_cluster {
            if let Some((j, other)) = out
                .iter()
                .enumerate()
                .find(|(_, o)| o.location == ArgoCdLocation::ControlPlane && o.in_cluster)
            {
                let problem = ArgoCdProblem::InClusterTwice {
                    other: format!("argocd[{j}] ({})", other.name),
                };
                return Err(invalid(format!("{at}.inCluster"), problem));
            }
        }
        out.push(instance);
    }
    Ok(out)
}

fn validate_instance(
    at: &str,
    a: RawArgoCd,
    listed: bool,
    known: &KnownDestinations<'_>,
) -> Result<ArgoCdConfig, InvalidField> {
    let name = match (a.name, listed) {
        (Some(n), _) => n,
        (None, false) => DEFAULT_ARGOCD_INSTANCE.to_string(),
        (None, true) => return Err(invalid(format!("{at}.name"), ArgoCdProblem::NoName)),
    };
    check_destination_name(&name).map_err(|e| invalid(format!("{at}.name"), e))?;
    let location = match (a.kubeconfig, a.destination) {
        (Some(_), Some(_)) => {
            return Err(invalid(at, ArgoCdProblem::KubeconfigAndDestination));
        }
        (None, None) => ArgoCdLocation::ControlPlane,
        (Some(k), None) => {
            if name == IN_CLUSTER_NAME {
                return Err(invalid(format!("{at}.name"), ArgoCdProblem::InClusterName));
            }
            if known.direct.contains(&name) || known.agents.contains(&name) {
                let problem = ArgoCdProblem::NameTaken(name);
                return Err(invalid(format!("{at}.name"), problem));
            }
            ArgoCdLocation::Kubeconfig {
                path: k.path,
                context: k.context,
            }
        }
        (None, Some(d)) => {
            let field = format!("{at}.destination");
            if known.agents.contains(&d) {
                return Err(invalid(field, ArgoCdProblem::AgentDestination(d)));
            }
            if !known.direct.contains(&d) && !known.kubeconfig_contexts {
                return Err(invalid(field, ArgoCdProblem::UnknownDestination(d)));
            }
            ArgoCdLocation::Destination(d)
        }
    };
    let shards = match a.shards {
        None if listed => Shards::Only(BTreeSet::from([String::new()])),
        None => Shards::Every,
        Some(list) if list.is_empty() => {
            return Err(invalid(format!("{at}.shards"), ArgoCdProblem::NoShards));
        }
        Some(list) => {
            let mut set = BTreeSet::new();
            for (i, s) in list.into_iter().enumerate() {
                if !s.is_empty() && !dispatch_api::names::is_label_value(&s) {
                    let problem = ArgoCdProblem::BadShard(s);
                    return Err(invalid(format!("{at}.shards[{i}]"), problem));
                }
                if !set.insert(s.clone()) {
                    return Err(invalid(format!("{at}.shards[{i}]"), Problem::Duplicate(s)));
                }
            }
            Shards::Only(set)
        }
    };
    let namespace = a.namespace.unwrap_or_else(|| "argocd".into());
    check_namespace(Some(&namespace)).map_err(|e| invalid(format!("{at}.namespace"), e))?;
    let default_namespace = a.default_namespace.unwrap_or_else(|| "default".into());
    check_namespace(Some(&default_namespace))
        .map_err(|e| invalid(format!("{at}.defaultNamespace"), e))?;
    if let Some(i) = a
        .exec_providers
        .iter()
        .position(|c| c.trim().is_empty() || c.trim() != c)
    {
        return Err(invalid(
            format!("{at}.execProviders[{i}]"),
            Problem::BadCommand(a.exec_providers[i].clone()),
        ));
    }
    check_namespaces(a.in_cluster_namespaces.as_deref(), None)
        .map_err(|e| invalid(format!("{at}.inClusterNamespaces"), e))?;
    if let (ArgoCdLocation::Destination(d), Some(_)) = (&location, &a.in_cluster_namespaces) {
        let problem = ArgoCdProblem::InClusterNamespacesOfDestination(d.clone());
        return Err(invalid(format!("{at}.inClusterNamespaces"), problem));
    }
    Ok(ArgoCdConfig {
        name,
        location,
        shards,
        namespace,
        in_cluster: a.in_cluster.unwrap_or(true),
        in_cluster_namespaces: a.in_cluster_namespaces,
        default_namespace,
        exec_providers: a.exec_providers,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::{ArgoCdLocation, ServerConfig, Shards};
    use std::collections::BTreeSet;

    fn parse(text: &str) -> Result<ServerConfig, String> {
        ServerConfig::parse(text, "config file t.yaml").map_err(|e| e.to_string())
    }

    const DESTINATIONS: &str = "destinations: [{name: us-mgmt, kubeconfig: /k}]\n\
                                agents: {destinations: [{name: edge}]}\n";

    fn shards(list: &[&str]) -> Shards {
        Shards::Only(list.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>())
    }

    #[test]
    fn a_list_of_instances_on_their_clusters() {
        let c = parse(&format!(
            "{DESTINATIONS}argocd:\n\
             - {{name: main}}\n\
             - {{name: eu, kubeconfig: {{path: /eu, context: eu-admin}}, shards: [eu, eu-2]}}\n\
             - {{name: us, destination: us-mgmt, namespace: gitops, shards: [us]}}\n"
        ))
        .unwrap();
        let got: Vec<_> = c
            .argocd
            .iter()
            .map(|a| (a.name.as_str(), a.location.clone(), a.shards.clone()))
            .collect();
        assert_eq!(
            got,
            [
                ("main", ArgoCdLocation::ControlPlane, shards(&[""])),
                (
                    "eu",
                    ArgoCdLocation::Kubeconfig {
                        path: Some("/eu".into()),
                        context: Some("eu-admin".into())
                    },
                    shards(&["eu", "eu-2"])
                ),
                (
                    "us",
                    ArgoCdLocation::Destination("us-mgmt".into()),
                    shards(&["us"])
                ),
            ]
        );
        assert_eq!(c.argocd[2].namespace, "gitops");
        assert!(c.argocd.iter().all(|a| a.in_cluster));
        // An instance serving the default shard and a named one, like a Kargo default
        // controller with a shard name.
        let c = parse("argocd: [{name: main, shards: ['', eu]}]").unwrap();
        assert!(c.argocd[0].shards.serves("") && c.argocd[0].shards.serves("eu"));
        assert!(!c.argocd[0].shards.serves("us"));
        // The single map: every Stage, whatever its shard.
        let c = parse("argocd: {}").unwrap();
        assert_eq!(c.argocd[0].shards, Shards::Every);
        assert!(c.argocd[0].shards.serves("anything"));
    }

    #[test]
    fn every_mistake_names_the_instance_field_and_fix() {
        for (text, needle) in [
            (
                "argocd: []",
                "argocd: empty list: give at least one Argo CD instance",
            ),
            (
                "argocd: [{namespace: x}]",
                "argocd[0].name: required in a list",
            ),
            (
                "argocd: [{name: a}, {name: a, shards: [x]}]",
                "argocd[1].name: \"a\" is used twice",
            ),
            (
                "argocd: [{name: 'a b'}]",
                "argocd[0].name: \"a b\" contains",
            ),
            (
                "argocd: [{name: a, destination: us-mgmt, kubeconfig: {}}]",
                "argocd[0]: `kubeconfig` and `destination` are mutually exclusive",
            ),
            (
                "argocd: [{name: a, destination: edge}]",
                "argocd[0].destination: \"edge\" is an agent destination",
            ),
            (
                "argocd: [{name: a, destination: nowhere}]",
                "argocd[0].destination: there is no direct destination \"nowhere\"",
            ),
            (
                "argocd: [{name: a, destination: us-mgmt, inClusterNamespaces: [x]}]",
                "argocd[0].inClusterNamespaces: is the destination `us-mgmt` itself",
            ),
            (
                "argocd: [{name: us-mgmt, kubeconfig: {}}]",
                "argocd[0].name: \"us-mgmt\" is also the name of a destination",
            ),
            (
                "argocd: [{name: edge, kubeconfig: {}}]",
                "argocd[0].name: \"edge\" is also the name of a destination",
            ),
            (
                "argocd: [{name: in-cluster, kubeconfig: {}}]",
                "argocd[0].name: \"in-cluster\" is the control plane's implicit destination",
            ),
            (
                "argocd: [{name: a, shards: []}]",
                "argocd[0].shards: empty list",
            ),
            (
                "argocd: [{name: a, shards: [eu, eu]}]",
                "argocd[0].shards[1]: \"eu\" is used twice",
            ),
            (
                "argocd: [{name: a, shards: ['e u']}]",
                "argocd[0].shards[0]: \"e u\" is not a shard name",
            ),
            (
                "argocd: [{name: a, shards: [eu]}, {name: b, kubeconfig: {}, shards: [us, eu]}]",
                "argocd[1].shards: shard \"eu\" is also served by argocd[0] (a)",
            ),
            (
                "argocd: [{name: a}, {name: b, kubeconfig: {}}]",
                "argocd[1].shards: the default shard (Stages without spec.shard",
            ),
            (
                "argocd: [{name: a, shards: [x]}, {name: b, namespace: other, shards: [y]}]",
                "argocd[1].inCluster: is also true for argocd[0] (a), on the control plane too",
            ),
            ("argocd: [{name: a, zone: x}]", "unknown field `zone`"),
            ("argocd: 3", "an Argo CD instance (a map) or a list of them"),
        ] {
            let e = parse(&format!("{DESTINATIONS}{text}")).unwrap_err();
            assert!(
                e.contains("config file t.yaml") && e.contains(needle),
                "{text}: {e}"
            );
        }
        // Two instances on the control plane: the second without the implicit in-cluster.
        parse("argocd: [{name: a, shards: [x]}, {name: b, namespace: o, shards: [y], inCluster: false}]")
            .unwrap();
        // `destination` may name a kubeconfig context, known only at start.
        parse("kubeconfigContexts: {}\nargocd: [{name: a, destination: kind-b}]").unwrap();
    }
}
