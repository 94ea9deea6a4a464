//! `rollouts-dispatch doctor`: validates the configuration, prints the security model it sets
//! (callers fail closed, the `policy.callers` entries, what each rule allows, a warning per rule
//! that allows every namespace), starts the engine and checks every
//! destination: API server reachable, watch caches synced, and the RBAC the engine needs
//! (SelfSubjectAccessReview; then, per destination, a line on the reads of the `rollout:` and
//! `application:` checks), and whether the AnalysisRuns that confirm requests (`confirmRuns`)
//! can be watched. Prints a table; exit 0 when every row is fine, 1 otherwise. Then one line per
//! destination on the Jobs left behind longer than the retention ([`super::leftovers`]), for a
//! person to act on (they do not change the exit code).
//!
//! Nothing secret is printed: rows show names, sources, server URLs and error messages only.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

use crate::config::{ConfirmRuns, DEFAULT_ARGOCD_INSTANCE};
use crate::destinations::{Destination, Entry, Source};
use crate::engine::Engine;
use crate::runs::Runs;
use crate::runtime::limits;

use super::{parse_duration, ConfigArgs};

/// `rollouts-dispatch doctor`
#[derive(Debug, Clone, Args)]
pub struct DoctorArgs {
    /// `--config`
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Bound on waiting for destinations (Go duration).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// One access the engine needs: verb, API group, resource, subresource, namespaced.
const CHECKS: [(&str, &str, &str, &str, bool); 7] = [
    ("create", "batch", "jobs", "", true),
    ("delete", "batch", "jobs", "", true),
    ("get", "", "pods", "log", true),
    // The watch caches list and watch across all namespaces, or in each namespace of a
    // destination limited to `namespaces`.
    ("list", "batch", "jobs", "", false),
    ("watch", "batch", "jobs", "", false),
    ("list", "", "pods", "", false),
    ("watch", "", "pods", "", false),
];

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// destination name
    pub name: String,
    /// where it comes from, short
    pub source: String,
    /// API server URL
    pub server: String,
    /// `yes` / `no`
    pub reachable: String,
    /// `ok`, `-` or the missing permissions
    pub rbac: String,
    /// version, cache state or the error
    pub detail: String,
    /// whether the row is fine
    pub ok: bool,
}

fn short_source(s: &Source) -> String {
    match s {
        Source::Config { index } => format!("config[{index}]"),
        Source::ArgoCd {
            instance,
            namespace,
            secret,
        } if instance == DEFAULT_ARGOCD_INSTANCE => format!("argocd:{namespace}/{secret}"),
        Source::ArgoCd {
            instance,
            namespace,
            secret,
        } => format!("argocd[{instance}]:{namespace}/{secret}"),
        Source::ArgoCdInCluster { .. } => "argocd:in-cluster".into(),
        Source::ArgoCdHome { instance } => format!("argocd[{instance}]:own-cluster"),
        Source::Kubeconfig { context, .. } => format!("kubeconfig:{context}"),
        Source::Agent { index } => format!("agent[{index}]"),
        Source::Local => "local".into(),
    }
}

/// Runs `rollouts-dispatch doctor`; returns the exit code.
pub(super) async fn run(args: DoctorArgs) -> ExitCode {
    let config = match args.config.load() {
        Ok(c) => {
            println!("config: OK ({})", c.origin);
            for line in model_lines(&c) {
                println!("{line}");
            }
            c
        }
        Err(e) => {
            println!("config: {e}");
            return ExitCode::from(1);
        }
    };
    let settings = config.engine;
    let confirm_runs = config.confirm_runs;
    let store = config.agents.as_ref().map(|a| a.store);
    let agents = config.agents.as_ref().map_or(0, |a| a.destinations.len());
    let engine = match Engine::start(config).await {
        Ok(e) => e,
        Err(e) => {
            println!("engine: {e}");
            return ExitCode::from(1);
        }
    };
    let deadline = Instant::now() + args.timeout;
    let runs_ok = check_runs(confirm_runs, &engine, args.timeout).await;
    // Argo CD cluster Secrets (a live source) must be listed before the registry is complete.
    let _ = engine.registry().wait_sources(args.timeout).await;
    let entries = engine.registry().entries();
    if entries.is_empty() {
        println!("destinations: none (add `destinations` to the config, or kubeconfig contexts)");
        return ExitCode::from(1);
    }
    let call_timeout = settings.request_timeout.min(args.timeout);
    let rows =
        futures::future::join_all(entries.iter().map(|e| check(e, deadline, call_timeout))).await;
    print_table(&rows);
    let left_timeout = deadline
        .saturating_duration_since(Instant::now())
        .max(call_timeout);
    for line in super::leftovers::lines(&engine, store, left_timeout).await {
        println!("{line}");
    }
    for line in observe_access(&entries, call_timeout).await {
        println!("{line}");
    }
    if agents > 0 {
        println!("{}", budget_line(agents, &served_budgets()));
    }
    if rows.iter().all(|r| r.ok) {
        println!("all {} destination(s) OK", rows.len());
        if runs_ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        }
    } else {
        println!(
            "{} of {} destination(s) have problems",
            rows.iter().filter(|r| !r.ok).count(),
            rows.len()
        );
        ExitCode::from(1)
    }
}

