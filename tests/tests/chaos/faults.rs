//! The four faults of `make chaos` after its kill phase, one verification each, in turn (each
//! needs the scene to itself: a stopped API server, a paused agent, a webhook, a server on the
//! memory store):
//!
//! 1. [`abort_while_apiserver_down`]: cluster-a's API server is down when Kargo aborts a run;
//!    the run must be terminal at once, and its Job deleted soon after the API server is back
//!    (the pending deletion the server retries every 10 s).
//! 2. [`agent_silent_past_deadline`]: cluster-b's agent is frozen (SIGSTOP) before the run is
//!    submitted; the run must end `Error` at the server's deadline (its `activeDeadline` +
//!    `engine.deadlineGrace`), naming the deadline and the agent.
//! 3. [`transient_create_failure`]: a webhook nobody serves (`failurePolicy: Fail`) makes
//!    cluster-b's API server answer 500 to the agent's Job create; the agent must retry until the
//!    webhook is gone, and the run end with its verdict and one Job.
//! 4. [`memory_store_restart`]: one replica on the memory store is killed and started again
//!    after it wrote the run's record and before the frozen agent polled; the run must end with
//!    its verdict and one Job (the plugin's status call writes the record again). Its Job is
//!    then left to that replica's retention sweep, and the two Kubernetes-store replicas come
//!    back for the rest of the test.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use dispatch_tests::analysis::{self, all_messages, is_finished, phase};
use dispatch_tests::kargo::Verification;
use dispatch_tests::objects::{dry_run_job, jobs_of};
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::world::agents::{Agents, Store};
use dispatch_tests::world::World;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{DEADLINE, GRACE, RETENTION, SLACK, SWEEP_EVERY};
use dispatch_tests::invariants::{wait_terminal, JobWatch, Outcome};

/// How many verifications the faults add.
pub(crate) const COUNT: usize = 4;

/// When the faults are over: the last run seen terminal, and the Kubernetes-store replicas
/// ready again (the sweep of their records starts then).
pub(crate) struct Done {
    pub(crate) last_terminal: Instant,
    pub(crate) servers_back: Instant,
}

/// Runs the four faults in turn; pushes their outcomes.
pub(crate) async fn run_all(
    w: &mut World<Agents>,
    watch: &JobWatch,
    outcomes: &mut Vec<Outcome>,
) -> Result<Done> {
    for o in [
        abort_while_apiserver_down(w).await?,
        agent_silent_past_deadline(w).await?,
        transient_create_failure(w, watch).await?,
    ] {
        println!(
            "chaos: fault {}: correct={} {}",
            o.name, o.correct, o.detail
        );
        outcomes.push(o);
    }
    let (o, done) = memory_store_restart(w, watch).await?;
    println!(
        "chaos: fault {}: correct={} {}",
        o.name, o.correct, o.detail
    );
    outcomes.push(o);
    Ok(done)
}

/// Submits `v`; returns its name, UID and when it was created.
async fn submit(w: &World<Agents>, v: &Verification) -> Result<(String, String, Instant)> {
    let run = w.submit(v).await?;
    Ok((
        analysis::name(&run).to_string(),
        analysis::uid(&run),
        Instant::now(),
    ))
}

/// The run `name` once terminal or `bound` after `created`.
async fn settle(
    w: &World<Agents>,
    name: &str,
    created: Instant,
    bound: Duration,
) -> Result<DynamicObject> {
    let mut last = wait_terminal(&w.runs(), &[(name.to_string(), created, bound)]).await?;
    last.pop().context("no run")
}

fn outcome(
    run: &DynamicObject,
    destination: &'static str,
    correct: bool,
    detail: String,
) -> Outcome {
    Outcome {
        name: analysis::name(run).to_string(),
        uid: analysis::uid(run),
        destination,
        correct,
        stuck: !is_finished(run),
        detail: format!("{}: {detail}; {}", phase(run), all_messages(run)),
    }
}

/// How many measurements the run's metric took (Argo takes another after an `Error`).
fn measurements(run: &DynamicObject) -> usize {
    run.data
        .pointer("/status/metricResults/0/measurements")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len)
}

