//! Reading what is already deployed on a destination, for the `rollout:` and `application:`
//! checks and the Application sync trigger (pure: JSON of the objects in, states out).
//!
//! * [`application`]: an Argo CD Application's status → [`ApplicationState`], and the
//!   `application:` check's judgement of it.
//! * [`rollout`]: the `rollout:` check's judgement of a Rollout and its AnalysisRuns.
//!
//! The engine (direct destinations) and the agent (its own cluster) read the objects with
//! their own kube clients and hand them here, so both judge them by the same rules.

use kube::api::{ApiResource, GroupVersionKind};

pub mod application;
pub mod rollout;

pub use rollout::Judged;

pub use dispatch_api::observe::ApplicationState;

/// `argoproj.io/v1alpha1` `Application` (Argo CD).
pub fn application_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
        "applications",
    )
}

/// `argoproj.io/v1alpha1` `Rollout` (Argo Rollouts).
pub fn rollout_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Rollout"),
        "rollouts",
    )
}

/// `argoproj.io/v1alpha1` `AnalysisRun` on a destination (the Rollout's own analysis).
pub fn analysis_run_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AnalysisRun"),
        "analysisruns",
    )
}
