//! A server-side hashicorp/yamux session: exactly what a go-plugin host needs, nothing more.
//!
//! Why our own and not the `yamux` crate: rust-yamux ACKs an inbound stream lazily (on its first
//! outbound frame). go-plugin opens stdout/stderr streams the plugin never writes to, and
//! hashicorp/yamux ≥ 0.1 (Argo Rollouts ≥ 1.7) closes the whole session when a stream it opened
//! is not ACKed within 75 s. Here every inbound stream is ACKed the moment its SYN arrives, pings
//! are answered by the frame reader itself (never behind application work), and each stream
//! keeps its own 256 KiB windows in both directions.

mod frame;
mod session;

pub use frame::INITIAL_WINDOW;
pub use session::{Session, Stream, StreamWriter};
