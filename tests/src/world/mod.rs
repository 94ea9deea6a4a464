//! The World: the whole system on this machine, nothing mocked, as the end-to-end tests, the
//! demo, the verdict benchmark and chaos need it.
//!
//! Three real clusters: `control` (the real Argo Rollouts controller with our plugin registered
//! through `argo-rollouts-config`, the Kargo project namespace and a Freight that owns the
//! AnalysisRuns), and the destinations `a` (`cluster-a`) and `b` (`cluster-b`). What differs is
//! how `rollouts-dispatch` runs, the `D` of [`World<D>`]:
//!
//! * [`Direct`] ([`World::start`]): one `rollouts-dispatch serve` in this process, with both
//!   destinations in its config (their kubeconfigs), policy `kargo-demo → cluster-*`, and
//!   `control` as its `controlPlane`, so every request is confirmed against the real
//!   controller's AnalysisRuns (`confirmRuns`). [`World::start_with`] adds `argocd:`
//!   ([`DirectOptions`]): the Argo CD cluster Secrets on `control` become destinations too, and
//!   `destination: stage` resolves through the Stages and Applications there.
//! * [`agents::Agents`] ([`World::start_with_agent`]): two server replicas (real processes) on
//!   the Kubernetes store behind a TCP front; `a` direct, `b` reachable only through its agent.
//!
//! Either way the API is TLS only ([`crate::tls`]): the plugin trusts the test CA through
//! `--ca-file`, and nothing runs with `--insecure-plaintext`.

pub mod agents;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_api::client::{ClientConfig, ServerClient};
use kube::api::{Api, DynamicObject, PostParams};

use crate::analysis::{self, wait_finished};
use crate::artifacts::{plugin_binary, PLUGIN_NAME};
use crate::block::RULE_ALLOWS;
use crate::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use crate::cluster::argocd;
use crate::cluster::process::tail;
use crate::cluster::{start_many, Cluster};
use crate::kargo::{Freight, Verification, PROJECT, TENANT_B};
use crate::ports::free_port;
use crate::server::Server;
use crate::tls::ApiTls;

/// The signing key of the plugin's token (HS256).
const DIRECT_KEY: &str = "e2e-signing-key-0123456789abcdef0123456789";

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

/// [`World`]'s dispatch side when the server reaches every destination itself.
pub struct Direct {
    /// The in-process server.
    pub server: Server,
    /// Its files: config, signing key, the plugin's token.
    pub dir: PathBuf,
    /// The API's CA, certificate and key.
    pub tls: ApiTls,
}

/// What a [`Direct`] scene's server configuration adds to the two configured destinations.
#[derive(Debug, Clone, Copy, Default)]
pub struct DirectOptions {
    /// `argocd: {namespace: argocd, inCluster: false}`: the Argo CD cluster Secrets in
    /// `control`'s `argocd` namespace become destinations (watched live; name them
    /// `cluster-*` for the policy to allow them), and `destination: stage` reads the Stages and
    /// Applications on `control`. No `in-cluster` destination: the scene's runs never land on
    /// the control plane.
    pub argocd: bool,
}

impl World<Direct> {
    /// Starts the scene with one in-process server that reaches both destinations directly.
    pub async fn start() -> Result<Self> {
        Self::start_with(DirectOptions::default()).await
    }

    /// [`Self::start`], the server configured with `options` as well.
    pub async fn start_with(options: DirectOptions) -> Result<Self> {
        let [control, a, b] = start_clusters().await?;
        let dir = control.dir.join("dispatch");
        std::fs::create_dir_all(&dir)?;
        let key = dir.join("jwt.key");
        std::fs::write(&key, DIRECT_KEY)?;
        let config = dir.join("server.yaml");
        let argocd = if options.argocd {
            format!(
                "argocd: {{namespace: {}, inCluster: false}}\n",
                argocd::NAMESPACE
            )
        } else {
            String::new()
        };
        std::fs::write(
            &config,
            format!(
                "controlPlane: {{kubeconfig: {}}}\n{argocd}\
                 destinations:\n\
                 - name: cluster-a\n  kubeconfig: {}\n  labels: {{env: e2e}}\n\
                 - name: cluster-b\n  kubeconfig: {}\n  labels: {{env: e2e}}\n\
                 policy:\n  rules:\n  - projects: [\"{PROJECT}\", \"{TENANT_B}\"]\n    destinations: [\"cluster-*\"]\n    {RULE_ALLOWS}\n",
                control.kubeconfig.display(),
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
        let tls = ApiTls::write(&dir)?;
        let (port, admin) = (free_port()?, free_port()?);
        let [tls_cert, tls_key] = tls.serve_flags();
        let server = Server::start([
            "--config".into(),
            config.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin}"),
            "--jwt-key-file".into(),
            key.display().to_string(),
            "--sync-timeout".into(),
            "30s".into(),
            // The sweep removes Jobs still running under a completed run. Argo Rollouts v1.9 and
            // older complete a run terminated between two resumes without calling Terminate
            // (analysis/analysis.go:189 in v1.9.1 skips a measurement whose resumeAt is ahead;
            // v1.10 added `!terminating &&`), so on those versions the sweep is what deletes an
            // aborted Job: every 15 s here instead of 5 m, so `make e2e` sees it on both.
            "--sweep-orphans-every".into(),
            "15s".into(),
            tls_cert,
            tls_key,
        ])
        .await?;
        let url = format!("https://127.0.0.1:{port}");
        let plugin_args = [
            "--server",
            &url,
            "--token-file",
            &token_file.display().to_string(),
            "--ca-file",
            &tls.ca.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        Self::assemble(
            [control, a, b],
            url,
            plugin_args,
            Direct { server, dir, tls },
        )
        .await
    }

    /// A client of the server's `/v1` API with the plugin's token and the API's CA.
    pub fn api_client(&self) -> Result<ServerClient> {
        Ok(ServerClient::new(&ClientConfig {
            server: self.url.clone(),
            token_file: Some(self.dispatch.dir.join("plugin.token")),
            ca_file: Some(self.dispatch.tls.ca.clone()),
            ca_only: true,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?)
    }
}

impl<D> World<D> {
    /// The rest of every scene: the controller with the plugin (started with `plugin_args`),
    /// the Kargo project and its Freight.
    async fn assemble(
        [mut control, a, b]: [Cluster; 3],
        url: String,
        plugin_args: Vec<String>,
        dispatch: D,
    ) -> Result<Self> {
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

/// Starts `control`, `a` and `b` in parallel.
async fn start_clusters() -> Result<[Cluster; 3]> {
    let clusters = start_many(&["control", "a", "b"]).await?;
    let count = clusters.len();
    clusters
        .try_into()
        .map_err(|_| anyhow::anyhow!("start_many returned {count} clusters, want 3"))
}
