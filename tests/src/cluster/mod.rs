//! Real, isolated Kubernetes control planes for tests, on loopback ports.
//!
//! [`Cluster::start`] runs etcd, kube-apiserver (RBAC, service-account token signing, a
//! bearer-token admin in `system:masters`), kube-controller-manager (the real Job controller and
//! friends), kube-scheduler and kwok (one fake node and a pod lifecycle the test controls, see
//! [`kwok`]; it also serves the kubelet API, so `pods/log` returns files a test names, see
//! [`pod_logs`]) from the binaries that `make k8s-bin` builds, writes a kubeconfig and waits until
//! `/readyz` is ok (only then are the controller-manager, scheduler and kwok started), the `default` ServiceAccount exists and the fake node is Ready. All state is
//! in one temporary directory; every process is in one process group that dies with the
//! [`Cluster`] (see [`process`]). [`start_many`] starts several clusters in parallel.
//! [`argo::ArgoRollouts`] runs the real Argo Rollouts controller on a cluster; [`rollout`] an
//! application it deploys (a canary Rollout with a background analysis) on a destination;
//! [`argocd`] Argo CD's Application CRD and a stand-in for its controller; [`argocd_real`] the
//! real Argo CD (application controller, repo-server, Redis) and Git repositories it syncs from.

pub mod argo;
pub mod argocd;
pub mod argocd_real;
pub mod audit;
pub mod binaries;
mod kubelet_shim;
pub mod kwok;
pub mod node;
pub(crate) mod pki;
pub mod pod_logs;
pub mod process;
pub mod rollout;
pub mod throttle;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use rand::distr::{Alphanumeric, SampleString};

use crate::ports;
use crate::wait::{eventually, Progress};

pub use binaries::Binaries;
pub use process::ProcessGroup;

/// How long [`Cluster::start`] waits for readiness by default.
pub const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Set to keep cluster directories (logs, kubeconfig, etcd data) after the cluster is dropped.
pub const KEEP_ENV: &str = "ROLLOUTS_DISPATCH_KEEP_CLUSTERS";

/// Options of [`Cluster::start_with`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Cluster name: the kubeconfig context and cluster name, and part of the directory name.
    pub name: String,
    /// Parent of the cluster directory (default: `$TMPDIR/rollouts-dispatch-clusters`).
    pub base_dir: Option<PathBuf>,
    /// Keep the cluster directory after drop (default: `$ROLLOUTS_DISPATCH_KEEP_CLUSTERS` is set,
    /// or the thread is panicking, so that logs survive a failed test).
    pub keep_dir: bool,
    /// How long to wait for readiness.
    pub ready_timeout: Duration,
    /// Run a real node ([`node::RealNode`]: containerd, kubelet, kube-proxy, CoreDNS) instead of
    /// kwok's fake one, and enforce the `restricted` Pod Security level by default.
    pub real_node: bool,
    /// The API server keeps an audit log of writes ([`audit`]: who wrote what, by client).
    pub audit_writes: bool,
    /// The controller-manager and the scheduler talk to the API server without client-side
    /// throttling (their defaults are 20 and 50 requests a second), as kwokctl's
    /// `--disable-qps-limits` runs them: a bench of thousands of Jobs measures our side and the
    /// Rollouts controller, not the Job controller's rate limiter.
    pub unthrottled: bool,
}

impl ClusterOptions {
    /// Defaults for a cluster called `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            base_dir: None,
            keep_dir: std::env::var_os(KEEP_ENV).is_some(),
            ready_timeout: DEFAULT_READY_TIMEOUT,
            real_node: false,
            audit_writes: false,
            unthrottled: false,
        }
    }
}

/// Loopback ports of one cluster.
#[derive(Debug, Clone, Copy)]
pub struct ClusterPorts {
    /// etcd client port.
    pub etcd_client: u16,
    /// etcd peer port.
    pub etcd_peer: u16,
    /// kube-apiserver secure port (the cluster's server URL).
    pub apiserver: u16,
    /// kube-controller-manager secure (health) port.
    pub controller_manager: u16,
    /// kube-scheduler secure (health) port.
    pub scheduler: u16,
    /// The fake node's kubelet endpoint (HTTPS on 127.0.0.1): a shim in front of kwok's kubelet
    /// API that ends followed logs when the container ends (see `kubelet_shim.rs`).
    pub kubelet: u16,
    /// kwok's kubelet API, which serves `pods/log` from the files that `Logs` objects name
    /// ([`pod_logs::LogFile`]).
    pub kwok: u16,
}

