//! One cluster Secret read: what it defines, what it may not do, and why it is unusable.

use super::*;
use k8s_openapi::ByteString;
use kube::api::ObjectMeta;

const CA: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

fn settings() -> ArgoCdConfig {
    ArgoCdConfig {
        name: "argocd".into(),
        location: crate::config::ArgoCdLocation::ControlPlane,
        shards: crate::config::Shards::Every,
        namespace: "argocd".into(),
        in_cluster: true,
        in_cluster_namespaces: None,
        default_namespace: "default".into(),
        exec_providers: vec!["sh".into(), "no-such-helper".into()],
    }
}

fn cp() -> kube::Config {
    kube::Config::new("https://127.0.0.1:6443".parse().unwrap())
}

fn secret(data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("cluster-prod".into()),
            namespace: Some("argocd".into()),
            labels: Some(BTreeMap::from([
                (SECRET_TYPE_LABEL.to_string(), "cluster".to_string()),
                ("env".to_string(), "prod".to_string()),
            ])),
            annotations: Some(BTreeMap::from([(
                NAMESPACE_ANNOTATION.to_string(),
                "verify".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test]
async fn bearer_token_and_ca() {
    let config =
        json!({"bearerToken": "tok", "tlsClientConfig": {"insecure": false, "caData": b64(CA)}});
    let s = spec_from_secret(
        &secret(&[
            ("name", "prod"),
            ("server", "https://10.0.0.1:6443/"),
            ("config", &config.to_string()),
        ]),
        &settings(),
    )
    .await;
    assert_eq!(s.name, "prod");
    assert_eq!(s.server, "https://10.0.0.1:6443");
    assert_eq!(s.namespace, "verify");
    assert_eq!(s.labels["env"], "prod");
    let c = s.config.unwrap();
    assert_eq!(c.cluster_url.to_string(), "https://10.0.0.1:6443/");
    assert!(c.root_cert.is_some());
    assert!(!c.accept_invalid_certs);
}

#[tokio::test]
async fn an_annotation_limits_the_destination_to_namespaces() {
    let limited = |namespace: Option<&str>, namespaces: &str| {
        let config = json!({"bearerToken": "tok"}).to_string();
        let mut s = secret(&[
            ("name", "prod"),
            ("server", "https://10.0.0.1:6443"),
            ("config", &config),
        ]);
        let a = s.metadata.annotations.as_mut().unwrap();
        a.remove(NAMESPACE_ANNOTATION);
        if let Some(ns) = namespace {
            a.insert(NAMESPACE_ANNOTATION.into(), ns.into());
        }
        a.insert(NAMESPACES_ANNOTATION.into(), namespaces.into());
        s
    };
    let s = spec_from_secret(&limited(None, "verify, smoke"), &settings()).await;
    assert_eq!(s.namespaces, Some(vec!["verify".into(), "smoke".into()]));
    assert_eq!(
        s.namespace, "verify",
        "`default` is not listed: the first is"
    );
    assert!(s.config.is_ok());
    let s = spec_from_secret(&limited(Some("smoke"), "verify,smoke"), &settings()).await;
    assert_eq!(s.namespace, "smoke");
    for (namespace, value, needle) in [
        (
            Some("other"),
            "verify",
            "does not list the destination's default namespace \"other\"",
        ),
        (None, "Verify", "item 0"),
        (None, " , ", "is empty"),
    ] {
        let s = spec_from_secret(&limited(namespace, value), &settings()).await;
        let e = s.config.unwrap_err().to_string();
        assert!(
            e.contains(NAMESPACES_ANNOTATION)
                && e.contains(needle)
                && e.contains("fix the Argo CD cluster Secret argocd/cluster-prod"),
            "{e}"
        );
    }
    let mut in_cluster = settings();
    in_cluster.in_cluster_namespaces = Some(vec!["a".into(), "default".into()]);
    let s = in_cluster_spec(&in_cluster, &cp());
    assert_eq!(
        (s.namespace.as_str(), s.namespaces.as_ref().map(Vec::len)),
        ("default", Some(2))
    );
}

/// #27: a Secret never gets this server's own credentials, for the cluster Argo CD runs on
/// or any other; the control plane is the implicit in-cluster alone.
#[tokio::test]
async fn a_secret_without_credentials_never_gets_the_servers_own() {
    let cert_only = json!({"tlsClientConfig": {"certData": b64(CA)}}).to_string();
    let empty_token = json!({"bearerToken": " "}).to_string();
    for (server, config, needle) in [
        (IN_CLUSTER_SERVER, "", "the cluster Argo CD runs on"),
        (
            IN_CLUSTER_SERVER,
            "{\"bearerToken\": \"t\"}",
            "never through a Secret",
        ),
        ("https://10.0.0.1:6443", "", "gives no credentials"),
        ("https://10.0.0.1:6443", "{}", "never reaches"),
        ("https://10.0.0.1:6443", &cert_only, "gives no credentials"),
        (
            "https://10.0.0.1:6443",
            &empty_token,
            "gives no credentials",
        ),
    ] {
        let s = spec_from_secret(
            &secret(&[("name", "local"), ("server", server), ("config", config)]),
            &settings(),
        )
        .await;
        let e = s.config.expect_err("no destination").to_string();
        assert!(e.contains(needle), "{server} {config}: {e}");
    }
    let implicit = in_cluster_spec(&settings(), &cp());
    assert_eq!(
        implicit.config.unwrap().cluster_url.to_string(),
        "https://127.0.0.1:6443/"
    );
    assert_eq!(implicit.name, IN_CLUSTER_NAME);
    assert_eq!(
        implicit.source,
        Source::ArgoCdInCluster {
            instance: "argocd".into()
        }
    );
}

#[tokio::test]
async fn unusable_secrets_say_why() {
    for (data, needle) in [
        (vec![("server", "https://x")], "data.name is missing"),
        (vec![("name", "x")], "data.server is missing"),
        (
            vec![("name", "x"), ("server", "https://x"), ("config", "{")],
            "not valid JSON",
        ),
        (
            vec![
                ("name", "x"),
                ("server", "https://x"),
                (
                    "config",
                    r#"{"bearerToken":"t","tlsClientConfig":{"caData":"%%%"}}"#,
                ),
            ],
            "caData is not base64",
        ),
        (
            vec![
                ("name", "x"),
                ("server", "https://x"),
                (
                    "config",
                    r#"{"awsAuthConfig":{"clusterName":"prod","roleARN":"arn:x"}}"#,
                ),
            ],
            "\"argocd-k8s-auth\" is not installed",
        ),
        (
            vec![
                ("name", "x"),
                ("server", "https://x"),
                (
                    "config",
                    r#"{"execProviderConfig":{"command":"no-such-helper","installHint":"get it"}}"#,
                ),
            ],
            "get it",
        ),
        (
            vec![
                ("name", "x"),
                ("server", "https://x"),
                ("config", r#"{"proxyUrl":"http://p","bearerToken":"t"}"#),
            ],
            "proxyUrl",
        ),
    ] {
        let s = spec_from_secret(&secret(&data), &settings()).await;
        let e = s.config.unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
        assert!(
            e.contains("Argo CD cluster Secret argocd/cluster-prod"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn exec_with_a_present_command_works() {
    let config =
        r#"{"execProviderConfig":{"command":"sh","args":["-c","exit 1"],"env":{"A":"b"}}}"#;
    let s = spec_from_secret(
        &secret(&[("name", "x"), ("server", "https://x"), ("config", config)]),
        &settings(),
    )
    .await;
    assert!(s.config.is_ok(), "{:?}", s.config.err());
}

#[tokio::test]
async fn exec_outside_the_allowlist_is_refused_and_insecure_is_kept() {
    for (config, allowed) in [
        (
            r#"{"execProviderConfig":{"command":"/bin/sh","args":["-c","id"]}}"#,
            vec!["sh".to_string()],
        ),
        (r#"{"execProviderConfig":{"command":"sh"}}"#, vec![]),
        (
            r#"{"execProviderConfig":{"command":"sh "}}"#,
            vec!["sh".to_string()],
        ),
    ] {
        let mut settings = settings();
        settings.exec_providers = allowed;
        let s = spec_from_secret(
            &secret(&[("name", "x"), ("server", "https://x"), ("config", config)]),
            &settings,
        )
        .await;
        let e = s.config.unwrap_err().to_string();
        assert!(e.contains("inside the rollouts-dispatch server"), "{e}");
        assert!(e.contains("argocd.execProviders"), "{e}");
        assert!(
            e.contains("Argo CD cluster Secret argocd/cluster-prod"),
            "{e}"
        );
    }
    let s = spec_from_secret(
        &secret(&[
            ("name", "x"),
            ("server", "https://x"),
            (
                "config",
                r#"{"bearerToken":"t","tlsClientConfig":{"insecure":true}}"#,
            ),
        ]),
        &settings(),
    )
    .await;
    assert!(s.config.unwrap().accept_invalid_certs);
}

#[test]
fn the_destination_name_is_data_name_else_the_secret_name() {
    assert_eq!(destination_name(&secret(&[("name", " prod ")])), "prod");
    assert_eq!(destination_name(&secret(&[("name", "")])), "cluster-prod");
    assert_eq!(destination_name(&secret(&[])), "cluster-prod");
}

#[tokio::test]
async fn fingerprints_follow_the_data() {
    let a = spec_from_secret(
        &secret(&[("name", "x"), ("server", "https://x")]),
        &settings(),
    )
    .await;
    let b = spec_from_secret(
        &secret(&[("name", "x"), ("server", "https://x")]),
        &settings(),
    )
    .await;
    let c = spec_from_secret(
        &secret(&[("name", "x"), ("server", "https://y")]),
        &settings(),
    )
    .await;
    assert_eq!(a.fingerprint, b.fingerprint);
    assert_ne!(a.fingerprint, c.fingerprint);
}
