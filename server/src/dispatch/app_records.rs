//! The Application routes on an agent destination: the server cannot reach the Application, so
//! it writes a DispatchJob record for the agent (`observe: application`, and `sync` for a sync
//! order) and answers from what the agent reports (`status.application`).

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::ApplicationState;

use crate::http::{AppRef, DispatchError};

use super::EngineDispatcher;

impl EngineDispatcher {
    /// The Application's state as the agent of `app.destination` reports it; with `order`,
    /// the agent is asked to carry out that sync first.
    pub(super) async fn agent_application(
        &self,
        app: &AppRef,
        order: Option<SyncOrder>,
    ) -> Result<ApplicationState, DispatchError> {
        let _ = order;
        Err(DispatchError::Unavailable(format!(
            "destination {:?} is an agent destination: not yet served",
            app.destination
        )))
    }
}
