//! The real Argo CD on a test cluster (issue #29): Redis, `argocd-repo-server` and
//! `argocd-application-controller` v3.2.6 as host processes (as the cluster's own components
//! run), built by `make argocd-bin`, syncing plain-manifest Applications from local Git
//! repositories ([`git::GitRepo`]) that the test commits to and pushes.
//!
//! [`ArgoCd::start`] installs what an Argo CD install applies ([`install`]), then starts, in a
//! process group of its own that dies with the [`ArgoCd`]:
//!
//! * `redis-server` on a random loopback port, its own directory, no persistence;
//! * the repo-server on a random loopback port without TLS (`--disable-tls`), GnuPG off
//!   (`ARGOCD_GPG_ENABLED=false`: no keyring to initialise), its askpass socket and temporary
//!   checkouts in its own directory (`ARGOCD_ASK_PASS_SOCK`, `TMPDIR`), so two instances never
//!   share a path;
//! * the application controller in namespace `argocd` with the cluster's admin kubeconfig and
//!   `ARGOCD_FAKE_IN_CLUSTER=true`, which makes `https://kubernetes.default.svc` mean that
//!   kubeconfig's cluster (argo-cd v3.2.6 pkg/apis/application/v1alpha1/types.go:3629-3640)
//!   instead of the pod's service account, which a host process does not have; it talks to the
//!   repo-server in plain text (`--repo-server-plaintext`).
//!
//! The one departure from an install's defaults: `--app-resync` is [`RESYNC`] (Argo CD's
//! default is 120 s plus up to 60 s of jitter, `timeout.reconciliation` in argocd-cm), so that
//! a test waits seconds, not minutes, for a periodic comparison. Sync operations and refresh
//! requests are acted on at once either way.

pub mod binaries;
pub mod git;
pub mod install;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{DynamicObject, PostParams};
use kube::Client;
use serde_json::{json, Value};

pub use binaries::ArgoCdBinaries;
pub use git::GitRepo;

use super::argocd::{applications, APP_STAGE, AUTHORIZED_STAGE, NAMESPACE};
use super::process::{tail, ProcessGroup};
use super::{Cluster, KEEP_ENV};
use crate::ports::free_port;
use crate::wait::eventually;

/// The controller's periodic comparison (`--app-resync`, seconds), without jitter.
pub const RESYNC: Duration = Duration::from_secs(10);
/// How long each component may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Log (process) names.
pub const REDIS: &str = "argocd-redis";
/// …
pub const REPO_SERVER: &str = "argocd-repo-server";
/// …
pub const CONTROLLER: &str = "argocd-application-controller";

/// How [`ArgoCd::start_with`] runs the controller, beyond an install's defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct ArgoCdOptions {
    /// `--persist-resource-health` (`controller.resource.health.persist` in
    /// argocd-cmd-params-cm): write each resource's health into the Application's
    /// `status.resources`, as Argo CD 2.x did. Off by default since 3.0 (argo-cd v3.2.6
    /// docs/operator-manual/upgrading/2.14-3.0.md:336-345; controller/health.go:61-66): the
    /// health then lives in Redis only, and `status.resourceHealthSource` is `appTree`.
    pub persist_resource_health: bool,
}

/// A running Argo CD; see the module docs. Dropping it kills its processes and removes its
/// directory (kept when the thread panics or `ROLLOUTS_DISPATCH_KEEP_CLUSTERS` is set).
pub struct ArgoCd {
    /// `<cluster dir>/argocd`: logs, Redis, the repo-server's files, the Git repositories.
    pub dir: PathBuf,
    /// What it runs.
    pub binaries: ArgoCdBinaries,
    group: ProcessGroup,
}

impl ArgoCd {
    /// Installs and starts Argo CD on `cluster` with an install's defaults; returns once each
    /// component is up.
    pub async fn start(cluster: &Cluster) -> Result<Self> {
        Self::start_with(cluster, ArgoCdOptions::default()).await
    }

