//! Go `net/rpc` served over one yamux stream: concurrent calls, replies matched by `Seq`.
//!
//! Requests are decoded in stream order (type definitions are stream state), then each call runs
//! as its own task, exactly as Go's server runs a goroutine per call. One writer task encodes the
//! replies in the order they finish. An unknown service or method gets an error reply and the
//! connection lives on; a header that cannot be decoded ends the connection, as in Go.

mod codec;
mod server;

use std::future::Future;
use std::pin::Pin;

use bytes::BytesMut;
use tokio::sync::oneshot;

pub use codec::{Request, Response};
pub use server::serve_stream;

use crate::gob::{self, Decoder, Encoder, GobDecode, GobEncode};

/// A reply body that can be encoded on a stream, whatever its type.
pub trait EncodeBody: Send + 'static {
    /// Appends the body as one gob value (with any new type definitions).
    fn encode_body(&self, enc: &mut Encoder, out: &mut Vec<u8>);
}

impl<T: GobEncode + Send + 'static> EncodeBody for T {
    fn encode_body(&self, enc: &mut Encoder, out: &mut Vec<u8>) {
        enc.encode(self, out);
    }
}

/// The outcome of one call.
pub struct Reply {
    pub(crate) result: Result<Box<dyn EncodeBody>, String>,
    pub(crate) written: Option<oneshot::Sender<()>>,
}

impl Reply {
    /// A successful reply carrying `body`.
    pub fn ok(body: impl EncodeBody) -> Self {
        Self {
            result: Ok(Box::new(body)),
            written: None,
        }
    }

    /// A net/rpc error reply (Go's `ServerError`); the client discards the body.
    pub fn error(message: impl Into<String>) -> Self {
        Self {
            result: Err(message.into()),
            written: None,
        }
    }

    /// Signals `tx` once the reply has been handed to the connection (used by `Control.Quit`).
    pub fn notify_when_written(mut self, tx: oneshot::Sender<()>) -> Self {
        self.written = Some(tx);
        self
    }
}

/// A call in flight.
pub type ReplyFuture = Pin<Box<dyn Future<Output = Reply> + Send>>;

/// The body of a request, still in the stream buffer.
///
/// A [`Service`] decodes it with exactly one of the methods below. They return
/// [`gob::Error::Incomplete`] when the body has not fully arrived; the call is then retried with
/// more bytes, so decoding must have no side effects.
pub struct Body<'a> {
    dec: &'a mut Decoder,
    buf: &'a mut BytesMut,
}

impl Body<'_> {
    /// Decodes the body as `T` (a concrete, non-interface argument such as a string or bool).
    pub fn decode<T: GobDecode>(self) -> Result<T, gob::Error> {
        self.dec.decode(self.buf)
    }

    /// Decodes an interface-typed argument holding the Go type registered as `name`;
    /// `Ok(Err(actual))` names what it held instead (`"nil"` for nil).
    pub fn decode_interface<T: GobDecode>(
        self,
        name: &str,
    ) -> Result<Result<T, String>, gob::Error> {
        self.dec.decode_interface(self.buf, name)
    }

    /// Discards the body.
    pub fn skip(self) -> Result<(), gob::Error> {
        self.dec.skip(self.buf)
    }
}

/// A net/rpc service: `Name.Method` calls are routed to it by name.
pub trait Service: Send + Sync + 'static {
    /// The service name, e.g. `"Plugin"`.
    fn name(&self) -> &str;

    /// Decodes the arguments of `method` from `body` and returns the call to run.
    ///
    /// For an unknown method, skip the body and return [`unknown_method`].
    fn call(&self, method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error>;
}

/// The reply Go's server gives for a method a service does not have.
pub fn unknown_method(service_method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error> {
    body.skip()?;
    Ok(ready(Reply::error(format!(
        "rpc: can't find method {service_method}"
    ))))
}

/// A reply that is already known.
pub fn ready(reply: Reply) -> ReplyFuture {
    Box::pin(std::future::ready(reply))
}

#[cfg(test)]
mod tests;
