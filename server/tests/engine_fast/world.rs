//! The scene of a fast engine test: fake API servers for destinations `a` and `b` and for the
//! control plane, an [`Engine`] started from a real configuration file pointing at them, and the
//! measurement requests and waits that every test needs.
//!
//! Each test builds its own world on its own runtime, so tests share nothing and run in parallel.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use dispatch_api::JobConfig;
use dispatch_server::config::ServerConfig;
use dispatch_server::destinations::{Destination, Entry};
use dispatch_server::engine::{Engine, JobRef, MeasureRequest};
use dispatch_server::job::{self, RunContext};
use dispatch_server::logs::Redactor;
use dispatch_server::podsecurity;
use dispatch_server::signing::Signer;
use dispatch_server::verdict::Verdict;
use serde_json::{json, Value};

use crate::fake_api::FakeApi;

/// The default namespace of Jobs on `a` and `b`.
pub(crate) const NS: &str = "verify";
/// The Kargo project (AnalysisRun namespace) of the runs.
pub(crate) const PROJECT: &str = "team-a";
/// Bound on every wait: the fake answers in microseconds, so this only trips on a bug.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// The fake clusters, before an engine is started on them (a test may script them first).
#[derive(Debug)]
pub(crate) struct Clusters {
    pub(crate) a: FakeApi,
    pub(crate) b: FakeApi,
    pub(crate) cp: FakeApi,
}

impl Clusters {
    pub(crate) async fn start() -> Result<Self> {
        Ok(Self {
            a: FakeApi::start().await?,
            b: FakeApi::start().await?,
            cp: FakeApi::start().await?,
        })
    }

    /// The configuration file: `a` (labels env=prod, region=eu) and `b` (env=prod, region=us)
    /// by server URL and token, then `more_destinations` (YAML list items), the control plane
    /// likewise, short timeouts, plus `extra` top-level keys. The policy denies by default, so a
    /// test that does not bring its own `policy:` in `extra` runs with `policy: {allowAll: true}`
    /// (one that wants no policy block at all says so in a comment: `# no policy: …`).
    pub(crate) fn config(&self, more_destinations: &str, extra: &str) -> String {
        let policy = if extra.contains("policy:") {
            ""
        } else {
            "policy: {allowAll: true}"
        };
        format!(
            r#"
controlPlane: {{server: "{cp}", token: cp-token}}
destinations:
- {{name: a, server: "{a}", token: a-token, namespace: {NS}, labels: {{env: prod, region: eu}}}}
- {{name: b, server: "{b}", token: b-token, namespace: {NS}, labels: {{env: prod, region: us}}}}
{more_destinations}
engine: {{connectTimeout: 2s, requestTimeout: 3s, cacheWait: 3s, logTimeout: 3s}}
{policy}
{extra}
"#,
            cp = self.cp.url(),
            a = self.a.url(),
            b = self.b.url(),
        )
    }

    /// Starts an engine on [`Clusters::config`] and waits for its caches when `synced`.
    pub(crate) async fn engine(
        self,
        more_destinations: &str,
        extra: &str,
        synced: bool,
    ) -> Result<World> {
        let yaml = self.config(more_destinations, extra);
        let config = ServerConfig::parse(&yaml, "config file engine-fast.yaml")
            .map_err(|e| anyhow!("{e}"))?;
        let engine = Engine::start(config).await.context("starting the engine")?;
        engine.mark_jobs_with(std::sync::Arc::new(Signer::new(&[MARK_KEY.to_vec()])?));
        if synced {
            let unsynced = engine.wait_synced(WAIT).await;
            ensure!(unsynced.is_empty(), "caches not synced: {unsynced:?}");
        }
        Ok(World {
            engine,
            clusters: self,
        })
    }
}

/// The Job mark key of the engines here, shared like replicas share theirs.
pub(crate) const MARK_KEY: &[u8] = b"engine-fast-mark-key-0123456789abcdef";

/// Job `metric`/1 of `req` as an engine with [`MARK_KEY`] (another replica) creates it on `a`.
pub(crate) fn as_another_replica_builds_it(
    w: &World,
    req: &MeasureRequest,
) -> Result<serde_json::Value> {
    let mut job = job::build(&job::JobInput {
        run: &req.run,
        metric: &req.metric,
        measurement: req.measurement,
        config: &req.config,
        destination: "a",
        namespace: NS,
    })?;
    let profile = w.engine.policy().profile(&req.run.namespace, "a", NS);
    podsecurity::enforce(
        &mut job,
        &profile,
        &podsecurity::our_labels(&req.run.uid, "a"),
    )?;
    job::mark::stamp(&mut job, &Signer::new(&[MARK_KEY.to_vec()])?, &req.run.uid);
    Ok(job)
}

/// An engine on fake clusters.
#[derive(Debug)]
pub(crate) struct World {
    pub(crate) engine: Engine,
    pub(crate) clusters: Clusters,
}

impl World {
    /// Fake clusters and a synced engine with the default configuration plus `extra`.
    pub(crate) async fn start(extra: &str) -> Result<Self> {
        Clusters::start().await?.engine("", extra, true).await
    }

