//! Reading AnalysisRuns the way Kargo does: the phase, the message of the last measurement, and
//! waiting until the controller has decided.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, DynamicObject};
use serde_json::Value;

use crate::wait::{eventually, Progress};

/// How long a verification may take to reach a verdict (Jobs run seconds; the controller
/// measures every few seconds).
pub const VERDICT_TIMEOUT: Duration = Duration::from_secs(120);

/// The run's `status.phase` (`""` before the controller has seen it).
pub fn phase(run: &DynamicObject) -> String {
    text_at(run, "/status/phase")
}

/// Whether the controller has decided: Successful, Failed, Error or Inconclusive.
pub fn is_finished(run: &DynamicObject) -> bool {
    matches!(
        phase(run).as_str(),
        "Successful" | "Failed" | "Error" | "Inconclusive"
    )
}

/// The message of the last measurement of the run's first metric: where the plugin's verdict
/// text (destination, reason, log tail) lands.
pub fn measurement_message(run: &DynamicObject) -> String {
    last_measurement(run)
        .and_then(|m| m.get("message"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// The last measurement of the run's first metric, if it has one.
pub fn last_measurement(run: &DynamicObject) -> Option<&Value> {
    run.data
        .pointer("/status/metricResults/0/measurements")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
}

/// The run's own `status.message` followed by its last measurement's message: where an error
/// that stops the whole run shows up.
pub fn all_messages(run: &DynamicObject) -> String {
    text_at(run, "/status/message") + &measurement_message(run)
}

/// The run's name.
pub fn name(run: &DynamicObject) -> &str {
    run.metadata.name.as_deref().unwrap_or_default()
}

/// The run's UID (what our Jobs carry as `rollouts-dispatch.io/run-uid`).
pub fn uid(run: &DynamicObject) -> String {
    run.metadata.uid.clone().unwrap_or_default()
}

/// Polls run `name` until it is finished (or `done` holds for it), for up to `timeout`.
pub async fn wait_for(
    runs: &Api<DynamicObject>,
    name: &str,
    timeout: Duration,
    done: impl Fn(&DynamicObject) -> bool,
) -> Result<DynamicObject> {
    eventually(&format!("analysisrun {name}"), timeout, || async {
        let run = runs
            .get(name)
            .await
            .with_context(|| format!("getting analysisrun {name}"))?;
        Ok(if done(&run) {
            Progress::Done(run)
        } else {
            Progress::Waiting(format!("status {}", run.data["status"]))
        })
    })
    .await
}

/// Polls run `name` until the controller has decided, for up to [`VERDICT_TIMEOUT`].
pub async fn wait_finished(runs: &Api<DynamicObject>, name: &str) -> Result<DynamicObject> {
    wait_for(runs, name, VERDICT_TIMEOUT, is_finished).await
}

fn text_at(run: &DynamicObject, pointer: &str) -> String {
    run.data
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}
