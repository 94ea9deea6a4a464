//! The dispatch engine (`dispatch-server`) against real clusters (`make test-engine`).
//!
//! Three clusters `a`, `b` and `c` start once per test binary and are shared by every test; each
//! test uses its own run UIDs, so tests run in parallel. `a` doubles as the control plane: it
//! holds the Argo CD cluster Secret of `b` (with a real ServiceAccount token of `b`), and the
//! Kargo Stage and Argo CD Application CRDs. kwok runs the pods: annotations on the pod template
//! choose the exit code and run time; states kwok cannot produce (an image pull error, a
//! kubelet's termination message) are written into pod status by the test, as a kubelet would.
//!
//! `#[ignore]`d so that a plain `cargo test` needs no cluster binaries.

mod engine_support;

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use dispatch_server::destinations::{Entry, IN_CLUSTER_NAME};
use dispatch_server::engine::Outcome;
use dispatch_server::job::{self, LABEL_MANAGED, LABEL_RUN_UID};
use dispatch_server::logs::Redactor;
use dispatch_server::{EngineError, Phase};
use dispatch_tests::cluster::{start_many, Cluster, FAKE_NODE};
use engine_support::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::ByteString;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{json, Value};

/// Node label the fixture puts on each cluster's fake node (value: the cluster name).
const CLUSTER_LABEL: &str = "test.rollouts-dispatch.io/cluster";
/// The Argo CD cluster name (= destination name) of `b` registered on `a`.
const B_VIA_ARGOCD: &str = "b-argocd";
const VERDICT_TIMEOUT: Duration = Duration::from_secs(60);

struct Fixture {
    a: Cluster,
    b: Cluster,
    c: Cluster,
    /// token of ServiceAccount default/rollouts-dispatch on `b`
    b_token: String,
}

static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();

/// The shared clusters (started by the first test that needs them).
fn fixture() -> Result<&'static Fixture> {
    FIXTURE
        .get_or_init(|| RT.block_on(setup()).map_err(|e| format!("{e:#}")))
        .as_ref()
        .map_err(|e| anyhow!("cluster fixture: {e}"))
}

async fn setup() -> Result<Fixture> {
    let started = Instant::now();
    let mut clusters = start_many(&["a", "b", "c"]).await?;
    let c = clusters.pop().context("cluster c")?;
    let b = clusters.pop().context("cluster b")?;
    let a = clusters.pop().context("cluster a")?;
    for cl in [&a, &b, &c] {
        let nodes: Api<Node> = Api::all(cl.client().await?);
        let patch = json!({"metadata": {"labels": {CLUSTER_LABEL: cl.name}}});
        nodes
            .patch(FAKE_NODE, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("labelling the node of {}", cl.name))?;
    }
    let b_token = service_account_token(&b).await?;
    let ca = a.client().await?;
    for ns in ["argocd", "kargo-demo"] {
        create_namespace(&ca, ns).await?;
    }
    install_crds(&ca).await?;
    apply_cluster_secret(
        &ca,
        "cluster-b",
        B_VIA_ARGOCD,
        &b.server,
        &argocd_config(&b_token, &b.ca_pem),
        &[("env", "argocd-test")],
    )
    .await?;
    println!(
        "fixture: clusters a, b, c ready in {:.1}s (a={}, b={}, c={})",
        started.elapsed().as_secs_f64(),
        a.server,
        b.server,
        c.server
    );
    Ok(Fixture { a, b, c, b_token })
}

async fn create_namespace(client: &kube::Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

/// A real ServiceAccount token of `cluster` with RBAC for Jobs, Pods and logs.
async fn service_account_token(cluster: &Cluster) -> Result<String> {
    let client = cluster.client().await?;
    let post = PostParams::default();
    let sa: ServiceAccount = serde_json::from_value(
        json!({"metadata": {"name": "rollouts-dispatch", "namespace": "default"}}),
    )?;
    Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .create(&post, &sa)
        .await
        .context("creating serviceaccount rollouts-dispatch")?;
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch"},
        "rules": [
            {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create", "get", "list", "watch", "delete"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}
        ]
    }))?;
    Api::<ClusterRole>::all(client.clone())
        .create(&post, &role)
        .await
        .context("creating clusterrole")?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rollouts-dispatch"},
        "subjects": [{"kind": "ServiceAccount", "name": "rollouts-dispatch", "namespace": "default"}]
    }))?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&post, &binding)
        .await
        .context("creating clusterrolebinding")?;
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let token_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "rollouts-dispatch-token", "namespace": "default",
                     "annotations": {"kubernetes.io/service-account.name": "rollouts-dispatch"}},
        "type": "kubernetes.io/service-account-token"
    }))?;
    secrets
        .create(&post, &token_secret)
        .await
        .context("creating the token secret")?;
    eventually(
        "the token controller fills the token secret",
        Duration::from_secs(30),
        || async {
            let s = secrets.get("rollouts-dispatch-token").await?;
            Ok(s.data
                .and_then(|d| d.get("token").cloned())
                .and_then(|t| String::from_utf8(t.0).ok()))
        },
    )
    .await
}

