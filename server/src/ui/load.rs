//! What the pages (`/ui/destinations`) show beside `/v1/destinations`: how many of our Jobs run
//! on each destination now, counted from what the server already holds — the watch cache of a
//! direct destination's Jobs, the store's records of an agent destination — without an API call.

use super::{DestinationLoad, Pages};
use crate::destinations::Entry;
use crate::measure::{destination_rows, job_phase};

impl Pages {
    /// Every destination with the Jobs running on it now (`None` where the count is not known:
    /// a broken destination, a cache not synced, an agent destination without a store).
    pub(super) fn destination_load(&self) -> Vec<DestinationLoad> {
        destination_rows(&self.engine)
            .into_iter()
            .map(|info| {
                let running = match self.engine.registry().get(&info.name) {
                    Some(Entry::Ready(d)) if d.cache_problem().is_none() => Some(
                        d.jobs()
                            .count_by(job_phase)
                            .get("active")
                            .copied()
                            .unwrap_or(0),
                    ),
                    Some(Entry::Agent(_)) => self.engine.store().map(|store| {
                        store
                            .for_destination(&info.name)
                            .iter()
                            .filter(|r| {
                                !r.spec.delete
                                    && r.spec.job.is_some()
                                    && r.status.as_ref().is_none_or(|s| s.phase == "Running")
                            })
                            .count()
                    }),
                    _ => None,
                };
                DestinationLoad { info, running }
            })
            .collect()
    }
}
