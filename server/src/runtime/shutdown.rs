//! Process shutdown: the first SIGTERM or SIGINT starts a graceful stop (listeners drain, tasks
//! finish their step); a second one aborts at once, for the person who does not want to wait.

use std::future::Future;
use std::pin::Pin;

use futures::future::Shared;
use tracing::{info, warn, Instrument};

/// Exit code of an abort by a second signal (128 + SIGINT, as shells report it).
pub const ABORT_EXIT_CODE: i32 = 130;

/// Resolves on the first SIGTERM or SIGINT; clones resolve together.
pub fn shutdown_signal() -> Shared<Pin<Box<dyn Future<Output = ()> + Send>>> {
    use futures::FutureExt;
    let fut: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async {
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
        // A second signal while draining: stop now.
        tokio::spawn(
            async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                warn!("second signal: aborting without waiting for the drain");
                std::process::exit(ABORT_EXIT_CODE);
            }
            .instrument(tracing::info_span!("second_signal")),
        );
    });
    fut.shared()
}
