//! `dispatch-tests`: the scene library of the cross-crate, cross-language and real-cluster tests
//! (the tests themselves are in `tests/tests/`, run by the targets of `tests/tests.mk`).
//!
//! # Layout
//!
//! * [`cluster`]: real, isolated Kubernetes control planes on loopback ports (kwok runs the
//!   pods) and the real Argo Rollouts controller on them.
//! * [`world`]: the World, the whole system on this machine (three clusters, the controller
//!   with our plugin, `rollouts-dispatch` in-process or as replicas with an agent).
//! * [`kargo`] and [`analysis`]: AnalysisRuns shaped as Kargo creates them, and reading their
//!   verdict as Kargo does.
//! * [`block`]: the one builder of plugin blocks and the Jobs in them.
//! * [`invariants`]: what every fault test asserts (verdicts, one Job per measurement).
//! * [`fleet`]: simulated agents (the wire protocol without a cluster) for the benches.
//! * [`wait`]: the one [`eventually`](wait::eventually) every wait goes through.
//! * [`ports`]: the one way to pick a free loopback port.
//! * [`artifacts`]: where the plugin and server binaries and the repository's files are.
//! * [`server`], [`admin`], [`objects`]: an in-process server, GETs on admin ports, Kubernetes
//!   objects (CRDs, our Jobs).
//! * [`admission`]: an admission policy that refuses Jobs, on a real API server.
//! * [`tls`]: the CA and certificate of the API (the scenes serve it over TLS only).
//! * [`shared`]: one scene per test binary, shared by its tests; [`summary`]: the last line of
//!   benchmarks and smoke tests.
//! * [`netfault`]: network faults made with namespaces, veth pairs and `tc` (`make faults`).
//! * [`kept`]: the demo's World kept up for a person until they stop it (`make demo-up`).
//!
//! Tests that need real clusters are `#[ignore]`d, so `cargo test` runs without the Go-built
//! binaries; see `tests/README.md`.

pub mod admin;
pub mod admission;
pub mod analysis;
pub mod artifacts;
pub mod block;
pub mod cluster;
pub mod fleet;
pub mod invariants;
pub mod kargo;
pub mod kept;
pub mod netfault;
pub mod objects;
pub mod ports;
pub mod server;
pub mod shared;
pub mod summary;
pub mod tls;
pub mod wait;
pub mod world;

pub use artifacts::{plugin_binary, rollouts_dispatch_binary};
pub use ports::free_port;
pub use wait::eventually;
