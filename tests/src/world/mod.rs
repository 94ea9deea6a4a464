//! The World: the whole system on this machine, nothing mocked, as the end-to-end tests, the
//! demo, the verdict benchmark and chaos need it.
//!
//! Three real clusters: `control` (the real Argo Rollouts controller with our plugin registered
//! through `argo-rollouts-config`, the Kargo project namespace and a Freight that owns the
//! AnalysisRuns), and the destinations `a` (`cluster-a`) and `b` (`cluster-b`). What differs is
//! how `rollouts-dispatch` runs, the `D` of [`World<D>`]:
//!
//! * [`Direct`] ([`World::start`], `direct.rs`): one `rollouts-dispatch serve` in this
//!   process, with both destinations in its config (their kubeconfigs), policy `kargo-demo →
//!   cluster-*`, and `control` as its `controlPlane`, so every request is confirmed against the
//!   real controller's AnalysisRuns (`confirmRuns`). [`World::start_with`] adds what
//!   [`DirectOptions`] says: `argocd:` (the Argo CD cluster Secrets on `control` become
//!   destinations too, and `destination: stage` resolves through the Stages and Applications
//!   there), more destinations, more sections (`jobs:`, `applicationSync:`, `ui:`).
//! * [`agents::Agents`] ([`World::start_with_agent`]): two server replicas (real processes) on
//!   the Kubernetes store behind a TCP front; `a` direct, `b` reachable only through its agent.
//!
//! Either way the API is TLS only ([`crate::tls`]): the plugin trusts the test CA through
//! `--ca-file`, and nothing runs with `--insecure-plaintext`. A scene reaches the signing key,
//! the CA and the plugin's token through accessors ([`Credentials`], `credentials.rs`), never
//! by a path into the World's directories. A scene of its own (another server, more CRDs, a
//! second controller) starts the clusters ([`start_clusters`]) and its server, then hands them
//! to [`World::assemble`].

pub mod agents;
mod credentials;
mod direct;

pub use credentials::{Credentials, PluginTokenSwap};
pub use direct::{Direct, DirectOptions};

use std::path::Path;

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject, PostParams};

use crate::analysis::{self, wait_finished};
use crate::artifacts::{plugin_binary, PLUGIN_NAME};
use crate::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use crate::cluster::process::tail;
use crate::cluster::{start_many, Cluster};
use crate::kargo::{Freight, Verification, PROJECT};

/// The whole system; see the module docs. Dropping it stops everything.
pub struct World<D> {
    /// The control plane: Argo Rollouts, the AnalysisRuns.
    pub control: Cluster,
    /// Destination `cluster-a`.
    pub a: Cluster,
    /// Destination `cluster-b`.
    pub b: Cluster,
    /// A client of `control`.
    pub client: kube::Client,
    /// The Argo Rollouts controller on `control`.
    pub rollouts: ArgoRollouts,
    /// The Freight that owns every verification.
    pub freight: Freight,
    /// The URL of the API the plugin calls.
    pub url: String,
    /// How `rollouts-dispatch` runs.
    pub dispatch: D,
}

