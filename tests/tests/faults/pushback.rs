//! The API servers pushing back: 429s from API Priority and Fairness on a destination and on the
//! control plane ([`dispatch_tests::cluster::throttle`]), watches ending 410 Gone after an etcd
//! compaction and an API server restart, and 10 000 Jobs carrying our label on a destination
//! (listed in pages; none of them ours to delete).

use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Context, Result};
use dispatch_server::watch::EXPIRED_LOG;
use dispatch_tests::cluster::throttle::{self, Resource};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::invariants::Outcome;
use dispatch_tests::objects::RUN_UID_LABEL;
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use dispatch_tests::world::agents::ConfigVariant;

use super::scene::{Scene, Submitted};

/// The destination name under which cluster-a is reached as the throttled user.
const THROTTLED: &str = "cluster-a-throttled";
/// Our requests (every verb, both replicas) for two verifications under throttling that still
/// count as backing off: a storm (a retry every few milliseconds) makes thousands.
const NOT_A_STORM: u64 = 400;

/// What a throttled scenario measured.
struct Throttled {
    ours: throttle::AuditCount,
    load: throttle::LoadStats,
}

impl Throttled {
    fn held(&self) -> bool {
        // The fault happened to us (some of our requests were refused) and we backed off.
        self.ours.throttled > 0 && self.ours.requests <= NOT_A_STORM
    }

    fn detail(&self) -> String {
        format!(
            "ours: {} requests, {} answered 429 (bound {NOT_A_STORM}; by kind {:?}); the load: \
             {} served, {} answered 429, Retry-After seen {:?}",
            self.ours.requests,
            self.ours.throttled,
            self.ours.by_kind,
            self.load.served,
            self.load.throttled,
            self.load.retry_after
        )
    }
}

