//! Why the destinations of a run's Stage cannot be found: each message names the object to
//! look at (the Stage, the Application and its Argo CD instance, the config key) and the fix.

use std::time::Duration;

use super::{ARGOCD_CONTEXT, SHARD_LABEL};
use crate::destinations::{IN_CLUSTER_NAME, IN_CLUSTER_SERVER};
use crate::job::KARGO_STAGE;

/// Why the destinations of a run's Stage cannot be found. Each message names the object to
/// look at and, where there is one, the fix.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The run carries no Stage: Kargo did not create it.
    #[error(
        "AnalysisRun {namespace}/{run} has no {KARGO_STAGE} label: only runs that Kargo creates \
         for Stage verification can use `destination: stage`; name the destination instead"
    )]
    NotKargo {
        /// the run's namespace
        namespace: String,
        /// the run
        run: String,
    },
    /// The Stage cannot be read.
    #[error("cannot read Stage {namespace}/{stage}: {source}")]
    ReadStage {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// the API error or timeout
        #[source]
        source: ReadError,
    },
    /// The Stage is gone.
    #[error("Stage {namespace}/{stage} does not exist")]
    NoStage {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// The Stage's last promotion updated no Argo CD Application.
    #[error(
        "Stage {namespace}/{stage} has no {ARGOCD_CONTEXT} annotation: its last promotion \
         updated no Argo CD Application (use the argocd-update step), or name the destination \
         instead"
    )]
    NoContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// The annotation is not the JSON list Kargo writes.
    #[error(
        "Stage {namespace}/{stage}: annotation {ARGOCD_CONTEXT} is not a JSON list of \
         {{name, namespace}}: {source}"
    )]
    BadContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// the JSON error
        #[source]
        source: serde_json::Error,
    },
    /// The annotation is an empty list.
    #[error("Stage {namespace}/{stage}: annotation {ARGOCD_CONTEXT} lists no Application")]
    EmptyContext {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// An entry of the annotation has no Application name.
    #[error("Stage {namespace}/{stage}: an entry of {ARGOCD_CONTEXT} has no name")]
    UnnamedApplication {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// `spec.shard` is not a string.
    #[error("Stage {namespace}/{stage}: spec.shard is not a string")]
    BadShard {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
    },
    /// The shard label and `spec.shard` differ: which controller promoted it is unclear.
    #[error(
        "Stage {namespace}/{stage}: label {SHARD_LABEL} is {label:?} but spec.shard is \
         {shard:?}; Kargo's webhook keeps them equal, and its controllers pick Stages by the \
         label: fix the Stage (or Kargo's webhook) before verifying it"
    )]
    ShardMismatch {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// `spec.shard` (`""`: none)
        shard: String,
        /// the label (`""`: none)
        label: String,
    },
    /// No Argo CD instance serves the Stage's shard.
    #[error(
        "Stage {namespace}/{stage} {}, and no Argo CD instance of the server config serves it: \
         add it to the `shards` of the `argocd[]` instance its Applications live in ({served})",
        if shard.is_empty() { "has no spec.shard (the default shard, \"\")".to_string() }
        else { format!("belongs to shard {shard:?} (spec.shard)") }
    )]
    NoInstance {
        /// the Stage's namespace (the run's)
        namespace: String,
        /// the Stage
        stage: String,
        /// its shard (`""`: none)
        shard: String,
        /// `name: shards` of every instance, for the message
        served: String,
    },
    /// The instance of the Stage's shard cannot be read.
    #[error(
        "the Stage's Applications are in Argo CD instance {instance}, whose cluster cannot be \
         read: {error}"
    )]
    InstanceUnusable {
        /// the instance
        instance: String,
        /// why (its `kubeconfig` or `destination`)
        error: String,
    },
    /// An Application cannot be read.
    #[error("cannot read Application {application}: {source}")]
    ReadApplication {
        /// `namespace/name`
        application: String,
        /// the API error or timeout
        #[source]
        source: ReadError,
    },
    /// An Application the Stage names is gone.
    #[error("Application {application} (from Stage {stage}) does not exist")]
    NoApplication {
        /// `namespace/name`
        application: String,
        /// the Stage
        stage: String,
    },
    /// `spec.destination` names a server and a cluster.
    #[error(
        "Application {application}: spec.destination has both server and name (Argo CD rejects \
         that too)"
    )]
    ServerAndName {
        /// `namespace/name`
        application: String,
    },
    /// `spec.destination` names no server and no cluster.
    #[error("Application {application}: spec.destination has neither server nor name")]
    NoServerNorName {
        /// `namespace/name`
        application: String,
    },
    /// The Application deploys to the cluster its Argo CD runs on, which is not a destination.
    #[error(
        "Application {application} deploys to {IN_CLUSTER_SERVER} ({IN_CLUSTER_NAME}), the \
         cluster its Argo CD runs on, but that cluster is no destination here ({key} is false, \
         or another instance on the control plane registers none) and no cluster Secret of this \
         instance has that server"
    )]
    InClusterDisabled {
        /// `namespace/name`
        application: String,
        /// the key that turns it on
        key: String,
    },
    /// The Application names a cluster that another Argo CD instance registered.
    #[error(
        "Application {application} deploys to cluster {cluster:?}, but that destination comes \
         from Argo CD instance {owner}{broken}, not from {instance}, which serves this Stage's shard; \
         register the cluster in {instance}'s Argo CD (a cluster Secret), or give the \
         destination in `destinations`"
    )]
    OtherInstance {
        /// `namespace/name`
        application: String,
        /// the cluster name or server
        cluster: String,
        /// the instance that registered it
        owner: String,
        /// its error when it is broken, as ` (and it is unusable: …)`
        broken: String,
        /// the instance of the Stage's shard
        instance: String,
    },
    /// No destination has the Application's server.
    #[error(
        "Application {application} deploys to server {server}, and no Argo CD cluster Secret \
         (or configured destination) has that server; register the cluster in Argo CD"
    )]
    UnknownServer {
        /// `namespace/name`
        application: String,
        /// the server URL
        server: String,
    },
    /// No destination has the Application's cluster name.
    #[error(
        "Application {application} deploys to cluster {cluster:?}, and there is no destination \
         with that name (there are no clusters with this name)"
    )]
    UnknownCluster {
        /// `namespace/name`
        application: String,
        /// the cluster name
        cluster: String,
    },
}

/// Why an object could not be read from the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The API server answered with an error, or could not be reached.
    #[error("{}", crate::destinations::client::describe(.0))]
    Api(#[source] kube::Error),
    /// No answer within the request timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}
