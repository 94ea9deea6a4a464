//! A process group that holds every process of one test cluster and never outlives the test.
//!
//! The group leader is a tiny `sh` watchdog whose stdin is a pipe held only by this process.
//! Every component is spawned into the leader's group (`CommandExt::process_group`, no unsafe
//! code). Dropping the [`ProcessGroup`] sends SIGTERM to the group, waits a few seconds and then
//! sends SIGKILL, which also reaps grandchildren such as metric plugins started by the Argo
//! Rollouts controller. If the test process dies without unwinding (SIGKILL, abort), the kernel
//! closes the pipe, the watchdog reads EOF and kills the group itself. `prctl(PR_SET_DEATHSIG)`
//! would need `pre_exec`, i.e. unsafe code, which the workspace forbids.

use std::fs::File;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The watchdog: ignore the signals it will send, wait for EOF on stdin, then end the group.
const WATCHDOG: &str = "trap '' TERM INT HUP; while read -r _; do :; done; \
                        kill -TERM 0; sleep 3; kill -KILL 0";

/// Grace period between SIGTERM and SIGKILL on drop.
const GRACE: Duration = Duration::from_secs(1);

/// A running component of the group.
#[derive(Debug)]
struct Member {
    name: String,
    child: Child,
    log: PathBuf,
}

/// All processes of one cluster, killed together on drop.
#[derive(Debug)]
pub struct ProcessGroup {
    pgid: Pid,
    watchdog: Child,
    /// Held open for the watchdog; closing it (or dying) tells the watchdog to kill the group.
    watchdog_stdin: Option<ChildStdin>,
    members: Vec<Member>,
    log_dir: PathBuf,
}

impl ProcessGroup {
    /// Starts the watchdog that leads a new process group; component logs go to `log_dir`.
    pub fn new(log_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let mut watchdog = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .context("spawning the process-group watchdog (sh)")?;
        let watchdog_stdin = watchdog.stdin.take();
        let pid = i32::try_from(watchdog.id()).context("watchdog pid out of range")?;
        Ok(Self {
            pgid: Pid::from_raw(pid),
            watchdog,
            watchdog_stdin,
            members: Vec::new(),
            log_dir: log_dir.to_owned(),
        })
    }

    /// The process-group id (the watchdog's pid).
    pub fn pgid(&self) -> i32 {
        self.pgid.as_raw()
    }

    /// Path of the combined stdout/stderr log of component `name`.
    pub fn log_path(&self, name: &str) -> PathBuf {
        self.log_dir.join(format!("{name}.log"))
    }

    /// Spawns `cmd` into the group with stdin closed and stdout/stderr appended to its log.
    pub fn spawn(&mut self, name: &str, mut cmd: Command) -> Result<()> {
        let log = self.log_path(name);
        let out = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("duplicating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(self.pgid.as_raw())
            .spawn()
            .with_context(|| format!("spawning {name} ({:?})", cmd.get_program()))?;
        self.members.push(Member {
            name: name.to_owned(),
            child,
            log,
        });
        Ok(())
    }

    /// Component `name`, no longer a member (to be stopped).
    fn take(&mut self, name: &str) -> Result<Member> {
        let i = self
            .members
            .iter()
            .position(|m| m.name == name)
            .with_context(|| format!("no process named {name} in this cluster"))?;
        Ok(self.members.remove(i))
    }

    /// Stops component `name` as Kubernetes stops a Pod: SIGTERM, then SIGKILL after `grace`;
    /// forgets it, so that it can be started again under the same name.
    pub fn terminate(&mut self, name: &str, grace: Duration) -> Result<()> {
        let mut member = self.take(name)?;
        let pid = Pid::from_raw(member.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
        let until = Instant::now() + grace;
        while Instant::now() < until {
            if member.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = member.child.kill();
        member
            .child
            .wait()
            .with_context(|| format!("reaping {name}"))?;
        Ok(())
    }

    /// Kills component `name` with SIGKILL (a crash, as far as it can tell) and forgets it, so
    /// that it can be started again under the same name.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let mut member = self.take(name)?;
        member
            .child
            .kill()
            .with_context(|| format!("killing {name}"))?;
        member
            .child
            .wait()
            .with_context(|| format!("reaping {name}"))?;
        Ok(())
    }

    /// Sends `signal` to component `name` alone (not its group): SIGSTOP freezes it between two
    /// writes of a test, so that it cannot act on the first before the second; SIGCONT lets it
    /// go on.
    pub fn signal(&mut self, name: &str, signal: Signal) -> Result<()> {
        let member = self
            .members
            .iter()
            .find(|m| m.name == name)
            .with_context(|| format!("no process named {name} in this cluster"))?;
        let pid = Pid::from_raw(i32::try_from(member.child.id()).context("a pid beyond i32")?);
        nix::sys::signal::kill(pid, signal).with_context(|| format!("sending {signal} to {name}"))
    }

    /// The PID of component `name`, if the group runs one by that name.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.members
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.child.id())
    }

    /// Fails if a component has exited, quoting the end of its log.
    pub fn check_alive(&mut self) -> Result<()> {
        for member in &mut self.members {
            let status = member
                .child
                .try_wait()
                .with_context(|| format!("polling {}", member.name))?;
            if let Some(status) = status {
                bail!(
                    "{} exited early ({}); last log lines from {}:\n{}",
                    member.name,
                    describe(status),
                    member.log.display(),
                    tail(&member.log, 30)
                );
            }
        }
        Ok(())
    }

    /// Terminates every process of the group: SIGTERM, up to [`GRACE`], then SIGKILL.
    pub fn shutdown(&mut self) {
        if self.watchdog_stdin.is_none() && self.members.is_empty() {
            return;
        }
        let _ = killpg(self.pgid, Signal::SIGTERM);
        let deadline = Instant::now() + GRACE;
        while Instant::now() < deadline
            && self
                .members
                .iter_mut()
                .any(|m| matches!(m.child.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        // SIGKILL also ends the watchdog and any grandchild that ignored SIGTERM.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        if let Some(mut stdin) = self.watchdog_stdin.take() {
            let _ = stdin.flush();
        }
        for member in &mut self.members {
            let _ = member.child.wait();
        }
        let _ = self.watchdog.wait();
        self.members.clear();
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        _ => status.to_string(),
    }
}

/// A memory figure of process `pid` in MiB: `field` of `/proc/<pid>/status`, e.g. `VmRSS`
/// (resident now) or `VmHWM` (the peak of resident).
pub fn status_mib(pid: u32, field: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in {path}"))?;
    Ok(kib / 1024.0)
}

/// The last `lines` lines of a log file (or a note that it could not be read).
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}
