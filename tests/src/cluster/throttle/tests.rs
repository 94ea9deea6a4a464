//! The throttle's pure parts: audit lines, the API server's flags, the audit policy, the level
//! and the schema.

use super::*;

/// Lines as kube-apiserver v1.37 writes them (`--audit-log-format=json`, level `Metadata`).
fn line(stage: &str, agent: &str, verb: &str, code: u16, at: &str) -> String {
    json!({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "auditID": "0b4e", "stage": stage,
        "requestURI": "/apis/batch/v1/namespaces/default/jobs", "verb": verb,
        "user": {"username": USER, "groups": ["system:authenticated"]},
        "sourceIPs": ["127.0.0.1"], "userAgent": agent,
        "objectRef": {"resource": "jobs", "namespace": "default", "apiGroup": "batch",
                      "apiVersion": "v1"},
        "responseStatus": {"metadata": {}, "status": "Failure",
                           "message": "Too many requests, please try again later.", "code": code},
        "requestReceivedTimestamp": at, "stageTimestamp": at,
    })
    .to_string()
}

#[test]
fn an_audit_line_is_a_complete_request_with_its_code() {
    let e = entry(&line(
        "ResponseComplete",
        "rollouts-dispatch/0.1.0",
        "create",
        429,
        "2026-03-01T10:00:00.123456Z",
    ))
    .unwrap();
    assert_eq!(
        (e.verb.as_str(), e.resource.as_str(), e.code),
        ("create", "jobs", 429)
    );
    assert_eq!(
        e.received,
        humantime::parse_rfc3339("2026-03-01T10:00:00.123456Z").unwrap()
    );
    // A watch logs ResponseStarted too: only the complete request counts.
    assert!(entry(&line(
        "ResponseStarted",
        "a/1",
        "watch",
        200,
        "2026-03-01T10:00:00Z"
    ))
    .is_none());
    assert!(entry("not json").is_none());
    assert!(entry("{\"stage\":\"ResponseComplete\"}").is_none());
}

#[test]
fn requests_are_counted_by_agent_prefix_window_and_kind() {
    let dir = std::env::temp_dir().join(format!("throttle-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("audit.log");
    let ours = "rollouts-dispatch/0.1.0";
    let lines = [
        line(
            "ResponseComplete",
            ours,
            "create",
            429,
            "2026-03-01T10:00:01Z",
        ),
        line(
            "ResponseComplete",
            ours,
            "create",
            429,
            "2026-03-01T10:00:02.5Z",
        ),
        line(
            "ResponseComplete",
            ours,
            "create",
            201,
            "2026-03-01T10:00:04Z",
        ),
        line(
            "ResponseComplete",
            ours,
            "delete",
            200,
            "2026-03-01T10:00:05Z",
        ),
        // before and after the window
        line(
            "ResponseComplete",
            ours,
            "create",
            429,
            "2026-03-01T09:59:59Z",
        ),
        line(
            "ResponseComplete",
            ours,
            "create",
            429,
            "2026-03-01T10:00:10Z",
        ),
        // another client, and the plugin whose name starts like ours but not its prefix
        line(
            "ResponseComplete",
            "kube-controller-manager/v1.37.2",
            "patch",
            429,
            "2026-03-01T10:00:03Z",
        ),
        line(
            "ResponseComplete",
            "rollouts-dispatch-plugin/0.1.0",
            "patch",
            429,
            "2026-03-01T10:00:03Z",
        ),
        line(
            "ResponseStarted",
            ours,
            "watch",
            200,
            "2026-03-01T10:00:03Z",
        ),
    ];
    std::fs::write(&log, lines.join("\n") + "\n{\"half\":").unwrap();
    let at = |s: &str| humantime::parse_rfc3339(s).unwrap();
    let count = count_requests(
        &log,
        "rollouts-dispatch/",
        at("2026-03-01T10:00:00Z"),
        at("2026-03-01T10:00:10Z"),
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!((count.requests, count.throttled), (4, 2));
    assert_eq!(
        count.by_kind,
        BTreeMap::from([
            ("create jobs".into(), (3, 2)),
            ("delete jobs".into(), (1, 0))
        ])
    );
    assert!(count_requests(
        &dir.join("none"),
        "x",
        at("2026-03-01T10:00:00Z"),
        at("2026-03-01T10:00:10Z")
    )
    .is_err());
}

#[test]
fn the_api_server_is_started_again_with_apf_and_one_audit_policy() {
    let before: Vec<String> = [
        "--secure-port=1",
        "--enable-priority-and-fairness=false",
        "--audit-policy-file=/old.yaml",
        "--audit-log-path=/old.log",
    ]
    .map(String::from)
    .to_vec();
    let after = apiserver_args(&before, Path::new("/d/p.yaml"), Path::new("/d/audit.log"));
    assert!(after.contains(&"--secure-port=1".to_string()));
    assert!(after.contains(&"--enable-priority-and-fairness=true".to_string()));
    assert!(!after
        .iter()
        .any(|a| a.ends_with("=false") || a.contains("/old")));
    assert_eq!(
        after
            .iter()
            .filter(|a| a.starts_with("--audit-policy-file"))
            .count(),
        1
    );
}

#[test]
fn the_policy_logs_every_request_of_the_resources_and_nothing_of_the_load() {
    let policy: Value = serde_saphyr::from_str(&audit_policy(&[
        Resource::jobs(),
        Resource::new("", "configmaps"),
    ]))
    .unwrap();
    let rules = policy["rules"].as_array().unwrap();
    assert_eq!(rules[0], json!({"level": "None", "users": [LOAD_USER]}));
    assert_eq!(
        rules[1],
        json!({"level": "Metadata", "resources": [
            {"group": "batch", "resources": ["jobs"]},
            {"group": "", "resources": ["configmaps"]}]})
    );
    assert_eq!(rules.len(), 5, "{rules:?}");
    assert_eq!(rules[2]["resources"][1]["resources"], json!(["leases"]));
    assert_eq!(rules.last().unwrap(), &json!({"level": "None"}));
}

#[test]
fn the_level_rejects_and_the_schema_sends_every_user_of_the_resources_there() {
    let level = priority_level();
    let limited = &level["spec"]["limited"];
    assert_eq!(limited["limitResponse"]["type"], "Reject");
    for field in [
        "nominalConcurrencyShares",
        "lendablePercent",
        "borrowingLimitPercent",
    ] {
        assert_eq!(limited[field], 0, "{field}");
    }
    let schema = flow_schema(&[Resource::dispatchjobs()]);
    assert_eq!(schema["spec"]["matchingPrecedence"], PRECEDENCE);
    let rule = &schema["spec"]["rules"][0];
    assert_eq!(rule["subjects"][0]["group"]["name"], "system:authenticated");
    assert_eq!(
        rule["resourceRules"][0]["apiGroups"][0],
        "rollouts-dispatch.io"
    );
    assert_eq!(rule["resourceRules"][0]["resources"][0], "dispatchjobs");
    assert_eq!(rule["resourceRules"][1]["namespaces"][0], NAME);
}