/// A running test cluster. Dropping it kills every process and removes its directory.
#[derive(Debug)]
pub struct Cluster {
    /// Cluster name (kubeconfig context).
    pub name: String,
    /// Directory with all state: `kubeconfig`, `pki/`, `etcd/`, `logs/`.
    pub dir: PathBuf,
    /// Admin kubeconfig (bearer token, CA file).
    pub kubeconfig: PathBuf,
    /// API server URL, `https://127.0.0.1:<port>`.
    pub server: String,
    /// Admin bearer token (user `admin`, group `system:masters`).
    pub token: String,
    /// CA certificate (PEM) that signed the API server's serving certificate.
    pub ca_pem: String,
    /// Path of the CA certificate.
    pub ca_file: PathBuf,
    /// Ports in use.
    pub ports: ClusterPorts,
    /// Wall time from the first process spawn until ready.
    pub start_time: Duration,
    /// The binaries this cluster runs (and that add-ons such as Argo Rollouts use).
    pub binaries: Binaries,
    processes: ProcessGroup,
    keep_dir: bool,
    /// the kube-apiserver's arguments, to start it again after a kill
    apiserver_args: Vec<String>,
    /// The real node, when [`ClusterOptions::real_node`] asked for one.
    pub node: Option<node::RealNode>,
    /// The components started once the API server answers `/readyz` (`wait_ready`):
    /// kube-controller-manager exits at once when it cannot read its authentication ConfigMap,
    /// which on a loaded machine happens before the API server listens.
    deferred: Vec<(&'static str, Command)>,
}

/// Name of the fake node that kwok manages in every cluster.
pub const FAKE_NODE: &str = kwok::NODE_NAME;

impl Cluster {
    /// Starts a cluster called `name` with default options.
    pub async fn start(name: &str) -> Result<Self> {
        Self::start_with(ClusterOptions::new(name)).await
    }

    /// Starts a cluster and waits until it is ready. A failed start is retried once with fresh
    /// ports (a port can be taken by another process between the check and the bind).
    pub async fn start_with(options: ClusterOptions) -> Result<Self> {
        let binaries = Binaries::locate()?;
        match Self::start_once(&options, binaries.clone()).await {
            Ok(cluster) => Ok(cluster),
            Err(first) => {
                eprintln!(
                    "cluster {}: start failed, retrying once: {first:#}",
                    options.name
                );
                Self::start_once(&options, binaries).await
            }
        }
    }

    async fn start_once(options: &ClusterOptions, binaries: Binaries) -> Result<Self> {
        let started = Instant::now();
        let mut cluster = Self::spawn(options, binaries)
            .with_context(|| format!("starting cluster {}", options.name))?;
        if let Err(err) = cluster.wait_ready(options.ready_timeout).await {
            // Keep the directory: the error points at its logs.
            cluster.keep_dir = true;
            return Err(err.context(format!(
                "cluster {} not ready (logs in {})",
                options.name,
                cluster.dir.join("logs").display()
            )));
        }
        cluster.start_time = started.elapsed();
        Ok(cluster)
    }

