//! The scene of an attack: the engine on fake clusters (`a`, `b`, control plane; see
//! `engine_fast/world.rs`) behind the real `/v1` router, served on a loopback port, and the
//! tokens of every kind of caller.
//!
//! Each case builds its own scene, so cases share nothing and run in parallel. A scene serves
//! every request whatever run it names unless it is started with [`Scene::serve_confirming`]
//! (`confirmRuns`: the runs must then exist as AnalysisRuns on the fake control plane).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{Context, Result};
use dispatch_server::app::{router_over, Options};
use dispatch_server::http::auth::{self, Claims, JwtAuthenticator};
use dispatch_server::http::Gate;
use dispatch_server::runtime::limits::{BudgetArgs, Budgets};
use dispatch_server::runtime::metrics::Metrics;
use serde_json::Value;

use crate::world::World;

/// The server's JWT key in every scene.
pub(crate) const KEY: &[u8] = b"attack-scene-signing-key-0123456789abcdef";
/// A revoked token id.
pub(crate) const REVOKED_JTI: &str = "revoked-1";

/// An engine behind the API on a loopback port.
pub(crate) struct Scene {
    pub(crate) world: World,
    pub(crate) addr: SocketAddr,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Scene {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// The reply to one call: status code and JSON body (`Null` when the body is not JSON).
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Value,
}

impl Scene {
    /// The default engine configuration plus `extra` top-level keys, behind the API.
    pub(crate) async fn start(extra: &str) -> Result<Self> {
        let jwt = JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]);
        Self::start_with_auth(extra, Arc::new(jwt.into())).await
    }

    /// [`Scene::start`] with the authenticator `auth` (e.g. TokenReview, then JWTs).
    pub(crate) async fn start_with_auth(extra: &str, auth: Arc<auth::Chain>) -> Result<Self> {
        Self::serve_with(World::start(extra).await?, auth, Arc::new(Metrics::new())).await
    }

    /// `world`'s engine behind the API, with the authenticator `auth` and the metrics `metrics`
    /// (a case that reads them keeps a clone).
    pub(crate) async fn serve_with(
        world: World,
        auth: Arc<auth::Chain>,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        Self::serve_dispatcher(world, auth, metrics, None, None).await
    }

    /// [`Scene::start`] behind the request budgets `budgets`, as `serve` wires them.
    pub(crate) async fn start_budgeted(extra: &str, budgets: BudgetArgs) -> Result<Self> {
        let jwt = JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]);
        let world = World::start(extra).await?;
        Self::serve_dispatcher(
            world,
            Arc::new(jwt.into()),
            Arc::new(Metrics::new()),
            None,
            Some(budgets),
        )
        .await
    }

    /// `world`'s engine behind the request budgets `budgets` as `serve` wires them, its
    /// requests confirmed by `runs` (which the log API finds runs in), counted in `metrics`.
    pub(crate) async fn serve_budgeted(
        world: World,
        runs: Option<dispatch_server::runs::Runs>,
        budgets: BudgetArgs,
        metrics: Arc<Metrics>,
    ) -> Result<Self> {
        let jwt = JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]);
        Self::serve_dispatcher(world, Arc::new(jwt.into()), metrics, runs, Some(budgets)).await
    }

    /// `world`'s engine (its configuration was the default plus `extra`) behind the API the
    /// way `serve` wires it with `confirmRuns`: every measurement request is confirmed against
    /// the AnalysisRuns of the fake control plane `world.clusters.cp`, watched from now on
    /// (`cmd::serve::confirming_runs`). Script the control plane before calling this.
    pub(crate) async fn serve_confirming(world: World, extra: &str) -> Result<Self> {
        let yaml = world.clusters.config("", extra);
        let config = dispatch_server::config::ServerConfig::parse(&yaml, "scene.yaml")?;
        let runs = dispatch_server::cmd::serve::confirming_runs(config.confirm_runs, &world.engine)
            .await?;
        let jwt = JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]);
        Self::serve_dispatcher(
            world,
            Arc::new(jwt.into()),
            Arc::new(Metrics::new()),
            runs,
            None,
        )
        .await
    }

    /// `world`'s engine behind the API, its requests confirmed by `runs` and held to `budgets`
    /// when given.
    async fn serve_dispatcher(
        world: World,
        auth: Arc<auth::Chain>,
        metrics: Arc<Metrics>,
        runs: Option<dispatch_server::runs::Runs>,
        budgets: Option<BudgetArgs>,
    ) -> Result<Self> {
        let gate = Gate {
            auth,
            people: Arc::new(dispatch_server::http::viewer::People::Nobody),
            sessions: Arc::default(),
        };
        let options = Options {
            runs,
            ..Options::default()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let router = router_over(
            world.engine.clone(),
            metrics.clone(),
            Arc::new(signer()),
            options,
            gate,
        );
        let router = match budgets {
            Some(b) => Budgets::new(&b, metrics).around(router),
            None => router,
        };
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        Ok(Self {
            world,
            addr,
            http: reqwest::Client::new(),
            server,
        })
    }

    /// The calls on destinations `a` and `b` that an attack could cause: writes, deletes and log
    /// reads. (The watch caches' own lists and watches come and go in the background.)
    pub(crate) fn destination_calls(&self) -> Vec<String> {
        let mut calls = Vec::new();
        for (name, api) in [("a", &self.world.clusters.a), ("b", &self.world.clusters.b)] {
            for r in api.requests() {
                if r.method != "GET" || r.path.ends_with("/log") {
                    calls.push(format!("{name}: {} {}?{}", r.method, r.path, r.query));
                }
            }
        }
        calls
    }

    /// `method path` with `token` (if any) and a JSON `body` (for POST).
    pub(crate) async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &Value,
    ) -> Result<Reply> {
        let url = format!("http://{}{path}", self.addr);
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut req = self.http.request(method.clone(), &url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if method == reqwest::Method::POST {
            req = req.json(body);
        }
        let resp = req
            .send()
            .await
            .with_context(|| format!("calling {path}"))?;
        let status = resp.status().as_u16();
        let body = resp.json::<Value>().await.unwrap_or(Value::Null);
        Ok(Reply { status, body })
    }
}

