//! The rig of the agent log tests (`engine_fast/agent_logs.rs`, `attacks/agent_logs.rs`): the
//! engine of fake clusters behind the real `/v1` router with the dispatcher at hand (to ask for
//! logs as the log API does), two agent destinations (`edge`, `edge2`) whose agent tokens it
//! issues, and a Job's pods and logs on fake cluster `a`, the agent's cluster.
//!
//! [`Rig::start_replicated`] adds a second replica (its own dispatcher and router over the same
//! engine): both publish their log requests on a `LogBoard` of fake cluster `a`'s API (as the
//! Kubernetes store does on the control plane) and forward uploads to each other in plain HTTP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use base64::Engine as _;
use dispatch_api::agent::{DispatchJobSpec, WorkItem, WorkReply, WorkRequest};
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_api::logs::LogRequest;
use dispatch_server::app::{self, Features, Options, PeerOptions};
use dispatch_server::http::auth::JwtAuthenticator;
use dispatch_server::http::Gate;
use dispatch_server::logs::board::LogBoard;
use dispatch_server::logs::peers::PeerTransport;
use dispatch_server::runtime::metrics::Metrics;
use serde_json::json;

use crate::cluster_side::pods;
use crate::fake_api::Res;
use crate::world::{World, NS};

const AGENTS: &str =
    "agents: {store: memory, offlineAfter: 60s, destinations: [{name: edge, namespace: verify}]}";
pub(crate) const KEY: &[u8] = b"agent-logs-test-key-0123456789abcdef0123";
pub(crate) const JOB: &str = "verify-smoke-1";
pub(crate) const PASSWORD: &str = "pa55-w0rd-of-the-agent-cluster";

/// The features of `w` behind the real `/v1` router on a loopback port.
pub(crate) struct Rig {
    pub(crate) w: World,
    pub(crate) features: Arc<Features>,
    pub(crate) addr: SocketAddr,
    /// serves the router (stopped when dropped)
    _replica: Replica,
}

/// Another replica of a rig's engine: its features behind the real router.
pub(crate) struct Replica {
    pub(crate) features: Arc<Features>,
    pub(crate) addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The namespace of the published log requests on fake cluster `a`.
pub(crate) const BOARD_NAMESPACE: &str = "rollouts-dispatch";

impl Replica {
    /// The features of `w`'s engine behind the real router on a loopback port; with `board`,
    /// its log requests are published there and uploads forwarded in plain HTTP.
    pub(crate) async fn start(w: &World, board: Option<Arc<LogBoard>>) -> Result<Self> {
        Self::start_with(w, board, PeerTransport::Plain).await
    }

    /// [`Replica::start`] reaching the other replicas through `transport`.
    pub(crate) async fn start_with(
        w: &World,
        board: Option<Arc<LogBoard>>,
        transport: PeerTransport,
    ) -> Result<Self> {
        let signer = dispatch_server::signing::Signer::derived_from_jwt_keys(&[KEY.to_vec()])?;
        let metrics = Arc::new(Metrics::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let options = Options {
            log_peers: board.map(|board| PeerOptions {
                board,
                me: addr,
                transport,
            }),
            ..Options::default()
        };
        let features = Arc::new(Features::new(
            w.engine.clone(),
            metrics.clone(),
            Arc::new(signer),
            options,
        ));
        let gate = Gate {
            auth: Arc::new(JwtAuthenticator::new(&[KEY.to_vec()], []).into()),
            people: Arc::new(dispatch_server::http::viewer::People::Nobody),
            sessions: Arc::default(),
        };
        let router = app::router(&features, gate, metrics);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            features,
            addr,
            server,
        })
    }
}

/// A board of the published log requests on fake cluster `a`, read by its own informer.
pub(crate) fn board(w: &World) -> Result<Arc<LogBoard>> {
    let client = w.engine.client_of("a").context("cluster a")?;
    Ok(Arc::new(LogBoard::start(
        client,
        BOARD_NAMESPACE,
        Duration::from_secs(5),
    )))
}

impl Rig {
    pub(crate) async fn start() -> Result<Self> {
        let w = World::start(AGENTS).await?;
        let replica = Replica::start(&w, None).await?;
        Ok(Self::of(w, replica))
    }

    /// A rig whose replica (the reader's) shares its log requests with a second replica
    /// (returned): each has its own board on fake cluster `a`.
    pub(crate) async fn start_replicated() -> Result<(Self, Replica)> {
        let w = World::start(AGENTS).await?;
        let one = Replica::start(&w, Some(board(&w)?)).await?;
        let two = Replica::start(&w, Some(board(&w)?)).await?;
        Ok((Self::of(w, one), two))
    }

    fn of(w: World, replica: Replica) -> Self {
        Self {
            w,
            features: replica.features.clone(),
            addr: replica.addr,
            _replica: replica,
        }
    }

