//! The resume patch (#30, `dispatch_metric_provider::resume::resume_patch`) against a real API
//! server and the real AnalysisRun CRD: the plugin reads a run, then patches its measurement's
//! `resumeAt` guarded by `test`s, and every write that lands in between makes the API server
//! refuse the whole patch, changing nothing. The run carries another controller instance's
//! label, so the real controller on this cluster leaves it alone and the test plays it.

use anyhow::{ensure, Context, Result};
use dispatch_api::v1::ResumeHint;
use dispatch_metric_provider::resume::resume_patch;
use dispatch_plugin::gob::GoTime;
use dispatch_tests::cluster::argo;
use dispatch_tests::kargo::CONTROLLER_INSTANCE_LABEL;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};

const RUN: &str = "resume-race";
const JOB: &str = "resume-race.smoke.1";

/// The run as the controller leaves it mid-measurement: `resumeAt` 60 s ahead.
fn run_object(now: GoTime) -> Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
        "metadata": {"name": RUN, "namespace": "default",
                     "labels": {CONTROLLER_INSTANCE_LABEL: "nobody"}},
        "spec": {"metrics": [{"name": "smoke", "provider": {"job": {"spec": {"template": {"spec": {
            "restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}}}}]},
        "status": {"phase": "Running", "metricResults": [{"name": "smoke", "phase": "Running",
            "measurements": [{"phase": "Running", "startedAt": now.to_rfc3339(),
                "resumeAt": GoTime::from_unix(now.unix_seconds + 60, 0).to_rfc3339(),
                "metadata": {"job-name": JOB}}]}]}
    }))?)
}

fn resume_at(run: &DynamicObject) -> String {
    run.data
        .pointer("/status/metricResults/0/measurements/0/resumeAt")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Reads the run and computes the plugin's patch, as `Resumer::poke` does.
async fn read_and_plan(runs: &Api<DynamicObject>) -> Result<(DynamicObject, Value)> {
    let run = runs.get(RUN).await?;
    let hint = ResumeHint {
        namespace: "default".into(),
        run_uid: run.metadata.uid.clone().unwrap_or_default(),
        job: JOB.into(),
    };
    let value = serde_json::to_value(&run)?;
    let patch = resume_patch(&value, &hint, "smoke", GoTime::now())
        .map_err(|why| anyhow::anyhow!("no patch: {why}"))?;
    Ok((run, patch))
}

async fn apply(runs: &Api<DynamicObject>, patch: &Value) -> kube::Result<DynamicObject> {
    let patch: json_patch::Patch =
        serde_json::from_value(patch.clone()).map_err(kube::Error::SerdeError)?;
    runs.patch(RUN, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
}

fn refused(r: &kube::Result<DynamicObject>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 422 || s.code == 404)
}

/// The races; returns how many the API server refused (all of them, or an error).
pub(crate) async fn resume_patch_races(client: &kube::Client) -> Result<usize> {
    let runs = argo::analysis_runs(client, "default");
    runs.create(&PostParams::default(), &run_object(GoTime::now())?)
        .await
        .context("creating the race run")?;
    let mut refusals = 0;

    // 1. The controller writes the measurement between our read and our patch.
    let (_, patch) = read_and_plan(&runs).await?;
    let theirs = GoTime::from_unix(GoTime::now().unix_seconds + 30, 0).to_rfc3339();
    controller_writes(&runs, &theirs).await?;
    let r = apply(&runs, &patch).await;
    ensure!(
        refused(&r),
        "a patch over the controller's write landed: {r:?}"
    );
    ensure!(
        resume_at(&runs.get(RUN).await?) == theirs,
        "the controller's resumeAt changed"
    );
    refusals += 1;

    // 2. Nothing in between: the measurement resumes now.
    let (_, patch) = read_and_plan(&runs).await?;
    let moved = apply(&runs, &patch)
        .await
        .context("the plain resume patch")?;
    let at = GoTime::parse_rfc3339(&resume_at(&moved)).context("resumeAt after the patch")?;
    ensure!(
        at <= GoTime::now(),
        "resumeAt {} is not now",
        resume_at(&moved)
    );

    // 3. The measurement finishes in between.
    controller_writes(&runs, &theirs).await?;
    let (_, patch) = read_and_plan(&runs).await?;
    runs.patch(
        RUN,
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"metricResults": [{"name": "smoke", "phase": "Successful",
            "measurements": [{"phase": "Successful", "finishedAt": GoTime::now().to_rfc3339(),
                              "metadata": {"job-name": JOB}}]}]}}),
        ),
    )
    .await?;
    let r = apply(&runs, &patch).await;
    ensure!(
        refused(&r),
        "a patch of a finished measurement landed: {r:?}"
    );
    refusals += 1;

    // 4. The run is deleted and created again under its name (another uid) in between.
    runs.delete(RUN, &DeleteParams::default()).await?;
    wait_gone(&runs).await?;
    runs.create(&PostParams::default(), &run_object(GoTime::now())?)
        .await?;
    let (_, patch) = read_and_plan(&runs).await?;
    runs.delete(RUN, &DeleteParams::default()).await?;
    wait_gone(&runs).await?;
    let again = runs
        .create(&PostParams::default(), &run_object(GoTime::now())?)
        .await?;
    let r = apply(&runs, &patch).await;
    ensure!(
        refused(&r),
        "a patch of the run's predecessor landed on it: {r:?}"
    );
    ensure!(
        resume_at(&runs.get(RUN).await?) == resume_at(&again),
        "the new run's resumeAt changed"
    );
    refusals += 1;

    // 5. The run is deleted in between.
    let (_, patch) = read_and_plan(&runs).await?;
    runs.delete(RUN, &DeleteParams::default()).await?;
    wait_gone(&runs).await?;
    let r = apply(&runs, &patch).await;
    ensure!(refused(&r), "a patch of a deleted run landed: {r:?}");
    refusals += 1;
    Ok(refusals)
}

/// The controller's write of the measurement, still running, resuming at `resume_at`.
async fn controller_writes(runs: &Api<DynamicObject>, resume_at: &str) -> Result<()> {
    let status = json!({"status": {"metricResults": [{"name": "smoke", "phase": "Running",
        "measurements": [{"phase": "Running", "resumeAt": resume_at, "metadata": {"job-name": JOB}}]}]}});
    runs.patch(RUN, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

async fn wait_gone(runs: &Api<DynamicObject>) -> Result<()> {
    for _ in 0..100 {
        if runs.get_opt(RUN).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!("run {RUN} still there 10 s after its deletion")
}
