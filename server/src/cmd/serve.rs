//! `rollouts-dispatch serve`: the engine, the authenticated `/v1` API and the admin port, with
//! graceful shutdown on SIGTERM/SIGINT.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use tokio::net::TcpListener;
use tracing::{info, info_span, warn, Instrument};

use crate::app::{self, Features, Options, PeerOptions};
use crate::config::{CallerBinding, ConfirmRuns};
use crate::engine::Engine;
use crate::logs::board::LogBoard;
use crate::logs::peers::PeerTransport;
use crate::runs::Runs;
use crate::signing::{KeyFiles, Signer};

use super::{parse_duration, AdminArgs, ConfigArgs, KeyArgs};
use crate::http::auth::{parse_revoked, Chain, JwtAuthenticator, JwtKeys};
use crate::http::tokenreview::TokenReviewAuthenticator;
use crate::http::{self, Authenticator, Gate};
use crate::runtime::admin::{self, Readiness};
use crate::runtime::limits;
use crate::runtime::listener;
use crate::runtime::metrics::Metrics;
use crate::runtime::reload::{self, Reloading};
use crate::runtime::shutdown::shutdown_signal;

/// `rollouts-dispatch serve`
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// `--config`
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Address of the API.
    #[arg(long, env = "ROLLOUTS_DISPATCH_LISTEN", default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// `--admin-listen`
    #[command(flatten)]
    pub admin: AdminArgs,
    /// PEM certificate chain of the API (with --tls-key); re-read when it changes on disk.
    /// Without both, `serve` refuses to start unless --listen is loopback or
    /// --insecure-plaintext is given.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the API; re-read when it changes on disk.
    #[arg(long, env = "ROLLOUTS_DISPATCH_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve the API in plain HTTP on a non-loopback address: only when TLS ends before this
    /// process (a service-mesh sidecar), since bearer tokens and Job specs cross in clear.
    #[arg(
        long,
        env = "ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT",
        conflicts_with = "tls_cert"
    )]
    pub insecure_plaintext: bool,
    /// `--jwt-key-file`, `--signing-key-file`.
    #[command(flatten)]
    pub keys: KeyArgs,
    /// Token ids (`jti`) that are refused.
    #[arg(
        long = "revoked-token",
        env = "ROLLOUTS_DISPATCH_REVOKED_TOKENS",
        value_delimiter = ','
    )]
    pub revoked_tokens: Vec<String>,
    /// File of revoked token ids: one `jti` per line, `#` comments; re-read when it changes on
    /// disk, so a revocation needs no restart (adds to --revoked-token).
    #[arg(long, env = "ROLLOUTS_DISPATCH_REVOKED_TOKENS_FILE")]
    pub revoked_tokens_file: Option<PathBuf>,
    /// Kubernetes users whose ServiceAccount tokens are accepted (checked by TokenReview), e.g.
    /// `system:serviceaccount:argo-rollouts:argo-rollouts`.
    #[arg(
        long = "token-review-allow",
        env = "ROLLOUTS_DISPATCH_TOKEN_REVIEW_ALLOW",
        value_delimiter = ','
    )]
    pub token_review_allow: Vec<String>,
    /// How long to wait for destinations to sync before reporting ready anyway.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub sync_timeout: Duration,
    /// Every this long, delete the Jobs whose AnalysisRun no longer exists on the control plane,
    /// or completed longer ago than `jobs.retention` (needs list on analysisruns there); only Jobs
    /// marked by this server; the same loop asks agents to delete the Jobs of their records
    /// finished longer ago than the records' retention. Default 5m when the control plane's
    /// credentials resolve or `agents` is configured; 0: off.
    #[arg(long, env = "ROLLOUTS_DISPATCH_SWEEP_ORPHANS_EVERY", value_parser = parse_duration)]
    pub sweep_orphans_every: Option<Duration>,
    /// The connection and request budgets of the API port.
    #[command(flatten)]
    pub budgets: limits::BudgetArgs,
    /// This replica's pod IP (chart: the downward API's `status.podIP`). With `agents.store:
    /// kubernetes`, a request for a Job's log on an agent destination is published with this IP
    /// and the --listen port, so that whichever replica the agent polls hands it out and an
    /// upload landing on another replica is forwarded here. Without it, the agent must poll the
    /// replica holding the reader (one replica).
    #[arg(long, env = "POD_IP")]
    pub pod_ip: Option<std::net::IpAddr>,
    /// The DNS name another replica's certificate is verified against when an agent's log
    /// upload is forwarded to it (the Service's name, e.g. `rollouts-dispatch.rollouts-dispatch.svc`;
    /// every replica serves the same certificate). Needed with --pod-ip and --tls-cert.
    #[arg(long, env = "ROLLOUTS_DISPATCH_PEER_NAME")]
    pub peer_name: Option<String>,
    /// PEM file of the CA that issued the replicas' certificate (a bundle of the old and new CA
    /// during a rotation; re-read when it changes): the only CAs trusted when forwarding an
    /// upload to another replica. Needed with --pod-ip and --tls-cert.
    #[arg(long, env = "ROLLOUTS_DISPATCH_PEER_CA_FILE")]
    pub peer_ca_file: Option<PathBuf>,
}

