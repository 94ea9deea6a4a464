//! Log tails never carry the destination's Secrets: the values of every Secret the failed
//! container can read (env, envFrom, mounted volumes) are redacted from its tail, and when one
//! of them cannot be read the tail is withheld with the reason — whichever source the tail comes
//! from (termination message or `pods/log`).

use anyhow::Result;
use base64::Engine as _;
use dispatch_server::engine::JobRef;
use dispatch_server::logs::Redactor;
use dispatch_server::Phase;
use serde_json::json;

use crate::cluster_side::{finish_job, pod_for, terminated};
use crate::fake_api::{FakeApi, Res};
use crate::world::{block, request, run, World, NS};

const PASSWORD: &str = "pa55-w0rd-from-a-secret";
const PEM_LINE: &str = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7";

fn secrets() -> Res {
    Res::new("v1", "secrets")
}

fn put_secret(api: &FakeApi, name: &str, data: &[(&str, &str)]) {
    let b64 = |v: &str| base64::engine::general_purpose::STANDARD.encode(v);
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_string(), json!(b64(v))))
        .collect();
    api.put(
        &secrets(),
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": name, "namespace": NS}, "data": data}),
    );
}

/// A failed Job of run `n` whose pod's container `check` reads Secret `db` through env and
/// Secret `tls` through a volume, and printed `log` as its termination message.
async fn failed_reading_secrets(w: &World, n: u32, log: &str) -> Result<JobRef> {
    let ensured = w
        .engine
        .ensure(&request(
            &run(n),
            "smoke",
            1,
            block(json!({"destination": "a", "logTail": 10}))?,
        ))
        .await?;
    let job = ensured.job;
    w.cached("a", &job.name, true).await?;
    let api = w.api("a");
    let pod = pod_for(api, &job.name, terminated(1, Some(log)), true)?;
    api.update(&Res::new("v1", "pods"), NS, &pod, |p| {
        p["spec"] = json!({
            "containers": [{
                "name": "check", "image": "example.invalid/check:1",
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
                "volumeMounts": [{"name": "tls", "mountPath": "/tls"}]
            }],
            "volumes": [{"name": "tls", "secret": {"secretName": "tls"}}]
        });
    });
    finish_job(api, &job.name, "Failed", "BackoffLimitExceeded", "");
    Ok(job)
}

#[tokio::test]
async fn the_values_of_secrets_the_container_reads_are_redacted_from_its_tail() -> Result<()> {
    let w = World::start("").await?;
    let api = w.api("a");
    put_secret(api, "db", &[("password", PASSWORD)]);
    put_secret(
        api,
        "tls",
        &[(
            "tls.key",
            &format!("-----BEGIN KEY-----\n{PEM_LINE}\n-----END KEY-----\n"),
        )],
    );
    let log = format!("connecting with {PASSWORD}\nkey line {PEM_LINE}\nfailed\n");
    let job = failed_reading_secrets(&w, 1, &log).await?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Failed);
    let m = &v.message;
    assert!(m.contains("termination message"), "{m}");
    assert!(
        m.contains("connecting with *****\nkey line *****\nfailed"),
        "{m}"
    );
    assert!(
        !m.contains(PASSWORD) && !m.contains(PEM_LINE),
        "a Secret leaked: {m}"
    );
    assert_eq!(
        api.calls("GET", "/secrets/db"),
        1,
        "each Secret read once per verdict"
    );
    // Asked again (the agent asks every loop until its record goes): no new Secret read.
    let again = w.engine.status(&job, &Redactor::default()).await;
    assert_eq!(again.message, v.message);
    assert_eq!(
        api.calls("GET", "/secrets/db"),
        1,
        "a rendered tail is kept"
    );
    Ok(())
}

#[tokio::test]
async fn a_secret_that_cannot_be_read_withholds_the_tail() -> Result<()> {
    let w = World::start("").await?;
    let api = w.api("a");
    put_secret(api, "db", &[("password", PASSWORD)]);
    // `tls` does not exist (deleted after the pod started): its values are unknown.
    let job = failed_reading_secrets(&w, 2, &format!("key {PEM_LINE}\n")).await?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert_eq!(v.phase, Phase::Failed);
    let m = &v.message;
    assert!(!m.contains(PEM_LINE), "a Secret leaked: {m}");
    assert!(m.contains("withheld"), "{m}");
    assert!(m.contains("Secret(s) db, tls"), "{m}");
    assert!(m.contains(&format!("Secret {NS}/tls")), "{m}");
    assert!(
        m.contains("`get` those Secrets, or set `logTail: 0`"),
        "{m}"
    );

    // Forbidden reads withhold too.
    put_secret(api, "tls", &[("tls.key", "k")]);
    api.fail("GET", "/secrets/tls", 403, 10);
    let job = failed_reading_secrets(&w, 3, &format!("key {PASSWORD}\n")).await?;
    let v = w
        .verdict(&job, &Redactor::default(), |v| v.phase.is_terminal())
        .await?;
    assert!(
        v.message.contains("withheld") && !v.message.contains(PASSWORD),
        "{}",
        v.message
    );
    Ok(())
}