/// The scene server's signer of Job references: derived from its JWT key, as `serve` does
/// without `--signing-key-file`. Tests use it to forge references signed with the genuine key.
pub(crate) fn signer() -> dispatch_server::signing::Signer {
    dispatch_server::signing::Signer::derived_from_jwt_keys(&[KEY.to_vec()])
        .expect("the scene key is usable")
}

/// A token signed with the scene's key: subject `sub`, valid for ten minutes, for every
/// project (`projects: ["*"]`, the Rollouts controller's), with `edit` applied to its claims
/// (an agent's destination, an expiry in the past, no `projects` …).
pub(crate) fn token(sub: &str, edit: impl FnOnce(&mut Claims)) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    let mut claims = Claims {
        sub: sub.to_string(),
        aud: auth::AUDIENCE.to_string(),
        exp: now + 600,
        iat: now,
        jti: format!("{sub}-jti"),
        destination: None,
        projects: Some(vec!["*".into()]),
    };
    edit(&mut claims);
    auth::issue(KEY, &claims).expect("signing a test token")
}

/// A plugin token bound to `projects` (`Some(&["*"])`: every project, the Rollouts
/// controller's; `None`: no `projects` claim, which the server refuses since #27).
pub(crate) fn plugin_token(sub: &str, projects: Option<&[&str]>) -> String {
    token(sub, |c| {
        c.projects = projects.map(|p| p.iter().map(|s| s.to_string()).collect());
    })
}

/// An agent token for `destination`.
pub(crate) fn agent_token(destination: &str) -> String {
    token(&format!("agent:{destination}"), |c| {
        c.destination = Some(destination.to_string());
        c.projects = None;
    })
}

/// The policy of the tenancy scenes: project `team-a` may use destination `a`, `team-b`
/// destination `b`, each in namespace `verify` only.
pub(crate) const TENANTS_POLICY: &str = "policy: {rules: [\
    {projects: [team-a], destinations: [a], namespaces: [verify]}, \
    {projects: [team-b], destinations: [b], namespaces: [verify]}]}";

/// Measurement `index` of `metric` of run `namespace/name` (uid `uid`), on the destinations
/// `destination` names, with `metadata`.
pub(crate) fn measurement(
    (namespace, name, uid): (&str, &str, &str),
    metric: &str,
    index: u32,
    destination: &str,
) -> dispatch_api::v1::MeasurementRef {
    dispatch_api::v1::MeasurementRef {
        run: dispatch_api::v1::RunRef {
            name: name.to_string(),
            namespace: namespace.to_string(),
            uid: uid.to_string(),
            ..Default::default()
        },
        metric: metric.to_string(),
        index,
        block: serde_json::json!({
            "destination": destination,
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "x"}]}}}
        }),
        metadata: Default::default(),
    }
}

impl Scene {
    /// How many [`Scene::destination_calls`] each of `a` and `b` has had so far.
    pub(crate) fn calls_mark(&self) -> [usize; 2] {
        let all = self.destination_calls();
        ["a: ", "b: "].map(|p| all.iter().filter(|c| c.starts_with(p)).count())
    }

    /// The [`Scene::destination_calls`] made since `mark` (from [`Scene::calls_mark`]).
    pub(crate) fn calls_since(&self, mark: [usize; 2]) -> Vec<String> {
        let all = self.destination_calls();
        let of = |prefix: &str, skip: usize| {
            all.iter()
                .filter(|c| c.starts_with(prefix))
                .skip(skip)
                .cloned()
                .collect::<Vec<_>>()
        };
        let mut out = of("a: ", mark[0]);
        out.extend(of("b: ", mark[1]));
        out
    }

