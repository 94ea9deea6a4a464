//! `rollouts-dispatch agent`: runs the Jobs of one destination inside a cluster that can only
//! dial out.
//!
//! The agent long-polls the server for its destination's work ([`api`]), creates and deletes the
//! Jobs in its own cluster with the same engine code (and so the same Job identity, context and
//! verdict rules) as the server uses for direct destinations, watches them, and reports each
//! state change. It keeps nothing that matters: after a restart it lists its Jobs, adopts them,
//! and reports again. Before it creates anything it checks the work itself ([`guard`]): the
//! server's signature over it (`--work-keys`, `signing::work`), its namespaces and the pod
//! security of the Job, whatever the server asks. Each pass over the work
//! ([`work`]) skips the records whose final state the server already accepted. The records of
//! the Application routes (read an Argo CD Application, carry out a sync order once) are
//! served by [`sync`]. A log the server asks for in the work is checked and streamed back by
//! [`logs`] (the cluster still needs no inbound path).

mod guard;

mod sync;
mod work;

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::client::{CallError, ClientConfig, ServerClient};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tracing::{error, info, info_span, warn, Instrument};

use crate::config::EngineSettings;
use crate::engine::{Engine, EngineError};
use crate::podsecurity::{Level, Origin, Profile};
use crate::runtime::admin::{self, Readiness};
use crate::runtime::metrics::Metrics;
use crate::runtime::reload::{self, Reloading};
use crate::runtime::{listener, shutdown::shutdown_signal};
use crate::signing::WorkKeys;
use dispatch_api::agent::{
    self as api, ReportReply, ReportRequest, WorkItem, WorkReply, WorkRequest,
};
pub use guard::{namespaces, AgentRefused, Guard, MissingNamespaces};
pub use work::{is_final, Worker, CREATE_RETRY};

/// What `rollouts-dispatch agent` needs.
#[derive(Debug, Clone)]
pub struct AgentOptions {
    /// the server's base URL
    pub server: String,
    /// the agent token (re-read on every request: it can be rotated in place)
    pub token_file: PathBuf,
    /// the server's CA: the only one trusted (pinned), re-read when it changes on disk
    pub ca_file: Option<PathBuf>,
    /// allow an `http://` server that is not loopback
    pub insecure_plaintext: bool,
    /// the destination, when given on the command line (must match the token)
    pub destination: Option<String>,
    /// address of /live, /ready and /metrics
    pub admin_listen: SocketAddr,
    /// how long one long poll may stay open
    pub poll_wait: Duration,
    /// `--namespaces` (empty: `$POD_NAMESPACE`, see [`namespaces`])
    pub namespaces: Vec<String>,
    /// `--pod-security`
    pub pod_security: Level,
    /// `--service-accounts`
    pub service_accounts: Vec<String>,
    /// `--automount-service-account-token`
    pub automount_service_account_token: bool,
    /// `--argocd-sync`: carry out the sync orders of the Application routes
    pub argocd_sync: bool,
    /// `--secrets`, `--scheduling`, `--max-resources` …: what the Jobs' pods may reference,
    /// set and use (#27)
    pub allowlists: crate::podsecurity::Allowlists,
    /// `--work-keys`: the server's public keys; work no key of these signed is refused
    pub work_keys: WorkKeys,
    /// `--default-run-as-user`: the user of a restricted pod whose template names none
    pub default_user: crate::podsecurity::DefaultUser,
    /// `--start-grace`, `--scheduling-grace`: how long a pod that cannot start or be scheduled
    /// is given before its Job's state is an Error
    pub graces: crate::verdict::Graces,
}

impl AgentOptions {
    /// The namespaces the Job and Pod caches watch, one watch each: those of `--namespaces`
    /// when it lists exact names (the agent never acts elsewhere, so it needs no cluster-wide
    /// read). `None` (a watch over every namespace): no `--namespaces` (the agent's own
    /// namespace is then its only one, but its RBAC was granted cluster-wide), or globs in it.
    pub fn watched_namespaces(&self) -> Option<Vec<String>> {
        let given = namespaces(&self.namespaces, None).ok()?;
        given
            .iter()
            .all(|n| crate::config::check_namespaces(Some(std::slice::from_ref(n)), None).is_ok())
            .then(|| {
                let mut unique = given.clone();
                unique.sort();
                unique.dedup();
                unique
            })
    }

