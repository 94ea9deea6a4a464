//! AnalysisRuns shaped exactly as Kargo v1.11 creates them for a Stage's verification
//! (akuity/kargo v1.11.2 `RegularStageReconciler.startVerification`,
//! pkg/controller/stages/regular_stages.go:1427-1579, through `AnalysisRunBuilder`,
//! pkg/rollouts/analysis_run_builder.go):
//!
//! * name `<stage>.<ulid>.<first 7 characters of the freight collection id>`, lowercased
//!   (`WithNamePrefix(stage.Name)`, `WithNameSuffix(freight.ID)`: regular_stages.go:1494-1495;
//!   the suffix cut to 7, pkg/rollouts/options.go:18,99-105; joined with `.` and lowercased,
//!   analysis_run_builder.go:107-121). The collection id is the hex SHA-1 of the collection's
//!   Freight names, not a Freight name ([`FREIGHT_COLLECTION_ID`]);
//!   A Stage name past 218 characters is cut in the name, as Kargo cuts it ([`naming`]);
//! * labels `kargo.akuity.io/stage` (the Stage name, shortened with a hash past 63 characters:
//!   [`naming::label_value`]) and
//!   `kargo.akuity.io/freight-collection` (the collection id), regular_stages.go:1496-1499, and
//!   `argo-rollouts.argoproj.io/controller-instance-id` when Kargo's controller has
//!   `ROLLOUTS_CONTROLLER_INSTANCE_ID` (analysis_run_builder.go:150-152,
//!   [`Verification::for_controller_instance`]);
//! * annotation `kargo.akuity.io/promotion` (the Stage's last Promotion) on the first
//!   verification of a freight collection and on a re-verification requested through Kargo's
//!   API, none on a re-verification requested by annotating the Stage
//!   (regular_stages.go:1540-1546, [`Verification::reverification`]); `kargo.akuity.io/stage`
//!   (the whole Stage name) only when the label had to be shortened (:1489,1527-1531);
//! * one owner reference per Freight of the collection, `blockOwnerDeletion: false`
//!   (:1533-1539, analysis_run_builder.go:272-278);
//! * the `destination` arg that a Stage's `verification.args` provides;
//! * the metrics of the Stage's templates, in order, each name once: metric `smoke` and those
//!   of [`Verification::with_metric`] (Kargo copies the templates' metrics into the run and
//!   refuses a name twice: `flattenMetrics`, pkg/rollouts/analysis_template.go:47-62, through
//!   `buildSpec`, analysis_run_builder.go:164-186).

pub mod naming;

use anyhow::{ensure, Context, Result};
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};

use crate::artifacts::PLUGIN_NAME;
use crate::block::Block;
use crate::objects;

/// The Kargo project (namespace) of the verifications.
pub const PROJECT: &str = "kargo-demo";
/// A second Kargo project the e2e policy allows on the same destinations: the tenant of the
/// cross-project attack scenarios.
pub const TENANT_B: &str = "tenant-b";

/// The log a failing check prints (its termination message on the test clusters); the verdict
/// must quote its last lines.
pub const FAILED_CHECK_LOG: &str =
    "GET http://svc/health\nHTTP 503 Service Unavailable\ncheck failed: svc is not healthy\n";

/// The name of the fixtures' one Freight (Kargo names a Freight by a hash of its artifacts).
pub const FREIGHT_NAME: &str = "abc1234f9e8d7c6b5a4938271605f4e3d2c1b0a9";

/// The id of the freight collection that holds only [`FREIGHT_NAME`]: Kargo sets it to the hex
/// SHA-1 of the collection's Freight names, sorted and joined by `,`
/// (`FreightCollection.UpdateOrPush`, akuity/kargo v1.11.2 api/v1alpha1/stage_types.go:591-604),
/// here `printf %s FREIGHT_NAME | sha1sum` (checked by a unit test below).
pub const FREIGHT_COLLECTION_ID: &str = "9811bd09b08335806fcd42b7646ad27d9571fd27";

/// The ULID of the Promotion that put the Freight into every fixture Stage.
const PROMOTION_ULID: &str = "01jq0p3n9m6x2w8r4t7v5s1kza";

/// Kargo's label naming the Argo Rollouts controller instance that must run an AnalysisRun
/// (akuity/kargo v1.11.2 pkg/rollouts/analysis_run_builder.go:25; Argo Rollouts'
/// `LabelKeyControllerInstanceID`, pkg/apis/rollouts/v1alpha1/types.go:161).
pub const CONTROLLER_INSTANCE_LABEL: &str = "argo-rollouts.argoproj.io/controller-instance-id";

