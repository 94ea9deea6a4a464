//! The Application routes on an agent destination: the server cannot reach the Application, so
//! it keeps a DispatchJob record for the agent (`engine::applications::api_record`:
//! `observe: application`, and `sync` for a sync order) and answers from what the agent reports
//! (`status.application`).
//!
//! * GET creates the record when there is none (a record carrying a sync order is kept as it
//!   is) and answers the agent's last report, waiting up to [`FIRST_REPORT_WAIT`] for the first
//!   one, else `503` with `Retry-After`.
//! * POST replaces the record with one carrying a new order (a fresh id, which the agent carries
//!   out once) and answers `202` at once with the last state known: a `503` would make Kargo's
//!   `http` step send the sync again, and the order is already placed.
//!
//! Every call marks the record asked for; `Engine::expire_app_records` removes it after
//! `APP_RECORD_IDLE` without one.

use std::time::Duration;

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::ApplicationState;

use crate::engine::applications::api_record;
use crate::http::{AppRef, DispatchError, Reason};
use crate::store::{Created, DispatchJob, Store, StoreError};

use super::EngineDispatcher;

/// How long a GET waits for the agent's first report on a new record (an agent answers a
/// change of its work within one long poll and one pass).
pub(super) const FIRST_REPORT_WAIT: Duration = Duration::from_secs(5);

fn unavailable(e: StoreError) -> DispatchError {
    DispatchError::Unavailable(Reason::caused_by(
        format!("the agent store cannot be written: {e}"),
        e,
    ))
}

impl EngineDispatcher {
    /// The Application's state as the agent of `app.destination` reports it; with `order`,
    /// the agent is first asked to carry out that sync.
    pub(super) async fn agent_application(
        &self,
        app: &AppRef,
        order: Option<SyncOrder>,
    ) -> Result<ApplicationState, DispatchError> {
        let store = self.engine.store().cloned().ok_or_else(|| {
            DispatchError::Internal("an agent destination without an agent store".into())
        })?;
        let sync = order.is_some();
        let record = api_record(&app.destination, &app.namespace, &app.name, order);
        self.engine.app_record_asked(&record.name);
        let before = store.get(&record.name);
        if sync {
            if before.is_some() {
                store.remove(&record.name).await.map_err(unavailable)?;
            }
            store.create(record.clone()).await.map_err(unavailable)?;
            let order = record.spec.sync.as_ref().map(|o| o.id.as_str());
            tracing::info!(application = %app.object(), project = %app.project, sync_id = ?order,
                           "sync order written for the agent");
            let mut state = known_state(before.as_ref()).unwrap_or_else(|| ApplicationState {
                destination: app.destination.clone(),
                namespace: app.namespace.clone(),
                name: app.name.clone(),
                ..ApplicationState::default()
            });
            state.sync_requested = true;
            return Ok(state);
        }
        if let Some(answer) = reported(before.as_ref()) {
            return answer;
        }
        if before.is_none() {
            match store.create(record.clone()).await.map_err(unavailable)? {
                Created::New | Created::Existing(_) => {}
            }
        }
        wait_for_report(&store, &record.name, &app.destination)
            .await
            .unwrap_or_else(|| {
                Err(DispatchError::Unavailable(
                    format!(
                        "the agent of destination {:?} has not reported on Application {}/{} yet; \
                     ask again (is the agent connected? `rollouts-dispatch destinations`)",
                        app.destination, app.namespace, app.name
                    )
                    .into(),
                ))
            })
    }
}

/// The Application state of `record`'s last report, if any.
fn known_state(record: Option<&DispatchJob>) -> Option<ApplicationState> {
    record?.status.as_ref()?.application.clone()
}

/// What the agent last reported on `record`: the Application's state, or why it could not
/// serve it (its `--namespaces`, no `--argocd-sync`, no such Application: a report without a
/// state); `None` before its first report.
fn reported(record: Option<&DispatchJob>) -> Option<Result<ApplicationState, DispatchError>> {
    let status = record?.status.as_ref()?;
    if let Some(state) = &status.application {
        return Some(Ok(state.clone()));
    }
    let why = match &status.state {
        Some(crate::verdict::DestState::Error(m)) => m.clone(),
        _ => return None,
    };
    Some(Err(DispatchError::Refused(why.into())))
}

/// The first reported state of record `name`, within [`FIRST_REPORT_WAIT`].
async fn wait_for_report(
    store: &Store,
    name: &str,
    destination: &str,
) -> Option<Result<ApplicationState, DispatchError>> {
    let mut changes = store.subscribe(destination);
    let deadline = tokio::time::Instant::now() + FIRST_REPORT_WAIT;
    loop {
        changes.mark_unchanged();
        if let Some(answer) = reported(store.get(name).as_ref()) {
            return Some(answer);
        }
        tokio::select! {
            _ = changes.changed() => {}
            () = tokio::time::sleep_until(deadline) => return None,
        }
    }
}
