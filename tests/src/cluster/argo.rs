//! The real Argo Rollouts controller on a test cluster.
//!
//! [`ArgoRollouts::install`] applies the CRDs from the Argo Rollouts module
//! (`manifests/crds/*.yaml`, copied by `make k8s-bin`), creates the `argo-rollouts` namespace
//! and its `argo-rollouts-config` ConfigMap (which registers metric-provider plugins, e.g.
//! `rollouts-dispatch/job` from a `file://` path), and starts `rollouts-controller` against the
//! cluster in the cluster's process group. The controller runs in its own working directory
//! (it copies plugins to `plugin-bin/` there) and logs to `logs/rollouts-controller.log`.
//! [`ArgoRollouts::start_instance`] starts one more controller beside it with `--instance-id`,
//! as a sharded install runs one per shard.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams,
};
use kube::Client;

use super::process::tail;
use super::Cluster;
use crate::objects::wait_established;
use crate::ports;
use crate::wait::eventually;

/// Namespace of the controller and its ConfigMap.
pub const NAMESPACE: &str = "argo-rollouts";
/// Name of the controller's ConfigMap.
pub const CONFIG_MAP: &str = "argo-rollouts-config";
/// Name of the controller process in the cluster's process group (and of its log file).
pub const PROCESS: &str = "rollouts-controller";
/// Field manager for server-side apply.
const MANAGER: &str = "dispatch-tests";

/// A metric-provider plugin registered in `argo-rollouts-config`.
#[derive(Debug, Clone)]
pub struct MetricPlugin {
    /// Plugin name, `<namespace>/<name>`, e.g. `rollouts-dispatch/job`.
    pub name: String,
    /// Where the controller gets it, e.g. `file:///abs/path/rollouts-dispatch-plugin`.
    pub location: String,
    /// The plugin's argv (`args` in `argo-rollouts-config`, Argo >= 1.7).
    pub args: Vec<String>,
}

impl MetricPlugin {
    /// A plugin loaded from a local file (`file://` + the absolute path).
    pub fn file(name: &str, path: &Path) -> Result<Self> {
        let path = std::fs::canonicalize(path)
            .with_context(|| format!("plugin binary {} not found", path.display()))?;
        Ok(Self {
            name: name.to_owned(),
            location: format!("file://{}", path.display()),
            args: Vec::new(),
        })
    }

    /// The same plugin started with `args`.
    pub fn with_args(mut self, args: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.args = args.into_iter().map(Into::into).collect();
        self
    }
}

/// The Argo Rollouts controller running on a test cluster.
#[derive(Debug)]
pub struct ArgoRollouts {
    /// The controller's log (stdout and stderr, including go-plugin's and plugins' lines).
    pub log: PathBuf,
    /// The controller's working directory (plugins are copied to `plugin-bin/` in it).
    pub work_dir: PathBuf,
    /// Port of the controller's `/healthz`.
    pub healthz_port: u16,
    /// Port of the controller's `/metrics`.
    pub metrics_port: u16,
    /// Its `--instance-id`, if any: it runs only the objects labelled
    /// `argo-rollouts.argoproj.io/controller-instance-id: <id>`, and a controller without one
    /// only the objects without that label (`InstanceIDRequirement`, argo-rollouts
    /// utils/controller/controller.go:287-300, the informers' selector in
    /// cmd/rollouts-controller/main.go:170-195).
    pub instance_id: Option<String>,
    /// Flags after the scene's own (the later of two wins): a bench's `--qps`, `--burst`,
    /// `--analysis-threads`, `--loglevel=info`.
    extra_args: Vec<String>,
    /// Its name in the cluster's process group (and of its log file).
    process: String,
}

impl ArgoRollouts {
    /// Installs the CRDs and the ConfigMap and starts the controller; waits for `/healthz`.
    pub async fn install(cluster: &mut Cluster, plugins: &[MetricPlugin]) -> Result<Self> {
        Self::install_with(cluster, plugins, &[]).await
    }

    /// [`Self::install`], the controller started with `extra_args` after the scene's flags.
    pub async fn install_with(
        cluster: &mut Cluster,
        plugins: &[MetricPlugin],
        extra_args: &[&str],
    ) -> Result<Self> {
        let client = cluster.client().await?;
        apply_crds(&client, &cluster.binaries.argo_rollouts_crds).await?;
        apply_namespace(&client, NAMESPACE).await?;
        apply_config_map(&client, plugins).await?;
        Self::launch(cluster, None, extra_args).await
    }

    /// Starts one more controller on `cluster`, where [`Self::install`] ran, with
    /// `--instance-id id`: it loads the same plugins (the one `argo-rollouts-config`) and runs
    /// only the AnalysisRuns (and Rollouts, Experiments) labelled for instance `id`. Its
    /// process, log and working directory are named after `id`; waits for `/healthz`.
    pub async fn start_instance(cluster: &mut Cluster, id: &str) -> Result<Self> {
        Self::launch(cluster, Some(id), &[]).await
    }

