//! The agent scene shared by `e2e_agent` and `chaos`: clusters control, a and b; the
//! DispatchJob CRD on control; two `rollouts-dispatch serve` replicas (real processes, the
//! Kubernetes store) behind a TCP front; cluster-a a direct destination, cluster-b reachable only
//! through its agent (a real process with B's kubeconfig); the real Argo Rollouts controller with
//! the plugin pointed at the front.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::process::tail;
use dispatch_tests::cluster::Cluster;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};

use super::*;

pub const KEY: &str = "e2e-agent-signing-key-0123456789abcdef0123456789";
pub const DJ_NAMESPACE: &str = "rollouts-dispatch";

/// Installs the DispatchJob CRD of `config/crds` and waits until it is served.
pub async fn install_crd(client: &kube::Client) -> Result<()> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/crds/dispatchjobs.yaml");
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(&std::fs::read_to_string(&path)?).context("parsing the CRD")?;
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    api.create(&PostParams::default(), &crd)
        .await
        .context("creating the DispatchJob CRD")?;
    let records: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        DJ_NAMESPACE,
        &dispatch_server::store::kubernetes::api_resource(),
    );
    eventually("the DispatchJob CRD to be served", || async {
        Ok(records.list(&ListParams::default()).await.is_ok())
    })
    .await
}

/// A TCP front for the server replicas: each connection goes to the first backend that
/// accepts it, as a Service does with its ready endpoints.
pub async fn front(backends: Vec<u16>) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let backends = backends.clone();
            tokio::spawn(async move {
                for port in backends {
                    if let Ok(mut outbound) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        return;
                    }
                }
            });
        }
    });
    Ok(port)
}

/// POSTs `{}` to `path` of the server at `url` (TLS, trusting `ca`) with the token in
/// `token_file`; describes the answer: `ok …`, `rejected <code>: <message>` or `transient: …`.
pub async fn call_as(url: &str, token_file: &Path, ca: &Path, path: &str) -> Result<String> {
    use dispatch_api::client::{CallError, ClientConfig, ServerClient};
    let client = ServerClient::new(&ClientConfig {
        server: url.to_string(),
        token_file: Some(token_file.to_path_buf()),
        ca_file: Some(ca.to_path_buf()),
        timeout: Duration::from_secs(20),
    })?;
    Ok(
        match client
            .post::<_, serde_json::Value>(path, &serde_json::json!({}))
            .await
        {
            Ok(v) => format!("ok {v}"),
            Err(CallError::Rejected(e)) => format!("rejected {}: {}", e.code, e.message),
            Err(CallError::Transient(m)) => format!("transient: {m}"),
        },
    )
}

pub fn token(destination: Option<&str>, subject: &str, exp_offset: i64) -> Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let claims = dispatch_server::http::auth::Claims {
        sub: subject.into(),
        aud: dispatch_server::http::auth::AUDIENCE.into(),
        exp: (now + exp_offset) as u64,
        iat: (now - 7200).max(0) as u64,
        jti: format!("{subject}-{now}"),
        destination: destination.map(str::to_string),
    };
    Ok(dispatch_server::http::auth::issue(KEY.as_bytes(), &claims)?)
}

pub struct Replica {
    pub name: String,
    pub port: u16,
    pub admin: u16,
}

pub fn spawn_server(
    control: &mut Cluster,
    binary: &Path,
    config: &Path,
    key: &Path,
    name: &str,
    extra: &[String],
) -> Result<Replica> {
    let (port, admin) = (free_port()?, free_port()?);
    spawn_server_on(control, binary, config, key, name, port, admin, extra)?;
    Ok(Replica {
        name: name.into(),
        port,
        admin,
    })
}

#[allow(clippy::too_many_arguments)]
pub fn spawn_server_on(
    control: &mut Cluster,
    binary: &Path,
    config: &Path,
    key: &Path,
    name: &str,
    port: u16,
    admin: u16,
    extra: &[String],
) -> Result<()> {
    let mut cmd = Command::new(binary);
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--jwt-key-file")
        .arg(key)
        .args(["--sync-timeout", "30s"])
        .env_remove("KUBECONFIG")
        .env("ROLLOUTS_DISPATCH_LOG", "info")
        .args(extra);
    control.spawn_process(name, cmd)?;
    Ok(())
}

