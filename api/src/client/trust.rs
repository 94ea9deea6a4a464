//! The client's trust in the server's certificate, following `--ca-file` (issue #32).
//!
//! The CA file is read again, on the next call, once its content differs from what the client
//! trusts (looked at most every [`CA_CHECK_EVERY`]), and the HTTP client is built again over it:
//! a CA rotation — a bundle of the old and the new CA first, every certificate of which is
//! trusted, the new CA alone once the server serves a certificate of it — needs no restart of
//! the plugin (a child of the Rollouts controller) or of the agent. The content is compared,
//! not the file's metadata: two CA files of the same length written within one clock tick
//! are still told apart. A file that does not load (half written, no certificate, removed
//! while its Secret volume swaps) keeps the client in force; a call that then fails says why.

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{ClientConfig, ClientError};

/// How often a client looks at its CA file: a rotated file is trusted from the first call this
/// long after it changed (plus the kubelet's sync of a mounted Secret, about a minute).
pub const CA_CHECK_EVERY: Duration = Duration::from_secs(3);

/// The HTTP client of a [`super::ServerClient`], built again when its CA file changes.
#[derive(Debug)]
pub(super) struct Trust {
    config: ClientConfig,
    plaintext: bool,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// when the CA file was last looked at
    looked: Instant,
    /// the CA file's content the client trusts
    pem: Vec<u8>,
    http: reqwest::Client,
    /// why the CA file's current content is not trusted (the previous one stays)
    problem: Option<String>,
}

impl Trust {
    /// The client of `config` (`plaintext`: an `http://` server), trusting `--ca-file` as it is
    /// now: an error here is the caller's (the process should not start).
    pub(super) fn new(config: &ClientConfig, plaintext: bool) -> Result<Self, ClientError> {
        let pem = match &config.ca_file {
            Some(path) => std::fs::read(path).map_err(|e| ClientError::CaFile {
                path: path.clone(),
                reason: e.to_string(),
            })?,
            None => Vec::new(),
        };
        let http = build(config, plaintext, &pem)?;
        Ok(Self {
            config: config.clone(),
            plaintext,
            state: Mutex::new(State {
                looked: Instant::now(),
                pem,
                http,
                problem: None,
            }),
        })
    }

    /// The client to send the next request with: built again first when the CA file's content
    /// changed since it was last looked at (at most once per `every`).
    pub(super) fn http(&self, every: Duration) -> reqwest::Client {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(path) = &self.config.ca_file {
            if state.looked.elapsed() >= every {
                state.looked = Instant::now();
                self.look(path, &mut state);
            }
        }
        state.http.clone()
    }

    fn look(&self, path: &Path, state: &mut State) {
        let pem = match std::fs::read(path) {
            Ok(pem) => pem,
            Err(e) => {
                state.problem = Some(e.to_string());
                return;
            }
        };
        if pem == state.pem {
            state.problem = None;
            return;
        }
        match build(&self.config, self.plaintext, &pem) {
            Ok(http) => {
                state.http = http;
                state.pem = pem;
                state.problem = None;
            }
            Err(e) => state.problem = Some(e.to_string()),
        }
    }

    /// Drops the pooled connections: the next call connects anew (same trust).
    pub(super) fn reconnect(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(http) = build(&self.config, self.plaintext, &state.pem) {
            state.http = http;
        }
    }

    /// What a failed call should add: the CA file changed but cannot be used.
    pub(super) fn problem(&self) -> Option<String> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let problem = state.problem.as_ref()?;
        let path = self.config.ca_file.as_deref()?;
        Some(format!(
            "the --ca-file {} changed but cannot be used ({problem}); the CA read before is still \
             the one trusted",
            path.display()
        ))
    }
}

/// The HTTP client of `config`, trusting the PEM certificates of `ca_pem` (every one of a
/// bundle) when it has a CA file.
fn build(
    config: &ClientConfig,
    plaintext: bool,
    ca_pem: &[u8],
) -> Result<reqwest::Client, ClientError> {
    // One process-wide crypto provider; a second install is a no-op error we can ignore.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut builder = reqwest::Client::builder()
        .timeout(config.timeout)
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!(
            "rollouts-dispatch-plugin/",
            env!("CARGO_PKG_VERSION")
        ))
        // No redirect may lead an https:// server's client to plain HTTP.
        .https_only(!plaintext);
    if let Some(path) = &config.ca_file {
        let bad = |reason: String| ClientError::CaFile {
            path: path.clone(),
            reason,
        };
        let certs =
            reqwest::Certificate::from_pem_bundle(ca_pem).map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no PEM certificate in it".into()));
        }
        builder = if config.ca_only {
            builder.tls_certs_only(certs)
        } else {
            builder.tls_certs_merge(certs)
        };
    }
    builder
        .build()
        .map_err(|e| ClientError::Build(e.to_string()))
}

#[cfg(test)]
mod tests;
