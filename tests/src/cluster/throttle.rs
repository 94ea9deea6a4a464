//! A test cluster's API server that pushes back (issue #32): API Priority and Fairness (APF)
//! answers our requests of chosen resources `429 Too Many Requests` with `Retry-After`, and the
//! audit log says how many requests we sent and how many were refused.
//!
//! Three things stand in the way on a test cluster, and [`prepare`] removes them once:
//!
//! * The clusters run `--enable-priority-and-fairness=false` ([`super::Cluster::start`]), so no
//!   FlowSchema has any effect: the API server is started again with APF on.
//! * Every client of a test cluster is the admin, in `system:masters`, and `system:masters` is
//!   never refused: APF's mandatory `exempt` FlowSchema (precedence 1) sends it to the `exempt`
//!   level, and only that schema may have precedence 1 (kubernetes v1.37.2
//!   `pkg/apis/flowcontrol/validation/validation.go:113-114`; among equal precedences the smaller
//!   name would win, `k8s.io/apiserver` `pkg/util/apihelpers/helpers.go:95-102`, but the tie
//!   cannot be had), while the API server puts its mandatory objects back every minute
//!   (`pkg/registry/flowcontrol/ensurer/strategy.go:41-44`, `rest/storage_flowcontrol.go:156-164`).
//!   The max-in-flight filter exempts `system:masters` too
//!   (`pkg/server/filters/maxinflight.go:199-207`). So two users outside it, with
//!   `cluster-admin`, are added to the token file: [`USER`], whose
//!   kubeconfig ([`Throttling::kubeconfig`]) the server under test is given, and [`LOAD_USER`],
//!   the load generator's.
//! * The audit policy of [`super::audit`] logs only writes: the API server's audit policy is
//!   replaced by one that also logs every request of the throttled resources (at `Metadata`),
//!   and nothing of the load's. The log stays [`super::audit::LOG_FILE`].
//!
//! [`Throttling::apply`] then creates a priority level that serves one request at a time and
//! rejects the rest (`nominalConcurrencyShares: 0`, nothing lent or borrowed, `limitResponse:
//! Reject`) and a FlowSchema of precedence [`PRECEDENCE`] that sends every authenticated user's
//! requests of the resources there, with the ballast LISTs of the load ([`Load`]): while one of
//! those runs, every other request of the level is answered `429`. An APF rejection carries
//! `Retry-After`, from 1 s doubling up to 32 s while the level keeps dropping requests
//! (`k8s.io/apiserver` `pkg/server/filters/priority-and-fairness.go:317,377-380`,
//! `pkg/util/flowcontrol/dropped_requests_tracker.go:29,155-172`), and since the audit filter
//! wraps the APF filter (`pkg/server/config.go:1043-1065`) a rejected request is in the audit
//! log with `responseStatus.code` 429 ([`count_requests`]).
//!
//! ```no_run
//! # async fn scene(cluster: &mut dispatch_tests::cluster::Cluster) -> anyhow::Result<()> {
//! use std::time::{Duration, SystemTime};
//! use dispatch_tests::cluster::throttle::{self, Resource};
//!
//! let throttling = throttle::prepare(cluster, &[Resource::jobs()]).await?;
//! // The server under test reaches this cluster with `throttling.kubeconfig`.
//! throttling.apply(&[Resource::jobs()]).await?;
//! let load = throttling.start_load(4, Duration::from_millis(5)).await?;
//! let from = SystemTime::now();
//! // ... the scenario: measurements whose Jobs go to this cluster ...
//! let to = SystemTime::now();
//! let seen = load.stop().await; // seen.throttled, seen.retry_after ("32" → how many)
//! tokio::time::sleep(Duration::from_secs(2)).await; // the audit batch is written
//! let ours = throttling.count("rollouts-dispatch/", from, to)?;
//! println!("{} requests, {} refused; the load: {seen:?}", ours.requests, ours.throttled);
//! throttling.remove().await?;
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::discovery::ApiResource;
use kube::Client;
use rand::distr::{Alphanumeric, SampleString};
use serde_json::{json, Value};

use super::Cluster;
use crate::wait::{eventually, Progress};

/// The name of the priority level, the FlowSchema and the ballast namespace.
pub const NAME: &str = "rollouts-dispatch-throttle";

/// The user whose requests of the throttled resources are refused: give the server under test
/// [`Throttling::kubeconfig`].
pub const USER: &str = "rollouts-dispatch-throttled";

/// The load generator's user: its LISTs keep the level busy and are not audited.
pub const LOAD_USER: &str = "rollouts-dispatch-throttle-load";

