//! The Application routes on an agent destination: the server cannot reach the Application, so
//! it keeps a DispatchJob record for the agent ([`api_record`]: `observe: application`, no Job,
//! no run, `forStage` the caller's project and Stage, and `sync` for a sync order) and answers
//! from what the agent reports (`status.application`).
//!
//! A record is per Application **and Stage**: the agent checks the live Application's
//! `kargo.akuity.io/authorized-stage` against the record's Stage on every pass, so one project's
//! answer is never another's. An agent's refusal of it (the note
//! [`authorized::NOTE_UNAUTHORIZED`]) is answered `403`, as on a direct destination, and a sync
//! order for a Stage the agent last refused is not placed at all.
//!
//! * GET creates the record when there is none (a record carrying a sync order is kept as it
//!   is) and answers the agent's last report, waiting up to [`FIRST_REPORT_WAIT`] for the first
//!   one, else `503` with `Retry-After`.
//! * POST replaces the record with one carrying a new order (a fresh id, which the agent carries
//!   out once) and answers `202` at once with the last state known: a `503` would make Kargo's
//!   `http` step send the sync again, and the order is already placed.
//!
//! Every call marks the record asked for; [`Applications::expire_idle`] (the sweep loop of
//! `serve`) removes it after [`APP_RECORD_IDLE`] without one. The run sweep and the record
//! retention leave these records alone (`store::is_application_record`).

use std::time::{Duration, Instant};

use dispatch_api::agent::SyncOrder;
use dispatch_api::observe::{ApplicationCheck, ApplicationState, Observe, StageRef};

use super::{authorized, AppRef, Applications};
use crate::engine::{SweepReason, SweepReport};
use crate::http::{DispatchError, Reason};
use crate::store::{self, Created, DispatchJob, DispatchJobSpec, Store, StoreError};

/// A record of the Application routes nobody asked for this long is removed (the Application
/// itself is never touched).
pub const APP_RECORD_IDLE: Duration = Duration::from_secs(15 * 60);

/// The record of Application `namespace/name` on agent destination `destination` for `stage`,
/// with the sync order `sync`. Its name is stable per Application and Stage
/// (`app.<ns>.<name>.<hash of the Stage>.<hash of the destination>`), the name hashed when that
/// would pass the 253 characters of an object name.
pub fn api_record(
    destination: &str,
    namespace: &str,
    name: &str,
    stage: &StageRef,
    sync: Option<SyncOrder>,
) -> DispatchJob {
    let mut shown = name.to_string();
    if namespace.len() + name.len() > 180 {
        shown = format!("{:016x}", crate::job::fnv1a(name.as_bytes()));
    }
    let base = format!(
        "app.{namespace}.{shown}.{:08x}",
        crate::job::fnv1a(stage.to_string().as_bytes()) as u32
    );
    DispatchJob {
        name: store::record_name(&base, destination),
        spec: DispatchJobSpec {
            destination: destination.to_string(),
            namespace: namespace.to_string(),
            job_name: name.to_string(),
            run_uid: String::new(),
            run: String::new(),
            metric: String::new(),
            measurement: 0,
            log_tail: 0,
            job: None,
            delete: false,
            observe: Some(Observe::Application(ApplicationCheck {
                name: name.to_string(),
                namespace: namespace.to_string(),
                revision: None,
            })),
            sync,
            for_stage: Some(stage.clone()),
            ..DispatchJobSpec::default()
        },
        status: None,
        resource_version: None,
    }
}

/// How long a GET waits for the agent's first report on a new record (an agent answers a
/// change of its work within one long poll and one pass).
const FIRST_REPORT_WAIT: Duration = Duration::from_secs(5);

fn unavailable(e: StoreError) -> DispatchError {
    DispatchError::Unavailable(Reason::caused_by(
        format!("the agent store cannot be written: {e}"),
        e,
    ))
}

impl Applications {
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
        let stage = app.stage();
        let mut record = api_record(&app.destination, &app.namespace, &app.name, &stage, order);
        record.spec.project = app.project.clone();
        if sync {
            // An order not carried out by then is not carried out later (Kargo's step has
            // given up on it long before).
            record.spec.deadline = crate::signing::work::now_secs() + APP_RECORD_IDLE.as_secs();
        }
        self.engine.sign_work(&mut record.spec);
        self.mark_asked(&record.name);
        let before = store.get(&record.name);
        if sync {
            // The server's own check before it places the order: the agent's last word on
            // this Application for this Stage (its record is per Stage), if it refused it.
            if let Some(Err(refused @ DispatchError::Forbidden(_))) = reported(before.as_ref()) {
                tracing::warn!(application = %app.object(), project = %app.project,
                               stage = %app.stage, "refused: the agent last found the \
                               Application not authorized for the Stage; no order placed");
                return Err(refused);
            }
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

impl Applications {
    /// Record `name` of the Application routes was asked for now.
    fn mark_asked(&self, name: &str) {
        let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
        asked.insert(name.to_string(), Instant::now());
    }

    /// Removes the records of the Application routes that nobody asked for in `idle` (a
    /// record this process has not seen asked for counts from when it first saw it: another
    /// replica's, or from before a restart).
    pub async fn expire_idle(&self, idle: Duration) -> SweepReport {
        let mut report = SweepReport::default();
        let Some(store) = self.engine.store() else {
            return report;
        };
        let now = Instant::now();
        let idle_ones: Vec<DispatchJob> = {
            let mut asked = self.asked.lock().unwrap_or_else(|e| e.into_inner());
            let records: Vec<DispatchJob> = store
                .all()
                .into_iter()
                .filter(|r| store::is_application_record(&r.spec))
                .collect();
            asked.retain(|name, _| records.iter().any(|r| &r.name == name));
            records
                .into_iter()
                .filter(|r| {
                    let at = *asked.entry(r.name.clone()).or_insert(now);
                    now.duration_since(at) >= idle
                })
                .collect()
        };
        for r in idle_ones {
            match store.remove(&r.name).await {
                Ok(()) => {
                    self.asked
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&r.name);
                    report.deleted.push((
                        r.spec.destination.clone(),
                        format!("{}/{}", r.spec.namespace, r.spec.job_name),
                        SweepReason::ApplicationIdle,
                    ));
                }
                Err(e) => report
                    .failed
                    .push((r.spec.destination.clone(), e.to_string())),
            }
        }
        if !report.deleted.is_empty() {
            tracing::info!(removed = ?report.deleted, idle_s = idle.as_secs(),
                           "records of the Application routes nobody asked for are removed");
        }
        report
    }
}

/// The Application state of `record`'s last report, if any.
fn known_state(record: Option<&DispatchJob>) -> Option<ApplicationState> {
    record?.status.as_ref()?.application.clone()
}

/// What the agent last reported on `record`: the Application's state, or why it could not
/// serve it (its `--namespaces`, no `--argocd-sync`: `422`; not authorized for the Stage, or
/// no such Application: `403`; a report without a state); `None` before its first report.
fn reported(record: Option<&DispatchJob>) -> Option<Result<ApplicationState, DispatchError>> {
    let status = record?.status.as_ref()?;
    if let Some(state) = &status.application {
        return Some(Ok(state.clone()));
    }
    let why = match &status.state {
        Some(crate::verdict::DestState::Error(m)) => m.clone(),
        _ => return None,
    };
    if status.notes.contains_key(authorized::NOTE_UNAUTHORIZED) {
        return Some(Err(DispatchError::Forbidden(why.into())));
    }
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