/// Who may do what under `config` (#27): how callers are bound to projects (they fail closed),
/// the `policy.callers` entries, what each rule allows, and a warning per rule that allows
/// every namespace.
fn model_lines(config: &crate::config::ServerConfig) -> Vec<String> {
    let policy = config.policy.clone().unwrap_or_default();
    let mut lines =
        vec![format!(
        "model: callers fail closed: a plugin JWT acts for the projects of its `projects` claim \
         (none: 401, `token issue --project`), a TokenReview identity (serve \
         --token-review-allow) for those of its first `policy.callers` entry (none: 403), an \
         agent token for its destination's work only; {} callers entr{}",
        policy.callers.len(),
        if policy.callers.len() == 1 { "y" } else { "ies" }
    )];
    for (i, c) in policy.callers.iter().enumerate() {
        lines.push(format!(
            "model: policy.callers[{i}]: {} acts for projects [{}]",
            c.subject,
            c.projects.join(", ")
        ));
    }
    for (i, r) in policy.rules.iter().enumerate() {
        lines.push(format!(
            "model: policy.rules[{i}]: projects [{}] may run Jobs on [{}] in namespaces [{}], \
             pod security {}, service accounts [{}]",
            r.projects.join(", "),
            r.destinations.join(", "),
            r.namespaces.join(", "),
            r.pod_security,
            r.service_accounts.join(", ")
        ));
    }
    let rules = crate::policy::Policy::new(config.policy.as_ref(), &config.origin);
    lines.extend(rules.warning().map(|w| format!("policy: WARN {w}")));
    lines.extend(
        rules
            .namespace_warnings()
            .into_iter()
            .map(|w| format!("policy: WARN {w}")),
    );
    lines
}

/// The budgets `serve` runs with here: its flags read from their environment variables (set in
/// the server's pod, where `doctor` runs) by `serve`'s own argument definitions, else defaults.
fn served_budgets() -> limits::BudgetArgs {
    use clap::{Args, FromArgMatches};
    let command = limits::BudgetArgs::augment_args(clap::Command::new("serve"));
    command
        .try_get_matches_from(["serve"])
        .ok()
        .and_then(|m| limits::BudgetArgs::from_arg_matches(&m).ok())
        .unwrap_or_default()
}

/// One line on whether one replica's budgets hold `agents` agent destinations: each holds one
/// long poll (two while it reconnects) and one connection, if every agent polls this replica.
fn budget_line(agents: usize, budgets: &limits::BudgetArgs) -> String {
    let (polls, connections) = (budgets.max_agent_polls, budgets.max_connections);
    // Room for the plugin, log readers and the pages beside the agents' connections.
    let fits = agents.saturating_mul(2) <= polls && agents + 256 <= connections;
    if fits {
        format!(
            "budgets: {agents} agent destination(s) fit one replica (serve --max-agent-polls \
             {polls}, --max-connections {connections})"
        )
    } else {
        format!(
            "budgets: WARN {agents} agent destination(s) may not fit one replica: raise serve \
             --max-agent-polls to at least {} and --max-connections to at least {} (now {polls} \
             and {connections}), or spread the agents over more replicas (agents.store: \
             kubernetes lets any replica serve any agent)",
            agents * 2,
            agents + 256
        )
    }
}

