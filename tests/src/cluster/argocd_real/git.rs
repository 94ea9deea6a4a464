//! A Git repository the real Argo CD syncs from: a bare repository on local disk that the
//! repo-server reads through a `file://` URL (its git client is the `git` CLI and go-git, both
//! of which speak the file transport), and a work tree next to it that the test commits plain
//! manifests in and pushes, as a person or Kargo's `git-push` step would.
//!
//! One repository per Application: Argo CD moves `status.sync.revision` to the branch's newest
//! commit on every comparison, so two Applications on one branch would each see the other's
//! commits as their own revision.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

/// The branch the test pushes to (and Applications' `targetRevision`).
pub const BRANCH: &str = "main";

/// A bare repository and the work tree the test commits in.
#[derive(Debug)]
pub struct GitRepo {
    git: PathBuf,
    bare: PathBuf,
    work: PathBuf,
    /// One commit and push at a time.
    lock: Mutex<()>,
}

impl GitRepo {
    /// Creates `<dir>/<name>.git` (bare, default branch [`BRANCH`]) and its work tree
    /// `<dir>/<name>`.
    pub fn create(git: &Path, dir: &Path, name: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let repo = Self {
            git: git.to_owned(),
            bare: dir.join(format!("{name}.git")),
            work: dir.join(name),
            lock: Mutex::new(()),
        };
        let bare = repo.bare.display().to_string();
        let work = repo.work.display().to_string();
        repo.run(dir, &["init", "--quiet", "--bare", "-b", BRANCH, &bare])?;
        repo.run(dir, &["init", "--quiet", "-b", BRANCH, &work])?;
        repo.run(&repo.work, &["remote", "add", "origin", &bare])?;
        Ok(repo)
    }

    /// The URL an Application's `source.repoURL` names.
    pub fn url(&self) -> String {
        format!("file://{}", self.bare.display())
    }

    /// Writes `files` (paths relative to the repository root, and their contents), commits them
    /// with `message`, pushes to [`BRANCH`] and returns the commit's SHA.
    pub fn commit(&self, files: &[(&str, String)], message: &str) -> Result<String> {
        let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        for (path, text) in files {
            let path = self.work.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        }
        self.run(&self.work, &["add", "--all"])?;
        self.run(&self.work, &["commit", "--quiet", "-m", message])?;
        self.run(&self.work, &["push", "--quiet", "origin", BRANCH])?;
        let head = self.run(&self.work, &["rev-parse", "HEAD"])?;
        Ok(String::from_utf8_lossy(&head.stdout).trim().to_string())
    }

    /// Runs `git args` in `dir` with a configuration of its own (no user's or system's).
    fn run(&self, dir: &Path, args: &[&str]) -> Result<Output> {
        let out = Command::new(&self.git)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(["-c", "user.name=rollouts-dispatch e2e"])
            .args(["-c", "user.email=e2e@rollouts-dispatch.invalid"])
            .args(args)
            .output()
            .with_context(|| format!("running git {}", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "git {} in {}: {}: {}",
                args.join(" "),
                dir.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }
}