/// Applies `config/agent-rbac.yaml` to `cluster` and writes a kubeconfig that authenticates as
/// its ServiceAccount (a TokenRequest token): the agent runs with exactly the documented rights.
pub async fn agent_kubeconfig(cluster: &Cluster) -> Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent-rbac.yaml");
    let applied = Command::new(&cluster.binaries.kubectl)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(["apply", "-f"])
        .arg(&path)
        .output()?;
    ensure!(
        applied.status.success(),
        "kubectl apply -f {}: {}",
        path.display(),
        String::from_utf8_lossy(&applied.stderr)
    );
    let token = Command::new(&cluster.binaries.kubectl)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args([
            "create",
            "token",
            "rollouts-dispatch-agent",
            "-n",
            "rollouts-dispatch",
            "--duration",
            "2h",
        ])
        .output()?;
    ensure!(
        token.status.success(),
        "kubectl create token: {}",
        String::from_utf8_lossy(&token.stderr)
    );
    let kubeconfig = cluster.dir.join("agent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: agent\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: agent}}\ncurrent-context: c\n",
            cluster.server,
            cluster.ca_file.display(),
            String::from_utf8_lossy(&token.stdout).trim()
        ),
    )?;
    Ok(kubeconfig)
}

pub fn spawn_agent(
    b: &mut Cluster,
    binary: &Path,
    url: &str,
    ca: &Path,
    token_file: &Path,
    name: &str,
) -> Result<u16> {
    let admin = free_port()?;
    let mut cmd = Command::new(binary);
    cmd.args(["agent", "--server", url, "--token-file"])
        .arg(token_file)
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--poll-wait", "10s"])
        .arg("--ca-file")
        .arg(ca)
        .env("ROLLOUTS_DISPATCH_LOG", "dispatch_server=debug,info")
        .env("KUBECONFIG", b.dir.join("agent.kubeconfig"));
    b.spawn_process(name, cmd)?;
    Ok(admin)
}

/// Waits until `path`'s log holds `needle`.
pub async fn log_shows(path: &Path, needle: &str) -> Result<()> {
    eventually(&format!("{needle:?} in {}", path.display()), || async {
        Ok(std::fs::read_to_string(path)
            .unwrap_or_default()
            .contains(needle))
    })
    .await
    .with_context(|| tail(path, 20))
}

/// Everything of the agent scene.
pub struct AgentWorld {
    pub control: Cluster,
    pub a: Cluster,
    pub b: Cluster,
    pub client: kube::Client,
    pub binary: PathBuf,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub key: PathBuf,
    pub replicas: Vec<Replica>,
    pub url: String,
    /// the CA of the server's TLS certificate
    pub ca: PathBuf,
    pub plugin_token: PathBuf,
    pub agent_token: PathBuf,
    pub rollouts: ArgoRollouts,
    pub freight: (String, String),
}