/// Fault 1: cluster-a's API server down during an abort, then back.
async fn abort_while_apiserver_down(w: &mut World<Agents>) -> Result<Outcome> {
    let v =
        Verification::new("fault-abort", "01jfault000000000000000001", "cluster-a").runs_for("10m");
    let (name, uid, created) = submit(w, &v).await?;
    let a = &w.a;
    eventually(
        "the aborted run's Job on cluster-a",
        Duration::from_secs(120),
        || async { Ok(!jobs_of(a, &uid).await?.is_empty()) },
    )
    .await?;
    w.a.stop_apiserver()?;
    // Kargo aborts a verification by setting `spec.terminate` (tests/e2e/main.rs, the abort scenario).
    w.runs()
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"terminate": true}})),
        )
        .await
        .context("aborting the verification")?;
    // Terminal at once, while the destination is still down.
    let terminal_while_down = analysis::wait_for(&w.runs(), &name, Duration::from_secs(60), |r| {
        is_finished(r)
    })
    .await
    .is_ok();
    w.a.start_apiserver().await?;
    let back = Instant::now();
    let a = &w.a;
    let deleted = eventually(
        "the aborted run's Job deleted",
        Duration::from_secs(40),
        || async {
            Ok(jobs_of(a, &uid)
                .await?
                .iter()
                .all(|j| j.metadata.deletion_timestamp.is_some()))
        },
    )
    .await
    .is_ok();
    let run = settle(w, &name, created, DEADLINE + GRACE + SLACK).await?;
    Ok(outcome(
        &run,
        "cluster-a",
        terminal_while_down && deleted,
        format!(
            "terminal while cluster-a was down: {terminal_while_down}; Job deleted within {}s \
             of its return: {deleted}",
            back.elapsed().as_secs()
        ),
    ))
}

/// Fault 2: cluster-b's agent frozen past the run's deadline.
async fn agent_silent_past_deadline(w: &mut World<Agents>) -> Result<Outcome> {
    let active_deadline = Duration::from_secs(20);
    let v = Verification::new("fault-silent", "01jfault000000000000000002", "cluster-b")
        .runs_for("10m")
        .routed(json!({
            "destination": "{{args.destination}}",
            "activeDeadline": format!("{}s", active_deadline.as_secs()),
        }));
    let mut ar = v.analysis_run(&w.freight)?;
    // Argo retries an `Error` measurement up to its consecutiveErrorLimit (default 4) before the
    // run ends Error; with 0 the first deadline Error ends the run, as a template can ask.
    ar.data["spec"]["metrics"][0]["consecutiveErrorLimit"] = json!(0);
    w.b.pause_process("agent", true)?;
    let created_run = w.runs().create(&PostParams::default(), &ar).await;
    let created = Instant::now();
    let run = match created_run {
        Ok(run) => {
            let name = analysis::name(&run).to_string();
            settle(w, &name, created, active_deadline + GRACE + SLACK).await
        }
        Err(e) => Err(e.into()),
    };
    w.b.pause_process("agent", false)?;
    let run = run?;
    let message = all_messages(&run);
    let correct = phase(&run) == "Error"
        && message.contains("server's deadline")
        && message.contains("agent of cluster-b");
    Ok(outcome(
        &run,
        "cluster-b",
        correct,
        format!(
            "after {}s with the agent frozen (want Error naming the deadline and the agent)",
            created.elapsed().as_secs()
        ),
    ))
}