/// A budget flag: a whole number of at least 1.
/// Runs `rollouts-dispatch serve`; returns the exit code.
pub(super) async fn run(args: ServeArgs) -> ExitCode {
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %crate::http::Chain(e.as_ref()), "server stopped");
            ExitCode::FAILURE
        }
    }
}

/// Runs the server until SIGTERM or SIGINT.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let ServeArgs {
        config,
        listen,
        admin: AdminArgs { admin_listen },
        tls_cert,
        tls_key,
        insecure_plaintext,
        keys: KeyArgs {
            jwt_key_files,
            signing_key_files,
        },
        revoked_tokens,
        revoked_tokens_file,
        token_review_allow,
        sync_timeout,
        sweep_orphans_every,
        budgets,
        pod_ip,
        peer_name,
        peer_ca_file,
    } = args;
    let config = config.load()?;
    let confirm_runs = config.confirm_runs;
    let ui = config.ui.clone();
    let signer = Arc::new(signer(&signing_key_files, &jwt_key_files)?);
    info!(key_ids = %signer.key_ids().join(","), "Job references are signed");
    let work_key_ids: Vec<String> = signer
        .work_public_keys()
        .iter()
        .map(|k| k.id().to_string())
        .collect();
    info!(work_key_ids = %work_key_ids.join(","),
          "agent work is signed: agents pin these keys (`rollouts-dispatch work-keys`, --work-keys)");
    let callers = config
        .policy
        .as_ref()
        .map(|p| p.callers.clone())
        .unwrap_or_default();
    let peers = peer_transport(
        pod_ip.map(|ip| SocketAddr::new(ip, listen.port())),
        tls_cert.is_some(),
        peer_name,
        peer_ca_file,
    )?;
    let tls = match (&tls_cert, &tls_key) {
        (Some(c), Some(k)) => Some(listener::tls_config(c, k)?),
        _ => {
            let why = plaintext_allowed(listen, insecure_plaintext)?;
            warn!(%listen, allowed_by = why, "the API is plain HTTP");
            None
        }
    };
    let auth = authenticators(
        &jwt_key_files,
        revoked_tokens,
        revoked_tokens_file,
        token_review_allow,
        (callers, &config.origin),
    )
    .await?;
    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new("destinations are not synced yet");
    let admin_listener = TcpListener::bind(admin_listen)
        .await
        .with_context(|| format!("binding the admin port {admin_listen}"))?;
    let api_listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("binding the API port {listen}"))?;

    let engine = Engine::start(config).await?;
    let runs = confirming_runs(confirm_runs, &engine).await?;
    let people = people(&ui.people, &engine).await?;
    let shutdown = shutdown_signal();
    // The admin port stays plain HTTP: kubelet probes and Prometheus scrape it from inside the
    // cluster network, and it carries no token and no secret (liveness, readiness, counters).
    let admin = tokio::spawn(
        listener::serve(
            admin_listener,
            admin::router(readiness.clone(), metrics.clone()),
            None,
            shutdown.clone(),
        )
        .instrument(info_span!("admin", listen = %admin_listen)),
    );
    // The board's informer starts only here: without --pod-ip a replica publishes nothing.
    let log_peers = peers.and_then(|(me, transport)| {
        let site = engine.store().and_then(|s| s.shared_site())?;
        let board = Arc::new(LogBoard::start(site.client, &site.namespace, site.timeout));
        info!(%me, "log requests of agent destinations are shared with the other replicas");
        Some(PeerOptions {
            board,
            me,
            transport,
        })
    });
    let features = Features::new(
        engine.clone(),
        metrics.clone(),
        signer,
        Options {
            runs: runs.clone(),
            external_url: ui.external_url.clone(),
            log_peers,
        },
    );
    let counts = tokio::spawn({
        let (measure, agents) = (features.measure.clone(), features.agents.clone());
        async move {
            loop {
                measure.publish_job_counts();
                agents.publish_agents();
                tokio::time::sleep(std::time::Duration::from_secs(15)).await;
            }
        }
        .instrument(info_span!("publish_gauges"))
    });
    let deletions =
        super::deletions::spawn(engine.clone(), metrics.clone(), super::deletions::EVERY);
    // With agents but no control plane the loop still runs: it expires finished agent records.
    let sweeper = super::sweep::interval(
        sweep_orphans_every,
        engine.has_control_plane() || engine.store().is_some(),
    )
    .map(|every| {
        super::sweep::spawn(
            engine.clone(),
            runs.clone(),
            features.applications.clone(),
            metrics.clone(),
            every,
        )
    });
    // Open long polls of agents answer at once on shutdown, so that the drain does not wait.
    tokio::spawn({
        let agents = features.agents.clone();
        let shutdown = shutdown.clone();
        async move {
            shutdown.await;
            agents.stop_polls();
        }
        .instrument(info_span!("release_polls_at_shutdown"))
    });
    // The pages' logins live in this replica's memory (`http::sessions`).
    let sessions = Arc::new(http::sessions::Sessions::new(ui.sessions));
    let gate = Gate {
        auth,
        people,
        sessions,
    };
    let router = app::router(&features, gate, metrics.clone());
    let router = limits::Budgets::new(&budgets, metrics.clone()).around(router);
    open_files_for(budgets.max_connections);
    let api = tokio::spawn(
        listener::serve_limited(
            api_listener,
            router,
            tls,
            shutdown.clone(),
            Some(budgets.max_connections),
        )
        .instrument(
            info_span!("api", %listen, max_connections = budgets.max_connections,
                               max_concurrent_requests = budgets.max_concurrent_requests,
                               max_agent_polls = budgets.max_agent_polls),
        ),
    );

    if let Some(store) = engine.store() {
        if !store.wait_synced(sync_timeout).await {
            warn!("the DispatchJob store is not synced yet (is the CRD installed and may the server list dispatchjobs?); serving anyway");
        }
    }
    let unsynced = engine.wait_synced(sync_timeout).await;
    if unsynced.is_empty() {
        info!("all destinations synced");
    } else {
        warn!(destinations = %unsynced.join(","), "not synced yet; serving anyway, their calls will be retried");
    }
    if let Some(runs) = &runs {
        if !runs.wait_synced(sync_timeout).await {
            warn!("the watch of analysisruns on the control plane has not listed them yet (may the server list and watch analysisruns.argoproj.io there?); serving anyway, measurement requests are answered 503 until it has");
        }
    }
    readiness.set_ready();
    let follow = runs.clone().map(|runs| {
        tokio::spawn(
            follow_control_plane(runs, readiness.clone(), {
                let agents = features.agents.clone();
                move |unanswered| agents.set_control_plane_unanswered(unanswered)
            })
            .instrument(tracing::info_span!("control_plane_readiness")),
        )
    });
    shutdown.await;
    if let Some(f) = follow {
        f.abort();
    }
    readiness.set_unready("shutting down");
    counts.abort();
    deletions.abort();
    if let Some(s) = sweeper {
        s.abort();
    }
    let (a, b) = tokio::join!(api, admin);
    a??;
    b??;
    info!("stopped");
    Ok(())
}