    /// The fake API of destination `a` or `b`.
    pub(crate) fn api(&self, destination: &str) -> &FakeApi {
        match destination {
            "a" => &self.clusters.a,
            "b" => &self.clusters.b,
            other => panic!("no fake cluster {other:?}"),
        }
    }

    /// The engine's destination called `name`.
    pub(crate) fn destination(&self, name: &str) -> Result<std::sync::Arc<Destination>> {
        match self.engine.registry().get(name) {
            Some(Entry::Ready(d)) => Ok(d),
            other => bail!("destination {name} is not ready: {other:?}"),
        }
    }

    /// Waits until the engine's Job cache of `destination` shows `NS/name` (or, when
    /// `present` is false, no longer shows it).
    pub(crate) async fn cached(&self, destination: &str, name: &str, present: bool) -> Result<()> {
        let d = self.destination(destination)?;
        eventually(
            &format!("job {name} cached={present} on {destination}"),
            || {
                let seen = d.jobs().get(NS, name).is_some();
                async move { Ok((seen == present).then_some(())) }
            },
        )
        .await
    }

    /// Polls the engine's verdict until `done` holds, for at most [`WAIT`].
    pub(crate) async fn verdict(
        &self,
        job: &JobRef,
        secrets: &Redactor,
        done: impl Fn(&Verdict) -> bool,
    ) -> Result<Verdict> {
        let deadline = Instant::now() + WAIT;
        loop {
            let v = self.engine.status(job, secrets).await;
            if done(&v) {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!(
                    "verdict of {} not reached within {WAIT:?}; last: {} {:?}",
                    job.name,
                    v.phase,
                    v.message
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Polls `check` every few milliseconds until it returns `Ok(Some(_))`, for at most [`WAIT`].
pub(crate) async fn eventually<T, F, Fut>(what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("{what}: not reached within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The freight collection id of the runs: the hex SHA-1 of the collection's Freight names, as
/// Kargo computes it (akuity/kargo v1.11.2 api/v1alpha1/stage_types.go:591-604), the same as
/// `dispatch_tests::kargo::FREIGHT_COLLECTION_ID`.
pub(crate) const FREIGHT_COLLECTION: &str = "9811bd09b08335806fcd42b7646ad27d9571fd27";
/// The Promotion of the runs' first verification, named as Kargo names it:
/// `<stage>.<ulid>.<first 7 characters of the Freight's name>` (pkg/api/promotion.go:91-120).
pub(crate) const PROMOTION: &str = "uat.01jq0p3n9m6x2w8r4t7v5s1kza.abc1234";

/// A run of [`PROJECT`] created by Kargo v1.11 for the first verification of Stage `uat`
/// (`<stage>.<ulid>.<first 7 characters of the freight collection id>`, the stage and
/// freight-collection labels, the promotion annotation: regular_stages.go:1494-1499,1540-1546);
/// `n` makes its name and UID unique in a test.
pub(crate) fn run(n: u32) -> RunContext {
    let uid = format!("0000{n:04x}-aaaa-4bbb-8ccc-000000000001");
    let mut run = RunContext {
        name: format!(
            "uat.01jq0p3n9m6x2w8r4t7v{n:06x}.{}",
            &FREIGHT_COLLECTION[..7]
        ),
        namespace: PROJECT.to_string(),
        uid,
        ..RunContext::default()
    };
    run.labels
        .insert("kargo.akuity.io/stage".into(), "uat".into());
    run.labels.insert(
        "kargo.akuity.io/freight-collection".into(),
        FREIGHT_COLLECTION.into(),
    );
    run.annotations
        .insert("kargo.akuity.io/promotion".into(), PROMOTION.into());
    run
}

/// A plugin block: `routing` (destination, require, logTail…) plus a Job with one container
/// `check` that sets `ANALYSIS_METRIC` itself (the engine must not overwrite it).
pub(crate) fn block(routing: Value) -> Result<JobConfig> {
    let mut b = json!({
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "check",
                    "image": "example.invalid/check:1",
                    "env": [{"name": "ANALYSIS_METRIC", "value": "set-by-user"}]
                }]
            }}
        }
    });
    if let (Some(o), Some(r)) = (b.as_object_mut(), routing.as_object()) {
        for (k, v) in r {
            o.insert(k.clone(), v.clone());
        }
    }
    JobConfig::parse(b.to_string().as_bytes()).map_err(|e| anyhow!("plugin block: {e}"))
}

/// Measurement `n` of `metric` of `run` with `config`.
pub(crate) fn request(run: &RunContext, metric: &str, n: u32, config: JobConfig) -> MeasureRequest {
    MeasureRequest {
        run: run.clone(),
        metric: metric.to_string(),
        measurement: n,
        config,
        secrets: Vec::new(),
    }
}

/// A synced watch of AnalysisRuns holding run `n` of [`run`].
pub(crate) fn runs_with(n: u32) -> Result<dispatch_server::runs::Runs> {
    let r = run(n);
    let object = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": r.name, "namespace": r.namespace, "uid": r.uid},
        "spec": {"metrics": []}
    }))?;
    let runs = dispatch_server::runs::Runs::default();
    runs.apply(kube::runtime::watcher::Event::Init);
    runs.apply(kube::runtime::watcher::Event::InitApply(object));
    runs.apply(kube::runtime::watcher::Event::InitDone);
    Ok(runs)
}
