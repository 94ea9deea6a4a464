//! Every way a real kubelet keeps a container from running, each ending the measurement fast
//! (Error, Failed or Inconclusive with the kubelet's or the scheduler's words), not at the
//! deadline: what kwok never showed. Each is `smoke.yaml`'s metric with one thing changed, run
//! as a Kargo-shaped AnalysisRun through the installed product, all at once.

use std::time::Instant;

use anyhow::{bail, Result};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::kargo::Freight;
use serde_json::{json, Value};

use crate::examples::{project_runs, run_from, template, verdict_of};

/// One scenario: what is changed in the Job spec of the metric's block, the phase it must end
/// in, and the words its message must hold.
struct Scenario {
    name: &'static str,
    change: fn(&mut Value),
    phase: &'static [&'static str],
    says: &'static [&'static str],
}

/// The check container of a Job spec.
fn container(job: &mut Value) -> &mut Value {
    &mut job["template"]["spec"]["containers"][0]
}

const SCENARIOS: [Scenario; 6] = [
    Scenario {
        name: "CreateContainerConfigError",
        // a key of a ConfigMap that does not exist (the policy allows `missing-*`)
        change: |job| {
            container(job)["env"] = json!([{"name": "K", "valueFrom": {"configMapKeyRef": {"name": "missing-config", "key": "k"}}}]);
        },
        phase: &["Error"],
        says: &["CreateContainerConfigError", "missing-config"],
    },
    Scenario {
        name: "CrashLoopBackOff",
        // restarted in place (OnFailure) with retries left (backoffLimit 0 fails the Job, and
        // its pod goes, before the kubelet's back-off shows): the kubelet's CrashLoopBackOff,
        // with the last run's log from the kubelet
        change: |job| {
            job["backoffLimit"] = json!(6);
            job["template"]["spec"]["restartPolicy"] = json!("OnFailure");
            container(job)["command"] =
                json!(["sh", "-c", format!("echo {KUBELET_LOG_LINE}; exit 3")]);
        },
        phase: &["Failed"],
        says: &["CrashLoopBackOff", KUBELET_LOG_LINE],
    },
    Scenario {
        name: "ErrImagePull",
        // a tag the node's registry does not have: a real 404 from a real pull
        change: |job| container(job)["image"] = json!("busybox:0.0.0-not-pushed"),
        phase: &["Inconclusive"],
        says: &["busybox:0.0.0-not-pushed"],
    },
    Scenario {
        name: "InvalidImageName",
        change: |job| container(job)["image"] = json!("BUSYBOX:1.37"),
        phase: &["Error"],
        says: &["InvalidImageName"],
    },
    Scenario {
        name: "Unschedulable",
        // all of the node's 2 CPUs (the policy's default cap): other pods already hold some
        change: |job| {
            container(job)["resources"] = json!({"requests": {"cpu": "2"}, "limits": {"cpu": "2"}});
        },
        phase: &["Error"],
        says: &["Unschedulable", "Insufficient cpu"],
    },
    Scenario {
        name: "RunContainerError",
        // an entrypoint that is not in the image: runc cannot start it
        change: |job| container(job)["command"] = json!(["/no/such/binary"]),
        phase: &["Error", "Failed"],
        says: &["/no/such/binary"],
    },
];

/// The line the crash-looping check prints, which its verdict must quote from the kubelet's log.
pub(crate) const KUBELET_LOG_LINE: &str = "crash-marker from the kubelet log";

/// What [`check_all`] saw.
pub(crate) struct Outcome {
    /// scenarios that ended as they must
    pub(crate) planned: usize,
    /// scenarios
    pub(crate) total: usize,
    /// a verdict quoted a container's output, read through the API server from the real kubelet
    pub(crate) kubelet_log: bool,
}

/// Runs every scenario at once; returns how many ended as they must (each printed, with how
/// long it took from the run's creation to its verdict).
pub(crate) async fn check_all(cluster: &Cluster, freight: &Freight) -> Result<Outcome> {
    let smoke = template("smoke.yaml")?;
    let runs = project_runs(cluster).await?;
    let mut waits = Vec::new();
    for (i, scenario) in SCENARIOS.iter().enumerate() {
        let mut changed = smoke.clone();
        (scenario.change)(
            &mut changed["spec"]["metrics"][0]["provider"]["plugin"]["rollouts-dispatch/job"]
                ["spec"],
        );
        let run = run_from(
            &changed,
            freight,
            "waiting",
            &format!("01jwait{i:019}"),
            &[("destination", "in-cluster")],
        )?;
        let runs = runs.clone();
        waits.push(async move {
            let started = Instant::now();
            let verdict = verdict_of(&runs, run).await;
            (i, started.elapsed(), verdict)
        });
    }
    let mut planned = 0;
    let mut kubelet_log = false;
    for (i, took, verdict) in futures::future::join_all(waits).await {
        let (phase, message) = verdict?;
        kubelet_log |= message.contains(KUBELET_LOG_LINE);
        println!(
            "real: waiting {}: {phase} in {:.0}s: {message}",
            SCENARIOS[i].name,
            took.as_secs_f64()
        );
        match as_planned(i, &phase, &message) {
            Ok(()) => planned += 1,
            Err(err) => println!(
                "real: waiting {}: NOT AS PLANNED: {err:#}",
                SCENARIOS[i].name
            ),
        }
    }
    Ok(Outcome {
        planned,
        total: SCENARIOS.len(),
        kubelet_log,
    })
}

/// Whether scenario `i` ended as it must.
fn as_planned(i: usize, phase: &str, message: &str) -> Result<()> {
    let s = &SCENARIOS[i];
    if !s.phase.contains(&phase) {
        bail!("{}: ended {phase}, not {:?}: {message}", s.name, s.phase);
    }
    for words in s.says {
        if !message.contains(words) {
            bail!("{}: the message does not say {words:?}: {message}", s.name);
        }
    }
    Ok(())
}