/// The FlowSchema's precedence: the first any schema but `exempt` may have.
pub const PRECEDENCE: i32 = 2;

/// How many ConfigMaps the ballast namespace holds, and the size of each: a LIST of them
/// (1.6 MiB of JSON) keeps the level's one seat for a while, so that the load keeps it busy
/// without spinning.
const BALLAST: usize = 200;
const BALLAST_BYTES: usize = 8 << 10;

const MANAGER: &str = "rollouts-dispatch-tests";

/// A resource whose requests are throttled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// API group (`""` for the core group)
    pub group: String,
    /// its plural name (`jobs`)
    pub plural: String,
}

impl Resource {
    /// `plural` of `group`.
    pub fn new(group: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            plural: plural.into(),
        }
    }

    /// `batch` `jobs`: what the server creates, reads and deletes on a destination.
    pub fn jobs() -> Self {
        Self::new("batch", "jobs")
    }

    /// Our `DispatchJob` records: the server's store on the control plane.
    pub fn dispatchjobs() -> Self {
        Self::new(
            dispatch_server::store::GROUP,
            dispatch_server::store::PLURAL,
        )
    }
}

/// A cluster made ready to push back ([`prepare`]).
#[derive(Debug, Clone)]
pub struct Throttling {
    /// the kubeconfig of [`USER`], in the cluster directory: what the server under test uses
    pub kubeconfig: PathBuf,
    /// the kubeconfig of [`LOAD_USER`]
    pub load_kubeconfig: PathBuf,
    /// the cluster's admin kubeconfig (never throttled)
    pub admin_kubeconfig: PathBuf,
    /// the audit log: every request of the resources given to [`prepare`], and every write
    pub audit_log: PathBuf,
}

/// Turns APF on in `cluster`'s API server, adds [`USER`] and [`LOAD_USER`] (both
/// `cluster-admin`, neither in `system:masters`) and logs every request of `resources` in the
/// audit log: the API server is restarted once (etcd keeps the state; clients reconnect). Later
/// [`Cluster::restart_apiserver`] calls keep all of it. Nothing is throttled until
/// [`Throttling::apply`]. With [`super::ClusterOptions::audit_writes`] the log of writes goes
/// on in the same file, with the reads of `resources` beside them.
pub async fn prepare(cluster: &mut Cluster, resources: &[Resource]) -> Result<Throttling> {
    let dir = cluster.dir.clone();
    let tokens = dir.join("pki").join("tokens.csv");
    let mut users = std::fs::read_to_string(&tokens)
        .with_context(|| format!("reading {}", tokens.display()))?;
    let mut kubeconfigs = Vec::new();
    for user in [USER, LOAD_USER] {
        let token = Alphanumeric.sample_string(&mut rand::rng(), 32);
        if !users.ends_with('\n') && !users.is_empty() {
            users.push('\n');
        }
        // No group: only `system:authenticated`, which the API server adds.
        users.push_str(&format!("{token},{user},{user}\n"));
        let path = dir.join(format!("kubeconfig-{user}"));
        super::write_kubeconfig(
            &path,
            &cluster.name,
            &cluster.server,
            &cluster.ca_file,
            &token,
        )?;
        kubeconfigs.push(path);
    }
    std::fs::write(&tokens, users).with_context(|| format!("writing {}", tokens.display()))?;

    let policy = dir.join("throttle-audit-policy.yaml");
    std::fs::write(&policy, audit_policy(resources))
        .with_context(|| format!("writing {}", policy.display()))?;
    let audit_log = dir.join(super::audit::LOG_FILE);
    cluster.apiserver_args = apiserver_args(&cluster.apiserver_args, &policy, &audit_log);
    cluster.stop_apiserver()?;
    cluster
        .start_apiserver()
        .await
        .context("starting the kube-apiserver again with APF on")?;

    let admin = cluster.client().await?;
    let subjects: Vec<Value> = [USER, LOAD_USER]
        .iter()
        .map(|u| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}))
        .collect();
    apply_object(
        &admin,
        &ApiResource::erase::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>(&()),
        None,
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "cluster-admin"},
            "subjects": subjects,
        }),
    )
    .await?;
    let [kubeconfig, load_kubeconfig]: [PathBuf; 2] = kubeconfigs
        .try_into()
        .map_err(|_| anyhow::anyhow!("two kubeconfigs"))?;
    let throttling = Throttling {
        kubeconfig,
        load_kubeconfig,
        admin_kubeconfig: cluster.kubeconfig.clone(),
        audit_log,
    };
    throttling.fill_ballast().await?;
    Ok(throttling)
}

