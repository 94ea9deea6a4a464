//! The images a real node pulls, under the public names that config/ and the chart use.
//!
//! There is no public registry here: tests/k8s/node-images.sh assembles one OCI layout per
//! recipe (from Debian's packages and Go builds), `make image` builds ours, and [`Registry`]
//! serves them on loopback (`crane registry serve`) under the names of [`IMAGES`]. containerd
//! mirrors each public registry of [`MIRRORED_REGISTRIES`] to it (`super::config::containerd`),
//! so a pod spec names `curlimages/curl:8.11.1` as a user's does, and the pull is a real pull:
//! a name that is not pushed ends in `ErrImagePull` like a missing tag does.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cluster::ProcessGroup;
use crate::wait::{eventually, Progress};

/// The sandbox image of the node's containerd (`sandbox_image`).
pub const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// The public registries whose names the node pulls from the loopback registry.
pub const MIRRORED_REGISTRIES: [&str; 4] = ["docker.io", "registry.k8s.io", "quay.io", "ghcr.io"];

/// A public image name (as a pod spec writes it, normalised to its registry) and the recipe of
/// tests/k8s/node-images.sh that stands for it.
#[derive(Debug, Clone, Copy)]
pub struct Image {
    /// `registry/repository:tag`
    pub name: &'static str,
    /// directory under the `NODE_IMAGES` layouts
    pub recipe: &'static str,
}

/// Every image the real-node tests pull, by the name config/ (and Kubernetes) use.
pub const IMAGES: [Image; 4] = [
    Image {
        name: PAUSE_IMAGE,
        recipe: "pause",
    },
    Image {
        name: "docker.io/library/busybox:1.37",
        recipe: "busybox",
    },
    Image {
        name: "docker.io/curlimages/curl:8.11.1",
        recipe: "curl",
    },
    Image {
        name: "quay.io/argoproj/argo-rollouts:v1.10.1",
        recipe: "rollouts",
    },
];

/// The registry and repository path of a pod spec's image reference, as containerd resolves it
/// (`busybox:1.37` → `docker.io/library/busybox:1.37`, docker/distribution reference rules).
pub fn normalise(reference: &str) -> String {
    let (first, rest) = reference.split_once('/').unwrap_or(("", reference));
    let has_registry =
        !first.is_empty() && (first.contains('.') || first.contains(':') || first == "localhost");
    if has_registry {
        return reference.to_owned();
    }
    if first.is_empty() {
        return format!("docker.io/library/{rest}");
    }
    format!("docker.io/{reference}")
}

/// The recipe that stands for `reference`, if the node has one.
pub fn recipe_of(reference: &str) -> Option<&'static str> {
    let name = normalise(reference);
    IMAGES.iter().find(|i| i.name == name).map(|i| i.recipe)
}

/// The loopback registry the node pulls from.
#[derive(Debug)]
pub struct Registry {
    /// `127.0.0.1:<port>`
    pub address: String,
    crane: PathBuf,
}

impl Registry {
    /// Starts `crane registry serve` on `port` in `processes` and waits until it answers.
    pub async fn start(crane: &Path, port: u16, processes: &mut ProcessGroup) -> Result<Self> {
        let address = format!("127.0.0.1:{port}");
        let mut serve = Command::new(crane);
        serve.args(["registry", "serve", "--address", &address]);
        processes.spawn("registry", serve)?;
        let probe = address.clone();
        eventually(
            "the loopback registry listens",
            Duration::from_secs(20),
            || {
                let probe = probe.clone();
                async move {
                    Ok(match TcpStream::connect(&probe) {
                        Ok(_) => Progress::Done(()),
                        Err(err) => Progress::Waiting(err.to_string()),
                    })
                }
            },
        )
        .await?;
        Ok(Self {
            address,
            crane: crane.to_owned(),
        })
    }

    /// Pushes the OCI layout `layout` as `name` (`registry/repository:tag`, the registry part
    /// dropped: the mirror serves every registry's repositories from one namespace).
    pub fn push(&self, layout: &Path, name: &str) -> Result<()> {
        let (_, path) = name
            .split_once('/')
            .context("an image name with a registry")?;
        let target = format!("{}/{path}", self.address);
        let out = Command::new(&self.crane)
            .args(["push", "--insecure"])
            .arg(layout)
            .arg(&target)
            .output()
            .with_context(|| format!("running crane push {}", layout.display()))?;
        if !out.status.success() {
            bail!(
                "crane push {} {target}: {}",
                layout.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }

    /// Pushes every image of [`IMAGES`] from the layouts in `layouts`.
    pub fn push_all(&self, layouts: &Path) -> Result<()> {
        for image in IMAGES {
            self.push(&layouts.join(image.recipe), image.name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_normalise_as_containerd_resolves_them() {
        assert_eq!(normalise("busybox:1.37"), "docker.io/library/busybox:1.37");
        assert_eq!(
            normalise("curlimages/curl:8.11.1"),
            "docker.io/curlimages/curl:8.11.1"
        );
        assert_eq!(normalise("ghcr.io/a/b:1"), "ghcr.io/a/b:1");
        assert_eq!(normalise("localhost:5000/x:1"), "localhost:5000/x:1");
        assert_eq!(recipe_of("busybox:1.37"), Some("busybox"));
        assert_eq!(recipe_of("busybox:1.36"), None);
    }
}
