//! The go-plugin handshake: magic cookie check, the unix socket, and the line on stdout.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;

use crate::Error;

/// What the host and plugin must agree on, as go-plugin's `HandshakeConfig`.
#[derive(Debug, Clone)]
pub struct HandshakeConfig {
    /// The application protocol version (Argo Rollouts: 1).
    pub protocol_version: u32,
    /// The env var the host sets (Argo Rollouts: `ARGO_ROLLOUTS_RPC_PLUGIN`).
    pub magic_cookie_key: &'static str,
    /// Its expected value (Argo Rollouts metric providers: `metricprovider`).
    pub magic_cookie_value: &'static str,
}

/// go-plugin's message for a plugin binary started by hand (printed to stderr, then exit 1).
pub const NOT_A_PLUGIN_MESSAGE: &str =
    "This binary is a plugin. These are not meant to be executed directly.\n\
Please execute the program that consumes these plugins, which will\n\
load any plugins automatically";

/// Checks that the host set the magic cookie.
pub fn check_cookie(config: &HandshakeConfig) -> Result<(), Error> {
    match std::env::var(config.magic_cookie_key) {
        Ok(v) if v == config.magic_cookie_value => Ok(()),
        _ => Err(Error::NotAPlugin),
    }
}

/// The socket directory: `PLUGIN_UNIX_SOCKET_DIR`, else `TMPDIR`, else `/tmp` (Go's `os.TempDir`).
pub(crate) fn socket_dir() -> PathBuf {
    ["PLUGIN_UNIX_SOCKET_DIR", "TMPDIR"]
        .iter()
        .filter_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map(PathBuf::from)
        .next()
        .unwrap_or_else(|| PathBuf::from("/tmp"))
}

/// Binds a fresh `plugin<random>` unix socket in `dir`.
pub(crate) fn listen(dir: &Path) -> Result<(UnixListener, PathBuf), Error> {
    let mut last = None;
    for attempt in 0..16u32 {
        let path = dir.join(format!("plugin{}", unique_suffix(attempt)));
        match UnixListener::bind(&path) {
            Ok(l) => {
                if let Some(group) =
                    std::env::var_os("PLUGIN_UNIX_SOCKET_GROUP").filter(|g| !g.is_empty())
                {
                    set_group(&path, &group.to_string_lossy())?;
                }
                return Ok((l, path));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => {
                return Err(Error::Listen {
                    dir: dir.to_path_buf(),
                    source: e,
                })
            }
        }
    }
    Err(Error::Listen {
        dir: dir.to_path_buf(),
        source: last.expect("bind was tried"),
    })
}

/// A name suffix unique to this process and moment. Deliberately no RNG: the binary must run in an
/// empty chroot (distroless), where a userspace RNG that falls back to `/dev/urandom` fails.
fn unique_suffix(attempt: u32) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    // std's RandomState is seeded by the getrandom syscall, which needs no files.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(nanos);
    h.write_u32(std::process::id());
    h.write_u32(attempt);
    h.finish() % 10_000_000_000
}

/// Makes the socket group-owned and group-writable, like go-plugin's `setGroupWritable`.
fn set_group(path: &Path, group: &str) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt;
    let gid = match group.parse::<u32>() {
        Ok(gid) => gid,
        Err(_) => std::fs::read_to_string("/etc/group")
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| {
                    let mut f = l.split(':');
                    (f.next() == Some(group))
                        .then(|| f.nth(1)?.parse().ok())
                        .flatten()
                })
            })
            .ok_or_else(|| Error::SocketGroup {
                group: group.into(),
                reason: "no such group in /etc/group".into(),
            })?,
    };
    std::os::unix::fs::chown(path, None, Some(gid))
        .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660)))
        .map_err(|e| Error::SocketGroup {
            group: group.into(),
            reason: e.to_string(),
        })
}

/// Writes `1|<version>|unix|<path>|netrpc|` as the first line on stdout and flushes it.
pub(crate) fn announce(config: &HandshakeConfig, path: &Path) -> Result<(), Error> {
    let line = format!(
        "1|{}|unix|{}|netrpc|\n",
        config.protocol_version,
        path.display()
    );
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|()| out.flush())
        .map_err(Error::Handshake)
}
