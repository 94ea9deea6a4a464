//! The process runtime shared by `serve` and `agent`: shutdown on signals, the admin port
//! (`/live`, `/ready`, `/metrics`), the metrics registry, logging, the API listener and its
//! budgets (`limits`: per kind of request; `quota`: per project or destination), and values that follow their files (`reload`: certificates, keys,
//! revocations).
//!
//! Nothing here knows the engine, the API or the agent: they import the runtime, never the
//! reverse (`docs/architecture.md`).

pub mod admin;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod quota;
pub mod reload;
pub mod shutdown;
pub mod telemetry;
