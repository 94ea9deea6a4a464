//! Shared by the end-to-end tests and the verdict benchmark: an in-process `rollouts-dispatch
//! serve`, Kargo-shaped AnalysisRuns with a Freight owner, and polling helpers.
#![allow(dead_code, unreachable_pub)]

pub mod agents;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use dispatch_tests::cluster::kwok::lifecycle_annotations;
use dispatch_tests::cluster::Cluster;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

pub const PLUGIN_NAME: &str = "rollouts-dispatch/job";
pub const PROJECT: &str = "kargo-demo";

pub fn plugin_binary() -> Result<PathBuf> {
    let path = std::env::var_os("PLUGIN_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/x86_64-unknown-linux-gnu/release/rollouts-dispatch-plugin")
        });
    if !path.is_file() {
        bail!(
            "plugin binary {} is missing: run `make plugin-release` or set PLUGIN_BINARY",
            path.display()
        );
    }
    Ok(path)
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// GET `path` on 127.0.0.1:`port`: the status and body, or `None` if nothing answers yet.
pub async fn http_request(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, b)| b.to_string());
    Some((status, body))
}

/// The HTTP status of GET `path`, or `None` if nothing answers yet.
pub async fn http_status(port: u16, path: &str) -> Option<u16> {
    http_request(port, path).await.map(|(status, _)| status)
}

/// The body of GET `path`, or `None` if nothing answers.
pub async fn http_get(port: u16, path: &str) -> Option<String> {
    http_request(port, path).await.map(|(_, body)| body)
}

/// Waits up to 60 s until the admin port `admin` answers `/ready` with 200.
pub async fn wait_ready(what: &str, admin: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(admin, "/ready").await != Some(200) {
        if Instant::now() > deadline {
            bail!("{what} did not become ready within 60s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// `rollouts-dispatch serve` running in this process.
pub struct Server {
    pub args: dispatch_server::cmd::ServeArgs,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(args: dispatch_server::cmd::ServeArgs) -> Result<Self> {
        let admin = args.admin.admin_listen.port();
        let run = args.clone();
        let task = tokio::spawn(async move {
            if let Err(e) = dispatch_server::cmd::serve::serve(run).await {
                eprintln!("rollouts-dispatch serve stopped: {e:#}");
            }
        });
        wait_ready("rollouts-dispatch serve", admin).await?;
        Ok(Self { args, task })
    }

    /// Kills the server abruptly (its engine, watches and listeners go with it) and starts a
    /// fresh one on the same ports and config.
    pub async fn restart(self, down_for: Duration) -> Result<Self> {
        self.task.abort();
        let _ = self.task.await;
        tokio::time::sleep(down_for).await;
        Self::start(self.args).await
    }
}

/// Starts `rollouts-dispatch serve` in this process with destinations `a` and `b`; returns the
/// API URL, the plugin's token file and the server.
pub async fn start_server(
    dir: &Path,
    a: &Cluster,
    b: &Cluster,
) -> Result<(String, PathBuf, Server)> {
    std::fs::create_dir_all(dir)?;
    let key = dir.join("jwt.key");
    std::fs::write(&key, "e2e-signing-key-0123456789abcdef0123456789")?;
    let config = dir.join("server.yaml");
    std::fs::write(
        &config,
        format!(
            "destinations:\n- name: cluster-a\n  kubeconfig: {}\n  labels: {{env: e2e}}\n- name: cluster-b\n  kubeconfig: {}\n  labels: {{env: e2e}}\n\
             policy:\n  rules:\n  - projects: [\"{PROJECT}\"]\n    destinations: [\"cluster-*\"]\n",
            a.kubeconfig.display(),
            b.kubeconfig.display()
        ),
    )?;
    let (token, _) = dispatch_server::token::issue_token(
        &dispatch_server::token::read_key(&key)?,
        "argo-rollouts-controller",
        None,
        Duration::from_secs(3600),
    )?;
    let token_file = dir.join("plugin.token");
    std::fs::write(&token_file, token)?;
    let (port, admin) = (free_port()?, free_port()?);
    let args = dispatch_server::cmd::ServeArgs {
        config: dispatch_server::cmd::ConfigArgs {
            config_file: Some(config),
        },
        listen: ([127, 0, 0, 1], port).into(),
        admin: dispatch_server::cmd::AdminArgs {
            admin_listen: ([127, 0, 0, 1], admin).into(),
        },
        tls_cert: None,
        tls_key: None,
        jwt_key_files: vec![key],
        revoked_tokens: Vec::new(),
        token_review_allow: Vec::new(),
        sync_timeout: Duration::from_secs(30),
        sweep_orphans_every: None,
    };
    let server = Server::start(args).await?;
    Ok((format!("http://127.0.0.1:{port}"), token_file, server))
}

/// A minimal Freight CRD and one Freight, so AnalysisRuns can carry Kargo's owner reference.
pub async fn freight(client: &kube::Client) -> Result<(String, String)> {
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "freights.kargo.akuity.io"},
        "spec": {"group": "kargo.akuity.io", "scope": "Namespaced",
                 "names": {"kind": "Freight", "plural": "freights", "singular": "freight", "listKind": "FreightList"},
                 "versions": [{"name": "v1alpha1", "served": true, "storage": true,
                               "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))?;
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &crd)
        .await
        .context("creating the Freight CRD")?;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kargo.akuity.io", "v1alpha1", "Freight"),
        "freights",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), PROJECT, &ar);
    let name = "abc1234f9e8d7c6b5a4938271605f4e3d2c1b0a9";
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight",
        "metadata": {"name": name, "namespace": PROJECT}, "origin": {"kind": "Warehouse", "name": "w"}
    }))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&PostParams::default(), &obj).await {
            Ok(f) => return Ok((name.to_string(), f.metadata.uid.unwrap_or_default())),
            // The CRD takes a moment to be served.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => return Err(e).context("creating a Freight"),
        }
    }
}