    /// POSTs `body` to `path` with `token`, as JSON.
    pub(crate) async fn post(
        &self,
        path: &str,
        token: &str,
        body: &impl serde::Serialize,
    ) -> Result<Reply> {
        self.call("POST", path, Some(token), &serde_json::to_value(body)?)
            .await
    }
}

/// How often a [`ServedScene`] looks at its files (`serve` looks every 3 s): short, so that a
/// rotation case waits milliseconds, not seconds.
pub(crate) const RELOAD_EVERY: std::time::Duration = std::time::Duration::from_millis(50);

/// The files a [`ServedScene`] serves from, as `serve` takes them: `--tls-cert`, `--tls-key`,
/// `--jwt-key-file`, `--revoked-tokens-file`.
pub(crate) struct ServedFiles {
    pub(crate) tls_cert: std::path::PathBuf,
    pub(crate) tls_key: std::path::PathBuf,
    pub(crate) jwt_key: std::path::PathBuf,
    pub(crate) revoked: std::path::PathBuf,
}

/// The engine behind the API the way `serve` runs it: over TLS through `listener::serve`, with
/// `serve`'s JWT check (keys and revocations read from files), every file re-read when it
/// changes. Dropping it stops the listener.
pub(crate) struct ServedScene {
    /// The fake clusters behind the engine (kept alive with the scene).
    #[allow(dead_code)]
    pub(crate) world: World,
    pub(crate) addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for ServedScene {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl ServedScene {
    /// The default engine configuration plus `extra`, served from `files` on a loopback port.
    pub(crate) async fn start(extra: &str, files: &ServedFiles) -> Result<Self> {
        use dispatch_server::runtime::listener;
        let world = World::start(extra).await?;
        let metrics = Arc::new(Metrics::new());
        let jwt = dispatch_server::cmd::serve::jwt_authenticator(
            std::slice::from_ref(&files.jwt_key),
            Vec::new(),
            Some(files.revoked.clone()),
            RELOAD_EVERY,
        )?;
        let router = router_over(
            world.engine.clone(),
            metrics,
            Arc::new(signer()),
            Options::default(),
            Gate {
                auth: Arc::new(jwt.into()),
                people: Arc::new(dispatch_server::http::viewer::People::Nobody),
                sessions: Arc::default(),
            },
        );
        let tls = listener::reloading_tls_config(&files.tls_cert, &files.tls_key, RELOAD_EVERY)?;
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = tcp.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(listener::serve(tcp, router, Some(tls), async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            world,
            addr,
            stop: Some(stop),
        })
    }

    /// `https://localhost:PORT`: the name the scene's certificates are issued for.
    pub(crate) fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Scene {
    /// [`Scene::start`] with `more_destinations` (YAML list items, e.g. a destination on a fake
    /// cluster of the case's own) after `a` and `b`.
    pub(crate) async fn start_with_destinations(
        more_destinations: &str,
        extra: &str,
    ) -> Result<Self> {
        let world = crate::world::Clusters::start()
            .await?
            .engine(more_destinations, extra, true)
            .await?;
        let jwt = JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]);
        Self::serve_with(world, Arc::new(jwt.into()), Arc::new(Metrics::new())).await
    }
}

impl Scene {
    /// `world`'s engine behind the API with `people` (the log route's persons), served with
    /// each connection's peer address (as `serve`'s listener hands it to handlers), so a case can
    /// play a proxy from a trusted or an untrusted address.
    pub(crate) async fn serve_with_people(
        world: World,
        people: Arc<dispatch_server::http::viewer::People>,
    ) -> Result<Self> {
        let metrics = Arc::new(Metrics::new());
        let gate = Gate {
            auth: Arc::new(
                JwtAuthenticator::new(&[KEY.to_vec()], [REVOKED_JTI.to_string()]).into(),
            ),
            people,
            sessions: Arc::default(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = router_over(
            world.engine.clone(),
            metrics,
            Arc::new(signer()),
            Options::default(),
            gate,
        )
        .into_make_service_with_connect_info::<SocketAddr>();
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            world,
            addr,
            http: reqwest::Client::new(),
            server,
        })
    }

    /// `GET path` sent as written (no URL normalisation: `..` stays), with `headers`; the
    /// status code of the reply.
    pub(crate) async fn raw_get(&self, path: &str, headers: &[(&str, &str)]) -> Result<u16> {
        Ok(self.raw_get_text(path, headers).await?.0)
    }

    /// [`Self::raw_get`], with the whole answer after the status line (headers and body).
    pub(crate) async fn raw_get_text(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(self.addr).await?;
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await?;
        let mut answer = Vec::new();
        tcp.read_to_end(&mut answer).await?;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let status = answer
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .with_context(|| format!("no status line: {answer:?}"))?;
        Ok((status, answer))
    }
}
