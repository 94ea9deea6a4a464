//! A real node for a test cluster, where containers really start.
//!
//! [`RealNode`] runs, in the cluster's process group: a loopback registry with the images of
//! [`images`], containerd with runc and the CNI bridge plugin (Debian's packages), the kubelet and
//! kube-proxy of the control plane's version, and CoreDNS on the node's address, so that pods get
//! addresses, Services route and resolve by name, and `pods/log` is the kubelet's. The cluster's
//! API server then binds beyond loopback and advertises [`NODE_IP`] (the `kubernetes` Service's
//! endpoint pods reach), and enforces the `restricted` Pod Security level by default
//! (`super::Cluster::spawn`).
//!
//! A node changes the machine (a bridge, a cgroup root, iptables chains, mounts, shims that leave
//! the process group): one runs at a time, and [`host::clean`] takes all of it back (see
//! [`host`]). Needs root, Linux, and `make real-node-bin`.

pub mod binaries;
mod config;
mod host;
pub mod images;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};

pub use binaries::NodeBinaries;
pub use config::NodePorts;
pub use images::Registry;

use crate::cluster::ProcessGroup;
use crate::ports;

/// The node's name (its kubelet's `--hostname-override`).
pub const NODE_NAME: &str = "real-node";
/// The node's address: the bridge's, the gateway of the pods, the API server's advertised
/// address, the kubelet's and CoreDNS's.
pub const NODE_IP: &str = "10.244.0.1";
/// The pods' addresses.
pub const POD_SUBNET: &str = "10.244.0.0/24";
/// The prefix length of [`POD_SUBNET`].
pub const POD_PREFIX_LEN: u8 = 24;
/// The Linux bridge of the pods.
pub const BRIDGE: &str = "rd-node0";
/// The cgroup under which the kubelet puts every pod (`cgroupRoot`).
pub const CGROUP_ROOT: &str = "/rollouts-dispatch-node";

/// The user of the kubelet in the API server's token file (the Node authorizer's form).
pub const KUBELET_USER: &str = "system:node:real-node";
/// The user of kube-proxy (bound to `system:node-proxier` by the API server's bootstrap policy).
pub const PROXY_USER: &str = "system:kube-proxy";

/// How long a run waits for another run's node to go.
const LOCK_WAIT: Duration = Duration::from_secs(600);

/// A real node of one cluster; [`RealNode::teardown`] (called by the cluster's drop) removes it.
#[derive(Debug)]
pub struct RealNode {
    /// Ports of the node's components.
    pub ports: NodePorts,
    /// The loopback registry, once [`RealNode::start`] ran.
    pub registry: Option<Registry>,
    /// What the node runs.
    pub binaries: NodeBinaries,
    /// The node's directory (under the cluster's).
    pub dir: PathBuf,
    /// the API server's token-file lines of the kubelet and kube-proxy
    kubelet_token: String,
    proxy_token: String,
    registry_port: u16,
    torn_down: bool,
    _lock: host::NodeLock,
}

impl RealNode {
    /// Before the API server starts: takes the machine's real-node lock, removes what an earlier
    /// run left under `clusters_base`, and makes the bridge with [`NODE_IP`].
    pub fn prepare(cluster_dir: &Path, clusters_base: &Path) -> Result<Self> {
        let binaries = NodeBinaries::locate()?;
        let lock = host::NodeLock::acquire(LOCK_WAIT)?;
        for problem in host::clean(&binaries.kube_proxy, clusters_base) {
            eprintln!("real node: cleaning an earlier run: {problem}");
        }
        host::prepare_network().context("preparing the node's network")?;
        host::make_cgroup_root().context("making the node's cgroup root")?;
        let p = ports::allocate(6)?;
        let dir = cluster_dir.join("node");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        use rand::distr::{Alphanumeric, SampleString};
        let token = || Alphanumeric.sample_string(&mut rand::rng(), 32);
        Ok(Self {
            ports: NodePorts {
                kubelet: p[0],
                kubelet_healthz: p[1],
                proxy_healthz: p[2],
                proxy_metrics: p[3],
                dns_health: p[4],
            },
            registry_port: p[5],
            registry: None,
            binaries,
            dir,
            kubelet_token: token(),
            proxy_token: token(),
            torn_down: false,
            _lock: lock,
        })
    }

    /// The API server's token-file lines of the node's components.
    pub fn token_lines(&self) -> String {
        format!(
            "{},{KUBELET_USER},{KUBELET_USER},system:nodes\n{},{PROXY_USER},{PROXY_USER}\n",
            self.kubelet_token, self.proxy_token
        )
    }

