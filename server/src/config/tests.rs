//! The configuration file parsed and validated: a full file, the defaults, and each mistake
//! refused with the field it names.

use super::*;

fn parse(text: &str) -> Result<ServerConfig, String> {
    ServerConfig::parse(text, "config file t.yaml").map_err(|e| e.to_string())
}

#[test]
fn a_full_file_parses() {
    let c = parse(
        r#"
controlPlane: {kubeconfig: /cp.kubeconfig, context: cp}
destinations:
- name: prod-eu
  labels: {env: prod}
  namespace: verification
  kubeconfig: /k
  context: prod-eu
- name: edge-1
  server: https://10.0.0.1:6443/
  token: abc
  caData: "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
- name: "arn:aws:eks:eu-west-1:1:cluster/x"
  kubeconfig: /k
kubeconfigContexts: {contexts: ["kind-*"]}
argocd: {namespace: gitops}
policy:
  rules:
  - projects: [team-a]
    destinations: ["prod-*"]
    namespaces: [verification]
engine: {connectTimeout: 2s}
"#,
    )
    .unwrap();
    assert_eq!(c.origin, "config file t.yaml");
    assert_eq!(
        c.control_plane,
        Access::Kubeconfig {
            path: Some("/cp.kubeconfig".into()),
            context: Some("cp".into())
        }
    );
    assert_eq!(c.destinations.len(), 3);
    assert_eq!(c.destinations[0].labels["env"], "prod");
    let Access::Direct(d) = &c.destinations[1].access else {
        panic!("direct")
    };
    assert_eq!(d.server, "https://10.0.0.1:6443");
    assert_eq!(d.token.as_ref().unwrap().expose(), "abc");
    assert!(
        !format!("{d:?}").contains("abc"),
        "tokens never appear in Debug"
    );
    let argocd = &c.argocd[0];
    assert_eq!(c.argocd.len(), 1);
    assert_eq!(argocd.name, DEFAULT_ARGOCD_INSTANCE);
    assert_eq!(argocd.location, ArgoCdLocation::ControlPlane);
    assert_eq!(argocd.shards, Shards::Every);
    assert_eq!(argocd.namespace, "gitops");
    assert!(argocd.in_cluster);
    assert_eq!(argocd.default_namespace, "default");
    assert_eq!(c.policy.unwrap().rules[0].namespaces, vec!["verification"]);
    assert_eq!(c.engine.connect_timeout, Duration::from_secs(2));
    assert_eq!(c.engine.request_timeout, Duration::from_secs(20));
    assert_eq!(c.jobs, JobsSettings::default());
}

#[test]
fn the_default_deadline_is_within_the_longest_allowed() {
    let c = parse("engine: {maxMeasurementDeadline: 2h, measurementDeadline: 1h}").unwrap();
    assert_eq!(c.engine.max_measurement_deadline, Duration::from_secs(7200));
    assert_eq!(
        EngineSettings::default().max_measurement_deadline,
        Duration::from_secs(6 * 3600)
    );
    let e = parse("engine: {maxMeasurementDeadline: 20m}").unwrap_err();
    assert!(
        e.contains(
            "engine.measurementDeadline: 30m is more than `engine.maxMeasurementDeadline` (20m)"
        ),
        "{e}"
    );
}

#[test]
fn jobs_settings_are_durations_of_a_minute_or_more() {
    let c = parse("jobs: {ttlAfterFinished: 2h, retention: 30m}").unwrap();
    assert_eq!(c.jobs.ttl_after_finished, Duration::from_secs(7200));
    assert_eq!(c.jobs.retention, Duration::from_secs(1800));
    for (text, needle) in [
        (
            "jobs: {ttlAfterFinished: 10s}",
            "jobs.ttlAfterFinished: must be at least 1m",
        ),
        (
            "jobs: {retention: 0s}",
            "jobs.retention: must be at least 1m",
        ),
        (
            "jobs: {retention: soon}",
            "jobs.retention: \"soon\" is not a duration",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn the_example_file_is_valid() {
    let c = ServerConfig::parse(
        include_str!("../../../config/server.yaml"),
        "config file config/server.yaml",
    )
    .unwrap();
    assert_eq!(c.destinations.len(), 2);
    assert_eq!(c.confirm_runs, ConfirmRuns::On);
    assert!(matches!(&c.destinations[1].access, Access::Direct(d) if d.token_file.is_some()));
    let policy = c.policy.unwrap();
    assert_eq!(policy.rules.len(), 4);
    assert!(policy.rules[2].automount_service_account_token && !policy.allow_all);
    assert_eq!(c.argocd[0].default_namespace, "verification");
    let agents = c.agents.unwrap();
    assert_eq!(agents.store, StoreKind::Kubernetes);
    assert_eq!(agents.destinations[0].name, "edge-2");
}

#[test]
fn empty_and_default() {
    let c = parse("").unwrap();
    assert!(c.destinations.is_empty() && c.policy.is_none());
    assert_eq!(c.control_plane, Access::Infer);
    let d = ServerConfig::embedded_default();
    assert!(d.kubeconfig_contexts.is_some());
}

#[test]
fn an_unreadable_file_is_named() {
    let e = ServerConfig::load(Path::new("/nonexistent/x.yaml")).unwrap_err();
    assert!(
        e.to_string()
            .contains("/nonexistent/x.yaml: cannot read it"),
        "{e}"
    );
}

#[test]
fn policy_callers_bind_users_to_projects() {
    let c = parse(
        r#"
policy:
  callers:
  - {subject: "system:serviceaccount:team-a:*", projects: [team-a, "team-a-*"]}
"#,
    )
    .unwrap();
    let p = c.policy.unwrap();
    assert!(p.rules.is_empty());
    assert_eq!(
        p.callers,
        vec![CallerBinding {
            subject: "system:serviceaccount:team-a:*".into(),
            projects: vec!["team-a".into(), "team-a-*".into()],
        }]
    );
}
