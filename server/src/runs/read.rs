//! The live read behind [`super::Runs::confirm`]'s refusals (issue #32): before a request is
//! refused because the watch holds no such run (or holds it with another uid), the run is read
//! from the control plane's API server. A watch can be silent without knowing it — a replica
//! whose link to the control plane drops every packet keeps its watch "open" until the stall
//! bound ([`crate::watch::STALL`]) — and a refusal is an `Error` measurement for a real run:
//! `make faults`' replica cut from the control plane ended every run it served `Error` that
//! way. The read decides instead: found (the cache takes it), absent (the refusal stands), or
//! no answer — none within [`READ_TIMEOUT`], or a connection that failed before one came —
//! (a retry, [`super::RunError::NotSynced`], and this replica reports the control plane
//! unanswered, so that it goes unready). Before the watch's first
//! list (and while it lists again) a run asked about is read too: found confirms it, no
//! answer marks the control plane unanswered — a replica cut from it as it started never
//! lists, and would otherwise stay ready answering 503 and taking the agents' polls.
//!
//! A request naming a run nobody created costs one read of the control plane; at most
//! [`READS_AT_ONCE`] are in flight, so a caller cannot turn its requests into a storm there.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use kube::api::{Api, DynamicObject};
use tokio::sync::Semaphore;

/// How long a live read may take before the control plane counts as unanswered.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Live reads in flight at once, per replica.
pub const READS_AT_ONCE: usize = 8;
/// Live reads of old runs' pages (`/ui`, [`super::Runs::summary`]) in flight at once, per
/// replica: their own slots, so that viewers opening old pages never take the reads that
/// confirm runs.
pub const PAGE_READS_AT_ONCE: usize = 2;

/// Why a live read gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// No answer from the control plane: none within [`READ_TIMEOUT`] (`cause: None`), or the
    /// request failed before one came (a connect timeout or refusal, a reset connection:
    /// nothing the API server said).
    #[error("the control plane did not answer a read of the run{}", unanswered_detail(.cause.as_ref()))]
    Unanswered {
        /// the client's error, when the request failed before an answer came
        #[source]
        cause: Option<kube::Error>,
    },
    /// Every read slot stayed taken for [`READ_TIMEOUT`] (many requests about runs the watch
    /// lacks): says nothing about the control plane, so it is not counted as unanswered — a
    /// caller naming runs nobody created cannot turn the replica unready.
    #[error("{READS_AT_ONCE} reads of runs are already under way on this replica")]
    Busy,
    /// The API server answered with an error.
    #[error("reading the run from the control plane failed: {0}")]
    Api(#[source] kube::Error),
}

/// How [`ReadError::Unanswered`] ends: the bound, or what the client ran into.
fn unanswered_detail(cause: Option<&kube::Error>) -> String {
    match cause {
        None => format!(" within {}s", READ_TIMEOUT.as_secs()),
        Some(e) => format!(": {e}"),
    }
}

/// Whether `e` carries something the API server said (a status, a body): an answer, unlike a
/// connection that could not be made or broke before an answer came. A connect timeout
/// (`engine.connectTimeout`, 5 s by default, as [`READ_TIMEOUT`]) counted as an answer kept a
/// replica cut from its control plane ready (`make faults`' replica cut, #32).
fn is_answer(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(_) | kube::Error::SerdeError(_))
}

type Read = dyn Fn(String, String) -> BoxFuture<'static, Result<Option<DynamicObject>, kube::Error>>
    + Send
    + Sync;

/// Reads one AnalysisRun by namespace and name; remembers since when the control plane has not
/// answered (cleared by any answer, or by the watch's next event through [`Reader::heard`]).
#[derive(Clone)]
pub struct Reader {
    read: Arc<Read>,
    permits: Arc<Semaphore>,
    unanswered_since: Arc<Mutex<Option<Instant>>>,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("unanswered_since", &self.unanswered_since())
            .finish_non_exhaustive()
    }
}

impl Reader {
    /// Reads through `client`.
    pub fn of(client: kube::Client) -> Self {
        Self::with(move |namespace, name| {
            let api: Api<DynamicObject> =
                Api::namespaced_with(client.clone(), &namespace, &super::resource());
            Box::pin(async move { api.get_opt(&name).await })
        })
    }

    /// Reads with `read` (a scripted API in tests).
    pub fn with(
        read: impl Fn(String, String) -> BoxFuture<'static, Result<Option<DynamicObject>, kube::Error>>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        Self {
            read: Arc::new(read),
            permits: Arc::new(Semaphore::new(READS_AT_ONCE)),
            unanswered_since: Arc::default(),
        }
    }

    /// A reader through the same API with `at_once` slots of its own; an unanswered read of
    /// either counts for both (it is the same control plane).
    pub fn beside(&self, at_once: usize) -> Self {
        Self {
            read: self.read.clone(),
            permits: Arc::new(Semaphore::new(at_once)),
            unanswered_since: self.unanswered_since.clone(),
        }
    }

    /// Run `namespace/name` as the API server has it now (`None`: it does not exist).
    pub async fn read(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<DynamicObject>, ReadError> {
        let Ok(Ok(_permit)) = tokio::time::timeout(READ_TIMEOUT, self.permits.acquire()).await
        else {
            return Err(ReadError::Busy);
        };
        let read = (self.read)(namespace.to_string(), name.to_string());
        match tokio::time::timeout(READ_TIMEOUT, read).await {
            Ok(Ok(run)) => {
                self.heard();
                Ok(run)
            }
            Ok(Err(e)) if is_answer(&e) => {
                // An answer, even an error one: the control plane is there.
                self.heard();
                Err(ReadError::Api(e))
            }
            Ok(Err(e)) => Err(self.unanswered(Some(e))),
            Err(_) => Err(self.unanswered(None)),
        }
    }

    /// A read got no answer (`cause`: the client's error, if it gave up before the bound).
    fn unanswered(&self, cause: Option<kube::Error>) -> ReadError {
        self.unanswered_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Instant::now);
        ReadError::Unanswered { cause }
    }

    /// The control plane answered (a read, or the watch's next event).
    pub fn heard(&self) {
        *self
            .unanswered_since
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Since when a read has gone unanswered, with nothing heard since.
    pub fn unanswered_since(&self) -> Option<Instant> {
        *self
            .unanswered_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests;
