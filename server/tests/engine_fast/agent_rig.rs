//! The rig of the agent log tests (`engine_fast/agent_logs.rs`, `attacks/agent_logs.rs`): the
//! engine of fake clusters behind the real `/v1` router with the dispatcher at hand (to ask for
//! logs as the log API does), two agent destinations (`edge`, `edge2`) whose agent tokens it
//! issues, and a Job's pods and logs on fake cluster `a`, the agent's cluster.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use base64::Engine as _;
use dispatch_api::agent::{DispatchJobSpec, WorkItem};
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_api::logs::LogRequest;
use dispatch_server::dispatch::EngineDispatcher;
use dispatch_server::http::auth::JwtAuthenticator;
use dispatch_server::http::{self as api_http, AppState};
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

/// The dispatcher of `w` behind the real `/v1` router on a loopback port.
pub(crate) struct Rig {
    pub(crate) w: World,
    pub(crate) dispatcher: Arc<EngineDispatcher>,
    pub(crate) addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Rig {
    pub(crate) async fn start() -> Result<Self> {
        let w = World::start(AGENTS).await?;
        let signer = dispatch_server::signing::Signer::derived_from_jwt_keys(&[KEY.to_vec()])?;
        let metrics = Arc::new(Metrics::new());
        let dispatcher = Arc::new(EngineDispatcher::new(
            w.engine.clone(),
            metrics.clone(),
            Arc::new(signer),
        ));
        let state = AppState {
            dispatcher: dispatcher.clone(),
            auth: Arc::new(JwtAuthenticator::new(&[KEY.to_vec()], [])),
            people: Arc::new(dispatch_server::http::viewer::NoPeople),
            metrics,
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = api_http::router(state);
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            w,
            dispatcher,
            addr,
            server,
        })
    }

    /// The agent token of `destination`.
    pub(crate) fn agent_token(destination: &str) -> Result<String> {
        let subject = format!("agent:{destination}");
        let ttl = Duration::from_secs(600);
        Ok(dispatch_server::token::issue_token(KEY, &subject, Some(destination), ttl)?.0)
    }

    /// A plugin token acting for every project.
    pub(crate) fn plugin_token() -> Result<String> {
        let ttl = Duration::from_secs(600);
        Ok(dispatch_server::token::issue_token(KEY, "plugin", None, ttl)?.0)
    }

    /// An agent's client of the rig, with the agent token of `destination`.
    pub(crate) fn agent_client(&self, destination: &str) -> Result<ServerClient> {
        let token = Self::agent_token(destination)?;
        let file = std::env::temp_dir().join(format!(
            "rd-agent-logs-{}-{}-{destination}",
            std::process::id(),
            self.addr.port()
        ));
        std::fs::write(&file, token)?;
        Ok(ServerClient::new(&ClientConfig {
            server: format!("http://{}", self.addr),
            token_file: Some(file),
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?)
    }
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
        },
        reported: true,
    }
}

/// Two attempts of `JOB` on the agent's cluster (fake `a`), the second reading Secret `db`;
/// each printed `lines` numbered lines, one of them the Secret's value.
pub(crate) fn job_pods(w: &World, lines: usize) {
    let api = w.api("a");
    api.put(
        &Res::new("v1", "secrets"),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": NS},
               "data": {"password": base64::engine::general_purpose::STANDARD.encode(PASSWORD)}}),
    );
    for (n, at) in [(1, "2026-01-01T00:00:00Z"), (2, "2026-01-01T00:01:00Z")] {
        let pod = format!("{JOB}-{n}");
        api.put(
            &pods(),
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": pod, "namespace": NS, "creationTimestamp": at,
                                "labels": {"job-name": JOB}},
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
