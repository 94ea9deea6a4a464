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
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

use crate::install::{apply, workspace};

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
