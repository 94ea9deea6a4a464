//! Budgets of the API port: how many requests of each kind are served at once. Each kind of
//! request ([`Budget`]) has its own bounded budget, so the plugin's calls can never wait behind
//! agents' long polls, agents' log uploads or people's log streams, nor any of those behind
//! another: 1 000 idle long polls cost 1 000 tasks and a few KiB each, never a slot of the
//! plugin. Beyond its budget a request is answered `503` at once (with `Retry-After` and a
//! message naming the budget and its flag), before authentication, so an overload costs neither
//! a TokenReview nor a destination call, and every caller retries (the plugin and the agent treat
//! 503 as transient; the agent backs off with jitter). The connection budget is in
//! [`super::listener::serve_limited`].
//!
//! A slot is held until the handler has answered, and for a log read (whose reply streams for
//! as long as the log is followed) until its reply body is done or dropped: `--max-log-reads`
//! counts open streams, not handlers. An agent's log upload is its own kind too: the upload
//! streams inside its handler, so it holds a `--max-log-uploads` slot for as long as it lasts
//! and never an API slot of the plugin's.
//!
//! The kind is read from the request's path alone, before routing: the agent routes and the log
//! routes have fixed shapes (`dispatch_api::agent`, `dispatch_api::logs`); everything else is
//! the plugin's and the API's. A path is only sorted here; the router and authentication decide
//! what it may do, so a caller choosing another kind's path only spends that kind's budget.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use clap::Args;
use tokio::sync::Semaphore;

use super::metrics::Metrics;

/// Default of `serve --max-connections`: 1 000 agents (one connection each) beside the plugin,
/// log readers and the pages, with room for reconnects.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default of `serve --max-concurrent-requests` (the plugin and the API).
pub const DEFAULT_MAX_CONCURRENT_REQUESTS: usize = 256;
/// Default of `serve --max-agent-polls`: 1 000 agents per replica, two polls each (an agent
/// whose connection broke polls again before the server has seen the old poll end).
pub const DEFAULT_MAX_AGENT_POLLS: usize = 2048;
/// Default of `serve --max-agent-reports`.
pub const DEFAULT_MAX_AGENT_REPORTS: usize = 256;
/// Default of `serve --max-log-uploads`.
pub const DEFAULT_MAX_LOG_UPLOADS: usize = 64;
/// Default of `serve --max-log-reads`.
pub const DEFAULT_MAX_LOG_READS: usize = 128;

/// A kind of request, with a budget of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Budget {
    /// The plugin's measurement calls, the rest of `/v1`, the pages, unknown paths.
    Api,
    /// Agents' long polls for work (`POST /v1/agents/{destination}/work`).
    AgentPolls,
    /// Agents' reports of their Jobs (`POST /v1/agents/{destination}/report`).
    AgentReports,
    /// Agents' uploads of a Job's log (`POST /v1/agents/{destination}/logs/{id}`).
    LogUploads,
    /// Reads of a run's log, whole or followed (`GET /v1/runs/{namespace}/{name}/logs`).
    LogReads,
}

impl Budget {
    /// Every budget, in the order of [`Budgets`].
    pub const ALL: [Budget; 5] = [
        Budget::Api,
        Budget::AgentPolls,
        Budget::AgentReports,
        Budget::LogUploads,
        Budget::LogReads,
    ];

    /// The kind of a request, from its path (see the module's doc).
    pub fn of(path: &str) -> Budget {
        let mut segments = path.strip_prefix("/v1/").unwrap_or_default().split('/');
        match (
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
            segments.next(),
        ) {
            (Some("agents"), Some(_), Some("work"), None, _) => Budget::AgentPolls,
            (Some("agents"), Some(_), Some("report"), None, _) => Budget::AgentReports,
            (Some("agents"), Some(_), Some("logs"), Some(_), None) => Budget::LogUploads,
            (Some("runs"), Some(_), Some(_), Some("logs"), None) => Budget::LogReads,
            _ => Budget::Api,
        }
    }

