//! The agent scene ([`World::start_with_agent`]), shared by `e2e_agent` and `chaos`: the
//! DispatchJob CRD on control; two `rollouts-dispatch serve` replicas (real processes on the
//! Kubernetes store) behind a TCP front, serving the API over TLS; cluster-a a direct
//! destination, cluster-b reachable only through its agent (a real process with a kubeconfig of
//! the documented agent RBAC); the controller's plugin pointed at the front.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};

use super::credentials::write_token;
use super::{plugin_args, start_clusters, World};
use crate::admin::wait_ready;
use crate::artifacts::{repo_path, rollouts_dispatch_binary};
use crate::block::{AGENT_ALLOWS, RULE_ALLOWS};
use crate::cluster::argo;
use crate::cluster::argocd::RULE_APPLICATIONS;
use crate::cluster::process::tail;
use crate::cluster::Cluster;
use crate::kargo::PROJECT;
use crate::objects::install_crd;
use crate::ports::free_port;
use crate::tls::ApiTls;
use crate::wait::eventually;

/// The servers' signing key (HS256): tests mint their own tokens with it.
pub const KEY: &str = "e2e-agent-signing-key-0123456789abcdef0123456789";
/// The namespace of the DispatchJobs on the control plane.
pub const DJ_NAMESPACE: &str = "rollouts-dispatch";
/// How long a log line may take to show up.
const LOG_TIMEOUT: Duration = Duration::from_secs(90);

/// One server replica (process `name` in control's process group).
#[derive(Debug, Clone)]
pub struct Replica {
    /// Process name (and log file name).
    pub name: String,
    /// API port (TLS).
    pub port: u16,
    /// Admin port (plain HTTP).
    pub admin: u16,
}

/// [`World`]'s dispatch side in the agent scene.
pub struct Agents {
    /// The `rollouts-dispatch` binary.
    pub binary: PathBuf,
    /// Config, keys, tokens, flags.
    pub dir: PathBuf,
    /// The servers' config file.
    pub config: PathBuf,
    /// The servers' signing key file.
    pub key: PathBuf,
    /// The replicas behind the front.
    pub replicas: Vec<Replica>,
    /// The CA of the servers' TLS certificate.
    pub ca: PathBuf,
    /// The plugin's token file.
    pub plugin_token: PathBuf,
    /// cluster-b's agent token file.
    pub agent_token: PathBuf,
    /// The public keys of the servers' signed work, as `rollouts-dispatch work-keys` printed
    /// them: B's agent's `--work-keys`.
    pub work_keys: PathBuf,
    /// The servers' TLS ([`Self::ca`] is its CA).
    pub tls: ApiTls,
    /// Extra `serve` flags of every replica.
    serve_args: Vec<String>,
    /// More `serve` flags for the replicas (re)started from now on ([`World::restart_replica_binary`]):
    /// a scene's preparation for a rotation (a second key file, a revocation file).
    pub more_serve_args: Vec<String>,
    /// What `start_with_agent_config` appended to the config.
    extra_yaml: String,
    /// Extra `agent` flags of B's agent (`start_with_agent_options`).
    agent_args: Vec<String>,
}

/// Where a replica keeps agent work (`agents.store`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// DispatchJobs on the control plane: any number of replicas.
    Kubernetes,
    /// In the process: one replica, forgotten on restart.
    Memory,
}

/// What a fault scene changes in the servers' config ([`World::config_variant`]); the default
/// is the scene's own config.
#[derive(Debug, Clone, Default)]
pub struct ConfigVariant {
    /// The control plane's kubeconfig instead of `control`'s (e.g. through a [`crate::netfault::Link`]).
    pub control_kubeconfig: Option<PathBuf>,
    /// More direct destinations: (name, kubeconfig).
    pub destinations: Vec<(String, PathBuf)>,
    /// The policy rule's destination patterns instead of `["cluster-*"]`.
    pub allowed: Option<Vec<String>>,
}

