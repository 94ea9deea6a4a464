//! A CA rotation against a real TLS server: the client trusts a bundle as a whole, follows its
//! rewritten CA file on the next call, and keeps its trust when the file is broken.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::client::{CallError, ClientConfig, ServerClient};

/// A certificate authority of the test.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).unwrap().pem();
        Self {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A server config with a certificate of this CA for 127.0.0.1.
    fn serving(&self) -> Arc<rustls::ServerConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()];
        let key = PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        Arc::new(config)
    }
}

/// A TLS server answering `{}` to every request, with the certificate `served` holds at each
/// handshake; its URL.
async fn server(served: Arc<Mutex<Arc<rustls::ServerConfig>>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let config = served.lock().unwrap().clone();
            tokio::spawn(async move {
                let Ok(mut tls) = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 4096];
                let _ = tls.read(&mut buf).await;
                let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                             content-length: 2\r\nconnection: close\r\n\r\n{}";
                let _ = tls.write_all(reply.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    url
}

fn scratch(case: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rd-api-trust-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A client of `url` trusting only `ca_file`, looking at it on every call.
fn client(url: &str, ca_file: &Path) -> ServerClient {
    ServerClient::new(&ClientConfig {
        server: url.to_string(),
        token_file: None,
        ca_file: Some(ca_file.to_path_buf()),
        ca_only: true,
        insecure_plaintext: false,
        timeout: Duration::from_secs(5),
    })
    .unwrap()
    .with_ca_check_every(Duration::ZERO)
}

async fn call(c: &ServerClient) -> Result<serde_json::Value, CallError> {
    c.get::<serde_json::Value>("/v1/destinations").await
}

#[tokio::test]
async fn a_ca_rotation_through_a_bundle_needs_no_new_client() {
    let dir = scratch("rotation");
    let (old, new) = (Ca::new("old ca"), Ca::new("new ca"));
    let served = Arc::new(Mutex::new(old.serving()));
    let url = server(served.clone()).await;
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &old.pem).unwrap();
    let c = client(&url, &ca_file);
    call(&c).await.unwrap();

    // Step 1: the bundle of both CAs; the server still serves the old CA's certificate.
    std::fs::write(&ca_file, format!("{}{}", old.pem, new.pem)).unwrap();
    call(&c).await.unwrap();
    // Step 2: the server moves to a certificate of the new CA: trusted through the bundle.
    *served.lock().unwrap() = new.serving();
    call(&c).await.unwrap();
    // Step 3: the new CA alone; a certificate of the old one is now refused.
    std::fs::write(&ca_file, &new.pem).unwrap();
    call(&c).await.unwrap();
    *served.lock().unwrap() = old.serving();
    let e = call(&c).await.unwrap_err();
    assert!(
        matches!(&e, CallError::Transient(m) if m.contains("certificate")),
        "{e:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_clone_follows_the_ca_file_too_and_a_broken_one_keeps_the_trust_in_force() {
    let dir = scratch("broken");
    let (old, new) = (Ca::new("old ca"), Ca::new("new ca"));
    let served = Arc::new(Mutex::new(new.serving()));
    let url = server(served.clone()).await;
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, &old.pem).unwrap();
    let c = client(&url, &ca_file);
    // The provider and the resume follower hold clones of one client: both follow the file.
    let clone = c.clone();
    assert!(
        call(&c).await.is_err(),
        "the old CA does not issue the served certificate"
    );
    std::fs::write(&ca_file, &new.pem).unwrap();
    call(&clone).await.unwrap();
    call(&c).await.unwrap();

    // A file that is not PEM, then a removed file: the new CA stays trusted.
    std::fs::write(&ca_file, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
    call(&c).await.unwrap();
    std::fs::remove_file(&ca_file).unwrap();
    call(&c).await.unwrap();
    // A failed call names the CA file that cannot be used.
    *served.lock().unwrap() = old.serving();
    let e = call(&c).await.unwrap_err();
    assert!(
        matches!(&e, CallError::Transient(m) if m.contains("changed but cannot be used")
            && m.contains("ca.crt")),
        "{e:?}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn the_token_file_is_read_again_for_every_call() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let recorded = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let mut buf = [0u8; 4096];
            let n = tcp.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]).to_lowercase();
            if let Some(line) = head.lines().find(|l| l.starts_with("authorization:")) {
                recorded.lock().unwrap().push(line.trim().to_string());
            }
            let reply = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                         content-length: 2\r\nconnection: close\r\n\r\n{}";
            let _ = tcp.write_all(reply.as_bytes()).await;
        }
    });
    let dir = scratch("token");
    let token_file = dir.join("token");
    std::fs::write(&token_file, "first-token\n").unwrap();
    let c = ServerClient::new(&ClientConfig {
        server: url,
        token_file: Some(token_file.clone()),
        ca_file: None,
        ca_only: false,
        insecure_plaintext: false,
        timeout: Duration::from_secs(5),
    })
    .unwrap();
    call(&c).await.unwrap();
    std::fs::write(&token_file, "second-token").unwrap();
    call(&c).await.unwrap();
    assert_eq!(
        *seen.lock().unwrap(),
        vec![
            "authorization: bearer first-token".to_string(),
            "authorization: bearer second-token".to_string()
        ]
    );
    std::fs::remove_dir_all(dir).ok();
}