impl<D> World<D> {
    /// The rest of every scene, once its clusters run and its `rollouts-dispatch` serves:
    ///
    /// 1. on `control`, Argo Rollouts ([`ArgoRollouts::install`]): its CRDs, namespace
    ///    `argo-rollouts`, the `argo-rollouts-config` ConfigMap registering our plugin
    ///    ([`PLUGIN_NAME`], the binary of [`plugin_binary`]) with `plugin_args`, and the
    ///    controller (no `--instance-id`), waited for until healthy;
    /// 2. the Kargo project namespace ([`PROJECT`]) and the Freight that owns the runs
    ///    ([`Freight::create`], with its stand-in CRD).
    ///
    /// It expects: the three clusters of [`start_clusters`], in that order (`control`, `a`,
    /// `b`), with no Argo Rollouts on `control` yet (this installs it, and its controller is the
    /// World's [`World::rollouts`]); `url`, the API the plugin calls, and `plugin_args`, the
    /// plugin's command line (`--server <url> --token-file … --ca-file …`, as
    /// [`plugin_args()`] writes it), to which only [`kube_args`] is added (the resume hints
    /// move `resumeAt` on `control`); `dispatch` already serving at `url`
    /// (nothing here waits for it). It does not touch `a` or `b`. What a test adds goes around
    /// it: CRDs or objects on `control` before or after (through `control.client()` or
    /// [`World::client`]), a second controller after ([`ArgoRollouts::start_instance`] on
    /// [`World::control`]: it reads the same ConfigMap).
    pub async fn assemble(
        [mut control, a, b]: [Cluster; 3],
        url: String,
        plugin_args: Vec<String>,
        dispatch: D,
    ) -> Result<Self> {
        let mut plugin_args = plugin_args;
        plugin_args.extend(kube_args(&control)?);
        let plugin = MetricPlugin::file(PLUGIN_NAME, &plugin_binary()?)?.with_args(plugin_args);
        let rollouts = ArgoRollouts::install(&mut control, &[plugin]).await?;
        let client = control.client().await?;
        argo::apply_namespace(&client, PROJECT).await?;
        let freight = Freight::create(&client).await?;
        Ok(Self {
            control,
            a,
            b,
            client,
            rollouts,
            freight,
            url,
            dispatch,
        })
    }

    /// The AnalysisRuns of the Kargo project.
    pub fn runs(&self) -> Api<DynamicObject> {
        argo::analysis_runs(&self.client, PROJECT)
    }

    /// Creates the AnalysisRun of `verification`, as Kargo does.
    pub async fn submit(&self, verification: &Verification) -> Result<DynamicObject> {
        let run = verification.analysis_run(&self.freight)?;
        let name = analysis::name(&run).to_string();
        self.runs()
            .create(&PostParams::default(), &run)
            .await
            .with_context(|| format!("creating AnalysisRun {name}"))
    }

    /// Waits until the controller has decided `run`; returns it as decided.
    pub async fn finished(&self, run: &DynamicObject) -> Result<DynamicObject> {
        wait_finished(&self.runs(), analysis::name(run)).await
    }

    /// The last `lines` lines of the controller's log (it includes the plugin's log lines):
    /// the first thing to read when a verification went wrong.
    pub fn controller_log_tail(&self, lines: usize) -> String {
        tail(&self.rollouts.log, lines)
    }
}

/// The plugin's command line for [`World::assemble`]: the API at `url`, the token in
/// `token_file`, the API's CA `ca`.
pub fn plugin_args(url: &str, token_file: &Path, ca: &Path) -> Vec<String> {
    let [token_file, ca] = [token_file, ca].map(|p| p.display().to_string());
    [
        "--server",
        url,
        "--token-file",
        &token_file,
        "--ca-file",
        &ca,
    ]
    .map(String::from)
    .to_vec()
}

/// The plugin's access to `control`'s API server for the resume hints (`--kube-api-server`,
/// `--kube-token-file`, `--kube-ca-file`): the admin token the controller itself runs with here
/// (a host process with the cluster's kubeconfig; in a pod it is the controller's
/// ServiceAccount, found by the plugin without flags), written next to the cluster.
pub fn kube_args(control: &Cluster) -> Result<Vec<String>> {
    let dir = control.dir.join("plugin-kube");
    std::fs::create_dir_all(&dir)?;
    let (token, ca) = (dir.join("token"), dir.join("ca.crt"));
    std::fs::write(&token, &control.token)?;
    std::fs::write(&ca, &control.ca_pem)?;
    Ok(vec![
        "--kube-api-server".into(),
        control.server.clone(),
        "--kube-token-file".into(),
        token.display().to_string(),
        "--kube-ca-file".into(),
        ca.display().to_string(),
    ])
}

/// Starts `control`, `a` and `b` in parallel: the clusters [`World::assemble`] expects.
pub async fn start_clusters() -> Result<[Cluster; 3]> {
    let clusters = start_many(&["control", "a", "b"]).await?;
    let count = clusters.len();
    clusters
        .try_into()
        .map_err(|_| anyhow::anyhow!("start_many returned {count} clusters, want 3"))
}