/// The servers' config: cluster-a direct, cluster-b an agent destination, the policy, then
/// `extra_yaml`.
fn server_yaml(control: &Cluster, a: &Cluster, store: Store, extra_yaml: &str) -> String {
    variant_yaml(control, a, store, extra_yaml, &ConfigVariant::default())
}

/// [`server_yaml`] with what `variant` changes.
fn variant_yaml(
    control: &Cluster,
    a: &Cluster,
    store: Store,
    extra_yaml: &str,
    variant: &ConfigVariant,
) -> String {
    let control_kubeconfig = variant
        .control_kubeconfig
        .clone()
        .unwrap_or_else(|| control.kubeconfig.clone());
    let more: String = variant
        .destinations
        .iter()
        .map(|(name, kubeconfig)| {
            format!("- name: {name}\n  kubeconfig: {}\n", kubeconfig.display())
        })
        .collect();
    let allowed = variant
        .allowed
        .as_ref()
        .map(|a| {
            a.iter()
                .map(|d| format!("\"{d}\""))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_else(|| "\"cluster-*\"".into());
    let store = match store {
        Store::Kubernetes => format!("store: kubernetes\n  namespace: {DJ_NAMESPACE}"),
        Store::Memory => "store: memory".to_string(),
    };
    format!(
        "controlPlane: {{kubeconfig: {}}}\n\
         destinations:\n- name: cluster-a\n  kubeconfig: {}\n{more}\
         agents:\n  {store}\n  offlineAfter: 20s\n  \
         destinations:\n  - name: cluster-b\n    labels: {{env: edge}}\n\
         policy:\n  rules:\n  - projects: [\"{PROJECT}\"]\n    destinations: [{allowed}]\n    namespaces: [\"*\"]\n    {RULE_ALLOWS}\n    {RULE_APPLICATIONS}\n\
         {extra_yaml}",
        control_kubeconfig.display(),
        a.kubeconfig.display(),
    )
}

impl World<Agents> {
    /// Writes new tokens for the plugin and cluster-b's agent, and of the agent's
    /// ServiceAccount on cluster-b, each valid for an hour from now, as an operator (and the
    /// kubelet, for the ServiceAccount's) renews them (all three are followed in their files):
    /// a test longer than an hour calls it on a schedule, or they are refused once their hour
    /// is up.
    pub fn renew_tokens(&self) -> Result<()> {
        let d = &self.dispatch;
        write_tokens(&d.binary, &d.key, &d.plugin_token, &d.agent_token)?;
        renew_agent_sa_token(&self.b).map(drop)
    }

    /// Starts the agent scene; `serve_args` are extra `rollouts-dispatch serve` flags.
    pub async fn start_with_agent(serve_args: &[&str]) -> Result<Self> {
        Self::start_with_agent_config(serve_args, "").await
    }

    /// [`World::start_with_agent`] with `extra_yaml` appended to the servers' config: more
    /// top-level sections (`engine:`, `jobs:`), each a complete YAML block.
    pub async fn start_with_agent_config(serve_args: &[&str], extra_yaml: &str) -> Result<Self> {
        Self::start_with_agent_options(serve_args, extra_yaml, &[]).await
    }

    /// [`World::start_with_agent_config`] with `agent_args`, extra `rollouts-dispatch agent`
    /// flags of B's agent (kept for [`World::spawn_agent`]), e.g. `--namespaces argocd`.
    pub async fn start_with_agent_options(
        serve_args: &[&str],
        extra_yaml: &str,
        agent_args: &[&str],
    ) -> Result<Self> {
        Self::start_with_agent_front(serve_args, extra_yaml, agent_args, Front::FirstUp).await
    }

    /// [`World::start_with_agent_options`] with the front's way of choosing a replica.
    pub async fn start_with_agent_front(
        serve_args: &[&str],
        extra_yaml: &str,
        agent_args: &[&str],
        front_kind: Front,
    ) -> Result<Self> {
        let agent_args: Vec<String> = agent_args.iter().map(|s| s.to_string()).collect();
        let binary = rollouts_dispatch_binary()?;
        let [mut control, a, mut b] = start_clusters().await?;
        let client = control.client().await?;
        argo::apply_namespace(&client, DJ_NAMESPACE).await?;
        install_dispatch_job_crd(&client).await?;

        // The server knows cluster-a directly and cluster-b only as an agent destination.
        let dir: PathBuf = control.dir.join("dispatch");
        std::fs::create_dir_all(&dir)?;
        let key = dir.join("jwt.key");
        std::fs::write(&key, KEY)?;
        let config = dir.join("server.yaml");
        std::fs::write(
            &config,
            server_yaml(&control, &a, Store::Kubernetes, extra_yaml),
        )?;
        // The API is TLS with a CA of its own (not the clusters'): agents pin it and the plugin
        // trusts it through --ca-file.
        let tls = ApiTls::write(&dir)?;
        let ca = tls.ca.clone();
        let mut extra: Vec<String> = serve_args.iter().map(|s| s.to_string()).collect();
        extra.extend(tls.serve_flags());
        // Log requests of agent destinations shared across the replicas, as the chart does:
        // each publishes with its address (127.0.0.1 and its --listen port here) and forwards an
        // agent's upload to the one holding the reader over TLS verified for `localhost`.
        extra.extend([
            "--pod-ip=127.0.0.1".to_string(),
            "--peer-name=localhost".to_string(),
            format!("--peer-ca-file={}", ca.display()),
        ]);
        let mut replicas = Vec::new();
        for name in ["server-1", "server-2"] {
            let replica = Replica {
                name: name.into(),
                port: free_port()?,
                admin: free_port()?,
            };
            spawn_server(&mut control, &binary, &config, &key, &replica, &extra)?;
            replicas.push(replica);
        }
        for replica in &replicas {
            wait_ready(&replica.name, replica.admin).await?;
        }
        let front_port = front(&replicas, front_kind).await?;
        let url = format!("https://127.0.0.1:{front_port}");

        let plugin_token = dir.join("plugin.token");
        let agent_token = dir.join("agent-b.token");
        write_tokens(&binary, &key, &plugin_token, &agent_token)?;
        // The agent pins the keys the servers sign its work with, printed by the CLI from the
        // same key flag as `serve`.
        let work_keys = dir.join("work.keys");
        let printed = Command::new(&binary)
            .arg("work-keys")
            .arg("--jwt-key-file")
            .arg(&key)
            .output()?;
        ensure!(printed.status.success(), "work-keys: {printed:?}");
        std::fs::write(&work_keys, &printed.stdout)?;
        let argocd_sync = agent_args.iter().any(|a| a == "--argocd-sync");
        write_agent_kubeconfig(&b, argocd_sync).await?;
        let agent = AgentProcess {
            binary: &binary,
            url: &url,
            ca: &ca,
            work_keys: &work_keys,
            args: &agent_args,
        };
        let agent_admin = agent.spawn(&mut b, &agent_token, "agent")?;
        wait_ready("the agent", agent_admin).await?;

        let plugin_args = plugin_args(&url, &plugin_token, &ca);
        let agents = Agents {
            binary,
            dir,
            config,
            key,
            replicas,
            ca,
            plugin_token,
            agent_token,
            work_keys,
            tls,
            serve_args: extra,
            more_serve_args: Vec::new(),
            extra_yaml: extra_yaml.to_string(),
            agent_args,
        };
        Self::assemble([control, a, b], url, plugin_args, agents).await
    }

    /// The DispatchJobs on the control plane.
    pub fn records(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            DJ_NAMESPACE,
            &dispatch_server::store::kubernetes::api_resource(),
        )
    }

    /// The DispatchLogRequests on the control plane (published log requests).
    pub fn log_requests(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.client.clone(),
            DJ_NAMESPACE,
            &dispatch_server::logs::board::api_resource(),
        )
    }

    /// The DispatchJob of the run with UID `run_uid`, if the store holds one.
    pub async fn record_of(&self, run_uid: &str) -> Result<Option<DynamicObject>> {
        let records = self.records().list(&ListParams::default()).await?.items;
        Ok(records.into_iter().find(|r| {
            r.data
                .pointer("/spec/runUid")
                .and_then(serde_json::Value::as_str)
                == Some(run_uid)
        }))
    }

    /// (Re)starts replica `i` (after a kill) on its ports; waits until it is ready.
    pub async fn restart_replica(&mut self, i: usize) -> Result<()> {
        self.restart_replica_with(i, Store::Kubernetes).await
    }

    /// (Re)starts replica `i` on its ports with the config of `store` instead (the same
    /// destinations, policy and extra config; [`Store::Memory`] only with no other replica up);
    /// waits until it is ready.
    pub async fn restart_replica_with(&mut self, i: usize, store: Store) -> Result<()> {
        let d = &self.dispatch;
        let config = match store {
            Store::Kubernetes => d.config.clone(),
            Store::Memory => {
                let path = d.dir.join("server-memory.yaml");
                std::fs::write(
                    &path,
                    server_yaml(&self.control, &self.a, store, &d.extra_yaml),
                )?;
                path
            }
        };
        let replica = d.replicas[i].clone();
        spawn_server(
            &mut self.control,
            &d.binary,
            &config,
            &d.key,
            &replica,
            &d.serve_args,
        )?;
        wait_ready(&replica.name, replica.admin).await
    }

    /// Writes the servers' config as `variant` changes it to `<dir>/<file>`; returns its path,
    /// for [`World::restart_replica_config`].
    pub fn config_variant(&self, file: &str, variant: &ConfigVariant) -> Result<PathBuf> {
        let d = &self.dispatch;
        let path = d.dir.join(file);
        std::fs::write(
            &path,
            variant_yaml(
                &self.control,
                &self.a,
                Store::Kubernetes,
                &d.extra_yaml,
                variant,
            ),
        )?;
        Ok(path)
    }

    /// (Re)starts replica `i` (after a kill) with the config at `config`; waits until it is ready.
    pub async fn restart_replica_config(&mut self, i: usize, config: &Path) -> Result<()> {
        self.restart_replica_binary(i, config, None).await
    }

    /// [`World::restart_replica_config`] running `binary` (another release's) instead of the
    /// scene's.
    pub async fn restart_replica_binary(
        &mut self,
        i: usize,
        config: &Path,
        binary: Option<&Path>,
    ) -> Result<()> {
        let d = &self.dispatch;
        let replica = d.replicas[i].clone();
        spawn_server(
            &mut self.control,
            binary.unwrap_or(&d.binary),
            config,
            &d.key,
            &replica,
            &[d.serve_args.clone(), d.more_serve_args.clone()].concat(),
        )?;
        wait_ready(&replica.name, replica.admin).await
    }

    /// (Re)starts B's agent under process name `name` with `token_file`; returns its admin port.
    pub fn spawn_agent(&mut self, name: &str, token_file: &Path) -> Result<u16> {
        let url = self.url.clone();
        self.spawn_agent_at(name, token_file, &url)
    }

    /// [`World::spawn_agent`] dialing `url` instead of the front (a [`crate::netfault::Link`]
    /// to it).
    pub fn spawn_agent_at(&mut self, name: &str, token_file: &Path, url: &str) -> Result<u16> {
        self.spawn_agent_with(None, name, token_file, url)
    }

    /// [`World::spawn_agent_at`] running `binary` (another release's) instead of the scene's.
    pub fn spawn_agent_with(
        &mut self,
        binary: Option<&Path>,
        name: &str,
        token_file: &Path,
        url: &str,
    ) -> Result<u16> {
        let d = &self.dispatch;
        let agent = AgentProcess {
            binary: binary.unwrap_or(&d.binary),
            url,
            ca: &d.ca,
            work_keys: &d.work_keys,
            args: &d.agent_args,
        };
        agent.spawn(&mut self.b, token_file, name)
    }
}

