//! The product installed as a user installs it, on the real node: our image pushed under its
//! public name, `helm install` of our chart (its generated TLS, RBAC and projected tokens), and
//! the Argo Rollouts controller as a pod from the module's `manifests/install.yaml` with our
//! plugin delivered by the init container of `config/argo-helm-values.yaml`, as the argo-helm
//! chart renders those values (`controller.initContainers`, `controller.volumes`,
//! `controller.volumeMounts`, `controller.metricProviderPlugins`; the file's own comments cite
//! where). The argo-helm chart is not a Go module, so the test renders the same values into the
//! upstream manifest itself.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::wait::{eventually, Progress};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::Api;
use serde_json::{json, Value};

use crate::agent;

/// The namespace of our chart's release.
pub(crate) const RELEASE_NAMESPACE: &str = "rollouts-dispatch";
/// The namespace of the Argo Rollouts controller (`config/argo-helm-values.yaml`'s plugin args and
/// the chart's default `tokenReviewAllow` name it).
pub(crate) const ROLLOUTS_NAMESPACE: &str = "argo-rollouts";
/// Argo CD's namespace: the chart's `in-cluster` destination is Argo CD's implicit one.
pub(crate) const ARGOCD_NAMESPACE: &str = "argocd";
/// A destination labelled `env: prod, region: eu` (this cluster, by its `kubernetes` Service).
pub(crate) const PROD_EU: &str = "prod-eu";
/// Where the example Jobs run on the in-cluster destination.
pub(crate) const JOB_NAMESPACE: &str = "verification";
/// rollout.yaml's Rollout `web` (the in-cluster destination may read Rollouts there).
pub(crate) const WEB_NAMESPACE: &str = "web";

/// The workspace root.
pub(crate) fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_owned()
}

/// The version of the workspace (the image tag `make image` builds and the chart's appVersion).
pub(crate) fn version() -> Result<String> {
    let cargo = std::fs::read_to_string(workspace().join("Cargo.toml"))?;
    cargo
        .lines()
        .find_map(|l| {
            l.strip_prefix("version = \"")?
                .strip_suffix('"')
                .map(str::to_owned)
        })
        .context("no version in Cargo.toml")
}