    /// [`ArgoCd::start`] with `options`.
    pub async fn start_with(cluster: &Cluster, options: ArgoCdOptions) -> Result<Self> {
        let binaries = ArgoCdBinaries::locate()?;
        let dir = cluster.dir().join("argocd");
        for sub in ["redis", "repo-server/tmp", "controller", "git", "home"] {
            std::fs::create_dir_all(dir.join(sub))?;
        }
        let client = cluster.client().await?;
        install::install(&client, &binaries.manifests).await?;
        let mut me = Self {
            group: ProcessGroup::new(&dir.join("logs"))?,
            dir,
            binaries,
        };
        let redis = me.start_redis().await?;
        let repo_server = me.start_repo_server(redis).await?;
        me.start_controller(cluster, redis, repo_server, options)
            .await?;
        Ok(me)
    }

    async fn start_redis(&mut self) -> Result<u16> {
        let port = free_port()?;
        let mut cmd = Command::new(&self.binaries.redis_server);
        cmd.current_dir(self.dir.join("redis")).args([
            "--bind",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ]);
        self.group.spawn(REDIS, cmd)?;
        self.wait_up(REDIS, || answers(port, b"PING\r\n", "+PONG"))
            .await?;
        Ok(port)
    }

    async fn start_repo_server(&mut self, redis: u16) -> Result<u16> {
        let (port, metrics) = (free_port()?, free_port()?);
        let home = self.dir.join("repo-server");
        let mut cmd = Command::new(&self.binaries.repo_server);
        cmd.current_dir(&home)
            .env("HOME", self.dir.join("home"))
            .env("TMPDIR", home.join("tmp"))
            .env("ARGOCD_ASK_PASS_SOCK", home.join("askpass.sock"))
            .env("ARGOCD_GPG_ENABLED", "false")
            .args(["--address", "127.0.0.1", "--port", &port.to_string()])
            .args(["--metrics-address", "127.0.0.1"])
            .args(["--metrics-port", &metrics.to_string()])
            .args(["--redis", &format!("127.0.0.1:{redis}")])
            .args([
                "--disable-tls",
                "--logformat",
                "text",
                "--loglevel",
                "debug",
            ]);
        self.group.spawn(REPO_SERVER, cmd)?;
        self.wait_up(REPO_SERVER, || answers(metrics, HEALTHZ, " 200"))
            .await?;
        Ok(port)
    }

    async fn start_controller(
        &mut self,
        cluster: &Cluster,
        redis: u16,
        repo: u16,
        options: ArgoCdOptions,
    ) -> Result<()> {
        let metrics = free_port()?;
        let mut cmd = Command::new(&self.binaries.application_controller);
        cmd.current_dir(self.dir.join("controller"))
            .env("HOME", self.dir.join("home"))
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env("ARGOCD_FAKE_IN_CLUSTER", "true")
            .args(["--kubeconfig", &cluster.kubeconfig.display().to_string()])
            .args(["--namespace", NAMESPACE])
            .args(["--repo-server", &format!("127.0.0.1:{repo}")])
            .arg("--repo-server-plaintext")
            .args(["--redis", &format!("127.0.0.1:{redis}")])
            .args(["--metrics-port", &metrics.to_string()])
            .args(["--app-resync", &RESYNC.as_secs().to_string()])
            .args(["--app-resync-jitter", "0"])
            .args(["--logformat", "text", "--loglevel", "debug"]);
        if options.persist_resource_health {
            cmd.arg("--persist-resource-health");
        }
        self.group.spawn(CONTROLLER, cmd)?;
        self.wait_up(CONTROLLER, || answers(metrics, HEALTHZ, " 200"))
            .await
    }

    /// Waits until `up` holds, failing early (with the log's tail) if a component exits.
    async fn wait_up(&mut self, name: &str, up: impl Fn() -> bool) -> Result<()> {
        let group = &mut self.group;
        let log = group.log_path(name);
        eventually(&format!("{name} up"), START_TIMEOUT, || {
            let alive = group.check_alive().map(|()| up());
            async move { alive }
        })
        .await
        .with_context(|| format!("{} tail:\n{}", log.display(), tail(&log, 30)))
    }

    /// A new Git repository `name` for one Application.
    pub fn repo(&self, name: &str) -> Result<GitRepo> {
        GitRepo::create(&self.binaries.git, &self.dir.join("git"), name)
    }

