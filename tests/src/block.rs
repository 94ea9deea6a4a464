//! The one builder of `rollouts-dispatch/job` plugin blocks (and of the JobSpec inside them) for
//! every test: routing fields, then a Job whose single container `check` exits with a chosen
//! code after a chosen time on the test clusters (kwok reads the pod-template annotations, see
//! [`crate::cluster::kwok`]).
//!
//! ```no_run
//! # use dispatch_tests::block::Block;
//! # use serde_json::json;
//! let block = Block::to("cluster-b").exits(1).runs_for("2s").with("logTail", json!(5)).json();
//! ```

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::cluster::kwok::{lifecycle_annotations, TERMINATION_MESSAGE_ANNOTATION};

/// The image of the check container; never pulled (kwok runs the pods).
pub const CHECK_IMAGE: &str = "example.invalid/check:1";

/// The pod-template annotation keys of these blocks (the kwok lifecycle, the termination
/// message): a glob for `podAnnotations` (a policy rule) and `--pod-annotations` (an agent),
/// which allow no annotation by default (issue #27).
pub const ANNOTATION_KEYS: &str = "test.rollouts-dispatch.io/*";

/// The policy rule key that lets these blocks' annotations through, as YAML (flow style).
pub const RULE_ALLOWS: &str = "podAnnotations: [\"test.rollouts-dispatch.io/*\"]";

/// The agent flags that let these blocks' annotations through.
pub const AGENT_ALLOWS: [&str; 2] = ["--pod-annotations", ANNOTATION_KEYS];

/// A plugin block under construction. By default: no routing, a container that exits 0 after
/// 1 s, `backoffLimit: 0` and `restartPolicy: Never` (one attempt, so the verdict is the exit).
#[derive(Debug, Clone)]
pub struct Block {
    fields: Map<String, Value>,
    exit_code: i32,
    duration: String,
    log: Option<String>,
    pod_spec: Map<String, Value>,
    container: Map<String, Value>,
}

impl Default for Block {
    fn default() -> Self {
        Self {
            fields: Map::new(),
            exit_code: 0,
            duration: "1s".into(),
            log: None,
            pod_spec: Map::new(),
            container: Map::new(),
        }
    }
}

impl Block {
    /// A block for destination `destination` (a name, a comma list, or `stage`).
    pub fn to(destination: &str) -> Self {
        Self::routed(json!({ "destination": destination }))
    }

    /// A block with the routing fields of `routing` (`destination`, `destinationSelector`,
    /// `require`, `namespace`, ...), an object.
    pub fn routed(routing: Value) -> Self {
        let mut block = Self::default();
        if let Value::Object(fields) = routing {
            block.fields = fields;
        }
        block
    }

    /// The container exits with `code` (0: the Job completes; else it fails).
    pub fn exits(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }

    /// The container runs for `duration` (a Go duration: `500ms`, `2s`, `10m`).
    pub fn runs_for(mut self, duration: &str) -> Self {
        self.duration = duration.into();
        self
    }

    /// The container's log, as its termination message: what a failed check printed, and what
    /// the verdict's log tail quotes.
    pub fn logs(mut self, log: &str) -> Self {
        self.log = Some(log.into());
        self
    }

    /// Sets a top-level field of the block (`logTail`, `activeDeadline`, `namespace`, ...).
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.fields.insert(key.into(), value);
        self
    }

    /// Sets a field of the pod spec (`nodeSelector`, ...).
    pub fn pod(mut self, key: &str, value: Value) -> Self {
        self.pod_spec.insert(key.into(), value);
        self
    }

    /// Sets a field of the `check` container (`env`, `command`, ...).
    pub fn container(mut self, key: &str, value: Value) -> Self {
        self.container.insert(key.into(), value);
        self
    }

    /// The pod-template annotations: the kwok lifecycle, and the log if one was set.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = lifecycle_annotations(self.exit_code, &self.duration);
        if let Some(log) = &self.log {
            annotations.insert(TERMINATION_MESSAGE_ANNOTATION.into(), log.clone());
        }
        annotations
    }

    /// The JobSpec alone: what Argo's built-in `job` provider takes as `provider.job.spec`.
    pub fn job_spec(&self) -> Value {
        let mut container = json!({"name": "check", "image": CHECK_IMAGE});
        merge(&mut container, &self.container);
        let mut pod = json!({"restartPolicy": "Never", "containers": [container]});
        merge(&mut pod, &self.pod_spec);
        json!({
            "backoffLimit": 0,
            "template": {"metadata": {"annotations": self.annotations()}, "spec": pod}
        })
    }

    /// The plugin block: the fields and `spec`.
    pub fn json(&self) -> Value {
        let mut block = Value::Object(self.fields.clone());
        merge(
            &mut block,
            &Map::from_iter([("spec".into(), self.job_spec())]),
        );
        block
    }
}

fn merge(target: &mut Value, fields: &Map<String, Value>) {
    if let Some(object) = target.as_object_mut() {
        object.extend(fields.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_job_exits_0_after_1s_with_one_attempt() {
        let block = Block::to("a").json();
        assert_eq!(block["destination"], "a");
        assert_eq!(block["spec"]["backoffLimit"], 0);
        let template = &block["spec"]["template"];
        assert_eq!(template["spec"]["restartPolicy"], "Never");
        assert_eq!(template["spec"]["containers"][0]["image"], CHECK_IMAGE);
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(annotations["test.rollouts-dispatch.io/exit-code"], "0");
        assert_eq!(annotations["test.rollouts-dispatch.io/duration"], "1s");
        assert!(annotations.get(TERMINATION_MESSAGE_ANNOTATION).is_none());
    }

    #[test]
    fn every_setter_lands_where_the_plugin_reads_it() {
        let block = Block::routed(json!({"destinationSelector": "env=e2e", "require": "all"}))
            .exits(1)
            .runs_for("2s")
            .logs("check failed\n")
            .with("logTail", json!(5))
            .pod("nodeSelector", json!({"x": "y"}))
            .container("command", json!(["sh", "-c", "exit 1"]))
            .json();
        assert_eq!(block["destinationSelector"], "env=e2e");
        assert_eq!(block["require"], "all");
        assert!(block.get("destination").is_none());
        assert_eq!(block["logTail"], 5);
        let template = &block["spec"]["template"];
        assert_eq!(template["spec"]["nodeSelector"]["x"], "y");
        assert_eq!(template["spec"]["containers"][0]["command"][2], "exit 1");
        assert_eq!(template["spec"]["containers"][0]["name"], "check");
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(annotations["test.rollouts-dispatch.io/exit-code"], "1");
        assert_eq!(annotations["test.rollouts-dispatch.io/duration"], "2s");
        assert_eq!(
            annotations[TERMINATION_MESSAGE_ANNOTATION],
            "check failed\n"
        );
    }
}
