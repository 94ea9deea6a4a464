//! The example templates of config/analysis-templates/, as written, through the installed
//! product on the real node: each AnalysisRun is built the way Kargo builds one from a template
//! (its metrics and args, Kargo's labels and annotations: `dispatch_tests::kargo`), the real
//! controller measures it with the plugin its init container delivered, the server runs the Job
//! in a real container, and the run must end with the template's documented verdict.

use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_tests::analysis::{self, wait_for};
use dispatch_tests::cluster::argo::analysis_runs;
use dispatch_tests::cluster::Cluster;
use dispatch_tests::kargo::{Freight, Verification, PROJECT};
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use crate::install::{apply, workspace, JOB_NAMESPACE, WEB_NAMESPACE};

/// How long an example may take, from the run's creation to its verdict (pulls, a container
/// start, the controller's measurement interval).
const VERDICT_TIMEOUT: Duration = Duration::from_secs(180);

/// `my-app` in namespace `my-app`, which the examples check: busybox's httpd serving `/healthz`
/// on 8080 behind a Service on port 80, as restricted as the examples' own pods.
pub(crate) fn my_app() -> Value {
    let labels = json!({"app": "my-app"});
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "my-app"}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "my-app", "namespace": "my-app"},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
           "template": {"metadata": {"labels": labels}, "spec": {
             "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                 "seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{"name": "httpd", "image": "busybox:1.37",
               "command": ["sh", "-c", "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -v -p 8080 -h /tmp/www"],
               "ports": [{"containerPort": 8080}],
               "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
               "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "my-app", "namespace": "my-app"},
         "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]})
}

/// Applies [`my_app`].
pub(crate) fn install_my_app(cluster: &Cluster) -> Result<()> {
    apply(cluster, &my_app(), "my-app")
}

/// The template `config/analysis-templates/<file>` parsed.
pub(crate) fn template(file: &str) -> Result<Value> {
    let path = workspace().join("config/analysis-templates").join(file);
    serde_saphyr::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("parsing {}", path.display()))
}

/// The AnalysisRun Kargo creates for Stage `stage` from `template` with `args` (name, value):
/// Kargo's metadata ([`Verification::analysis_run`]) and the template's metrics and args.
pub(crate) fn run_from(
    template: &Value,
    freight: &Freight,
    stage: &str,
    ulid: &str,
    args: &[(&str, &str)],
) -> Result<DynamicObject> {
    let mut run = Verification::new(stage, ulid, "in-cluster").analysis_run(freight)?;
    run.data["spec"]["metrics"] = template["spec"]["metrics"].clone();
    let declared: Vec<&str> = template["spec"]["args"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["name"].as_str()).collect())
        .unwrap_or_default();
    let args: Vec<Value> = declared
        .iter()
        .map(|name| {
            let value = args.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
            json!({"name": name, "value": value.unwrap_or_default()})
        })
        .collect();
    run.data["spec"]["args"] = Value::Array(args);
    Ok(run)
}

/// The AnalysisRuns of Kargo's project namespace.
pub(crate) async fn project_runs(cluster: &Cluster) -> Result<Api<DynamicObject>> {
    Ok(analysis_runs(&cluster.client().await?, PROJECT))
}

/// Creates `run` in Kargo's project namespace and waits for the controller's verdict; returns
/// the phase and the messages.
pub(crate) async fn verdict_of(
    runs: &Api<DynamicObject>,
    run: DynamicObject,
) -> Result<(String, String)> {
    let name = analysis::name(&run).to_owned();
    runs.create(&PostParams::default(), &run)
        .await
        .with_context(|| format!("creating analysisrun {name}"))?;
    let done = wait_for(runs, &name, VERDICT_TIMEOUT, analysis::is_finished).await?;
    Ok((analysis::phase(&done), analysis::all_messages(&done)))
}

