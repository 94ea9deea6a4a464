//! The TLS of the rollouts-dispatch API in the end-to-end scenes: a CA of its own and a serving
//! certificate for 127.0.0.1/localhost (generated with `rcgen`, as the cluster PKI is), the
//! `serve` flags that use them, and the check that the API port answers nothing in clear.
//!
//! The e2e scenes run the API over TLS only, as the chart does by default (issue #14): `serve`
//! gets `--tls-cert/--tls-key`, the plugin and the agents `--ca-file` with this CA, and no
//! `--insecure-plaintext` anywhere.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::pki;

/// The names and addresses of the API's certificate: the scenes reach it on loopback, and
/// `make faults` through its network-namespace links too.
const API_SANS: [&str; 7] = [
    "127.0.0.1",
    "::1",
    "localhost",
    crate::netfault::LINK_ADDRESSES[0],
    crate::netfault::LINK_ADDRESSES[1],
    crate::netfault::LINK_ADDRESSES[2],
    crate::netfault::LINK_ADDRESSES[3],
];

/// A new CA and a serving certificate it signed, for a rotation (`make faults`): the scene
/// writes them over [`ApiTls`]'s files in the order a rotation takes.
#[derive(Debug, Clone)]
pub struct NextTls {
    /// The new CA, PEM.
    pub ca_pem: String,
    /// The serving certificate it signed, PEM.
    pub cert_pem: String,
    /// Its key, PEM.
    pub key_pem: String,
}

impl NextTls {
    /// Generates them; `generation` names the CA.
    pub fn generate(generation: u32) -> Result<Self> {
        let (ca_pem, issuer) = pki::ca(&format!("rollouts-dispatch test api ca {generation}"))?;
        let (cert_pem, key_pem) = pki::serving(&issuer, &API_SANS, "rollouts-dispatch")?;
        Ok(Self {
            ca_pem,
            cert_pem,
            key_pem,
        })
    }
}

/// The PEM files of the API's TLS, written by [`ApiTls::write`].
#[derive(Debug, Clone)]
pub struct ApiTls {
    /// The CA that signed the certificate: `--ca-file` of the plugin, agents and CLI.
    pub ca: PathBuf,
    /// The same CA in PEM, for a client built in the test (kept, not read back from [`Self::ca`]).
    pub ca_pem: String,
    /// The serving certificate: `--tls-cert`.
    pub cert: PathBuf,
    /// Its key: `--tls-key`.
    pub key: PathBuf,
}

impl ApiTls {
    /// Generates a CA and a serving certificate for loopback into `dir`.
    pub fn write(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (ca_pem, issuer) = pki::ca("rollouts-dispatch test api ca")?;
        let (cert, key) = pki::serving(&issuer, &API_SANS, "rollouts-dispatch")?;
        let tls = Self {
            ca: dir.join("api-ca.crt"),
            ca_pem: ca_pem.clone(),
            cert: dir.join("api.crt"),
            key: dir.join("api.key"),
        };
        pki::write_file(&tls.ca, &ca_pem)?;
        pki::write_file(&tls.cert, &cert)?;
        pki::write_file(&tls.key, &key)?;
        Ok(tls)
    }

    /// `--tls-cert=… --tls-key=…` of `rollouts-dispatch serve`.
    pub fn serve_flags(&self) -> [String; 2] {
        [
            format!("--tls-cert={}", self.cert.display()),
            format!("--tls-key={}", self.key.display()),
        ]
    }
}

/// Fails unless a plain-HTTP request (with `token`, as a downgraded client would send it) to
/// the API on 127.0.0.1:`port` goes unanswered: the TLS listener must not speak HTTP in clear.
pub async fn plain_http_is_refused(port: u16, token: &str) -> Result<()> {
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .with_context(|| format!("connecting to the API port {port}"))?;
    tcp.write_all(
        format!(
            "GET /v1/destinations HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), tcp.read_to_end(&mut answer))
        .await
        .context("the API port kept a plain-HTTP connection open for 20s")?
        .ok();
    ensure!(
        !answer.starts_with(b"HTTP/"),
        "the API port answered plain HTTP: {:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(200)])
    );
    Ok(())
}
