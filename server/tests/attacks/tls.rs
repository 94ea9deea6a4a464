//! A man in the middle, a downgrade, a stale key: the API over TLS as `serve` runs it
//! ([`ServedScene`]: `listener::serve`, `serve`'s JWT check), the clients of the plugin and the
//! agent, and rotation of certificates, JWT keys and revocations on disk without a restart.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use dispatch_api::client::{ClientConfig, ClientError, ServerClient};
use dispatch_api::v1;
use dispatch_server::agent::{server_client, AgentOptions};
use dispatch_server::http::auth::{self, Claims};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::scene::{token, ServedFiles, ServedScene, KEY, RELOAD_EVERY};
use crate::tally::{self, Outcome};
use crate::world::eventually;

/// A scratch directory for one case.
pub(crate) fn scratch(case: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("rd-attacks-tls-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A certificate authority of the test, and the server certificates it issues.
pub(crate) struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key)?.pem();
        Ok(Self {
            pem,
            issuer: Issuer::new(params, key),
        })
    }

    /// A serving certificate for `localhost` and 127.0.0.1: (certificate PEM, key PEM).
    fn server_cert(&self) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params =
            CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "rollouts-dispatch");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        Ok((
            params.signed_by(&key, &self.issuer)?.pem(),
            key.serialize_pem(),
        ))
    }

    /// Writes a new serving certificate into `files`.
    fn issue_into(&self, files: &ServedFiles) -> Result<()> {
        let (cert, key) = self.server_cert()?;
        std::fs::write(&files.tls_cert, cert)?;
        std::fs::write(&files.tls_key, key)?;
        Ok(())
    }

    pub(crate) fn write(&self, path: &Path) -> Result<()> {
        Ok(std::fs::write(path, &self.pem)?)
    }
}

/// The files of a served scene in `dir`: a certificate of `ca`, the scene's JWT [`KEY`], an
/// empty revocations file.
pub(crate) fn served_files(dir: &Path, ca: &Ca) -> Result<ServedFiles> {
    let files = ServedFiles {
        tls_cert: dir.join("tls.crt"),
        tls_key: dir.join("tls.key"),
        jwt_key: dir.join("jwt.key"),
        revoked: dir.join("revoked"),
    };
    ca.issue_into(&files)?;
    std::fs::write(&files.jwt_key, KEY)?;
    std::fs::write(&files.revoked, "# revoked token ids\n")?;
    Ok(files)
}

/// A client that trusts only `ca` (a fresh connection pool: every call is a new handshake).
fn trusting(ca: &Ca) -> Result<reqwest::Client> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Ok(reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca.pem.as_bytes())?])
        .pool_max_idle_per_host(0)
        .build()?)
}

/// The status of `GET /v1/destinations` with `token`, or the connection error.
async fn status(client: &reqwest::Client, scene: &ServedScene, token: &str) -> Result<u16> {
    let resp = client
        .get(format!("{}{}", scene.url(), v1::DESTINATIONS))
        .bearer_auth(token)
        .send()
        .await?;
    Ok(resp.status().as_u16())
}

/// The agent's options for `server`, trusting `ca_file`.
fn agent_options(server: &str, ca_file: Option<PathBuf>, token_file: PathBuf) -> AgentOptions {
    AgentOptions {
        server: server.to_string(),
        token_file,
        ca_file,
        insecure_plaintext: false,
        destination: None,
        admin_listen: "127.0.0.1:0".parse().expect("an address"),
        poll_wait: Duration::from_secs(1),
        namespaces: vec!["verify".into()],
        pod_security: dispatch_server::podsecurity::Level::Restricted,
        service_accounts: vec!["default".into()],
        automount_service_account_token: false,
        argocd_sync: false,
        allowlists: Default::default(),
        // No record reaches these agents: they test the connection only.
        work_keys: dispatch_server::signing::WorkKeys::fixed(Vec::new()),
        default_user: Default::default(),
        graces: dispatch_server::verdict::Graces {
            start: Duration::from_secs(30),
            scheduling: Duration::from_secs(60),
        },
    }
}

