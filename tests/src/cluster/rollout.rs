//! An application deployed by Argo Rollouts on a destination cluster, for the `rollout:` check:
//! a canary [`Rollout`] whose pods kwok keeps running, with a background analysis (an
//! AnalysisTemplate whose built-in `job` metric passes or fails, [`Analysis`]), updated to a new
//! image, aborted as `kubectl argo rollouts abort` does, and read back: its phase and the
//! AnalysisRuns the Rollouts controller ran for it.
//!
//! The controller is a second [`super::argo::ArgoRollouts`] on the destination (no plugins);
//! the kube-controller-manager of every test cluster runs the ReplicaSet and Job controllers it
//! needs (see `super::Cluster`).

use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::Client;
use serde_json::{json, Value};

use super::argo;
use crate::block::Block;
use crate::wait::{eventually, Progress};

/// The image repository of the test application (never pulled: kwok runs the pods).
pub const APP_REPO: &str = "example.invalid/shop";
/// Field manager of the test's writes.
const MANAGER: &str = "dispatch-tests";
/// How long a Rollout may take to reach a phase (its steps pause for [`PAUSE`]).
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(120);
/// The canary's pause: longer than the analysis Job ([`ANALYSIS_DURATION`] plus the Job and
/// pod controllers' latency), so that the background analysis decides before the Rollout is
/// promoted: a fully promoted Rollout runs no background analysis, and a failed one aborts it
/// only while it is running (argo-rollouts rollout/analysis.go:350-386 at 9f8d111d8,
/// `reconcileBackgroundAnalysisRun`: `IsFullyPromoted` → none; `Failed`/`Error` → `AddAbort`).
pub const PAUSE: &str = "15s";
/// How long the analysis Job's check runs.
pub const ANALYSIS_DURATION: &str = "2s";

/// The background analysis a Rollout runs during its canary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analysis {
    /// The `job` metric's check exits 0: the AnalysisRun is Successful, the Rollout promotes.
    Passes,
    /// It exits 1: the AnalysisRun is Failed and the controller aborts the Rollout.
    Fails,
}

impl Analysis {
    /// The AnalysisTemplate's name.
    pub fn template(self) -> &'static str {
        match self {
            Self::Passes => "smoke-passes",
            Self::Fails => "smoke-fails",
        }
    }

    fn exit_code(self) -> i32 {
        match self {
            Self::Passes => 0,
            Self::Fails => 1,
        }
    }
}

/// The name of the `job` metric of both templates (what a failed verdict quotes; not `smoke`,
/// the metric of the Kargo verifications, so that quoting it proves the Rollout's was read).
pub const METRIC: &str = "shop-health";

/// `<APP_REPO>:<tag>`.
pub fn image(tag: &str) -> String {
    format!("{APP_REPO}:{tag}")
}

/// The `Rollout` resource (argoproj.io/v1alpha1).
pub fn rollout_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"),
        "rollouts",
    )
}

fn analysis_template_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisTemplate"),
        "analysistemplates",
    )
}

/// Applies both AnalysisTemplates ([`Analysis`]) in `namespace`: one `job` metric whose Job's
/// pod kwok ends with the variant's exit code after [`ANALYSIS_DURATION`].
pub async fn apply_analysis_templates(client: &Client, namespace: &str) -> Result<()> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &analysis_template_resource());
    for analysis in [Analysis::Passes, Analysis::Fails] {
        let name = analysis.template();
        let spec = Block::default()
            .exits(analysis.exit_code())
            .runs_for(ANALYSIS_DURATION)
            .container("command", json!(["sh", "-c", "curl -f http://shop/health"]))
            .job_spec();
        let template: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"metrics": [{"name": METRIC, "provider": {"job": {"spec": spec}}}]}
        }))?;
        api.patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&template),
        )
        .await
        .with_context(|| format!("applying AnalysisTemplate {namespace}/{name}"))?;
    }
    Ok(())
}

/// A canary Rollout of 2 replicas running [`image`]`(tag)`.
#[derive(Debug, Clone)]
pub struct Rollout {
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its background analysis.
    pub analysis: Analysis,
    /// Whether its canary pauses until promoted (`pause: {}`) instead of for [`PAUSE`].
    pub pauses_indefinitely: bool,
}

