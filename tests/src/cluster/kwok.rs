//! kwok: the fake node of a test cluster and the pod lifecycle that tests control.
//!
//! The scheduler binds pods to the fake node [`NODE_NAME`]; kwok then moves them through the
//! stages in `kwok-stages.yaml`:
//!
//! * a pending pod becomes `Running` with every container running;
//! * a running pod owned by a Job, or any running pod annotated with [`EXIT_CODE_ANNOTATION`],
//!   waits [`DURATION_ANNOTATION`] (a Go duration such as `500ms` or `2s`; default `1s`), then
//!   every container terminates with exit code [`EXIT_CODE_ANNOTATION`] (default `0`) and the
//!   pod phase becomes `Succeeded` (exit code 0) or `Failed` (anything else);
//! * a pod with a deletion timestamp is deleted.
//!
//! Put the annotations on a Job's pod template (`spec.template.metadata.annotations`) and use
//! `restartPolicy: Never`. Pods of other owners without the annotation keep running.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::Client;

/// Exit code of every container of the pod (decimal string, default `"0"`).
pub const EXIT_CODE_ANNOTATION: &str = "test.rollouts-dispatch.io/exit-code";
/// How long the containers run before they terminate (Go duration string, default `"1s"`).
pub const DURATION_ANNOTATION: &str = "test.rollouts-dispatch.io/duration";
/// Pod-template annotation: the termination message of every container (what a kubelet writes
/// from the log tail under `terminationMessagePolicy: FallbackToLogsOnError`).
pub const TERMINATION_MESSAGE_ANNOTATION: &str = "test.rollouts-dispatch.io/termination-message";

/// Name of the fake node in every test cluster.
pub const NODE_NAME: &str = "kwok-node-0";
/// Annotation that makes kwok manage a node (`--manage-nodes-with-annotation-selector`).
pub const NODE_ANNOTATION: &str = "kwok.x-k8s.io/node";
/// Value of [`NODE_ANNOTATION`].
pub const NODE_ANNOTATION_VALUE: &str = "fake";

/// kwok's configuration: the `KwokConfiguration` and the node and pod stages.
pub const STAGES_YAML: &str = include_str!("kwok-stages.yaml");

/// Pod-template annotations that make every container exit with `exit_code` after `duration`
/// (a Go duration, e.g. `"2s"`).
pub fn lifecycle_annotations(exit_code: i32, duration: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (EXIT_CODE_ANNOTATION.to_owned(), exit_code.to_string()),
        (DURATION_ANNOTATION.to_owned(), duration.to_owned()),
    ])
}

/// Creates the fake node (an existing one is left alone).
pub(crate) async fn create_node(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(NODE_NAME.to_owned()),
            annotations: Some(BTreeMap::from([
                (NODE_ANNOTATION.to_owned(), NODE_ANNOTATION_VALUE.to_owned()),
                ("node.alpha.kubernetes.io/ttl".to_owned(), "0".to_owned()),
            ])),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), NODE_NAME.to_owned()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("kubernetes.io/arch".to_owned(), "amd64".to_owned()),
                ("type".to_owned(), "kwok".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(err) => Err(err).with_context(|| format!("creating node {NODE_NAME}")),
    }
}

/// Whether the node's `Ready` condition is `True` and no taint keeps pods off it.
pub fn node_is_ready(node: &Node) -> bool {
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.effect != "PreferNoSchedule"));
    !tainted
        && node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
}

/// Writes `message` into the terminated state of container `container` of `pod`, as a kubelet
/// does under `terminationMessagePolicy: FallbackToLogsOnError` (kwok terminates containers but
/// writes no message). Container statuses are an atomic list: read, change, write back.
pub async fn set_termination_message(
    client: &Client,
    pod: k8s_openapi::api::core::v1::Pod,
    container: &str,
    message: &str,
) -> Result<()> {
    use k8s_openapi::api::core::v1::Pod;
    let namespace = pod
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut pod = pod;
    for _ in 0..5 {
        let terminated = pod
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|cs| cs.iter_mut().find(|c| c.name == container))
            .and_then(|c| c.state.as_mut())
            .and_then(|s| s.terminated.as_mut())
            .with_context(|| format!("container {container} of pod {name} is not terminated"))?;
        terminated.message = Some(message.to_string());
        match pods
            .replace_status(&name, &PostParams::default(), &pod)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => pod = pods.get(&name).await?,
            Err(e) => return Err(e).context("writing the termination message"),
        }
    }
    anyhow::bail!("pod {name}: status kept changing")
}
