//! The dispatch engine against fake Kubernetes API servers, in process and in seconds (part of
//! `make test-fast`).
//!
//! Each test starts fake API servers ([`fake_api`]) for two destinations and a control plane,
//! and an [`dispatch_server::Engine`] from a real configuration file that points at them, so
//! the engine's own kube clients, watch caches, timeouts and error paths all run. The test plays
//! the cluster's controllers ([`cluster_side`]): it writes the Pods and Job conditions a Job
//! controller and kubelet would, and scripts errors, late watch events and slow deletions.
//! Assertions are on what the engine wrote (Job objects, deletions), on its verdicts and reports,
//! and on which API calls it made.
//!
//! The real-cluster tests (`tests/tests/engine.rs`, `make test-engine`) cover what a fake
//! cannot: a real API server's validation and RBAC, the Job controller, Pods that really run,
//! ServiceAccount tokens and TLS.

mod agent_logs;
mod agent_loop;
#[allow(dead_code)]
mod agent_rig;
mod agents;
mod applications;
mod cleanup;
mod cluster_side;
mod create;
mod deadline;
mod doctor;
mod expiry;
mod failures;
mod fake_api;
mod hints;
mod lifecycle;
mod log_peers;
mod log_secrets;
mod namespaces;
mod observe;
mod pending;
mod refusals;
mod run_logs;
mod stage;
mod status;
mod topologies;
mod waiting;
mod world;
