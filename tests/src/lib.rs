//! `dispatch-tests`: helpers for cross-crate, cross-language and real-cluster tests.

pub mod cluster;
