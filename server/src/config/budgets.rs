//! The per-project budgets of the server (`budgets:`): how much of each kind of work one Kargo
//! project (or one agent destination) may hold at once on a replica, so that no project can
//! take what another's plugin calls need (issue #27). Each key names itself in the `429` of a
//! refusal; `app` turns them into `runtime::quota::Quota`s. The budgets of the API port for
//! everyone together are `serve`'s flags (`runtime::limits`), not keys of this file.

/// `budgets.measurementCallsPerProject`
pub const MEASUREMENT_CALLS_PER_PROJECT: &str = "budgets.measurementCallsPerProject";
/// `budgets.applicationCallsPerProject`
pub const APPLICATION_CALLS_PER_PROJECT: &str = "budgets.applicationCallsPerProject";
/// `budgets.logStreamsPerProject`
pub const LOG_STREAMS_PER_PROJECT: &str = "budgets.logStreamsPerProject";
/// `budgets.logRequestsPerProject`
pub const LOG_REQUESTS_PER_PROJECT: &str = "budgets.logRequestsPerProject";
/// `budgets.pendingLogRequestsPerDestination`
pub const PENDING_LOG_REQUESTS_PER_DESTINATION: &str = "budgets.pendingLogRequestsPerDestination";

/// The per-project budgets (`budgets:`), each at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetsConfig {
    /// measurement calls (ensure, status, terminate, garbage collection) of one project served
    /// at once. The default is above the 30 analysis workers of one Rollouts controller
    /// (argo-rollouts controller/controller.go `DefaultAnalysisThreads = 30`), so the controller
    /// is never refused for one project's runs, and eight projects at their budget still leave
    /// the plugin's 256 request slots (`--max-concurrent-requests`) to the others
    pub measurement_calls_per_project: usize,
    /// Application reads and syncs of one project served at once
    pub application_calls_per_project: usize,
    /// log streams (`GET /v1/runs/{ns}/{name}/logs`, whole or followed) of one project's runs
    /// open at once, out of `--max-log-reads` (128)
    pub log_streams_per_project: usize,
    /// log requests at agent destinations of one project open at once, waiting for their agent
    /// or streaming from it; each streaming one holds an upload slot (`--max-log-uploads`, 64),
    /// so the default leaves half of them to the other projects
    pub log_requests_per_project: usize,
    /// log requests of one agent destination waiting for its agent to start their upload (the
    /// agent uploads 4 at once)
    pub pending_log_requests_per_destination: usize,
}

impl Default for BudgetsConfig {
    fn default() -> Self {
        Self {
            measurement_calls_per_project: 32,
            application_calls_per_project: 16,
            log_streams_per_project: 8,
            log_requests_per_project: 32,
            pending_log_requests_per_destination: 16,
        }
    }
}