/// Installs the CRDs of `config/crds` (DispatchJob, DispatchLogRequest) and waits until they
/// are served.
async fn install_dispatch_job_crd(client: &kube::Client) -> Result<()> {
    for (file, resource) in [
        (
            "config/crds/dispatchjobs.yaml",
            dispatch_server::store::kubernetes::api_resource(),
        ),
        (
            "config/crds/dispatchlogrequests.yaml",
            dispatch_server::logs::board::api_resource(),
        ),
    ] {
        let path = repo_path(file);
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(&std::fs::read_to_string(&path)?)
                .with_context(|| format!("parsing {file}"))?;
        install_crd(client, &crd).await?;
        let objects: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), DJ_NAMESPACE, &resource);
        eventually(
            &format!("the {} CRD served", resource.kind),
            LOG_TIMEOUT,
            || async { Ok(objects.list(&ListParams::default()).await.is_ok()) },
        )
        .await?;
    }
    Ok(())
}

/// How the front picks a replica for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// The first replica that accepts (a replica sees traffic only when those before it are
    /// down): the scenes whose checks read one replica's log.
    FirstUp,
    /// In turn among the replicas whose `/ready` answered 200 at the last probe (every second,
    /// as a Service with a 1 s readiness probe), the others after them: `make faults`.
    Balanced,
}

