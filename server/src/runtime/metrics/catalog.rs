//! The catalog of every metric `serve` and `agent` export: name, type, labels and help, in one
//! table that [`super::Metrics::new`] registers from and `docs/metrics.md` is generated from
//! (`make docs`), so the reference cannot drift from the registry. The chart's dashboard and
//! alerts are checked against the generated page (`make monitoring-check`).

/// The prefix of every metric name (`Registry::with_prefix`).
pub const PREFIX: &str = "rollouts_dispatch";

/// A metric's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// only goes up; exposed as `<name>_total`
    Counter,
    /// goes up and down
    Gauge,
    /// exposed as `<name>_bucket{le}`, `<name>_sum` and `<name>_count`
    Histogram,
}

impl Kind {
    /// The word of the exposition's `# TYPE` line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// Which processes move a metric. Both expose the whole registry on `/metrics` of
/// `--admin-listen`; a metric the process never sets has no series there (or stays at 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Set {
    /// `rollouts-dispatch serve` only
    Server,
    /// `serve` and `rollouts-dispatch agent`
    ServerAndAgent,
}

/// One metric of the catalog.
#[derive(Clone, Copy, Debug)]
pub struct MetricDoc {
    /// The name without the prefix, as registered.
    pub name: &'static str,
    /// Its type.
    pub kind: Kind,
    /// Its label names, in the order of its label set.
    pub labels: &'static [&'static str],
    /// Its help text (the exposition's `# HELP`).
    pub help: &'static str,
    /// Which processes set it.
    pub set_by: Set,
}

impl MetricDoc {
    /// The name as exposed: `rollouts_dispatch_<name>`.
    pub fn full_name(&self) -> String {
        format!("{PREFIX}_{}", self.name)
    }

    /// The names of its series as Prometheus stores them.
    pub fn series(&self) -> Vec<String> {
        let full = self.full_name();
        match self.kind {
            Kind::Counter => vec![format!("{full}_total")],
            Kind::Gauge => vec![full],
            Kind::Histogram => ["bucket", "sum", "count"]
                .iter()
                .map(|s| format!("{full}_{s}"))
                .collect(),
        }
    }
}

/// Every metric, in the order of the reference.
pub const CATALOG: &[MetricDoc] = &[
    MetricDoc {
        name: "http_requests",
        kind: Kind::Counter,
        labels: &["route", "method", "code"],
        help: "API requests by route, method and status code",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "http_request_duration_seconds",
        kind: Kind::Histogram,
        labels: &["route"],
        help: "API request latency by route",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "verdicts",
        kind: Kind::Counter,
        labels: &["phase"],
        help: "measurement verdicts returned, by phase",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "verdict_latency_seconds",
        kind: Kind::Histogram,
        labels: &[],
        help: "time from a Job finishing to its verdict being reported",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "jobs",
        kind: Kind::Gauge,
        labels: &["destination", "phase"],
        help: "Jobs known to the engine, by destination and phase",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "agent_connected",
        kind: Kind::Gauge,
        labels: &["destination"],
        help: "1 when the agent of an agent destination polled this replica within agents.offlineAfter",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "agent_reports",
        kind: Kind::Counter,
        labels: &["destination"],
        help: "Job states reported by agents, by destination",
        set_by: Set::ServerAndAgent,
    },
    MetricDoc {
        name: "jobs_swept",
        kind: Kind::Counter,
        labels: &["destination", "reason"],
        help: "Jobs deleted by the sweep (agent destinations: deletions asked of the agent), by \
               destination and reason (deleted_run: the AnalysisRun is gone; retention: it \
               completed longer ago than jobs.retention; run_completed: it completed while the \
               Job still ran; record_retention: its agent record finished longer ago than the \
               records' retention)",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "measurements_past_deadline",
        kind: Kind::Counter,
        labels: &[],
        help: "Measurements ended because they had no verdict by the server's deadline (the \
               block's activeDeadline, else engine.measurementDeadline, plus engine.deadlineGrace \
               for Jobs): in Error for an agent gone, a destination unreachable, a Job never \
               started; in Failed for an observe check whose object never got as it wants",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "gc_failures",
        kind: Kind::Counter,
        labels: &["destination"],
        help: "Garbage collection calls that could not delete on a destination (best effort: the \
               call still succeeds; the Jobs end by their TTL and the sweep), by destination",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "pending_deletions",
        kind: Kind::Gauge,
        labels: &["destination"],
        help: "Jobs a Terminate (or a sweep, a garbage collection) asked to delete that are not \
               gone yet, by destination: a direct destination that could not be reached (the \
               server retries), or an agent that has not confirmed the deletion",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "budget_in_use",
        kind: Kind::Gauge,
        labels: &["budget"],
        help: "Requests being served now, by request budget (api: the plugin and the API; \
               agent_polls, agent_reports, log_uploads, log_reads: see serve --help)",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "budget_refused",
        kind: Kind::Counter,
        labels: &["budget"],
        help: "Requests answered 503 overloaded because their budget was used up, by budget \
               (raise the serve flag the reply names, or add a replica)",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "budget_size",
        kind: Kind::Gauge,
        labels: &["budget"],
        help: "The size of each request budget (its serve flag)",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "over_budget",
        kind: Kind::Counter,
        labels: &["key"],
        help: "Requests answered 429 over_budget because their project (or agent destination) \
               held its share of a per-owner budget, by the config key of that budget (raise it \
               in the server's config if the load is legitimate)",
        set_by: Set::Server,
    },
    MetricDoc {
        name: "runtime_tasks",
        kind: Kind::Gauge,
        labels: &[],
        help: "Tasks alive in the process's async runtime, read at each scrape: it follows the \
               work in flight and comes back down when the work ends (a floor that keeps rising \
               under a steady load is a leak)",
        set_by: Set::ServerAndAgent,
    },
    MetricDoc {
        name: "open_fds",
        kind: Kind::Gauge,
        labels: &[],
        help: "File descriptors open in the process (sockets, watches, files), read at each \
               scrape from /proc/self/fd (absent where that does not exist)",
        set_by: Set::ServerAndAgent,
    },
];

