//! Namespace names in the config file: a default `namespace`, and the `namespaces` a
//! destination is limited to (each gets its own watch, so no globs).

use std::collections::BTreeSet;

use dispatch_api::names::is_dns_label;

/// A string that is not a Kubernetes namespace name.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a valid namespace name (lowercase letters, digits and '-', at most 63)")]
pub struct InvalidNamespace(String);

/// A `namespaces` list a destination cannot be limited to ([`check_namespaces`]).
#[derive(Debug, thiserror::Error)]
pub enum InvalidNamespaces {
    /// no namespace at all
    #[error("is empty: list at least one namespace, or remove it to allow every namespace")]
    Empty,
    /// item `.0` is not a namespace name
    #[error("item {0}: {1}")]
    Name(usize, #[source] InvalidNamespace),
    /// a namespace listed twice
    #[error("lists {0:?} twice")]
    Duplicate(String),
    /// the destination's default namespace is not listed
    #[error(
        "does not list the destination's default namespace {namespace:?}: add it to the list \
         ({listed}), or make the default namespace one of them"
    )]
    DefaultOutside {
        /// the default namespace
        namespace: String,
        /// the list
        listed: String,
    },
}

/// The namespaces a destination is limited to: DNS-1123 labels (namespace names, no globs: each
/// gets a watch), at least one, each once, and its default `namespace` among them.
pub fn check_namespaces(
    namespaces: Option<&[String]>,
    default: Option<&str>,
) -> Result<(), InvalidNamespaces> {
    let Some(list) = namespaces else {
        return Ok(());
    };
    if list.is_empty() {
        return Err(InvalidNamespaces::Empty);
    }
    let mut seen = BTreeSet::new();
    for (i, ns) in list.iter().enumerate() {
        check_namespace(Some(ns)).map_err(|e| InvalidNamespaces::Name(i, e))?;
        if !seen.insert(ns.as_str()) {
            return Err(InvalidNamespaces::Duplicate(ns.clone()));
        }
    }
    match default {
        Some(d) if !seen.contains(d) => Err(InvalidNamespaces::DefaultOutside {
            namespace: d.to_string(),
            listed: list.join(", "),
        }),
        _ => Ok(()),
    }
}

pub(super) fn check_namespace(ns: Option<&str>) -> Result<(), InvalidNamespace> {
    match ns {
        None => Ok(()),
        Some(ns) if is_dns_label(ns) => Ok(()),
        Some(ns) => Err(InvalidNamespace(ns.to_string())),
    }
}
