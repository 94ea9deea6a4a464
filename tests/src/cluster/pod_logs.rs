//! Real `pods/log` for kwok pods: a test says "these containers print the lines of this file",
//! and the kube-apiserver's `pods/log` returns them (with `follow`, as the test appends more).
//!
//! There is no kubelet: kwok v0.8.0 serves the kubelet API itself (the cluster starts it with
//! `--server-address`, `--node-port` and `--enable-crds=Logs,ClusterLogs`, see `mod.rs`). Its
//! `/containerLogs/{namespace}/{pod}/{container}` finds the file in a `Logs` object named after
//! the pod (first) or a `ClusterLogs` whose selector matches the pod's namespace and name, by
//! container name (a rule without containers is the default), in
//! sigs.k8s.io/kwok@v0.8.0 pkg/kwok/server/debugging_logs.go:124-160, and reads it with the
//! kubelet's own reader, `k8s.io/cri-client` pkg/logs/logs.go:286 (`ReadLogs`): every line in
//! the CRI format `<RFC 3339 time> stdout F <text>` (logs.go:123-127), which [`LogFile`] writes.
//!
//! A followed stream does not end when the container does: kwok has no runtime to ask, and the
//! reader takes "runtime unavailable" for "still running" (cri-client logs.go:431-439, kwok's
//! stub in debugging_logs.go:167-176), so it ends only when the client goes away.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::Client;
use serde_json::json;

use crate::wait::{eventually, Progress};

/// A container log file in the CRI format, appended line by line.
#[derive(Debug, Clone)]
pub struct LogFile {
    path: PathBuf,
}

impl LogFile {
    /// Creates (or empties) the file at `path`.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self> {
        let path = path.into();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, b"").with_context(|| format!("creating {}", path.display()))?;
        Ok(Self { path })
    }

    /// The file's absolute path (what kwok opens).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `lines` as whole stdout lines, written at once (a follower sees them appear).
    pub fn append<I, S>(&self, lines: I) -> Result<()>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let now = humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string();
        let mut text = String::new();
        for line in lines {
            let line = line.as_ref();
            debug_assert!(!line.contains('\n'), "one log line at a time");
            text.push_str(&now);
            text.push_str(" stdout F ");
            text.push_str(line);
            text.push('\n');
        }
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .with_context(|| format!("opening {}", self.path.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("appending to {}", self.path.display()))
    }
}

fn resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "Logs" => "logs",
        _ => "clusterlogs",
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kwok.x-k8s.io", "v1alpha1", kind),
        plural,
    )
}

fn rules(containers: &[(&str, &LogFile)]) -> serde_json::Value {
    containers
        .iter()
        .map(|(container, file)| {
            json!({ "containers": [container], "logsFile": file.path().display().to_string() })
        })
        .collect()
}

/// Every pod in `namespace` (every namespace: `None`) whose containers are named as in
/// `containers` prints its file: a `ClusterLogs` named `name` selecting the namespace, for pods
/// whose names the test cannot know in advance, such as a verification's Job. kwok sees it
/// through a watch, a moment after this returns.
pub async fn serve_in_namespace(
    client: &Client,
    name: &str,
    namespace: Option<&str>,
    containers: &[(&str, &LogFile)],
) -> Result<()> {
    let selector = namespace.map_or_else(|| json!({}), |ns| json!({ "matchNamespaces": [ns] }));
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource("ClusterLogs"));
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterLogs",
        "metadata": { "name": name },
        "spec": {
            "selector": selector,
            "logs": rules(containers),
        },
    }))?;
    api.create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating ClusterLogs {name}"))?;
    Ok(())
}

/// The containers of the pods of Job `job` in `namespace` print the files in `containers`:
/// waits (up to `timeout`) for the Job's pods, then makes a `Logs` object for each.
pub async fn serve_job(
    client: &Client,
    namespace: &str,
    job: &str,
    containers: &[(&str, &LogFile)],
    timeout: Duration,
) -> Result<Vec<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = format!("job-name={job}");
    let names = eventually(&format!("pods of Job {namespace}/{job}"), timeout, || {
        let (pods, selector) = (pods.clone(), selector.clone());
        async move {
            let list = pods.list(&ListParams::default().labels(&selector)).await?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            Ok(if names.is_empty() {
                Progress::Waiting("no pod yet".to_owned())
            } else {
                Progress::Done(names)
            })
        }
    })
    .await?;
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &resource("Logs"));
    for pod in &names {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": { "name": pod, "namespace": namespace },
            "spec": { "logs": rules(containers) },
        }))?;
        api.create(&PostParams::default(), &object)
            .await
            .with_context(|| format!("creating Logs {namespace}/{pod}"))?;
    }
    Ok(names)
}