/// How often readiness looks at whether the control plane answers.
const READINESS_EVERY: Duration = Duration::from_secs(1);

/// Keeps the replica unready while the control plane leaves a live read of a run unanswered
/// (`runs/read.rs`): such a replica cannot confirm runs, and every request it takes is a retry
/// for its caller, so a Service should send them to the other replicas (issue #32, `make
/// faults`' replica cut from the control plane); agents polling it are answered 503 so that
/// they connect again. Ready again at the control plane's next answer.
async fn follow_control_plane(
    runs: Runs,
    readiness: Readiness,
    agents_refused: impl Fn(bool) + Send + 'static,
) {
    let mut unready = false;
    loop {
        tokio::time::sleep(READINESS_EVERY).await;
        match runs.control_plane_unanswered_since() {
            Some(since) if !unready => {
                unready = true;
                warn!(
                    silent_for_s = since.elapsed().as_secs(),
                    "unready: the control plane did not answer a read of an AnalysisRun; this \
                     replica cannot confirm measurement requests until it answers"
                );
                readiness.set_unready(
                    "the control plane does not answer (a read of an AnalysisRun timed out)",
                );
                agents_refused(true);
            }
            None if unready => {
                unready = false;
                info!("ready again: the control plane answers");
                readiness.set_ready();
                agents_refused(false);
            }
            _ => {}
        }
    }
}