/// Kargo's label with the (shortened) Stage name, and its annotation with the whole name when
/// the label had to be shortened (akuity/kargo v1.11.2 api/v1alpha1/labels.go:35,
/// annotations.go:59).
const STAGE_KEY: &str = "kargo.akuity.io/stage";

/// The name of the verification's own metric; [`Verification::with_metric`] adds others.
pub const SMOKE_METRIC: &str = "smoke";

/// The Freight that owns the verifications, as Kargo's owner reference needs it, and the
/// freight collection (of that Freight alone) that a Stage verifies.
#[derive(Debug, Clone)]
pub struct Freight {
    /// The Freight's name ([`FREIGHT_NAME`]; its first 7 characters end Promotion names).
    pub name: String,
    /// The Freight's UID.
    pub uid: String,
    /// The id of the freight collection ([`FREIGHT_COLLECTION_ID`]; its first 7 characters end
    /// AnalysisRun names).
    pub collection_id: String,
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
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight",
            "metadata": {"name": FREIGHT_NAME, "namespace": PROJECT}, "origin": {"kind": "Warehouse", "name": "w"}
        }))?;
        let created = objects::create_when_served(&api, &object).await?;
        Ok(Self {
            name: FREIGHT_NAME.into(),
            uid: created.metadata.uid.unwrap_or_default(),
            collection_id: FREIGHT_COLLECTION_ID.into(),
        })
    }

    /// The name of the Promotion that put this Freight into Stage `stage`
    /// ([`promotion_name`]).
    pub fn promotion(&self, stage: &str) -> String {
        promotion_name(stage, &self.name)
    }
}

/// Creates Stage `name` in [`PROJECT`] on the control plane (the stand-in CRD, installed if
/// missing: every field kept) as Kargo's `argocd-update` step leaves it: annotation
/// `kargo.akuity.io/argocd-context` listing the `{name, namespace}` of each Application the
/// step updated (akuity/kargo v1.11.2 pkg/promotion/runner/builtin/argocd_updater.go:201-207,
/// written to the Stage by pkg/api/stage.go:236-281), and `spec.shard` with the label Kargo's
/// webhook keeps equal to it (api/v1alpha1/stage_types.go:216-220), if `shard` is given.
pub async fn create_stage(
    client: &kube::Client,
    name: &str,
    applications: &[(&str, &str)],
    shard: Option<&str>,
) -> Result<DynamicObject> {
    objects::create_crd(client, "kargo.akuity.io", "Stage", "stages").await?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kargo.akuity.io", "v1alpha1", "Stage"),
        "stages",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), PROJECT, &resource);
    let context: Vec<Value> = applications
        .iter()
        .map(|(name, namespace)| json!({"name": name, "namespace": namespace}))
        .collect();
    let mut stage = json!({
        "apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Stage",
        "metadata": {"name": name, "namespace": PROJECT,
                     "annotations": {"kargo.akuity.io/argocd-context": Value::from(context).to_string()}},
        "spec": {"requestedFreight": [{"origin": {"kind": "Warehouse", "name": "w"},
                                       "sources": {"direct": true}}]}
    });
    if let Some(shard) = shard {
        stage["spec"]["shard"] = Value::from(shard);
        stage["metadata"]["labels"] = json!({"kargo.akuity.io/shard": shard});
    }
    objects::create_when_served(&api, &serde_json::from_value(stage)?).await
}

