//! `rollouts-dispatch install-plugin`: copies the metric-provider plugin that the image ships
//! beside this binary into a directory shared with the Argo Rollouts controller, so that an init
//! container of the controller's pod can hand it over and the controller loads it with a
//! `file://` location (docs/install.md, "Deliver the plugin to the controller").
//!
//! Why a subcommand and not `cp`: the image has no shell and no coreutils (an empty base). The
//! copy is written beside the target and renamed into place, so the controller never starts on a
//! half-written plugin, and the sha256 is printed for the record (Argo Rollouts checks `sha256`
//! only for `https://` locations, argo-rollouts `utils/plugin/downloader.go:160-168`).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;

/// The plugin's file name, in the image (`/usr/local/bin`) and in the target directory.
pub const PLUGIN_FILE: &str = "rollouts-dispatch-plugin";

/// `install-plugin`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct InstallPluginArgs {
    /// Directory to put the plugin in (a volume the Rollouts controller mounts); the file is
    /// `DIR/rollouts-dispatch-plugin`, executable, replaced atomically.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// The plugin binary to copy (default: `rollouts-dispatch-plugin` beside this executable,
    /// where the image puts it).
    #[arg(long, value_name = "FILE")]
    pub from: Option<PathBuf>,
}

/// Copies the plugin; exit 0 and one line `installed PATH sha256=HEX`, else 2 and the reason.
pub fn run(args: InstallPluginArgs) -> ExitCode {
    match install(&args) {
        Ok((path, sha256)) => {
            println!("installed {} sha256={sha256}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rollouts-dispatch install-plugin: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn install(args: &InstallPluginArgs) -> Result<(PathBuf, String)> {
    let from = match &args.from {
        Some(f) => f.clone(),
        None => this_executable()
            .context("cannot find this executable; pass --from FILE")?
            .with_file_name(PLUGIN_FILE),
    };
    let bytes = std::fs::read(&from).with_context(|| {
        format!(
            "cannot read the plugin {} (--from): this image or install has no plugin beside the \
             server binary; pass --from FILE",
            from.display()
        )
    })?;
    if !bytes.starts_with(b"\x7fELF") {
        bail!(
            "{} (--from) is not an executable (no ELF header): not the plugin",
            from.display()
        );
    }
    if !args.to.is_dir() {
        bail!(
            "--to {}: not a directory; mount the volume shared with the Rollouts controller there",
            args.to.display()
        );
    }
    let target = args.to.join(PLUGIN_FILE);
    let partial = args.to.join(format!(".{PLUGIN_FILE}.partial"));
    write_executable(&partial, &bytes)
        .with_context(|| format!("cannot write {} (--to)", partial.display()))?;
    std::fs::rename(&partial, &target).with_context(|| {
        format!(
            "cannot rename {} to {}",
            partial.display(),
            target.display()
        )
    })?;
    let digest = ring::digest::digest(&ring::digest::SHA256, &bytes);
    let sha256 = digest
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>();
    Ok((target, sha256))
}

/// This executable's path: `/proc/self/exe`, else an absolute `argv[0]` (a container runtime
/// starts the entrypoint by its absolute path; a bare chroot has no `/proc`).
fn this_executable() -> std::io::Result<PathBuf> {
    std::env::current_exe().or_else(|e| {
        std::env::args_os()
            .next()
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or(e)
    })
}

fn write_executable(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(bytes)?;
    file.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary directory, removed when dropped.
    struct TempDir(PathBuf);
    impl TempDir {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "install-plugin-{name}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }
        fn path(&self) -> &Path {
            &self.0
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn args(from: &Path, to: &Path) -> InstallPluginArgs {
        InstallPluginArgs {
            to: to.to_path_buf(),
            from: Some(from.to_path_buf()),
        }
    }

    #[test]
    fn copies_an_executable_atomically_and_prints_its_sha256() {
        let dir = TempDir::new("copy");
        let from = dir.path().join("plugin");
        std::fs::write(&from, b"\x7fELF and the rest").unwrap();
        let to = dir.path().join("shared");
        std::fs::create_dir(&to).unwrap();
        let (path, sha256) = install(&args(&from, &to)).unwrap();
        assert_eq!(path, to.join(PLUGIN_FILE));
        assert_eq!(std::fs::read(&path).unwrap(), b"\x7fELF and the rest");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        // `printf '\x7fELF and the rest' | sha256sum`
        assert_eq!(
            sha256,
            "6a412bbdaa5ce31b499cf297b396554aca2e8c313a37db62dadc810207444624"
        );
        assert!(!to.join(format!(".{PLUGIN_FILE}.partial")).exists());
    }

    #[test]
    fn refuses_what_is_not_a_plugin_or_not_a_directory() {
        let dir = TempDir::new("refuse");
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, b"hello").unwrap();
        let e = install(&args(&text, dir.path())).unwrap_err().to_string();
        assert!(e.contains("no ELF header") && e.contains("--from"), "{e}");
        let elf = dir.path().join("plugin");
        std::fs::write(&elf, b"\x7fELF").unwrap();
        let e = install(&args(&elf, &text)).unwrap_err().to_string();
        assert!(e.contains("--to") && e.contains("not a directory"), "{e}");
        let e = install(&args(&dir.path().join("absent"), dir.path()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read the plugin"), "{e}");
    }
}
