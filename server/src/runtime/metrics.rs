//! Prometheus metrics of the server (`/metrics` on the admin port).

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    route: String,
    method: String,
    code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabels {
    route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    destination: String,
    phase: String,
}

/// Every metric the server exports.
pub struct Metrics {
    registry: Mutex<Registry>,
    requests: Family<RequestLabels, Counter>,
    latency: Family<RouteLabels, Histogram>,
    verdicts: Family<PhaseLabels, Counter>,
    jobs: Family<JobLabels, Gauge>,
    verdict_latency: Histogram,
    agent_connected: Family<DestinationLabels, Gauge>,
    agent_reports: Family<DestinationLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationLabels {
    destination: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with the prefix `rollouts_dispatch`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("rollouts_dispatch");
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let verdicts = Family::<PhaseLabels, Counter>::default();
        let jobs = Family::<JobLabels, Gauge>::default();
        let verdict_latency = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        registry.register(
            "http_requests",
            "API requests by route, method and status code",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "API request latency by route",
            latency.clone(),
        );
        registry.register(
            "verdicts",
            "measurement verdicts returned, by phase",
            verdicts.clone(),
        );
        registry.register(
            "jobs",
            "Jobs known to the engine, by destination and phase",
            jobs.clone(),
        );
        registry.register(
            "verdict_latency_seconds",
            "time from a Job finishing to its verdict being reported",
            verdict_latency.clone(),
        );
        let agent_connected = Family::<DestinationLabels, Gauge>::default();
        let agent_reports = Family::<DestinationLabels, Counter>::default();
        registry.register(
            "agent_connected",
            "1 when the agent of an agent destination polled this replica within agents.offlineAfter",
            agent_connected.clone(),
        );
        registry.register(
            "agent_reports",
            "Job states reported by agents, by destination",
            agent_reports.clone(),
        );
        Self {
            agent_connected,
            agent_reports,
            registry: Mutex::new(registry),
            requests,
            latency,
            verdicts,
            jobs,
            verdict_latency,
        }
    }

    /// Counts a verdict returned to the plugin.
    pub fn observe_verdict(&self, phase: &str) {
        self.verdicts
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .inc();
    }

    /// Records how long after a Job finished its verdict was reported.
    pub fn observe_verdict_latency(&self, seconds: f64) {
        self.verdict_latency.observe(seconds);
    }

    /// Sets whether the agent of `destination` is connected.
    pub fn set_agent_connected(&self, destination: &str, connected: bool) {
        self.agent_connected
            .get_or_create(&DestinationLabels {
                destination: destination.into(),
            })
            .set(i64::from(connected));
    }

    /// Counts `n` reports stored for `destination`.
    pub fn count_agent_reports(&self, destination: &str, n: u64) {
        self.agent_reports
            .get_or_create(&DestinationLabels {
                destination: destination.into(),
            })
            .inc_by(n);
    }

    /// Sets the number of Jobs in `phase` on `destination`.
    pub fn set_jobs(&self, destination: &str, phase: &str, count: i64) {
        self.jobs
            .get_or_create(&JobLabels {
                destination: destination.into(),
                phase: phase.into(),
            })
            .set(count);
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock().expect("metrics registry lock");
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

/// Middleware: counts every API request by matched route (never the raw path: unbounded labels).
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = req.method().to_string();
    let started = Instant::now();
    let resp = next.run(req).await;
    m.requests
        .get_or_create(&RequestLabels {
            route: route.clone(),
            method,
            code: resp.status().as_u16(),
        })
        .inc();
    m.latency
        .get_or_create(&RouteLabels { route })
        .observe(started.elapsed().as_secs_f64());
    resp
}