/// The name of the Promotion that put Freight `freight` into Stage `stage`, as Kargo names it:
/// `<stage, cut to 218>.<ulid>.<first 7 characters of the Freight's name>`, lowercased
/// (`GeneratePromotionName`, akuity/kargo v1.11.2 pkg/api/promotion.go:91-108). Kargo copies it
/// into a verification's `kargo.akuity.io/promotion` annotation.
pub fn promotion_name(stage: &str, freight: &str) -> String {
    let (stage, freight) = (naming::name_prefix(stage), naming::short_id(freight));
    format!("{stage}.{PROMOTION_ULID}.{freight}").to_lowercase()
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
    instance: Option<String>,
    observe: Option<Value>,
    metrics: Vec<(String, Value)>,
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
            instance: None,
            observe: None,
            metrics: Vec::new(),
        }
    }

    /// The check exits with `code`; a failing check prints [`FAILED_CHECK_LOG`].
    pub fn exits(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }

    /// The exit code the check is planned to end with.
    pub fn exit_code(&self) -> i32 {
        self.exit_code
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

    /// A re-verification requested by annotating the Stage (`kubectl annotate stage …
    /// kargo.akuity.io/reverify=<verification id>`): a new run for the same Stage and freight
    /// collection with no annotation at all. Kargo v1.11 adds `kargo.akuity.io/promotion` only
    /// when the collection has no verification yet, or when the re-verification request came
    /// from Kargo's control plane with an actor (akuity/kargo v1.11.2
    /// pkg/controller/stages/regular_stages.go:1540-1546): its API server, for the UI's and the
    /// CLI's reverify (pkg/api/stage.go:288-325 patches the annotation with the API server's own
    /// client, and the Stage webhook sets `controlPlane` for the control plane's user,
    /// pkg/webhook/kubernetes/stage/webhook.go:114-130). A request written by anyone else
    /// (kubectl, a GitOps tool) is not from the control plane, so its run carries none.
    pub fn reverification(mut self) -> Self {
        self.promotion = false;
        self
    }

    /// The run carries Kargo's `argo-rollouts.argoproj.io/controller-instance-id: <id>` label,
    /// as when Kargo's controller runs with `ROLLOUTS_CONTROLLER_INSTANCE_ID=<id>` (chart value
    /// `controller.rollouts.controllerInstanceID`; akuity/kargo v1.11.2
    /// pkg/controller/stages/regular_stages.go:55,1490-1492): only the Argo Rollouts controller
    /// started with `--instance-id <id>` runs it.
    pub fn for_controller_instance(mut self, id: &str) -> Self {
        self.instance = Some(id.into());
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

    /// One more `rollouts-dispatch/job` metric `name` in the run, after [`SMOKE_METRIC`], with
    /// plugin block `block` (e.g. another Verification's [`Self::block_json`], or a
    /// [`Block`]'s JSON): a Stage whose templates have several metrics. Argo Rollouts measures
    /// each and the run fails when any fails. A name twice (or `smoke`) is refused when the
    /// run is built, as Kargo refuses it.
    pub fn with_metric(mut self, name: &str, block: Value) -> Self {
        self.metrics.push((name.into(), block));
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

    /// The name Kargo gives the run of this verification of `freight`'s collection (the Stage
    /// name cut to 218 characters: [`naming::name_prefix`]).
    pub fn run_name(&self, freight: &Freight) -> String {
        let stage = naming::name_prefix(&self.stage);
        let collection = naming::short_id(&freight.collection_id);
        format!("{stage}.{}.{collection}", self.ulid).to_lowercase()
    }

    /// The run's metrics: [`SMOKE_METRIC`], then those of [`Self::with_metric`].
    fn metrics_json(&self) -> Result<Value> {
        let mut names = vec![SMOKE_METRIC];
        let mut metrics = vec![plugin_metric(SMOKE_METRIC, self.block_json())];
        for (name, block) in &self.metrics {
            ensure!(
                !names.contains(&name.as_str()),
                "duplicate metric name: {name:?} (Kargo refuses it: flattenMetrics, \
                 pkg/rollouts/analysis_template.go:53-55)"
            );
            names.push(name);
            metrics.push(plugin_metric(name, block.clone()));
        }
        Ok(Value::Array(metrics))
    }

    /// The AnalysisRun Kargo would create in [`PROJECT`] for this verification of `freight`'s
    /// collection (the module docs say where each field comes from).
    pub fn analysis_run(&self, freight: &Freight) -> Result<DynamicObject> {
        let stage = &self.stage;
        let name = self.run_name(freight);
        let stage_label = naming::label_value(stage);
        let mut annotations = serde_json::Map::new();
        if stage_label != *stage {
            annotations.insert(STAGE_KEY.into(), json!(stage));
        }
        let mut labels = json!({
            STAGE_KEY: stage_label,
            "kargo.akuity.io/freight-collection": freight.collection_id,
        });
        if let Some(instance) = &self.instance {
            labels[CONTROLLER_INSTANCE_LABEL] = json!(instance);
        }
        let mut metadata = json!({
            "name": name, "namespace": PROJECT, "labels": labels,
            "ownerReferences": [{"apiVersion": "kargo.akuity.io/v1alpha1", "kind": "Freight", "name": freight.name, "uid": freight.uid, "blockOwnerDeletion": false}]
        });
        if self.promotion {
            annotations.insert(
                "kargo.akuity.io/promotion".into(),
                json!(freight.promotion(stage)),
            );
        }
        if !annotations.is_empty() {
            metadata["annotations"] = Value::Object(annotations);
        }
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": metadata,
            "spec": {
                "args": [{"name": "destination", "value": self.destination}],
                "metrics": self.metrics_json()?
            }
        }))
        .with_context(|| format!("building AnalysisRun {name}"))
    }
}

