//! The agent as a user installs it for a cluster that only dials out, following the server
//! release's NOTES: its token (`rollouts-dispatch token issue --destination`) and the work keys
//! (`rollouts-dispatch work-keys`) from the server's pod by `kubectl exec`, the token in a
//! Secret, and `helm install` of the same chart with `server.enabled=false, agent.enabled=true`
//! dialling the server's Service, pinning the CA the server release published into the agent's
//! namespace. There is one real node, so the "dial-out cluster" is this cluster: what is real is
//! the agent's pod, its token, its TLS pinning, its RBAC and the Jobs it runs in real containers.

use std::path::Path;

use anyhow::{ensure, Result};
use dispatch_tests::cluster::Cluster;
use serde_json::{json, Value};

use crate::install::{self, apply, exec_in_server};

/// The agent release's namespace.
pub(crate) const NAMESPACE: &str = "edge";
/// The agent's destination (the server release's `agents.destinations`).
pub(crate) const EDGE: &str = "edge-1";
/// Where the agent runs Jobs (`agent.namespaces`).
pub(crate) const JOB_NAMESPACE: &str = "edge-jobs";
/// The agent release (its Deployment is `<release>-rollouts-dispatch-agent`).
pub(crate) const RELEASE: &str = "edge";
/// Where the server's pod has its signing key (`signingKey.value`, the NOTES' `--key-file`).
const SIGNING_KEY: &str = "/etc/rollouts-dispatch/signing-key/jwt.key";

/// Installs the agent release; returns `helm install`'s output.
pub(crate) async fn install(cluster: &Cluster) -> Result<String> {
    let (out, _) = install_from(cluster, &install::our_chart(), None).await?;
    Ok(out)
}

/// Installs the agent release from `chart`, with image tag `image_tag` (else the chart's
/// `appVersion`); returns `helm install`'s output and the values, without the tag, for an
/// upgrade of the same release.
pub(crate) async fn install_from(
    cluster: &Cluster,
    chart: &Path,
    image_tag: Option<&str>,
) -> Result<(String, Value)> {
    let token = exec_in_server(
        cluster,
        "",
        &[
            "token",
            "issue",
            "--key-file",
            SIGNING_KEY,
            "--destination",
            EDGE,
        ],
    )?;
    let keys = exec_in_server(cluster, "", &["work-keys", "--jwt-key-file", SIGNING_KEY])?;
    let work_keys: Vec<&str> = keys
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    ensure!(!work_keys.is_empty(), "work-keys printed no key: {keys}");
    let secret = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "edge-agent-token", "namespace": NAMESPACE},
         "stringData": {"token": token.trim()}},
    ]});
    apply(cluster, &secret, "edge-agent-token")?;
    let values = json!({
        "server": {"enabled": false},
        "agent": {
            "enabled": true,
            "server": format!(
                "https://rollouts-dispatch.{}.svc:8443",
                install::RELEASE_NAMESPACE
            ),
            "tokenSecret": {"name": "edge-agent-token"},
            "workKeys": work_keys,
            "caConfigMap": {"name": "rollouts-dispatch-ca"},
            "namespaces": [JOB_NAMESPACE],
        },
    });
    let mut tagged = values.clone();
    if let Some(tag) = image_tag {
        tagged["image"] = json!({"tag": tag});
    }
    let out = install::helm_release(cluster, "install", RELEASE, chart, NAMESPACE, &tagged)?;
    install::wait_available(
        cluster,
        NAMESPACE,
        &deployment(),
        std::time::Duration::from_secs(120),
    )
    .await?;
    Ok((out, values))
}

/// The agent release's Deployment.
pub(crate) fn deployment() -> String {
    format!("{RELEASE}-rollouts-dispatch-agent")
}