    /// The agent's checks; `pod_namespace` is `$POD_NAMESPACE`.
    pub fn guard(&self, pod_namespace: Option<String>) -> Result<Guard, MissingNamespaces> {
        Ok(Guard {
            namespaces: namespaces(&self.namespaces, pod_namespace)?,
            profile: Profile {
                level: self.pod_security,
                service_accounts: self.service_accounts.clone(),
                automount_service_account_token: self.automount_service_account_token,
                origin: Origin::Agent,
                allow: self.allowlists.clone(),
                default_user: self.default_user,
            },
            work_keys: self.work_keys.clone(),
        })
    }
}

/// Why the agent cannot run. `rollouts-dispatch agent` reports it with its sources.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// neither `--namespaces` nor `POD_NAMESPACE`
    #[error(transparent)]
    Namespaces(#[from] MissingNamespaces),
    /// `--token-file` cannot be read
    #[error("reading the agent token {}", .path.display())]
    TokenRead {
        /// the file
        path: PathBuf,
        /// why
        #[source]
        source: std::io::Error,
    },
    /// `--token-file` holds no JWT
    #[error(
        "{} does not hold a rollouts-dispatch JWT; issue one with `rollouts-dispatch token issue --destination NAME`",
        .path.display()
    )]
    NotAJwt {
        /// the file
        path: PathBuf,
    },
    /// `--destination` names another destination than the token
    #[error("--destination {flag} does not match the token, which is for destination {claim}")]
    WrongDestination {
        /// `--destination`
        flag: String,
        /// the token's destination
        claim: String,
    },
    /// the token has no destination claim
    #[error(
        "the token in {} is not an agent token (no destination claim); issue one with \
         `rollouts-dispatch token issue --destination NAME`",
        .path.display()
    )]
    NotAnAgentToken {
        /// the file
        path: PathBuf,
    },
    /// the client of the server cannot be built (`--server`, `--ca-file`)
    #[error(transparent)]
    Client(#[from] dispatch_api::client::ClientError),
    /// the engine of its own cluster cannot start (boxed: the other causes are small)
    #[error(transparent)]
    Engine(Box<EngineError>),
    /// `--admin-listen` cannot be bound
    #[error("binding the admin port {addr}")]
    Bind {
        /// `--admin-listen`
        addr: SocketAddr,
        /// why
        #[source]
        source: std::io::Error,
    },
    /// the engine did not register the agent's own cluster
    #[error("the agent's own cluster {destination} is not registered")]
    Unregistered {
        /// the destination
        destination: String,
    },
    /// the admin server failed
    #[error(transparent)]
    Admin(std::io::Error),
    /// the admin server's task panicked or was cancelled
    #[error(transparent)]
    AdminTask(#[from] tokio::task::JoinError),
}

impl From<EngineError> for AgentError {
    fn from(e: EngineError) -> Self {
        Self::Engine(Box::new(e))
    }
}

/// The claims of a token that the agent reads without verifying (the server verifies).
#[derive(serde::Deserialize)]
struct UnverifiedClaims {
    sub: Option<String>,
    destination: Option<String>,
}

/// The `(subject, destination)` claims of the JWT in `token_file`.
fn token_identity(token_file: &Path) -> Result<(String, Option<String>), AgentError> {
    use base64::Engine as _;
    let token = std::fs::read_to_string(token_file).map_err(|source| AgentError::TokenRead {
        path: token_file.to_path_buf(),
        source,
    })?;
    let payload = token.trim().split('.').nth(1).unwrap_or_default();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()
        .and_then(|b| serde_json::from_slice::<UnverifiedClaims>(&b).ok());
    let Some(claims) = bytes else {
        return Err(AgentError::NotAJwt {
            path: token_file.to_path_buf(),
        });
    };
    Ok((claims.sub.unwrap_or_default(), claims.destination))
}

/// The agent's client of the server. With `--ca-file` it trusts only that CA (a certificate that
/// any public CA issued for the server's name is not enough: whoever answers decides which Jobs
/// run in this cluster), and it is built again when the CA file changes, so a CA rotation needs
/// no restart (a CA file that does not load keeps the previous client, with a log line).
pub fn server_client(
    opts: &AgentOptions,
    every: Duration,
) -> Result<Reloading<ServerClient>, AgentError> {
    let config = ClientConfig {
        server: opts.server.clone(),
        token_file: Some(opts.token_file.clone()),
        ca_file: opts.ca_file.clone(),
        ca_only: true,
        insecure_plaintext: opts.insecure_plaintext,
        timeout: opts.poll_wait + Duration::from_secs(30),
    };
    Ok(match &opts.ca_file {
        None => Reloading::fixed(
            "server client",
            ServerClient::new(&config)?.with_max_reply_bytes(MAX_WORK_REPLY_BYTES),
        ),
        // The client would follow its CA file by itself (`dispatch_api::client`); here the
        // `Reloading` does, so that a CA file that does not load is logged when it changes.
        Some(ca) => Reloading::new(
            "server ca",
            vec![ca.clone()],
            every,
            move |_: &[PathBuf]| {
                Ok::<_, dispatch_api::client::ClientError>(
                    ServerClient::new(&config)?
                        .with_max_reply_bytes(MAX_WORK_REPLY_BYTES)
                        .with_ca_check_every(Duration::MAX),
                )
            },
        )?,
    })
}

/// The delay before retry number `failures` (1-based): exponential from 0.5 s, capped at 30 s,
/// with ±50% jitter so that many agents cut off together do not come back together.
pub fn backoff(failures: u32) -> Duration {
    let base = 500u64
        .saturating_mul(1 << failures.saturating_sub(1).min(6))
        .min(30_000);
    let jitter = RandomState::new().hash_one(failures) % 1000;
    Duration::from_millis(base / 2 + base * jitter / 1000)
}

/// How long to wait after the `failures`-th failed call in a row: the [`backoff`], or, when the
/// server said when to come back (`Retry-After`, at a budget), that long plus up to half as much
/// again, so that a fleet refused at once does not come back at once.
pub fn retry_delay(e: &CallError, failures: u32) -> Duration {
    let backoff = backoff(failures);
    match e {
        CallError::Busy { retry_after, .. } => {
            let jitter = RandomState::new().hash_one(failures) % 1000;
            let asked = *retry_after + retry_after.mul_f64(jitter as f64 / 2000.0);
            asked.max(backoff)
        }
        _ => backoff,
    }
}

/// When the agent may send its next report. At once while reports go through; after a failed
/// one, not before [`retry_delay`]: the server's `Retry-After` when it gave one (a full
/// `--max-agent-reports` budget, a project's budget), else the growing backoff with jitter (a
/// `503` because the control plane pushes back on the store's writes, a timeout). The passes
/// over the work go on meanwhile; only the report waits, and then carries the latest states.
/// Without it a refused report was sent again on the next pass, 500 ms later, whatever the
/// server asked: once the control plane's pushback (`429` on the store's writes) held every
/// report slot, each other agent's report was refused at once and sent again twice a second
/// (issue #32).
#[derive(Debug, Default)]
struct ReportPacing {
    /// failed reports in a row
    failures: u32,
    /// no report before this instant
    not_before: Option<tokio::time::Instant>,
}

impl ReportPacing {
    /// Whether a report may be sent at `now`.
    fn due(&self, now: tokio::time::Instant) -> bool {
        self.not_before.is_none_or(|at| now >= at)
    }

    /// A report failed at `now` with `e`; returns how long the next one waits.
    fn failed(&mut self, e: &CallError, now: tokio::time::Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let delay = retry_delay(e, self.failures);
        self.not_before = Some(now + delay);
        delay
    }

    /// A report went through: the next one goes at once.
    fn succeeded(&mut self) {
        *self = Self::default();
    }
}

struct Shared {
    destination: String,
    /// the last work the server sent, replaced whole when it changes (cheap to share)
    work: Mutex<Arc<Vec<WorkItem>>>,
    changed: Notify,
    /// `--argocd-sync`
    argocd_sync: bool,
}

/// The largest reply the agent reads from the server. A work reply lists every record of the
/// destination, each with its Job (at most the server's 1 MiB request body when it was
/// ensured), so it is allowed more than the plugin's 1 MiB; beyond it the reply is refused
/// unread (a broken server or a man in the middle cannot exhaust the agent's memory) and the
/// poll is retried.
pub const MAX_WORK_REPLY_BYTES: usize = 32 << 20;

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(opts: AgentOptions) -> Result<(), AgentError> {
    let guard = opts.guard(std::env::var("POD_NAMESPACE").ok())?;
    let (subject, claimed) = token_identity(&opts.token_file)?;
    let destination = match (opts.destination.clone(), claimed) {
        (Some(flag), Some(claim)) if flag != claim => {
            return Err(AgentError::WrongDestination { flag, claim });
        }
        (_, Some(claim)) => claim,
        (Some(_), None) | (None, None) => {
            return Err(AgentError::NotAnAgentToken {
                path: opts.token_file.clone(),
            })
        }
    };
    let client = server_client(&opts, reload::CHECK_EVERY)?;
    let watched = opts.watched_namespaces();
    if watched.is_none() && !opts.namespaces.is_empty() {
        warn!(namespaces = ?guard.namespaces, "--namespaces has globs: the Job and Pod caches watch \
              every namespace (cluster-wide list and watch); list exact names to watch only those");
    }
    let settings = EngineSettings {
        start_grace: opts.graces.start,
        scheduling_grace: opts.graces.scheduling,
        ..EngineSettings::default()
    };
    let engine = Engine::start_local(&destination, watched, settings).await?;
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new("the cluster's Jobs are not listed yet");
    let admin_listener = TcpListener::bind(opts.admin_listen)
        .await
        .map_err(|source| AgentError::Bind {
            addr: opts.admin_listen,
            source,
        })?;
    let shutdown = shutdown_signal();
    let admin = tokio::spawn(
        listener::serve(
            admin_listener,
            admin::router(readiness.clone(), metrics.clone()),
            None,
            shutdown.clone(),
        )
        .instrument(info_span!("admin", listen = %opts.admin_listen)),
    );
    info!(%destination, server = %opts.server, agent = %subject, namespaces = ?guard.namespaces,
          pod_security = %guard.profile.level, service_accounts = ?guard.profile.service_accounts,
          work_keys = ?guard.work_keys.key_ids(), "agent starting");
    // Act only on a complete view of the cluster: a Job missing from a half-listed cache
    // would be created twice.
    while !engine.wait_synced(Duration::from_secs(30)).await.is_empty() {
        warn!(%destination, "cannot list the Jobs and Pods of this cluster yet; check the agent's RBAC (jobs, pods: get, list, watch)");
    }
    let shared = Arc::new(Shared {
        destination: destination.clone(),
        work: Mutex::new(Arc::new(Vec::new())),
        changed: Notify::new(),
        argocd_sync: opts.argocd_sync,
    });
    let Some(kube) = engine.client_of(&destination) else {
        return Err(AgentError::Unregistered { destination });
    };
    let log_server = crate::logs::agent::LogServer::new(
        client.clone(),
        kube,
        &destination,
        guard.namespaces.clone(),
    );
    let poller = tokio::spawn(
        poll(
            client.clone(),
            shared.clone(),
            log_server,
            guard.work_keys.clone(),
            readiness.clone(),
            opts.poll_wait,
        )
        .instrument(info_span!("agent_poll", %destination)),
    );
    tokio::select! {
        () = sync(engine, client, shared, subject, metrics, guard) => {}
        () = shutdown.clone() => {}
    }
    poller.abort();
    readiness.set_unready("shutting down");
    admin.await?.map_err(AgentError::Admin)?;
    info!(%destination, "agent stopped");
    Ok(())
}

/// The records of `work` a key of `keys` signed: the only ones whose Jobs' logs the agent
/// uploads (a record someone else wrote into the store names no Job the agent would read).
pub fn signed_work(keys: &WorkKeys, work: &[WorkItem]) -> Vec<WorkItem> {
    work.iter()
        .filter(|w| keys.verify(&w.spec).is_ok())
        .cloned()
        .collect()
}

/// Long-polls the work of the destination forever.
async fn poll(
    client: Reloading<ServerClient>,
    shared: Arc<Shared>,
    log_server: Arc<crate::logs::agent::LogServer>,
    work_keys: WorkKeys,
    readiness: Readiness,
    wait: Duration,
) {
    let path = api::path(api::WORK, &shared.destination);
    let mut fingerprint = String::new();
    let mut failures = 0u32;
    loop {
        let request = WorkRequest {
            fingerprint: fingerprint.clone(),
            wait_seconds: wait.as_secs() as u32,
        };
        let client = client.get();
        match client.post::<_, WorkReply>(&path, &request).await {
            Ok(reply) => {
                if failures > 0 {
                    info!(destination = %shared.destination, server = client.server(), "connected to the server again");
                }
                failures = 0;
                readiness.set_ready();
                if !reply.logs.is_empty() {
                    // A log only of a Job of signed work: a record someone else wrote into the
                    // store names no Job whose log the agent would upload.
                    log_server.serve(reply.logs, &signed_work(&work_keys, &reply.jobs));
                }
                if reply.fingerprint != fingerprint {
                    fingerprint = reply.fingerprint;
                    *shared.work.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(reply.jobs);
                    shared.changed.notify_one();
                }
            }
            Err(e) => {
                failures += 1;
                let delay = retry_delay(&e, failures);
                match &e {
                    CallError::Rejected(api) => {
                        error!(destination = %shared.destination, code = %api.code, error = %api.message,
                               retry_in_ms = delay.as_millis() as u64, "the server refused the agent")
                    }
                    CallError::Transient(m) => {
                        warn!(destination = %shared.destination, error = %m,
                              retry_in_ms = delay.as_millis() as u64, "cannot get work from the server")
                    }
                    CallError::Busy { message, .. } => {
                        warn!(destination = %shared.destination, error = %message,
                              retry_in_ms = delay.as_millis() as u64,
                              "the server is at a budget; polling again when it asks")
                    }
                }
                if failures >= 3 {
                    readiness.set_unready("the server cannot be reached");
                }
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// Creates, watches and deletes the Jobs of the work, and reports every state change.
async fn sync(
    engine: Engine,
    client: Reloading<ServerClient>,
    shared: Arc<Shared>,
    subject: String,
    metrics: Arc<Metrics>,
    guard: Guard,
) {
    let destination = shared.destination.clone();
    let path = api::path(api::REPORT, &destination);
    let Some(worker) = Worker::new(engine, &destination, guard) else {
        error!(%destination, "the agent's own cluster is not registered");
        return;
    };
    let mut worker = worker.with_argocd_sync(shared.argocd_sync);
    let mut pacing = ReportPacing::default();
    loop {
        tokio::select! {
            () = shared.changed.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        let work = shared
            .work
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let reports = worker.pass(&work).await;
        if reports.is_empty() || !pacing.due(tokio::time::Instant::now()) {
            continue;
        }
        for r in &reports {
            tracing::debug!(%destination, record = %r.name, state = ?r.state, "reporting");
        }
        let request = ReportRequest { reports };
        match client.get().post::<_, ReportReply>(&path, &request).await {
            Ok(reply) => {
                pacing.succeeded();
                worker.accepted(request.reports, &reply.unknown);
                metrics.count_agent_reports(&destination, u64::from(reply.accepted));
            }
            Err(e) => {
                let delay = pacing.failed(&e, tokio::time::Instant::now());
                warn!(%destination, agent = %subject, error = %e,
                      retry_in_ms = delay.as_millis() as u64,
                      "cannot report to the server; retrying")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        for n in 1..20 {
            let d = backoff(n);
            assert!(d <= Duration::from_millis(45_000), "{n}: {d:?}");
            assert!(d >= Duration::from_millis(250), "{n}: {d:?}");
        }
        assert!(backoff(1) < Duration::from_millis(750));
        assert!(backoff(10) >= Duration::from_secs(15));
    }

    #[test]
    fn a_busy_server_is_polled_again_no_sooner_than_it_asks_with_jitter() {
        let busy = CallError::Busy {
            message: "the server is serving its maximum of 2048 agent long polls".into(),
            retry_after: Duration::from_secs(5),
        };
        let delays: Vec<Duration> = (1..40).map(|n| retry_delay(&busy, n % 3 + 1)).collect();
        assert!(delays
            .iter()
            .all(|d| *d >= Duration::from_secs(5) && *d <= Duration::from_millis(7_500)));
        assert!(
            delays.iter().any(|d| *d != delays[0]),
            "jittered: {delays:?}"
        );
        // Past the server's hint, the agent's own growing backoff wins.
        assert!(retry_delay(&busy, 10) >= Duration::from_secs(15));
        let transient = CallError::Transient("connection refused".into());
        assert!(retry_delay(&transient, 1) < Duration::from_secs(1));
    }

    /// The sync loop's report step under a server that refuses every report: over 60 s of
    /// passes every 500 ms, a report is sent no sooner than each `Retry-After` (plus jitter),
    /// and without one the gaps grow; before the pacing it was sent on all 120 passes.
    #[test]
    fn refused_reports_wait_for_retry_after_then_back_off() {
        let sends = |refusal: &CallError| {
            let start = tokio::time::Instant::now();
            let mut pacing = ReportPacing::default();
            let mut sent = Vec::new();
            for pass in 0..120u64 {
                let now = start + Duration::from_millis(500 * pass);
                if pacing.due(now) {
                    sent.push(now - start);
                    pacing.failed(refusal, now);
                }
            }
            sent
        };
        let busy = CallError::Busy {
            message: "the server is serving its maximum of 256 agent reports".into(),
            retry_after: Duration::from_secs(5),
        };
        let sent = sends(&busy);
        assert!(sent.len() <= 12, "{} reports in 60 s: {sent:?}", sent.len());
        assert!(
            sent.windows(2)
                .all(|w| w[1] - w[0] >= Duration::from_secs(5)),
            "no sooner than Retry-After: {sent:?}"
        );
        let unavailable = CallError::Transient(
            "dispatchjob x in namespace rd: no answer within 20s (503 Service Unavailable)".into(),
        );
        let sent = sends(&unavailable);
        assert!(sent.len() <= 10, "{} reports in 60 s: {sent:?}", sent.len());
        let gaps: Vec<Duration> = sent.windows(2).map(|w| w[1] - w[0]).collect();
        // The n-th wait is jittered within half to one and a half times 500 ms · 2^(n-1), so
        // each gap is at least its floor whatever the jitter drew (a 9 s sixth gap after a 10.5 s
        // fifth one is right: the floor of the sixth is 8 s).
        assert!(gaps.len() >= 4, "the gaps grow: {gaps:?}");
        for (n, gap) in gaps.iter().enumerate() {
            let floor = Duration::from_millis(250 << n).min(Duration::from_secs(15));
            assert!(*gap >= floor, "gap {n} under its floor {floor:?}: {gaps:?}");
        }
        // A report that goes through lifts the wait at once.
        let mut pacing = ReportPacing::default();
        let now = tokio::time::Instant::now();
        pacing.failed(&busy, now);
        assert!(!pacing.due(now + Duration::from_secs(1)));
        pacing.succeeded();
        assert!(pacing.due(now));
    }

    #[test]
    fn exact_namespaces_are_watched_each_globs_or_none_cluster_wide() {
        let opts = |namespaces: &[&str]| AgentOptions {
            server: "https://s".into(),
            token_file: "/t".into(),
            ca_file: None,
            insecure_plaintext: false,
            destination: None,
            admin_listen: "127.0.0.1:0".parse().unwrap(),
            poll_wait: Duration::from_secs(1),
            namespaces: namespaces.iter().map(|n| n.to_string()).collect(),
            pod_security: Level::Restricted,
            service_accounts: vec![],
            automount_service_account_token: false,
            argocd_sync: false,
            allowlists: Default::default(),
            work_keys: WorkKeys::fixed(Vec::new()),
            default_user: Default::default(),
            graces: crate::verdict::Graces {
                start: Duration::ZERO,
                scheduling: Duration::ZERO,
            },
        };
        assert_eq!(
            opts(&["b", " a", "b"]).watched_namespaces(),
            Some(vec!["a".to_string(), "b".to_string()])
        );
        assert_eq!(opts(&["a", "team-*"]).watched_namespaces(), None);
        assert_eq!(opts(&["*"]).watched_namespaces(), None);
        assert_eq!(opts(&[]).watched_namespaces(), None);
    }

    #[test]
    fn the_destination_comes_from_the_token() {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let (token, _) =
            crate::token::issue_token(&key, "agent:b", Some("cluster-b"), Duration::from_secs(60))
                .unwrap();
        let file = std::env::temp_dir().join(format!("rd-agent-token-{}", std::process::id()));
        std::fs::write(&file, format!("{token}\n")).unwrap();
        let (sub, dest) = token_identity(&file).unwrap();
        assert_eq!(
            (sub.as_str(), dest.as_deref()),
            ("agent:b", Some("cluster-b"))
        );
        std::fs::write(&file, "not a jwt").unwrap();
        assert!(token_identity(&file)
            .unwrap_err()
            .to_string()
            .contains("token issue --destination"));
        std::fs::remove_file(file).ok();
    }

    #[test]
    fn an_unreadable_token_is_reported_with_its_cause() {
        let file = std::env::temp_dir().join(format!("rd-agent-no-token-{}", std::process::id()));
        let e = token_identity(&file).unwrap_err();
        assert!(matches!(e, AgentError::TokenRead { .. }), "{e:?}");
        assert!(e.to_string().starts_with("reading the agent token "), "{e}");
        // `rollouts-dispatch agent` logs the context, then this io error.
        let source = std::error::Error::source(&e).map(ToString::to_string);
        assert!(
            source
                .as_deref()
                .is_some_and(|s| s.contains("No such file")),
            "{source:?}"
        );
    }
}
