//! The faults' scene ([`Scene::start`]): the agent World with a balanced front, its three links
//! (agent → front, server → cluster-a as `cluster-a-slow`, server → control plane), and what
//! every scenario does with a verification: [`Scene::submit`] and [`Scene::conclude`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dispatch_tests::admin::wait_ready;
use dispatch_tests::analysis::{self, all_messages, is_finished, phase};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::invariants::{fault_server_config, wait_terminal, JobWatch, Outcome};
use dispatch_tests::kargo::Verification;
use dispatch_tests::netfault::Link;
use dispatch_tests::world::agents::{Agents, ConfigVariant, Front};
use dispatch_tests::world::World;
use kube::api::DynamicObject;

use super::{DEADLINE, GRACE, RETENTION, SWEEP_EVERY};

/// The destination that is cluster-a reached through [`Scene::a_link`].
pub(crate) const SLOW: &str = "cluster-a-slow";

/// Everything the scenarios share.
pub(crate) struct Scene {
    pub(crate) w: World<Agents>,
    /// Every Job of ours seen on a, b and control.
    pub(crate) watch: JobWatch,
    /// The servers' config with [`SLOW`] (the base every restart goes back to).
    pub(crate) base_config: PathBuf,
    /// B's agent → the front.
    pub(crate) agent_link: Link,
    /// The servers → cluster-a's API server ([`SLOW`]).
    pub(crate) a_link: Link,
    /// A replica → the control plane's API server (used by one scenario's config).
    pub(crate) control_link: Link,
    /// cluster-a's kubeconfig through [`Scene::a_link`].
    pub(crate) slow_kubeconfig: PathBuf,
    /// The admin port of B's agent now.
    pub(crate) agent_admin: u16,
    /// Run UIDs of Jobs a scenario made itself (not verifications).
    pub(crate) scene_runs: Vec<String>,
    /// Runs that ended in another phase than planned.
    pub(crate) lost_verdicts: usize,
    /// When the last scenario ended.
    pub(crate) last_terminal: Instant,
    next: usize,
}

/// A verification submitted: its run, where its Jobs go (the cluster, for the Job watch), and
/// the verdict planned.
pub(crate) struct Submitted {
    pub(crate) name: String,
    pub(crate) uid: String,
    pub(crate) created: Instant,
    pub(crate) cluster: &'static str,
    pub(crate) want: &'static str,
}

