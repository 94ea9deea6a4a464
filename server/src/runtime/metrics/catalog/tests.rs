//! The catalog against the registry it describes: every family registered is in it with its type
//! and help, every series carries exactly its labels; `docs/metrics.md` is its Markdown
//! (`UPDATE_DOCS=1` rewrites it, `make docs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use tower::ServiceExt;

use super::super::{track, Metrics};
use super::*;

/// A registry with at least one series in every family, through the setters the code calls.
async fn every_family_touched() -> Arc<Metrics> {
    let m = Arc::new(Metrics::new());
    m.observe_verdict("Successful");
    m.observe_verdict_latency(0.3);
    m.set_jobs("a", "active", 1);
    m.set_agent_connected("edge", true);
    m.count_agent_reports("edge", 2);
    m.count_swept("a", "retention");
    m.count_past_deadline();
    m.count_gc_failure("a");
    m.set_pending_deletions(&BTreeMap::from([("a".to_string(), 1)]));
    m.set_budget_size("api", 4);
    m.budget_in_use("api").inc();
    m.count_budget_refused("api");
    m.count_over_budget("budgets.perProject");
    let app = Router::new()
        .route("/v1/x", get(|| async { "ok" }))
        .layer(axum::middleware::from_fn_with_state(m.clone(), track));
    let req = axum::http::Request::get("/v1/x")
        .body(Body::empty())
        .unwrap();
    app.oneshot(req).await.unwrap();
    m
}

/// `(name, labels)` of a sample line of the exposition.
fn sample(line: &str) -> (String, BTreeSet<String>) {
    let head = line.split(' ').next().unwrap_or_default();
    let (name, labels) = head.split_once('{').unwrap_or((head, ""));
    let labels = labels
        .trim_end_matches('}')
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split('=').next().unwrap_or_default().to_string())
        .collect();
    (name.to_string(), labels)
}

/// (prometheus_client writes no `# TYPE` line for a family without series: hence the touching.)
#[tokio::test]
async fn every_registered_family_is_in_the_catalog_with_its_type_and_help() {
    let text = every_family_touched().await.encode();
    let mut families = BTreeMap::new();
    let mut helps = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            families.insert(name.to_string(), kind.to_string());
        } else if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap();
            helps.insert(name.to_string(), help.to_string());
        }
    }
    let want: BTreeMap<String, String> = CATALOG
        .iter()
        .map(|d| (d.full_name(), d.kind.as_str().to_string()))
        .collect();
    assert_eq!(families, want, "registered families vs CATALOG");
    for d in CATALOG {
        // prometheus_client ends every help text with a full stop.
        assert_eq!(
            helps[&d.full_name()],
            format!("{}.", d.help),
            "help of {}",
            d.name
        );
    }
}

#[tokio::test]
async fn every_series_carries_exactly_the_catalog_labels() {
    let text = every_family_touched().await.encode();
    let mut seen = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (name, labels) = sample(line);
        let d = CATALOG
            .iter()
            .find(|d| d.series().contains(&name))
            .unwrap_or_else(|| panic!("series {name} of no catalog entry: {line}"));
        let mut want: BTreeSet<String> = d.labels.iter().map(|l| l.to_string()).collect();
        if name.ends_with("_bucket") {
            want.insert("le".into());
        }
        assert_eq!(labels, want, "labels of {line}");
        seen.insert(d.name);
    }
    let all: BTreeSet<&str> = CATALOG.iter().map(|d| d.name).collect();
    assert_eq!(seen, all, "every catalog entry has a series once touched");
}

#[test]
#[should_panic(expected = "not in runtime::metrics::catalog::CATALOG")]
fn a_name_outside_the_catalog_cannot_be_registered() {
    let mut registry = prometheus_client::registry::Registry::default();
    super::super::register(
        &mut registry,
        "not_a_metric",
        prometheus_client::metrics::counter::Counter::<u64>::default(),
    );
}

#[test]
fn docs_metrics_md_is_up_to_date() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let want = markdown();
    if std::env::var_os("UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/metrics.md differs from catalog::markdown(): run `make docs` to regenerate it from \
         server/src/runtime/metrics/catalog.rs"
    );
}