/// The watch of the control plane's AnalysisRuns that confirms every measurement request
/// (`confirmRuns`), or `None` when runs are not confirmed, the reason logged once here.
pub async fn confirming_runs(
    confirm: ConfirmRuns,
    engine: &Engine,
) -> anyhow::Result<Option<Runs>> {
    if let Some(why) = confirm.not_confirmed_because() {
        warn!(
            reason = why,
            "AnalysisRuns are not confirmed: a measurement request is served for \
              whichever run it names (the policy, the caller's projects and the signed Job \
              references still apply)"
        );
        return Ok(None);
    }
    let client = engine.control_plane_client().await.context(
        "`confirmRuns` watches the AnalysisRuns of the control plane: fix `controlPlane`, or set \
         `confirmRuns: false`",
    )?;
    info!("measurement requests are confirmed against the control plane's AnalysisRuns");
    Ok(Some(Runs::watch(client)))
}

/// The people of the control plane who may read logs and pages (`ui.people`): their tokens
/// reviewed and their access decided by its apiserver; [`http::viewer::People::Nobody`] when the config
/// accepts none (no `controlPlane`, or `tokenReview: false` and no proxy).
pub async fn people(
    config: &crate::config::PeopleConfig,
    engine: &Engine,
) -> anyhow::Result<Arc<http::viewer::People>> {
    if !config.token_review && config.proxy.is_none() {
        info!("people are not recognised (ui.people): only service tokens read logs and pages");
        return Ok(Arc::new(http::viewer::People::Nobody));
    }
    let client = engine.control_plane_client().await.context(
        "`ui.people` reviews people's tokens and access on the control plane: fix          `controlPlane`, or set `ui.people.tokenReview: false` and remove `ui.people.proxy`",
    )?;
    info!(
        token_review = config.token_review,
        proxy = config.proxy.is_some(),
        "people of the control plane may read the logs of the runs they may get"
    );
    Ok(Arc::new(
        http::people::ControlPlanePeople::new(client, config.clone()).into(),
    ))
}

