//! Prometheus metrics of the server and the agent (`/metrics` on the admin port). Names, types,
//! labels and help come from [`catalog::CATALOG`], the one table `docs/metrics.md` is generated from.

pub mod catalog;

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
use prometheus_client::registry::{Metric, Registry};

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
    jobs_swept: Family<SweptLabels, Counter>,
    past_deadline: Counter,
    gc_failures: Family<DestinationLabels, Counter>,
    pending_deletions: Family<DestinationLabels, Gauge>,
    budget_in_use: Family<BudgetLabels, Gauge>,
    budget_refused: Family<BudgetLabels, Counter>,
    budget_size: Family<BudgetLabels, Gauge>,
    over_budget: Family<KeyLabels, Counter>,
    runtime_tasks: Gauge,
    open_fds: Gauge,
}

/// `key` is the config key of a per-owner budget (`runtime::quota`): a fixed set. The owner
/// (a project, a destination) is never a label: projects are tenants' names, unbounded.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KeyLabels {
    key: &'static str,
}

/// `budget` is one of `runtime::limits::Budget`'s labels: a fixed set.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BudgetLabels {
    budget: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestinationLabels {
    destination: String,
}

/// `reason` is `deleted_run`, `retention` or `run_completed` (`engine::SweepReason`); destinations are the
/// registry's: a fixed set per configuration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SweptLabels {
    destination: String,
    reason: &'static str,
}