/// A metric `name` of our plugin with block `block`.
fn plugin_metric(name: &str, block: Value) -> Value {
    json!({"name": name, "provider": {"plugin": {PLUGIN_NAME: block}}})
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

    fn freight() -> Freight {
        Freight {
            name: FREIGHT_NAME.into(),
            uid: "8c0d4bd4-0000-4000-8000-000000000001".into(),
            collection_id: FREIGHT_COLLECTION_ID.into(),
        }
    }

    #[test]
    fn the_collection_id_is_the_sha1_of_the_freight_name_as_kargo_computes_it() {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf %s {FREIGHT_NAME} | sha1sum")])
            .output()
            .expect("sh and sha1sum (coreutils)");
        let sum = String::from_utf8_lossy(&out.stdout);
        assert_eq!(sum.split_whitespace().next(), Some(FREIGHT_COLLECTION_ID));
    }

    #[test]
    fn a_first_verification_is_named_after_the_collection_and_annotated_with_the_promotion() {
        let run = Verification::new("uat", "01JABCDEFGHJKMNPQRSTVWXYZ0", "cluster-a")
            .analysis_run(&freight())
            .unwrap();
        let meta = serde_json::to_value(&run.metadata).unwrap();
        // The collection id's first 7 characters (not the Freight name's, "abc1234"), lowercased.
        assert_eq!(meta["name"], "uat.01jabcdefghjkmnpqrstvwxyz0.9811bd0");
        assert_eq!(
            meta["labels"],
            json!({"kargo.akuity.io/stage": "uat", "kargo.akuity.io/freight-collection": FREIGHT_COLLECTION_ID})
        );
        assert_eq!(
            meta["annotations"],
            json!({"kargo.akuity.io/promotion": "uat.01jq0p3n9m6x2w8r4t7v5s1kza.abc1234"})
        );
        assert_eq!(meta["ownerReferences"][0]["name"], FREIGHT_NAME);
        assert_eq!(meta["ownerReferences"][0]["blockOwnerDeletion"], false);
    }

    #[test]
    fn a_reverification_has_no_annotations_and_an_instance_gets_its_label() {
        let run = Verification::new("uat", "01jabcdefghjkmnpqrstvwxyz1", "cluster-a")
            .reverification()
            .for_controller_instance("shard-a")
            .analysis_run(&freight())
            .unwrap();
        let meta = serde_json::to_value(&run.metadata).unwrap();
        assert!(meta.get("annotations").is_none(), "{meta}");
        assert_eq!(meta["labels"][CONTROLLER_INSTANCE_LABEL], "shard-a");
    }

    #[test]
    fn a_long_stage_name_is_shortened_in_the_label_and_cut_in_the_names_as_kargo_does() {
        const ULID: &str = "01jlong0000000000000000000";
        // 60 fits a label as it is: nothing to shorten, no stage annotation.
        let sixty = "s".repeat(60);
        let run = Verification::new(&sixty, ULID, "cluster-a")
            .analysis_run(&freight())
            .unwrap();
        let meta = serde_json::to_value(&run.metadata).unwrap();
        assert_eq!(meta["labels"][STAGE_KEY], sixty.as_str());
        assert!(meta["annotations"].get(STAGE_KEY).is_none(), "{meta}");
        // 253, the longest Stage name: label 63 with a hash, the whole name in the annotation,
        // the run and Promotion names exactly 253.
        let longest = "l".repeat(253);
        let run = Verification::new(&longest, ULID, "cluster-a")
            .analysis_run(&freight())
            .unwrap();
        let meta = serde_json::to_value(&run.metadata).unwrap();
        let label = meta["labels"][STAGE_KEY].as_str().unwrap();
        assert_eq!(label, naming::label_value(&longest));
        assert_eq!(label.len(), 63);
        assert_eq!(meta["annotations"][STAGE_KEY], longest.as_str());
        assert_eq!(meta["name"].as_str().unwrap().len(), 253);
        let promotion = meta["annotations"]["kargo.akuity.io/promotion"].as_str();
        assert_eq!(promotion.map(str::len), Some(253));
    }

    #[test]
    fn several_metrics_are_in_the_run_in_order_and_a_name_twice_is_refused() {
        let failing = Verification::new("uat", "01j", "cluster-a").exits(1);
        let run = Verification::new("uat", "01jmetrics0000000000000000", "cluster-a")
            .with_metric("second", failing.block_json())
            .analysis_run(&freight())
            .unwrap();
        let metrics = &run.data["spec"]["metrics"];
        assert_eq!(metrics[0]["name"], SMOKE_METRIC);
        assert_eq!(metrics[1]["name"], "second");
        assert_eq!(
            metrics[1]["provider"]["plugin"][PLUGIN_NAME],
            failing.block_json()
        );
        let twice = Verification::new("uat", "01j", "cluster-a")
            .with_metric("smoke", json!({}))
            .analysis_run(&freight());
        assert!(twice.unwrap_err().to_string().contains("duplicate metric"));
    }
}