/// Prints whether measurement requests are confirmed against the control plane's AnalysisRuns
/// (`confirmRuns`) and, when they are, whether the watch `serve` starts lists them within
/// `timeout` (the RBAC it needs); false when it does not.
async fn check_runs(confirm: ConfirmRuns, engine: &Engine, timeout: Duration) -> bool {
    if let Some(why) = confirm.not_confirmed_because() {
        println!("runs: not confirmed: {why}");
        return true;
    }
    let client = match engine.control_plane_client().await {
        Ok(c) => c,
        Err(e) => {
            println!("runs: cannot confirm them (confirmRuns): {e}");
            return false;
        }
    };
    let runs = Runs::watch(client);
    if runs.wait_synced(timeout).await {
        println!("runs: confirmed against the control plane's AnalysisRuns (confirmRuns)");
        true
    } else {
        let why = runs
            .problem()
            .unwrap_or_else(|| format!("no answer within {timeout:?}"));
        println!(
            "runs: the watch of analysisruns on the control plane is not synced ({why}): every \
             measurement request would be answered 503; the server needs list and watch on \
             analysisruns.argoproj.io there (or `confirmRuns: false`)"
        );
        false
    }
}

async fn check(entry: &Entry, deadline: Instant, call_timeout: Duration) -> Row {
    let mut row = Row {
        name: entry.name().to_string(),
        source: short_source(entry.source()),
        server: if entry.server().is_empty() {
            "-".into()
        } else {
            entry.server().to_string()
        },
        reachable: "no".into(),
        rbac: "-".into(),
        detail: String::new(),
        ok: false,
    };
    let d: &Arc<Destination> = match entry {
        Entry::Ready(d) => d,
        Entry::Broken(b) => {
            row.detail = one_line(&b.error);
            return row;
        }
        Entry::Agent(_) => {
            // Nothing to dial: the agent dials the server. Its state is on the server.
            row.reachable = "via agent".into();
            row.detail = "check its connection with `rollouts-dispatch destinations`".into();
            row.ok = true;
            return row;
        }
    };
    let client = d.client().clone();
    let version = match tokio::time::timeout(call_timeout, client.apiserver_version()).await {
        Ok(Ok(v)) => v.git_version,
        Ok(Err(e)) => {
            row.detail = one_line(&format!("API server did not answer: {}", chain(&e)));
            return row;
        }
        Err(_) => {
            row.detail = format!("API server did not answer within {call_timeout:?}");
            return row;
        }
    };
    row.reachable = "yes".into();
    let (missing, synced) = tokio::join!(
        rbac(&client, &d.namespace, d.namespaces.as_deref(), call_timeout),
        d.wait_synced(deadline.saturating_duration_since(Instant::now()))
    );
    let mut problems = Vec::new();
    match missing {
        Ok(m) if m.is_empty() => row.rbac = "ok".into(),
        Ok(m) => {
            row.rbac = format!("missing: {}", m.join(", "));
            problems.push(format!(
                "grant the missing permissions to the destination's identity (namespace {})",
                d.namespace
            ));
        }
        Err(e) => {
            row.rbac = "unknown".into();
            problems.push(one_line(&format!("SelfSubjectAccessReview failed: {e}")));
        }
    }
    let cache = if synced {
        d.cache_problem()
    } else {
        Some(
            d.cache_problem()
                .unwrap_or_else(|| "watch caches not synced".into()),
        )
    };
    if let Some(p) = cache {
        problems.push(one_line(&p));
    }
    row.ok = problems.is_empty();
    row.detail = if problems.is_empty() {
        format!("{version}, caches synced, namespace {}", d.namespace)
    } else {
        format!("{version}: {}", problems.join("; "))
    };
    // Works, but a person should know: not a failure of the row.
    for w in entry.warnings() {
        row.detail = format!("WARNING {w}; {}", row.detail);
    }
    row
}

/// The reads of the `rollout:` and `application:` checks, in a destination's namespace.
const OBSERVE_CHECKS: [(&str, &str); 3] = [
    ("get", "rollouts"),
    ("list", "analysisruns"),
    ("get", "applications"),
];

