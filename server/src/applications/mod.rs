//! Argo CD Applications, the feature: read an Application, and request its sync, on a direct
//! destination with the server's own client (`argocd`), on an agent destination
//! through its agent (`records`); the routes Kargo's `http` step calls (`routes`).
//!
//! Every call first applies the policy to (project, destination, the Application's namespace:
//! a rule's `applicationNamespaces`, never its Job `namespaces`), deny by default like Jobs. A
//! sync also needs `applicationSync.destinations` to list the destination. A refusal there
//! reaches no destination. Then the Application itself must be authorized for the caller's
//! project and the Stage it names, as Kargo authorizes it (`authorized`): on a direct
//! destination the server checks the Application it read, and patches it only at that
//! resourceVersion (so the annotation cannot change in between); on an agent destination the
//! record carries the Stage and the agent checks its live Application (`agent/sync.rs`).
//!
//! The sync names the caller in Argo CD's audit trail: `initiatedBy.username`
//! `rollouts-dispatch:<project>/<stage>` and the operation's `info` (`argocd`).
//!
//! An allowed call then holds one of its project's Application calls
//! (`budgets.applicationCallsPerProject`; beyond it `429 over_budget`), so that one project's
//! reads and syncs cannot take the API's slots.

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::{ApplicationState, SyncRequest};

pub mod argocd;
pub mod authorized;
mod records;
pub mod routes;

pub use records::{api_record, APP_RECORD_IDLE};
pub use routes::AppRef;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::destinations::{Destination, Entry};
use crate::engine::Engine;
use crate::http::{DispatchError, Reason};
use crate::observe::application::state_of;
use crate::runtime::quota::Quota;
use crate::store::random_id;
use argocd::{AppError, AppTarget};
use authorized::{Unauthorized, Why};
use serde_json::Value;

/// The Applications of every destination, as the policy lets each project see and sync them.
pub struct Applications {
    engine: Engine,
    /// when each record of an agent destination's Application was last asked for (`records`)
    asked: Mutex<HashMap<String, Instant>>,
    /// the calls each project has in progress
    calls: Quota,
}

/// The destination of an Application route, once the policy allows it.
enum Place {
    /// the server reads and patches the Application itself
    Direct(std::sync::Arc<Destination>),
    /// its agent does
    Agent,
}

fn app_error(e: AppError) -> DispatchError {
    match &e {
        AppError::NotFound { .. } => DispatchError::NotFound(Reason::of(e)),
        AppError::Busy { .. } => DispatchError::Conflict(Reason::of(e)),
        AppError::Api {
            source: kube::Error::Api(s),
            ..
        } if s.code == 403 || s.code == 401 => DispatchError::Forbidden(Reason::caused_by(
            format!(
                "{e}: grant the server's credentials for that destination get (and, to \
                 sync, patch) on applications.argoproj.io in that namespace"
            ),
            e,
        )),
        AppError::Api { .. } | AppError::TimedOut { .. } => {
            DispatchError::Unavailable(Reason::of(e))
        }
    }
}

/// The Application `read` for `app`, if it exists and is authorized for `app`'s project and
/// Stage; a missing one is refused the same way, so that a refusal tells nothing about
/// Applications the caller may not see.
fn authorize(app: &AppRef, read: Result<Value, AppError>) -> Result<Value, DispatchError> {
    let stage = app.stage();
    let why = match read {
        Err(AppError::NotFound { .. }) => Why::NotFound,
        Err(e) => return Err(app_error(e)),
        Ok(found) => match authorized::check(&found, &stage) {
            Ok(()) => return Ok(found),
            Err(why) => why,
        },
    };
    tracing::warn!(application = %app.object(), project = %app.project, stage = %app.stage,
                   reason = %why, "refused: the Application is not authorized for the Stage");
    let refusal = Unauthorized::new(&app.destination, &app.namespace, &app.name, &stage, why);
    Err(DispatchError::Forbidden(Reason::of(refusal)))
}

