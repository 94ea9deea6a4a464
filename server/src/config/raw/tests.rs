//! The config file's validation: every refusal names the field and the fix.

use super::*;
use crate::config::ServerConfig;

fn parse(text: &str) -> Result<ServerConfig, String> {
    ServerConfig::parse(text, "config file t.yaml").map_err(|e| e.to_string())
}

#[test]
fn agents_have_defaults() {
    let c = parse("agents: {destinations: [{name: edge-1, labels: {env: edge}}]}").unwrap();
    let a = c.agents.unwrap();
    assert_eq!(a.store, StoreKind::Memory);
    assert_eq!(a.offline_after, Duration::from_secs(60));
    assert_eq!(a.namespace, None);
    assert_eq!(a.destinations[0].namespace, "default");
    assert_eq!(a.destinations[0].labels["env"], "edge");
    let k = parse("agents: {store: kubernetes, namespace: rd, offlineAfter: 2m}").unwrap();
    let a = k.agents.unwrap();
    assert_eq!(
        (a.store, a.namespace.as_deref(), a.offline_after),
        (StoreKind::Kubernetes, Some("rd"), Duration::from_secs(120))
    );
}

#[test]
fn users_and_graces_parse() {
    let rule = |extra: &str| {
        let c = parse(&format!(
            "policy: {{rules: [{{projects: [a], destinations: [b], namespaces: [n]{extra}}}]}}"
        ))
        .unwrap();
        c.policy.unwrap().rules[0].default_user
    };
    use crate::podsecurity::DefaultUser;
    assert_eq!(rule(""), DefaultUser::Id(65532));
    assert_eq!(rule(", defaultRunAsUser: 1000"), DefaultUser::Id(1000));
    assert_eq!(rule(", defaultRunAsUser: none"), DefaultUser::Image);
    let c = parse("engine: {startGrace: 0s, schedulingGrace: 5m}").unwrap();
    assert_eq!(c.engine.start_grace, Duration::ZERO);
    assert_eq!(c.engine.scheduling_grace, Duration::from_secs(300));
}

#[test]
fn every_mistake_names_file_and_field() {
    for (text, needle) in [
        (
            "destinations: [{name: a, kubeconfig: /k, tokn: x}]",
            "unknown field `tokn`",
        ),
        ("destinaton: []", "unknown field `destinaton`"),
        (
            "destinations: [{name: a}]",
            "destinations[0]: say how to reach it",
        ),
        (
            "destinations: [{name: 'a b', kubeconfig: /k}]",
            "destinations[0].name",
        ),
        ("destinations: [{name: stage, kubeconfig: /k}]", "reserved"),
        (
            "destinations: [{name: a, kubeconfig: /k}, {name: a, kubeconfig: /k}]",
            "destinations[1].name: \"a\" is used twice",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, token: t}]",
            "destinations[0].token: only allowed with `server`",
        ),
        (
            "destinations: [{name: a, server: 'ftp://x'}]",
            "destinations[0].server",
        ),
        (
            "destinations: [{name: a, server: 'https://x', kubeconfig: /k}]",
            "mutually exclusive",
        ),
        (
            "destinations: [{name: a, server: 'https://x', caData: nope}]",
            "destinations[0].caData",
        ),
        (
            "destinations: [{name: a, server: 'https://x', certData: c}]",
            "go together",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, namespace: Bad}]",
            "destinations[0].namespace",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, labels: {env: 'a b'}}]",
            "destinations[0].labels",
        ),
        (
            "policy: {rules: [{projects: [a]}]}",
            "policy.rules[0].destinations: empty list",
        ),
        (
            "policy: {callers: [{subject: 'system:serviceaccount:*', projects: []}]}",
            "policy.callers[0].projects: empty list",
        ),
        (
            "policy: {callers: [{subject: '', projects: [a]}]}",
            "policy.callers[0].subject",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b]}]}",
            "policy.rules[0]: name its namespaces (`namespaces: [verification]`); write `\"*\"` \
             to allow every namespace",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: []}]}",
            "policy.rules[0]: name its namespaces",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n, ' ']}]}",
            "policy.rules[0].namespaces[1]: empty glob",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n], podSecurity: Privileged}]}",
            "policy.rules[0].podSecurity: \"Privileged\" is not a pod security level",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n], serviceAccounts: []}]}",
            "policy.rules[0].serviceAccounts: empty list",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n], defaultRunAsUser: 0}]}",
            "policy.rules[0].defaultRunAsUser: \"0\" is not a user for the pods",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n], defaultRunAsUser: nobody}]}",
            "policy.rules[0].defaultRunAsUser: \"nobody\" is not a user for the pods",
        ),
        (
            "engine: {startGrace: soon}",
            "engine.startGrace: \"soon\" is not a duration",
        ),
        (
            "policy: {rules: [{projects: [a], destinations: [b], namespaces: [n], applicationNamespaces: [argocd, ' ']}]}",
            "policy.rules[0].applicationNamespaces[1]",
        ),
        (
            "policy: {allowAll: true, rules: [{projects: [a], destinations: [b], namespaces: [n]}]}",
            "policy.allowAll: `allowAll: true` and `rules` are mutually exclusive",
        ),
        ("engine: {connectTimeout: soon}", "engine.connectTimeout"),
        (
            "engine: {requestTimeout: 0s}",
            "engine.requestTimeout: must be more",
        ),
        ("argocd: {namespace: Argo}", "argocd.namespace"),
        (
            "argocd: {execProviders: [/bin/a, ' ']}",
            "argocd.execProviders[1]: \" \" is not a command",
        ),
        ("destinations: {}", "line 1 column 15"),
        (
            "agents: {store: etcd}",
            "agents.store: \"etcd\" is not a store",
        ),
        (
            "agents: {offlineAfter: 10ms}",
            "agents.offlineAfter: must be at least 1s",
        ),
        (
            "agents: {destinations: [{name: a}, {name: a}]}",
            "agents.destinations[1].name: \"a\" is used twice",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k}]\nagents: {destinations: [{name: a}]}",
            "agents.destinations[0].name: \"a\" is also in `destinations`",
        ),
        (
            "agents: {destinations: [{name: a, namespace: A}]}",
            "agents.destinations[0].namespace",
        ),
        (
            "agents: {destinations: [{name: a, url: x}]}",
            "unknown field `url`",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.starts_with("invalid config file t.yaml: "), "{e}");
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn runs_are_confirmed_when_the_control_plane_is_known() {
    let confirm = |text: &str| parse(text).map(|c| c.confirm_runs);
    assert_eq!(confirm("controlPlane: {}"), Ok(ConfirmRuns::On));
    assert_eq!(
        confirm("controlPlane: {kubeconfig: /cp}\nconfirmRuns: true"),
        Ok(ConfirmRuns::On)
    );
    assert_eq!(
        confirm("controlPlane: {}\nconfirmRuns: false"),
        Ok(ConfirmRuns::Off)
    );
    assert_eq!(confirm("confirmRuns: false"), Ok(ConfirmRuns::Off));
    assert_eq!(confirm(""), Ok(ConfirmRuns::NoControlPlane));
    let why = ConfirmRuns::NoControlPlane.not_confirmed_because().unwrap();
    assert!(why.contains("controlPlane"), "{why}");
    assert_eq!(ConfirmRuns::On.not_confirmed_because(), None);

    let e = parse("confirmRuns: true").unwrap_err();
    assert!(
        e.contains("t.yaml: confirmRuns: `true` needs `controlPlane`")
            && e.contains("`controlPlane: {}`"),
        "{e}"
    );
}