/// The API server's arguments with APF on and the audit policy at `policy` (any audit flags
/// before are replaced: one policy, one log).
fn apiserver_args(args: &[String], policy: &Path, log: &Path) -> Vec<String> {
    let mut out: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--enable-priority-and-fairness") && !a.starts_with("--audit-"))
        .cloned()
        .collect();
    out.extend([
        "--enable-priority-and-fairness=true".into(),
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", log.display()),
        "--audit-log-format=json".into(),
        // As `audit::apiserver_args`: batched, so the log does not hold up what it records.
        "--audit-log-mode=batch".into(),
        "--audit-log-maxsize=0".into(),
    ]);
    out
}

/// The audit policy: nothing of the load; every request of `resources`; then what
/// [`super::audit`] logs (writes, but not the fake node's pod lifecycle).
fn audit_policy(resources: &[Resource]) -> String {
    let mut policy = format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: None\n  users: [{LOAD_USER}]\n"
    );
    if !resources.is_empty() {
        policy.push_str("- level: Metadata\n  resources:\n");
        for r in resources {
            policy.push_str(&format!(
                "  - group: {:?}\n    resources: [{}]\n",
                r.group, r.plural
            ));
        }
    }
    policy.push_str(
        "- level: None\n  resources:\n  - group: \"\"\n    \
         resources: [pods, pods/status, pods/binding, nodes, nodes/status]\n  \
         - group: coordination.k8s.io\n    resources: [leases]\n\
         - level: Metadata\n  verbs: [create, update, patch, delete, deletecollection]\n\
         - level: None\n",
    );
    policy
}

/// The priority level: one request at a time, the others refused at once. With no shares its
/// nominal limit is 0 (`ceil(serverCL × 0 / Σshares)`, `k8s.io/apiserver`
/// `pkg/util/flowcontrol/apf_controller.go:863`), and a queue set admits a request wider than
/// its limit only when nothing runs (`fairqueuing/queueset/queueset.go:753-763`): one at a time
/// is the least a limited level serves. Lending nothing and borrowing nothing keep it there:
/// without `borrowingLimitPercent` a level may borrow up to the whole server's limit from idle
/// levels (`apf_controller.go:864-877`, adjusted every 10 s, `:398-480`) and would stop refusing.
fn priority_level() -> Value {
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": NAME},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 0,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Reject"},
            },
        },
    })
}

/// The FlowSchema: every authenticated user's requests of `resources`, and the load's LISTs of
/// the ballast, to the level. `system:masters` still goes to `exempt` (precedence 1).
fn flow_schema(resources: &[Resource]) -> Value {
    let mut rules: Vec<Value> = resources
        .iter()
        .map(|r| {
            json!({"verbs": ["*"], "apiGroups": [r.group], "resources": [r.plural],
                   "clusterScope": true, "namespaces": ["*"]})
        })
        .collect();
    rules.push(
        json!({"verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"],
                      "namespaces": [NAME]}),
    );
    json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": NAME},
        "spec": {
            "priorityLevelConfiguration": {"name": NAME},
            "matchingPrecedence": PRECEDENCE,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "Group", "group": {"name": "system:authenticated"}}],
                "resourceRules": rules,
            }],
        },
    })
}