/// The catalog entry of `name` (without the prefix).
///
/// # Panics
///
/// When `name` is not in [`CATALOG`]: a metric registered without its entry is a bug that
/// every test constructing [`super::Metrics`] finds.
pub fn doc(name: &str) -> &'static MetricDoc {
    CATALOG
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("metric {name:?} is not in runtime::metrics::catalog::CATALOG"))
}

const INTRO: &str = "\
<!-- Generated from server/src/runtime/metrics/catalog.rs (`CATALOG`); do not edit: run `make docs`. -->

# Metrics reference

`rollouts-dispatch serve` and `rollouts-dispatch agent` serve Prometheus metrics on `/metrics` of
their admin port (`--admin-listen`, default `0.0.0.0:9090`, with `/live` and `/ready`), in the
OpenMetrics text format. In the Helm chart, `serviceMonitor.enabled` scrapes the server (and the
agent, with `agent.service.enabled`), and `monitoring.dashboard.enabled` and
`monitoring.rules.enabled` install the Grafana dashboard and the Prometheus alerts that read the
metrics below (`charts/rollouts-dispatch/monitoring/`).

Both processes expose the same registry: a metric a process never sets has no series there, or
stays at 0. The agent sets only `rollouts_dispatch_agent_reports_total` (the reports its server
accepted) and the two process gauges (`rollouts_dispatch_runtime_tasks`,
`rollouts_dispatch_open_fds`); everything else comes from the server. The plugin
(`rollouts-dispatch-plugin`) has no `/metrics`: it runs inside the Argo Rollouts controller and
keeps no state, and what it does shows in the server's request metrics
(`route=\"/v1/measurements/…\"`).

Label values are bounded: `route` is the matched route template (`unmatched` for any other path),
`method` one of the RFC 9110 methods or `other`, `destination` a configured destination,
`budget` and `key` fixed sets; a project (a tenant's name) is never a label.
";

/// The reference as Markdown: `docs/metrics.md` holds exactly this (a test checks it; `make docs`
/// rewrites it). The `Series` column is what a query names; `make monitoring-check` reads it.
pub fn markdown() -> String {
    let cell = |s: &str| s.replace('|', "\\|");
    let mut out = String::from(INTRO);
    out.push_str("\n## Metrics\n\n| Series | Type | Labels | Set by | Description |\n|---|---|---|---|---|\n");
    for d in CATALOG {
        let series: Vec<String> = d.series().iter().map(|s| format!("`{s}`")).collect();
        let mut labels: Vec<String> = d.labels.iter().map(|l| format!("`{l}`")).collect();
        if d.kind == Kind::Histogram {
            labels.push("`le` (`_bucket`)".into());
        }
        let labels = if labels.is_empty() {
            "—".to_string()
        } else {
            labels.join(", ")
        };
        let set_by = match d.set_by {
            Set::Server => "serve",
            Set::ServerAndAgent => "serve, agent",
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            series.join("<br>"),
            d.kind.as_str(),
            labels,
            set_by,
            cell(d.help)
        ));
    }
    out
}

#[cfg(test)]
mod tests;
