//! The server's HTTP application: every feature built once over one engine ([`Features`]), and
//! their routes assembled into one router ([`router`]).
//!
//! * Behind the bearer layer (`http::auth::require_bearer`, which puts the [`Principal`] in the
//!   request): the measurement routes (`measure::routes`), the agent routes
//!   (`measure::agents`), the agents' log uploads (`logs::routes::upload_routes`), the Argo CD
//!   Application routes (`applications::routes`), `/v1/openapi.json` and the fallback.
//! * Outside it, because they identify people as well as services (`http::viewer`): the log
//!   API (`logs::routes::read_routes`) and the pages (`ui`).
//! * Around everything: the request metrics, the `request` span, the body limit.
//!
//! [`Principal`]: crate::http::Principal

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::get;
use axum::{middleware, Router};

use crate::applications::{self, Applications};
use crate::config::budgets::{APPLICATION_CALLS_PER_PROJECT, MEASUREMENT_CALLS_PER_PROJECT};
use crate::engine::Engine;
use crate::http::{self, auth, Gate};
use crate::logs::board::LogBoard;
use crate::logs::peers::{LogPeers, PeerTransport};
use crate::logs::relay::{self, LogRelay};
use crate::logs::routes as log_routes;
use crate::logs::run::{log_quotas, RunLogs, Scope};
use crate::measure::agents::{self, AgentChannel};
use crate::measure::{routes as measure_routes, Measure, Measurements};
use crate::runs::Runs;
use crate::runtime::metrics::{self, Metrics};
use crate::runtime::quota::Quota;
use crate::signing::Signer;
use crate::ui::{self, Pages};

/// How the features are built beyond the engine.
#[derive(Default)]
pub struct Options {
    /// the control plane's AnalysisRuns: measurement requests are confirmed against them
    /// (`confirmRuns`), the log API and the pages find runs in them
    pub runs: Option<Runs>,
    /// `ui.externalURL`: every measurement message ends with the run page's address under it
    pub external_url: Option<String>,
    /// the other replicas, with whom log requests of agent destinations are shared
    pub log_peers: Option<PeerOptions>,
}

/// Log requests shared with the other replicas through the store's board.
pub struct PeerOptions {
    /// the board (`agents.store: kubernetes`)
    pub board: Arc<LogBoard>,
    /// this replica's address as the others reach it (pod IP and API port)
    pub me: SocketAddr,
    /// how uploads are forwarded to the replica holding the reader
    pub transport: PeerTransport,
}

/// Every feature of one replica, over one engine. `M` is [`Measurements`] but in the router's
/// own tests, which script the measurement answers.
pub struct Features<M = Measurements> {
    /// the plugin's measurement calls
    pub measure: Arc<M>,
    /// the agents' work and reports
    pub agents: Arc<AgentChannel>,
    /// the log API and the agents' log uploads
    pub logs: Arc<RunLogs>,
    /// the Argo CD Application routes
    pub applications: Arc<Applications>,
    /// the measurement calls each project has in progress (`budgets.measurementCallsPerProject`)
    measurement_calls: Quota,
    /// what the pages read
    engine: Engine,
    runs: Option<Runs>,
}

impl Features {
    /// The features over `engine`, reporting to `metrics`, signing with `signer`, each
    /// project's share of them bounded by `engine`'s `budgets:`.
    pub fn new(
        engine: Engine,
        metrics: Arc<Metrics>,
        signer: Arc<Signer>,
        options: Options,
    ) -> Self {
        let Options {
            runs,
            external_url,
            log_peers,
        } = options;
        let budgets = engine.budgets();
        let quota = |key, what, max| Quota::new(key, "project", what, max, Some(metrics.clone()));
        let waiting = relay::waiting_quota(
            budgets.pending_log_requests_per_destination,
            Some(metrics.clone()),
        );
        let relay = Arc::new(
            match log_peers {
                Some(PeerOptions {
                    board,
                    me,
                    transport,
                }) => LogRelay::with_peers(|wake| LogPeers::start(board, me, transport, wake)),
                None => LogRelay::default(),
            }
            .with_waiting(waiting),
        );
        let measurement_calls = quota(
            MEASUREMENT_CALLS_PER_PROJECT,
            "measurement calls in progress",
            budgets.measurement_calls_per_project,
        );
        let application_calls = quota(
            APPLICATION_CALLS_PER_PROJECT,
            "Application calls in progress",
            budgets.application_calls_per_project,
        );
        let log_quotas = log_quotas(&budgets, Some(metrics.clone()));
        let mut measure = Measurements::new(engine.clone(), metrics.clone(), signer)
            .with_external_url(external_url);
        if let Some(runs) = &runs {
            measure = measure.with_runs(runs.clone());
        }
        Self {
            measure: Arc::new(measure),
            agents: Arc::new(AgentChannel::new(engine.clone(), metrics, relay.clone())),
            logs: Arc::new(
                RunLogs::new(
                    engine.shared_registry(),
                    engine.store().cloned(),
                    runs.clone(),
                    relay,
                    engine.agent_offline_after(),
                    engine.jobs_settings(),
                    Scope {
                        policy: engine.policy().clone(),
                        marker: engine.job_marker(),
                    },
                )
                .with_quotas(log_quotas),
            ),
            applications: Arc::new(Applications::new(engine.clone()).with_calls(application_calls)),
            measurement_calls,
            engine,
            runs,
        }
    }
}

impl<M> Features<M> {
    /// The same features with the measurement calls answered by `measure` (tests).
    pub fn with_measure<N: Measure>(self, measure: Arc<N>) -> Features<N> {
        Features {
            measure,
            agents: self.agents,
            logs: self.logs,
            applications: self.applications,
            measurement_calls: self.measurement_calls,
            engine: self.engine,
            runs: self.runs,
        }
    }
}

/// The server's router: every feature's routes, callers identified by `gate`, requests counted
/// in `metrics`.
pub fn router<M: Measure>(features: &Features<M>, gate: Gate, metrics: Arc<Metrics>) -> Router {
    let authenticated = Router::new()
        .merge(measure_routes::routes(
            features.measure.clone(),
            metrics.clone(),
            features.measurement_calls.clone(),
            (
                features.engine.registry().hints().clone(),
                features.runs.clone(),
            ),
        ))
        .merge(agents::routes(features.agents.clone()))
        .merge(log_routes::upload_routes(features.logs.clone()))
        .merge(applications::routes::routes(features.applications.clone()))
        .route("/v1/openapi.json", get(http::openapi))
        .fallback(http::not_found)
        .layer(middleware::from_fn_with_state(
            gate.clone(),
            auth::require_bearer,
        ));
    let pages = Pages::new(gate.clone(), features.runs.clone(), features.engine.clone());
    Router::new()
        .merge(log_routes::read_routes(features.logs.clone(), gate))
        .merge(ui::router(pages))
        .merge(authenticated)
        .layer(middleware::from_fn_with_state(metrics, metrics::track))
        .layer(middleware::from_fn(http::request_span))
        .layer(DefaultBodyLimit::max(http::MAX_BODY))
}

/// The router `serve` builds over `engine`, in one step (for tests and tools that need no
/// feature at hand): [`Features::new`], then [`router`].
pub fn router_over(
    engine: Engine,
    metrics: Arc<Metrics>,
    signer: Arc<Signer>,
    options: Options,
    gate: Gate,
) -> Router {
    let features = Features::new(engine, metrics.clone(), signer, options);
    router(&features, gate, metrics)
}

#[cfg(test)]
mod tests;