fn flowcontrol(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "flowcontrol.apiserver.k8s.io".into(),
        version: "v1".into(),
        api_version: "flowcontrol.apiserver.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// Server-side applies `object` (cluster-scoped, or in `namespace`); returns it as stored.
async fn apply_object(
    client: &Client,
    resource: &ApiResource,
    namespace: Option<&str>,
    object: Value,
) -> Result<DynamicObject> {
    let name = object["metadata"]["name"]
        .as_str()
        .context("an object without a name")?
        .to_string();
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .with_context(|| format!("applying {} {name}", resource.kind))
}

async fn client_from(path: &Path) -> Result<Client> {
    let kubeconfig =
        Kubeconfig::read_from(path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("loading {}", path.display()))?;
    Client::try_from(config).context("building the kube client")
}

impl Throttling {
    /// A client of [`USER`] with kube's default retry, as the server builds its own.
    pub async fn client(&self) -> Result<Client> {
        client_from(&self.kubeconfig).await
    }

    /// A client of [`LOAD_USER`] that retries nothing: every `429` comes back as it is.
    pub async fn load_client(&self) -> Result<Client> {
        let kubeconfig = Kubeconfig::read_from(&self.load_kubeconfig)
            .with_context(|| format!("reading {}", self.load_kubeconfig.display()))?;
        let mut config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
        config.default_retry = false;
        Client::try_from(config).context("building the load's kube client")
    }

    async fn admin(&self) -> Result<Client> {
        client_from(&self.admin_kubeconfig).await
    }

    /// The ballast the load lists: [`BALLAST`] ConfigMaps in namespace [`NAME`].
    async fn fill_ballast(&self) -> Result<()> {
        let admin = self.admin().await?;
        let namespaces = ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&());
        apply_object(
            &admin,
            &namespaces,
            None,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAME}}),
        )
        .await?;
        let configmaps = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let padding = "x".repeat(BALLAST_BYTES);
        for i in 0..BALLAST {
            apply_object(
                &admin,
                &configmaps,
                Some(NAME),
                json!({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": format!("ballast-{i}")},
                       "data": {"padding": padding}}),
            )
            .await?;
        }
        Ok(())
    }

    /// Sends the requests of `resources` (every authenticated user's but `system:masters`') to
    /// the rejecting level, and waits until the API server classifies the load's requests there
    /// (the `X-Kubernetes-PF-FlowSchema-UID` of a reply).
    pub async fn apply(&self, resources: &[Resource]) -> Result<()> {
        let admin = self.admin().await?;
        apply_object(
            &admin,
            &flowcontrol("PriorityLevelConfiguration", "prioritylevelconfigurations"),
            None,
            priority_level(),
        )
        .await?;
        let schema = apply_object(
            &admin,
            &flowcontrol("FlowSchema", "flowschemas"),
            None,
            flow_schema(resources),
        )
        .await?;
        let uid = schema.metadata.uid.unwrap_or_default();
        let load = self.load_client().await?;
        eventually(
            "the load's LISTs classified by our FlowSchema",
            Duration::from_secs(30),
            || {
                let (load, uid) = (load.clone(), uid.clone());
                async move {
                    let reply = load.send(ballast_list()?).await?;
                    let seen = reply
                        .headers()
                        .get("x-kubernetes-pf-flowschema-uid")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let _ = reply.into_body().collect_bytes().await;
                    Ok(if seen == uid {
                        Progress::Done(())
                    } else {
                        Progress::Waiting(format!("flowschema uid {seen:?}, ours {uid:?}"))
                    })
                }
            },
        )
        .await
    }

    /// Removes the FlowSchema and the level: nothing is throttled any more (APF stays on).
    pub async fn remove(&self) -> Result<()> {
        let admin = self.admin().await?;
        for (kind, plural) in [
            ("FlowSchema", "flowschemas"),
            ("PriorityLevelConfiguration", "prioritylevelconfigurations"),
        ] {
            let api: Api<DynamicObject> = Api::all_with(admin.clone(), &flowcontrol(kind, plural));
            match api.delete(NAME, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e).with_context(|| format!("deleting {kind} {NAME}")),
            }
        }
        Ok(())
    }

    /// Starts `tasks` load tasks that LIST the ballast over and over, so that the level's one
    /// seat is nearly always taken; after a `429` a task waits `pause` (a few milliseconds keep
    /// the level busy without spinning). Four tasks and 5 ms had 7 in 10 of the load's own LISTs
    /// and 5 of another client's 9 requests refused, and drove APF's `Retry-After` from 1 to
    /// 32 s within half a minute (kube-apiserver v1.37.2, a 2-core machine).
    pub async fn start_load(&self, tasks: usize, pause: Duration) -> Result<Load> {
        Ok(Load::start(self.load_client().await?, tasks, pause))
    }

    /// [`count_requests`] in this cluster's audit log.
    pub fn count(
        &self,
        user_agent_prefix: &str,
        from: SystemTime,
        to: SystemTime,
    ) -> Result<AuditCount> {
        count_requests(&self.audit_log, user_agent_prefix, from, to)
    }
}

fn ballast_list() -> Result<http::Request<kube::client::Body>> {
    Ok(
        http::Request::get(format!("/api/v1/namespaces/{NAME}/configmaps"))
            .body(kube::client::Body::empty())?,
    )
}

/// The load on the level, running until [`Load::stop`] (or dropped: its tasks are aborted).
#[derive(Debug)]
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<LoadStats>,
}

/// What the load's requests got back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadStats {
    /// LISTs served
    pub served: u64,
    /// LISTs refused with `429`
    pub throttled: u64,
    /// anything else (another status, a transport error)
    pub failed: u64,
    /// the `Retry-After` of the `429`s, by value (`"none"`: without one)
    pub retry_after: BTreeMap<String, u64>,
}

impl LoadStats {
    fn add(&mut self, other: LoadStats) {
        self.served += other.served;
        self.throttled += other.throttled;
        self.failed += other.failed;
        for (k, v) in other.retry_after {
            *self.retry_after.entry(k).or_default() += v;
        }
    }
}