/// One line per destination: whether its credentials may do the reads of the observe checks
/// (`argoproj.io`, in its default namespace). Needed only by templates with `rollout:` or
/// `application:`, so informative: they do not change the exit code.
async fn observe_access(entries: &[Entry], timeout: Duration) -> Vec<String> {
    let lines = entries.iter().map(|entry| async move {
        let name = entry.name();
        let d = match entry {
            Entry::Ready(d) => d,
            Entry::Agent(_) => {
                return format!(
                    "observe checks on {name}: not checked here (the agent reads its own cluster                      with its ServiceAccount: it needs get on rollouts and applications, list on                      analysisruns of argoproj.io in its namespaces)"
                )
            }
            Entry::Broken(_) => {
                return format!("observe checks on {name}: not checked (unusable destination)")
            }
        };
        let api: Api<SelfSubjectAccessReview> = Api::all(d.client().clone());
        let mut parts = Vec::new();
        for (verb, resource) in OBSERVE_CHECKS {
            let answer = review(&api, verb, "argoproj.io", resource, "", Some(&d.namespace), timeout).await;
            parts.push(match answer {
                Ok(true) => format!("{verb} {resource}: yes"),
                Ok(false) => format!("{verb} {resource}: NO"),
                Err(e) => format!("{verb} {resource}: unknown ({})", one_line(&e.to_string())),
            });
        }
        format!(
            "observe checks on {name} (namespace {}; needed by rollout:/application: blocks only): {}",
            d.namespace,
            parts.join(", ")
        )
    });
    futures::future::join_all(lines).await
}

/// Whether the API server allows `verb` on `group/resource[/sub]` in `namespace` (`None`: all)
/// to the caller.
async fn review(
    api: &Api<SelfSubjectAccessReview>,
    verb: &str,
    group: &str,
    resource: &str,
    sub: &str,
    namespace: Option<&str>,
    timeout: Duration,
) -> Result<bool, ReviewError> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(group.to_string()),
                resource: Some(resource.to_string()),
                subresource: (!sub.is_empty()).then(|| sub.to_string()),
                namespace: namespace.map(str::to_string),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    match tokio::time::timeout(timeout, api.create(&PostParams::default(), &review)).await {
        Ok(Ok(r)) => Ok(r.status.is_some_and(|s| s.allowed)),
        Ok(Err(e)) => Err(ReviewError::Api(e)),
        Err(_) => Err(ReviewError::Timeout(timeout)),
    }
}

/// Why a SelfSubjectAccessReview gave no answer.
#[derive(Debug, thiserror::Error)]
enum ReviewError {
    /// The API server refused the review or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within the request timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Where each check of [`CHECKS`] is asked: the namespaced ones in `namespace`, the watches of
/// the caches cluster-wide (`None`), or in each of `watched` for a limited destination.
fn check_scopes<'a>(
    namespace: &'a str,
    watched: Option<&'a [String]>,
) -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'a str>,
)> {
    CHECKS
        .iter()
        .flat_map(|&(verb, group, resource, sub, namespaced)| {
            let scopes: Vec<Option<&str>> = match (namespaced, watched) {
                (true, _) => vec![Some(namespace)],
                (false, None) => vec![None],
                (false, Some(list)) => list.iter().map(|n| Some(n.as_str())).collect(),
            };
            scopes
                .into_iter()
                .map(move |ns| (verb, group, resource, sub, ns))
        })
        .collect()
}

/// The checks of [`CHECKS`] that are denied, as `verb resource` strings.
async fn rbac(
    client: &kube::Client,
    namespace: &str,
    watched: Option<&[String]>,
    timeout: Duration,
) -> Result<Vec<String>, ReviewError> {
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let reviews =
        check_scopes(namespace, watched)
            .into_iter()
            .map(|(verb, group, resource, sub, scope)| {
                let api = api.clone();
                let what = format!(
                    "{verb} {resource}{}{}",
                    if sub.is_empty() {
                        String::new()
                    } else {
                        format!("/{sub}")
                    },
                    match scope {
                        Some(ns) if ns != namespace => format!(" (namespace {ns})"),
                        Some(_) => String::new(),
                        None => " (all namespaces)".to_string(),
                    }
                );
                async move {
                    let allowed = review(&api, verb, group, resource, sub, scope, timeout).await?;
                    Ok::<_, ReviewError>((what, allowed))
                }
            });
    let results = futures::future::join_all(reviews).await;
    let mut missing = Vec::new();
    for r in results {
        let (what, allowed) = r?;
        if !allowed {
            missing.push(what);
        }
    }
    Ok(missing)
}

/// An error and its sources, `: `-separated (repeated texts dropped).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn one_line(s: &str) -> String {
    s.replace('\n', " ")
}

/// Prints `rows` as an aligned table.
pub fn print_table(rows: &[Row]) {
    print!("{}", render_table(rows));
}

