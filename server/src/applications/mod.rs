//! Argo CD Applications, the feature: read an Application, and request its sync, on a direct
//! destination with the server's own client (`argocd`), on an agent destination
//! through its agent (`records`); the routes Kargo's `http` step calls (`routes`).
//!
//! Every call first applies the policy to (project, destination, the Application's namespace),
//! deny by default like Jobs: the Application a tenant may read or sync is one in a namespace
//! its project may use there. A sync also needs `applicationSync.destinations` to list the
//! destination. A refusal reaches no destination.

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::{ApplicationState, SyncRequest};

pub mod argocd;
mod records;
pub mod routes;

pub use records::{api_record, APP_RECORD_IDLE};
pub use routes::AppRef;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use crate::destinations::{Destination, Entry};
use crate::engine::Engine;
use crate::http::{DispatchError, Reason};
use crate::observe::application::state_of;
use crate::store::random_id;
use argocd::{AppError, AppTarget};

/// The Applications of every destination, as the policy lets each project see and sync them.
pub struct Applications {
    engine: Engine,
    /// when each record of an agent destination's Application was last asked for (`records`)
    asked: Mutex<HashMap<String, Instant>>,
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
        AppError::Api { .. } => DispatchError::Unavailable(Reason::of(e)),
    }
}

/// `app` on the direct destination `d`.
fn target<'a>(d: &'a Destination, app: &'a AppRef) -> AppTarget<'a> {
    AppTarget {
        client: d.client(),
        destination: &app.destination,
        namespace: &app.namespace,
        name: &app.name,
    }
}

impl Applications {
    /// The Applications of `engine`'s destinations, under its policy and `applicationSync`.
    pub fn new(engine: Engine) -> Self {
        Self {
            engine,
            asked: Mutex::new(HashMap::new()),
        }
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
            .check(&app.project, &app.destination, &app.namespace)
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
        match self.place(&app, false)? {
            Place::Direct(d) => {
                let target = target(&d, &app);
                let found = target.read().await.map_err(app_error)?;
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
        let order = SyncOrder {
            id: random_id(),
            refresh: req.refresh().to_string(),
            revision: req.revision,
        };
        match place {
            Place::Direct(d) => {
                let target = target(&d, &app);
                let found = target.read().await.map_err(app_error)?;
                let patched = target
                    .request_sync(&found, &order)
                    .await
                    .map_err(app_error)?;
                Ok(state_of(&app.destination, &patched))
            }
            Place::Agent => self.agent_application(&app, Some(order)).await,
        }
    }
}
