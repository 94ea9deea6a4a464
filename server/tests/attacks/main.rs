//! `make attacks`: what a tenant, a stolen token or a man in the middle tries against the server
//! and the agent, each case asserted refused (part of `make test`).
//!
//! Every case runs the real code path (the `/v1` router, the engine, the agent's checks) against
//! fake Kubernetes API servers in process ([`fake_api`], shared with `engine_fast`), so a case can
//! also assert which destination API calls an attack caused (none, for a refused one). Each case
//! records its outcome with [`tally::record`]; `make attacks` sums the records into its last line
//! `attacks=N refused=N cross_tenant_reads=0 cross_tenant_deletes=0 secret_leaks=0
//! cross_tenant_syncs=0 foreign_mounts=0 unbound_callers=0 starved_calls=0`.
//!
//! Shared: [`scene`] (the engine behind the API, tokens), [`tally`] (the record every case
//! writes). Groups, one module each:
//! * [`authn`]: no token, expired, revoked, forged, wrong audience → 401 on every route.
//! * [`secrets`]: a failed check printing a destination Secret leaks nothing into the verdict.
//! * [`budgets`]: DoS budgets — garbage JWTs cost no TokenReview, the review cache is capped,
//!   metric labels are bounded, placements per measurement, long polls per agent, agent report
//!   strings and reply bodies read by the plugin and the agent are capped.
//! * [`argocd`]: Argo CD cluster Secret abuse — a duplicated name, an exec provider outside the
//!   allowlist, `insecure` TLS: refused or surfaced, and no Job through a broken destination; a
//!   Secret named like a configured destination or `in-cluster` → ignored; one for
//!   `https://kubernetes.default.svc` or without credentials → never the server's own.
//! * [`topologies`]: Kargo topologies — a Stage whose shard no Argo CD instance serves (or whose
//!   shard label contradicts `spec.shard`) is refused without reading any Argo CD, and a remote
//!   instance's Secret cannot take the control plane's Argo CD destination names or `in-cluster`.
//! * [`references`]: forged, replayed and edited Job references (`dispatch-ref`) → 403, no
//!   destination call; the genuine reference still works.
//! * [`runs`]: with `confirmRuns`, requests about a run that does not exist on the control plane,
//!   with another uid, or with a metric that does not use the plugin → 403 on every measurement
//!   route, no destination call; before the watch of AnalysisRuns has listed them → 503 (retry).
//! * [`authz`]: every route × every caller (plugin JWTs bound to a project or to all, agents of
//!   their own, another or an unknown destination) → the exact status code; TokenReview users
//!   bound by `policy.callers`; a seeded property that no request reaches a placement the policy
//!   denies.
//! * [`callers`]: callers fail closed — a JWT without `projects`, a TokenReview identity with
//!   no `policy.callers` entry, a token reviewed for the apiserver's audience instead of ours →
//!   401/403 naming the fix on every measurement route, no destination call.
//! * [`podsecurity`]: escalating Job templates (privileged, host namespaces, hostPath, nodeName,
//!   selectors, service accounts, API tokens, reserved labels) → refused with the field, no
//!   destination call; no policy → refused; and the agent's own re-check.
//! * [`pod_allowlists`]: foreign mounts — Secrets (volumes, `secretKeyRef`, `envFrom`, projected),
//!   ConfigMaps, claims, CSI drivers and pull Secrets a rule does not name, legacy
//!   service-account token Secrets even under `secrets: ["*"]`, scheduling fields, resources,
//!   parallelism and retries over the caps, pod labels and annotations outside the allowlist →
//!   403 with the field, no destination call; the agent refuses them from its own flags.
//! * [`signed_work`]: a DispatchJob record written into the store by someone else, signed by
//!   another server's key, edited after signing or replayed past its deadline → the agent refuses
//!   it (`Error` naming why) and creates nothing; a log only of signed work's Jobs.
//! * [`adoption`]: Jobs made to look like ours (our labels, the next predictable name, a mark
//!   copied from another Job, our Job replaced after creation) are never adopted and never
//!   become another project's verdict.
//! * [`namespaces`]: a placement outside a destination's `namespaces` (by the block's
//!   namespace, a selector, or the status route) → 403 naming the destination, the namespace
//!   and the key, no destination call, even when the policy allows every namespace.
//! * [`deadlines`]: a block asking for a 30-day `activeDeadline` (to hold its Stage) → 4xx
//!   naming the field, its value, `engine.maxMeasurementDeadline` and the key to raise it; no
//!   destination call, no agent record.
//! * [`destination_errors`]: an unknown destination, a selector matching only another tenant's
//!   destination, another tenant's destination by name → refused naming only the caller's own
//!   destinations (never another tenant's names or labels, nor whether one exists).
//! * [`hints`]: the resume hints feed — an agent token is refused; a project's plugin token sees
//!   only its project's hints; a tenant forging the run namespace on its own Job carries its
//!   hint to nobody (with `confirmRuns`).
//! * [`observe`]: an observe check (`rollout:`) redirected — the status block naming another
//!   Rollout still observes the signed reference's; the reference edited to observe another →
//!   403; an observed namespace outside the project's policy → 403 at ensure; no destination
//!   write or delete.
//! * [`sync`]: the Application read and sync trigger — agent tokens, another project's
//!   Application, a destination without `applicationSync`, names leaving the namespace, bad
//!   bodies, no token → 403/400/401, no destination call; the genuine sync patches once.
//! * [`authorized_stage`]: Applications authorized as Kargo does it — no
//!   `kargo.akuity.io/authorized-stage`, another project's Stage, another Stage of the caller's
//!   project, globs Kargo rejects, a missing Application, no or a glob `stage`, a namespace
//!   granted for Jobs but not in `applicationNamespaces`, forged agent records (another Stage,
//!   none) → 403/400 naming the annotation or key, nothing of the Application shown, no patch;
//!   the genuine Stage syncs once, named in `initiatedBy`.
//! * [`agent_logs`]: the agent log relay — another destination's agent, a plugin token or an
//!   unknown id uploading a pending request's log → 403/404, nothing reaches the reader; an
//!   agent asked for a Job not of its records or outside its `--namespaces` streams nothing and
//!   makes no call in its cluster.
//! * [`agent_log_peers`]: the same relay across replicas — at a replica that does not hold the
//!   published request, another destination's agent, an unknown id, a plugin token or an upload
//!   forged as already forwarded → 403/404, nothing forwarded; a published owner without a
//!   certificate of the replicas' CA for their name → 503, no byte of the agent's token sent.
//! * [`logs`]: the log route — people without `get analysisruns` in the namespace (by
//!   SubjectAccessReview), agent tokens, JWTs of another project → 403; proxy headers from an
//!   untrusted address → ignored (401); a trusted proxy asserting a `system:` user → 401, a
//!   `system:` group (system:masters) → dropped (403); `..`, `%2F` and unknown query fields → 400; no token →
//!   401; none of them costs a destination call.
//! * [`tls`]: plain HTTP to the TLS port, clients refusing `http://`, the agent's pinned CA,
//!   certificate, JWT key and revocation rotation on disk without a restart.
//! * [`ui`]: the pages for people — no session → login; another project's run → 403 and not
//!   listed; an agent token as session or login → 403, no cookie; a cross-site login → 403; a
//!   hostile run message escaped under a strict Content-Security-Policy; a person (Kubernetes
//!   token) sees only the namespaces a SubjectAccessReview allows.

#[path = "../engine_fast/agent_rig.rs"]
#[allow(dead_code)]
mod agent_rig;
#[path = "../engine_fast/cluster_side.rs"]
#[allow(dead_code)]
mod cluster_side;
#[path = "../engine_fast/fake_api/mod.rs"]
#[allow(dead_code)]
mod fake_api;
#[path = "../engine_fast/world.rs"]
#[allow(dead_code)]
mod world;

mod adoption;
mod agent_log_peers;
mod agent_logs;
mod argocd;
mod authn;
mod authorized_stage;
mod authz;
mod budgets;
mod callers;
mod deadlines;
mod destination_errors;
mod hints;
mod logs;
mod namespaces;
mod observe;
mod pod_allowlists;
mod podsecurity;
mod references;
mod runs;
mod scene;
mod secrets;
mod signed_work;
mod sync;
mod tally;
mod tls;
mod topologies;
mod ui;
