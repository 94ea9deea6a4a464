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
//! which the server answers with the agent's message.

use std::collections::HashMap;

use dispatch_api::agent::{Report, WorkItem};
use tracing::warn;

use super::guard::Guard;
use crate::applications::argocd::{sync_id_of, AppError, AppTarget};
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
        };
        let mut app = match target.read().await {
            Ok(app) => app,
            Err(e @ AppError::NotFound { .. }) => return Some(error(item, e.to_string())),
            Err(e) => {
                warn!(%destination, application = %object, error = %e, "cannot read the application");
                return Some(Report::new(
                    item.name.clone(),
                    Some(DestState::Unavailable(e.to_string())),
                ));
            }
        };
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
                match target.request_sync(&app, order).await {
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