    /// The log of component `name` ([`CONTROLLER`], [`REPO_SERVER`], [`REDIS`]).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.group.log_path(name)
    }

    /// The last `lines` lines of the controller's and the repo-server's logs.
    pub fn log_tail(&self, lines: usize) -> String {
        [CONTROLLER, REPO_SERVER]
            .map(|name| format!("{name}:\n{}", tail(&self.log_path(name), lines)))
            .join("\n")
    }

    /// The version the controller reports at its start (`version=` of its "is starting" line,
    /// common/version.go:47), e.g. `v3.2.6+unknown` (the module zip carries no commit).
    pub fn version(&self) -> Result<String> {
        let log = std::fs::read_to_string(self.log_path(CONTROLLER))?;
        log.lines()
            .filter(|l| l.contains("is starting"))
            .find_map(|l| {
                l.split_whitespace()
                    .find_map(|field| field.strip_prefix("version="))
            })
            .map(|v| v.trim_matches('"').to_string())
            .context("no `is starting` line with a version in the controller's log")
    }

    /// Fails if a component has exited, quoting its log.
    pub fn check_alive(&mut self) -> Result<()> {
        self.group.check_alive()
    }
}

impl Drop for ArgoCd {
    fn drop(&mut self) {
        self.group.shutdown();
        if !std::thread::panicking() && std::env::var_os(KEEP_ENV).is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Argo CD's name of the cluster it runs on (`KubernetesInternalAPIServerAddr`, argo-cd v3.2.6
/// pkg/apis/application/v1alpha1/application_defaults.go:28), made the harness's kubeconfig by
/// `ARGOCD_FAKE_IN_CLUSTER`.
pub const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// What an Application of the tests is: its Git source and where it deploys.
#[derive(Debug, Clone)]
pub struct AppSpec<'a> {
    /// The Application's name (in [`NAMESPACE`]).
    pub name: &'a str,
    /// `source.repoURL` ([`GitRepo::url`]).
    pub repo_url: String,
    /// `source.path`: the directory of plain manifests.
    pub path: &'a str,
    /// `destination.server`: [`IN_CLUSTER`] (the cluster Argo CD runs on) or the URL of a
    /// cluster one of its cluster Secrets names.
    pub server: &'a str,
    /// `destination.namespace`.
    pub namespace: &'a str,
    /// `syncOptions: [CreateNamespace=true]`: the sync creates [`Self::namespace`]; otherwise
    /// it must exist.
    pub create_namespace: bool,
    /// `syncPolicy.automated`: Argo CD syncs every new commit by itself; otherwise only an
    /// operation (the sync trigger) does.
    pub automated: bool,
}

/// Creates the Application `spec` describes, authorized for [`APP_STAGE`] of the project as
/// Kargo's annotation says, tracking [`git::BRANCH`]. Argo CD writes its `status`.
pub async fn create_application(client: &Client, spec: &AppSpec<'_>) -> Result<DynamicObject> {
    let authorized = format!("{}:{APP_STAGE}", crate::kargo::PROJECT);
    let mut sync_policy = json!({});
    if spec.create_namespace {
        sync_policy["syncOptions"] = json!(["CreateNamespace=true"]);
    }
    if spec.automated {
        sync_policy["automated"] = json!({});
    }
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": spec.name, "namespace": NAMESPACE,
                     "annotations": {AUTHORIZED_STAGE: authorized}},
        "spec": {
            "project": "default",
            "source": {"repoURL": spec.repo_url, "path": spec.path,
                       "targetRevision": git::BRANCH},
            "destination": {"server": spec.server, "namespace": spec.namespace},
            "syncPolicy": sync_policy
        }
    }))?;
    applications(client)
        .create(&PostParams::default(), &app)
        .await
        .with_context(|| format!("creating Application {NAMESPACE}/{}", spec.name))
}

/// Whether Application `app` (as JSON) is Synced at `sha` and Healthy, as Argo CD writes it.
pub fn synced_healthy_at(app: &Value, sha: &str) -> bool {
    text(app, "/status/sync/status") == "Synced"
        && text(app, "/status/sync/revision") == sha
        && text(app, "/status/health/status") == "Healthy"
}

/// The text of `pointer` in `v` (empty when absent).
pub fn text(v: &Value, pointer: &str) -> String {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";

/// Whether a loopback `port` answers `request` with a first line containing `want`.
fn answers(port: u16, request: &[u8], want: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(request).is_err() {
        return false;
    }
    let mut answer = [0u8; 256];
    let n = stream.read(&mut answer).unwrap_or(0);
    String::from_utf8_lossy(&answer[..n])
        .lines()
        .next()
        .is_some_and(|line| line.contains(want))
}