/// alb-ingress.yaml's ServiceAccount `alb-verifier` in [`JOB_NAMESPACE`], which may create, read
/// and delete Ingresses there (the template's comment), and `my-app` there too: an Ingress's
/// backend is a Service of its own namespace.
pub(crate) fn alb_verifier() -> Value {
    let mut app = my_app();
    let items = app["items"].as_array_mut().expect("items");
    items.retain(|o| o["kind"] != "Namespace");
    for item in items.iter_mut() {
        item["metadata"]["namespace"] = json!(JOB_NAMESPACE);
    }
    items.extend([
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "alb-verifier", "namespace": JOB_NAMESPACE}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "alb-verifier", "namespace": JOB_NAMESPACE},
               "rules": [{"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"],
                          "verbs": ["create", "get", "delete"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "alb-verifier", "namespace": JOB_NAMESPACE},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "alb-verifier"},
               "subjects": [{"kind": "ServiceAccount", "name": "alb-verifier", "namespace": JOB_NAMESPACE}]}),
    ]);
    app
}

/// Plays the part of an ALB ingress controller (there is no cloud load balancer here): every
/// Ingress of class `alb` in [`JOB_NAMESPACE`] gets, in its status, a load balancer hostname
/// that CoreDNS resolves to its backend's Service, where the template's check then sends its
/// request. Runs until dropped.
pub(crate) async fn play_alb_controller(client: Client) -> Result<tokio::task::JoinHandle<()>> {
    let ingresses: Api<Ingress> = Api::namespaced(client, JOB_NAMESPACE);
    Ok(tokio::spawn(async move {
        loop {
            if let Ok(list) = ingresses.list(&ListParams::default()).await {
                for ingress in list {
                    let class = ingress
                        .spec
                        .as_ref()
                        .and_then(|s| s.ingress_class_name.clone());
                    let provisioned = ingress
                        .status
                        .as_ref()
                        .and_then(|s| s.load_balancer.as_ref())
                        .and_then(|lb| lb.ingress.as_ref())
                        .is_some_and(|i| !i.is_empty());
                    if class.as_deref() != Some("alb") || provisioned {
                        continue;
                    }
                    let name = ingress.metadata.name.clone().unwrap_or_default();
                    let hostname = format!("my-app.{JOB_NAMESPACE}.svc.cluster.local");
                    let status =
                        json!({"status": {"loadBalancer": {"ingress": [{"hostname": hostname}]}}});
                    let _ = ingresses
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }))
}

/// Applies [`alb_verifier`].
pub(crate) fn install_alb_verifier(cluster: &Cluster) -> Result<()> {
    apply(cluster, &alb_verifier(), "alb-verifier")
}

/// The image rollout.yaml's check expects the Rollout to run, as the Stage would pass it.
pub(crate) const WEB_IMAGE: &str = "busybox:1.37";

/// rollout.yaml's Rollout `web` in [`WEB_NAMESPACE`]: a canary of busybox's httpd, which the real
/// controller rolls out to real pods on the node (its first revision goes straight to stable).
pub(crate) fn web_rollout() -> Value {
    let labels = json!({"app": "web"});
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
         "metadata": {"name": "web", "namespace": WEB_NAMESPACE},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
           "strategy": {"canary": {"steps": [{"setWeight": 50}, {"pause": {"duration": "1s"}}]}},
           "template": {"metadata": {"labels": labels}, "spec": {
             "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                 "seccompProfile": {"type": "RuntimeDefault"}},
             "containers": [{"name": "httpd", "image": WEB_IMAGE,
               "command": ["sh", "-c", "mkdir -p /tmp/www && echo ok > /tmp/www/healthz && exec httpd -f -p 8080 -h /tmp/www"],
               "ports": [{"containerPort": 8080}],
               "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 2},
               "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]}}}},
    ]})
}

/// Applies [`web_rollout`].
pub(crate) fn install_web_rollout(cluster: &Cluster) -> Result<()> {
    apply(cluster, &web_rollout(), "web-rollout")
}