impl Load {
    /// `tasks` tasks listing the ballast through `client` (one that retries nothing).
    pub fn start(client: Client, tasks: usize, pause: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..tasks {
            let (client, stop) = (client.clone(), stop.clone());
            set.spawn(async move {
                let mut stats = LoadStats::default();
                while !stop.load(Ordering::Relaxed) {
                    let reply = match ballast_list() {
                        Ok(request) => client.send(request).await,
                        Err(_) => break,
                    };
                    match reply {
                        Ok(reply) if reply.status() == http::StatusCode::TOO_MANY_REQUESTS => {
                            stats.throttled += 1;
                            let after = reply
                                .headers()
                                .get(http::header::RETRY_AFTER)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("none")
                                .to_string();
                            *stats.retry_after.entry(after).or_default() += 1;
                            let _ = reply.into_body().collect_bytes().await;
                            tokio::time::sleep(pause).await;
                        }
                        Ok(reply) => {
                            let ok = reply.status().is_success();
                            let body = reply.into_body().collect_bytes().await;
                            if ok && body.is_ok() {
                                stats.served += 1;
                            } else {
                                stats.failed += 1;
                            }
                        }
                        Err(_) => {
                            stats.failed += 1;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
                stats
            });
        }
        Self { stop, tasks: set }
    }

    /// Stops the load (each task after its request in flight) and sums what it got.
    pub async fn stop(mut self) -> LoadStats {
        self.stop.store(true, Ordering::Relaxed);
        let mut total = LoadStats::default();
        while let Some(done) = self.tasks.join_next().await {
            if let Ok(stats) = done {
                total.add(stats);
            }
        }
        total
    }
}

/// Requests counted in an audit log ([`count_requests`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditCount {
    /// requests that completed (one `ResponseComplete` event each)
    pub requests: u64,
    /// of those, the ones answered `429`
    pub throttled: u64,
    /// the same by `"<verb> <resource>"` (`"create jobs"`): (requests, throttled)
    pub by_kind: BTreeMap<String, (u64, u64)>,
}

/// One request of the audit log, as [`count_requests`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    user_agent: String,
    verb: String,
    resource: String,
    code: u16,
    received: SystemTime,
}

/// The request an audit line records once it is complete; `None` for any other line (another
/// stage, a line that is not an event).
fn entry(line: &str) -> Option<Entry> {
    let event: Value = serde_json::from_str(line).ok()?;
    if event["stage"] != "ResponseComplete" {
        return None;
    }
    let received = event["requestReceivedTimestamp"].as_str()?;
    let resource = match event["objectRef"]["subresource"].as_str() {
        Some(sub) => format!("{}/{sub}", event["objectRef"]["resource"].as_str()?),
        None => event["objectRef"]["resource"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    Some(Entry {
        user_agent: event["userAgent"].as_str().unwrap_or_default().to_string(),
        verb: event["verb"].as_str().unwrap_or_default().to_string(),
        resource,
        code: u16::try_from(event["responseStatus"]["code"].as_u64()?).ok()?,
        received: humantime::parse_rfc3339_weak(received).ok()?,
    })
}

/// The requests received in `[from, to)` whose `User-Agent` starts with `user_agent_prefix`
/// (`"rollouts-dispatch/"`: the server and the agent, `dispatch_server::destinations::client::
/// USER_AGENT`), and how many were answered `429`, from the audit log at `log`. A request is
/// logged once the API server has answered it (and its audit batch is written, within a second
/// or so): count a little after `to`.
pub fn count_requests(
    log: &Path,
    user_agent_prefix: &str,
    from: SystemTime,
    to: SystemTime,
) -> Result<AuditCount> {
    let text = std::fs::read(log).with_context(|| format!("reading {}", log.display()))?;
    let mut count = AuditCount::default();
    // The API server may be writing the last line: only whole lines are read.
    let whole = text.iter().rposition(|b| *b == b'\n').unwrap_or(0);
    for line in text[..whole].split(|b| *b == b'\n') {
        let Some(e) = entry(&String::from_utf8_lossy(line)) else {
            continue;
        };
        if !e.user_agent.starts_with(user_agent_prefix) || e.received < from || e.received >= to {
            continue;
        }
        let throttled = u64::from(e.code == 429);
        count.requests += 1;
        count.throttled += throttled;
        let kind = count
            .by_kind
            .entry(format!("{} {}", e.verb, e.resource))
            .or_default();
        kind.0 += 1;
        kind.1 += throttled;
    }
    Ok(count)
}

#[cfg(test)]
mod tests;
