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
                None => return,
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