/// Registers `metric` under `name` with the help text of its catalog entry.
fn register(registry: &mut Registry, name: &str, metric: impl Metric) {
    let doc = catalog::doc(name);
    registry.register(doc.name, doc.help, metric);
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with the prefix `rollouts_dispatch`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(catalog::PREFIX);
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let verdicts = Family::<PhaseLabels, Counter>::default();
        let jobs = Family::<JobLabels, Gauge>::default();
        let verdict_latency = Histogram::new(exponential_buckets(0.05, 2.0, 14));
        register(&mut registry, "http_requests", requests.clone());
        register(
            &mut registry,
            "http_request_duration_seconds",
            latency.clone(),
        );
        register(&mut registry, "verdicts", verdicts.clone());
        register(&mut registry, "jobs", jobs.clone());
        register(
            &mut registry,
            "verdict_latency_seconds",
            verdict_latency.clone(),
        );
        let agent_connected = Family::<DestinationLabels, Gauge>::default();
        let agent_reports = Family::<DestinationLabels, Counter>::default();
        register(&mut registry, "agent_connected", agent_connected.clone());
        register(&mut registry, "agent_reports", agent_reports.clone());
        let jobs_swept = Family::<SweptLabels, Counter>::default();
        register(&mut registry, "jobs_swept", jobs_swept.clone());
        let past_deadline = Counter::default();
        register(
            &mut registry,
            "measurements_past_deadline",
            past_deadline.clone(),
        );
        let gc_failures = Family::<DestinationLabels, Counter>::default();
        register(&mut registry, "gc_failures", gc_failures.clone());
        let pending_deletions = Family::<DestinationLabels, Gauge>::default();
        register(
            &mut registry,
            "pending_deletions",
            pending_deletions.clone(),
        );
        let budget_in_use = Family::<BudgetLabels, Gauge>::default();
        register(&mut registry, "budget_in_use", budget_in_use.clone());
        let budget_refused = Family::<BudgetLabels, Counter>::default();
        register(&mut registry, "budget_refused", budget_refused.clone());
        let budget_size = Family::<BudgetLabels, Gauge>::default();
        register(&mut registry, "budget_size", budget_size.clone());
        let over_budget = Family::<KeyLabels, Counter>::default();
        register(&mut registry, "over_budget", over_budget.clone());
        let runtime_tasks = Gauge::default();
        register(&mut registry, "runtime_tasks", runtime_tasks.clone());
        let open_fds = Gauge::default();
        register(&mut registry, "open_fds", open_fds.clone());
        Self {
            runtime_tasks,
            open_fds,
            over_budget,
            budget_in_use,
            budget_refused,
            budget_size,
            pending_deletions,
            gc_failures,
            past_deadline,
            jobs_swept,
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

    /// Counts a Job the sweep deleted on `destination`, for `reason` (`engine::SweepReason`).
    pub fn count_swept(&self, destination: &str, reason: &'static str) {
        self.jobs_swept
            .get_or_create(&SweptLabels {
                destination: destination.into(),
                reason,
            })
            .inc();
    }

    /// Counts a garbage collection that could not finish on `destination`.
    pub fn count_gc_failure(&self, destination: &str) {
        self.gc_failures
            .get_or_create(&DestinationLabels {
                destination: destination.into(),
            })
            .inc();
    }

    /// Sets the pending deletions per destination; a destination not in `pending` goes to 0.
    pub fn set_pending_deletions(&self, pending: &std::collections::BTreeMap<String, usize>) {
        // Families cannot list their series cheaply: reset every known one, then set.
        self.pending_deletions.clear();
        for (destination, n) in pending {
            self.pending_deletions
                .get_or_create(&DestinationLabels {
                    destination: destination.clone(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a measurement ended for its deadline (`Engine::past_deadline`).
    pub fn count_past_deadline(&self) {
        self.past_deadline.inc();
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

    /// The gauge of the requests `budget` serves now (`runtime::limits`).
    pub fn budget_in_use(&self, budget: &'static str) -> Gauge {
        self.budget_in_use
            .get_or_create(&BudgetLabels { budget })
            .clone()
    }

    /// One request refused by `budget`.
    pub fn count_budget_refused(&self, budget: &'static str) {
        self.budget_refused
            .get_or_create(&BudgetLabels { budget })
            .inc();
    }

    /// The size of `budget`; its in-use and refused series start at 0 with it.
    pub fn set_budget_size(&self, budget: &'static str, size: usize) {
        let labels = BudgetLabels { budget };
        self.budget_size
            .get_or_create(&labels)
            .set(i64::try_from(size).unwrap_or(i64::MAX));
        let _ = self.budget_in_use.get_or_create(&labels);
        let _ = self.budget_refused.get_or_create(&labels);
    }

    /// One request refused by the per-owner budget of config key `key` (`runtime::quota`).
    pub fn count_over_budget(&self, key: &'static str) {
        self.over_budget.get_or_create(&KeyLabels { key }).inc();
    }

    /// The refusals of the per-owner budget of `key` start at 0.
    pub fn start_over_budget(&self, key: &'static str) {
        let _ = self.over_budget.get_or_create(&KeyLabels { key });
    }

    /// The Prometheus text exposition of every metric, the process gauges read first.
    pub fn encode(&self) -> String {
        self.read_process_gauges();
        let mut out = String::new();
        let registry = self.registry.lock().expect("metrics registry lock");
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}

impl Metrics {
    /// Reads the process gauges, which nothing sets as it goes: the runtime's alive tasks (when
    /// called on a runtime, as the admin handler is) and the entries of `/proc/self/fd` (Linux;
    /// elsewhere the gauge stays at 0). A soak reads both to see that nothing piles up.
    fn read_process_gauges(&self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let tasks = runtime.metrics().num_alive_tasks();
            self.runtime_tasks
                .set(i64::try_from(tasks).unwrap_or(i64::MAX));
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The read_dir itself holds one descriptor while it counts: not ours to report.
            let open = entries.count().saturating_sub(1);
            self.open_fds.set(i64::try_from(open).unwrap_or(i64::MAX));
        }
    }
}

/// The `method` label of a request: the methods of RFC 9110 that clients send, else `other`.
/// HTTP methods are open-ended tokens (`FOO /v1/…` is a valid request line), so labelling the
/// raw method would let any caller, even one without a token, create a series per request.
pub fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// Middleware: counts every API request by matched route template (never the raw path, and
/// `unmatched` for every path no route matches) and by [`method_label`]: both label sets are
/// fixed, so no request can add series.
pub async fn track(State(m): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let method = method_label(req.method()).to_string();
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

#[cfg(test)]
mod tests {
    use axum::body::Body;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;

    /// The series of `http_requests` in the exposition.
    fn request_series(m: &Metrics) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| l.starts_with("rollouts_dispatch_http_requests_total{"))
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn pending_deletions_follow_the_last_pass() {
        let m = Metrics::new();
        let pass = |pairs: &[(&str, usize)]| {
            pairs
                .iter()
                .map(|(d, n)| (d.to_string(), *n))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        m.set_pending_deletions(&pass(&[("a", 2), ("gone", 1)]));
        m.set_pending_deletions(&pass(&[("a", 0)]));
        let text = m.encode();
        assert!(
            text.lines()
                .any(|l| l == "rollouts_dispatch_pending_deletions{destination=\"a\"} 0"),
            "{text}"
        );
        assert!(!text.contains("destination=\"gone\""), "{text}");
    }

    /// The value of the unlabelled gauge `name` in the exposition.
    fn gauge(text: &str, name: &str) -> i64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    }

    #[tokio::test]
    async fn the_process_gauges_follow_tasks_and_descriptors() {
        let m = Metrics::new();
        let before = m.encode();
        let (tasks, fds) = (
            gauge(&before, "rollouts_dispatch_runtime_tasks"),
            gauge(&before, "rollouts_dispatch_open_fds"),
        );
        let (hold, held) = tokio::sync::watch::channel(());
        let waiting: Vec<_> = (0..8)
            .map(|_| {
                let mut held = held.clone();
                tokio::spawn(async move { held.changed().await })
            })
            .collect();
        let files: Vec<_> = (0..64)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        let during = m.encode();
        assert_eq!(
            gauge(&during, "rollouts_dispatch_runtime_tasks"),
            tasks + 8,
            "{during}"
        );
        // Other tests of this process open and close files meanwhile: a margin, not an equality.
        assert!(
            gauge(&during, "rollouts_dispatch_open_fds") >= fds + 32,
            "{fds} before, then\n{during}"
        );
        drop((hold, files));
        for task in waiting {
            let _ = task.await;
        }
        let after = m.encode();
        assert_eq!(gauge(&after, "rollouts_dispatch_runtime_tasks"), tasks);
    }

    #[test]
    fn measurements_past_deadline_are_counted() {
        let m = Metrics::new();
        m.count_past_deadline();
        let text = m.encode();
        assert!(
            text.lines()
                .any(|l| l == "rollouts_dispatch_measurements_past_deadline_total 1"),
            "{text}"
        );
    }

    #[test]
    fn swept_jobs_are_counted_by_destination_and_reason() {
        let m = Metrics::new();
        m.count_swept("a", "retention");
        m.count_swept("a", "retention");
        m.count_swept("b", "deleted_run");
        let text = m.encode();
        for line in [
            "rollouts_dispatch_jobs_swept_total{destination=\"a\",reason=\"retention\"} 2",
            "rollouts_dispatch_jobs_swept_total{destination=\"b\",reason=\"deleted_run\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[tokio::test]
    async fn random_methods_and_paths_create_a_bounded_number_of_series() {
        let metrics = Arc::new(Metrics::new());
        let app = Router::new()
            .route("/v1/agents/{destination}/work", post(|| async { "ok" }))
            .fallback(|| async { axum::http::StatusCode::NOT_FOUND })
            .layer(axum::middleware::from_fn_with_state(metrics.clone(), track));
        let methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"];
        for i in 0..1000u32 {
            // Random-looking methods and paths: a new token of each every request.
            let method = if i % 3 == 0 {
                methods[i as usize % methods.len()].to_string()
            } else {
                format!("M{:x}", i.wrapping_mul(2_654_435_761))
            };
            let path = if i % 2 == 0 {
                format!("/v1/agents/d{i}/work")
            } else {
                format!("/x/{:x}/{i}", i.wrapping_mul(40_503))
            };
            let req = axum::http::Request::builder()
                .method(method.as_str())
                .uri(path)
                .body(Body::empty())
                .unwrap();
            app.clone().oneshot(req).await.unwrap();
        }
        let series = request_series(&metrics);
        // 2 routes × 8 methods × a few status codes at most; 1000 without the fixed labels.
        assert!(
            series.len() <= 2 * 8 * 2,
            "{} series: {series:#?}",
            series.len()
        );
        assert!(series.iter().any(|s| s.contains("method=\"other\"")));
        assert!(series.iter().any(|s| s.contains("route=\"unmatched\"")));
        assert!(series
            .iter()
            .any(|s| s.contains("route=\"/v1/agents/{destination}/work\"")));
        for s in &series {
            assert!(
                !s.contains("/x/") && !s.contains("M"),
                "raw input in a label: {s}"
            );
        }
    }

    #[test]
    fn method_labels_are_a_fixed_set() {
        use axum::http::Method;
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::CONNECT), "other");
        assert_eq!(method_label(&Method::from_bytes(b"BREW").unwrap()), "other");
    }
}
