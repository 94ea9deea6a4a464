//! `dispatch-server`: the rollouts-dispatch companion server, agent and CLI.
//!
//! Today the crate is the **dispatch engine**, the library that the HTTP server and the agent
//! share: it runs verification Jobs on destination clusters, with the Kargo context injected,
//! and turns their state into Argo Rollouts measurement verdicts (`docs/architecture.md`).
//!
//! # Layout
//!
//! * [`config`]: the server configuration file, typed and validated once.
//! * [`destinations`]: the destination registry and its sources (config file, kubeconfig
//!   contexts, Argo CD cluster Secrets watched live), each destination with a kube client and a
//!   label-selected watch cache of our Jobs and their Pods; [`destinations::stage`] resolves
//!   `destination: stage` from Kargo and Argo CD objects.
//! * [`job`]: the Job object (name, labels, annotations, injected context) — pure.
//! * [`verdict`]: per-destination state → measurement phase, message, metadata — pure.
//! * [`observe`]: what is deployed (Argo Rollouts, Argo CD Applications) read into states — pure.
//! * [`policy`]: which Kargo projects may use which destinations and namespaces, and with which
//!   [`podsecurity`] profile (the Pod Security Standards check that the server and the agent run,
//!   and what the pods may reference, set and use); [`glob`]: the globs of both.
//! * [`engine`]: the core, [`engine::Engine`] (`ensure`, `status`, `terminate`, `gc`);
//!   [`hints`]: the resume hints its watch caches and store emit when a Job finishes.
//! * The features, each with its routes and state: [`measure`] (the plugin's calls and the
//!   agents' work), [`logs`] (tails in verdicts, whole logs, relayed from agents),
//!   [`applications`] (Argo CD Applications), [`ui`] (the pages); [`app`] builds them over one
//!   engine and assembles their routes.
//! * [`http`]: the web layer under the routes: authentication, authorization, errors.
//! * [`agent`]: the agent of a destination that only dials out; [`store`]: its work records.
//! * [`runtime`]: shutdown, the admin port, metrics, logging and the API listener.
//! * [`watch`]: the list-then-watch of every watch (caches, runs, store, board), bounded
//!   against stalls and relisting after `410 Gone`.
//! * [`signing`]: the server's HMAC keys, which sign the Job references it hands out.
//! * [`cmd`]: the command line, one module per subcommand with its args; [`token`]: JWTs.

pub mod agent;
pub mod app;
pub mod applications;
pub mod cmd;
pub mod config;
pub mod destinations;
pub mod engine;
pub mod glob;
pub mod hints;
pub mod http;
pub mod job;
pub mod logs;
pub mod measure;
pub mod observe;
pub mod podsecurity;
pub mod policy;
pub mod quantity;
pub mod runs;
pub mod runtime;
pub mod signing;
pub mod store;
pub mod token;
pub mod ui;
pub mod verdict;
pub mod watch;

pub use engine::{Engine, EngineError, Ensured, JobRef, MeasureRequest};
pub use verdict::{Phase, Verdict};

/// The version of this build, as reported by `rollouts-dispatch --version`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