/// `app` on the direct destination `d`.
fn target<'a>(d: &'a Destination, app: &'a AppRef, timeout: Duration) -> AppTarget<'a> {
    AppTarget {
        client: d.client(),
        destination: &app.destination,
        namespace: &app.namespace,
        name: &app.name,
        timeout,
    }
}

impl Applications {
    /// The Applications of `engine`'s destinations, under its policy and `applicationSync`.
    pub fn new(engine: Engine) -> Self {
        let calls = Quota::new(
            crate::config::budgets::APPLICATION_CALLS_PER_PROJECT,
            "project",
            "Application calls in progress",
            engine.budgets().application_calls_per_project,
            None,
        );
        Self {
            engine,
            asked: Mutex::new(HashMap::new()),
            calls,
        }
    }

    /// The same, each project's calls in progress bounded by `calls` (its refusals counted).
    pub fn with_calls(mut self, calls: Quota) -> Self {
        self.calls = calls;
        self
    }

    /// Where `app` lives, if the policy lets `app.project` use it (and, with `sync`,
    /// `applicationSync` allows syncing there).
    fn place(&self, app: &AppRef, sync: bool) -> Result<Place, DispatchError> {
        let refused = |why: Reason| {
            tracing::warn!(application = %app.object(), project = %app.project, sync,
                           reason = %why, "refused: application route");
            DispatchError::Forbidden(why)
        };
        let entry = self
            .engine
            .registry()
            .get(&app.destination)
            .ok_or_else(|| {
                DispatchError::UnknownDestination(
                    format!(
                        "unknown destination {:?} (known: {}); add it to `destinations` in {}",
                        app.destination,
                        // Only what the project may use: never another tenant's names.
                        self.engine.usable_destinations(&app.project).join(", "),
                        self.engine.origin()
                    )
                    .into(),
                )
            })?;
        self.engine
            .policy()
            .check_application(&app.project, &app.destination, &app.namespace)
            .map_err(|d| refused(Reason::of(d)))?;
        if sync {
            self.engine
                .sync_enabled(&app.destination)
                .map_err(|e| refused(Reason::of(e)))?;
        }
        match entry {
            Entry::Ready(d) => Ok(Place::Direct(d)),
            Entry::Agent(_) => Ok(Place::Agent),
            Entry::Broken(b) => Err(DispatchError::Unavailable(
                format!(
                    "destination {:?} cannot be used: {}",
                    app.destination, b.error
                )
                .into(),
            )),
        }
    }

    /// `GET …/applications/{ns}/{name}`.
    pub async fn read(&self, app: AppRef) -> Result<ApplicationState, DispatchError> {
        let place = self.place(&app, false)?;
        let _call = self.calls.take(&app.project)?;
        match place {
            Place::Direct(d) => {
                let found = authorize(
                    &app,
                    target(&d, &app, self.engine.request_timeout()).read().await,
                )?;
                Ok(state_of(&app.destination, &found))
            }
            Place::Agent => self.agent_application(&app, None).await,
        }
    }

    /// `POST …/applications/{ns}/{name}:sync`.
    pub async fn sync(
        &self,
        app: AppRef,
        req: SyncRequest,
    ) -> Result<ApplicationState, DispatchError> {
        let place = self.place(&app, true)?;
        let _call = self.calls.take(&app.project)?;
        let order = SyncOrder {
            id: random_id(),
            refresh: req.refresh().to_string(),
            revision: req.revision,
        };
        match place {
            Place::Direct(d) => {
                let target = target(&d, &app, self.engine.request_timeout());
                let found = authorize(&app, target.read().await)?;
                // Patched at the resourceVersion just read: an annotation changed since fails
                // the patch (409) instead of being synced past.
                let patched = target
                    .request_sync(&found, &order, &app.stage())
                    .await
                    .map_err(app_error)?;
                Ok(state_of(&app.destination, &patched))
            }
            Place::Agent => self.agent_application(&app, Some(order)).await,
        }
    }
}
