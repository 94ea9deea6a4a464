//! Locating the Go-built binaries that the test clusters run.
//!
//! `make k8s-bin` (tests/k8s/k8s.mk) builds them into version-keyed directories under
//! `$CACHE_DIR/bin/` and writes `$CACHE_DIR/bin/k8s-bin.env`, one `KEY=/absolute/path` a line.
//! [`Binaries::locate`] reads that file; an environment variable of the same `KEY` overrides a
//! line, and `K8S_BIN_ENV` names another file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// Name of the file that `make k8s-bin` writes under `$CACHE_DIR/bin/`.
pub const ENV_FILE_NAME: &str = "k8s-bin.env";

/// Absolute paths of everything a test cluster (and Argo Rollouts on it) needs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `kube-apiserver` (k8s.io/kubernetes).
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager` (k8s.io/kubernetes).
    pub kube_controller_manager: PathBuf,
    /// `kube-scheduler` (k8s.io/kubernetes).
    pub kube_scheduler: PathBuf,
    /// `kubectl` (k8s.io/kubernetes), for people and scripts; the launcher does not need it.
    pub kubectl: PathBuf,
    /// `etcd` (go.etcd.io/etcd/server/v3).
    pub etcd: PathBuf,
    /// `kwok` (sigs.k8s.io/kwok).
    pub kwok: PathBuf,
    /// `rollouts-controller` (github.com/argoproj/argo-rollouts).
    pub rollouts_controller: PathBuf,
    /// Directory with the Argo Rollouts CRD manifests (`manifests/crds/*.yaml` of the module).
    pub argo_rollouts_crds: PathBuf,
    /// Directory with kwok's `Logs` and `ClusterLogs` CRD manifests (`kustomize/crd/bases/` of
    /// the module), which make `pods/log` serve a file per container ([`super::kwok`]).
    pub kwok_crds: PathBuf,
}

/// The keys of `k8s-bin.env`, in the order of the fields of [`Binaries`].
const KEYS: [&str; 9] = [
    "KUBE_APISERVER",
    "KUBE_CONTROLLER_MANAGER",
    "KUBE_SCHEDULER",
    "KUBECTL",
    "ETCD",
    "KWOK",
    "ROLLOUTS_CONTROLLER",
    "ARGO_ROLLOUTS_CRDS",
    "KWOK_CRDS",
];

/// Where `make k8s-bin` writes its env file: `$K8S_BIN_ENV`, else `$CACHE_DIR/bin/k8s-bin.env`,
/// else `$HOME/.cache/rollouts-dispatch/bin/k8s-bin.env`.
pub fn env_file_path() -> PathBuf {
    if let Some(path) = std::env::var_os("K8S_BIN_ENV") {
        return PathBuf::from(path);
    }
    cache_dir().join("bin").join(ENV_FILE_NAME)
}

/// The cache directory shared with the Makefile (`CACHE_DIR`).
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CACHE_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("rollouts-dispatch")
}

impl Binaries {
    /// Finds every binary, failing with one message that lists whatever is missing.
    pub fn locate() -> Result<Self> {
        let paths = resolve_keys(&KEYS, &env_file_path()).map_err(|missing| {
            anyhow::anyhow!(
                "test cluster binaries are missing, run `make k8s-bin` first: {missing}"
            )
        })?;
        let mut it = paths.into_iter();
        let mut next = || it.next().unwrap_or_default();
        Ok(Self {
            kube_apiserver: next(),
            kube_controller_manager: next(),
            kube_scheduler: next(),
            kubectl: next(),
            etcd: next(),
            kwok: next(),
            rollouts_controller: next(),
            argo_rollouts_crds: next(),
            kwok_crds: next(),
        })
    }
}

/// Key of `k8s-bin.env` naming the directory of Argo CD's CRD manifests (copied by `make k8s-bin`
/// from the `github.com/argoproj/argo-cd/v3` module's `manifests/crds/`): only the tests that
/// play Argo CD need it, so it is not one of [`Binaries`]' required keys.
pub const ARGO_CD_CRDS: &str = "ARGO_CD_CRDS";

/// The directory of Argo CD's CRD manifests (`$ARGO_CD_CRDS`, else `k8s-bin.env`).
pub fn argo_cd_crds() -> Result<PathBuf> {
    let env_file = env_file_path();
    let value = std::env::var(ARGO_CD_CRDS)
        .ok()
        .filter(|v| !v.is_empty())
        .or_else(|| {
            std::fs::read_to_string(&env_file)
                .ok()
                .and_then(|text| parse_env_file(&text).remove(ARGO_CD_CRDS))
        });
    match value {
        Some(dir) if Path::new(&dir).join("application-crd.yaml").exists() => Ok(dir.into()),
        Some(dir) => {
            bail!("{ARGO_CD_CRDS}={dir} holds no application-crd.yaml: run `make k8s-bin`")
        }
        None => bail!(
            "{ARGO_CD_CRDS} is not in {}: run `make k8s-bin` (it copies Argo CD's CRDs)",
            env_file.display()
        ),
    }
}

/// The path of each of `keys`: its environment variable when set, else its line of `env_file`;
/// every one must exist. Fails with the list of what is missing (one message for all).
pub(crate) fn resolve_keys(
    keys: &[&str],
    env_file: &Path,
) -> std::result::Result<Vec<PathBuf>, String> {
    let from_file = std::fs::read_to_string(env_file)
        .map(|text| parse_env_file(&text))
        .unwrap_or_default();
    let mut paths = Vec::with_capacity(keys.len());
    let mut missing = Vec::new();
    for key in keys {
        let value = std::env::var(key)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| from_file.get(*key).cloned());
        match value {
            Some(v) if Path::new(&v).exists() => paths.push(PathBuf::from(v)),
            Some(v) => missing.push(format!("{key}={v} (does not exist)")),
            None => missing.push(format!("{key} (not in {})", env_file.display())),
        }
    }
    if missing.is_empty() {
        Ok(paths)
    } else {
        Err(missing.join(", "))
    }
}

fn parse_env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_env_lines_and_ignores_comments() {
        let map = parse_env_file("# comment\nETCD=/a/etcd\n\n KWOK = /b/kwok \nbogus\n");
        assert_eq!(map.get("ETCD").map(String::as_str), Some("/a/etcd"));
        assert_eq!(map.get("KWOK").map(String::as_str), Some("/b/kwok"));
        assert_eq!(map.len(), 2);
    }
}