    /// The `budget` label of its metrics.
    pub fn label(self) -> &'static str {
        match self {
            Budget::Api => "api",
            Budget::AgentPolls => "agent_polls",
            Budget::AgentReports => "agent_reports",
            Budget::LogUploads => "log_uploads",
            Budget::LogReads => "log_reads",
        }
    }

    /// The `serve` flag that sizes it.
    pub fn flag(self) -> &'static str {
        match self {
            Budget::Api => "--max-concurrent-requests",
            Budget::AgentPolls => "--max-agent-polls",
            Budget::AgentReports => "--max-agent-reports",
            Budget::LogUploads => "--max-log-uploads",
            Budget::LogReads => "--max-log-reads",
        }
    }

    /// What it counts, for people.
    fn what(self) -> &'static str {
        match self {
            Budget::Api => "plugin and API requests",
            Budget::AgentPolls => "agent long polls",
            Budget::AgentReports => "agent reports",
            Budget::LogUploads => "agent log uploads",
            Budget::LogReads => "log reads",
        }
    }

    /// `Retry-After` of a refusal, seconds. A refused poll waits longer: the agent then holds
    /// no slot at all, and its work is only late by as much (its records are kept).
    fn retry_after(self) -> &'static str {
        match self {
            Budget::AgentPolls => "5",
            _ => "1",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The sizes of the budgets: `serve`'s flags (flattened into `ServeArgs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
pub struct BudgetArgs {
    /// Most connections open at once on the API port (each agent holds one); beyond it new
    /// connections wait in the kernel's backlog until one closes. The server raises its
    /// open-file limit to fit, as far as the hard limit allows.
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_CONNECTIONS",
          default_value_t = DEFAULT_MAX_CONNECTIONS, value_parser = parse_limit)]
    pub max_connections: usize,
    /// Most plugin and API requests served at once (agents' calls and log reads have budgets of
    /// their own and never take these slots); beyond it a request is answered 503 `overloaded`
    /// at once, before authentication, and its caller retries.
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_CONCURRENT_REQUESTS",
          default_value_t = DEFAULT_MAX_CONCURRENT_REQUESTS, value_parser = parse_limit)]
    pub max_concurrent_requests: usize,
    /// Most agents' long polls held at once (one per agent destination polling this replica,
    /// at most 4 per destination); beyond it a poll is answered 503 and the agent backs off.
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_AGENT_POLLS",
          default_value_t = DEFAULT_MAX_AGENT_POLLS, value_parser = parse_limit)]
    pub max_agent_polls: usize,
    /// Most agents' reports served at once.
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_AGENT_REPORTS",
          default_value_t = DEFAULT_MAX_AGENT_REPORTS, value_parser = parse_limit)]
    pub max_agent_reports: usize,
    /// Most agents' uploads of a Job's log served at once (one per log being read from an agent
    /// destination).
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_LOG_UPLOADS",
          default_value_t = DEFAULT_MAX_LOG_UPLOADS, value_parser = parse_limit)]
    pub max_log_uploads: usize,
    /// Most reads of a run's log served at once, whole or followed (`logs -f`, the run page).
    #[arg(long, env = "ROLLOUTS_DISPATCH_MAX_LOG_READS",
          default_value_t = DEFAULT_MAX_LOG_READS, value_parser = parse_limit)]
    pub max_log_reads: usize,
}

impl Default for BudgetArgs {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
            max_agent_polls: DEFAULT_MAX_AGENT_POLLS,
            max_agent_reports: DEFAULT_MAX_AGENT_REPORTS,
            max_log_uploads: DEFAULT_MAX_LOG_UPLOADS,
            max_log_reads: DEFAULT_MAX_LOG_READS,
        }
    }
}

impl BudgetArgs {
    /// The size of one request budget.
    pub fn size(&self, budget: Budget) -> usize {
        match budget {
            Budget::Api => self.max_concurrent_requests,
            Budget::AgentPolls => self.max_agent_polls,
            Budget::AgentReports => self.max_agent_reports,
            Budget::LogUploads => self.max_log_uploads,
            Budget::LogReads => self.max_log_reads,
        }
    }
}