impl AgentWorld {
    /// Starts the scene; `serve_args` are extra `rollouts-dispatch serve` flags.
    pub async fn start(serve_args: &[&str]) -> Result<Self> {
        let binary = dispatch_tests::rollouts_dispatch_binary()?;
        let plugin = plugin_binary()?;
        let mut clusters = dispatch_tests::cluster::start_many(&["control", "a", "b"]).await?;
        let mut b = clusters.pop().context("cluster b")?;
        let a = clusters.pop().context("cluster a")?;
        let mut control = clusters.pop().context("cluster control")?;
        let client = control.client().await?;
        argo::apply_namespace(&client, DJ_NAMESPACE).await?;
        install_crd(&client).await?;

        // The server knows cluster-a directly and cluster-b only as an agent destination.
        let dir: PathBuf = control.dir.join("dispatch");
        std::fs::create_dir_all(&dir)?;
        let key = dir.join("jwt.key");
        std::fs::write(&key, KEY)?;
        let config = dir.join("server.yaml");
        std::fs::write(
            &config,
            format!(
                "controlPlane: {{kubeconfig: {}}}\n\
                 destinations:\n- name: cluster-a\n  kubeconfig: {}\n\
                 agents:\n  store: kubernetes\n  namespace: {DJ_NAMESPACE}\n  offlineAfter: 20s\n  \
                 destinations:\n  - name: cluster-b\n    labels: {{env: edge}}\n\
                 policy:\n  rules:\n  - projects: [\"{PROJECT}\"]\n    destinations: [\"cluster-*\"]\n",
                control.kubeconfig.display(),
                a.kubeconfig.display(),
            ),
        )?;
        // The API is TLS, with the control cluster's serving certificate (127.0.0.1 is in its
        // SANs) and CA: agents and the plugin trust it through --ca-file.
        let pki = control.dir.join("pki");
        let ca = pki.join("ca.crt");
        let mut extra: Vec<String> = serve_args.iter().map(|s| s.to_string()).collect();
        extra.extend([
            format!("--tls-cert={}", pki.join("apiserver.crt").display()),
            format!("--tls-key={}", pki.join("apiserver.key").display()),
        ]);
        std::fs::write(dir.join("serve-args"), extra.join("\n"))?;
        let one = spawn_server(&mut control, &binary, &config, &key, "server-1", &extra)?;
        let two = spawn_server(&mut control, &binary, &config, &key, "server-2", &extra)?;
        wait_ready("server-1", one.admin).await?;
        wait_ready("server-2", two.admin).await?;
        let front_port = front(vec![one.port, two.port]).await?;
        let url = format!("https://127.0.0.1:{front_port}");

        let plugin_token = dir.join("plugin.token");
        std::fs::write(
            &plugin_token,
            token(None, "argo-rollouts-controller", 3600)?,
        )?;
        let agent_token = dir.join("agent-b.token");
        let issued = Command::new(&binary)
            .args([
                "token",
                "issue",
                "--destination",
                "cluster-b",
                "--ttl",
                "1h",
                "--key-file",
            ])
            .arg(&key)
            .output()?;
        ensure!(issued.status.success(), "token issue: {issued:?}");
        std::fs::write(&agent_token, &issued.stdout)?;
        agent_kubeconfig(&b).await?;
        let agent_admin = spawn_agent(&mut b, &binary, &url, &ca, &agent_token, "agent")?;
        wait_ready("the agent", agent_admin).await?;

        let plugin_token_s = plugin_token.display().to_string();
        let plugin = MetricPlugin::file(PLUGIN_NAME, &plugin)?.with_args([
            "--server",
            url.as_str(),
            "--token-file",
            &plugin_token_s,
            "--ca-file",
            &ca.display().to_string(),
        ]);
        let rollouts = ArgoRollouts::install(&mut control, &[plugin]).await?;
        argo::apply_namespace(&client, PROJECT).await?;
        let freight = freight(&client).await?;
        Ok(Self {
            control,
            a,
            b,
            client,
            binary,
            dir,
            config,
            key,
            replicas: vec![one, two],
            url,
            ca,
            plugin_token,
            agent_token,
            rollouts,
            freight,
        })
    }

    /// The DispatchJobs on the control plane.
    pub fn records(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            DJ_NAMESPACE,
            &dispatch_server::store::kubernetes::api_resource(),
        )
    }

    /// (Re)starts replica `i` (after a kill) on its ports; waits until it is ready.
    pub async fn restart_replica(&mut self, i: usize) -> Result<()> {
        let r = &self.replicas[i];
        let (name, port, admin) = (r.name.clone(), r.port, r.admin);
        let extra = self.serve_args();
        spawn_server_on(
            &mut self.control,
            &self.binary,
            &self.config,
            &self.key,
            &name,
            port,
            admin,
            &extra,
        )?;
        wait_ready(&name, admin).await
    }

    fn serve_args(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("serve-args"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// (Re)starts B's agent under process name `name` with `token_file`; returns its admin port.
    pub fn spawn_agent(&mut self, name: &str, token_file: &Path) -> Result<u16> {
        spawn_agent(
            &mut self.b,
            &self.binary,
            &self.url,
            &self.ca,
            token_file,
            name,
        )
    }
}