/// An AnalysisRun as Kargo creates it for Stage `stage` verifying on `destination`.
pub fn kargo_run(
    stage: &str,
    ulid: &str,
    freight: &(String, String),
    destination: &str,
    exit_code: i32,
) -> Result<DynamicObject> {
    kargo_run_with(
        stage,
        ulid,
        freight,
        destination,
        json!({"destination": "{{args.destination}}"}),
        exit_code,
        "2s",
    )
}

/// [`kargo_run`] with its own routing fields and Job duration.
pub fn kargo_run_with(
    stage: &str,
    ulid: &str,
    freight: &(String, String),
    destination: &str,
    routing: Value,
    exit_code: i32,
    duration: &str,
) -> Result<DynamicObject> {
    let name = format!("{stage}.{ulid}.{}", &freight.0[..7]);
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {
            "name": name, "namespace": PROJECT,
            "labels": {"kargo.akuity.io/stage": stage, "kargo.akuity.io/freight-collection": "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"},
            "annotations": {"kargo.akuity.io/promotion": format!("{stage}.{ulid}.promo")},
            "ownerReferences": [{"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "name": freight.0, "uid": freight.1, "blockOwnerDeletion": false}]
        },
        "spec": {
            "args": [{"name": "destination", "value": destination}],
            "metrics": [{
                "name": "smoke",
                "provider": {"plugin": {PLUGIN_NAME: block(routing, json!({
                    "logTail": 5,
                    "spec": {"backoffLimit": 0, "template": {
                        "metadata": {"annotations": failing_with_log(lifecycle_annotations(exit_code, duration), exit_code)},
                        "spec": {"restartPolicy": "Never",
                                 "containers": [{"name": "check", "image": "example.invalid/check:1", "command": ["sh", "-c", "curl -f http://svc"]}]}
                    }}
                }))}}
            }]
        }
    }))?)
}

/// The log a failing check prints (the container's termination message in the test clusters).
pub const FAILED_CHECK_LOG: &str =
    "GET http://svc/health\nHTTP 503 Service Unavailable\ncheck failed: svc is not healthy\n";

/// Lifecycle annotations plus, for a failing container, its log as the termination message.
fn failing_with_log(
    mut annotations: std::collections::BTreeMap<String, String>,
    exit_code: i32,
) -> std::collections::BTreeMap<String, String> {
    if exit_code != 0 {
        annotations.insert(
            dispatch_tests::cluster::kwok::TERMINATION_MESSAGE_ANNOTATION.to_string(),
            FAILED_CHECK_LOG.to_string(),
        );
    }
    annotations
}

