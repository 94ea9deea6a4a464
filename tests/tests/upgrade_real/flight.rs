//! Runs in flight across a release change, and what the upgrade test checks around them: the
//! planned verdict of each, that it was still running when the change was done, one Job per run,
//! nothing left once the runs are deleted, the CRDs kept; and the steps a user takes that are not `helm`
//! itself (the docs' CRD step, the controller's plugin image).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use dispatch_tests::analysis::{self, is_finished};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::invariants::{list_managed, wait_terminal, JobWatch};
use dispatch_tests::kargo::Freight;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

use crate::{agent, examples, install};

/// How long each check's container sleeps before its verdict: longer than a `helm upgrade
/// --wait` of the server and then of the agent, so that both happen while the runs are in flight.
const CHECK_SLEEPS: Duration = Duration::from_secs(90);
/// From a run's creation to its verdict, at most: the sleep, pulls, the releases rolling, the
/// controller's resume interval.
const VERDICT_BOUND: Duration = Duration::from_secs(420);
/// The CRDs of the chart.
const CRDS: [&str; 2] = [
    "dispatchjobs.rollouts-dispatch.io",
    "dispatchlogrequests.rollouts-dispatch.io",
];

/// One run in flight.
pub(crate) struct Flight {
    name: String,
    uid: String,
    destination: &'static str,
    planned: &'static str,
}

/// The runs of the test and every Job of ours seen.
pub(crate) struct Flights {
    runs: Api<DynamicObject>,
    freight: Freight,
    jobs: JobWatch,
    uids: Vec<String>,
    names: Vec<String>,
}

impl Flights {
    pub(crate) fn new(runs: Api<DynamicObject>, freight: Freight, jobs: JobWatch) -> Self {
        Self {
            runs,
            freight,
            jobs,
            uids: Vec::new(),
            names: Vec::new(),
        }
    }

    /// Creates four runs of phase `phase` (a passing and a failing check on the direct and on
    /// the agent's destination) and waits until each has its Job: they are in flight.
    pub(crate) async fn launch(&mut self, phase: u8) -> Result<Vec<Flight>> {
        let mut flights = Vec::new();
        for (i, (destination, stage, passes)) in [
            ("in-cluster", "uat", true),
            ("in-cluster", "uat", false),
            (agent::EDGE, "edge", true),
            (agent::EDGE, "edge", false),
        ]
        .into_iter()
        .enumerate()
        {
            let ulid = format!("01jupg{phase}{i:019}");
            let run = examples::run_from(
                &slow_smoke(passes)?,
                &self.freight,
                stage,
                &ulid,
                &[("destination", destination)],
            )?;
            let created = self.runs.create(&PostParams::default(), &run).await?;
            let uid = created
                .metadata
                .uid
                .clone()
                .context("a created run has a uid")?;
            self.uids.push(uid.clone());
            self.names.push(analysis::name(&created).to_owned());
            flights.push(Flight {
                name: analysis::name(&created).to_owned(),
                uid,
                destination,
                planned: if passes { "Successful" } else { "Failed" },
            });
        }
        let deadline = Instant::now() + Duration::from_secs(180);
        for f in &flights {
            while self.jobs.jobs_of("real", &f.uid) == 0 {
                ensure!(
                    Instant::now() < deadline,
                    "run {} on {} has no Job after 3 minutes",
                    f.name,
                    f.destination
                );
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        println!(
            "upgrade: phase {phase}: {} runs in flight, each with its Job",
            flights.len()
        );
        Ok(flights)
    }

    /// How many of `flights` were still running now (the release change done) and then ended
    /// with their planned verdict; prints each.
    pub(crate) async fn land(&self, flights: &[Flight], what: &str) -> Result<usize> {
        let mut in_flight = Vec::new();
        for f in flights {
            in_flight.push(!is_finished(&self.runs.get(&f.name).await?));
        }
        let bounds: Vec<(String, Instant, Duration)> = flights
            .iter()
            .map(|f| (f.name.clone(), Instant::now(), VERDICT_BOUND))
            .collect();
        let last = wait_terminal(&self.runs, &bounds).await?;
        let mut right = 0;
        for ((f, run), was_in_flight) in flights.iter().zip(&last).zip(in_flight) {
            let phase = analysis::phase(run);
            let ok = was_in_flight && phase == f.planned;
            right += usize::from(ok);
            println!(
                "upgrade: {what}: {} on {}: {phase} (planned {}, in flight when done: {was_in_flight}){}",
                f.name,
                f.destination,
                f.planned,
                if ok {
                    String::new()
                } else {
                    format!(": {}", analysis::all_messages(run))
                }
            );
        }
        Ok(right)
    }

    /// Deletes every run of the test: their Jobs are then the sweep's to delete.
    pub(crate) async fn delete_runs(&self) -> Result<()> {
        for name in &self.names {
            self.runs
                .delete(name, &kube::api::DeleteParams::default())
                .await?;
        }
        Ok(())
    }

    /// Jobs beyond one per run of the test, and Jobs of no run of the test.
    pub(crate) fn duplicate_jobs(&self) -> usize {
        let seen = self.jobs.seen();
        let strays = seen
            .iter()
            .filter(|s| !self.uids.contains(&s.run_uid))
            .inspect(|s| println!("upgrade: job {} belongs to no run of the test", s.name))
            .count();
        let extra: usize = self
            .uids
            .iter()
            .map(|uid| self.jobs.jobs_of("real", uid).saturating_sub(1))
            .sum();
        strays + extra
    }
}

/// smoke.yaml whose check sleeps [`CHECK_SLEEPS`] first, then passes (`curl` of my-app, as
/// written) or fails (`exit 1`).
fn slow_smoke(passes: bool) -> Result<Value> {
    let mut template = examples::template("smoke.yaml")?;
    let container = &mut template["spec"]["metrics"][0]["provider"]["plugin"]
        ["rollouts-dispatch/job"]["spec"]["template"]["spec"]["containers"][0];
    let written = container["command"][2]
        .as_str()
        .context("smoke.yaml's check is `sh -c <script>`")?
        .to_owned();
    let check = if passes { written.as_str() } else { "exit 1" };
    container["command"] = json!([
        "sh",
        "-c",
        format!("sleep {}; {check}", CHECK_SLEEPS.as_secs())
    ]);
    Ok(template)
}

/// Runs docs/upgrading.md's one-time step for a release installed with a chart that had `crds/`
/// as written there (its first `sh` block that labels CRDs), with the cluster's kubectl.
pub(crate) fn run_upgrading_doc_crd_step(cluster: &Cluster) -> Result<()> {
    let doc = std::fs::read_to_string(install::workspace().join("docs/upgrading.md"))?;
    let block = sh_blocks(&doc)
        .into_iter()
        .find(|b| b.contains("kubectl label crd"))
        .context("docs/upgrading.md has no sh block that labels the CRDs")?;
    let kubectl_dir = cluster
        .binaries
        .kubectl
        .parent()
        .context("kubectl's directory")?;
    let path = format!(
        "{}:{}",
        kubectl_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .env("PATH", path)
        .env("KUBECONFIG", &cluster.kubeconfig)
        .output()?;
    ensure!(
        out.status.success(),
        "docs/upgrading.md's CRD step failed: {}\n{block}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("upgrade: docs/upgrading.md's CRD step ran as written:\n{block}");
    Ok(())
}

/// The ```sh blocks of a Markdown text, each without the indentation of its fence.
fn sh_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<(usize, Vec<&str>)> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None if trimmed == "```sh" => open = Some((indent, Vec::new())),
            Some((fence, lines)) if trimmed == "```" => {
                let text: Vec<&str> = lines
                    .iter()
                    .map(|l| l.get(*fence..).unwrap_or(l.trim_start()))
                    .collect();
                blocks.push(text.join("\n"));
                open = None;
            }
            Some((_, lines)) => lines.push(line),
            None => {}
        }
    }
    blocks
}

/// Waits until Deployment `namespace/name` runs `image` and is available.
pub(crate) async fn expect_image(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    image: &str,
) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(cluster.client().await?, namespace);
    let d = deployments.get(name).await?;
    let running = d
        .spec
        .template
        .spec
        .and_then(|p| p.containers.first().and_then(|c| c.image.clone()))
        .unwrap_or_default();
    ensure!(
        running == image,
        "deployment {namespace}/{name} runs {running}, not {image}"
    );
    install::wait_available(cluster, namespace, name, Duration::from_secs(120)).await
}

