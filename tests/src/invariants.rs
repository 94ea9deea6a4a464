//! The invariants every fault test asserts (`make chaos`, `make faults`): each verification's
//! [`Outcome`] (its verdict and whether it ended within its bound), every Job of ours seen on any
//! cluster during the test ([`JobWatch`]) and from it the duplicates ([`duplicate_jobs`]): one
//! Job per measurement, on its run's destination only.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DynamicObject, ListParams};

use crate::analysis::is_finished;
use crate::cluster::Cluster;
use crate::objects::RUN_UID_LABEL;

/// The servers' extra config of a fault test: the deadline of a block without
/// `activeDeadline`, its grace and `jobs.retention`, short enough for a test to wait out.
pub fn fault_server_config(deadline: Duration, grace: Duration, retention: Duration) -> String {
    format!(
        "engine:\n  measurementDeadline: {}s\n  deadlineGrace: {}s\njobs:\n  retention: {}s\n",
        deadline.as_secs(),
        grace.as_secs(),
        retention.as_secs()
    )
}

/// The Jobs of ours (label `rollouts-dispatch.io/managed=true`) on `cluster`, any namespace.
pub async fn managed_jobs(cluster: &Cluster) -> Result<Vec<Job>> {
    list_managed(&cluster.client().await?).await
}

/// [`managed_jobs`] through `client`.
pub async fn list_managed(client: &kube::Client) -> Result<Vec<Job>> {
    let api: Api<Job> = Api::all(client.clone());
    Ok(api
        .list(&ListParams::default().labels("rollouts-dispatch.io/managed=true"))
        .await?
        .items)
}

/// One Job the watch saw: its cluster, name and run UID label.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The cluster it was on.
    pub cluster: &'static str,
    /// Its name.
    pub name: String,
    /// Its run UID label.
    pub run_uid: String,
}

/// Every Job of ours seen on any cluster during the test, by Job UID: a metadata watch per
/// cluster (it lists again after an API server outage, with kube's backoff), so that Jobs the
/// retention removes still count, a Job deleted and created again under the same name shows as
/// two, and 10 000 Jobs on a destination cost one list, not one a second.
#[derive(Clone, Default)]
pub struct JobWatch(Arc<Mutex<BTreeMap<String, Seen>>>);

impl JobWatch {
    /// Starts watching `clusters` (name, client), until the process ends.
    pub fn start(clusters: Vec<(&'static str, kube::Client)>) -> Self {
        use futures::StreamExt;
        use kube::api::PartialObjectMeta;
        use kube::runtime::watcher::{self, Event};
        use kube::runtime::WatchStreamExt;
        let watch = Self::default();
        for (cluster, client) in clusters {
            let seen = watch.0.clone();
            let jobs: Api<PartialObjectMeta<Job>> = Api::all(client);
            let config = watcher::Config::default().labels("rollouts-dispatch.io/managed=true");
            tokio::spawn(async move {
                let mut events = watcher::watcher(jobs, config).default_backoff().boxed();
                while let Some(event) = events.next().await {
                    let (Ok(Event::Apply(j)) | Ok(Event::InitApply(j))) = event else {
                        continue;
                    };
                    let uid = j.metadata.uid.clone().unwrap_or_default();
                    let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
                    seen.entry(uid).or_insert_with(|| Seen {
                        cluster,
                        name: j.metadata.name.clone().unwrap_or_default(),
                        run_uid: j
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(RUN_UID_LABEL))
                            .cloned()
                            .unwrap_or_default(),
                    });
                }
            });
        }
        watch
    }

    /// The Jobs seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// How many Jobs of run `run_uid` were seen on `cluster`.
    pub fn jobs_of(&self, cluster: &str, run_uid: &str) -> usize {
        self.seen()
            .iter()
            .filter(|s| s.cluster == cluster && s.run_uid == run_uid)
            .count()
    }
}

/// What one verification came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// the AnalysisRun's name
    pub name: String,
    /// its UID
    pub uid: String,
    /// `cluster-a` or `cluster-b`
    pub destination: &'static str,
    /// the verdict and every check of its scenario held
    pub correct: bool,
    /// not terminal within its deadline + grace (+ the test's slack)
    pub stuck: bool,
    /// what it came to, for the report
    pub detail: String,
}

/// Polls the runs `names` until each is terminal or past its own bound (`created + bound`);
/// returns the runs as last seen.
pub async fn wait_terminal(
    runs: &Api<DynamicObject>,
    names: &[(String, Instant, Duration)],
) -> Result<Vec<DynamicObject>> {
    loop {
        let mut last = Vec::new();
        let mut waiting = false;
        for (name, created, bound) in names {
            let run = runs.get(name).await?;
            waiting |= !is_finished(&run) && created.elapsed() < *bound;
            last.push(run);
        }
        if !waiting {
            return Ok(last);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Counts the Jobs in `seen` that break "one Job per measurement, on its run's destination
/// only" for the runs of `outcomes`; a Job of any other run counts too, but for those of
/// `scene_runs` (run UIDs of Jobs the scene made itself). Says why for each in `report`.
pub fn duplicate_jobs(
    outcomes: &[Outcome],
    seen: &[Seen],
    scene_runs: &[&str],
    report: &mut Vec<String>,
) -> usize {
    let destination_of: BTreeMap<&str, &str> = outcomes
        .iter()
        .map(|o| (o.uid.as_str(), o.destination))
        .collect();
    let mut duplicates = 0;
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for s in seen {
        match destination_of.get(s.run_uid.as_str()) {
            None if scene_runs.contains(&s.run_uid.as_str()) => {}
            None => {
                duplicates += 1;
                report.push(format!(
                    "job {} on {} belongs to no run of the test ({})",
                    s.name, s.cluster, s.run_uid
                ));
            }
            Some(d) if *d != s.cluster => {
                duplicates += 1;
                report.push(format!(
                    "job {} on {} belongs to run {} of {d}",
                    s.name, s.cluster, s.run_uid
                ));
            }
            Some(_) if !names.insert(&s.name) => {
                duplicates += 1;
                report.push(format!(
                    "job {} on {} existed more than once",
                    s.name, s.cluster
                ));
            }
            Some(_) => {}
        }
    }
    duplicates
}
