//! go-plugin's MuxBroker, plugin side: the host dials a stream per dispensed plugin and names it by
//! a little-endian `u32` id; we echo the id as the ack and serve the plugin's net/rpc service there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use tracing::{debug, warn};

use crate::rpc::{serve_stream, Service};
use crate::yamux::Stream;

/// How long a dispensed id waits for its stream, as go-plugin's `Accept`.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Ids handed out by `Dispense` and the service each one will serve.
#[derive(Default)]
pub(crate) struct Broker {
    next_id: AtomicU32,
    pending: Mutex<HashMap<u32, Arc<dyn Service>>>,
}

impl Broker {
    /// Allocates the next id (the first is 1) for `service`; it expires unused after 5 s.
    pub(crate) fn expect(self: &Arc<Self>, service: Arc<dyn Service>) -> u32 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.pending
            .lock()
            .expect("broker lock")
            .insert(id, service);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(ACCEPT_TIMEOUT).await;
            if this
                .pending
                .lock()
                .expect("broker lock")
                .remove(&id)
                .is_some()
            {
                warn!(id, "mux broker: the host never dialed the dispensed stream");
            }
        });
        id
    }

    /// Reads the id from a host-opened stream, acks it and serves the matching service.
    pub(crate) async fn serve(self: Arc<Self>, mut stream: Stream) {
        let mut buf = BytesMut::new();
        while buf.len() < 4 {
            match stream.read().await {
                Some(chunk) => buf.extend_from_slice(&chunk),
                None => {
                    // Closed before naming an id: close our side too, or the session would keep
                    // the stream (and count it against its stream limit) until the end.
                    stream.writer().close();
                    return;
                }
            }
        }
        let id_bytes = buf.split_to(4);
        let id = u32::from_le_bytes([id_bytes[0], id_bytes[1], id_bytes[2], id_bytes[3]]);
        let Some(service) = self.pending.lock().expect("broker lock").remove(&id) else {
            warn!(
                id,
                stream = stream.id(),
                "mux broker: stream for an unknown id, closing it"
            );
            stream.writer().close();
            return;
        };
        if stream.writer().write(&id_bytes).await.is_err() {
            return;
        }
        debug!(
            id,
            stream = stream.id(),
            "mux broker: serving plugin stream"
        );
        serve_stream(stream, Arc::from(vec![service]), buf).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::yamux::{Session, MAX_STREAMS};

    /// A yamux frame header: version 0, type, flags, stream id, length.
    fn frame(ty: u8, flags: u16, id: u32, length: u32) -> Vec<u8> {
        let mut f = vec![0, ty];
        f.extend_from_slice(&flags.to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&length.to_be_bytes());
        f
    }

    /// The next frame from the session: its flags and stream id.
    async fn next_frame(host: &mut tokio::io::DuplexStream) -> (u16, u32) {
        let mut h = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), host.read_exact(&mut h))
            .await
            .expect("a frame in time")
            .unwrap();
        (
            u16::from_be_bytes([h[2], h[3]]),
            u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        )
    }

    #[tokio::test]
    async fn streams_closed_before_their_id_do_not_pile_up() {
        const SYN: u16 = 1;
        const ACK: u16 = 2;
        const FIN: u16 = 4;
        let (server, mut host) = tokio::io::duplex(1 << 20);
        let broker = Arc::new(Broker::default());
        tokio::spawn({
            let broker = Arc::clone(&broker);
            async move {
                let mut session = Session::server(server);
                while let Some(stream) = session.accept().await {
                    tokio::spawn(Arc::clone(&broker).serve(stream));
                }
            }
        });
        // More streams than the session holds at once, each opened and closed with no id sent.
        for i in 0..(MAX_STREAMS as u32 + 10) {
            let id = 2 * i + 1;
            host.write_all(&frame(1, SYN, id, 0)).await.unwrap();
            host.write_all(&frame(1, FIN, id, 0)).await.unwrap();
            assert_eq!(
                next_frame(&mut host).await,
                (ACK, id),
                "stream {id} accepted"
            );
            assert_eq!(
                next_frame(&mut host).await,
                (FIN, id),
                "stream {id} closed by us"
            );
        }
    }
}
