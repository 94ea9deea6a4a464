//! The HTTP client the plugin uses to reach the rollouts-dispatch server.
//!
//! Pure-Rust TLS (rustls with ring) and DNS (hickory): the plugin is a static binary in a
//! distroless image, where glibc's NSS resolver does not work. The bearer token is read from its
//! file on every request, because projected ServiceAccount tokens are rotated in place.

use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::v1::ApiError;

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// base URL, e.g. `https://rollouts-dispatch.rollouts-dispatch.svc:8443`
    pub server: String,
    /// file holding the bearer token (re-read on every request)
    pub token_file: Option<PathBuf>,
    /// extra CA certificate (PEM) to trust, e.g. the server's private CA
    pub ca_file: Option<PathBuf>,
    /// per-request timeout
    pub timeout: Duration,
}

/// Why a call did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Worth retrying: the server could not be reached, timed out, or answered 5xx/429/401.
    #[error("{0}")]
    Transient(String),
    /// The server refused the request for a reason that retrying will not fix.
    #[error("{}", .0.message)]
    Rejected(ApiError),
}

/// The plugin's configuration could not be turned into a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--server` is not an http(s) URL.
    #[error("--server {0:?} is not an http:// or https:// URL")]
    BadUrl(String),
    /// `--ca-file` could not be read or parsed.
    #[error("--ca-file {path}: {reason}")]
    CaFile {
        /// the file
        path: PathBuf,
        /// what went wrong
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Build(String),
}

/// A client of the server's `/v1` API.
#[derive(Debug, Clone)]
pub struct ServerClient {
    http: reqwest::Client,
    base: String,
    token_file: Option<PathBuf>,
}

impl ServerClient {
    /// Builds a client; fails on a malformed URL or CA file.
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let base = config.server.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(ClientError::BadUrl(config.server.clone()));
        }
        // One process-wide crypto provider; a second install is a no-op error we can ignore.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(Duration::from_secs(5))
            .user_agent(concat!(
                "rollouts-dispatch-plugin/",
                env!("CARGO_PKG_VERSION")
            ));
        if let Some(path) = &config.ca_file {
            let pem = std::fs::read(path).map_err(|e| ClientError::CaFile {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let certs =
                reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| ClientError::CaFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            if certs.is_empty() {
                return Err(ClientError::CaFile {
                    path: path.clone(),
                    reason: "no PEM certificate in it".into(),
                });
            }
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| ClientError::Build(e.to_string()))?;
        Ok(Self {
            http,
            base,
            token_file: config.token_file.clone(),
        })
    }

    /// The server's base URL.
    pub fn server(&self) -> &str {
        &self.base
    }

    /// `POST {base}{path}` with a JSON body; decodes a JSON reply or an [`ApiError`].
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, CallError> {
        self.send(
            path,
            self.http.post(format!("{}{path}", self.base)).json(body),
        )
        .await
    }

    /// `GET {base}{path}`; decodes a JSON reply or an [`ApiError`].
    pub async fn get<Resp: DeserializeOwned>(&self, path: &str) -> Result<Resp, CallError> {
        self.send(path, self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn send<Resp: DeserializeOwned>(
        &self,
        path: &str,
        mut req: reqwest::RequestBuilder,
    ) -> Result<Resp, CallError> {
        if let Some(file) = &self.token_file {
            let token = std::fs::read_to_string(file).map_err(|e| {
                CallError::Transient(format!(
                    "cannot read the token file {}: {e}",
                    file.display()
                ))
            })?;
            req = req.bearer_auth(token.trim());
        }
        let resp = req
            .send()
            .await
            .map_err(|e| CallError::Transient(describe(&e, &self.base)))?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            CallError::Transient(format!("reading the reply of {}{path}: {e}", self.base))
        })?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Transient(format!("the server's reply to {path} is not what this plugin expects ({e}); check that plugin and server versions match"))
            });
        }
        let api_error: ApiError = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
            code: format!("http_{}", status.as_u16()),
            message: format!("the server answered {status} to {path}"),
        });
        if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 401 {
            Err(CallError::Transient(format!(
                "{} ({status})",
                api_error.message
            )))
        } else {
            Err(CallError::Rejected(api_error))
        }
    }
}

fn describe(e: &reqwest::Error, base: &str) -> String {
    if e.is_timeout() {
        format!("the server {base} did not answer in time")
    } else if e.is_connect() {
        format!("cannot connect to the server {base}: {}", root_cause(e))
    } else {
        format!("request to the server {base} failed: {}", root_cause(e))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}
