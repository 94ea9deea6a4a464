//! `dispatch-api`: the contract between the pieces of rollouts-dispatch, and nothing else.
//!
//! The plugin (`dispatch-metric-provider`), the server and the agent (`dispatch-server`) all
//! depend on this crate and on none of each other (`docs/architecture.md`). It holds only plain
//! types (serde + thiserror); the HTTP client is behind the `client` feature.
//!
//! # Layout
//!
//! * [`v1`]: the `/v1` routes and their request and reply types.
//! * [`agent`]: the agent routes (long-polled work, reports) and what they carry.
//! * [`block`]: the `rollouts-dispatch/job` plugin block, validated into [`JobConfig`]; its
//!   error, [`BlockError`], is in [`error`].
//! * [`observe`]: the `rollout:` and `application:` checks and the Application sync trigger.
//! * [`logs`]: full logs of a run's Jobs (the route, its query, the NDJSON events, agent log requests).
//! * [`selector`]: label selectors for `destinationSelector`.
//! * [`names`]: the Kubernetes name checks (DNS-1123 labels and subdomains, label keys and
//!   values), for every crate.
//! * [`duration`]: Go's duration syntax.
//! * [`phase`]: Argo's measurement phases; [`state`]: one destination's Job state.
//! * [`redact`]: the one [`Redactor`] of secret values.
//! * `client` (feature `client`): `ServerClient`, the HTTP client of the `/v1` API.

pub mod agent;
pub mod block;
#[cfg(feature = "client")]
pub mod client;
pub mod duration;
pub mod error;
pub mod logs;
pub mod names;
pub mod observe;
pub mod phase;
pub mod redact;
pub mod selector;
pub mod state;
pub mod v1;

pub use block::{Check, JobConfig, Require, Target, PLUGIN_NAME};
pub use duration::{format_go_duration, parse_go_duration};
pub use error::BlockError;
pub use observe::Observe;
pub use phase::Phase;
pub use redact::Redactor;
pub use selector::Selector;
pub use state::DestState;
