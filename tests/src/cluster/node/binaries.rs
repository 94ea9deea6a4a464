//! Locating what a real node runs: `make real-node-bin` (tests/k8s/node.mk) writes
//! `$CACHE_DIR/bin/real-node.env`, one `KEY=/absolute/path` a line; an environment variable of the
//! same key overrides a line.

use std::path::PathBuf;

use anyhow::{anyhow, Result};

use crate::cluster::binaries::{cache_dir, resolve_keys};

/// Name of the file that `make real-node-bin` writes under `$CACHE_DIR/bin/`.
pub const ENV_FILE_NAME: &str = "real-node.env";

/// Absolute paths of everything a real node needs.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// `kubelet` (k8s.io/kubernetes, the control plane's version).
    pub kubelet: PathBuf,
    /// `kube-proxy` (k8s.io/kubernetes).
    pub kube_proxy: PathBuf,
    /// `coredns` (github.com/coredns/coredns).
    pub coredns: PathBuf,
    /// `containerd` (Debian's package).
    pub containerd: PathBuf,
    /// `containerd-shim-runc-v2` (Debian's containerd package).
    pub containerd_shim: PathBuf,
    /// `runc` (Debian's package).
    pub runc: PathBuf,
    /// The CNI plugins (Debian's containernetworking-plugins: /usr/lib/cni).
    pub cni_bin_dir: PathBuf,
    /// `crane`, which serves the loopback registry and pushes the images to it.
    pub crane: PathBuf,
    /// The OCI image layouts of tests/k8s/node-images.sh, one directory per recipe.
    pub images: PathBuf,
    /// The Argo Rollouts `manifests/install.yaml` of the module the controller image is built from.
    pub rollouts_install_yaml: PathBuf,
}

const KEYS: [&str; 10] = [
    "KUBELET",
    "KUBE_PROXY",
    "COREDNS",
    "CONTAINERD",
    "CONTAINERD_SHIM",
    "RUNC",
    "CNI_BIN_DIR",
    "CRANE",
    "NODE_IMAGES",
    "ROLLOUTS_INSTALL_YAML",
];

impl NodeBinaries {
    /// Finds every piece, failing with one message that lists whatever is missing.
    pub fn locate() -> Result<Self> {
        let env_file = cache_dir().join("bin").join(ENV_FILE_NAME);
        let paths = resolve_keys(&KEYS, &env_file).map_err(|missing| {
            anyhow!("real-node pieces are missing, run `make real-node-bin` first: {missing}")
        })?;
        let mut it = paths.into_iter();
        let mut next = || it.next().unwrap_or_default();
        Ok(Self {
            kubelet: next(),
            kube_proxy: next(),
            coredns: next(),
            containerd: next(),
            containerd_shim: next(),
            runc: next(),
            cni_bin_dir: next(),
            crane: next(),
            images: next(),
            rollouts_install_yaml: next(),
        })
    }
}
