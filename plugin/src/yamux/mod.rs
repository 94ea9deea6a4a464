//! A server-side hashicorp/yamux session: exactly what a go-plugin host needs, nothing more.
//!
//! Why our own and not the `yamux` crate: rust-yamux ACKs an inbound stream lazily (on its first
//! outbound frame). go-plugin opens stdout/stderr streams the plugin never writes to, and
//! hashicorp/yamux ≥ 0.1 (Argo Rollouts ≥ 1.7) closes the whole session when a stream it opened
//! is not ACKed within 75 s. Here every inbound stream is ACKed the moment its SYN arrives, pings
//! are answered by the frame reader itself (never behind application work), and each stream
//! keeps its own 256 KiB windows in both directions.
//!
//! A host is trusted to speak yamux, not to be well-behaved: stream ids must grow (a reset id is
//! never reused), at most [`MAX_STREAMS`] streams are held, at most [`MAX_QUEUED_BYTES`] wait for
//! the connection (the reader stops reading beyond that, and gives up after
//! [`WRITE_STALL_TIMEOUT`]), and window overflows and oversized frames end the session with a
//! GoAway and an error that names the violation ([`Session::close_reason`]).

mod frame;
mod session;

pub use frame::INITIAL_WINDOW;
pub use session::{
    Session, Stream, StreamWriter, MAX_QUEUED_BYTES, MAX_STREAMS, WRITE_STALL_TIMEOUT,
};
