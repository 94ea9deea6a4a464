//! The dispatch engine (`dispatch-server`) against real clusters (`make test-engine`).
//!
//! Three clusters `a`, `b` and `c` start once per test binary and are shared by every test; each
//! test uses its own run UIDs, so tests run in parallel. `a` doubles as the control plane: it
//! holds the Argo CD cluster Secret of `b` (with a real ServiceAccount token of `b`), and the
//! Kargo Stage and Argo CD Application CRDs. kwok runs the pods: annotations on the pod template
//! choose the exit code and run time; states kwok cannot produce (an image pull error, a
//! kubelet's termination message) are written into pod status by the test, as a kubelet would.
//!
//! `#[ignore]`d so that a plain `cargo test` needs no cluster binaries.
//!
//! The tests are grouped by concern: [`jobs`] (one Job's life and verdicts), [`destinations`]
//! (routing, credentials, Argo CD, Kargo stage, policy), [`adoption`] (restarts, foreign Jobs,
//! unreachable destinations), [`refusals`] (a destination's API refusing the Job) and
//! [`topologies`] (`destination: stage` with Argo CD instances on two clusters, by Kargo
//! shard); [`fixture`] starts the clusters.

#[path = "../engine_support/mod.rs"]
mod engine_support;

mod adoption;
mod destinations;
mod fixture;
mod jobs;
mod refusals;
mod topologies;