#[test]
fn destinations_limited_to_namespaces() {
    let c = parse(
        "destinations: [{name: a, kubeconfig: /k, namespaces: [verify, smoke]}, \
         {name: b, kubeconfig: /k, namespace: smoke, namespaces: [verify, smoke]}, \
         {name: c, kubeconfig: /k}]\n\
         argocd: {inClusterNamespaces: [verify]}",
    )
    .unwrap();
    let limits: Vec<_> = c
        .destinations
        .iter()
        .map(|d| d.namespaces.clone())
        .collect();
    let both = Some(vec!["verify".to_string(), "smoke".to_string()]);
    assert_eq!(limits, [both.clone(), both, None]);
    assert_eq!(
        c.argocd[0].in_cluster_namespaces.clone(),
        Some(vec!["verify".to_string()])
    );
    for (text, needle) in [
        (
            "destinations: [{name: a, kubeconfig: /k, namespaces: []}]",
            "destinations[0].namespaces: is empty: list at least one namespace",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, namespaces: [ok, 'team-*']}]",
            "destinations[0].namespaces: item 1: \"team-*\" is not a valid namespace name",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, namespaces: [Verify]}]",
            "destinations[0].namespaces: item 0",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, namespaces: [x, x]}]",
            "destinations[0].namespaces: lists \"x\" twice",
        ),
        (
            "destinations: [{name: a, kubeconfig: /k, namespace: default, namespaces: [verify]}]",
            "destinations[0].namespaces: does not list the destination's default namespace \"default\"",
        ),
        (
            "argocd: {inClusterNamespaces: []}",
            "argocd.inClusterNamespaces: is empty",
        ),
    ] {
        let e = parse(text).unwrap_err();
        assert!(e.contains(needle), "{text}: {e}");
    }
}

#[test]
fn application_namespaces_are_their_own_list_none_by_default() {
    let rule = |text: &str| parse(text).unwrap().policy.unwrap().rules.remove(0);
    let r = rule("policy: {rules: [{projects: [a], destinations: [b], namespaces: [argocd]}]}");
    assert!(r.application_namespaces.is_empty(), "{r:?}");
    let r = rule(
        "policy: {rules: [{projects: [a], destinations: [b], namespaces: [verification], \
         applicationNamespaces: [argocd, 'apps-*']}]}",
    );
    assert_eq!(r.namespaces, ["verification"]);
    assert_eq!(r.application_namespaces, ["argocd", "apps-*"]);
}