/// Runs `runs` (destination, cluster) under a rejecting priority level fed by a load of 4
/// tasks: the servers must be configured to reach that cluster as [`throttle::USER`] already.
async fn under_load(
    s: &mut Scene,
    throttling: &throttle::Throttling,
    resource: Resource,
    runs: &[(&str, &'static str, i32)],
) -> Result<(Vec<(Submitted, kube::api::DynamicObject)>, Throttled)> {
    throttling.apply(&[resource]).await?;
    let load = throttling.start_load(4, Duration::from_millis(5)).await?;
    let from = SystemTime::now();
    let mut submitted = Vec::new();
    for (destination, cluster, exit) in runs {
        let v = s.verification(destination, *exit, "5s");
        submitted.push(s.submit(&v, cluster).await?);
    }
    let mut ended = Vec::new();
    for run in submitted {
        let last = s.settle(&run, super::DEADLINE + super::GRACE).await?;
        ended.push((run, last));
    }
    let to = SystemTime::now();
    let load = load.stop().await;
    throttling.remove().await?;
    // The audit log is written asynchronously.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ours = throttling.count("rollouts-dispatch/", from, to)?;
    Ok((ended, Throttled { ours, load }))
}

/// cluster-a reached as a user outside `system:masters` (API Priority and Fairness never
/// throttles those) whose Job requests go to a priority level with no seats of its own that
/// rejects when busy, kept busy by a load: our Job creates, reads and watches meet 429s with a
/// growing Retry-After (1 → 32 s). Two verifications must end with their verdicts, and our
/// request count (the API server's audit log) must show we backed off.
pub(crate) async fn throttled_destination(s: &mut Scene) -> Result<Vec<Outcome>> {
    let throttling = throttle::prepare(&mut s.w.a, &[Resource::jobs()]).await?;
    let mut destinations = s.slow_destination();
    destinations.push((THROTTLED.into(), throttling.kubeconfig.clone()));
    let config = s.w.config_variant(
        "faults-throttled-a.yaml",
        &ConfigVariant {
            destinations,
            ..ConfigVariant::default()
        },
    )?;
    let runs = [(THROTTLED, "cluster-a", 0), (THROTTLED, "cluster-a", 1)];
    rolled_under_load(s, &config, &throttling, Resource::jobs(), &runs).await
}

/// The control plane reached as the throttled user by both replicas, its DispatchJob requests
/// (the agent destination's store) rejected when busy: two verifications on cluster-b must end
/// with their verdicts, and we back off.
pub(crate) async fn throttled_control_plane(s: &mut Scene) -> Result<Vec<Outcome>> {
    let throttling = throttle::prepare(&mut s.w.control, &[Resource::dispatchjobs()]).await?;
    let config = s.w.config_variant(
        "faults-throttled-control.yaml",
        &ConfigVariant {
            control_kubeconfig: Some(throttling.kubeconfig.clone()),
            destinations: s.slow_destination(),
            ..ConfigVariant::default()
        },
    )?;
    let runs = [("cluster-b", "cluster-b", 0), ("cluster-b", "cluster-b", 1)];
    rolled_under_load(s, &config, &throttling, Resource::dispatchjobs(), &runs).await
}

/// The replicas rolled to `config`, [`under_load`], rolled back to the scene's config; the
/// outcomes.
async fn rolled_under_load(
    s: &mut Scene,
    config: &std::path::Path,
    throttling: &throttle::Throttling,
    resource: Resource,
    runs: &[(&str, &'static str, i32)],
) -> Result<Vec<Outcome>> {
    s.roll_replicas(config).await?;
    let result = under_load(s, throttling, resource, runs).await;
    let base = s.base_config.clone();
    s.roll_replicas(&base).await?;
    let (ended, measured) = result?;
    Ok(ended
        .iter()
        .map(|(run, last)| s.outcome(run, last, measured.held(), measured.detail()))
        .collect())
}

/// etcd's current revision, then a physical compaction at it, through etcd's JSON gateway
/// (`/v3/kv/range`, `/v3/kv/compaction`): every older revision is gone.
async fn compact_etcd(cluster: &Cluster) -> Result<i64> {
    let base = format!("http://127.0.0.1:{}", cluster.ports.etcd_client);
    let http = reqwest::Client::new();
    let range: serde_json::Value = http
        .post(format!("{base}/v3/kv/range"))
        .json(&json!({"key": "Lw==", "limit": 1}))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let revision: i64 = range
        .pointer("/header/revision")
        .and_then(|r| r.as_str().and_then(|s| s.parse().ok()).or(r.as_i64()))
        .context("etcd's revision")?;
    http.post(format!("{base}/v3/kv/compaction"))
        .json(&json!({"revision": revision.to_string(), "physical": true}))
        .send()
        .await?
        .error_for_status()?;
    Ok(revision)
}

/// The PIDs of the server replicas now.
fn replica_pids(s: &Scene) -> Vec<Option<u32>> {
    s.w.dispatch
        .replicas
        .iter()
        .map(|r| s.w.control.pid(&r.name))
        .collect()
}

/// While a run's Job runs on cluster-a, etcd is compacted at its current revision and the API
/// server restarted (down 10 s): the servers' watches come back with a resourceVersion the new
/// API server no longer serves, so they end 410 Gone and must list again, not crash or loop.
/// The Job ends after the restart: the verdict must come from the relisted cache.
pub(crate) async fn watch_gone_after_compaction(s: &mut Scene) -> Result<Vec<Outcome>> {
    let pids = replica_pids(s);
    let v = s.verification("cluster-a", 0, "25s");
    let run = s.submit(&v, "cluster-a").await?;
    let uid = run.uid.clone();
    let a = &s.w.a;
    let started = dispatch_tests::wait::eventually(
        "the run's Job on cluster-a",
        Duration::from_secs(120),
        || async { Ok(!dispatch_tests::objects::jobs_of(a, &uid).await?.is_empty()) },
    )
    .await
    .is_ok();
    let revision = compact_etcd(&s.w.a).await?;
    s.w.a.restart_apiserver(Duration::from_secs(10)).await?;
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await?;
    let same_processes = replica_pids(s) == pids;
    let relisted = s.replica_logs().contains(EXPIRED_LOG);
    Ok(vec![s.outcome(
        &run,
        &last,
        started && same_processes && relisted,
        format!(
            "compacted at revision {revision}; Job before: {started}; replicas not restarted: \
             {same_processes}; a replica logged {EXPIRED_LOG:?}: {relisted}"
        ),
    )])
}

/// How many Jobs [`ten_thousand_jobs`] makes.
const MANY: usize = 10_000;

/// 10 000 Jobs on cluster-a carrying `rollouts-dispatch.io/managed=true` and a run UID no run
/// has (as a tenant could write them, or another installation): suspended, so no pod runs. The
/// replicas are rolled, so each lists them from scratch (in pages: the watcher's list is
/// paginated). Checks: the replicas come back ready, a verification on cluster-a ends with its
/// verdict, and not one of the 10 000 is deleted (none carries this server's mark), after two
/// sweeps. The scene then deletes them itself.
pub(crate) async fn ten_thousand_jobs(s: &mut Scene) -> Result<Vec<Outcome>> {
    let foreign_uid = "f0f0f0f0-0000-4000-8000-000000010000";
    s.scene_runs.push(foreign_uid.to_string());
    let jobs: Api<Job> = Api::namespaced(s.w.a.client().await?, "default");
    let made = Instant::now();
    let created = futures::stream::iter(0..MANY)
        .map(|i| {
            let jobs = jobs.clone();
            async move {
                let job: Job = serde_json::from_value(json!({
                    "metadata": {
                        "name": format!("foreign-{i:05}"),
                        "labels": {
                            "rollouts-dispatch.io/managed": "true",
                            RUN_UID_LABEL: foreign_uid,
                        },
                    },
                    "spec": {
                        "suspend": true,
                        "template": {"spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "c", "image": "busybox"}],
                        }},
                    },
                }))?;
                jobs.create(&PostParams::default(), &job).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(32)
        .filter(|r| std::future::ready(r.is_ok()))
        .count()
        .await;
    ensure!(created == MANY, "created {created} of {MANY} Jobs");
    let made_in = made.elapsed();
    // kube-controller-manager's Job controller takes each of them in turn (it marks them
    // Suspended): a Job of ours created meanwhile waits behind them for its pod, which is the
    // cluster's time, not ours; so the verification starts once it is done.
    let selector = format!("{RUN_UID_LABEL}={foreign_uid}");
    let settled = dispatch_tests::wait::eventually(
        "the Job controller through the 10 000 Jobs",
        Duration::from_secs(600),
        || {
            let (jobs, selector) = (jobs.clone(), selector.clone());
            async move {
                let listed = jobs.list(&ListParams::default().labels(&selector)).await?;
                let suspended = listed
                    .items
                    .iter()
                    .filter(|j| {
                        j.status
                            .as_ref()
                            .and_then(|s| s.conditions.as_ref())
                            .is_some_and(|c| c.iter().any(|c| c.type_ == "Suspended"))
                    })
                    .count();
                tokio::time::sleep(Duration::from_secs(5)).await;
                Ok(suspended == MANY)
            }
        },
    )
    .await
    .is_ok();
    let rolled = Instant::now();
    let base = s.base_config.clone();
    s.roll_replicas(&base).await?;
    let ready_in = rolled.elapsed();
    let v = s.verification("cluster-a", 1, "3s");
    let run = s.submit(&v, "cluster-a").await?;
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await?;
    // Two sweeps after the verdict.
    tokio::time::sleep(2 * super::SWEEP_EVERY + Duration::from_secs(2)).await;
    let kept = jobs
        .list_metadata(&ListParams::default().labels(&selector))
        .await?
        .items
        .len();
    jobs.delete_collection(
        &DeleteParams::background(),
        &ListParams::default().labels(&selector),
    )
    .await?;
    Ok(vec![s.outcome(
        &run,
        &last,
        kept == MANY,
        format!(
            "{MANY} Jobs made in {}s (the Job controller through them: {settled}); replicas \
             rolled and ready in {}s; {kept} of them kept after two sweeps",
            made_in.as_secs(),
            ready_in.as_secs()
        ),
    )])
}
