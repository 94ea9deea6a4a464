//! `dispatch-server`: the rollouts-dispatch companion server, agent and CLI.
//!
//! This crate is a skeleton today. The engine (destinations, policy, Job lifecycle), the HTTP API,
//! the agent and the `token`/`run`/`doctor` commands land here in later issues; see
//! `ARCHITECTURE.md` §2 and §4–§9 in the design folder.

/// The version of this build, as reported by `rollouts-dispatch --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
