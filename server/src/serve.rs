//! `rollouts-dispatch serve`: the engine, the authenticated `/v1` API and the admin port, with
//! graceful shutdown on SIGTERM/SIGINT.

use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::cli::ServeArgs;
use crate::config::ServerConfig;
use crate::dispatch::EngineDispatcher;
use crate::engine::Engine;
use crate::http::admin::{self, Readiness};
use crate::http::auth::{Chain, JwtAuthenticator};
use crate::http::metrics::Metrics;
use crate::http::tokenreview::TokenReviewAuthenticator;
use crate::http::{self, AppState, Authenticator};

/// Runs the server until SIGTERM or SIGINT.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        listen,
        admin_listen,
        tls_cert,
        tls_key,
        jwt_key_files,
        revoked_tokens,
        token_review_allow,
        sync_timeout,
        sweep_orphans_every,
    } = args;
    let config = match &config {
        Some(path) => ServerConfig::load(path)?,
        None => ServerConfig::embedded_default(),
    };
    let auth = authenticators(&jwt_key_files, revoked_tokens, token_review_allow).await?;
    let tls = match (&tls_cert, &tls_key) {
        (Some(c), Some(k)) => Some(http::tls_config(c, k).map_err(anyhow::Error::msg)?),
        _ => {
            warn!("no --tls-cert/--tls-key: the API is plain HTTP; use TLS whenever it leaves the pod");
            None
        }
    };
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new("destinations are not synced yet");
    let admin_listener = TcpListener::bind(admin_listen)
        .await
        .with_context(|| format!("binding the admin port {admin_listen}"))?;
    let api_listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the API port {listen}"))?;

    let engine = Engine::start(config).await?;
    let shutdown = shutdown_signal();
    let admin = tokio::spawn(http::serve(
        admin_listener,
        admin::router(readiness.clone(), metrics.clone()),
        None,
        shutdown.clone(),
    ));
    let dispatcher = Arc::new(EngineDispatcher::new(engine.clone(), metrics.clone()));
    let counts = tokio::spawn({
        let dispatcher = dispatcher.clone();
        async move {
            loop {
                dispatcher.publish_job_counts();
                dispatcher.publish_agents();
                tokio::time::sleep(std::time::Duration::from_secs(15)).await;
            }
        }
    });
    let sweeper = sweep_orphans_every.filter(|d| !d.is_zero()).map(|every| {
        let engine = engine.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Err(e) = engine.sweep_orphans().await {
                    warn!(error = %e, "orphan sweep failed; retrying at the next interval");
                }
            }
        })
    });
    // Open long polls of agents answer at once on shutdown, so that the drain does not wait.
    tokio::spawn({
        let dispatcher = dispatcher.clone();
        let shutdown = shutdown.clone();
        async move {
            shutdown.await;
            dispatcher.stop_polls();
        }
    });
    let state = AppState {
        dispatcher,
        auth,
        metrics,
    };
    let api = tokio::spawn(http::serve(
        api_listener,
        http::router(state),
        tls,
        shutdown.clone(),
    ));

    if let Some(store) = engine.store() {
        if !store.wait_synced(sync_timeout).await {
            warn!("the DispatchJob store is not synced yet (is the CRD installed and may the server list dispatchjobs?); serving anyway");
        }
    }
    let unsynced = engine.wait_synced(sync_timeout).await;
    if unsynced.is_empty() {
        info!("all destinations synced");
    } else {
        warn!(destinations = %unsynced.join(","), "not synced yet; serving anyway, their calls will be retried");
    }
    readiness.set_ready();
    shutdown.await;
    readiness.set_unready("shutting down");
    counts.abort();
    if let Some(s) = sweeper {
        s.abort();
    }
    let (a, b) = tokio::join!(api, admin);
    a??;
    b??;
    info!("stopped");
    Ok(())
}

async fn authenticators(
    jwt_key_files: &[std::path::PathBuf],
    revoked: Vec<String>,
    token_review_allow: Vec<String>,
) -> anyhow::Result<Arc<dyn Authenticator>> {
    let mut chain: Vec<Arc<dyn Authenticator>> = Vec::new();
    if !token_review_allow.is_empty() {
        let client = kube::Client::try_default()
            .await
            .context("--token-review-allow needs a Kubernetes client for TokenReviews (in-cluster or $KUBECONFIG)")?;
        chain.push(Arc::new(TokenReviewAuthenticator::new(
            client,
            Vec::new(),
            token_review_allow,
        )));
    }
    if !jwt_key_files.is_empty() {
        let keys = jwt_key_files
            .iter()
            .map(|p| crate::token::read_key(p))
            .collect::<Result<Vec<_>, _>>()?;
        chain.push(Arc::new(JwtAuthenticator::new(&keys, revoked)));
    }
    if chain.is_empty() {
        bail!("refusing to start without authentication: set --jwt-key-file and/or --token-review-allow");
    }
    Ok(Arc::new(Chain(chain)))
}

/// Resolves on the first SIGTERM or SIGINT; clones resolve together.
pub(crate) fn shutdown_signal(
) -> futures::future::Shared<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> {
    use futures::FutureExt;
    let fut: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = Box::pin(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            warn!("cannot install signal handlers; stop the server with SIGKILL");
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = term.recv() => info!("SIGTERM: shutting down"),
            _ = int.recv() => info!("SIGINT: shutting down"),
        }
    });
    fut.shared()
}