impl Rollout {
    /// Rollout `namespace/name` with `analysis` as its background analysis.
    pub fn new(namespace: &str, name: &str, analysis: Analysis) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            analysis,
            pauses_indefinitely: false,
        }
    }

    /// The canary pauses at 50 % until promoted or aborted.
    pub fn pausing(mut self) -> Self {
        self.pauses_indefinitely = true;
        self
    }

    fn api(&self, client: &Client) -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), &self.namespace, &rollout_resource())
    }

    /// The Rollout's manifest running `image`.
    pub fn manifest(&self, image: &str) -> Value {
        let pause = if self.pauses_indefinitely {
            json!({})
        } else {
            json!({"duration": PAUSE})
        };
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "replicas": 2,
                "revisionHistoryLimit": 2,
                "selector": {"matchLabels": {"app": self.name}},
                "template": {
                    "metadata": {"labels": {"app": self.name}},
                    "spec": {"containers": [{"name": "shop", "image": image}]}
                },
                "strategy": {"canary": {
                    "analysis": {"templates": [{"templateName": self.analysis.template()}]},
                    "steps": [{"setWeight": 50}, {"pause": pause}]
                }}
            }
        })
    }

    /// Creates the Rollout on `image` and waits until it is Healthy (a first revision is
    /// promoted at once, without steps or analysis).
    pub async fn create(&self, client: &Client, image: &str) -> Result<DynamicObject> {
        let object: DynamicObject = serde_json::from_value(self.manifest(image))?;
        self.api(client)
            .patch(
                &self.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&object),
            )
            .await
            .with_context(|| format!("creating Rollout {}/{}", self.namespace, self.name))?;
        self.wait_phase(client, "Healthy").await
    }

    /// Updates the pod template to `image`: a new revision, which the canary steps and the
    /// background analysis then take through.
    pub async fn set_image(&self, client: &Client, image: &str) -> Result<()> {
        // A merge patch replaces the list: the one container, with the new image (custom
        // resources take no strategic merge patch).
        let merge = json!({"spec": {"template": {"spec": {"containers": [{"name": "shop", "image": image}]}}}});
        self.api(client)
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&merge))
            .await
            .with_context(|| format!("setting Rollout {} to {image}", self.name))?;
        Ok(())
    }

    /// Aborts the update exactly as `kubectl argo rollouts abort` does: a merge patch
    /// `{"status":{"abort":true}}` on the `status` subresource (argo-rollouts v1.10.1
    /// pkg/kubectl-argo-rollouts/cmd/abort/abort.go:30,65).
    pub async fn abort(&self, client: &Client) -> Result<()> {
        let patch = json!({"status": {"abort": true}});
        self.api(client)
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("aborting Rollout {}", self.name))?;
        Ok(())
    }

    /// The Rollout as the controller last wrote it.
    pub async fn get(&self, client: &Client) -> Result<DynamicObject> {
        self.api(client)
            .get(&self.name)
            .await
            .with_context(|| format!("getting Rollout {}/{}", self.namespace, self.name))
    }

    /// Waits until the Rollout's `status.phase` is `want` for its current spec (the
    /// controller has observed the latest generation).
    pub async fn wait_phase(&self, client: &Client, want: &str) -> Result<DynamicObject> {
        eventually(
            &format!("Rollout {} {want}", self.name),
            ROLLOUT_TIMEOUT,
            || async {
                let rollout = self.get(client).await?;
                let generation = rollout.metadata.generation.unwrap_or_default().to_string();
                let observed = text(&rollout, "/status/observedGeneration") == generation;
                Ok(if observed && text(&rollout, "/status/phase") == want {
                    Progress::Done(rollout)
                } else {
                    Progress::Waiting(format!("status {}", rollout.data["status"]))
                })
            },
        )
        .await
    }

    /// The AnalysisRuns the controller created for this Rollout (owned by it), oldest first.
    pub async fn analysis_runs(&self, client: &Client) -> Result<Vec<DynamicObject>> {
        let mut runs: Vec<DynamicObject> = argo::analysis_runs(client, &self.namespace)
            .list(&ListParams::default())
            .await
            .with_context(|| format!("listing AnalysisRuns in {}", self.namespace))?
            .items
            .into_iter()
            .filter(|run| {
                run.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "Rollout" && o.name == self.name)
            })
            .collect();
        runs.sort_by_key(|r| r.metadata.creation_timestamp.clone());
        Ok(runs)
    }

    /// Waits until the Rollout's AnalysisRun of revision `image` is decided; returns it.
    pub async fn decided_analysis_run(&self, client: &Client) -> Result<DynamicObject> {
        eventually(
            &format!("the AnalysisRun of Rollout {} decided", self.name),
            ROLLOUT_TIMEOUT,
            || async {
                let runs = self.analysis_runs(client).await?;
                Ok(match runs.last() {
                    Some(run) if crate::analysis::is_finished(run) => Progress::Done(run.clone()),
                    Some(run) => Progress::Waiting(format!(
                        "{} {}",
                        crate::analysis::name(run),
                        run.data["status"]
                    )),
                    None => Progress::Waiting("no AnalysisRun yet".into()),
                })
            },
        )
        .await
    }
}

/// The text at JSON `pointer` of `object`, numbers included (`""` when absent).
pub fn text(object: &DynamicObject, pointer: &str) -> String {
    match object.data.pointer(pointer) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rollout_runs_its_analysis_in_the_background_and_pauses_as_told() {
        let timed = Rollout::new("shop", "a", Analysis::Fails).manifest(&image("v1"));
        let canary = &timed["spec"]["strategy"]["canary"];
        assert_eq!(
            canary["analysis"]["templates"][0]["templateName"],
            "smoke-fails"
        );
        assert_eq!(canary["steps"][1]["pause"]["duration"], PAUSE);
        assert_eq!(
            timed["spec"]["template"]["spec"]["containers"][0]["image"],
            "example.invalid/shop:v1"
        );
        let held = Rollout::new("shop", "b", Analysis::Passes)
            .pausing()
            .manifest("x");
        assert_eq!(
            held["spec"]["strategy"]["canary"]["steps"][1]["pause"],
            json!({})
        );
    }
}