/// A TCP front for the server replicas, as a Service in front of their endpoints; see [`Front`].
async fn front(replicas: &[Replica], kind: Front) -> Result<u16> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", free_port()?)).await?;
    let port = listener.local_addr()?.port();
    let ports: Vec<u16> = replicas.iter().map(|r| r.port).collect();
    let ready = std::sync::Arc::new(std::sync::Mutex::new(vec![true; replicas.len()]));
    if kind == Front::Balanced {
        let (ready, admins) = (
            ready.clone(),
            replicas.iter().map(|r| r.admin).collect::<Vec<_>>(),
        );
        tokio::spawn(async move {
            loop {
                let mut now = Vec::new();
                for admin in &admins {
                    now.push(matches!(
                        crate::admin::get(*admin, "/ready").await,
                        Some((200, _))
                    ));
                }
                *ready.lock().unwrap_or_else(|e| e.into_inner()) = now;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
    let turn = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let backends = match kind {
                Front::FirstUp => ports.clone(),
                Front::Balanced => {
                    let ready = ready.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let start = turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let mut order: Vec<(bool, usize)> = (0..ports.len())
                        .map(|k| {
                            let i = (start + k) % ports.len();
                            (!ready[i], i)
                        })
                        .collect();
                    // Ready ones first, each group in turn order.
                    order.sort_by_key(|(unready, _)| *unready);
                    order.into_iter().map(|(_, i)| ports[i]).collect()
                }
            };
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
    post_as(url, token_file, ca, path, &serde_json::json!({})).await
}

/// [`call_as`] POSTing `body`.
pub async fn post_as(
    url: &str,
    token_file: &Path,
    ca: &Path,
    path: &str,
    body: &serde_json::Value,
) -> Result<String> {
    use dispatch_api::client::{CallError, ClientConfig, ServerClient};
    let client = ServerClient::new(&ClientConfig {
        server: url.to_string(),
        token_file: Some(token_file.to_path_buf()),
        ca_file: Some(ca.to_path_buf()),
        ca_only: true,
        insecure_plaintext: false,
        timeout: Duration::from_secs(20),
    })?;
    let answer = client.post::<_, serde_json::Value>(path, body).await;
    Ok(match answer {
        Ok(v) => format!("ok {v}"),
        Err(CallError::Rejected(e)) => format!("rejected {}: {}", e.code, e.message),
        Err(CallError::Transient(m) | CallError::Busy { message: m, .. }) => {
            format!("transient: {m}")
        }
    })
}

/// Writes the plugin's token (as the controller's, every project) and cluster-b's agent token
/// (`rollouts-dispatch token issue --destination cluster-b`), each valid for an hour, signed
/// with `key`: at start, and again by [`World::renew_tokens`].
fn write_tokens(binary: &Path, key: &Path, plugin_token: &Path, agent_token: &Path) -> Result<()> {
    write_token(
        plugin_token,
        &token(None, "argo-rollouts-controller", 3600)?,
    )?;
    let issued = Command::new(binary)
        .args([
            "token",
            "issue",
            "--destination",
            "cluster-b",
            "--ttl",
            "1h",
            "--key-file",
        ])
        .arg(key)
        .output()?;
    ensure!(issued.status.success(), "token issue: {issued:?}");
    write_token(agent_token, &String::from_utf8(issued.stdout)?)
}

/// A token signed with [`KEY`] for `subject` (an agent token when `destination` is set, else
/// one for every project, `projects: ["*"]`) that expires `exp_offset` seconds from now
/// (negative: already expired).
pub fn token(destination: Option<&str>, subject: &str, exp_offset: i64) -> Result<String> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs() as i64;
    let claims = dispatch_server::http::auth::Claims {
        sub: subject.into(),
        aud: dispatch_server::http::auth::AUDIENCE.into(),
        exp: (now + exp_offset) as u64,
        iat: (now - 7200).max(0) as u64,
        jti: format!("{subject}-{now}"),
        destination: destination.map(str::to_string),
        // Not an agent's: every project, written out (no claim is refused since #27).
        projects: destination.is_none().then(|| vec!["*".to_string()]),
    };
    Ok(dispatch_server::http::auth::issue(KEY.as_bytes(), &claims)?)
}

fn spawn_server(
    control: &mut Cluster,
    binary: &Path,
    config: &Path,
    key: &Path,
    replica: &Replica,
    extra: &[String],
) -> Result<()> {
    let mut cmd = Command::new(binary);
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{}", replica.port)])
        .args(["--admin-listen", &format!("127.0.0.1:{}", replica.admin)])
        .arg("--jwt-key-file")
        .arg(key)
        .args(["--sync-timeout", "30s"])
        .env_remove("KUBECONFIG")
        .env("ROLLOUTS_DISPATCH_LOG", "info")
        .args(extra);
    control.spawn_process(&replica.name, cmd)
}

/// Applies `config/agent-rbac.yaml` (and, for an agent with `--argocd-sync`,
/// `config/agent-rbac-argocd-sync.yaml`) to `cluster` and writes `agent.kubeconfig` in its
/// directory, authenticating as that ServiceAccount with the token in `agent-sa.token`
/// ([`renew_agent_sa_token`]): the agent runs with exactly the documented rights, and follows
/// its token file as it follows the projected token of its pod (kube-rs reads a `tokenFile`
/// again each minute), so [`World::renew_tokens`] renews it too.
async fn write_agent_kubeconfig(cluster: &Cluster, argocd_sync: bool) -> Result<PathBuf> {
    let mut files = vec!["config/agent-rbac.yaml"];
    if argocd_sync {
        files.push("config/agent-rbac-argocd-sync.yaml");
    }
    for file in files {
        let path = repo_path(file);
        let applied = kubectl(cluster, &["apply", "-f", &path.display().to_string()])?;
        ensure!(
            applied.status.success(),
            "kubectl apply -f {}: {}",
            path.display(),
            String::from_utf8_lossy(&applied.stderr)
        );
    }
    renew_agent_sa_token(cluster)?;
    let token_file = agent_sa_token_file(cluster);
    let kubeconfig = cluster.dir.join("agent.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\n\
             users:\n- name: agent\n  user:\n    tokenFile: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: agent}}\ncurrent-context: c\n",
            cluster.server,
            cluster.ca_file.display(),
            token_file.display()
        ),
    )?;
    Ok(kubeconfig)
}

/// How long the agent's ServiceAccount token on its cluster lasts. A fixed token outlived by
/// the test is refused at its end: the 2-hour soak's last deletions failed with it (a token of
/// `--duration 2h` made at the scene's start), which looked like Jobs the agent would not
/// delete (#32).
const AGENT_SA_TOKEN_LIFETIME: &str = "1h";

/// The label of the Secrets the agent's ServiceAccount tokens are bound to
/// ([`renew_agent_sa_token`]): deleting such a Secret revokes its token at once.
pub const AGENT_TOKEN_SECRET_LABEL: &str = "rollouts-dispatch.test/agent-token";

/// Writes a new token of the agent's ServiceAccount on `cluster` (a TokenRequest, valid for
/// [`AGENT_SA_TOKEN_LIFETIME`], bound to a new Secret labelled [`AGENT_TOKEN_SECRET_LABEL`] in
/// `rollouts-dispatch`) to [`agent_sa_token_file`], replacing the file at once (rename), as the
/// kubelet replaces a projected token; returns the Secret's name.
pub fn renew_agent_sa_token(cluster: &Cluster) -> Result<String> {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos();
    let secret = format!("agent-token-{nanos}");
    let ns = ["-n", "rollouts-dispatch"];
    let created = kubectl(
        cluster,
        &[&["create", "secret", "generic", secret.as_str()][..], &ns].concat(),
    )?;
    let labelled = kubectl(
        cluster,
        &[
            &["label", "secret", secret.as_str()][..],
            &[&format!("{AGENT_TOKEN_SECRET_LABEL}=true")],
            &ns,
        ]
        .concat(),
    )?;
    let token = kubectl(
        cluster,
        &[
            &["create", "token", "rollouts-dispatch-agent"][..],
            &ns,
            &["--duration", AGENT_SA_TOKEN_LIFETIME],
            &[
                "--bound-object-kind",
                "Secret",
                "--bound-object-name",
                &secret,
            ],
        ]
        .concat(),
    )?;
    for (what, out) in [
        ("secret", created),
        ("label", labelled),
        ("token", token.clone()),
    ] {
        ensure!(
            out.status.success(),
            "kubectl (the agent's {what}): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let file = agent_sa_token_file(cluster);
    let next = file.with_extension("next");
    std::fs::write(&next, String::from_utf8_lossy(&token.stdout).trim())?;
    std::fs::rename(&next, &file)?;
    Ok(secret)
}

/// The file of the agent's ServiceAccount token on `cluster`, which its kubeconfig names
/// (`tokenFile`).
pub fn agent_sa_token_file(cluster: &Cluster) -> PathBuf {
    cluster.dir.join("agent-sa.token")
}

/// `kubectl` on `cluster` as its admin.
fn kubectl(cluster: &Cluster, args: &[&str]) -> std::io::Result<std::process::Output> {
    Command::new(&cluster.binaries.kubectl)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(args)
        .output()
}

/// How B's agent is started: the binary, the server it dials, the CA it pins, extra flags.
struct AgentProcess<'a> {
    binary: &'a Path,
    url: &'a str,
    ca: &'a Path,
    work_keys: &'a Path,
    args: &'a [String],
}

impl AgentProcess<'_> {
    /// Spawns the agent on `b` as process `name` with `token_file`; returns its admin port.
    fn spawn(&self, b: &mut Cluster, token_file: &Path, name: &str) -> Result<u16> {
        let admin = free_port()?;
        let mut cmd = Command::new(self.binary);
        cmd.args(["agent", "--server", self.url, "--token-file"])
            .arg(token_file)
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--poll-wait", "10s"])
            // The agent destination's Jobs go to its default namespace.
            .args(["--namespaces", "default"])
            // The kwok annotations of the test blocks (the agent allows none by default).
            .args(AGENT_ALLOWS)
            .arg("--ca-file")
            .arg(self.ca)
            .arg("--work-keys")
            .arg(self.work_keys)
            .args(self.args)
            .env("ROLLOUTS_DISPATCH_LOG", "dispatch_server=debug,info")
            .env("KUBECONFIG", b.dir.join("agent.kubeconfig"));
        b.spawn_process(name, cmd)?;
        Ok(admin)
    }
}

/// Waits until the log file at `path` holds `needle`; on timeout, quotes the log's end.
pub async fn log_shows(path: &Path, needle: &str) -> Result<()> {
    eventually(
        &format!("{needle:?} in {}", path.display()),
        LOG_TIMEOUT,
        || async {
            Ok(std::fs::read_to_string(path)
                .unwrap_or_default()
                .contains(needle))
        },
    )
    .await
    .with_context(|| tail(path, 20))
}
