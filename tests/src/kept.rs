//! `make demo-up` (`DEMO_KEEP=1 make demo`): the demo's World kept up after its verdicts, for a
//! person to open the page, run `rollouts-dispatch logs` and `kubectl` against it, until they
//! stop it.
//!
//! The World's processes die with the test process (each cluster's process group, the
//! in-process server), so keeping it up means keeping the test in the foreground: [`keep`]
//! prints what to try and waits for SIGINT (Ctrl-C), SIGTERM (`make demo-down`) or SIGHUP
//! (the terminal went away), then returns and the World is dropped as in every test. Nothing
//! outlives the test, so `tests/leftovers.sh` has nothing new to know.
//!
//! The recipe runs the test with SIGINT ignored (`trap '' INT`), inherited by cargo and the
//! output filter, so that Ctrl-C reaches only the test, which catches it ([`Stop::listen`],
//! first thing, so Ctrl-C during the start works too) and tears down with its output still
//! read.
//!
//! What a person needs is in one directory, [`StateDir`] (`target/demo/` of the workspace):
//! `pid` (the test process), `groups` (the clusters' process groups), `token` (a token of the
//! Kargo project, [`TOKEN_TTL`]), `api-ca.crt` (the API's CA) and `kubeconfig` (the control
//! plane's admin). `make demo-down` (`tests/demo-down.sh`) reads `pid` and `groups`; the test
//! removes the directory when it ends.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

use crate::artifacts::{repo_path, rollouts_dispatch_binary};
use crate::cluster::pod_logs::{self, LogFile};
use crate::kargo::{FAILED_CHECK_LOG, PROJECT};
use crate::world::{Direct, DirectOptions, World};

/// The variable that asks for it: set and not `0`.
pub const KEEP_ENV: &str = "DEMO_KEEP";
/// How long the printed token is valid: as long as a page session lasts (`ui.sessionLifetime`).
pub const TOKEN_TTL: Duration = Duration::from_secs(8 * 3600);
/// The subject of the printed token.
const TOKEN_SUBJECT: &str = "demo";
/// How often the kept World is checked for a process that died.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Whether [`KEEP_ENV`] asks to keep the World up.
pub fn requested() -> bool {
    asks(std::env::var(KEEP_ENV).ok().as_deref())
}

/// Whether a value of [`KEEP_ENV`] asks for it.
fn asks(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && v != "0")
}

/// The demo's server configuration when kept: the Jobs (and so their logs) stay as long as the
/// token lasts, not the default hour (`jobs.ttlAfterFinished`).
pub fn options() -> DirectOptions {
    DirectOptions {
        extra_yaml: format!(
            "jobs: {{ttlAfterFinished: {}h}}\n",
            TOKEN_TTL.as_secs() / 3600
        ),
        ..DirectOptions::default()
    }
}

/// The signals that stop a kept demo, caught from [`Stop::listen`] on.
#[derive(Debug)]
pub struct Stop {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Stop {
    /// Catches SIGINT, SIGTERM and SIGHUP from now on (instead of dying of them).
    pub fn listen() -> Result<Self> {
        let catch = |kind| signal(kind).context("catching a signal");
        Ok(Self {
            int: catch(SignalKind::interrupt())?,
            term: catch(SignalKind::terminate())?,
            hup: catch(SignalKind::hangup())?,
        })
    }

    /// Waits for one of them; returns its name.
    pub async fn signalled(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
            _ = self.hup.recv() => "SIGHUP",
        }
    }
}

/// `target/demo/`, held by this process while it keeps a demo up; removed when dropped.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
}

impl StateDir {
    /// Takes `target/demo/` of the workspace: fails if a kept demo still holds it, else empties
    /// it (what a killed demo left) and writes this process's pid.
    pub fn claim() -> Result<Self> {
        Self::claim_at(&repo_path("target/demo"))
    }

    fn claim_at(dir: &Path) -> Result<Self> {
        if let Some(pid) = holder(dir) {
            bail!(
                "a kept demo is already running (pid {pid}, {}): stop it with `make demo-down`",
                dir.display()
            );
        }
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = std::fs::canonicalize(dir)?;
        let state = Self { dir };
        state.write("pid", &format!("{}\n", std::process::id()))?;
        Ok(state)
    }

