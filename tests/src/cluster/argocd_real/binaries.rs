//! Locating what `make argocd-bin` (tests/k8s/argocd.mk) built and installed for the real Argo
//! CD: `$CACHE_DIR/bin/argocd.env`, one `KEY=/absolute/path` a line, or the file `ARGOCD_ENV`
//! names; an environment variable of the same `KEY` overrides a line.

use std::path::PathBuf;

use anyhow::Result;

use crate::cluster::binaries::{cache_dir, resolve_keys};

/// Name of the file that `make argocd-bin` writes under `$CACHE_DIR/bin/`.
pub const ENV_FILE_NAME: &str = "argocd.env";

/// The keys of `argocd.env`, in the order of the fields of [`ArgoCdBinaries`].
const KEYS: [&str; 5] = [
    "ARGOCD_APPLICATION_CONTROLLER",
    "ARGOCD_REPO_SERVER",
    "ARGOCD_MANIFESTS",
    "REDIS_SERVER",
    "GIT",
];

/// Absolute paths of everything the real Argo CD needs.
#[derive(Debug, Clone)]
pub struct ArgoCdBinaries {
    /// `argocd-application-controller`: a symlink to the one `argocd` binary, which picks the
    /// component from argv[0] (argo-cd v3.2.6 cmd/main.go:36-52).
    pub application_controller: PathBuf,
    /// `argocd-repo-server`: the same binary under that name.
    pub repo_server: PathBuf,
    /// The module's manifests: `crds/*-crd.yaml` and `config/` (argocd-cm, argocd-rbac-cm,
    /// argocd-secret of `manifests/base/config/`).
    pub manifests: PathBuf,
    /// Debian's `redis-server`.
    pub redis_server: PathBuf,
    /// `git`, for the test's repository (the repo-server finds its own on `PATH`).
    pub git: PathBuf,
}

/// Where `make argocd-bin` writes its env file: `$ARGOCD_ENV`, else
/// `$CACHE_DIR/bin/argocd.env`.
pub fn env_file_path() -> PathBuf {
    std::env::var_os("ARGOCD_ENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("bin").join(ENV_FILE_NAME))
}

impl ArgoCdBinaries {
    /// Finds every one, failing with one message that lists whatever is missing.
    pub fn locate() -> Result<Self> {
        let paths = resolve_keys(&KEYS, &env_file_path()).map_err(|missing| {
            anyhow::anyhow!("the real Argo CD is missing, run `make argocd-bin` first: {missing}")
        })?;
        let mut it = paths.into_iter();
        let mut next = || it.next().unwrap_or_default();
        Ok(Self {
            application_controller: next(),
            repo_server: next(),
            manifests: next(),
            redis_server: next(),
            git: next(),
        })
    }
}
