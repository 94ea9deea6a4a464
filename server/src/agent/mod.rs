//! `rollouts-dispatch agent`: runs the Jobs of one destination inside a cluster that can only
//! dial out.
//!
//! The agent long-polls the server for its destination's work ([`api`]), creates and deletes the
//! Jobs in its own cluster with the same engine code (and so the same Job identity, context and
//! verdict rules) as the server uses for direct destinations, watches them, and reports each
//! state change. It keeps nothing that matters: after a restart it lists its Jobs, adopts them,
//! and reports again.

pub mod api;