/// A limit is a positive count.
fn parse_limit(s: &str) -> Result<usize, std::num::ParseIntError> {
    s.parse::<std::num::NonZeroUsize>().map(usize::from)
}

/// The slots of one budget.
#[derive(Debug)]
struct Slots {
    free: Arc<Semaphore>,
    max: usize,
}

/// The request budgets of the API port, each counted in the metrics (`budget_in_use`,
/// `budget_refused`, `budget_size`).
#[derive(Clone)]
pub struct Budgets {
    slots: Arc<[Slots; 5]>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Budgets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Budgets")
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

impl Budgets {
    /// Budgets of the sizes `args` gives (each ≥ 1).
    pub fn new(args: &BudgetArgs, metrics: Arc<Metrics>) -> Self {
        let slots = Budget::ALL.map(|b| {
            let max = args.size(b).max(1);
            metrics.set_budget_size(b.label(), max);
            Slots {
                free: Arc::new(Semaphore::new(max)),
                max,
            }
        });
        Self {
            slots: Arc::new(slots),
            metrics,
        }
    }

    /// `router` behind the budgets: the outermost layer, so that a refusal comes before
    /// authentication (no TokenReview spent) and before routing.
    pub fn around(self, router: axum::Router) -> axum::Router {
        router.layer(axum::middleware::from_fn_with_state(self, limit_requests))
    }

    /// The `503` of a request refused by `budget`.
    fn refusal(&self, budget: Budget) -> Response {
        let max = self.slots[budget.index()].max;
        let body = serde_json::json!({
            "code": "overloaded",
            "message": format!(
                "the server is serving its maximum of {max} {} (serve {}); retry shortly",
                budget.what(),
                budget.flag()
            ),
        });
        let mut resp = (StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(budget.retry_after()),
        );
        resp
    }
}

/// Middleware: runs the request if its budget has a free slot, else answers `503 overloaded`.
pub async fn limit_requests(State(budgets): State<Budgets>, req: Request, next: Next) -> Response {
    let budget = Budget::of(req.uri().path());
    let slots = &budgets.slots[budget.index()];
    let Ok(slot) = slots.free.clone().try_acquire_owned() else {
        budgets.metrics.count_budget_refused(budget.label());
        tracing::warn!(path = %req.uri().path(), budget = budget.label(), max = slots.max,
                       flag = budget.flag(), "request refused: its budget is used up");
        return budgets.refusal(budget);
    };
    let in_use = budgets.metrics.budget_in_use(budget.label());
    in_use.inc();
    // Counted down however the request ends, a dropped connection included.
    let counted = Counted(in_use);
    let reply = next.run(req).await;
    if budget != Budget::LogReads {
        return reply;
    }
    // The stream outlives the handler: the slot goes with the body.
    let (parts, body) = reply.into_parts();
    let held = (slot, counted);
    let body = futures::stream::unfold(
        (body.into_data_stream(), held),
        |(mut b, held)| async move {
            futures::StreamExt::next(&mut b)
                .await
                .map(|chunk| (chunk, (b, held)))
        },
    );
    Response::from_parts(parts, axum::body::Body::from_stream(body))
}

/// Decrements a gauge when dropped.
struct Counted(prometheus_client::metrics::gauge::Gauge);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Raises the soft limit of open files toward `wanted` (the connection budget plus the server's
/// own files), as far as the hard limit allows; returns the soft limit in force, or `None` when
/// it cannot be read. Each connection is a file descriptor, so a budget of 4 096 connections
/// under a soft limit of 1 024 would fail accepts long before the budget is reached.
pub fn raise_open_files(wanted: u64) -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft >= wanted {
        return Some(soft);
    }
    let raised = wanted.min(hard);
    match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
        Ok(()) => Some(raised),
        Err(_) => Some(soft),
    }
}

#[cfg(test)]
mod tests;