/// Runs `program args` with the cluster's kubeconfig, failing with its output.
pub(crate) fn run(cluster: &Cluster, program: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !out.status.success() {
        bail!(
            "{} {}: {}\n{}",
            program.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl apply --server-side` of `objects` (a JSON value of kind List).
pub(crate) fn apply(cluster: &Cluster, objects: &Value, what: &str) -> Result<()> {
    let file = cluster.dir().join(format!("{what}.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(objects)?)?;
    run(
        cluster,
        &cluster.binaries.kubectl,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &file.display().to_string(),
        ],
    )
    .with_context(|| format!("applying {what}"))?;
    Ok(())
}

/// Pushes our image (`make image`'s layout) under the chart's default repository and tag.
pub(crate) fn push_our_image(cluster: &Cluster) -> Result<String> {
    let node = cluster.node.as_ref().context("a real node")?;
    let registry = node.registry.as_ref().context("the node's registry")?;
    let layout = workspace().join("target/image/layout");
    ensure!(
        layout.join("index.json").exists(),
        "{} is missing: run `make image`",
        layout.display()
    );
    let tag = version()?;
    let name = format!("ghcr.io/rollouts-dispatch/rollouts-dispatch:{tag}");
    registry.push(&layout, &name)?;
    Ok(name)
}

/// The chart's values for this install: the server with Jobs on its own cluster (Argo CD's
/// `in-cluster`) in [`JOB_NAMESPACE`] and [`WEB_NAMESPACE`] for Kargo project `project`, a
/// labelled second destination ([`PROD_EU`]), an agent destination ([`crate::agent::EDGE`]), the
/// chart's generated TLS with the CA published to the controller's and the agent's namespaces, a
/// signing key (the agent's token and work keys come from it); short start and scheduling graces
/// for the waiting-reason scenarios; nothing else beyond the defaults.
pub(crate) fn chart_values(project: &str) -> Value {
    use rand::distr::{Alphanumeric, SampleString};
    let signing_key = Alphanumeric.sample_string(&mut rand::rng(), 48);
    json!({
        "argocd": {"enabled": true, "namespace": ARGOCD_NAMESPACE, "defaultNamespace": JOB_NAMESPACE},
        "inCluster": {"enabled": true, "namespaces": [JOB_NAMESPACE, WEB_NAMESPACE]},
        "tls": {"enabled": true, "caConfigMapNamespaces": [ROLLOUTS_NAMESPACE, agent::NAMESPACE]},
        "signingKey": {"value": signing_key},
        "agents": {"destinations": [
            {"name": agent::EDGE, "labels": {"env": "edge"}, "namespace": agent::JOB_NAMESPACE},
        ]},
        "config": {
            // multi-destination.yaml selects env=prod,region in (eu,us): this cluster once more,
            // labelled, reached with the server's own ServiceAccount (its Role in JOB_NAMESPACE)
            "destinations": [{
                "name": PROD_EU,
                "labels": {"env": "prod", "region": "eu"},
                "server": "https://kubernetes.default.svc",
                "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token",
                "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                "namespaces": [JOB_NAMESPACE],
            }],
            "policy": {
                "rules": [{
                    "projects": [project],
                    "destinations": ["in-cluster", PROD_EU, agent::EDGE],
                    "namespaces": [JOB_NAMESPACE, WEB_NAMESPACE, agent::JOB_NAMESPACE],
                    // alb-ingress.yaml's Job acts with its own ServiceAccount; the others run as
                    // `default`, which a rule with `serviceAccounts` must list (config/server.yaml)
                    "serviceAccounts": ["default", "alb-verifier"],
                    "automountServiceAccountToken": true,
                    // the waiting-reason scenario that names a ConfigMap that does not exist
                    "configMaps": ["missing-*"],
                }],
            },
            // the waiting-reason scenarios end after these (defaults: 30s, 60s)
            "engine": {"startGrace": "5s", "schedulingGrace": "5s"},
        },
    })
}

/// This workspace's chart.
pub(crate) fn our_chart() -> PathBuf {
    workspace().join("charts/rollouts-dispatch")
}

/// `helm args` with the cluster's kubeconfig (`$HELM`, which `make e2e-real` sets).
pub(crate) fn helm(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let helm = std::env::var_os("HELM").map(PathBuf::from).context(
        "HELM names no helm binary (make e2e-real sets it: $(CACHE_DIR)/bin/helm-<version>/helm)",
    )?;
    run(cluster, &helm, args)
}

/// `helm install` of this workspace's chart as `release` in `namespace` with `values`, waiting
/// for its pods.
pub(crate) fn helm_install(
    cluster: &Cluster,
    release: &str,
    namespace: &str,
    values: &Value,
) -> Result<String> {
    helm_release(cluster, "install", release, &our_chart(), namespace, values)
}

/// `helm verb` (`install` or `upgrade`) of `chart` as `release` in `namespace` with `values`,
/// waiting for its pods.
pub(crate) fn helm_release(
    cluster: &Cluster,
    verb: &str,
    release: &str,
    chart: &Path,
    namespace: &str,
    values: &Value,
) -> Result<String> {
    let file = cluster.dir().join(format!("{release}-{verb}-values.json"));
    std::fs::write(&file, serde_json::to_vec_pretty(values)?)?;
    helm(
        cluster,
        &[
            verb,
            release,
            &chart.display().to_string(),
            "--namespace",
            namespace,
            "--create-namespace",
            "-f",
            &file.display().to_string(),
            "--wait",
            "--timeout",
            "4m",
        ],
    )
}

/// The Argo Rollouts controller image, by the name `manifests/install.yaml`'s users pin.
pub(crate) fn controller_image() -> &'static str {
    dispatch_tests::cluster::node::images::IMAGES
        .iter()
        .find(|i| i.recipe == "rollouts")
        .map(|i| i.name)
        .unwrap_or_default()
}

/// Applies the Argo Rollouts controller ([`controller_objects`]), its plugin from `plugin_image`
/// when given (else config/argo-helm-values.yaml's), and waits until our release's server and
/// the controller are available.
pub(crate) async fn install_controller(
    cluster: &Cluster,
    plugin_image: Option<&str>,
) -> Result<()> {
    let node = cluster.node.as_ref().context("a real node")?;
    let mut controller =
        controller_objects(&node.binaries.rollouts_install_yaml, controller_image())?;
    if let Some(image) = plugin_image {
        use_plugin_of(&mut controller, image)?;
    }
    apply(cluster, &controller, "argo-rollouts")?;
    wait_available(
        cluster,
        RELEASE_NAMESPACE,
        "rollouts-dispatch",
        Duration::from_secs(120),
    )
    .await?;
    wait_available(
        cluster,
        ROLLOUTS_NAMESPACE,
        "argo-rollouts",
        Duration::from_secs(180),
    )
    .await
}

/// Points the controller's plugin init container (config/argo-helm-values.yaml) at `image`.
fn use_plugin_of(controller: &mut Value, image: &str) -> Result<()> {
    let items = controller["items"].as_array_mut().context("a List")?;
    for item in items {
        if item["kind"] == "Deployment" && item["metadata"]["name"] == "argo-rollouts" {
            for init in item["spec"]["template"]["spec"]["initContainers"]
                .as_array_mut()
                .context("the controller's init containers")?
            {
                if init["name"] == "rollouts-dispatch-plugin" {
                    init["image"] = json!(image);
                    return Ok(());
                }
            }
        }
    }
    bail!("no init container rollouts-dispatch-plugin in the controller's Deployment")
}

/// The Argo Rollouts controller's objects: the module's `manifests/install.yaml` with the
/// controller image of `image` (IfNotPresent: the node's registry has it), and
/// `config/argo-helm-values.yaml`'s `controller.*` rendered into it as the argo-helm chart does.
pub(crate) fn controller_objects(install_yaml: &Path, image: &str) -> Result<Value> {
    let text = std::fs::read_to_string(install_yaml)
        .with_context(|| format!("reading {}", install_yaml.display()))?;
    let values: Value = serde_saphyr::from_str(&std::fs::read_to_string(
        workspace().join("config/argo-helm-values.yaml"),
    )?)
    .context("parsing config/argo-helm-values.yaml")?;
    let controller = &values["controller"];
    let mut items = Vec::new();
    for doc in text.split("\n---") {
        let object: Value = match serde_saphyr::from_str(doc) {
            Ok(Value::Null) | Err(_) if doc.trim().is_empty() => continue,
            Ok(v) => v,
            Err(err) => bail!("parsing a document of {}: {err}", install_yaml.display()),
        };
        if object.is_null() {
            continue;
        }
        items.push(render_controller_object(object, controller, image)?);
    }
    Ok(json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

fn render_controller_object(mut object: Value, controller: &Value, image: &str) -> Result<Value> {
    let kind = object["kind"].as_str().unwrap_or_default().to_owned();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    if kind == "Deployment" && name == "argo-rollouts" {
        let pod = &mut object["spec"]["template"]["spec"];
        pod["initContainers"] = controller["initContainers"].clone();
        extend(&mut pod["volumes"], &controller["volumes"]);
        let container = &mut pod["containers"][0];
        container["image"] = json!(image);
        container["imagePullPolicy"] = json!("IfNotPresent");
        extend(&mut container["volumeMounts"], &controller["volumeMounts"]);
    }
    if kind == "ConfigMap" && name == "argo-rollouts-config" {
        // templates/controller/configmap.yaml of argo-helm: toYaml of the list (YAML is JSON's
        // superset, and the controller parses the key as YAML).
        object["data"] = json!({
            "metricProviderPlugins": serde_json::to_string(&controller["metricProviderPlugins"])?,
        });
    }
    if object["metadata"]["namespace"].is_null() && !is_cluster_scoped(&kind) {
        object["metadata"]["namespace"] = json!(ROLLOUTS_NAMESPACE);
    }
    Ok(object)
}

fn is_cluster_scoped(kind: &str) -> bool {
    matches!(
        kind,
        "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding" | "Namespace"
    )
}

fn extend(list: &mut Value, more: &Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    if let (Some(list), Some(more)) = (list.as_array_mut(), more.as_array()) {
        list.extend(more.iter().cloned());
    }
}

/// Waits until Deployment `namespace/name` has all its replicas available.
pub(crate) async fn wait_available(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client().await?, namespace);
    eventually(
        &format!("deployment {namespace}/{name} available"),
        timeout,
        || {
            let deployments = deployments.clone();
            let name = name.to_owned();
            async move {
                let d = deployments.get(&name).await?;
                let want = d.spec.replicas.unwrap_or(1);
                let status = d.status.unwrap_or_default();
                let available = status.available_replicas.unwrap_or(0);
                Ok(if available >= want {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!(
                        "{available}/{want} available: {:?}",
                        status.conditions
                    ))
                })
            }
        },
    )
    .await
}

/// `rollouts-dispatch args` in the server's pod (`kubectl exec deploy/rollouts-dispatch`, as the
/// chart's NOTES tell a user to), with `stdin` on its standard input; returns its output.
pub(crate) fn exec_in_server(cluster: &Cluster, stdin: &str, args: &[&str]) -> Result<String> {
    use std::io::Write;
    let mut command = Command::new(&cluster.binaries.kubectl);
    command
        .args([
            "-n",
            RELEASE_NAMESPACE,
            "exec",
            "-i",
            "deploy/rollouts-dispatch",
            "--",
        ])
        .arg("rollouts-dispatch")
        .args(args)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().context("running kubectl exec")?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "kubectl exec deploy/rollouts-dispatch -- rollouts-dispatch {}: {}\n{}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