/// The plugin block: routing fields merged into the rest.
pub fn block(routing: Value, rest: Value) -> Value {
    let mut b = rest;
    if let (Some(b), Some(r)) = (b.as_object_mut(), routing.as_object()) {
        b.extend(r.clone());
    }
    b
}

pub fn phase(ar: &DynamicObject) -> String {
    ar.data
        .pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

pub async fn wait_done(runs: &Api<DynamicObject>, name: &str) -> Result<DynamicObject> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ar = runs
            .get(name)
            .await
            .with_context(|| format!("getting analysisrun {name}"))?;
        if matches!(
            phase(&ar).as_str(),
            "Successful" | "Failed" | "Error" | "Inconclusive"
        ) {
            return Ok(ar);
        }
        if Instant::now() > deadline {
            bail!(
                "analysisrun {name} not finished after 120s; status {}",
                ar.data["status"]
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Our Jobs on `cluster` for the run with `uid`.
pub async fn jobs_of(cluster: &Cluster, uid: &str) -> Result<Vec<Job>> {
    let api: Api<Job> = Api::all(cluster.client().await?);
    Ok(api
        .list(&ListParams::default().labels(&format!("analysisrun.argoproj.io/uid={uid}")))
        .await?
        .items)
}

/// Polls `check` every 500 ms for up to 90 s.
pub async fn eventually<F, Fut>(what: &str, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if check().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The example AnalysisTemplates of `config/analysis-templates`, as JSON.
pub fn example_templates() -> Result<Vec<Value>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/analysis-templates");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let text = std::fs::read_to_string(&path)?;
        out.push(
            serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?,
        );
    }
    Ok(out)
}

/// Creates every example AnalysisTemplate in `namespace`: the real CRD schema validates them.
pub async fn create_example_templates(client: &kube::Client, namespace: &str) -> Result<usize> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisTemplate"),
        "analysistemplates",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    let templates = example_templates()?;
    for t in &templates {
        let obj: DynamicObject = serde_json::from_value(t.clone())?;
        api.create(&PostParams::default(), &obj)
            .await
            .with_context(|| {
                format!(
                    "creating example AnalysisTemplate {:?}",
                    t["metadata"]["name"]
                )
            })?;
    }
    Ok(templates.len())
}

/// The scene of the end-to-end tests: clusters `control`, `a` and `b`; `rollouts-dispatch serve`
/// with destinations cluster-a and cluster-b; the real Argo Rollouts controller on `control`
/// with the plugin registered (`--server`, `--token-file`); the Kargo project namespace and a
/// Freight to own the AnalysisRuns.
pub struct World {
    /// the control plane (Argo Rollouts, AnalysisRuns)
    pub control: Cluster,
    /// destination cluster-a
    pub a: Cluster,
    /// destination cluster-b
    pub b: Cluster,
    /// the server
    pub server: Server,
    /// the controller
    pub rollouts: dispatch_tests::cluster::argo::ArgoRollouts,
    /// a client of `control`
    pub client: kube::Client,
    /// (name, uid) of the Freight
    pub freight: (String, String),
    /// the server's API URL
    pub url: String,
}

impl World {
    /// Starts everything.
    pub async fn start() -> Result<Self> {
        use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
        let plugin = plugin_binary()?;
        let mut clusters = dispatch_tests::cluster::start_many(&["control", "a", "b"]).await?;
        let b = clusters.pop().context("cluster b")?;
        let a = clusters.pop().context("cluster a")?;
        let mut control = clusters.pop().context("cluster control")?;
        let (url, token_file, server) = start_server(&control.dir.join("dispatch"), &a, &b).await?;
        let token_file = token_file.display().to_string();
        let plugin = MetricPlugin::file(PLUGIN_NAME, &plugin)?.with_args([
            "--server",
            url.as_str(),
            "--token-file",
            &token_file,
        ]);
        let rollouts = ArgoRollouts::install(&mut control, &[plugin]).await?;
        let client = control.client().await?;
        argo::apply_namespace(&client, PROJECT).await?;
        let freight = freight(&client).await?;
        Ok(Self {
            control,
            a,
            b,
            server,
            rollouts,
            client,
            freight,
            url,
        })
    }
}

/// The message of the run's last measurement (of its first metric).
pub fn measurement_message(ar: &DynamicObject) -> String {
    ar.data
        .pointer("/status/metricResults/0/measurements")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .and_then(|m| m.get("message"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
