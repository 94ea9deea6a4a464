//! The Secrets a failed container could print, and their values to redact from its log tail.
//!
//! A check that fails often prints what it was given: an env value read from a Secret
//! (`env[].valueFrom.secretKeyRef`, `envFrom[].secretRef`) or a file of a mounted Secret
//! volume (`secret`, or a `projected` source). Before a log tail leaves the destination (into
//! the AnalysisRun on the control plane), whoever reads it — the server for a direct
//! destination, the agent for its own cluster — reads those Secrets with its own credentials
//! and redacts every value, and each line of a multi-line value. When a Secret cannot be read
//! (forbidden, gone, unreachable), the tail is withheld and the message says why: a value we
//! could not see is a value we could not redact.
//!
//! Not covered, and said so in docs/security.md: values the container transforms before printing
//! (base64, hex, a substring), Secrets it fetches itself over the network, and the
//! ServiceAccount token (the policy keeps `automountServiceAccountToken: false` by default).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;

/// Values shorter than this are still redacted, but a value this short also matches
/// unrelated text; docs/security.md says so. (No value is skipped: over-redaction is the safe side.)
pub const SHORT_VALUE: usize = 4;

/// Why the values of a referenced Secret could not be read, so the tail is withheld.
#[derive(Debug, thiserror::Error)]
pub enum SecretReadError {
    /// The API server refused (RBAC, the Secret is gone, …): its message and HTTP code.
    #[error("Secret {namespace}/{name}: {} ({})", .status.message, .status.code)]
    Refused {
        /// the Secret's namespace
        namespace: String,
        /// the Secret
        name: String,
        /// the API server's answer
        #[source]
        status: Box<kube::core::Status>,
    },
    /// The API server could not be reached or its answer not read.
    #[error("Secret {namespace}/{name}: {source}")]
    Request {
        /// the Secret's namespace
        namespace: String,
        /// the Secret
        name: String,
        /// the client error
        #[source]
        source: kube::Error,
    },
    /// No answer within the log timeout.
    #[error("Secret {namespace}/{name}: no answer within {timeout:?}")]
    Timeout {
        /// the Secret's namespace
        namespace: String,
        /// the Secret
        name: String,
        /// how long we waited
        timeout: Duration,
    },
}

/// The names of the Secrets `container` of `pod` can read: its env and envFrom references and
/// the Secret volumes (plain or projected) it mounts. Sorted, without duplicates.
pub fn referenced(pod: &Pod, container: &str) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let Some(c) = containers.into_iter().find(|c| c.name == container) else {
        return Vec::new();
    };
    let mut names = BTreeSet::new();
    for env in c.env.iter().flatten() {
        if let Some(r) = env
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
        {
            names.insert(r.name.clone());
        }
    }
    for from in c.env_from.iter().flatten() {
        if let Some(r) = &from.secret_ref {
            names.insert(r.name.clone());
        }
    }
    let mounted: BTreeSet<&str> = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .collect();
    for v in spec.volumes.iter().flatten() {
        if !mounted.contains(v.name.as_str()) {
            continue;
        }
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            names.insert(name);
        }
        let sources = v.projected.as_ref().and_then(|p| p.sources.as_ref());
        for s in sources.into_iter().flatten() {
            if let Some(secret) = &s.secret {
                names.insert(secret.name.clone());
            }
        }
    }
    names.into_iter().filter(|n| !n.is_empty()).collect()
}

/// Every value of `secret` as text to redact: each whole value and, for a multi-line value
/// (a PEM key, a kubeconfig), each of its non-blank lines, since a log tail is cut by lines.
pub fn values(secret: &Secret) -> Vec<String> {
    let mut out = Vec::new();
    let data = secret
        .data
        .iter()
        .flatten()
        .map(|(_, v)| String::from_utf8_lossy(&v.0).into_owned());
    let string_data = secret.string_data.iter().flatten().map(|(_, v)| v.clone());
    for value in data.chain(string_data) {
        if value.contains('\n') {
            out.extend(
                value
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(String::from),
            );
        }
        let trimmed = value.trim_end_matches(['\n', '\r']);
        if !trimmed.is_empty() {
            out.push(trimmed.to_string());
        }
    }
    out
}

/// Reads the Secrets `names` in `namespace` with `client` and returns every value to redact.
/// Any Secret that cannot be read fails the whole read: the caller withholds the tail.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    names: &[String],
    timeout: Duration,
) -> Result<Vec<String>, SecretReadError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut out = Vec::new();
    for name in names {
        let fail_ns = || namespace.to_string();
        let secret = match tokio::time::timeout(timeout, api.get(name)).await {
            Ok(Ok(s)) => s,
            Ok(Err(kube::Error::Api(status))) => {
                return Err(SecretReadError::Refused {
                    namespace: fail_ns(),
                    name: name.clone(),
                    status,
                })
            }
            Ok(Err(source)) => {
                return Err(SecretReadError::Request {
                    namespace: fail_ns(),
                    name: name.clone(),
                    source,
                })
            }
            Err(_) => {
                return Err(SecretReadError::Timeout {
                    namespace: fail_ns(),
                    name: name.clone(),
                    timeout,
                })
            }
        };
        out.extend(values(&secret));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn every_way_a_container_reads_a_secret_is_found() {
        let p = pod(json!({
            "containers": [{
                "name": "check",
                "env": [
                    {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-env", "key": "k"}}},
                    {"name": "B", "value": "plain"},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
                ],
                "envFrom": [{"secretRef": {"name": "s-envfrom"}}, {"configMapRef": {"name": "cm2"}}],
                "volumeMounts": [{"name": "vol", "mountPath": "/s"}, {"name": "proj", "mountPath": "/p"}]
            }, {
                "name": "other",
                "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "s-other", "key": "k"}}}],
                "volumeMounts": [{"name": "unmounted-by-check", "mountPath": "/u"}]
            }],
            "volumes": [
                {"name": "vol", "secret": {"secretName": "s-vol"}},
                {"name": "proj", "projected": {"sources": [
                    {"secret": {"name": "s-proj"}}, {"configMap": {"name": "cm3"}}
                ]}},
                {"name": "unmounted-by-check", "secret": {"secretName": "s-unmounted"}}
            ]
        }));
        assert_eq!(
            referenced(&p, "check"),
            ["s-env", "s-envfrom", "s-proj", "s-vol"]
        );
        assert_eq!(referenced(&p, "other"), ["s-other", "s-unmounted"]);
        assert!(referenced(&p, "missing").is_empty());
        let init = pod(json!({
            "initContainers": [{"name": "setup", "envFrom": [{"secretRef": {"name": "s-init"}}]}],
            "containers": [{"name": "check"}]
        }));
        assert_eq!(referenced(&init, "setup"), ["s-init"]);
        assert!(referenced(&init, "check").is_empty());
    }

    #[test]
    fn values_cover_whole_values_and_their_lines() {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            // "hunter2", "line-one\nline-two\n", ""
            "data": {"pw": "aHVudGVyMg==", "pem": "bGluZS1vbmUKbGluZS10d28K", "empty": ""}
        }))
        .unwrap();
        let mut v = values(&s);
        v.sort();
        assert_eq!(v, ["hunter2", "line-one", "line-one\nline-two", "line-two"]);
    }
}
