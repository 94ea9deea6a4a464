//! Unit tests of the destination registry and its sources.

use super::*;
use crate::config::{Access, DirectAccess, SecretValue};

fn spec(name: &str, source: Source, server: &str, ok: bool) -> DestinationSpec {
    DestinationSpec {
        name: name.into(),
        labels: BTreeMap::from([("env".to_string(), "prod".to_string())]),
        namespace: "default".into(),
        namespaces: None,
        server: server.into(),
        source,
        fingerprint: 1,
        config: if ok {
            Ok(kube::Config::new("https://127.0.0.1:1".parse().unwrap()))
        } else {
            Err(AccessError::ExecWithoutCommand.into())
        },
        follows: None,
    }
}

#[tokio::test]
async fn precedence_and_replacement() {
    let r = Registry::new(EngineSettings::default(), false);
    assert!(r.wait_sources(Duration::from_millis(1)).await);
    let argo = Source::ArgoCd {
        instance: "argocd".into(),
        namespace: "argocd".into(),
        secret: "s".into(),
    };
    assert!(r.insert(spec("a", argo.clone(), "https://x", false)));
    assert!(
        matches!(r.get("a"), Some(Entry::Broken(b)) if b.error == "exec credentials without a command")
    );
    // Unchanged data from the same source is a no-op; config wins over Argo CD.
    assert!(!r.insert(spec("a", argo.clone(), "https://x", false)));
    assert!(r.insert(spec("a", Source::Config { index: 0 }, "https://y", true)));
    assert!(matches!(r.get("a"), Some(Entry::Ready(_))));
    assert!(!r.insert(spec("a", argo.clone(), "https://x", true)));
    assert!(!r.remove("a", &argo), "only the owning source removes");
    assert!(r.insert(spec("b", argo.clone(), "https://x/", true)));
    assert_eq!(r.by_server("https://x/").len(), 1);
    let sel = Selector::parse("env=prod").unwrap();
    assert_eq!(r.matching(&sel).len(), 2);
    assert!(r.remove("b", &argo));
    assert_eq!(r.names(), vec!["a"]);
    assert!(
        !r.insert(spec("stage", argo, "https://x", true)),
        "reserved name"
    );
    let waited = r
        .wait_for("a", Duration::from_millis(10), |e| {
            matches!(e, Entry::Ready(_))
        })
        .await;
    assert!(waited.is_some());
}

#[tokio::test]
async fn config_specs_take_the_namespace() {
    let mut d = DestinationConfig {
        name: "edge".into(),
        labels: BTreeMap::new(),
        namespace: Some("verify".into()),
        namespaces: None,
        access: Access::Direct(Box::new(DirectAccess {
            server: "https://10.0.0.1:6443".into(),
            token: Some(SecretValue::new("t")),
            ..DirectAccess::default()
        })),
    };
    let s = spec_from_config(2, &d).await;
    assert_eq!(s.namespace, "verify");
    assert_eq!(s.server, "https://10.0.0.1:6443");
    assert_eq!(s.source.to_string(), "config destinations[2]");
    assert!(s.config.is_ok());
    assert_eq!(s.namespaces, None);
    // Limited to namespaces without a `namespace`: the first is the default.
    d.namespace = None;
    d.namespaces = Some(vec!["smoke".into(), "verify".into()]);
    let s = spec_from_config(2, &d).await;
    assert_eq!(s.namespace, "smoke");
    assert_eq!(s.namespaces, d.namespaces);
}
