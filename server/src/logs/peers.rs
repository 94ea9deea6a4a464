//! The log relay across server replicas (`agents.store: kubernetes`, `serve --pod-ip`): a
//! request for a Job's log on an agent destination is published on the store's [`LogBoard`] with
//! this replica's address, so that the replica the agent long-polls hands it out; an upload that
//! lands on a replica which does not hold the reader is forwarded to the one that does.
//!
//! No new trust: the forward presents the agent's own bearer token, and the owner authenticates
//! and checks it exactly as a direct upload (that destination's agent token, a pending id of that
//! destination). The forwarding replica forwards only for a published id of the route's
//! destination, to the published owner, which must prove to be a replica: TLS verified against
//! the Service name the replicas' certificate is issued for (`--peer-name`, trusting only
//! `--peer-ca-file`, every CA of a bundle, read again when it changes so that a CA rotation needs
//! no restart), resolved to the owner's pod IP. A forwarded upload is never forwarded again.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::agent::{LogUploadReply, LOG_UPLOAD_TIMEOUT};
use dispatch_api::logs::{LogRequest, CONTENT_TYPE};
use tokio::sync::watch;
use tracing::Instrument;

use super::board::{LogBoard, PublishedLog};
use crate::http::{DispatchError, LogUpload, Reason, FORWARDED_BY};
use crate::runtime::reload::{self, Reloading};

/// How often a replica deletes published requests gone stale (`board::STALE_AFTER`).
const SWEEP_EVERY: Duration = Duration::from_secs(30);
/// How long connecting to the owner may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most of an owner's refusal quoted to the agent.
const MAX_REFUSAL: usize = 512;

/// How this replica reaches the others.
#[derive(Clone)]
pub enum PeerTransport {
    /// HTTPS to the owner's pod IP, its certificate verified for `name` against `ca` only.
    Tls {
        /// the DNS name of the replicas' certificate (the Service's)
        name: String,
        /// the CA certificates that issued it (a bundle during a CA rotation), following
        /// `--peer-ca-file`
        ca: Reloading<Vec<reqwest::Certificate>>,
    },
    /// Plain HTTP: only when this server serves plain HTTP itself (a loopback `--listen`, or TLS
    /// ended by a mesh sidecar that also carries pod-to-pod traffic).
    Plain,
}

/// Why the transport to the other replicas could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// `--peer-ca-file` could not be read.
    #[error("--peer-ca-file {path}: {source}")]
    CaRead {
        /// the file
        path: String,
        /// why
        #[source]
        source: std::io::Error,
    },
    /// `--peer-ca-file` is not PEM.
    #[error("--peer-ca-file {path}: no PEM certificate in it ({source})")]
    CaParse {
        /// the file
        path: String,
        /// why
        #[source]
        source: reqwest::Error,
    },
    /// `--peer-ca-file` is PEM without a certificate.
    #[error("--peer-ca-file {path}: no PEM certificate in it (empty)")]
    CaEmpty {
        /// the file
        path: String,
    },
}

impl PeerTransport {
    /// HTTPS verified for `name` against the CA certificates of the PEM file `ca_file`, read
    /// again when it changes (looked at most every [`reload::CHECK_EVERY`]; a file that does not
    /// load keeps the CAs in force, logged).
    pub fn tls(name: &str, ca_file: &Path) -> Result<Self, PeerError> {
        Self::tls_every(name, ca_file, reload::CHECK_EVERY)
    }

    fn tls_every(name: &str, ca_file: &Path, every: Duration) -> Result<Self, PeerError> {
        let ca = Reloading::new(
            "peer ca",
            vec![ca_file.to_path_buf()],
            every,
            |files: &[PathBuf]| read_ca(&files[0]),
        )?;
        Ok(Self::Tls {
            name: name.to_string(),
            ca,
        })
    }

    /// A client that reaches `owner`, and the URL of `path` there.
    fn client_for(
        &self,
        owner: SocketAddr,
        path: &str,
    ) -> Result<(reqwest::Client, String), reqwest::Error> {
        // One process-wide crypto provider; a second install is a no-op error.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(LOG_UPLOAD_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy();
        Ok(match self {
            PeerTransport::Tls { name, ca } => (
                builder
                    .https_only(true)
                    .tls_certs_only(ca.get().iter().cloned())
                    .resolve(name, owner)
                    .build()?,
                format!("https://{name}:{}{path}", owner.port()),
            ),
            PeerTransport::Plain => (builder.build()?, format!("http://{owner}{path}")),
        })
    }
}

/// The CA certificates of the PEM file `ca_file` (every one of a bundle).
fn read_ca(ca_file: &Path) -> Result<Vec<reqwest::Certificate>, PeerError> {
    let path = ca_file.display().to_string();
    let pem = std::fs::read(ca_file).map_err(|source| PeerError::CaRead {
        path: path.clone(),
        source,
    })?;
    let ca = reqwest::Certificate::from_pem_bundle(&pem).map_err(|source| PeerError::CaParse {
        path: path.clone(),
        source,
    })?;
    if ca.is_empty() {
        return Err(PeerError::CaEmpty { path });
    }
    Ok(ca)
}

