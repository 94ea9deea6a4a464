//! What a real node changes on this machine, and how all of it is taken back.
//!
//! A node is machine-wide state, not a loopback port: a bridge with the node's address, a cgroup
//! root, kube-proxy's iptables chains, network namespaces, mounts under the kubelet's root, and
//! containerd shims that leave our process group (containerd starts each shim in a group of its
//! own). So one real node runs at a time on a machine ([`NodeLock`]), everything it makes is
//! named by the constants of [`super`], and [`clean`] removes all of it: at the start (what a run
//! killed without unwinding left) and at the end. The run that holds the lock owns those names.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::fcntl::{Flock, FlockArg};
use nix::mount::{umount2, MntFlags};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{BRIDGE, CGROUP_ROOT, NODE_IP, POD_PREFIX_LEN};

/// The machine-wide lock file of the real node.
const LOCK_FILE: &str = "/run/rollouts-dispatch-real-node.lock";

/// Where containerd's CRI plugin mounts pod network namespaces (`cni-<uuid>`).
const NETNS_DIR: &str = "/var/run/netns";

/// Held while a real node runs; released (the file closed) on drop.
#[derive(Debug)]
pub(super) struct NodeLock {
    _lock: Flock<File>,
}

impl NodeLock {
    /// Waits up to `timeout` for the machine's real-node lock.
    pub(super) fn acquire(timeout: Duration) -> Result<Self> {
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK_FILE)
            .with_context(|| format!("opening {LOCK_FILE} (a real node needs root)"))?;
        let deadline = Instant::now() + timeout;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(Self { _lock: lock }),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    file = back;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err((_, err)) => bail!("another real node holds {LOCK_FILE}: {err}"),
            }
        }
    }
}

/// Creates the bridge with the node's address (the CNI bridge plugin adopts it) and turns on IP
/// forwarding (a Service's DNAT to a pod on the same bridge is routed by the host).
pub(super) fn prepare_network() -> Result<()> {
    run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
    run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{NODE_IP}/{POD_PREFIX_LEN}"),
            "dev",
            BRIDGE,
        ],
    )?;
    run("ip", &["link", "set", BRIDGE, "up"])?;
    std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
        .context("turning on /proc/sys/net/ipv4/ip_forward")?;
    Ok(())
}

/// Makes the kubelet's cgroup root in every hierarchy (the kubelet wants it to exist: "cgroup
/// [...] has some missing paths"). A new cgroup v1 cpuset starts with no CPUs and no memory
/// nodes, and no task can join it until it has some: it gets its parent's.
pub(super) fn make_cgroup_root() -> Result<()> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        bail!("/sys/fs/cgroup is not readable");
    };
    for entry in entries.flatten() {
        let hierarchy = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let root = hierarchy.join(CGROUP_ROOT.trim_start_matches('/'));
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(parent) = std::fs::read_to_string(hierarchy.join(file)) {
                std::fs::write(root.join(file), parent.trim())
                    .with_context(|| format!("writing {}", root.join(file).display()))?;
            }
        }
    }
    Ok(())
}

/// Removes everything a real node makes on the machine, whatever state it is in: the processes
/// in its cgroup root and the shims of any containerd whose socket is under `under`, the mounts
/// under `under` and the pod network namespaces, the cgroups, kube-proxy's rules
/// (`kube-proxy --cleanup`) and the bridge. Best effort; returns what it could not undo.
pub(super) fn clean(kube_proxy: &Path, under: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    kill_cgroup_processes(&mut problems);
    kill_shims(under);
    // Shims end their containers' mounts as they exit; give them a moment.
    std::thread::sleep(Duration::from_millis(300));
    unmount_under(under, &mut problems);
    remove_netns(&mut problems);
    remove_cgroups(&mut problems);
    if let Err(err) = run(&kube_proxy.display().to_string(), &["--cleanup", "--v=0"]) {
        problems.push(format!("kube-proxy --cleanup: {err:#}"));
    }
    remove_kube_chains();
    if Path::new(&format!("/sys/class/net/{BRIDGE}")).exists() {
        if let Err(err) = run("ip", &["link", "del", BRIDGE]) {
            problems.push(format!("removing bridge {BRIDGE}: {err:#}"));
        }
    }
    problems
}

/// The cgroup v1 hierarchies (or the v2 root) that hold the node's cgroup root.
fn cgroup_dirs() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path().join(CGROUP_ROOT.trim_start_matches('/')))
        .filter(|p| p.is_dir())
        .collect();
    let unified = Path::new("/sys/fs/cgroup").join(CGROUP_ROOT.trim_start_matches('/'));
    if unified.is_dir() {
        dirs.push(unified);
    }
    dirs
}