/// Raises the open-file limit to fit `max_connections` (each connection is a file descriptor)
/// and the server's own files, or says which limit is short.
fn open_files_for(max_connections: usize) {
    // Watch streams, kube clients, log files, the admin port: a margin beside the connections.
    let wanted = max_connections as u64 + 512;
    match limits::raise_open_files(wanted) {
        Some(limit) if limit >= wanted => {}
        Some(limit) => warn!(
            open_files = limit,
            wanted,
            max_connections,
            "the open-file limit (RLIMIT_NOFILE, hard) is below --max-connections plus the \
             server's own files: accepts fail before the connection budget is reached; raise the \
             limit (the container runtime's nofile) or lower --max-connections"
        ),
        None => warn!("cannot read the open-file limit (RLIMIT_NOFILE)"),
    }
}

/// The signer of Job references: the `--signing-key-file` keys, else one derived from each JWT
/// key (`signing::derive_from_jwt_key`), so a deployment with JWT keys only keeps working and its
/// replicas agree. Either way the keys follow their files without a restart.
pub(super) fn signer(
    signing_key_files: &[PathBuf],
    jwt_key_files: &[PathBuf],
) -> anyhow::Result<Signer> {
    signer_every(signing_key_files, jwt_key_files, reload::CHECK_EVERY)
}

/// [`signer`] with the key files looked at most once per `every`.
fn signer_every(
    signing_key_files: &[PathBuf],
    jwt_key_files: &[PathBuf],
    every: Duration,
) -> anyhow::Result<Signer> {
    let read = |p: &std::path::Path| crate::token::read_key_if_any(p);
    if !signing_key_files.is_empty() {
        let signer = Signer::from_files_every(signing_key_files, KeyFiles::Signing, read, every)
            .context("--signing-key-file")?;
        warn_keyless("--signing-key-file", signing_key_files);
        return Ok(signer);
    }
    if jwt_key_files.is_empty() {
        bail!(
            "refusing to start without a key to sign Job references with: give \
             --signing-key-file (or $ROLLOUTS_DISPATCH_SIGNING_KEY_FILES), or --jwt-key-file \
             from which the signing key is derived; every replica needs the same key"
        );
    }
    Signer::from_files_every(jwt_key_files, KeyFiles::DerivedFromJwt, read, every)
        .context("--jwt-key-file")
}

/// Says at start which key files of `flag` hold no key (empty or absent): allowed, as the slot a
/// key rotation writes the next key into, but a typo in a path would otherwise go unnoticed.
fn warn_keyless(flag: &str, files: &[PathBuf]) {
    for file in files {
        if matches!(crate::token::read_key_if_any(file), Ok(None)) {
            warn!(flag, file = %file.display(), "this key file holds no key (empty or absent): \
                  a key written into it later is taken without a restart");
        }
    }
}

/// How this replica reaches the others for agents' log uploads (`--pod-ip`): `None` without a
/// pod IP; with TLS, `--peer-name` and `--peer-ca-file` are required.
fn peer_transport(
    me: Option<SocketAddr>,
    tls: bool,
    name: Option<String>,
    ca_file: Option<PathBuf>,
) -> anyhow::Result<Option<(SocketAddr, PeerTransport)>> {
    let Some(me) = me else {
        return Ok(None);
    };
    if !tls {
        return Ok(Some((me, PeerTransport::Plain)));
    }
    match (name, ca_file) {
        (Some(name), Some(ca)) => Ok(Some((me, PeerTransport::tls(&name, &ca)?))),
        _ => bail!(
            "--pod-ip with --tls-cert needs --peer-name (the DNS name of the replicas' \
             certificate, e.g. the Service's <name>.<namespace>.svc) and --peer-ca-file (the CA \
             that issued it): an agent's log upload is forwarded to the replica holding the \
             reader only over TLS verified that way. Chart: tls.enabled with a CA it knows \
             (tls.generated, or tls.caBundle)"
        ),
    }
}