/// The loopback address of an `https://127.0.0.1:<port>` URL.
pub(crate) fn loopback(url: &str) -> Result<SocketAddr> {
    let port: u16 = url
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in {url}"))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// A copy of `cluster`'s admin kubeconfig reaching its API server at `url` instead, at `path`.
pub(crate) fn kubeconfig_via(cluster: &Cluster, url: &str, path: PathBuf) -> Result<PathBuf> {
    let text = std::fs::read_to_string(&cluster.kubeconfig)?;
    std::fs::write(
        &path,
        text.replace(
            &format!("server: {}", cluster.server),
            &format!("server: {url}"),
        ),
    )?;
    Ok(path)
}

impl Scene {
    /// Starts the World and the links; restarts the replicas with [`SLOW`] and B's agent
    /// through its link.
    pub(crate) async fn start() -> Result<Self> {
        let sweep = format!("{}s", SWEEP_EVERY.as_secs());
        let w = World::start_with_agent_front(
            &["--sweep-orphans-every", &sweep],
            &fault_server_config(DEADLINE, GRACE, RETENTION),
            &[],
            Front::Balanced,
        )
        .await?;
        let watch = JobWatch::start(vec![
            ("cluster-a", w.a.client().await?),
            ("cluster-b", w.b.client().await?),
            ("control", w.control.client().await?),
        ]);
        let agent_link = Link::to(loopback(&w.url)?).await?;
        let a_link = Link::to(loopback(&w.a.server)?).await?;
        let control_link = Link::to(loopback(&w.control.server)?).await?;
        let slow_kubeconfig = kubeconfig_via(
            &w.a,
            &a_link.https_url(),
            w.dispatch.dir.join("a-slow.kubeconfig"),
        )?;
        let base_config = w.config_variant(
            "faults.yaml",
            &ConfigVariant {
                destinations: vec![(SLOW.into(), slow_kubeconfig.clone())],
                ..ConfigVariant::default()
            },
        )?;
        let mut s = Self {
            w,
            watch,
            base_config,
            agent_link,
            a_link,
            control_link,
            slow_kubeconfig,
            agent_admin: 0,
            scene_runs: Vec::new(),
            lost_verdicts: 0,
            last_terminal: Instant::now(),
            next: 0,
        };
        s.roll_replicas(&s.base_config.clone()).await?;
        s.respawn_agent(None).await?;
        Ok(s)
    }

    /// Every replica's log so far, one after the other.
    pub(crate) fn replica_logs(&self) -> String {
        self.w
            .dispatch
            .replicas
            .iter()
            .map(|r| std::fs::read_to_string(self.w.control.log_path(&r.name)).unwrap_or_default())
            .collect()
    }

    /// The scene's extra destination ([`SLOW`]), for a [`ConfigVariant`].
    pub(crate) fn slow_destination(&self) -> Vec<(String, PathBuf)> {
        vec![(SLOW.into(), self.slow_kubeconfig.clone())]
    }

    /// Restarts each replica in turn with the config at `config` (as a rolling update does:
    /// the next one only once the previous is ready again).
    pub(crate) async fn roll_replicas(&mut self, config: &std::path::Path) -> Result<()> {
        self.roll_replicas_to(config, None).await
    }

    /// [`Scene::roll_replicas`] to `binary` (another release's; `None`: the workspace's). The
    /// old process gets SIGTERM, as a Pod does, and its successor starts once it is gone.
    pub(crate) async fn roll_replicas_to(
        &mut self,
        config: &std::path::Path,
        binary: Option<&std::path::Path>,
    ) -> Result<()> {
        for i in 0..self.w.dispatch.replicas.len() {
            let name = self.w.dispatch.replicas[i].name.clone();
            // Kubernetes' default terminationGracePeriodSeconds.
            self.w
                .control
                .terminate_process(&name, Duration::from_secs(30))?;
            self.w.restart_replica_binary(i, config, binary).await?;
        }
        Ok(())
    }

    /// Restarts B's agent through its link, with the workspace's binary or `binary`.
    pub(crate) async fn respawn_agent(&mut self, binary: Option<&std::path::Path>) -> Result<()> {
        let _ = self.w.b.kill_process("agent");
        let token = self.w.dispatch.agent_token.clone();
        let url = self.agent_link.https_url();
        self.agent_admin = self.w.spawn_agent_with(binary, "agent", &token, &url)?;
        wait_ready("the agent", self.agent_admin).await
    }

    /// A verification of a stage of its own on `destination`: the check exits `exit` after
    /// `runs_for`.
    pub(crate) fn verification(
        &mut self,
        destination: &str,
        exit: i32,
        runs_for: &str,
    ) -> Verification {
        self.next += 1;
        Verification::new(
            &format!("fault-{:02}", self.next),
            &format!("01jfaults{:017}", self.next),
            destination,
        )
        .exits(exit)
        .runs_for(runs_for)
    }

    /// Submits `v`, whose Jobs land on `cluster`.
    pub(crate) async fn submit(
        &self,
        v: &Verification,
        cluster: &'static str,
    ) -> Result<Submitted> {
        let run = self.w.submit(v).await?;
        let want = planned(v);
        Ok(Submitted {
            name: analysis::name(&run).to_string(),
            uid: analysis::uid(&run),
            created: Instant::now(),
            cluster,
            want,
        })
    }

    /// The run once terminal or `bound` after its creation.
    pub(crate) async fn settle(&self, run: &Submitted, bound: Duration) -> Result<DynamicObject> {
        let mut last =
            wait_terminal(&self.w.runs(), &[(run.name.clone(), run.created, bound)]).await?;
        last.pop().context("no run")
    }

    /// The outcome of `run` as last seen (`last`).
    pub(crate) fn outcome(
        &mut self,
        run: &Submitted,
        last: &DynamicObject,
        checks_held: bool,
        detail: String,
    ) -> Outcome {
        let ended = phase(last);
        let stuck = !is_finished(last);
        if !stuck && ended != run.want {
            self.lost_verdicts += 1;
        }
        Outcome {
            name: run.name.clone(),
            uid: run.uid.clone(),
            destination: run.cluster,
            correct: ended == run.want && checks_held,
            stuck,
            detail: format!(
                "{ended} (want {}) in {}s; {detail}; {}",
                run.want,
                run.created.elapsed().as_secs(),
                all_messages(last)
            ),
        }
    }
}

/// The verdict `v` is planned to end with.
fn planned(v: &Verification) -> &'static str {
    if v.exit_code() == 0 {
        "Successful"
    } else {
        "Failed"
    }
}
