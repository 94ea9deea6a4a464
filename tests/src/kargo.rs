//! AnalysisRuns shaped exactly as Kargo creates them for a Stage's verification: name
//! `<stage>.<ulid>.<freight7>`, the Kargo labels and promotion annotation, a Freight owner
//! reference, and the `destination` arg that a Stage's `verification.args` provides.

use std::time::Duration;

use anyhow::{Context, Result};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use crate::artifacts::PLUGIN_NAME;
use crate::block::Block;
use crate::objects;
use crate::wait::{eventually, Progress};

/// The Kargo project (namespace) of the verifications.
pub const PROJECT: &str = "kargo-demo";
/// A second Kargo project the e2e policy allows on the same destinations: the tenant of the
/// cross-project attack scenarios.
pub const TENANT_B: &str = "tenant-b";

/// The log a failing check prints (its termination message on the test clusters); the verdict
/// must quote its last lines.
pub const FAILED_CHECK_LOG: &str =
    "GET http://svc/health\nHTTP 503 Service Unavailable\ncheck failed: svc is not healthy\n";

/// The Freight that owns the verifications, as Kargo's owner reference needs it.
#[derive(Debug, Clone)]
pub struct Freight {
    /// The Freight's name (a commit-like hash; its first 7 characters end run names).
    pub name: String,
    /// The Freight's UID.
    pub uid: String,
}

impl Freight {
    /// Installs a minimal Freight CRD on the control plane and creates one Freight in
    /// [`PROJECT`], so AnalysisRuns can carry Kargo's owner reference.
    pub async fn create(client: &kube::Client) -> Result<Self> {
        objects::create_crd(client, "kargo.akuity.io", "Freight", "freights").await?;
        let resource = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("kargo.akuity.io", "v1alpha1", "Freight"),
            "freights",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), PROJECT, &resource);
        let name = "abc1234f9e8d7c6b5a4938271605f4e3d2c1b0a9";
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight",
            "metadata": {"name": name, "namespace": PROJECT}, "origin": {"kind": "Warehouse", "name": "w"}
        }))?;
        // An Established CRD can take a moment longer to be served for writes.
        let created = eventually("a Freight created", Duration::from_secs(30), || async {
            Ok(match api.create(&PostParams::default(), &object).await {
                Ok(created) => Progress::Done(created),
                Err(e) => Progress::Waiting(e.to_string()),
            })
        })
        .await?;
        Ok(Self {
            name: name.into(),
            uid: created.metadata.uid.unwrap_or_default(),
        })
    }
}

/// One Kargo-shaped verification: Stage `stage` verifying Freight on destination arg
/// `destination`, with a `rollouts-dispatch/job` metric whose check exits 0 after 2 s unless
/// told otherwise.
#[derive(Debug, Clone)]
pub struct Verification {
    stage: String,
    ulid: String,
    destination: String,
    routing: Value,
    exit_code: i32,
    duration: String,
    image: Option<String>,
    promotion: bool,
    observe: Option<Value>,
}

impl Verification {
    /// Stage `stage`, run id `ulid` (26 characters), destination arg `destination`; the block
    /// routes by `destination: "{{args.destination}}"`, as the example templates do.
    pub fn new(stage: &str, ulid: &str, destination: &str) -> Self {
        Self {
            stage: stage.into(),
            ulid: ulid.into(),
            destination: destination.into(),
            routing: json!({"destination": "{{args.destination}}"}),
            exit_code: 0,
            duration: "2s".into(),
            image: None,
            promotion: true,
            observe: None,
        }
    }

    /// The check exits with `code`; a failing check prints [`FAILED_CHECK_LOG`].
    pub fn exits(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }

    /// The check runs for `duration` (a Go duration).
    pub fn runs_for(mut self, duration: &str) -> Self {
        self.duration = duration.into();
        self
    }

    /// The check container runs `image` instead of [`crate::block::CHECK_IMAGE`].
    pub fn image(mut self, image: &str) -> Self {
        self.image = Some(image.into());
        self
    }

    /// A re-verification: a new run for the same Stage and Freight, started by a person
    /// (`kargo.akuity.io/reverify` on the Stage). Kargo v1.11 adds the promotion annotation only
    /// to the first verification after a promotion or a control-plane reverify
    /// (akuity/kargo v1.11.2 pkg/controller/stages/regular_stages.go:1540-1546), so this run
    /// carries none.
    pub fn reverification(mut self) -> Self {
        self.promotion = false;
        self
    }

    /// Routes by these block fields instead (e.g. `destinationSelector` and `require`).
    pub fn routed(mut self, routing: Value) -> Self {
        self.routing = routing;
        self
    }

    /// An observe check instead of a Job: `check` is the block's `rollout` or `application`
    /// field as a Stage's AnalysisTemplate writes it, e.g.
    /// `json!({"rollout": {"name": "shop", "image": "repo:tag"}})`, beside the routing fields.
    pub fn observes(mut self, check: Value) -> Self {
        self.observe = Some(check);
        self
    }

    /// The block of the verification's metric as the plugin receives it: the routing fields and
    /// the observe check, else [`Self::block`]'s Job.
    pub fn block_json(&self) -> Value {
        match (&self.observe, &self.routing) {
            (Some(Value::Object(check)), Value::Object(routing)) => {
                let mut block = routing.clone();
                block.extend(check.clone());
                Value::Object(block)
            }
            _ => self.block().json(),
        }
    }

    /// The plugin block of the verification's metric.
    pub fn block(&self) -> Block {
        let mut block = Block::routed(self.routing.clone())
            .exits(self.exit_code)
            .runs_for(&self.duration)
            .with("logTail", json!(5))
            .container("command", json!(["sh", "-c", "curl -f http://svc"]));
        if self.exit_code != 0 {
            block = block.logs(FAILED_CHECK_LOG);
        }
        if let Some(image) = &self.image {
            block = block.container("image", json!(image));
        }
        block
    }

    /// The AnalysisRun Kargo would create in [`PROJECT`] for this verification of `freight`.
    pub fn analysis_run(&self, freight: &Freight) -> Result<DynamicObject> {
        let Self { stage, ulid, .. } = self;
        let name = format!("{stage}.{ulid}.{}", &freight.name[..7]);
        let annotations = if self.promotion {
            json!({"kargo.akuity.io/promotion": format!("{stage}.{ulid}.promo")})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {
                "name": name, "namespace": PROJECT,
                "labels": {"kargo.akuity.io/stage": stage, "kargo.akuity.io/freight-collection": "9f8e7d6c5b4a39281706f5e4d3c2b1a098765432"},
                "annotations": annotations,
                "ownerReferences": [{"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "name": freight.name, "uid": freight.uid, "blockOwnerDeletion": false}]
            },
            "spec": {
                "args": [{"name": "destination", "value": self.destination}],
                "metrics": [{"name": "smoke", "provider": {"plugin": {PLUGIN_NAME: self.block_json()}}}]
            }
        }))
        .with_context(|| format!("building AnalysisRun {name}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_observe_block_is_the_routing_and_the_check_without_a_job() {
        let check = json!({"rollout": {"name": "shop", "image": "r:v2"}});
        let block = Verification::new("s", "01j", "cluster-a")
            .observes(check)
            .block_json();
        assert_eq!(
            block,
            json!({"destination": "{{args.destination}}", "rollout": {"name": "shop", "image": "r:v2"}})
        );
        let job = Verification::new("s", "01j", "cluster-a").block_json();
        assert!(job.get("spec").is_some() && job.get("rollout").is_none());
    }
}
