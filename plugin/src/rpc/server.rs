//! The per-stream net/rpc server loop.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::mpsc;
use tracing::{debug, warn, Instrument};

use super::{ready, Body, Reply, Request, Response, Service};
use crate::gob::{self, Decoder, Empty, Encoder};
use crate::yamux::{Stream, StreamWriter};

/// Serves net/rpc `services` on `stream` until the peer closes it.
///
/// `buf` holds bytes already read from the stream (e.g. after the MuxBroker id). Returns once the
/// stream has ended and every call in flight has been answered.
pub async fn serve_stream(
    mut stream: Stream,
    services: Arc<[Arc<dyn Service>]>,
    mut buf: BytesMut,
) {
    let (tx, rx) = mpsc::unbounded_channel::<(Response, Reply)>();
    let writer = tokio::spawn(write_replies(stream.writer(), rx));
    let mut dec = Decoder::new();
    let mut pending: Option<Request> = None;
    'read: loop {
        loop {
            if pending.is_none() {
                match dec.decode::<Request>(&mut buf) {
                    Ok(req) => pending = Some(req),
                    Err(gob::Error::Incomplete) => break,
                    Err(e) => {
                        // Go's server gives up on a connection whose header it cannot read.
                        warn!(stream = stream.id(), error = %e, "net/rpc: unreadable request header, closing the stream");
                        break 'read;
                    }
                }
            }
            let req = pending.as_ref().expect("a request header is pending");
            let body = Body {
                dec: &mut dec,
                buf: &mut buf,
            };
            let call = match req.service_method.rsplit_once('.') {
                None => body.skip().map(|()| {
                    ready(Reply::error(format!(
                        "rpc: service/method request ill-formed: {}",
                        req.service_method
                    )))
                }),
                Some((service, method)) => match services.iter().find(|s| s.name() == service) {
                    Some(s) => s.call(method, body),
                    None => body.skip().map(|()| {
                        ready(Reply::error(format!(
                            "rpc: can't find service {}",
                            req.service_method
                        )))
                    }),
                },
            };
            let call = match call {
                Err(gob::Error::Incomplete) => break,
                Err(e) => ready(Reply::error(format!(
                    "rpc: cannot decode the arguments of {}: {e}",
                    req.service_method
                ))),
                Ok(call) => call,
            };
            let Request {
                service_method,
                seq,
            } = pending.take().expect("a request header is pending");
            let tx = tx.clone();
            let span = tracing::debug_span!("rpc", method = %service_method, seq);
            tokio::spawn(
                async move {
                    let reply = call.await;
                    let _ = tx.send((
                        Response {
                            service_method,
                            seq,
                            error: String::new(),
                        },
                        reply,
                    ));
                }
                .instrument(span),
            );
        }
        match stream.read().await {
            Some(chunk) => buf.extend_from_slice(&chunk),
            None => break,
        }
    }
    drop(tx);
    let _ = writer.await;
}

async fn write_replies(writer: StreamWriter, mut rx: mpsc::UnboundedReceiver<(Response, Reply)>) {
    let mut enc = Encoder::new();
    let mut out = Vec::with_capacity(4096);
    while let Some((mut resp, reply)) = rx.recv().await {
        out.clear();
        match reply.result {
            Ok(body) => {
                enc.encode(&resp, &mut out);
                body.encode_body(&mut enc, &mut out);
            }
            Err(message) => {
                debug!(method = %resp.service_method, seq = resp.seq, error = %message, "net/rpc error reply");
                resp.error = if message.is_empty() {
                    "unknown error".into()
                } else {
                    message
                };
                enc.encode(&resp, &mut out);
                enc.encode(&Empty, &mut out);
            }
        }
        if let Err(e) = writer.write(&out).await {
            debug!(error = %e, "net/rpc: cannot write reply, stream gone");
            return;
        }
        if let Some(done) = reply.written {
            let _ = done.send(());
        }
    }
    writer.close();
}