    fn spawn(options: &ClusterOptions, binaries: Binaries) -> Result<Self> {
        let name = &options.name;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            bail!("cluster name {name:?} must be non-empty ASCII alphanumerics and '-'");
        }
        let base = options
            .base_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("rollouts-dispatch-clusters"));
        std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
        remove_stale_dirs(&base);
        let suffix = Alphanumeric
            .sample_string(&mut rand::rng(), 6)
            .to_lowercase();
        let dir = base.join(format!("{name}-{}-{suffix}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

        let node = if options.real_node {
            Some(node::RealNode::prepare(&dir, &base)?)
        } else {
            None
        };
        let pki = pki::write(&dir.join("pki"), name)?;
        let token = Alphanumeric.sample_string(&mut rand::rng(), 32);
        let token_file = dir.join("pki").join("tokens.csv");
        let node_tokens = node.as_ref().map(node::RealNode::token_lines);
        std::fs::write(
            &token_file,
            format!(
                "{token},admin,admin,system:masters\n{}",
                node_tokens.unwrap_or_default()
            ),
        )
        .with_context(|| format!("writing {}", token_file.display()))?;

        let p = ports::allocate(7)?;
        let ports = ClusterPorts {
            etcd_client: p[0],
            etcd_peer: p[1],
            apiserver: p[2],
            controller_manager: p[3],
            scheduler: p[4],
            kubelet: node.as_ref().map_or(p[5], |n| n.ports.kubelet),
            kwok: p[6],
        };
        let server = format!("https://127.0.0.1:{}", ports.apiserver);
        let kubeconfig = dir.join("kubeconfig");
        write_kubeconfig(&kubeconfig, name, &server, &pki.ca_cert, &token)?;
        let kwok_config = dir.join("kwok.yaml");
        std::fs::write(&kwok_config, kwok::STAGES_YAML)
            .with_context(|| format!("writing {}", kwok_config.display()))?;

        let mut processes = ProcessGroup::new(&dir.join("logs"))?;
        let etcd_client = format!("http://127.0.0.1:{}", ports.etcd_client);
        let etcd_peer = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let mut etcd = Command::new(&binaries.etcd);
        etcd.args([
            format!("--name={name}"),
            format!("--data-dir={}", dir.join("etcd").display()),
            format!("--listen-client-urls={etcd_client}"),
            format!("--advertise-client-urls={etcd_client}"),
            format!("--listen-peer-urls={etcd_peer}"),
            format!("--initial-advertise-peer-urls={etcd_peer}"),
            format!("--initial-cluster={name}={etcd_peer}"),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ]);
        processes.spawn("etcd", etcd)?;

        let mut apiserver_args: Vec<String> = vec![
            format!("--etcd-servers={etcd_client}"),
            format!("--secure-port={}", ports.apiserver),
            format!("--cert-dir={}", dir.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", pki.server_cert.display()),
            format!("--tls-private-key-file={}", pki.server_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            format!("--token-auth-file={}", token_file.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", pki.sa_pub.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // No node-lifecycle controller runs to lift the not-ready taint from the fake node.
            "--disable-admission-plugins=TaintNodesByCondition".into(),
            "--enable-priority-and-fairness=false".into(),
            "--profiling=false".into(),
            // pods/log dials the node's kubelet: kwok's server at the node's InternalIP
            // (127.0.0.1) and status.daemonEndpoints.kubeletEndpoint.Port. The default order
            // starts with Hostname (kwok-node-0, which resolves nowhere). With no
            // --kubelet-certificate-authority the apiserver does not verify kwok's self-signed
            // certificate (kubernetes v1.37.2 pkg/kubelet/client/kubelet_client.go:126-128).
            "--kubelet-preferred-address-types=InternalIP".into(),
        ];
        if node.is_some() {
            // Pods reach the API server through the `kubernetes` Service, whose endpoint is the
            // advertised address: the node's, on the pods' bridge.
            apiserver_args.extend([
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={}", node::NODE_IP),
                // As a real cluster: privileged pods exist (and Pod Security refuses them where
                // its level says so), rather than the API server refusing every one.
                "--allow-privileged=true".into(),
                format!(
                    "--admission-control-config-file={}",
                    write_pod_security(&dir)?.display()
                ),
            ]);
        } else {
            apiserver_args.extend([
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                // 127.0.0.1 is not a valid endpoint of the `kubernetes` Service.
                "--endpoint-reconciler-type=none".into(),
            ]);
        }
        if options.audit_writes {
            apiserver_args.extend(audit::apiserver_args(&dir)?);
        }
        let mut apiserver = Command::new(&binaries.kube_apiserver);
        apiserver.args(&apiserver_args);
        processes.spawn("kube-apiserver", apiserver)?;
        let unthrottled: &[&str] = if options.unthrottled {
            &["--kube-api-qps=5000", "--kube-api-burst=10000"]
        } else {
            &[]
        };

        let kc = kubeconfig.display().to_string();
        let mut controller_manager = Command::new(&binaries.kube_controller_manager);
        controller_manager.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.controller_manager),
            format!("--cert-dir={}", dir.join("kcm-certs").display()),
            format!("--controllers={}", controllers(node.is_some()).join(",")),
            format!(
                "--service-account-private-key-file={}",
                pki.sa_key.display()
            ),
            format!("--root-ca-file={}", pki.ca_cert.display()),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=false".into(),
            "--profiling=false".into(),
        ]);
        controller_manager.args(unthrottled);
        let mut deferred = vec![("kube-controller-manager", controller_manager)];

        let mut scheduler = Command::new(&binaries.kube_scheduler);
        scheduler.args([
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", ports.scheduler),
            format!("--cert-dir={}", dir.join("scheduler-certs").display()),
            "--leader-elect=false".into(),
            "--profiling=false".into(),
        ]);
        scheduler.args(unthrottled);
        deferred.push(("kube-scheduler", scheduler));

        let mut kwok = Command::new(&binaries.kwok);
        kwok.args([
            format!("--kubeconfig={kc}"),
            format!("--config={}", kwok_config.display()),
            "--manage-all-nodes=false".into(),
            format!(
                "--manage-nodes-with-annotation-selector={}={}",
                kwok::NODE_ANNOTATION,
                kwok::NODE_ANNOTATION_VALUE
            ),
            "--cidr=10.244.0.0/16".into(),
            // kwok v0.8.0 serves the kubelet API itself: --server-address is where
            // (pkg/kwok/cmd/root.go:98; its container routes, /containerLogs among them, in
            // pkg/kwok/server/debugging.go:97-100), and the node stage writes --node-ip as the
            // InternalIP and --node-port as the kubelet port, where our kubelet_shim listens in
            // front of kwok (root.go:83,85; NodeIP/NodePort in
            // pkg/kwok/controllers/node_controller.go:147-149, used by kwok-stages.yaml). The
            // Logs and ClusterLogs kinds come from CRDs applied once the apiserver is up
            // (root.go:100; watched by pkg/kwok/server/server.go:157), not from --config, so a
            // test adds them while the cluster runs.
            "--node-ip=127.0.0.1".into(),
            format!("--node-port={}", ports.kubelet),
            format!("--server-address=127.0.0.1:{}", ports.kwok),
            "--enable-crds=Logs,ClusterLogs".into(),
        ]);
        if node.is_none() {
            deferred.push(("kwok", kwok));
        }

        Ok(Self {
            name: name.clone(),
            kubeconfig,
            server,
            token,
            ca_file: pki.ca_cert.clone(),
            ca_pem: pki.ca_pem,
            ports,
            start_time: Duration::ZERO,
            binaries,
            processes,
            keep_dir: options.keep_dir,
            dir,
            apiserver_args,
            node,
            deferred,
        })
    }

    /// Kills the kube-apiserver (SIGKILL), keeps it down for `down`, starts it again with the
    /// same arguments (etcd keeps the state) and waits until it answers `/readyz`: a destination
    /// that goes away mid-Job.
    pub async fn restart_apiserver(&mut self, down: Duration) -> Result<()> {
        self.stop_apiserver()?;
        tokio::time::sleep(down).await;
        self.start_apiserver().await
    }

    /// Kills the kube-apiserver (SIGKILL): the cluster's API is unreachable until
    /// [`Cluster::start_apiserver`]; the rest (etcd, controllers, kwok) keeps running.
    pub fn stop_apiserver(&mut self) -> Result<()> {
        self.processes.kill("kube-apiserver")
    }

    /// Starts the kube-apiserver again with its arguments after [`Cluster::stop_apiserver`];
    /// waits until it answers `/readyz`.
    pub async fn start_apiserver(&mut self) -> Result<()> {
        let mut apiserver = Command::new(&self.binaries.kube_apiserver);
        apiserver.args(&self.apiserver_args);
        self.processes.spawn("kube-apiserver", apiserver)?;
        let client = self.client().await?;
        self.wait_apiserver(&client, Duration::from_secs(60))
            .await
            .with_context(|| format!("restarting the kube-apiserver of {}", self.name))
    }

    /// Waits up to `timeout` until the API server answers `/readyz` with "ok".
    async fn wait_apiserver(&mut self, client: &Client, timeout: Duration) -> Result<()> {
        // Plain closures whose futures own their data: `start_many` spawns cluster starts, so
        // these futures must be `Send` for every lifetime, which borrowing async closures are not.
        let processes = &mut self.processes;
        eventually("kube-apiserver /readyz ok", timeout, || {
            let alive = processes.check_alive();
            let client = client.clone();
            async move {
                alive?;
                let request = http::Request::get("/readyz").body(Vec::new())?;
                Ok(match client.request_text(request).await {
                    Ok(body) if body.trim() == "ok" => Progress::Done(()),
                    Ok(body) => Progress::Waiting(body),
                    Err(err) => Progress::Waiting(err.to_string()),
                })
            }
        })
        .await
    }

    async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let client = self.client().await?;
        // 1. The API server answers /readyz with "ok"; then the components that need it start.
        self.wait_apiserver(&client, timeout).await?;
        for (name, command) in std::mem::take(&mut self.deferred) {
            self.processes.spawn(name, command)?;
        }
        // 2. The fake node exists (kwok then makes it Ready), and kwok's Logs CRDs; or the
        // real node's components start (its kubelet registers the node).
        let node_name = if let Some(node) = self.node.as_mut() {
            node.start(
                &mut self.processes,
                &self.server,
                &self.ca_file,
                &self.kubeconfig,
            )
            .await?;
            node::NODE_NAME
        } else {
            kwok::create_node(&client).await?;
            argo::apply_crds(&client, &self.binaries.kwok_crds).await?;
            kubelet_shim::start(client.clone(), self.ports.kubelet, self.ports.kwok).await?;
            FAKE_NODE
        };
        // 3. The ServiceAccount controller made `default/default`, and the node is Ready.
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let nodes: Api<Node> = Api::all(client);
        let processes = &mut self.processes;
        let left = deadline.saturating_duration_since(Instant::now());
        eventually("default serviceaccount and a Ready node", left, || {
            let alive = processes.check_alive();
            let (accounts, nodes) = (accounts.clone(), nodes.clone());
            async move {
                alive?;
                let sa = accounts
                    .get_opt("default")
                    .await
                    .context("getting serviceaccount default/default")?;
                let node = nodes
                    .get_opt(node_name)
                    .await
                    .with_context(|| format!("getting node {node_name}"))?;
                let node_ready = node.as_ref().is_some_and(kwok::node_is_ready);
                Ok(if sa.is_some() && node_ready {
                    Progress::Done(())
                } else {
                    Progress::Waiting(format!(
                        "default serviceaccount {}, node {node_name} {}",
                        if sa.is_some() { "exists" } else { "missing" },
                        if node_ready { "Ready" } else { "not Ready" }
                    ))
                })
            }
        })
        .await
    }

