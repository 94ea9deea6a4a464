//! Which destinations a viewer of the pages may see listed: those a project it acts for may use
//! (another tenant's destination names, sources and load are none of its business, as on
//! `/v1/destinations`).
//!
//! * A service (a token bound to projects): the destinations a rule of one of its projects
//!   lists (`Policy::shows_destination`); bound to every project (`"*"`, the controller's): all.
//! * A person: the projects whose runs they may see (the namespaces of the runs of the
//!   control plane's watch that a SubjectAccessReview lets them `get`), then the destinations
//!   those projects may use. A person who may see no run sees no destination.

use std::collections::BTreeSet;

use crate::http::viewer::Viewer;
use crate::http::ApiFailure;
use crate::policy::Policy;

use super::{Pages, Sight, LIST_SCAN};

/// What a viewer may see of the destinations.
pub(super) enum Shown {
    /// every destination
    All,
    /// those a project matching one of these globs may use
    OfGlobs(Vec<String>),
    /// those one of these projects may use
    OfProjects(BTreeSet<String>),
}

impl Shown {
    /// What `viewer` may see, asking at most one SubjectAccessReview per namespace.
    pub(super) async fn of(state: &Pages, viewer: &Viewer) -> Result<Self, ApiFailure> {
        match viewer {
            Viewer::Service(p) => Ok(if p.projects.is_every_project() {
                Shown::All
            } else {
                Shown::OfGlobs(p.projects.globs.clone())
            }),
            Viewer::Person(_) => {
                let mut sight = Sight {
                    state,
                    viewer,
                    seen: Default::default(),
                };
                let mut projects = BTreeSet::new();
                for run in state.recent_runs(LIST_SCAN).unwrap_or_default() {
                    if !projects.contains(&run.namespace) && sight.may_see(&run.namespace).await? {
                        projects.insert(run.namespace.clone());
                    }
                }
                Ok(Shown::OfProjects(projects))
            }
        }
    }

    /// Whether `destination` is listed.
    pub(super) fn shows(&self, policy: &Policy, destination: &str) -> bool {
        match self {
            Shown::All => true,
            Shown::OfGlobs(globs) => policy.shows_destination(globs, destination),
            Shown::OfProjects(projects) => projects
                .iter()
                .any(|p| policy.allows_destination(p, destination)),
        }
    }
}
