//! Agent destinations: reached through their agent (no client and no cache on the server), so
//! the registry only tracks when their agent was last heard from and how many long polls it
//! holds open.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use super::Source;

/// A destination reached through its agent: the server only knows when it last heard from it.
#[derive(Debug)]
pub struct AgentDestination {
    /// the name
    pub name: String,
    /// labels
    pub labels: BTreeMap<String, String>,
    /// default namespace of Jobs
    pub namespace: String,
    /// where it comes from
    pub source: Source,
    presence: Mutex<Presence>,
}

#[derive(Debug, Default)]
struct Presence {
    /// long polls of this destination's agent(s) open on this replica right now
    polling: usize,
    last_contact: Option<SystemTime>,
    subject: Option<String>,
}

impl AgentDestination {
    /// A destination nobody has heard from yet.
    pub fn new(
        name: &str,
        labels: BTreeMap<String, String>,
        namespace: &str,
        index: usize,
    ) -> Self {
        Self {
            name: name.to_string(),
            labels,
            namespace: namespace.to_string(),
            source: Source::Agent { index },
            presence: Mutex::new(Presence::default()),
        }
    }

    fn presence(&self) -> std::sync::MutexGuard<'_, Presence> {
        self.presence.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a request of the agent `subject`; `poll`: +1 when a long poll starts, -1 when it
    /// ends, 0 for other calls.
    pub fn contact(&self, subject: &str, poll: isize) {
        let mut p = self.presence();
        p.last_contact = Some(SystemTime::now());
        if p.subject.as_deref() != Some(subject) {
            p.subject = Some(subject.to_string());
        }
        p.polling = p.polling.saturating_add_signed(poll);
    }

    /// Starts a long poll of the agent `subject` unless `max` are open on this replica already
    /// (checked and counted under one lock, so concurrent polls cannot slip past the cap).
    /// On `true`, end it with `contact(subject, -1)`.
    pub fn start_poll(&self, subject: &str, max: usize) -> bool {
        let mut p = self.presence();
        p.last_contact = Some(SystemTime::now());
        if p.polling >= max {
            return false;
        }
        p.polling += 1;
        if p.subject.as_deref() != Some(subject) {
            p.subject = Some(subject.to_string());
        }
        true
    }

    /// When this replica last heard from the agent.
    pub fn last_contact(&self) -> Option<SystemTime> {
        self.presence().last_contact
    }

    /// Whether the agent is polling this replica now, or was heard from within `offline_after`.
    pub fn connected(&self, offline_after: Duration) -> bool {
        let p = self.presence();
        p.polling > 0
            || p.last_contact
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|e| e < offline_after)
    }
}