/// Argo CD's `config` JSON: a bearer token and the CA (base64, as Go encodes `[]byte`).
fn argocd_config(token: &str, ca_pem: &str) -> Value {
    let ca_b64 = serde_json::to_value(ByteString(ca_pem.as_bytes().to_vec())).unwrap_or_default();
    json!({"bearerToken": token, "tlsClientConfig": {"insecure": false, "caData": ca_b64}})
}

async fn apply_cluster_secret(
    client: &kube::Client,
    secret: &str,
    name: &str,
    server: &str,
    config: &Value,
    labels: &[(&str, &str)],
) -> Result<()> {
    let mut l: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    l.insert("argocd.argoproj.io/secret-type".into(), "cluster".into());
    let obj: Secret = serde_json::from_value(json!({
        "metadata": {"name": secret, "namespace": "argocd", "labels": l},
        "type": "Opaque",
        "stringData": {"name": name, "server": server, "config": config.to_string()}
    }))?;
    Api::<Secret>::namespaced(client.clone(), "argocd")
        .create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating Argo CD cluster secret {secret}"))?;
    Ok(())
}

fn crd(group: &str, kind: &str, plural: &str) -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": "v1alpha1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))?)
}

/// Minimal CRDs for Kargo's Stage and Argo CD's Application (schemas preserve every field).
async fn install_crds(client: &kube::Client) -> Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for (group, kind, plural) in [
        ("kargo.akuity.io", "Stage", "stages"),
        ("argoproj.io", "Application", "applications"),
    ] {
        api.create(&PostParams::default(), &crd(group, kind, plural)?)
            .await
            .with_context(|| format!("creating CRD {plural}.{group}"))?;
        let name = format!("{plural}.{group}");
        eventually(
            &format!("CRD {name} established"),
            Duration::from_secs(30),
            || async {
                let c = api.get(&name).await?;
                let established = c
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            },
        )
        .await?;
    }
    Ok(())
}

fn dynamic_api(
    client: &kube::Client,
    ns: &str,
    group: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1alpha1", kind), plural);
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// An engine over `a`, `b` and `c` from config entries (labels: a, b `env=prod`, c `env=dev`).
fn static_yaml(f: &Fixture, extra: &str) -> String {
    format!(
        "{}engine: {{logTimeout: 2s, cacheWait: 3s}}\n{extra}",
        destinations_yaml(&[
            (&f.a, "{env: prod, region: eu}"),
            (&f.b, "{env: prod, region: us}"),
            (&f.c, "{env: dev}"),
        ])
    )
}

/// The Jobs of run `uid` on `cluster` (not being deleted).
async fn jobs_of(cluster: &Cluster, uid: &str) -> Result<Vec<Job>> {
    let api: Api<Job> = Api::all(cluster.client().await?);
    let list = api
        .list(&ListParams::default().labels(&format!("{LABEL_RUN_UID}={uid}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|j| j.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The first pod of Job `name` in `default` once `ready` accepts it.
async fn pod_of(cluster: &Cluster, name: &str, ready: impl Fn(&Pod) -> bool) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await?, "default");
    eventually(
        &format!("pod of job {name} on {}", cluster.name),
        VERDICT_TIMEOUT,
        || async {
            let list = pods
                .list(
                    &ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}")),
                )
                .await?;
            Ok(list.items.into_iter().find(|p| ready(p)))
        },
    )
    .await
}

fn env_of(job: &Job) -> BTreeMap<String, String> {
    job.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|s| &s.containers[0])
        .and_then(|c| c.env.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap_or_default()))
        .collect()
}

/// The engine's request count once it has not changed for a while (the watches are open).
async fn settled_requests(engine: &dispatch_server::Engine) -> Result<u64> {
    let mut last = engine.api_requests();
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = engine.api_requests();
        if now == last {
            return Ok(now);
        }
        last = now;
    }
    bail!("the engine keeps sending API requests while idle")
}

async fn set_termination_message(cluster: &Cluster, pod: Pod, message: &str) -> Result<()> {
    dispatch_tests::cluster::kwok::set_termination_message(
        &cluster.client().await?,
        pod,
        "check",
        message,
    )
    .await
}

fn dest(names: &str) -> Value {
    json!({"destination": names})
}

// === tests ===

