//! Serving a go-plugin netrpc host: listen, announce, accept one connection, run until told to quit.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::sync::oneshot;
use tracing::{debug, info};

use crate::broker::Broker;
use crate::control::{Control, Dispenser};
use crate::handshake::{self, HandshakeConfig};
use crate::rpc::{serve_stream, Service};
use crate::yamux::{Session, Stream};
use crate::Error;

/// How long to wait for the host to connect after the handshake line (go-plugin's own start
/// timeout is 1 min); a plugin whose host died must not linger.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

/// What to serve.
pub struct ServeConfig {
    /// The handshake the host expects.
    pub handshake: HandshakeConfig,
    /// Dispensable plugins by name (Argo Rollouts: `RpcMetricProviderPlugin`), each a net/rpc
    /// service named `Plugin`.
    pub plugins: Vec<(String, Arc<dyn Service>)>,
}

/// Runs the plugin until the host calls `Control.Quit` or closes the connection.
///
/// Checks the magic cookie first ([`Error::NotAPlugin`]); prints the handshake line as the first
/// bytes on stdout and writes nothing to stdout after it.
pub async fn serve(config: ServeConfig) -> Result<(), Error> {
    handshake::check_cookie(&config.handshake)?;
    // go-plugin plugins ignore SIGINT: a Ctrl-C meant for the host must not kill them first.
    let _sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(Error::Signal)?;
    let dir = handshake::socket_dir();
    let (listener, path) = handshake::listen(&dir)?;
    handshake::announce(&config.handshake, &path)?;
    let accepted = tokio::time::timeout(CONNECT_TIMEOUT, listener.accept()).await;
    // One connection only: the socket file is not needed any more, and must not outlive a SIGKILL.
    let _ = std::fs::remove_file(&path);
    let (conn, _) = accepted
        .map_err(|_| Error::AcceptTimeout(CONNECT_TIMEOUT))?
        .map_err(Error::Accept)?;
    drop(listener);
    info!(socket = %path.display(), "host connected");

    let mut session = Session::server(conn);
    let (quit_tx, mut quit_rx) = oneshot::channel();
    let broker = Arc::new(Broker::default());
    let control: Arc<[Arc<dyn Service>]> = Arc::from(vec![
        Arc::new(Control::new(quit_tx)) as Arc<dyn Service>,
        Arc::new(Dispenser::new(config.plugins, Arc::clone(&broker))),
    ]);
    let closed = session.closed();
    tokio::pin!(closed);
    // go-plugin opens control, stdout and stderr in that order, then one stream per dispense.
    let mut accepted_streams = 0usize;
    let mut output_streams: Vec<Stream> = Vec::new();
    loop {
        tokio::select! {
            stream = session.accept() => {
                let Some(stream) = stream else { break };
                accepted_streams += 1;
                match accepted_streams {
                    1 => { tokio::spawn(serve_stream(stream, Arc::clone(&control), BytesMut::new())); }
                    // stdout/stderr: ACKed on arrival; the host only reads them and we never write.
                    2 | 3 => output_streams.push(stream),
                    _ => { tokio::spawn(Arc::clone(&broker).serve(stream)); }
                }
            }
            Ok(()) = &mut quit_rx => {
                debug!("Control.Quit answered, exiting");
                session.flush().await;
                break;
            }
            () = &mut closed => {
                match session.close_reason() {
                    None => info!("host closed the connection, exiting"),
                    Some(reason) => info!(%reason, "the yamux session ended, exiting"),
                }
                break;
            }
        }
    }
    Ok(())
}