    /// Once the API server answers: the registry (with every image pushed), containerd, the
    /// kubelet, kube-proxy and CoreDNS, in `processes`. `server` is the API server's loopback URL,
    /// `ca` its CA file, `admin_kubeconfig` the cluster's admin kubeconfig (CoreDNS reads with it).
    pub async fn start(
        &mut self,
        processes: &mut ProcessGroup,
        server: &str,
        ca: &Path,
        admin_kubeconfig: &Path,
    ) -> Result<()> {
        let registry = Registry::start(&self.binaries.crane, self.registry_port, processes).await?;
        registry
            .push_all(&self.binaries.images)
            .context("pushing the node's images")?;
        let d = &self.dir;
        let write = |name: &str, text: String| -> Result<PathBuf> {
            let path = d.join(name);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            Ok(path)
        };
        let containerd_config = write(
            "containerd.toml",
            config::containerd(
                d,
                &self.binaries.runc,
                &self.binaries.cni_bin_dir,
                &registry.address,
            ),
        )?;
        write("cni/net.d/10-node.conflist", config::cni(d))?;
        write("resolv.conf", format!("nameserver {NODE_IP}\n"))?;
        let kubelet_kubeconfig = write(
            "kubelet.kubeconfig",
            kubeconfig(server, ca, KUBELET_USER, &self.kubelet_token),
        )?;
        let proxy_kubeconfig = write(
            "kube-proxy.kubeconfig",
            kubeconfig(server, ca, PROXY_USER, &self.proxy_token),
        )?;
        let kubelet_config = write("kubelet.yaml", config::kubelet(d, self.ports))?;
        let proxy_config = write(
            "kube-proxy.yaml",
            config::kube_proxy(&proxy_kubeconfig, NODE_NAME, self.ports),
        )?;
        let corefile = write("Corefile", config::corefile(admin_kubeconfig, self.ports))?;
        self.registry = Some(registry);

        let mut containerd = Command::new(&self.binaries.containerd);
        containerd.arg("--config").arg(&containerd_config);
        // The shims find runc and themselves on PATH.
        containerd.env("PATH", node_path(&self.binaries));
        processes.spawn("containerd", containerd)?;

        let mut kubelet = Command::new(&self.binaries.kubelet);
        kubelet
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", kubelet_kubeconfig.display()))
            .arg(format!("--root-dir={}", d.join("kubelet").display()))
            .arg(format!("--cert-dir={}", d.join("kubelet-pki").display()))
            .arg(format!("--hostname-override={NODE_NAME}"))
            .arg(format!("--node-ip={NODE_IP}"))
            .arg("--v=1");
        kubelet.env("PATH", node_path(&self.binaries));
        processes.spawn("kubelet", kubelet)?;

        let mut proxy = Command::new(&self.binaries.kube_proxy);
        proxy
            .arg(format!("--config={}", proxy_config.display()))
            .arg("--v=1");
        processes.spawn("kube-proxy", proxy)?;

        let mut dns = Command::new(&self.binaries.coredns);
        dns.arg("-conf").arg(&corefile);
        processes.spawn("coredns", dns)?;
        Ok(())
    }

    /// Stops the kubelet first (so that nothing restarts), then removes every container,
    /// mount, network namespace, cgroup, iptables rule and the bridge the node made; the rest of
    /// `processes` ends with the cluster.
    pub fn teardown(&mut self, processes: &mut ProcessGroup) {
        if self.torn_down {
            return;
        }
        self.torn_down = true;
        for name in ["kubelet", "kube-proxy"] {
            let _ = processes.kill(name);
        }
        for problem in host::clean(&self.binaries.kube_proxy, &self.dir) {
            eprintln!("real node: teardown: {problem}");
        }
        let _ = processes.kill("containerd");
        // containerd's own mounts (the overlay snapshots) go with it.
        for problem in host::clean(&self.binaries.kube_proxy, &self.dir) {
            eprintln!("real node: teardown: {problem}");
        }
    }
}

/// PATH for containerd and the kubelet: the directories of runc and the shim, then the system's.
fn node_path(binaries: &NodeBinaries) -> String {
    let mut dirs: Vec<String> = [&binaries.runc, &binaries.containerd_shim]
        .iter()
        .filter_map(|p| p.parent().map(|d| d.display().to_string()))
        .collect();
    dirs.push("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    dirs.join(":")
}

/// A kubeconfig for `user` with a bearer token.
fn kubeconfig(server: &str, ca: &Path, user: &str, token: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: node\n  cluster:\n    server: {server}\n    \
         certificate-authority: {ca}\nusers:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: node\n  context:\n    cluster: node\n    user: {user}\ncurrent-context: node\n",
        ca = ca.display()
    )
}

impl Drop for RealNode {
    /// A node dropped before its cluster took it (a failed start) still takes back what it made.
    fn drop(&mut self) {
        if !self.torn_down {
            self.torn_down = true;
            for problem in host::clean(&self.binaries.kube_proxy, &self.dir) {
                eprintln!("real node: teardown: {problem}");
            }
        }
    }
}