    async fn launch(
        cluster: &mut Cluster,
        instance_id: Option<&str>,
        extra_args: &[&str],
    ) -> Result<Self> {
        let p = ports::allocate(2)?;
        let (healthz_port, metrics_port) = (p[0], p[1]);
        let suffix = instance_id.map(|id| format!("-{id}")).unwrap_or_default();
        let process = format!("{PROCESS}{suffix}");
        let work_dir = cluster.dir.join(format!("argo-rollouts{suffix}"));
        std::fs::create_dir_all(&work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let argo = Self {
            log: cluster.log_path(&process),
            work_dir,
            healthz_port,
            metrics_port,
            instance_id: instance_id.map(String::from),
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            process,
        };
        argo.spawn(cluster).await?;
        Ok(argo)
    }

    /// Kills the controller with SIGKILL (its plugin processes lose their connection) and starts
    /// it again with the same configuration; waits for `/healthz`.
    pub async fn restart(&self, cluster: &mut Cluster) -> Result<()> {
        cluster.kill_process(&self.process)?;
        self.spawn(cluster).await
    }

    /// Kills the controller with SIGKILL and leaves it down until [`Self::start`]: a test writes
    /// an AnalysisRun in several steps that the controller must first see all at once. (A
    /// frozen controller is not enough: thawed, it may act on a timer from its stale cache
    /// before it reads the writes from its watch.)
    pub fn stop(&self, cluster: &mut Cluster) -> Result<()> {
        cluster.kill_process(&self.process)
    }

    /// Starts the controller stopped by [`Self::stop`]; it lists everything afresh.
    pub async fn start(&self, cluster: &mut Cluster) -> Result<()> {
        self.spawn(cluster).await
    }

    async fn spawn(&self, cluster: &mut Cluster) -> Result<()> {
        let (healthz_port, metrics_port) = (self.healthz_port, self.metrics_port);
        let mut cmd = Command::new(&cluster.binaries.rollouts_controller);
        cmd.current_dir(&self.work_dir)
            .env("POD_NAMESPACE", NAMESPACE)
            .args([
                format!("--kubeconfig={}", cluster.kubeconfig.display()),
                format!("--healthzPort={healthz_port}"),
                format!("--metricsPort={metrics_port}"),
                "--leader-elect=false".into(),
                "--loglevel=debug".into(),
            ]);
        if let Some(id) = &self.instance_id {
            cmd.arg(format!("--instance-id={id}"));
        }
        cmd.args(&self.extra_args);
        cluster.spawn_process(&self.process, cmd)?;
        eventually(
            &format!("{} /healthz ok", self.process),
            Duration::from_secs(60),
            || {
                // Checked here, not in the future: it must own its data (see `Cluster`'s waits).
                let up = cluster.check_alive().map(|()| healthz_ok(healthz_port));
                async move { up }
            },
        )
        .await
        .with_context(|| format!("controller log tail:\n{}", tail(&self.log, 30)))
    }

    /// The controller's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

/// The `AnalysisRun` resource (argoproj.io/v1alpha1), for `Api<DynamicObject>`.
pub fn analysis_run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisRun"),
        "analysisruns",
    )
}

/// `Api` for AnalysisRuns in `namespace`.
pub fn analysis_runs(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &analysis_run_resource())
}

/// Applies every CRD manifest in `dir` and waits until each is Established.
pub async fn apply_crds(client: &Client, dir: &Path) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    entries.sort();
    if entries.is_empty() {
        bail!("no CRD manifests in {}", dir.display());
    }
    let mut names = Vec::new();
    for path in &entries {
        names.push(apply_crd_file(&api, path).await?);
    }
    for name in names {
        wait_established(client, &name).await?;
    }
    Ok(())
}

/// Applies the CRD manifest at `path` (server-side apply); returns the CRD's name.
pub async fn apply_crd_file(api: &Api<CustomResourceDefinition>, path: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let name = crd
        .metadata
        .name
        .clone()
        .with_context(|| format!("{} has no metadata.name", path.display()))?;
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .with_context(|| format!("applying crd {name}"))?;
    Ok(name)
}

/// Creates (or keeps) a namespace.
pub async fn apply_namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    api.patch(
        name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&ns),
    )
    .await
    .with_context(|| format!("applying namespace {name}"))?;
    Ok(())
}

/// The `metricProviderPlugins` value of `argo-rollouts-config`.
pub fn metric_plugins_yaml(plugins: &[MetricPlugin]) -> String {
    plugins
        .iter()
        .map(|p| {
            let mut item = format!(
                "- name: {}\n  location: {}\n",
                serde_json::Value::from(p.name.as_str()),
                serde_json::Value::from(p.location.as_str())
            );
            if !p.args.is_empty() {
                item.push_str(&format!(
                    "  args: {}\n",
                    serde_json::Value::from(p.args.clone())
                ));
            }
            item
        })
        .collect()
}

async fn apply_config_map(client: &Client, plugins: &[MetricPlugin]) -> Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let mut data = std::collections::BTreeMap::new();
    if !plugins.is_empty() {
        data.insert(
            "metricProviderPlugins".to_owned(),
            metric_plugins_yaml(plugins),
        );
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.to_owned()),
            namespace: Some(NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    };
    api.patch(
        CONFIG_MAP,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&cm),
    )
    .await
    .with_context(|| format!("applying configmap {NAMESPACE}/{CONFIG_MAP}"))?;
    Ok(())
}

/// A plain HTTP/1.0 `GET /healthz` on loopback; true on a 200 answer.
fn healthz_ok(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer
        .lines()
        .next()
        .is_some_and(|status| status.contains(" 200"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_list_is_yaml_with_quoted_values() {
        let yaml = metric_plugins_yaml(&[MetricPlugin {
            name: "rollouts-dispatch/job".into(),
            location: "file:///x/y".into(),
            args: Vec::new(),
        }]);
        assert_eq!(
            yaml,
            "- name: \"rollouts-dispatch/job\"\n  location: \"file:///x/y\"\n"
        );
        let with_args = MetricPlugin {
            name: "a/b".into(),
            location: "file:///p".into(),
            args: vec!["--server".into(), "http://x:1".into()],
        };
        assert_eq!(
            metric_plugins_yaml(&[with_args]),
            "- name: \"a/b\"\n  location: \"file:///p\"\n  args: [\"--server\",\"http://x:1\"]\n"
        );
    }
}