/// The other replicas, as this one's log relay sees them.
pub struct LogPeers {
    board: Arc<LogBoard>,
    /// this replica's address as the others reach it (pod IP and API port)
    me: SocketAddr,
    transport: PeerTransport,
    /// published ids a poll of this replica has carried: an open poll answers at once only for
    /// the others (pruned to the ids still published)
    carried: Mutex<HashSet<String>>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Drop for LogPeers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl LogPeers {
    /// The relay across replicas over `board`, this replica being `me`; `wake` is bumped
    /// whenever a published request appears or goes (the relay's open polls look again).
    pub fn start(
        board: Arc<LogBoard>,
        me: SocketAddr,
        transport: PeerTransport,
        wake: watch::Sender<u64>,
    ) -> Self {
        let mut changes = board.subscribe();
        let bridge = tokio::spawn(
            async move {
                while changes.changed().await.is_ok() {
                    wake.send_modify(|n| *n = n.wrapping_add(1));
                }
            }
            .instrument(tracing::info_span!("log_requests_published")),
        );
        let sweeper = tokio::spawn({
            let board = board.clone();
            async move {
                loop {
                    tokio::time::sleep(SWEEP_EVERY).await;
                    let removed = board.sweep().await;
                    if removed > 0 {
                        tracing::info!(removed, "stale log requests deleted");
                    }
                }
            }
            .instrument(tracing::info_span!("log_request_sweep"))
        });
        Self {
            board,
            me,
            transport,
            carried: Mutex::new(HashSet::new()),
            tasks: vec![bridge.abort_handle(), sweeper.abort_handle()],
        }
    }

    fn carried(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.carried.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `request` of `destination`, held by this replica.
    pub async fn publish(&self, destination: &str, request: &LogRequest) {
        let log = PublishedLog {
            destination: destination.to_string(),
            request: request.clone(),
            owner: self.me,
            created: None,
        };
        if let Err(e) = self.board.publish(log).await {
            // The agent may still poll this replica; otherwise the reader gets the 30 s note.
            tracing::warn!(destination, id = %request.id, error = %e,
                           "log request not published to the other replicas");
        }
    }

    /// Deletes published request `id` in the background (served, or given up).
    pub fn withdraw(&self, id: &str) {
        if !self.board.contains(id) {
            return;
        }
        let board = self.board.clone();
        let id = id.to_string();
        tokio::spawn(
            async move {
                if let Err(e) = board.withdraw(&id).await {
                    tracing::warn!(error = %e, "log request not withdrawn; the sweep deletes it");
                }
            }
            .instrument(tracing::info_span!("log_request_withdraw")),
        );
    }

    /// Whether `destination` has a published request no poll of this replica has carried.
    pub fn has_new(&self, destination: &str) -> bool {
        let carried = self.carried();
        self.board
            .for_destination(destination)
            .iter()
            .any(|p| !carried.contains(&p.request.id))
    }

    /// The published requests of `destination` (marked carried).
    pub fn for_poll(&self, destination: &str) -> Vec<LogRequest> {
        let published = self.board.for_destination(destination);
        let mut carried = self.carried();
        carried.retain(|id| self.board.contains(id));
        published
            .into_iter()
            .map(|p| {
                carried.insert(p.request.id.clone());
                p.request
            })
            .collect()
    }

    /// The replica holding request `id` of `destination`, when it is published by another one.
    pub fn owner_of(&self, destination: &str, id: &str) -> Option<SocketAddr> {
        self.board
            .get(id)
            .filter(|p| p.destination == destination && p.owner != self.me)
            .map(|p| p.owner)
    }

    /// Forwards `upload` (of request `id` of `destination`) to `owner`, streamed with
    /// backpressure: the owner reads it as its reader does. Its answer is the agent's.
    pub async fn forward(
        &self,
        owner: SocketAddr,
        destination: &str,
        id: &str,
        upload: LogUpload,
    ) -> Result<LogUploadReply, DispatchError> {
        let token = upload.bearer.ok_or_else(|| {
            DispatchError::Forbidden("a log upload needs the agent's bearer token".into())
        })?;
        let path = dispatch_api::agent::logs_path(destination, id);
        let unavailable = |e: reqwest::Error| {
            DispatchError::Unavailable(Reason::caused_by(
                format!(
                    "log request {id} is held by the server replica at {owner}, which could not \
                     be reached: {e}"
                ),
                e,
            ))
        };
        let (client, url) = self
            .transport
            .client_for(owner, &path)
            .map_err(unavailable)?;
        tracing::info!(destination, id, %owner, "log upload forwarded to the replica holding the reader");
        let resp = client
            .post(url)
            .bearer_auth(&token.0)
            .header(reqwest::header::CONTENT_TYPE, CONTENT_TYPE)
            .header(FORWARDED_BY, self.me.to_string())
            .body(reqwest::Body::wrap_stream(upload.body))
            .send()
            .await
            .map_err(unavailable)?;
        let status = resp.status();
        if status.is_success() {
            return resp.json().await.map_err(unavailable);
        }
        let text: String = resp
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(MAX_REFUSAL)
            .collect();
        let why = format!("the server replica holding log request {id} answered {status}: {text}");
        tracing::warn!(destination, id, %owner, %status, "forwarded log upload refused");
        Err(match status.as_u16() {
            401 | 403 => DispatchError::Forbidden(why.into()),
            404 => DispatchError::NotFound(why.into()),
            _ => DispatchError::Unavailable(why.into()),
        })
    }
}

#[cfg(test)]
mod tests;
