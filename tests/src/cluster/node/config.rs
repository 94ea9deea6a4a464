//! The configuration files of the node's components: containerd (CRI, runc, the registry
//! mirrors), the CNI bridge network, the kubelet, kube-proxy and CoreDNS. Pure text from paths
//! and ports, so that a test can read what the node runs with.

use std::path::Path;

use super::{images::MIRRORED_REGISTRIES, BRIDGE, CGROUP_ROOT, NODE_IP, POD_SUBNET};

/// containerd 1.6's config (version 2): its own root, state and socket under the node's
/// directory, the CRI plugin with runc (cgroupfs: no systemd here), the CNI plugins of Debian's
/// package, and every public registry that config/ names mirrored to the loopback registry
/// (`registry.mirrors`, containerd 1.6 docs/cri/registry.md), so that the examples keep their
/// image names.
pub(super) fn containerd(dir: &Path, runc: &Path, cni_bin: &Path, registry: &str) -> String {
    let d = dir.display();
    let mut mirrors = String::new();
    for host in MIRRORED_REGISTRIES {
        mirrors.push_str(&format!(
            "    [plugins.\"io.containerd.grpc.v1.cri\".registry.mirrors.\"{host}\"]\n      endpoint = [\"http://{registry}\"]\n"
        ));
    }
    format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[debug]
  level = "warn"
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "{d}/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{pause}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_unprivileged_ports = false
    # This machine's root has no CAP_SYS_RESOURCE (a sandboxed VM), so no process may lower its
    # oom_score_adj: runc fails at the sandbox's -998 ("can't get final child's PID from pipe").
    # Clamp every adjustment at containerd's own, as for rootless containerd.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "{runc}"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "{cni}"
      conf_dir = "{d}/cni/net.d"
    [plugins."io.containerd.grpc.v1.cri".registry]
{mirrors}"#,
        pause = super::images::PAUSE_IMAGE,
        runc = runc.display(),
        cni = cni_bin.display(),
    )
}

/// The pod network: the bridge plugin on [`BRIDGE`] (which [`super::host`] made, with the node's
/// address as the gateway), host-local addresses from [`POD_SUBNET`] kept under the node's
/// directory, hairpin so that a pod reaches itself through its Service, and no masquerade (the
/// pods reach nothing but this machine; a masquerade rule would outlive a killed run).
pub(super) fn cni(dir: &Path) -> String {
    let ipam = dir.join("cni").join("ipam");
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "rollouts-dispatch-node",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam,
                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP, "rangeStart": "10.244.0.10"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }, {
            "type": "portmap",
            "capabilities": {"portMappings": true},
        }],
    })
    .to_string()
}

/// Ports of the node's components.
#[derive(Debug, Clone, Copy)]
pub struct NodePorts {
    /// the kubelet's API (HTTPS, self-signed), where `pods/log` goes
    pub kubelet: u16,
    /// the kubelet's healthz (loopback)
    pub kubelet_healthz: u16,
    /// kube-proxy's healthz (loopback)
    pub proxy_healthz: u16,
    /// kube-proxy's metrics (loopback)
    pub proxy_metrics: u16,
    /// CoreDNS's health (loopback)
    pub dns_health: u16,
}

/// The kubelet's configuration: cgroup v1 allowed (`failCgroupV1`, kubernetes v1.37.2
/// pkg/kubelet/apis/config/v1beta1/defaults.go:291 defaults it to true), the cgroupfs driver under
/// [`CGROUP_ROOT`], CoreDNS on the node's address, no swap check (this machine may have swap), an
/// anonymous `AlwaysAllow` API (only the API server and the tests reach it on this machine, and
/// the API server's kubelet client presents no certificate here), and eviction thresholds low
/// enough that a busy test machine does not evict the pods under test.
pub(super) fn kubelet(dir: &Path, ports: NodePorts) -> String {
    let d = dir.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: {CGROUP_ROOT}
containerRuntimeEndpoint: unix://{d}/containerd.sock
address: {NODE_IP}
port: {kubelet}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: [{NODE_IP}]
clusterDomain: cluster.local
resolvConf: {d}/resolv.conf
failSwapOn: false
serializeImagePulls: false
imageMinimumGCAge: 24h
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
evictionPressureTransitionPeriod: 5s
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
nodeStatusReportFrequency: 30s
shutdownGracePeriod: 0s
containerLogMaxSize: 50Mi
"#,
        kubelet = ports.kubelet,
        healthz = ports.kubelet_healthz,
    )
}

/// kube-proxy's configuration: iptables mode (Debian's iptables, nf_tables backend), the pod
/// subnet as the cluster CIDR, health and metrics on loopback, and no conntrack sysctls (a
/// virtual machine may refuse them; kube-proxy skips them at 0).
pub(super) fn kube_proxy(kubeconfig: &Path, node_name: &str, ports: NodePorts) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: {kubeconfig}
hostnameOverride: {node_name}
bindAddress: {NODE_IP}
clusterCIDR: {POD_SUBNET}
healthzBindAddress: 127.0.0.1:{healthz}
metricsBindAddress: 127.0.0.1:{metrics}
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  syncPeriod: 5s
  minSyncPeriod: 0s
"#,
        kubeconfig = kubeconfig.display(),
        healthz = ports.proxy_healthz,
        metrics = ports.proxy_metrics,
    )
}

/// CoreDNS on the node's address: the cluster's Services and pods by name (the `kubernetes`
/// plugin, as a cluster's own CoreDNS runs), nothing upstream (this machine has no resolver to
/// forward to).
pub(super) fn corefile(kubeconfig: &Path, ports: NodePorts) -> String {
    format!(
        r#".:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{health}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"#,
        kubeconfig = kubeconfig.display(),
        health = ports.dns_health,
    )
}