/// `rows` as an aligned table with a header line.
pub fn render_table(rows: &[Row]) -> String {
    let header = ["NAME", "SOURCE", "SERVER", "REACHABLE", "RBAC", "DETAIL"];
    let cells: Vec<[&str; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.name.as_str(),
                r.source.as_str(),
                r.server.as_str(),
                r.reachable.as_str(),
                r.rbac.as_str(),
                r.detail.as_str(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for c in &cells {
        for (w, s) in widths.iter_mut().zip(c) {
            *w = (*w).max(s.chars().count());
        }
    }
    let mut out = String::new();
    for line in std::iter::once(header).chain(cells) {
        let mut l = String::new();
        for (i, (s, w)) in line.iter().zip(widths).enumerate() {
            if i == line.len() - 1 {
                l.push_str(s);
            } else {
                l.push_str(&format!("{s:<w$}  "));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_model_says_who_may_do_what_and_warns_about_every_namespace() {
        let c = crate::config::ServerConfig::parse(
            "policy: {rules: [{projects: [team-a], destinations: [prod], namespaces: [verify]}, \
             {projects: [team-b], destinations: [edge], namespaces: ['*']}], \
             callers: [{subject: 'system:serviceaccount:argo-rollouts:argo-rollouts', \
             projects: ['*']}]}",
            "config file d.yaml",
        )
        .unwrap();
        let lines = super::model_lines(&c);
        let text = lines.join("\n");
        assert!(
            text.contains("callers fail closed") && text.contains("1 callers entry"),
            "{text}"
        );
        assert!(
            text.contains(
                "policy.callers[0]: system:serviceaccount:argo-rollouts:argo-rollouts acts for \
                 projects [*]"
            ),
            "{text}"
        );
        assert!(
            text.contains("policy.rules[0]: projects [team-a] may run Jobs on [prod] in namespaces [verify], pod security restricted"),
            "{text}"
        );
        let warns: Vec<&String> = lines.iter().filter(|l| l.contains("WARN")).collect();
        assert_eq!(warns.len(), 1, "{warns:?}");
        assert!(warns[0].contains("policy.rules[1] in config file d.yaml allows every namespace"));
    }

    use super::*;

    #[test]
    fn the_budget_line_says_when_a_fleet_outgrows_one_replica_and_which_flags_to_raise() {
        let defaults = limits::BudgetArgs::default();
        let fits = budget_line(1000, &defaults);
        assert!(
            fits.starts_with("budgets: 1000 agent destination(s) fit one replica"),
            "{fits}"
        );
        assert_eq!(served_budgets().max_agent_polls, defaults.max_agent_polls);
        let over = budget_line(1500, &defaults);
        assert!(over.contains("WARN 1500"), "{over}");
        assert!(
            over.contains("--max-agent-polls to at least 3000")
                && over.contains("--max-connections to at least 1756"),
            "{over}"
        );
    }

    #[test]
    fn a_limited_destination_is_checked_per_namespace_never_cluster_wide() {
        let all = check_scopes("verify", None);
        assert_eq!(all.len(), CHECKS.len());
        assert!(all
            .iter()
            .any(|c| c.0 == "watch" && c.2 == "pods" && c.4.is_none()));
        let watched = ["verify".to_string(), "smoke".to_string()];
        let limited = check_scopes("verify", Some(&watched));
        assert!(limited.iter().all(|c| c.4.is_some()), "{limited:?}");
        for ns in ["verify", "smoke"] {
            assert!(limited
                .iter()
                .any(|c| c.0 == "watch" && c.2 == "jobs" && c.4 == Some(ns)));
        }
        assert!(!limited
            .iter()
            .any(|c| c.0 == "create" && c.4 == Some("smoke")));
    }

    #[test]
    fn table_is_aligned() {
        let row = |n: &str, ok: bool| Row {
            name: n.into(),
            source: "config[0]".into(),
            server: "https://127.0.0.1:1".into(),
            reachable: if ok { "yes" } else { "no" }.into(),
            rbac: if ok { "ok" } else { "-" }.into(),
            detail: "d".into(),
            ok,
        };
        let t = render_table(&[row("a", true), row("longer-name", false)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        let col = lines[0].find("SOURCE").unwrap();
        assert_eq!(lines[1].find("config").unwrap(), col);
        assert_eq!(lines[2].find("config").unwrap(), col);
    }
}
