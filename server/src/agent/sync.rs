//! The agent's side of the Application routes: the records of `GET|POST
//! /v1/destinations/{d}/applications/{ns}/{name}[:sync]` on its destination
//! (`store::is_application_record`). On each pass it reads the Application in its own
//! cluster and reports its state (`Report.application`, a `Running` record state that never
//! settles, so the server always has the state of the last pass), and carries out a record's
//! sync order.
//!
//! An order is carried out **once per id**: the agent patches the Application only when its
//! `rollouts-dispatch.io/sync-id` annotation is not the order's id (the patch writes it, in the
//! same merge patch as the operation), so neither a restarted agent nor a record sent again
//! syncs twice. While Argo CD runs another operation the order waits (reported as such).
//!
//! The agent checks the work itself first: the Application's namespace must be one of its
//! `--namespaces`, and a sync needs `--argocd-sync` (chart value `agent.argocd.sync`, which
//! also grants `patch` on applications); a refusal is an `Error` report without a state,
//! which the server answers with the agent's message. Then, whatever the server checked, the
//! live Application must be authorized for the record's Kargo Stage (`forStage`), as Kargo
//! authorizes it (`applications::authorized`): a record without a Stage, or an Application
//! that does not list it (or does not exist), gets the same refusal, noted
//! [`NOTE_UNAUTHORIZED`] so that the server answers `403`, and neither its state nor a sync.
//! The sync patches the Application at the resourceVersion that was checked.

use std::collections::HashMap;

use dispatch_api::agent::{Report, WorkItem};
use dispatch_api::observe::StageRef;
use tracing::warn;

use super::guard::Guard;
use crate::applications::argocd::{sync_id_of, AppError, AppTarget};
use crate::applications::authorized::{self, Unauthorized, Why, NOTE_UNAUTHORIZED};
use crate::destinations::Entry;
use crate::observe::application::state_of;
use crate::verdict::DestState;

/// The agent's memory of the Application records: what the server last accepted of each.
#[derive(Debug, Default)]
pub(super) struct Apps {
    /// `--argocd-sync`: sync orders are carried out
    pub(super) argocd_sync: bool,
    /// the last report the server accepted, per record
    accepted: HashMap<String, Report>,
}

/// A refusal or failure, reported without an Application state.
fn error(item: &WorkItem, message: String) -> Report {
    Report::new(item.name.clone(), Some(DestState::Error(message)))
}

/// A refusal for want of authorization: `403` at the server.
fn forbidden(item: &WorkItem, message: String) -> Report {
    let mut report = error(item, message);
    report
        .notes
        .insert(NOTE_UNAUTHORIZED.to_string(), "refused".to_string());
    report
}

/// The refusal of record `item` because its Application is not authorized for `stage`.
fn unauthorized(item: &WorkItem, destination: &str, stage: &StageRef, why: Why) -> Report {
    let spec = &item.spec;
    warn!(%destination, application = %format!("{}/{}", spec.namespace, spec.job_name),
          project = %stage.project, stage = %stage.stage, reason = %why,
          "refused: the Application is not authorized for the record's Stage");
    let refusal = Unauthorized::new(destination, &spec.namespace, &spec.job_name, stage, why);
    forbidden(item, refusal.to_string())
}

impl Apps {
    /// One pass over record `item`: its report when it differs from what the server has.
    pub(super) async fn pass(
        &mut self,
        entry: &Entry,
        destination: &str,
        guard: &Guard,
        item: &WorkItem,
    ) -> Option<Report> {
        let report = self.report(entry, destination, guard, item).await?;
        (self.accepted.get(&item.name) != Some(&report)).then_some(report)
    }

    /// The server stored `reports` (those of records it no longer has are `unknown`).
    pub(super) fn accepted(&mut self, reports: &[Report], unknown: &[String]) {
        for r in reports {
            if unknown.contains(&r.name) {
                self.accepted.remove(&r.name);
            } else {
                self.accepted.insert(r.name.clone(), r.clone());
            }
        }
    }

    /// Forgets the records that left the work.
    pub(super) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.accepted.retain(|name, _| keep(name));
    }

    async fn report(
        &self,
        entry: &Entry,
        destination: &str,
        guard: &Guard,
        item: &WorkItem,
    ) -> Option<Report> {
        let spec = &item.spec;
        let object = format!("Application {}/{}", spec.namespace, spec.job_name);
        if let Err(refused) = guard.admit(destination, spec) {
            warn!(%destination, application = %object, error = %refused, "refused work from the server");
            return Some(error(item, format!("{object} on {destination}: {refused}")));
        }
        if spec.sync.is_some() && !self.argocd_sync {
            warn!(%destination, application = %object, "refused a sync: the agent runs without --argocd-sync");
            return Some(error(
                item,
                format!(
                    "the agent of {destination} refused to sync {object}: it syncs Applications \
                     only when started with --argocd-sync (chart value agent.argocd.sync: true, \
                     which also grants it patch on applications)"
                ),
            ));
        }
        let Some(stage) = &spec.for_stage else {
            // Not written by a server of this version (an older one, or someone else): with
            // no Stage there is nothing to check the Application against, so nothing is served.
            warn!(%destination, application = %object, "refused: a record names no Kargo Stage");
            return Some(forbidden(
                item,
                format!(
                    "the agent of {destination} refused {object}: its record names no Kargo \
                     Stage (`forStage`), which the Application's kargo.akuity.io/authorized-stage \
                     must list; ask again through the server's Application routes (with `stage`)"
                ),
            ));
        };
        let Entry::Ready(d) = entry else {
            return Some(error(
                item,
                format!("the agent's cluster {destination} is not usable"),
            ));
        };
        let target = AppTarget {
            client: d.client(),
            destination,
            namespace: &spec.namespace,
            name: &spec.job_name,
            // The agent's engine runs with the default settings (`agent::run`).
            timeout: crate::config::EngineSettings::default().request_timeout,
        };
        let mut app = match target.read().await {
            Ok(app) => app,
            Err(AppError::NotFound { .. }) => {
                return Some(unauthorized(item, destination, stage, Why::NotFound))
            }
            Err(e) => {
                warn!(%destination, application = %object, error = %e, "cannot read the application");
                return Some(Report::new(
                    item.name.clone(),
                    Some(DestState::Unavailable(e.to_string())),
                ));
            }
        };
        if let Err(why) = authorized::check(&app, stage) {
            return Some(unauthorized(item, destination, stage, why));
        }
        let mut waiting = None;
        if let Some(order) = &spec.sync {
            if sync_id_of(&app) != Some(order.id.as_str()) {
                let now = crate::signing::work::now_secs();
                if let Err(expired) = guard.work_keys.verify_in_time(spec, now) {
                    warn!(%destination, application = %object, error = %expired, "refused a sync order");
                    return Some(error(
                        item,
                        format!("{object} on {destination}: the agent refused the sync: {expired}"),
                    ));
                }
                match target.request_sync(&app, order, stage).await {
                    Ok(patched) => app = patched,
                    Err(AppError::Busy { why, .. }) => {
                        waiting = Some(format!("sync {} waits: {why}", order.id));
                    }
                    Err(e) => {
                        warn!(%destination, application = %object, error = %e, "cannot request the sync");
                        return Some(Report::new(
                            item.name.clone(),
                            Some(DestState::Unavailable(e.to_string())),
                        ));
                    }
                }
            }
        }
        let mut report = Report::new(item.name.clone(), Some(DestState::Running(waiting)));
        report.application = Some(state_of(&spec.destination, &app));
        Some(report)
    }
}