    /// The agent token of `destination`.
    pub(crate) fn agent_token(destination: &str) -> Result<String> {
        let subject = format!("agent:{destination}");
        let ttl = Duration::from_secs(600);
        Ok(dispatch_server::token::issue_token(KEY, &subject, Some(destination), ttl)?.0)
    }

    /// A plugin token acting for every project (`projects: ["*"]`).
    pub(crate) fn plugin_token() -> Result<String> {
        let ttl = Duration::from_secs(600);
        let every = ["*".to_string()];
        Ok(dispatch_server::token::issue_token_for(KEY, "plugin", None, Some(&every), ttl)?.0)
    }

    /// An agent's client of the rig, with the agent token of `destination`.
    pub(crate) fn agent_client(&self, destination: &str) -> Result<ServerClient> {
        Self::agent_client_of(self.addr, destination)
    }

    /// An agent's client of the replica at `addr`, with the agent token of `destination`.
    pub(crate) fn agent_client_of(addr: SocketAddr, destination: &str) -> Result<ServerClient> {
        let token = Self::agent_token(destination)?;
        let file = std::env::temp_dir().join(format!(
            "rd-agent-logs-{}-{}-{destination}",
            std::process::id(),
            addr.port()
        ));
        std::fs::write(&file, token)?;
        Ok(ServerClient::new(&ClientConfig {
            server: format!("http://{addr}"),
            token_file: Some(file),
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?)
    }
}

/// One long poll of the agent of `edge` through `client`: its work with `fingerprint`, waiting
/// up to `wait_seconds` for a change.
pub(crate) async fn poll(
    client: &ServerClient,
    fingerprint: &str,
    wait_seconds: u32,
) -> Result<WorkReply> {
    let path = dispatch_api::agent::path(dispatch_api::agent::WORK, "edge");
    let req = WorkRequest {
        fingerprint: fingerprint.to_string(),
        wait_seconds,
    };
    Ok(client.post(&path, &req).await?)
}

/// The record the agent of `edge` runs `JOB` for.
pub(crate) fn record() -> WorkItem {
    WorkItem {
        name: format!("{JOB}.edge"),
        spec: DispatchJobSpec {
            destination: "edge".into(),
            namespace: NS.into(),
            job_name: JOB.into(),
            run_uid: "uid-1".into(),
            run: "team-a/uat.verify.1".into(),
            metric: "smoke".into(),
            measurement: 1,
            log_tail: 0,
            job: None,
            delete: false,
            observe: None,
            sync: None,
            ..DispatchJobSpec::default()
        },
        reported: true,
    }
}

/// The uid of `JOB` on the agent's cluster.
const JOB_UID: &str = "0d5c1f7e-job-uid";

/// What the pod that only wears `JOB`'s `job-name` label prints.
pub(crate) const IMPOSTOR_LINE: &str = "impostor line: not the Job's\n";

/// Two attempts of `JOB` on the agent's cluster (fake `a`), the second reading Secret `db`;
/// each printed `lines` numbered lines, one of them the Secret's value; and a pod not of the Job
/// that wears its `job-name` label.
pub(crate) fn job_pods(w: &World, lines: usize) {
    let api = w.api("a");
    api.put(
        &Res::new("v1", "secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": NS},
               "data": {"password": base64::engine::general_purpose::STANDARD.encode(PASSWORD)}}),
    );
    api.put(
        &Res::new("batch/v1", "jobs"),
        json!({"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": JOB, "namespace": NS, "uid": JOB_UID}}),
    );
    // A pod someone else created with the Job's `job-name` label: never part of its log.
    api.put(
        &pods(),
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": format!("{JOB}-impostor"), "namespace": NS,
                            "creationTimestamp": "2026-01-01T00:00:30Z", "labels": {"job-name": JOB}},
               "spec": {"containers": [{"name": "check", "image": "example.invalid/c:1"}]}}),
    );
    api.set_log(NS, &format!("{JOB}-impostor"), "check", IMPOSTOR_LINE);
    for (n, at) in [(1, "2026-01-01T00:00:00Z"), (2, "2026-01-01T00:01:00Z")] {
        let pod = format!("{JOB}-{n}");
        api.put(
            &pods(),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod, "namespace": NS, "creationTimestamp": at,
                                "labels": {"job-name": JOB},
                                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                    "name": JOB, "uid": JOB_UID, "controller": true}]},
                   "spec": {"containers": [{"name": "check", "image": "example.invalid/c:1",
                            "env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}]}}),
        );
        let text: String = (1..=lines)
            .map(|i| {
                if i == 2 {
                    format!("attempt {n} line {i:06} password={PASSWORD}\n")
                } else {
                    format!("attempt {n} line {i:06}\n")
                }
            })
            .collect();
        api.set_log(NS, &pod, "check", &text);
    }
}

/// A log request for `JOB` (the id is the relay's to set).
pub(crate) fn request(follow: bool) -> LogRequest {
    LogRequest {
        id: String::new(),
        namespace: NS.into(),
        job: JOB.into(),
        container: None,
        follow,
    }
}