#[tokio::test]
async fn plain_http_to_the_tls_api_port_gets_no_api_answer() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = scratch("downgrade")?;
    let ca = Ca::new("downgrade ca")?;
    let scene = ServedScene::start("", &served_files(&dir, &ca)?).await?;
    let good = token("plugin", |_| {});
    assert_eq!(
        status(&trusting(&ca)?, &scene, &good).await?,
        200,
        "the TLS API answers"
    );

    // A request in clear, with a valid token, as a downgraded client would send it.
    let mut tcp = tokio::net::TcpStream::connect(scene.addr).await?;
    tcp.write_all(
        format!(
            "GET {} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {good}\r\n\r\n",
            v1::DESTINATIONS
        )
        .as_bytes(),
    )
    .await?;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut answer)).await;
    let answered_http = answer.starts_with(b"HTTP/");
    let outcome = Outcome {
        refused: read.is_ok() && !answered_http,
        ..Outcome::default()
    };
    let plain = reqwest::Client::new()
        .get(format!(
            "http://127.0.0.1:{}{}",
            scene.addr.port(),
            v1::DESTINATIONS
        ))
        .bearer_auth(&good)
        .send()
        .await;
    assert!(
        plain.is_err(),
        "reqwest over plain HTTP got an answer: {plain:?}"
    );
    tally::refused(
        "tls: plain HTTP with a valid token to the TLS API port",
        outcome,
    );
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[test]
fn the_plugin_and_agent_clients_refuse_plain_http_to_a_remote_host() -> Result<()> {
    let dir = scratch("plaintext")?;
    let token_file = dir.join("token");
    for server in [
        "http://rollouts-dispatch.rollouts-dispatch.svc:8443",
        "http://10.0.0.7:8443",
        "http://localhost.attacker.example:8443",
    ] {
        // The plugin's client (`rollouts-dispatch-plugin --server`).
        let plugin = ServerClient::new(&ClientConfig {
            server: server.into(),
            token_file: Some(token_file.clone()),
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(1),
        });
        let refused = matches!(&plugin, Err(ClientError::Plaintext(_)));
        assert!(refused, "plugin client to {server}: {plugin:?}");
        let message = plugin.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("--insecure-plaintext"), "{message}");
        tally::refused(
            &format!("tls: plugin client to plain {server}"),
            Outcome {
                refused,
                ..Outcome::default()
            },
        );
        // The agent's client (`rollouts-dispatch agent --server`).
        let agent = server_client(
            &agent_options(server, None, token_file.clone()),
            RELOAD_EVERY,
        );
        let message = agent
            .as_ref()
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        let refused = message.contains("--insecure-plaintext");
        assert!(refused, "agent client to {server}: {agent:?}");
        tally::refused(
            &format!("tls: agent client to plain {server}"),
            Outcome {
                refused,
                ..Outcome::default()
            },
        );
    }
    // Loopback stays allowed (the server's own pod, tests); so does the explicit flag.
    server_client(
        &agent_options("http://127.0.0.1:8443", None, token_file.clone()),
        RELOAD_EVERY,
    )?;
    let mut allowed = agent_options("http://10.0.0.7:8443", None, token_file);
    allowed.insecure_plaintext = true;
    server_client(&allowed, RELOAD_EVERY)?;
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[tokio::test]
async fn an_agent_pinning_its_ca_refuses_a_certificate_of_another_ca_until_its_ca_file_changes(
) -> Result<()> {
    let dir = scratch("pinned")?;
    let (genuine, other) = (Ca::new("the server's ca")?, Ca::new("another ca")?);
    let scene = ServedScene::start("", &served_files(&dir, &genuine)?).await?;
    let token_file = dir.join("agent.token");
    std::fs::write(&token_file, token("plugin", |_| {}))?;
    // The agent pins `other`: the server's certificate (from `genuine`) must not be trusted.
    let ca_file = dir.join("ca.crt");
    other.write(&ca_file)?;
    let client = server_client(
        &agent_options(&scene.url(), Some(ca_file.clone()), token_file),
        RELOAD_EVERY,
    )?;
    let answer = client
        .get()
        .get::<serde_json::Value>(v1::DESTINATIONS)
        .await;
    let message = answer
        .as_ref()
        .err()
        .map(ToString::to_string)
        .unwrap_or_default();
    let refused = answer.is_err() && message.to_lowercase().contains("certificate");
    tally::refused(
        "tls: agent pinned to its CA, server certificate of another CA",
        Outcome {
            refused,
            ..Outcome::default()
        },
    );
    // The pinned CA file rotated on disk: the agent trusts the new CA without a restart.
    genuine.write(&ca_file)?;
    eventually("the agent trusting its rotated CA file", || async {
        Ok(client
            .get()
            .get::<serde_json::Value>(v1::DESTINATIONS)
            .await
            .ok())
    })
    .await?;
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[tokio::test]
async fn a_certificate_rotated_on_disk_is_served_to_new_connections_without_a_restart() -> Result<()>
{
    let dir = scratch("cert-rotation")?;
    let (old, new) = (Ca::new("old ca")?, Ca::new("new ca")?);
    let files = served_files(&dir, &old)?;
    let scene = ServedScene::start("", &files).await?;
    let good = token("plugin", |_| {});
    let (trusts_old, trusts_new) = (trusting(&old)?, trusting(&new)?);
    assert_eq!(status(&trusts_old, &scene, &good).await?, 200);
    assert!(
        status(&trusts_new, &scene, &good).await.is_err(),
        "not rotated yet"
    );

    new.issue_into(&files)?;
    eventually("the rotated certificate served", || async {
        Ok(status(&trusts_new, &scene, &good)
            .await
            .ok()
            .filter(|s| *s == 200))
    })
    .await?;
    // A fresh client: one that resumes a TLS session from before the rotation is not shown a
    // certificate at all (standard TLS resumption, not what this case is about).
    let old_refused = status(&trusting(&old)?, &scene, &good).await.is_err();
    // A broken rotation (garbage in the certificate file) keeps the certificate in force.
    std::fs::write(&files.tls_cert, "-----BEGIN CERTIFICATE-----\nnot base64\n")?;
    tokio::time::sleep(RELOAD_EVERY * 4).await;
    let kept = status(&trusts_new, &scene, &good).await.ok() == Some(200);
    assert!(
        kept,
        "a broken certificate file replaced the served certificate"
    );
    tally::refused(
        "tls: a certificate rotated on disk retires the old one for new connections",
        Outcome {
            refused: old_refused,
            ..Outcome::default()
        },
    );
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[tokio::test]
async fn a_jwt_key_rotated_on_disk_retires_its_tokens_without_a_restart() -> Result<()> {
    const NEW_KEY: &[u8] = b"attack-scene-rotated-signing-key-9876543210";
    let dir = scratch("key-rotation")?;
    let ca = Ca::new("key rotation ca")?;
    let files = served_files(&dir, &ca)?;
    let scene = ServedScene::start("", &files).await?;
    let client = trusting(&ca)?;
    let old_token = token("plugin", |_| {});
    let new_token = {
        let now = jsonwebtoken::get_current_timestamp();
        let claims = Claims {
            sub: "plugin".into(),
            aud: auth::AUDIENCE.into(),
            exp: now + 600,
            iat: now,
            jti: "after-rotation".into(),
            destination: None,
            projects: Some(vec!["*".into()]),
        };
        auth::issue(NEW_KEY, &claims)?
    };
    assert_eq!(status(&client, &scene, &old_token).await?, 200);
    assert_eq!(
        status(&client, &scene, &new_token).await?,
        401,
        "not rotated yet"
    );

    std::fs::write(&files.jwt_key, NEW_KEY)?;
    eventually("the new key accepted", || async {
        Ok((status(&client, &scene, &new_token).await? == 200).then_some(()))
    })
    .await?;
    let old_status = status(&client, &scene, &old_token).await?;
    tally::refused(
        "tls: a token of a JWT key removed from its file",
        Outcome {
            refused: old_status == 401,
            ..Outcome::default()
        },
    );
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}

#[tokio::test]
async fn a_jti_added_to_the_revocations_file_is_refused_without_a_restart() -> Result<()> {
    let dir = scratch("revocation")?;
    let ca = Ca::new("revocation ca")?;
    let files = served_files(&dir, &ca)?;
    let scene = ServedScene::start("", &files).await?;
    let client = trusting(&ca)?;
    let leaked = token("plugin", |c| c.jti = "leaked-0001".into());
    let other = token("plugin", |c| c.jti = "still-good-0002".into());
    assert_eq!(status(&client, &scene, &leaked).await?, 200);

    std::fs::write(
        &files.revoked,
        "# revoked token ids\nleaked-0001  # leaked in a CI log\n",
    )?;
    let refused = eventually("the revoked token refused", || async {
        let resp = client
            .get(format!("{}{}", scene.url(), v1::DESTINATIONS))
            .bearer_auth(&leaked)
            .send()
            .await?;
        if resp.status() != 401 {
            return Ok(None);
        }
        let body: serde_json::Value = resp.json().await?;
        Ok(Some(
            body["message"]
                .as_str()
                .unwrap_or_default()
                .contains("revoked"),
        ))
    })
    .await?;
    assert_eq!(
        status(&client, &scene, &other).await?,
        200,
        "only the listed jti is refused"
    );
    tally::refused(
        "tls: a jti added to the revocations file",
        Outcome {
            refused,
            ..Outcome::default()
        },
    );
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}