/// Every directory under `root`, deepest first.
fn subdirs_deepest_first(root: &Path) -> Vec<PathBuf> {
    let mut all = vec![root.to_owned()];
    let mut i = 0;
    while i < all.len() {
        if let Ok(entries) = std::fs::read_dir(&all[i]) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    all.push(entry.path());
                }
            }
        }
        i += 1;
    }
    all.reverse();
    all
}

fn kill_cgroup_processes(problems: &mut Vec<String>) {
    for _ in 0..20 {
        let mut any = false;
        for dir in cgroup_dirs() {
            for sub in subdirs_deepest_first(&dir) {
                let Ok(procs) = std::fs::read_to_string(sub.join("cgroup.procs")) else {
                    continue;
                };
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    any = true;
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
        if !any {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    problems.push(format!("processes still in cgroup {CGROUP_ROOT}"));
}

/// Kills the process group of every containerd shim started by a containerd whose socket is
/// under `under`: a shim names its containerd's address on its command line (`-address <socket>`).
fn kill_shims(under: &Path) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"));
        let ours = args.windows(2).any(|w| {
            w[0] == b"-address" && Path::new(&*String::from_utf8_lossy(w[1])).starts_with(under)
        });
        if is_shim && ours {
            let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Mount points under `under`, deepest first, from /proc/self/mountinfo.
fn mounts_under(under: &Path) -> Vec<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(under))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    points
}

fn unmount_under(under: &Path, problems: &mut Vec<String>) {
    for point in mounts_under(under) {
        if let Err(err) = umount2(&point, MntFlags::MNT_DETACH) {
            problems.push(format!("unmounting {}: {err}", point.display()));
        }
    }
}

/// The pod network namespaces of containerd's CRI plugin (`cni-*`): only the lock holder's
/// containerd makes them on this machine.
fn remove_netns(problems: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_name().to_string_lossy().starts_with("cni-") {
            continue;
        }
        let _ = umount2(&path, MntFlags::MNT_DETACH);
        if let Err(err) = std::fs::remove_file(&path) {
            problems.push(format!("removing {}: {err}", path.display()));
        }
    }
}

fn remove_cgroups(problems: &mut Vec<String>) {
    for dir in cgroup_dirs() {
        for sub in subdirs_deepest_first(&dir) {
            if let Err(err) = std::fs::remove_dir(&sub) {
                problems.push(format!("removing cgroup {}: {err}", sub.display()));
            }
        }
    }
}

/// The iptables chains that the kubelet makes beside kube-proxy's (`KUBE-FIREWALL`, the
/// `KUBE-*-CANARY` and `KUBE-IPTABLES-HINT` chains), in every table, for IPv4 and IPv6, with
/// both of Debian's backends (nf_tables and legacy): every jump to a `KUBE-*` chain from a
/// built-in chain, then every `KUBE-*` chain. Only the lock holder runs a node on this machine.
fn remove_kube_chains() {
    for program in [
        "iptables",
        "ip6tables",
        "iptables-legacy",
        "ip6tables-legacy",
    ] {
        for table in ["filter", "nat", "mangle"] {
            let Ok(out) = Command::new(program)
                .args(["-w", "-t", table, "-S"])
                .output()
            else {
                continue;
            };
            let rules = String::from_utf8_lossy(&out.stdout).into_owned();
            let mut chains = Vec::new();
            for rule in rules.lines() {
                let words: Vec<&str> = rule.split_whitespace().collect();
                match words.as_slice() {
                    ["-N", chain] if chain.starts_with("KUBE-") => chains.push(chain.to_string()),
                    ["-A", chain, rest @ ..]
                        if !chain.starts_with("KUBE-")
                            && rest
                                .windows(2)
                                .any(|w| w[0] == "-j" && w[1].starts_with("KUBE-")) =>
                    {
                        let mut delete = vec!["-w", "-t", table, "-D", chain];
                        delete.extend(rest.iter().map(|w| w.trim_matches('"')));
                        let _ = Command::new(program).args(&delete).output();
                    }
                    _ => {}
                }
            }
            for chain in &chains {
                let _ = Command::new(program)
                    .args(["-w", "-t", table, "-F", chain])
                    .output();
            }
            for chain in &chains {
                let _ = Command::new(program)
                    .args(["-w", "-t", table, "-X", chain])
                    .output();
            }
        }
    }
}

/// Runs `program args`, failing with its output.
pub(super) fn run(program: &str, args: &[&str]) -> Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim(),
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    Ok(())
}
