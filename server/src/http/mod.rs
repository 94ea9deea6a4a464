//! The server's `/v1` JSON API and the admin endpoints.
//!
//! * [`router`] builds the API (`/v1/...`, all authenticated) over a [`Dispatcher`];
//! * [`admin::router`] builds `/live`, `/ready` and `/metrics` for the separate admin port;
//! * [`serve`] runs a router on a listener, with TLS when configured, until `shutdown` resolves,
//!   then lets requests in flight finish.
//!
//! Errors are stable JSON (`{"code": …, "message": …}`) and never carry internals: the cause of an
//! internal error is logged in the request span and the reply names only an id to look it up.

pub mod admin;
pub mod auth;
mod error;
pub mod metrics;
pub mod tokenreview;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{DefaultBodyLimit, FromRequest, Path, Request, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{middleware, Extension, Json, Router};
use dispatch_api::v1::{self as api, Ensured, GcRequest, MeasurementRef, Verdict};
use dispatch_api::v1::{DestinationInfo, GcReply};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

pub use auth::{Authenticator, Principal};
use dispatch_api::agent::{self as agent_api, ReportReply, ReportRequest, WorkReply, WorkRequest};
pub use error::{ApiFailure, DispatchError};
use metrics::Metrics;

/// A boxed future, so that [`Dispatcher`] can be used as a trait object.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the API needs from the engine (direct destinations) or the agent store.
pub trait Dispatcher: Send + Sync + 'static {
    /// Creates or adopts the Jobs of one measurement.
    fn ensure<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Ensured, DispatchError>>;
    /// The verdict of one measurement so far.
    fn status<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Verdict, DispatchError>>;
    /// Deletes the Jobs of one measurement (foreground) on every destination.
    fn terminate<'a>(
        &'a self,
        caller: &'a Principal,
        req: MeasurementRef,
    ) -> BoxFuture<'a, Result<Verdict, DispatchError>>;
    /// Deletes the oldest Jobs of a run beyond `limit`; returns how many were deleted.
    fn gc<'a>(
        &'a self,
        caller: &'a Principal,
        req: GcRequest,
    ) -> BoxFuture<'a, Result<u32, DispatchError>>;
    /// Every known destination.
    fn destinations(&self) -> Vec<DestinationInfo>;
    /// The work of an agent destination (long poll).
    fn agent_work<'a>(
        &'a self,
        caller: &'a Principal,
        destination: String,
        req: WorkRequest,
    ) -> BoxFuture<'a, Result<WorkReply, DispatchError>> {
        let _ = (caller, req);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(format!(
            "{destination} is not an agent destination of this server"
        )))))
    }
    /// An agent's observations of its destination's Jobs.
    fn agent_report<'a>(
        &'a self,
        caller: &'a Principal,
        destination: String,
        req: ReportRequest,
    ) -> BoxFuture<'a, Result<ReportReply, DispatchError>> {
        let _ = (caller, req);
        Box::pin(std::future::ready(Err(DispatchError::NotFound(format!(
            "{destination} is not an agent destination of this server"
        )))))
    }
}

/// Shared state of the API handlers.
#[derive(Clone)]
pub struct AppState {
    /// the engine
    pub dispatcher: Arc<dyn Dispatcher>,
    /// who may call
    pub auth: Arc<dyn Authenticator>,
    /// request and verdict metrics
    pub metrics: Arc<Metrics>,
}

/// The largest request body accepted: a plugin block plus run metadata is a few KiB.
pub const MAX_BODY: usize = 1 << 20;

/// The OpenAPI document of `/v1`, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// Builds the `/v1` API. Every route requires a bearer token accepted by `state.auth`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(api::ENSURE, post(ensure))
        .route(api::STATUS, post(status))
        .route(api::TERMINATE, post(terminate))
        .route(api::GC, post(gc))
        .route("/v1/destinations", get(destinations))
        .route(agent_api::WORK, post(agent_work))
        .route(agent_api::REPORT, post(agent_report))
        .route("/v1/openapi.json", get(openapi))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_bearer,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            metrics::track,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn ensure(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Ensured>, ApiFailure> {
    Ok(Json(s.dispatcher.ensure(&caller, req).await?))
}

async fn status(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    let v = s.dispatcher.status(&caller, req).await?;
    s.metrics.observe_verdict(&v.phase);
    Ok(Json(v))
}

async fn terminate(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<MeasurementRef>,
) -> Result<Json<Verdict>, ApiFailure> {
    Ok(Json(s.dispatcher.terminate(&caller, req).await?))
}

async fn gc(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    ApiJson(req): ApiJson<GcRequest>,
) -> Result<Json<GcReply>, ApiFailure> {
    Ok(Json(GcReply {
        deleted: s.dispatcher.gc(&caller, req).await?,
    }))
}

async fn agent_work(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<WorkRequest>,
) -> Result<Json<WorkReply>, ApiFailure> {
    Ok(Json(
        s.dispatcher.agent_work(&caller, destination, req).await?,
    ))
}

async fn agent_report(
    State(s): State<AppState>,
    Extension(caller): Extension<Principal>,
    Path(destination): Path<String>,
    ApiJson(req): ApiJson<ReportRequest>,
) -> Result<Json<ReportReply>, ApiFailure> {
    Ok(Json(
        s.dispatcher.agent_report(&caller, destination, req).await?,
    ))
}

/// A JSON body whose rejections (malformed, too large, wrong content type) are JSON errors too.
pub struct ApiJson<T>(pub T);

impl<T: serde::de::DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiFailure;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match Json::<T>::from_request(req, state).await {
            Ok(Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(ApiFailure::new(
                rejection.status(),
                "invalid_request",
                rejection.body_text(),
            )),
        }
    }
}

async fn destinations(State(s): State<AppState>) -> Json<Vec<DestinationInfo>> {
    Json(s.dispatcher.destinations())
}

async fn openapi() -> ([(axum::http::HeaderName, &'static str); 1], &'static str) {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI,
    )
}

async fn not_found() -> ApiFailure {
    ApiFailure::new(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such endpoint; see /v1/openapi.json",
    )
}

/// TLS for a listener: a rustls server config (see [`tls_config`]).
pub type Tls = Arc<rustls::ServerConfig>;

/// Loads a PEM certificate chain and key into a rustls server config (HTTP/1.1 and h2).
pub fn tls_config(cert_file: &std::path::Path, key_file: &std::path::Path) -> Result<Tls, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert_file)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("tls certificate {}: {e}", cert_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "tls certificate {}: no PEM certificate in it",
            cert_file.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| format!("tls key {}: {e}", key_file.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("tls certificate and key do not match or are unsupported: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
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
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::server::graceful::GracefulShutdown;
    use tower::Service;

    let addr = listener.local_addr()?;
    info!(%addr, tls = tls.is_some(), "listening");
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
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
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| app.clone().call(req));
            let mut builder = auto::Builder::new(TokioExecutor::new());
            // A client that trickles its headers (slowloris) is cut off instead of holding a task.
            builder
                .http1()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT);
            let result = match acceptor {
                None => {
                    let conn = builder.serve_connection_with_upgrades(TokioIo::new(tcp), service);
                    watcher.watch(conn.into_owned()).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await
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
        });
    }
    info!(%addr, "draining connections");
    let started = Instant::now();
    tokio::select! {
        () = graceful.shutdown() => info!(%addr, elapsed_ms = started.elapsed().as_millis() as u64, "drained"),
        () = tokio::time::sleep(DRAIN_TIMEOUT) => warn!(%addr, "drain timed out; closing remaining connections"),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