    /// Writes `name` in the directory; returns its path.
    fn write(&self, name: &str, content: &str) -> Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pid in `dir/pid` if that process is still a demo test (`target/debug/deps/demo-…`).
fn holder(dir: &Path) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(dir.join("pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let program = cmdline.split(|b| *b == 0).next()?;
    let name = Path::new(std::str::from_utf8(program).ok()?).file_name()?;
    (pid != std::process::id() && name.to_string_lossy().starts_with("demo-")).then_some(pid)
}

/// What the printed block names, each a path or a URL on this machine.
#[derive(Debug, Clone)]
pub struct Instructions {
    /// The API and the page: `https://127.0.0.1:<port>`.
    pub url: String,
    /// The API's port.
    pub port: u16,
    /// The failing verification's AnalysisRun.
    pub failing_run: String,
    /// The token file.
    pub token: PathBuf,
    /// The API's CA file.
    pub ca: PathBuf,
    /// The control plane's kubeconfig.
    pub kubeconfig: PathBuf,
    /// `kubectl`.
    pub kubectl: PathBuf,
    /// `rollouts-dispatch`.
    pub dispatch: PathBuf,
    /// The process that keeps it all up.
    pub pid: u32,
}

impl Instructions {
    /// The block, one line each, every line starting with `demo:` (what `make demo` shows).
    pub fn lines(&self) -> Vec<String> {
        let p = |path: &Path| path.display().to_string();
        let page = format!("https://localhost:{}/ui", self.port);
        let logs = format!(
            "{} logs {} -n {PROJECT} --server {} --ca-file {} --token-file {}",
            p(&self.dispatch),
            self.failing_run,
            self.url,
            p(&self.ca),
            p(&self.token),
        );
        let hours = TOKEN_TTL.as_secs() / 3600;
        [
            "demo: kept up (DEMO_KEEP=1): the 3 clusters, the Argo Rollouts controller and \
             rollouts-dispatch serve run until you stop them"
                .to_string(),
            format!("demo: the page:  {page}"),
            format!(
                "demo:   log in with the token: paste the content of {} into the form",
                p(&self.token)
            ),
            format!(
                "demo:   the failing run's page: {page}/runs/{PROJECT}/{}",
                self.failing_run
            ),
            format!(
                "demo:   HTTPS with the demo's own CA ({}): let the browser through its warning; \
                 on 127.0.0.1 only (from elsewhere: ssh -L {port}:localhost:{port} <this host>)",
                p(&self.ca),
                port = self.port
            ),
            format!(
                "demo: the token: {} (project {PROJECT}, valid {hours}h)",
                p(&self.token)
            ),
            "demo: the failing verification's whole log:".to_string(),
            format!("demo:   {logs}"),
            "demo: the AnalysisRuns:".to_string(),
            format!(
                "demo:   {} --kubeconfig {} get analysisruns -A",
                p(&self.kubectl),
                p(&self.kubeconfig)
            ),
            format!(
                "demo: stop it: Ctrl-C here, or `make demo-down` from another terminal \
                 (ends pid {} and its clusters, removes {})",
                self.pid,
                p(self.token.parent().unwrap_or(Path::new("target/demo")))
            ),
        ]
        .into()
    }
}

/// Prints `line` if stdout still takes it: after a SIGHUP nobody may read it, and teardown
/// must go on.
pub fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// Keeps `world` up: writes the state files, prints the block for `failing_run`, then waits
/// until `stop` or a process of the World dies (an error naming it). The caller drops the
/// World afterwards.
pub async fn keep(
    world: &mut World<Direct>,
    failing_run: &str,
    state: &StateDir,
    stop: &mut Stop,
) -> Result<()> {
    let groups: Vec<String> = [&world.control, &world.a, &world.b]
        .iter()
        .map(|c| c.process_group().to_string())
        .collect();
    state.write("groups", &(groups.join("\n") + "\n"))?;
    let (token, _) = dispatch_server::token::issue_token_for(
        world.signing_key(),
        TOKEN_SUBJECT,
        None,
        Some(&[PROJECT.to_string()]),
        TOKEN_TTL,
    )?;
    serve_failed_check_log(world).await?;
    let kubeconfig = std::fs::read_to_string(&world.control.kubeconfig)?;
    let instructions = Instructions {
        url: world.url.clone(),
        port: world.dispatch.server.port,
        failing_run: failing_run.to_string(),
        token: state.write("token", &format!("{token}\n"))?,
        ca: state.write("api-ca.crt", world.ca_pem())?,
        kubeconfig: state.write("kubeconfig", &kubeconfig)?,
        kubectl: world.control.binaries.kubectl.clone(),
        dispatch: std::fs::canonicalize(rollouts_dispatch_binary()?)?,
        pid: std::process::id(),
    };
    for line in instructions.lines() {
        say(&line);
    }
    let mut every = tokio::time::interval(CHECK_EVERY);
    loop {
        tokio::select! {
            signal = stop.signalled() => {
                say(&format!("demo: {signal}: tearing everything down"));
                return Ok(());
            }
            _ = every.tick() => {
                for cluster in [&mut world.control, &mut world.a, &mut world.b] {
                    let name = cluster.name.clone();
                    cluster
                        .check_alive()
                        .with_context(|| format!("the kept demo's cluster {name}"))?;
                }
            }
        }
    }
}

/// The failing check's log, as `pods/log` serves it for the `logs` command and the page: kwok
/// runs no container, so what the check printed (its termination message, which the verdict
/// quotes: [`FAILED_CHECK_LOG`]) goes into a file kwok serves for every `check` container on
/// cluster-b ([`pod_logs::serve_in_namespace`]; it reads the rule at each request).
async fn serve_failed_check_log(world: &World<Direct>) -> Result<()> {
    let file = LogFile::create(world.b.dir().join("container-logs").join("check.log"))?;
    file.append(FAILED_CHECK_LOG.lines())?;
    let client = world.b.client().await?;
    pod_logs::serve_in_namespace(&client, "demo", None, &[("check", &file)]).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instructions() -> Instructions {
        Instructions {
            url: "https://127.0.0.1:40123".into(),
            port: 40123,
            failing_run: "prod.01jdemo.9811bd0".into(),
            token: "/r/target/demo/token".into(),
            ca: "/r/target/demo/api-ca.crt".into(),
            kubeconfig: "/r/target/demo/kubeconfig".into(),
            kubectl: "/c/kubectl".into(),
            dispatch: "/r/target/debug/rollouts-dispatch".into(),
            pid: 77,
        }
    }

    #[test]
    fn the_block_names_the_page_the_logs_command_kubectl_and_how_to_stop() {
        let lines = instructions().lines();
        assert!(lines.iter().all(|l| l.starts_with("demo: ")), "{lines:#?}");
        let text = lines.join("\n");
        for want in [
            "demo: the page:  https://localhost:40123/ui\n",
            "https://localhost:40123/ui/runs/kargo-demo/prod.01jdemo.9811bd0",
            "demo:   /r/target/debug/rollouts-dispatch logs prod.01jdemo.9811bd0 -n kargo-demo \
             --server https://127.0.0.1:40123 --ca-file /r/target/demo/api-ca.crt \
             --token-file /r/target/demo/token\n",
            "demo:   /c/kubectl --kubeconfig /r/target/demo/kubeconfig get analysisruns -A\n",
            "(project kargo-demo, valid 8h)",
            "`make demo-down` from another terminal (ends pid 77 and its clusters, removes \
             /r/target/demo)",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn keep_is_asked_by_any_value_but_unset_empty_and_0() {
        for (value, want) in [
            (Some("1"), true),
            (Some("yes"), true),
            (Some("0"), false),
            (Some(""), false),
            (None, false),
        ] {
            assert_eq!(asks(value), want, "{KEEP_ENV}={value:?}");
        }
    }

    #[test]
    fn a_state_dir_left_by_a_dead_demo_is_taken_and_removed_on_drop() {
        let dir = std::env::temp_dir().join(format!("kept-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A pid that is no demo: this test's own binary is `dispatch_tests-…`.
        std::fs::write(dir.join("pid"), "1\n").unwrap();
        std::fs::write(dir.join("token"), "stale").unwrap();
        let state = StateDir::claim_at(&dir).unwrap();
        assert!(!dir.join("token").exists());
        let pid = std::fs::read_to_string(dir.join("pid")).unwrap();
        assert_eq!(pid.trim(), std::process::id().to_string());
        drop(state);
        assert!(!dir.exists());
    }
}