/// Fault 3: transient 5xx on the agent's Job create.
///
/// A validating webhook that fails to be called with `failurePolicy: Fail` makes the API server
/// answer 500 Internal Server Error "failed calling webhook": kubernetes
/// staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/validating/dispatcher.go:127-136
/// (`ErrCallingWebhook` not ignored → `apierrors.NewInternalError`), the text from
/// staging/src/k8s.io/apiserver/pkg/util/webhook/error.go:34-37 (commit 02cf581).
async fn transient_create_failure(w: &mut World<Agents>, watch: &JobWatch) -> Result<Outcome> {
    let client = w.b.client().await?;
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let hook: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "chaos-unreachable-webhook"},
        "webhooks": [{
            "name": "jobs.chaos.rollouts-dispatch.io",
            // A port nobody listens on: every call fails to connect.
            "clientConfig": {"url": format!("https://127.0.0.1:{}/validate", dispatch_tests::free_port()?)},
            "rules": [{"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE"],
                       "resources": ["jobs"], "scope": "Namespaced"}],
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "default"}},
            "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 2
        }]
    }))?;
    hooks.create(&PostParams::default(), &hook).await?;
    // The API server loads webhook configurations asynchronously: wait until a dry-run create
    // of a Job in the agent's namespace gets the 500.
    let refusal = eventually(
        "the webhook refusing Job creates",
        Duration::from_secs(30),
        || async {
            Ok(
                match dry_run_job(&client, "default", "example.invalid/probe:1").await {
                    Err(kube::Error::Api(e)) if e.code == 500 => Progress::Done(e.message),
                    other => Progress::Waiting(format!("{other:?}")),
                },
            )
        },
    )
    .await?;
    println!("chaos: cluster-b refuses Job creates: 500 {refusal}");

    let v = Verification::new("fault-5xx", "01jfault000000000000000003", "cluster-b");
    let (name, uid, created) = submit(w, &v).await?;
    // The agent tries, fails transiently, and tries again after its pause (5 s), for the same
    // measurement (its Job name ends `.<metric>.1`): a new measurement after an Error would
    // be Argo's retry, not the agent's.
    let log = w.b.log_path("agent");
    let job = format!("{uid}.smoke.1 ");
    let failed_creates = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(&job) && l.contains("NotCreated"))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let retried = eventually(
        "the agent retrying the create",
        Duration::from_secs(60),
        || async { Ok(failed_creates().len() >= 2) },
    )
    .await
    .is_ok();
    let tries = failed_creates();
    hooks
        .delete("chaos-unreachable-webhook", &DeleteParams::default())
        .await?;
    let run = settle(w, &name, created, DEADLINE + GRACE + SLACK).await?;
    // The watch polls every second; the Job outlives its run by the retention.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let jobs = watch.jobs_of("cluster-b", &uid);
    let measurements = measurements(&run);
    Ok(outcome(
        &run,
        "cluster-b",
        phase(&run) == "Successful" && retried && jobs == 1 && measurements == 1,
        format!(
            "{} failed creates of its Job before the webhook went ({}), then {jobs} Job(s) in \
             {measurements} measurement(s) (want Successful, at least 2 failed creates, 1 Job, \
             1 measurement)",
            tries.len(),
            tries.last().map(String::as_str).unwrap_or_default()
        ),
    ))
}

/// Fault 4: a memory-store server restarted after it wrote the run's record and before the
/// agent polled.
async fn memory_store_restart(w: &mut World<Agents>, watch: &JobWatch) -> Result<(Outcome, Done)> {
    // The memory store holds a single replica: stop the Kubernetes-store ones (server-2 may be
    // down for good already).
    let _ = w.control.kill_process("server-2");
    w.control.kill_process("server-1")?;
    w.restart_replica_with(0, Store::Memory).await?;
    w.b.pause_process("agent", true)?;
    let v =
        Verification::new("fault-memory", "01jfault000000000000000004", "cluster-b").runs_for("3s");
    let submitted = submit(w, &v).await;
    let restarted = match &submitted {
        Ok((name, _, _)) => restart_after_record(w, name).await,
        Err(_) => Ok(()),
    };
    w.b.pause_process("agent", false)?;
    let (name, uid, created) = submitted?;
    restarted?;
    let run = settle(w, &name, created, DEADLINE + GRACE + SLACK).await?;
    let last_terminal = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let jobs = watch.jobs_of("cluster-b", &uid);
    let measurements = measurements(&run);
    let o = outcome(
        &run,
        "cluster-b",
        phase(&run) == "Successful" && jobs == 1 && measurements == 1,
        format!(
            "{jobs} Job(s) in {measurements} measurement(s) (want Successful, 1 Job, 1 \
             measurement)"
        ),
    );
    // Only this replica knows the record: leave it the retention to sweep the Job (what it
    // leaves is counted as left over), then bring the Kubernetes-store replicas back.
    let b = &w.b;
    let _ = eventually(
        "the memory-store run's Job swept",
        RETENTION + SWEEP_EVERY + Duration::from_secs(30),
        || async { Ok(jobs_of(b, &uid).await?.is_empty()) },
    )
    .await;
    w.control.kill_process("server-1")?;
    w.restart_replica(0).await?;
    w.restart_replica(1).await?;
    Ok((
        o,
        Done {
            last_terminal,
            servers_back: Instant::now(),
        },
    ))
}

/// Waits until run `name` has a measurement (the server wrote the agent's record before it
/// answered the plugin's Run), then kills the memory-store replica and starts it again.
async fn restart_after_record(w: &mut World<Agents>, name: &str) -> Result<()> {
    let runs = w.runs();
    analysis::wait_for(&runs, name, Duration::from_secs(60), |r| {
        r.data
            .pointer("/status/metricResults/0/measurements/0")
            .is_some()
    })
    .await?;
    w.control.kill_process("server-1")?;
    w.restart_replica_with(0, Store::Memory).await
}