    /// A `kube` client for the admin user, built from the cluster's kubeconfig file.
    pub async fn client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading {}", self.kubeconfig.display()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading {}", self.kubeconfig.display()))?;
        Client::try_from(config).context("building the kube client")
    }

    /// Spawns an extra process (e.g. a controller) into the cluster's process group; it dies
    /// with the cluster. Its output goes to [`Cluster::log_path`]`(name)`.
    pub fn spawn_process(&mut self, name: &str, cmd: Command) -> Result<()> {
        self.processes.spawn(name, cmd)
    }

    /// Stops one component as Kubernetes stops a Pod: SIGTERM, SIGKILL after `grace`.
    pub fn terminate_process(&mut self, name: &str, grace: Duration) -> Result<()> {
        self.processes.terminate(name, grace)
    }

    /// Kills one component (e.g. the Argo Rollouts controller) with SIGKILL.
    pub fn kill_process(&mut self, name: &str) -> Result<()> {
        self.processes.kill(name)
    }

    /// The PID of process `name` (one started with [`Cluster::spawn_process`]), if it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.processes.pid(name)
    }

    /// Freezes (`true`: SIGSTOP) or thaws (`false`: SIGCONT) one component.
    pub fn pause_process(&mut self, name: &str, paused: bool) -> Result<()> {
        let signal = if paused {
            nix::sys::signal::Signal::SIGSTOP
        } else {
            nix::sys::signal::Signal::SIGCONT
        };
        self.processes.signal(name, signal)
    }

    /// Fails if any process of the cluster has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.processes.check_alive()
    }

    /// Path of the combined stdout/stderr log of process `name` (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`, `kube-scheduler`, `kwok`, `rollouts-controller`, ...).
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.processes.log_path(name)
    }

    /// The id of the process group that holds every process of the cluster (its watchdog's
    /// pid): what `make demo-down` ends when the process that kept the cluster up is gone.
    pub fn process_group(&self) -> i32 {
        self.processes.pgid()
    }

    /// Directory with the cluster's state.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills every process now (also done on drop).
    pub fn stop(&mut self) {
        if let Some(node) = self.node.as_mut() {
            node.teardown(&mut self.processes);
        }
        self.processes.shutdown();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some(node) = self.node.as_mut() {
            node.teardown(&mut self.processes);
        }
        self.processes.shutdown();
        if self.keep_dir || std::thread::panicking() {
            let _ = std::fs::write(self.dir.join(KEEP_MARKER), b"");
            eprintln!("cluster {}: kept {}", self.name, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The kube-controller-manager controllers the test clusters run.
pub const CONTROLLERS: [&str; 12] = [
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "replicaset-controller",
    "deployment-controller",
];

/// The controllers of a cluster: [`CONTROLLERS`], and for a real node the EndpointSlice
/// controllers that kube-proxy and CoreDNS read Services' endpoints from.
fn controllers(real_node: bool) -> Vec<&'static str> {
    let mut all = CONTROLLERS.to_vec();
    if real_node {
        all.extend(["endpointslice-controller", "endpoints-controller"]);
    }
    all
}

/// The API server's admission configuration of a real-node cluster: Pod Security `restricted`
/// enforced (and warned, audited) in every namespace that does not say otherwise, as a cluster
/// set up by a careful platform team does.
fn write_pod_security(dir: &Path) -> Result<PathBuf> {
    let path = dir.join("admission.yaml");
    std::fs::write(
        &path,
        "apiVersion: apiserver.config.k8s.io/v1\n\
         kind: AdmissionConfiguration\n\
         plugins:\n\
         - name: PodSecurity\n  \
           configuration:\n    \
             apiVersion: pod-security.admission.config.k8s.io/v1\n    \
             kind: PodSecurityConfiguration\n    \
             defaults:\n      \
               enforce: restricted\n      \
               enforce-version: latest\n      \
               warn: restricted\n      \
               warn-version: latest\n      \
               audit: restricted\n      \
               audit-version: latest\n    \
             exemptions: {usernames: [], runtimeClasses: [], namespaces: []}\n",
    )
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Starts one cluster per name, in parallel; fails (stopping the others) if any fails.
pub async fn start_many(names: &[&str]) -> Result<Vec<Cluster>> {
    start_many_with(names.iter().map(|n| ClusterOptions::new(n)).collect()).await
}

/// [`start_many`] with each cluster's options.
pub async fn start_many_with(options: Vec<ClusterOptions>) -> Result<Vec<Cluster>> {
    let names: Vec<String> = options.iter().map(|o| o.name.clone()).collect();
    let mut tasks = tokio::task::JoinSet::new();
    for (index, options) in options.into_iter().enumerate() {
        tasks.spawn(async move { (index, Cluster::start_with(options).await) });
    }
    let mut slots: Vec<Option<Cluster>> = names.iter().map(|_| None).collect();
    let mut errors = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((index, Ok(cluster))) => slots[index] = Some(cluster),
            Ok((index, Err(err))) => errors.push(format!("{}: {err:#}", names[index])),
            Err(err) => errors.push(format!("cluster start task failed: {err}")),
        }
    }
    if !errors.is_empty() {
        bail!("starting clusters failed: {}", errors.join("; "));
    }
    Ok(slots.into_iter().flatten().collect())
}

/// Marks a cluster directory that was kept on purpose (see [`remove_stale_dirs`]).
const KEEP_MARKER: &str = ".kept";

/// Removes directories `<name>-<pid>-<suffix>` under `base` whose process is gone and that were
/// not kept on purpose: what a test process killed without unwinding leaves behind (its
/// processes are gone too, see [`process`]).
fn remove_stale_dirs(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(pid) = dir_pid(file_name) else {
            continue;
        };
        if pid != std::process::id()
            && !Path::new(&format!("/proc/{pid}")).exists()
            && !path.join(KEEP_MARKER).exists()
        {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

/// The pid in a cluster directory name `<name>-<pid>-<suffix>`.
fn dir_pid(dir_name: &str) -> Option<u32> {
    dir_name.rsplit('-').nth(1)?.parse().ok()
}

fn write_kubeconfig(path: &Path, name: &str, server: &str, ca: &Path, token: &str) -> Result<()> {
    let text = format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: {name}\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: {name}-admin\n  \
           user:\n    \
             token: {token}\n\
         contexts:\n\
         - name: {name}\n  \
           context:\n    \
             cluster: {name}\n    \
             user: {name}-admin\n    \
             namespace: default\n\
         current-context: {name}\n",
        ca = ca.display()
    );
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_pid_reads_the_second_last_field() {
        assert_eq!(dir_pid("control-plane-1234-abc123"), Some(1234));
        assert_eq!(dir_pid("a-77-zz"), Some(77));
        assert_eq!(dir_pid("a-zz"), None);
        assert_eq!(dir_pid("nodash"), None);
    }

    #[test]
    fn kubeconfig_is_loadable_by_kube() {
        let dir = std::env::temp_dir().join(format!("kubeconfig-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("kubeconfig");
        write_kubeconfig(
            &path,
            "x",
            "https://127.0.0.1:1",
            Path::new("/ca.crt"),
            "tok",
        )
        .unwrap();
        let kc = Kubeconfig::read_from(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("x"));
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:1"));
        assert_eq!(cluster.certificate_authority.as_deref(), Some("/ca.crt"));
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_some());
    }
}