/// Whether both CRDs exist and carry the chart's `helm.sh/resource-policy: keep`.
pub(crate) async fn crds_kept(client: &kube::Client) -> Result<bool> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in CRDS {
        let Some(crd) = crds.get_opt(name).await? else {
            println!("upgrade: CRD {name} is gone");
            return Ok(false);
        };
        let keep = crd
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/resource-policy"))
            .is_some_and(|p| p == "keep");
        if !keep {
            println!("upgrade: CRD {name} has no keep policy");
            return Ok(false);
        }
    }
    Ok(true)
}

/// How many Jobs of ours remain after waiting up to `timeout` for the sweep.
pub(crate) async fn leftover_jobs(client: &kube::Client, timeout: Duration) -> Result<usize> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = list_managed(client).await?;
        if left.is_empty() || Instant::now() >= deadline {
            for j in &left {
                println!(
                    "upgrade: job {}/{} left",
                    j.metadata.namespace.as_deref().unwrap_or_default(),
                    j.metadata.name.as_deref().unwrap_or_default()
                );
            }
            return Ok(left.len());
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indented_sh_blocks_lose_their_fence_indentation() {
        let doc = "text\n   ```sh\n   for a in b; do\n     echo $a\n   done\n   ```\n```yaml\nx: 1\n```\n";
        assert_eq!(sh_blocks(doc), vec!["for a in b; do\n  echo $a\ndone"]);
    }

    #[test]
    fn the_failing_check_fails_and_the_passing_one_is_smoke_yamls() -> Result<()> {
        let pass = slow_smoke(true)?;
        let fail = slow_smoke(false)?;
        let script = |t: &Value| {
            t["spec"]["metrics"][0]["provider"]["plugin"]["rollouts-dispatch/job"]["spec"]
                ["template"]["spec"]["containers"][0]["command"][2]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        };
        assert!(script(&pass).starts_with("sleep 90; curl -fsS"));
        assert_eq!(script(&fail), "sleep 90; exit 1");
        Ok(())
    }
}
