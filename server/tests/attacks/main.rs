//! `make attacks`: what a tenant, a stolen token or a man in the middle tries against the server
//! and the agent, each case asserted refused (part of `make test`).
//!
//! Every case runs the real code path (the `/v1` router, the engine, the agent's checks) against
//! fake Kubernetes API servers in process ([`fake_api`], shared with `engine_fast`), so a case can
//! also assert which destination API calls an attack caused (none, for a refused one). Each case
//! records its outcome with [`tally::record`]; `make attacks` sums the records into its last line
//! `attacks=N refused=N cross_tenant_reads=0 cross_tenant_deletes=0 secret_leaks=0`.
//!
//! Shared: [`scene`] (the engine behind the API, tokens), [`tally`] (the record every case
//! writes). Groups, one module each:
//! * [`authn`]: no token, expired, revoked, forged, wrong audience → 401 on every route.
//! * [`tls`]: plain HTTP to the TLS port, clients refusing `http://`, the agent's pinned CA,
//!   certificate, JWT key and revocation rotation on disk without a restart.

#[path = "../engine_fast/fake_api/mod.rs"]
#[allow(dead_code)]
mod fake_api;
#[path = "../engine_fast/world.rs"]
#[allow(dead_code)]
mod world;

mod authn;
mod scene;
mod tally;
mod tls;