#[test]
#[ignore = "needs clusters: make test-engine"]
fn success_carries_the_kargo_context() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("kargo-demo", Some("uat"));
        let req = request(&run, "smoke", 1, block(dest("a"), 0, "1s", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        ensure!(
            ensured.outcomes == vec![("a".to_string(), Outcome::Created)],
            "{:?}",
            ensured.outcomes
        );
        ensure!(
            ensured.verdict.phase == Phase::Running,
            "{:?}",
            ensured.verdict
        );
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Successful, "{v:?}");
        ensure!(v.message == "a: Successful", "{}", v.message);
        ensure!(v.metadata["job-name"] == job::job_name(&run.uid, "smoke", 1));
        ensure!(v.metadata["job-namespace"] == "default");
        ensure!(v.metadata["state.a"] == "Successful");

        let jobs = jobs_of(&f.a, &run.uid).await?;
        ensure!(jobs.len() == 1, "one Job on a, got {}", jobs.len());
        let j = &jobs[0];
        let labels = j.metadata.labels.clone().unwrap_or_default();
        ensure!(
            labels[LABEL_MANAGED] == "true" && labels["rollouts-dispatch.io/destination"] == "a"
        );
        let ann = j.metadata.annotations.clone().unwrap_or_default();
        ensure!(ann["analysisrun.argoproj.io/name"] == run.name);
        ensure!(ann["rollouts-dispatch.io/kargo-stage"] == "uat");
        let env = env_of(j);
        for (k, want) in [
            ("KARGO_PROJECT", "kargo-demo"),
            ("KARGO_STAGE", "uat"),
            ("KARGO_FREIGHT_COLLECTION", "55d4523"),
            ("KARGO_PROMOTION", "uat.promo.1"),
            ("ANALYSIS_RUN_UID", run.uid.as_str()),
            ("DISPATCH_DESTINATION", "a"),
            // the user's own value is kept
            ("ANALYSIS_METRIC", "set-by-user"),
        ] {
            ensure!(
                env.get(k).map(String::as_str) == Some(want),
                "env {k}: {:?}",
                env.get(k)
            );
        }
        // The reference can be found again from the request alone (the /v1 API's way).
        ensure!(engine.locate(&req).await? == ensured.job);
        // Ensuring again is idempotent: the Job is adopted, not duplicated.
        let again = engine.ensure(&req).await?;
        ensure!(
            again.outcomes[0].1 == Outcome::Adopted,
            "{:?}",
            again.outcomes
        );
        ensure!(jobs_of(&f.a, &run.uid).await?.len() == 1);
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn failure_carries_the_redacted_log_tail() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let mut req = request(
            &run,
            "e2e",
            1,
            block(
                json!({"destination": "b", "logTail": 3}),
                1,
                "1s",
                json!({}),
            )?,
        );
        req.secrets = vec!["s3cret-value".into()];
        let ensured = engine.ensure(&req).await?;
        let name = ensured.job.name.clone();
        // What a kubelet writes under terminationMessagePolicy FallbackToLogsOnError; kwok
        // terminates the container but writes no message.
        let pod = pod_of(&f.b, &name, |p| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.state
                            .as_ref()
                            .and_then(|s| s.terminated.as_ref())
                            .is_some()
                    })
                })
        })
        .await?;
        let log = "starting check\nGET https://svc/health\nusing token s3cret-value\nHTTP 503 from svc\nerror: check failed\n";
        set_termination_message(&f.b, pod, log).await?;
        let secrets = Redactor::new(req.secrets.clone());
        let v = wait_verdict(&engine, &ensured.job, &secrets, VERDICT_TIMEOUT, |v| {
            v.phase.is_terminal() && v.message.contains("termination message")
        })
        .await?;
        ensure!(v.phase == Phase::Failed, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        let lines: Vec<&str> = v.message.lines().collect();
        ensure!(
            lines[0].starts_with("b: Failed: BackoffLimitExceeded")
                && lines[0].contains("container \"check\" exited with code 1"),
            "{}",
            v.message
        );
        ensure!(
            lines[1].starts_with("--- b: last 3 log lines of container \"check\""),
            "{}",
            v.message
        );
        ensure!(
            lines[2..]
                == [
                    "using token *****",
                    "HTTP 503 from svc",
                    "error: check failed"
                ],
            "{}",
            v.message
        );
        ensure!(!v.message.contains("s3cret-value"));
        ensure!(v.metadata["state.b"] == "Failed: BackoffLimitExceeded");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn image_pull_error_is_inconclusive() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        // Unschedulable, so kwok leaves the pod alone and the test plays the kubelet.
        let req = request(
            &run,
            "pull",
            1,
            block(
                dest("c"),
                0,
                "1s",
                json!({"nodeSelector": {CLUSTER_LABEL: "none"}}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let pending = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.message.contains("Unschedulable"),
        )
        .await?;
        ensure!(pending.phase == Phase::Running, "{pending:?}");
        let pod = pod_of(&f.c, &ensured.job.name, |_| true).await?;
        let pods: Api<Pod> = Api::namespaced(f.c.client().await?, "default");
        let patch = json!({"status": {"containerStatuses": [{
            "name": "check", "image": "example.invalid/check:1", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied for example.invalid/check"}}
        }]}});
        pods.patch_status(
            pod.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .context("writing the waiting state")?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Inconclusive, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(
            v.message == "c: Inconclusive: container \"check\" cannot pull its image: ErrImagePull: pull access denied for example.invalid/check",
            "{}",
            v.message
        );
        let report = engine.terminate(&ensured.job).await;
        ensure!(report.deleted == vec!["c".to_string()], "{report:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn active_deadline_fails_with_the_reason() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "slow",
            1,
            block(
                json!({"destination": "a", "activeDeadline": "2s"}),
                0,
                "5m",
                json!({}),
            )?,
        );
        let started = Instant::now();
        let ensured = engine.ensure(&req).await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Failed, "{v:?}");
        println!("verdict {}:\n{}", v.phase, v.message);
        ensure!(
            v.message.starts_with("a: Failed: DeadlineExceeded")
                && v.message.contains("(activeDeadline 2s)"),
            "{}",
            v.message
        );
        ensure!(
            started.elapsed() < Duration::from_secs(30),
            "deadline took {:?}",
            started.elapsed()
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn terminate_deletes_the_jobs_everywhere() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(&run, "long", 1, block(dest("a,b"), 0, "5m", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        for cl in [&f.a, &f.b] {
            pod_of(cl, &ensured.job.name, |p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .await?;
        }
        let report = engine.terminate(&ensured.job).await;
        ensure!(
            report.deleted == vec!["a".to_string(), "b".to_string()] && report.failed.is_empty(),
            "{report:?}"
        );
        for cl in [&f.a, &f.b] {
            let jobs: Api<Job> = Api::namespaced(cl.client().await?, "default");
            let pods: Api<Pod> = Api::namespaced(cl.client().await?, "default");
            let name = ensured.job.name.clone();
            eventually(
                &format!("job and pods gone on {}", cl.name),
                VERDICT_TIMEOUT,
                || async {
                    let job_gone = jobs.get_opt(&name).await?.is_none();
                    let pods_gone = pods
                        .list(
                            &ListParams::default()
                                .labels(&format!("batch.kubernetes.io/job-name={name}")),
                        )
                        .await?
                        .items
                        .is_empty();
                    Ok((job_gone && pods_gone).then_some(()))
                },
            )
            .await?;
        }
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase == Phase::Error,
        )
        .await?;
        ensure!(v.message.contains("does not exist"), "{}", v.message);
        // A second terminate finds nothing left.
        let again = engine.terminate(&ensured.job).await;
        ensure!(again.absent.len() == 2, "{again:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn gc_keeps_the_newest_jobs_of_a_run() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        for n in 1..=4 {
            let req = request(&run, "gc", n, block(dest("a,b"), 0, "1s", json!({}))?);
            engine.ensure(&req).await?;
        }
        // Another metric of the same run: GC of metric "gc" leaves it alone.
        let other = request(&run, "other", 1, block(dest("a,b"), 0, "1s", json!({}))?);
        engine.ensure(&other).await?;
        for d in ["a", "b"] {
            let Some(Entry::Ready(dest)) = engine.registry().get(d) else {
                bail!("destination {d}")
            };
            eventually(
                &format!("5 jobs cached on {d}"),
                VERDICT_TIMEOUT,
                || async { Ok((dest.jobs().group(&run.uid).len() == 5).then_some(())) },
            )
            .await?;
        }
        let report = engine.gc(&run.uid, Some("gc"), 2).await;
        ensure!(report.failed.is_empty(), "{report:?}");
        let mut deleted: Vec<String> = report
            .deleted
            .iter()
            .map(|(d, j)| format!("{d}:{j}"))
            .collect();
        deleted.sort();
        let name = |n| format!("default/{}", job::job_name(&run.uid, "gc", n));
        let mut want = vec![
            format!("a:{}", name(1)),
            format!("a:{}", name(2)),
            format!("b:{}", name(1)),
            format!("b:{}", name(2)),
        ];
        want.sort();
        ensure!(deleted == want, "deleted {deleted:?}");
        for cl in [&f.a, &f.b] {
            let uid = run.uid.clone();
            eventually(
                &format!("only the newest 2 jobs left on {}", cl.name),
                VERDICT_TIMEOUT,
                || async {
                    let mut names: Vec<String> = jobs_of(cl, &uid)
                        .await?
                        .into_iter()
                        .filter_map(|j| j.metadata.name)
                        .collect();
                    names.sort();
                    let want = vec![
                        job::job_name(&uid, "gc", 3),
                        job::job_name(&uid, "gc", 4),
                        job::job_name(&uid, "other", 1),
                    ];
                    Ok((names == want).then_some(()))
                },
            )
            .await?;
        }
        // Nothing more to collect.
        eventually("gc is idempotent", Duration::from_secs(20), || async {
            Ok(engine
                .gc(&run.uid, Some("gc"), 2)
                .await
                .deleted
                .is_empty()
                .then_some(()))
        })
        .await?;
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn require_all_fails_and_require_any_succeeds() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        // Schedulable only on a; on b the pod stays pending until the deadline fails the Job.
        let pod = json!({"nodeSelector": {CLUSTER_LABEL: "a"}});
        let mut verdicts = Vec::new();
        // `any` first: it is decided as soon as a completes, before b's deadline.
        for require in ["any", "all"] {
            let run = run_context("team-a", None);
            let routing = json!({"destination": "a,b", "require": require, "activeDeadline": "4s"});
            let req = request(&run, "multi", 1, block(routing, 0, "1s", pod.clone())?);
            let ensured = engine.ensure(&req).await?;
            ensure!(ensured.verdict.metadata["destinations"] == "a,b");
            verdicts.push((require, engine.clone(), ensured.job));
        }
        for (require, engine, job) in verdicts {
            let v = wait_verdict(&engine, &job, &Redactor::default(), VERDICT_TIMEOUT, |v| {
                v.phase.is_terminal()
            })
            .await?;
            let lines: Vec<&str> = v.message.lines().collect();
            match require {
                "all" => {
                    ensure!(v.phase == Phase::Failed, "all: {v:?}");
                    ensure!(lines[0] == "a: Successful", "{}", v.message);
                    ensure!(
                        lines[1].starts_with("b: Failed: DeadlineExceeded"),
                        "{}",
                        v.message
                    );
                    ensure!(
                        v.metadata["state.b"] == "Failed: DeadlineExceeded"
                            && v.metadata["require"] == "all"
                    );
                }
                _ => {
                    ensure!(v.phase == Phase::Successful, "any: {v:?}");
                    // b is still pending (or, on a slow machine, already past its deadline).
                    ensure!(
                        lines[0] == "a: Successful"
                            && (lines[1].starts_with("b: Running")
                                || lines[1].starts_with("b: Failed")),
                        "{}",
                        v.message
                    );
                    ensure!(v.metadata["require"] == "any");
                }
            }
            engine.terminate(&job).await;
        }
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn selector_picks_the_labelled_destinations() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&static_yaml(f, "")).await?;
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "sel",
            1,
            block(
                json!({"destinationSelector": "env=prod"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == ["a", "b"], "{names:?}");
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == "a: Successful\nb: Successful",
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.c, &run.uid).await?.is_empty(),
            "nothing on c (env=dev)"
        );
        let none = request(
            &run,
            "sel",
            2,
            block(
                json!({"destinationSelector": "env=staging"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let e = engine.ensure(&none).await.unwrap_err();
        ensure!(
            matches!(e, EngineError::NoMatch { .. })
                && e.to_string().contains("a {\"env\": \"prod\""),
            "{e}"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn kubeconfig_contexts_and_direct_credentials() -> Result<()> {
    let f = fixture()?;
    run(async {
        // One kubeconfig with contexts a and b (the embedded default reads ~/.kube/config the
        // same way), plus c by server URL, bearer token and CA from the config file.
        let merged = kube::config::Kubeconfig::read_from(&f.a.kubeconfig)?
            .merge(kube::config::Kubeconfig::read_from(&f.b.kubeconfig)?)?;
        let path = std::env::temp_dir().join(format!("engine-test-{}.kubeconfig", &run_uid()[..8]));
        // JSON is YAML: the kubeconfig reader takes it.
        std::fs::write(&path, serde_json::to_string(&merged)?)?;
        let ca = f.c.ca_pem.replace('\n', "\n    ");
        let yaml = format!(
            "kubeconfigContexts: {{path: {}, contexts: [\"a\", \"b*\"], labels: {{from: kubeconfig}}}}\n\
             destinations:\n\
             - name: c-direct\n  server: {}\n  token: {}\n  namespace: default\n  caData: |\n    {ca}\n",
            path.display(),
            f.c.server,
            f.c.token
        );
        let kc_engine = engine(&yaml).await?;
        ensure!(
            kc_engine.registry().names() == ["a", "b", "c-direct"],
            "{:?}",
            kc_engine.registry().names()
        );
        let run = run_context("team-a", None);
        let req = request(
            &run,
            "kc",
            1,
            block(json!({"destination": "b,c-direct"}), 0, "1s", json!({}))?,
        );
        let ensured = kc_engine.ensure(&req).await?;
        let v = wait_verdict(
            &kc_engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == "b: Successful\nc-direct: Successful",
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.b, &run.uid).await?.len() == 1 && jobs_of(&f.c, &run.uid).await?.len() == 1
        );
        let sel = request(
            &run,
            "kc",
            2,
            block(
                json!({"destinationSelector": "from=kubeconfig"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let names: Vec<String> = kc_engine
            .ensure(&sel)
            .await?
            .job
            .placements
            .into_iter()
            .map(|p| p.destination)
            .collect();
        ensure!(names == ["a", "b"], "{names:?}");

        // A wrong token is a clear, permanent error.
        let bad = yaml.replace(&f.c.token, "wrong-token");
        let bad_engine = engine(&bad).await?;
        let e = bad_engine
            .ensure(&request(
                &run,
                "kc",
                3,
                block(json!({"destination": "c-direct"}), 0, "1s", json!({}))?,
            ))
            .await?;
        ensure!(
            e.verdict.phase == Phase::Error && !e.verdict.retryable,
            "{:?}",
            e.verdict
        );
        ensure!(
            e.verdict.message.contains("rejected (HTTP 401)"),
            "{}",
            e.verdict.message
        );
        let _ = std::fs::remove_file(&path);
        Ok(())
    })
}

fn argocd_yaml(f: &Fixture) -> String {
    format!(
        "controlPlane: {{kubeconfig: {}}}\nargocd: {{namespace: argocd}}\nengine: {{logTimeout: 2s}}\n",
        f.a.kubeconfig.display()
    )
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn argocd_cluster_secret_with_a_service_account_token() -> Result<()> {
    let f = fixture()?;
    run(async {
        let engine = engine(&argocd_yaml(f)).await?;
        let entry = engine
            .registry()
            .wait_for(B_VIA_ARGOCD, Duration::from_secs(30), |_| true)
            .await
            .context("destination from the Argo CD secret")?;
        let Entry::Ready(b_dest) = &entry else {
            bail!("{entry:?}")
        };
        ensure!(
            b_dest.server == f.b.server && b_dest.labels["env"] == "argocd-test",
            "{b_dest:?}"
        );
        ensure!(
            engine.registry().get(IN_CLUSTER_NAME).is_some(),
            "implicit in-cluster"
        );

        let run = run_context("team-a", None);
        let req = request(
            &run,
            "argocd",
            1,
            block(
                json!({"destinationSelector": "env=argocd-test"}),
                0,
                "1s",
                json!({}),
            )?,
        );
        let ensured = engine.ensure(&req).await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(
            v.phase == Phase::Successful && v.message == format!("{B_VIA_ARGOCD}: Successful"),
            "{v:?}"
        );
        ensure!(
            jobs_of(&f.b, &run.uid).await?.len() == 1,
            "the Job ran on b"
        );

        // Live: a new Secret appears, with credentials this server cannot use; then it goes.
        let ca = f.a.client().await?;
        let exec = json!({"execProviderConfig": {"command": "argocd-k8s-auth-not-installed", "args": ["aws"],
                                                 "installHint": "install argocd-k8s-auth"}});
        apply_cluster_secret(
            &ca,
            "cluster-eks",
            "eks-prod",
            "https://eks.invalid",
            &exec,
            &[],
        )
        .await?;
        let broken = engine
            .registry()
            .wait_for("eks-prod", Duration::from_secs(30), |_| true)
            .await
            .context("destination from the exec secret")?;
        let Entry::Broken(b) = &broken else {
            bail!("{broken:?}")
        };
        ensure!(
            b.error
                .contains("\"argocd-k8s-auth-not-installed\" is not installed")
                && b.error.contains("argocd/cluster-eks"),
            "{}",
            b.error
        );
        let run2 = run_context("team-a", None);
        let e = engine
            .ensure(&request(
                &run2,
                "eks",
                1,
                block(dest("eks-prod"), 0, "1s", json!({}))?,
            ))
            .await?;
        ensure!(
            e.verdict.phase == Phase::Error && e.verdict.message.contains("not installed"),
            "{:?}",
            e.verdict
        );

        Api::<Secret>::namespaced(ca.clone(), "argocd")
            .delete("cluster-eks", &DeleteParams::default())
            .await?;
        eventually(
            "destination removed with its secret",
            Duration::from_secs(30),
            || async { Ok(engine.registry().get("eks-prod").is_none().then_some(())) },
        )
        .await?;
        // The token still works for b (the first destination is untouched).
        ensure!(matches!(
            engine.registry().get(B_VIA_ARGOCD),
            Some(Entry::Ready(_))
        ));
        let _ = &f.b_token;

        // An exec credential plugin that is installed works: it prints c's token.
        let script = std::env::temp_dir().join(format!("exec-credential-{}.sh", &run_uid()[..8]));
        let credential = json!({"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                                "status": {"token": f.c.token}});
        std::fs::write(
            &script,
            format!("#!/bin/sh\ncat <<'EOF'\n{credential}\nEOF\n"),
        )?;
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let mut exec_ok = argocd_config("unused", &f.c.ca_pem);
        if let Some(o) = exec_ok.as_object_mut() {
            o.remove("bearerToken");
            o.insert(
                "execProviderConfig".into(),
                json!({"command": script, "args": [],
                     "apiVersion": "client.authentication.k8s.io/v1beta1"}),
            );
        }
        apply_cluster_secret(&ca, "cluster-c-exec", "c-exec", &f.c.server, &exec_ok, &[]).await?;
        let c_exec = engine
            .registry()
            .wait_for("c-exec", Duration::from_secs(30), |_| true)
            .await;
        ensure!(matches!(c_exec, Some(Entry::Ready(_))), "{c_exec:?}");
        let run3 = run_context("team-a", None);
        let ensured = engine
            .ensure(&request(
                &run3,
                "exec",
                1,
                block(dest("c-exec"), 0, "1s", json!({}))?,
            ))
            .await?;
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Successful, "{v:?}");
        ensure!(
            jobs_of(&f.c, &run3.uid).await?.len() == 1,
            "the Job ran on c"
        );
        Api::<Secret>::namespaced(ca, "argocd")
            .delete("cluster-c-exec", &DeleteParams::default())
            .await?;
        let _ = std::fs::remove_file(&script);
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn stage_resolves_through_argocd_applications() -> Result<()> {
    let f = fixture()?;
    run(async {
        let ca = f.a.client().await?;
        let stage = format!("uat-{}", &run_uid()[..6]);
        let apps = dynamic_api(&ca, "argocd", "argoproj.io", "Application", "applications");
        for (name, destination) in [
            (
                format!("{stage}-remote"),
                json!({"server": format!("{}/", f.b.server), "namespace": "guestbook"}),
            ),
            (
                format!("{stage}-local"),
                json!({"name": IN_CLUSTER_NAME, "namespace": "guestbook"}),
            ),
        ] {
            let app: DynamicObject = serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": name, "namespace": "argocd"},
                "spec": {"project": "default", "destination": destination,
                         "source": {"repoURL": "https://example.invalid/repo.git", "path": "guestbook"}}
            }))?;
            apps.create(&PostParams::default(), &app)
                .await
                .with_context(|| format!("creating application {name}"))?;
        }
        let context = json!([
            {"name": format!("{stage}-remote"), "namespace": "argocd"},
            {"name": format!("{stage}-local")}
        ]);
        let stages = dynamic_api(&ca, "kargo-demo", "kargo.akuity.io", "Stage", "stages");
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
            "metadata": {"name": stage, "namespace": "kargo-demo",
                         "annotations": {"kargo.akuity.io/argocd-context": context.to_string()}},
            "spec": {"requestedFreight": []}
        }))?;
        stages
            .create(&PostParams::default(), &obj)
            .await
            .context("creating the stage")?;

        let engine = engine(&argocd_yaml(f)).await?;
        let run = run_context("kargo-demo", Some(&stage));
        let req = request(&run, "stage", 1, block(dest("stage"), 0, "1s", json!({}))?);
        let ensured = engine.ensure(&req).await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == [B_VIA_ARGOCD, IN_CLUSTER_NAME], "{names:?}");
        // Later lookups of the run reuse the resolution: no Stage or Application reads.
        ensure!(engine.locate(&req).await? == ensured.job);
        let v = wait_verdict(
            &engine,
            &ensured.job,
            &Redactor::default(),
            VERDICT_TIMEOUT,
            |v| v.phase.is_terminal(),
        )
        .await?;
        ensure!(v.phase == Phase::Successful, "{v:?}");
        for cl in [&f.b, &f.a] {
            let jobs = jobs_of(cl, &run.uid).await?;
            ensure!(jobs.len() == 1, "one job on {}", cl.name);
            ensure!(env_of(&jobs[0])["KARGO_STAGE"] == stage);
        }

        // A run without a Stage label, and a Stage without the annotation, say what is missing.
        let plain = run_context("kargo-demo", None);
        let e = engine
            .ensure(&request(
                &plain,
                "stage",
                1,
                block(dest("stage"), 0, "1s", json!({}))?,
            ))
            .await
            .unwrap_err();
        ensure!(
            e.to_string().contains("has no kargo.akuity.io/stage label"),
            "{e}"
        );
        let bare = run_context("kargo-demo", Some("no-such-stage"));
        let e = engine
            .ensure(&request(
                &bare,
                "stage",
                1,
                block(dest("stage"), 0, "1s", json!({}))?,
            ))
            .await
            .unwrap_err();
        ensure!(
            e.to_string()
                .contains("Stage kargo-demo/no-such-stage does not exist"),
            "{e}"
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn policy_denies_with_the_config_key() -> Result<()> {
    let f = fixture()?;
    run(async {
        let policy = "policy:\n  rules:\n  - projects: [team-a]\n    destinations: [a]\n    namespaces: [default]\n";
        let engine = engine(&static_yaml(f, policy)).await?;
        ensure!(engine.policy().warning().is_none());
        let cases = [
            ("team-b", "a", None, "no rule lists this project"),
            ("team-a", "b", None, "allow destinations a"),
            ("team-a", "a", Some("other"), "allow namespaces default"),
        ];
        for (project, destination, namespace, why) in cases {
            let run = run_context(project, None);
            let mut routing = json!({"destination": destination});
            if let Some(ns) = namespace {
                routing["namespace"] = ns.into();
            }
            let e = engine
                .ensure(&request(&run, "p", 1, block(routing, 0, "1s", json!({}))?))
                .await
                .unwrap_err();
            let text = e.to_string();
            ensure!(matches!(e, EngineError::Denied(_)), "{text}");
            ensure!(
                text.contains(&format!("project {project:?}"))
                    && text.contains(&format!("destination {destination:?}"))
                    && text.contains(why)
                    && text.contains("`policy.rules` in config file engine-test.yaml"),
                "{text}"
            );
            ensure!(
                jobs_of(&f.a, &run.uid).await?.is_empty()
                    && jobs_of(&f.b, &run.uid).await?.is_empty()
            );
        }
        // A selector keeps the allowed destinations only.
        let run = run_context("team-a", None);
        let ensured = engine
            .ensure(&request(
                &run,
                "p",
                1,
                block(
                    json!({"destinationSelector": "env=prod"}),
                    0,
                    "1s",
                    json!({}),
                )?,
            ))
            .await?;
        let names: Vec<&str> = ensured
            .job
            .placements
            .iter()
            .map(|p| p.destination.as_str())
            .collect();
        ensure!(names == ["a"], "{names:?}");
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn a_new_engine_adopts_existing_jobs_and_refuses_foreign_ones() -> Result<()> {
    let f = fixture()?;
    run(async {
        let yaml = static_yaml(f, "");
        let run = run_context("team-a", None);
        let req = request(&run, "adopt", 1, block(dest("a,b"), 0, "30s", json!({}))?);
        let first = engine(&yaml).await?;
        let created = first.ensure(&req).await?;
        ensure!(
            created.outcomes.iter().all(|(_, o)| *o == Outcome::Created),
            "{:?}",
            created.outcomes
        );
        drop(first);

        // Cold caches: the API answers AlreadyExists and the Job is adopted.
        let second = engine(&yaml).await?;
        let adopted = second.ensure(&req).await?;
        ensure!(
            adopted.outcomes.iter().all(|(_, o)| *o == Outcome::Adopted),
            "{:?}",
            adopted.outcomes
        );
        ensure!(adopted.job == created.job);
        // Warm caches: adopted without a create call.
        let third = engine(&yaml).await?;
        ensure!(third.wait_synced(Duration::from_secs(30)).await.is_empty());
        // After the first list each watch sends its WATCH request: let them settle.
        let before = settled_requests(&third).await?;
        let again = third.ensure(&req).await?;
        ensure!(
            again.outcomes.iter().all(|(_, o)| *o == Outcome::Adopted),
            "{:?}",
            again.outcomes
        );
        ensure!(
            third.api_requests() == before,
            "adoption from the cache costs no request"
        );
        let v = third.status(&created.job, &Redactor::default()).await;
        ensure!(v.phase == Phase::Running, "{v:?}");
        for cl in [&f.a, &f.b] {
            ensure!(
                jobs_of(cl, &run.uid).await?.len() == 1,
                "no duplicate on {}",
                cl.name
            );
        }
        third.terminate(&created.job).await;

        // A Job with our name that we did not create is never touched.
        let other = run_context("team-a", None);
        let name = job::job_name(&other.uid, "adopt", 1);
        let foreign: Job = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "labels": {"owner": "someone-else"}},
            "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
                     "containers": [{"name": "x", "image": "example.invalid/x:1"}]}}}
        }))?;
        let jobs: Api<Job> = Api::namespaced(f.a.client().await?, "default");
        jobs.create(&PostParams::default(), &foreign).await?;
        let req = request(&other, "adopt", 1, block(dest("a"), 0, "1s", json!({}))?);
        let refused = third.ensure(&req).await?;
        ensure!(
            refused.verdict.phase == Phase::Error,
            "{:?}",
            refused.verdict
        );
        ensure!(
            refused
                .verdict
                .message
                .contains("already exists and is not ours"),
            "{}",
            refused.verdict.message
        );
        let report = third.terminate(&refused.job).await;
        ensure!(
            report.failed.len() == 1 && report.failed[0].1.contains("refusing to delete"),
            "{report:?}"
        );
        let still = jobs.get(&name).await?;
        ensure!(
            still
                .metadata
                .labels
                .unwrap_or_default()
                .get("owner")
                .map(String::as_str)
                == Some("someone-else")
        );
        jobs.delete(&name, &DeleteParams::background()).await?;
        Ok(())
    })
}

#[test]
#[ignore = "needs clusters: make test-engine"]
fn an_unreachable_destination_fails_fast_with_its_name() -> Result<()> {
    // No cluster needed: one port nobody listens on, one server that accepts connections and
    // never answers (TLS handshake stalls).
    run(async {
        let closed = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let silent_port = silent.local_addr()?.port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((sock, _)) = silent.accept().await {
                held.push(sock);
            }
        });
        let yaml = format!(
            "destinations:\n\
             - name: down\n  server: https://127.0.0.1:{closed}\n  token: t\n  insecure: true\n\
             - name: silent\n  server: https://127.0.0.1:{silent_port}\n  token: t\n  insecure: true\n\
             engine: {{connectTimeout: 2s, requestTimeout: 5s, cacheWait: 1s}}\n"
        );
        let engine = engine(&yaml).await?;
        for d in ["down", "silent"] {
            let run = run_context("team-a", None);
            let started = Instant::now();
            let ensured = engine
                .ensure(&request(&run, "u", 1, block(dest(d), 0, "1s", json!({}))?))
                .await?;
            let took = started.elapsed();
            let v = &ensured.verdict;
            ensure!(v.phase == Phase::Error && v.retryable, "{d}: {v:?}");
            ensure!(
                v.message
                    .starts_with(&format!("{d}: Error: destination unreachable")),
                "{d}: {}",
                v.message
            );
            ensure!(took < Duration::from_secs(10), "{d}: ensure took {took:?}");
            let started = Instant::now();
            let s = engine.status(&ensured.job, &Redactor::default()).await;
            ensure!(
                s.phase == Phase::Error && s.retryable && s.message.contains("unreachable"),
                "{d}: {s:?}"
            );
            ensure!(
                started.elapsed() < Duration::from_secs(10),
                "{d}: status took {:?}",
                started.elapsed()
            );
            println!(
                "{d}: ensure {took:?}, status {:?}: {}",
                started.elapsed(),
                s.message
            );
        }
        hold.abort();
        Ok(())
    })
}
