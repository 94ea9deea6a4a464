//! The real node on its own: containers start, Services route and resolve, logs are the
//! kubelet's.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::argo::apply_namespace;
use dispatch_tests::cluster::Cluster;
use dispatch_tests::wait::{eventually, Progress};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams, PostParams};
use serde_json::json;

/// A pod spec that the `restricted` level admits and a kubelet runs as non-root.
pub(crate) fn restricted_pod(name: &str, image: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "main",
                "image": image,
                "command": ["sh", "-c", script],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))
    .expect("a pod")
}

/// Waits until pod `name` ends; returns its phase and its log.
pub(crate) async fn run_to_end(
    pods: &Api<Pod>,
    name: &str,
    timeout: Duration,
) -> Result<(String, String)> {
    let phase = eventually(&format!("pod {name} ends"), timeout, || {
        let pods = pods.clone();
        let name = name.to_owned();
        async move {
            let pod = pods.get(&name).await?;
            let status = pod.status.unwrap_or_default();
            let phase = status.phase.clone().unwrap_or_default();
            Ok(match phase.as_str() {
                "Succeeded" | "Failed" => Progress::Done(phase),
                _ => Progress::Waiting(format!(
                    "{phase} {:?}",
                    status
                        .container_statuses
                        .unwrap_or_default()
                        .iter()
                        .map(|c| c.state.clone())
                        .collect::<Vec<_>>()
                )),
            })
        }
    })
    .await?;
    let log = pods
        .logs(name, &LogParams::default())
        .await
        .with_context(|| format!("reading the log of pod {name}"))?;
    Ok((phase, log))
}

/// A pod on the real node (curl's image, which has busybox's shell): it starts as a non-root user, resolves the `kubernetes` Service by
/// name through CoreDNS, reaches the API server through it (kube-proxy's rules), and its log
/// comes from the kubelet.
pub(crate) async fn check(cluster: &Cluster) -> Result<()> {
    let client = cluster.client().await?;
    apply_namespace(&client, "smoke").await?;
    let pods: Api<Pod> = Api::namespaced(client, "smoke");
    let script = "echo hello from a real container; id -u; \
                  nslookup kubernetes.default.svc.cluster.local 2>&1 | grep -v '^$'; \
                  echo api=$(curl -sS -k --max-time 5 https://kubernetes.default.svc/livez)";
    pods.create(
        &PostParams::default(),
        &restricted_pod("hello", "curlimages/curl:8.11.1", script),
    )
    .await?;
    let (phase, log) = run_to_end(&pods, "hello", Duration::from_secs(120)).await?;
    println!("real: pod hello {phase}:\n{log}");
    if phase != "Succeeded"
        || !log.contains("hello from a real container")
        || !log.contains("65532")
    {
        bail!("pod hello ended {phase}: {log}");
    }
    if !log.contains("api=ok") {
        bail!("the API server did not answer through the kubernetes Service: {log}");
    }
    if !log.contains("10.96.0.1") {
        bail!("kubernetes.default.svc.cluster.local did not resolve to 10.96.0.1: {log}");
    }
    Ok(())
}

/// The cluster's default Pod Security level is `restricted`: a privileged pod in a namespace
/// without labels is refused at admission. Returns `"ok"`.
pub(crate) async fn privileged_pod_is_refused(cluster: &Cluster) -> Result<&'static str> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await?, "smoke");
    let mut pod = restricted_pod("privileged", "busybox:1.37", "true");
    let container = &mut pod.spec.as_mut().expect("spec").containers[0];
    let context = container
        .security_context
        .get_or_insert_with(Default::default);
    context.privileged = Some(true);
    context.allow_privilege_escalation = None;
    match pods.create(&PostParams::default(), &pod).await {
        Err(kube::Error::Api(status))
            if status.message.contains("violates PodSecurity \"restricted") =>
        {
            Ok("ok")
        }
        Err(err) => {
            bail!("a privileged pod was refused, but not by Pod Security restricted: {err}")
        }
        Ok(_) => bail!("a privileged pod was admitted: the cluster does not enforce restricted"),
    }
}
