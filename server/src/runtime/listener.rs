//! The API listener: TLS when configured (the certificate follows its files without a restart),
//! a header-read timeout against slow clients, and a bounded drain of requests in flight when
//! shutdown begins.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tracing::{debug, info, warn, Instrument};

use super::reload::{self, Reloading};

/// Why the TLS certificate and key cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file cannot be read or holds no PEM certificate.
    #[error("tls certificate {}: {reason}", path.display())]
    Certificate {
        /// the file
        path: PathBuf,
        /// what is wrong with it
        reason: String,
    },
    /// The key file cannot be read.
    #[error("tls key {}: {source}", path.display())]
    Key {
        /// the file
        path: PathBuf,
        /// the PEM error
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// rustls refuses the pair.
    #[error("tls certificate and key do not match or are unsupported: {0}")]
    Rejected(#[from] rustls::Error),
}

/// TLS for a listener: a rustls server config (see [`tls_config`]).
pub type Tls = Arc<rustls::ServerConfig>;

/// Serves the PEM certificate chain and key of `cert_file` and `key_file` (HTTP/1.1 and h2),
/// re-read when they change on disk (looked at most every [`reload::CHECK_EVERY`]): a rotated
/// certificate is served to new connections without a restart, and one that does not load
/// (half-written, key and certificate not matching) is logged and the previous one kept.
pub fn tls_config(cert_file: &Path, key_file: &Path) -> Result<Tls, TlsError> {
    reloading_tls_config(cert_file, key_file, reload::CHECK_EVERY)
}

/// [`tls_config`] with the files looked at most once per `every`.
pub fn reloading_tls_config(
    cert_file: &Path,
    key_file: &Path,
    every: Duration,
) -> Result<Tls, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let keys = Reloading::new(
        "tls certificate",
        vec![cert_file.to_path_buf(), key_file.to_path_buf()],
        every,
        {
            let provider = provider.clone();
            move |files: &[PathBuf]| certified_key(&files[0], &files[1], &provider)
        },
    )?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(ReloadingCert(keys)));
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The certificate of every handshake: the current one of the files.
#[derive(Debug)]
struct ReloadingCert(Reloading<Arc<CertifiedKey>>);

impl rustls::server::ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.get()))
    }
}

/// Loads a PEM certificate chain and its key; fails unless the key is the certificate's.
fn certified_key(
    cert_file: &Path,
    key_file: &Path,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certificate {
            path: cert_file.to_path_buf(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certificate {
            path: cert_file.to_path_buf(),
            reason: "no PEM certificate in it".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|source| TlsError::Key {
        path: key_file.to_path_buf(),
        source,
    })?;
    Ok(Arc::new(CertifiedKey::from_der(certs, key, provider)?))
}

/// How long a client may take to send its request headers.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long requests in flight may take to finish after shutdown begins.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);

/// Serves `app` on `listener` until `shutdown` resolves, then drains requests in flight (at most
/// [`DRAIN_TIMEOUT`]). With `tls`, every connection is TLS; slow handshakes time out after 10 s.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_limited(listener, app, tls, shutdown, None).await
}

/// [`serve`] with at most `max_connections` connections open at once (`None`: no limit): at
/// the limit, no more connections are accepted (they wait in the kernel's backlog) until one
/// closes, as Go's `netutil.LimitListener` does, so a flood of idle connections costs a bounded
/// number of tasks and file descriptors.
pub async fn serve_limited(
    listener: TcpListener,
    app: Router,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    max_connections: Option<usize>,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use tower::Service;

    let addr = listener.local_addr()?;
    info!(%addr, tls = tls.is_some(), "listening");
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(
        max_connections.map_or(tokio::sync::Semaphore::MAX_PERMITS, |m| m.max(1)),
    ));
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let acceptor = acceptor.clone();
        let watcher = graceful.watcher();
        let span = tracing::debug_span!("connection", %addr, %peer);
        tokio::spawn(
            async move {
                // Held until the connection ends.
                let _slot = slot;
                // The peer reaches the handlers as axum's `ConnectInfo` (a trusted proxy is
                // recognised by its address: `http::people`).
                let service = hyper::service::service_fn(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut()
                            .insert(axum::extract::ConnectInfo(peer));
                        app.clone().call(req)
                    },
                );
                let mut builder = auto::Builder::new(TokioExecutor::new());
                // A client that trickles its headers (slowloris) is cut off instead of holding a task.
                builder
                    .http1()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                let result = match acceptor {
                    None => {
                        let conn =
                            builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                        watcher.watch(conn.into_owned()).await
                    }
                    Some(acceptor) => {
                        match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp))
                            .await
                        {
                            Ok(Ok(stream)) => {
                                let conn = builder
                                    .serve_connection_with_upgrades(TokioIo::new(stream), service);
                                watcher.watch(conn.into_owned()).await
                            }
                            Ok(Err(e)) => {
                                debug!(%peer, error = %e, "tls handshake failed");
                                return;
                            }
                            Err(_) => {
                                debug!(%peer, "tls handshake timed out");
                                return;
                            }
                        }
                    }
                };
                if let Err(e) = result {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
            }
            .instrument(span),
        );
    }
    info!(%addr, "draining connections");
    let started = Instant::now();
    tokio::select! {
        () = graceful.shutdown() => info!(%addr, elapsed_ms = started.elapsed().as_millis() as u64, "drained"),
        () = tokio::time::sleep(DRAIN_TIMEOUT) => warn!(%addr, "drain timed out; closing remaining connections"),
    }
    Ok(())
}