/// Why the API may be served in plain HTTP on `listen` (a loopback address, or the explicit
/// flag), or the error that says how to serve it over TLS.
fn plaintext_allowed(listen: SocketAddr, insecure_plaintext: bool) -> anyhow::Result<&'static str> {
    if listen.ip().is_loopback() {
        Ok("a loopback --listen address (no other host can connect)")
    } else if insecure_plaintext {
        Ok("--insecure-plaintext")
    } else {
        bail!(
            "refusing to serve the API in plain HTTP on {listen}: bearer tokens and the Jobs that \
             agents run would cross the network in clear. Give --tls-cert and --tls-key (chart: \
             tls.enabled=true with tls.secretName), or, only when TLS ends before this process (a \
             mesh sidecar), --insecure-plaintext (ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT=true; chart: \
             tls.insecurePlaintext=true). A loopback --listen such as 127.0.0.1:8443 is always allowed."
        )
    }
}

async fn authenticators(
    jwt_key_files: &[PathBuf],
    revoked: Vec<String>,
    revoked_file: Option<PathBuf>,
    token_review_allow: Vec<String>,
    (callers, origin): (Vec<CallerBinding>, &str),
) -> anyhow::Result<Arc<Chain>> {
    let mut chain: Vec<Authenticator> = Vec::new();
    if !token_review_allow.is_empty() {
        let client = kube::Client::try_default()
            .await
            .context("--token-review-allow needs a Kubernetes client for TokenReviews (in-cluster or $KUBECONFIG)")?;
        let review = TokenReviewAuthenticator::new(client, Vec::new(), token_review_allow)
            .with_callers(callers, origin);
        // Callers fail closed (#27): an identity no entry binds would be refused on every
        // request; say so now, with the entry to add.
        if let Some(user) = review.unbound().first() {
            bail!(
                "--token-review-allow {user} matches no `policy.callers` entry in {origin}, so \
                 it could act for no Kargo project and every request of it would be refused: \
                 add `policy: {{callers: [{{subject: \"{user}\", projects: [\"*\"]}}]}}` \
                 (the Rollouts controller serves every namespace) or the projects it serves \
                 (chart: config.policy.callers)"
            );
        }
        chain.push(review.into());
    }
    if !jwt_key_files.is_empty() {
        chain.push(
            jwt_authenticator(jwt_key_files, revoked, revoked_file, reload::CHECK_EVERY)?.into(),
        );
    } else if revoked_file.is_some() {
        bail!("--revoked-tokens-file revokes JWTs, but no --jwt-key-file is given");
    }
    if chain.is_empty() {
        bail!("refusing to start without authentication: set --jwt-key-file and/or --token-review-allow");
    }
    Ok(Arc::new(Chain(chain)))
}

/// The JWT check of `serve`: the HS256 keys of `key_files` and the ids of `revoked` and of
/// `revoked_file` (one `jti` per line, `#` comments), the files looked at most once per `every`
/// and re-read when they change.
pub fn jwt_authenticator(
    key_files: &[PathBuf],
    revoked: Vec<String>,
    revoked_file: Option<PathBuf>,
    every: Duration,
) -> anyhow::Result<JwtAuthenticator> {
    // A file without a key (empty, or a key taken out of the Secret) adds none, so a rotation
    // drops the old key by emptying its file; a half-written key keeps the keys in force.
    let keys = Reloading::new(
        "jwt keys",
        key_files.to_vec(),
        every,
        |files: &[PathBuf]| {
            crate::token::read_keys(files).map(|secrets| JwtKeys::from_secrets(&secrets))
        },
    )
    .context("--jwt-key-file")?;
    warn_keyless("--jwt-key-file", key_files);
    let revoked_file = revoked_file
        .map(|file| {
            Reloading::new(
                "revoked tokens",
                vec![file.clone()],
                every,
                |files: &[PathBuf]| std::fs::read_to_string(&files[0]).map(|t| parse_revoked(&t)),
            )
            .with_context(|| format!("reading --revoked-tokens-file {}", file.display()))
        })
        .transpose()?;
    Ok(JwtAuthenticator::reloading(keys, revoked, revoked_file))
}

#[cfg(test)]
mod rotation_tests;

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::signing::{self, JOB_REF};

    fn key_file(dir: &std::path::Path, name: &str, key: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, key).unwrap();
        path
    }

    #[test]
    fn the_signing_key_comes_from_its_flag_else_from_the_jwt_keys_else_nowhere() {
        let dir = std::env::temp_dir().join(format!("rd-serve-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let jwt = b"jwt-key-0123456789abcdef0123456789abcdef";
        let own = b"own-signing-key-0123456789abcdef01234567";
        let (jwt_file, own_file) = (key_file(&dir, "jwt", jwt), key_file(&dir, "own", own));

        let derived = signer(&[], std::slice::from_ref(&jwt_file)).unwrap();
        assert_eq!(
            derived.key_ids(),
            vec![signing::key_id(&signing::derive_from_jwt_key(jwt))]
        );
        let explicit = signer(
            std::slice::from_ref(&own_file),
            std::slice::from_ref(&jwt_file),
        )
        .unwrap();
        assert_eq!(explicit.key_ids(), vec![signing::key_id(own)]);
        // Replicas with the same JWT key agree without a key of their own.
        let again = signer(&[], &[jwt_file]).unwrap();
        again
            .verify(JOB_REF, b"m", &derived.sign(JOB_REF, b"m"))
            .unwrap();

        let e = format!("{:#}", signer(&[], &[]).unwrap_err());
        assert!(
            e.contains("--signing-key-file") && e.contains("--jwt-key-file"),
            "{e}"
        );
        let short = key_file(&dir, "short", b"short");
        let e = format!("{:#}", signer(&[short], &[]).unwrap_err());
        assert!(e.contains("at least 32"), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn plain_http_needs_loopback_or_the_flag() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        for loopback in ["127.0.0.1:8443", "127.9.9.9:1", "[::1]:8443"] {
            assert!(
                plaintext_allowed(addr(loopback), false).is_ok(),
                "{loopback}"
            );
        }
        for open in ["0.0.0.0:8443", "10.1.2.3:8443", "[::]:8443"] {
            let e = plaintext_allowed(addr(open), false)
                .unwrap_err()
                .to_string();
            for named in [
                "--tls-cert",
                "--tls-key",
                "--insecure-plaintext",
                "ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT",
                "tls.enabled",
                "tls.insecurePlaintext",
            ] {
                assert!(e.contains(named), "{open}: {e} does not name {named}");
            }
            assert_eq!(
                plaintext_allowed(addr(open), true).unwrap(),
                "--insecure-plaintext"
            );
        }
    }

    #[test]
    fn missing_key_or_revocation_files_name_their_flag() {
        let dir = std::env::temp_dir().join(format!("rd-serve-jwt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("jwt.key");
        std::fs::write(&key, "a-serve-test-signing-key-0123456789abcdef").unwrap();
        let every = Duration::from_millis(10);
        let e = jwt_authenticator(&[dir.join("absent.key")], Vec::new(), None, every)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(e.contains("--jwt-key-file"), "{e}");
        let e = jwt_authenticator(
            std::slice::from_ref(&key),
            Vec::new(),
            Some(dir.join("absent")),
            every,
        )
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
        assert!(e.contains("--revoked-tokens-file"), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn signing_key_files_are_a_comma_list() {
        #[derive(Parser)]
        struct Wrap {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let w = Wrap::try_parse_from(["x", "--signing-key-file", "new,old", "--jwt-key-file", "j"])
            .unwrap();
        assert_eq!(
            w.serve.keys.signing_key_files,
            vec![PathBuf::from("new"), PathBuf::from("old")]
        );
    }

    #[test]
    fn insecure_plaintext_and_a_certificate_exclude_each_other() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            args: ServeArgs,
        }
        let e = Cmd::try_parse_from([
            "serve",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--insecure-plaintext",
        ])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("--insecure-plaintext"), "{e}");
        let ok = Cmd::try_parse_from(["serve", "--insecure-plaintext"]).unwrap();
        assert!(ok.args.insecure_plaintext);
    }
}
