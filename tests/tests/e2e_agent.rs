//! Agent mode end to end, nothing mocked: the server has no credentials for cluster B; only B's
//! agent (`rollouts-dispatch agent`, a real process with B's kubeconfig) reaches it, by dialing
//! out to the server. Two server replicas (real processes) share the Kubernetes store
//! (`DispatchJob` resources on the control plane) behind a TCP front that, like a Service,
//! sends each connection to the first replica that accepts it. The real Argo Rollouts controller
//! runs the plugin against the same front.
//!
//! Covered: a verification on B goes Successful, a failing one Failed; the agent killed (-9)
//! mid-Job and restarted → the verdict arrives and there is one Job; the replica serving the
//! agent killed (-9) → the verdict arrives via the other replica; B's token asking for C's work
//! → 403; an expired token → 401; a clear log line on both sides; `rollouts-dispatch
//! destinations` shows B as an agent destination, connected.
//!
//! `#[ignore]`d for plain `cargo test`; `make e2e-agent` runs it.

mod e2e_support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use dispatch_tests::cluster::argo::{self, ArgoRollouts, MetricPlugin};
use dispatch_tests::cluster::process::tail;
use dispatch_tests::cluster::Cluster;
use e2e_support::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "e2e-agent-signing-key-0123456789abcdef0123456789";
const DJ_NAMESPACE: &str = "rollouts-dispatch";

/// Installs the DispatchJob CRD of `config/crds` and waits until it is served.
async fn install_crd(client: &kube::Client) -> Result<()> {
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
async fn front(backends: Vec<u16>) -> Result<u16> {
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

/// POST `body` to `path` on 127.0.0.1:`port` with `token`: the status and body.
async fn post(port: u16, path: &str, token: &str, body: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    Ok((status, text))
}

fn token(destination: Option<&str>, subject: &str, exp_offset: i64) -> Result<String> {
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

struct Replica {
    name: String,
    port: u16,
    admin: u16,
}

fn spawn_server(
    control: &mut Cluster,
    binary: &Path,
    config: &Path,
    key: &Path,
    name: &str,
) -> Result<Replica> {
    let (port, admin) = (free_port()?, free_port()?);
    let mut cmd = Command::new(binary);
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .arg("--jwt-key-file")
        .arg(key)
        .args(["--sync-timeout", "30s"])
        .env_remove("KUBECONFIG")
        .env("ROLLOUTS_DISPATCH_LOG", "info");
    control.spawn_process(name, cmd)?;
    Ok(Replica {
        name: name.into(),
        port,
        admin,
    })
}

fn spawn_agent(
    b: &mut Cluster,
    binary: &Path,
    url: &str,
    token_file: &Path,
    name: &str,
) -> Result<u16> {
    let admin = free_port()?;
    let mut cmd = Command::new(binary);
    cmd.args(["agent", "--server", url, "--token-file"])
        .arg(token_file)
        .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
        .args(["--poll-wait", "10s"])
        .env("ROLLOUTS_DISPATCH_LOG", "dispatch_server=debug,info")
        .env("KUBECONFIG", &b.kubeconfig);
    b.spawn_process(name, cmd)?;
    Ok(admin)
}

async fn wait_ready(what: &str, admin: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_status(admin, "/ready").await != Some(200) {
        if Instant::now() > deadline {
            bail!("{what} did not become ready within 60s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// Waits until `path`'s log holds `needle`.
async fn log_shows(path: &Path, needle: &str) -> Result<()> {
    eventually(&format!("{needle:?} in {}", path.display()), || async {
        Ok(std::fs::read_to_string(path)
            .unwrap_or_default()
            .contains(needle))
    })
    .await
    .with_context(|| tail(path, 20))
}

/// Writes `message` into the terminated state of Job `job`'s container, as a kubelet does under
/// `terminationMessagePolicy: FallbackToLogsOnError`.
async fn set_termination_message(cluster: &Cluster, job: &str, message: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(cluster.client().await?, "default");
    for _ in 0..10 {
        let list = pods
            .list(&ListParams::default().labels(&format!("job-name={job}")))
            .await?;
        let Some(mut pod) = list.items.into_iter().next() else {
            bail!("no pod of job {job}");
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let terminated = pod
            .status
            .as_mut()
            .and_then(|s| s.container_statuses.as_mut())
            .and_then(|cs| cs.iter_mut().find(|c| c.name == "check"))
            .and_then(|c| c.state.as_mut())
            .and_then(|s| s.terminated.as_mut())
            .context("container check is not terminated")?;
        terminated.message = Some(message.to_string());
        match pods
            .replace_status(&name, &PostParams::default(), &pod)
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(e).context("writing the termination message"),
        }
    }
    bail!("the pod of job {job} kept changing")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Go-built cluster binaries, the release plugin and the debug binary: run `make e2e-agent`"]
async fn verifications_run_on_a_cluster_only_its_agent_reaches() -> Result<()> {
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
    let one = spawn_server(&mut control, &binary, &config, &key, "server-1")?;
    let two = spawn_server(&mut control, &binary, &config, &key, "server-2")?;
    wait_ready("server-1", one.admin).await?;
    wait_ready("server-2", two.admin).await?;
    let front_port = front(vec![one.port, two.port]).await?;
    let url = format!("http://127.0.0.1:{front_port}");

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
    let agent_admin = spawn_agent(&mut b, &binary, &url, &agent_token, "agent")?;
    wait_ready("the agent", agent_admin).await?;

    let plugin_token_s = plugin_token.display().to_string();
    let plugin = MetricPlugin::file(PLUGIN_NAME, &plugin)?.with_args([
        "--server",
        url.as_str(),
        "--token-file",
        &plugin_token_s,
    ]);
    let _rollouts = ArgoRollouts::install(&mut control, &[plugin]).await?;
    argo::apply_namespace(&client, PROJECT).await?;
    let freight = freight(&client).await?;
    let runs = argo::analysis_runs(&client, PROJECT);
    let post_params = PostParams::default();

    // 1. Pass and fail on cluster-b, through its agent only.
    let ok = runs
        .create(
            &post_params,
            &kargo_run(
                "uat",
                "01jagent00000000000000000a",
                &freight,
                "cluster-b",
                0,
            )?,
        )
        .await?;
    let bad = runs
        .create(
            &post_params,
            &kargo_run(
                "prod",
                "01jagent00000000000000000b",
                &freight,
                "cluster-b",
                1,
            )?,
        )
        .await?;
    let ok = wait_done(&runs, ok.metadata.name.as_deref().unwrap_or_default()).await?;
    let bad = wait_done(&runs, bad.metadata.name.as_deref().unwrap_or_default()).await?;
    println!(
        "e2e-agent: pass={} {:?} | fail={} {:?}",
        phase(&ok),
        measurement_message(&ok),
        phase(&bad),
        measurement_message(&bad)
    );
    ensure!(
        phase(&ok) == "Successful",
        "pass on cluster-b: {}",
        ok.data["status"]
    );
    ensure!(
        phase(&bad) == "Failed",
        "fail on cluster-b: {}",
        bad.data["status"]
    );
    ensure!(
        measurement_message(&bad).contains("cluster-b"),
        "the failure names the destination: {}",
        measurement_message(&bad)
    );
    // The log tail travels from the agent: what a kubelet writes as the termination message
    // (kwok writes none) reaches the DispatchJob's status through the agent's report.
    let bad_uid = bad.metadata.uid.clone().unwrap_or_default();
    let bad_job = jobs_of(&b, &bad_uid).await?;
    let bad_job = bad_job
        .first()
        .context("the failing run's Job on cluster-b")?;
    let bad_name = bad_job.metadata.name.clone().unwrap_or_default();
    set_termination_message(&b, &bad_name, "GET https://svc/health\nHTTP 503 from svc\n").await?;
    let records: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        DJ_NAMESPACE,
        &dispatch_server::store::kubernetes::api_resource(),
    );
    eventually("the log tail in the DispatchJob status", || async {
        let list = records.list(&ListParams::default()).await?;
        Ok(list.items.iter().any(|r| {
            r.data
                .pointer("/spec/jobName")
                .and_then(serde_json::Value::as_str)
                == Some(bad_name.as_str())
                && r.data
                    .pointer("/status/state/detail/log")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|l| l.contains("HTTP 503 from svc"))
        }))
    })
    .await
    .with_context(|| format!("agent log:\n{}", tail(&b.log_path("agent"), 15)))?;
    let uid = ok.metadata.uid.clone().unwrap_or_default();
    let on = (
        jobs_of(&a, &uid).await?.len(),
        jobs_of(&b, &uid).await?,
        jobs_of(&control, &uid).await?.len(),
    );
    ensure!(
        on.0 == 0 && on.1.len() == 1 && on.2 == 0,
        "jobs of the passing run: {} on a, {} on b, {} on control; want 0/1/0",
        on.0,
        on.1.len(),
        on.2
    );
    // The same identity and context as on a direct destination.
    let env = on.1[0]
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .map(|p| p.containers[0].env.clone().unwrap_or_default())
        .unwrap_or_default();
    ensure!(
        env.iter()
            .any(|e| e.name == "KARGO_STAGE" && e.value.as_deref() == Some("uat")),
        "the agent's Job lacks KARGO_STAGE=uat: {env:?}"
    );

    // 2. The agent killed (-9) while its Job runs, then restarted: one Job, the verdict arrives.
    let slow = runs
        .create(
            &post_params,
            &kargo_run_with(
                "edge",
                "01jagent00000000000000000c",
                &freight,
                "cluster-b",
                serde_json::json!({"destination": "{{args.destination}}"}),
                0,
                "8s",
            )?,
        )
        .await?;
    let slow_uid = slow.metadata.uid.clone().unwrap_or_default();
    eventually("the slow Job on cluster-b", || async {
        Ok(jobs_of(&b, &slow_uid).await?.len() == 1)
    })
    .await?;
    b.kill_process("agent")?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent_admin = spawn_agent(&mut b, &binary, &url, &agent_token, "agent")?;
    wait_ready("the restarted agent", agent_admin).await?;
    let slow = wait_done(&runs, slow.metadata.name.as_deref().unwrap_or_default()).await?;
    let jobs = jobs_of(&b, &slow_uid).await?.len();
    println!(
        "e2e-agent: agent killed mid-Job → {} with {jobs} Job",
        phase(&slow)
    );
    ensure!(
        phase(&slow) == "Successful" && jobs == 1,
        "after the agent restart: {} with {jobs} Jobs",
        slow.data["status"]
    );

    // 3. The replica serving the agent killed (-9): the other replica takes over from the store.
    let slow = runs
        .create(
            &post_params,
            &kargo_run_with(
                "canary",
                "01jagent00000000000000000d",
                &freight,
                "cluster-b",
                serde_json::json!({"destination": "{{args.destination}}"}),
                0,
                "8s",
            )?,
        )
        .await?;
    let slow_uid = slow.metadata.uid.clone().unwrap_or_default();
    eventually("the Job on cluster-b", || async {
        Ok(jobs_of(&b, &slow_uid).await?.len() == 1)
    })
    .await?;
    control.kill_process(&one.name)?;
    let slow = wait_done(&runs, slow.metadata.name.as_deref().unwrap_or_default()).await?;
    let jobs = jobs_of(&b, &slow_uid).await?.len();
    let stored = records.list(&ListParams::default()).await?.items.len();
    println!(
        "e2e-agent: replica killed mid-Job → {} with {jobs} Job; {stored} DispatchJobs stored",
        phase(&slow)
    );
    ensure!(
        phase(&slow) == "Successful" && jobs == 1,
        "after the replica kill: {} with {jobs} Jobs",
        slow.data["status"]
    );
    ensure!(
        stored >= 4,
        "every verification on cluster-b has its DispatchJob: {stored}"
    );

    // 4. Hostile and stale agents: B's token asking for C's work → 403; an expired token → 401;
    //    a log line on both sides.
    let b_token = std::fs::read_to_string(&agent_token)?.trim().to_string();
    let (status, body) = post(two.port, "/v1/agents/cluster-c/work", &b_token, "{}").await?;
    ensure!(
        status == 403 && body.contains("is for destination \\\"cluster-b\\\""),
        "B's token for C's work: {status} {body}"
    );
    let server_log = control.log_path(&two.name);
    log_shows(&server_log, "refused: agent token of another destination").await?;
    let expired = dir.join("agent-expired.token");
    std::fs::write(
        &expired,
        token(Some("cluster-b"), "agent:cluster-b", -3600)?,
    )?;
    let (status, body) = post(
        two.port,
        "/v1/agents/cluster-b/work",
        &std::fs::read_to_string(&expired)?,
        "{}",
    )
    .await?;
    ensure!(
        status == 401 && body.contains("token expired"),
        "expired token: {status} {body}"
    );
    spawn_agent(&mut b, &binary, &url, &expired, "agent-expired")?;
    log_shows(&b.log_path("agent-expired"), "token expired").await?;
    log_shows(&server_log, "token expired").await?;
    b.kill_process("agent-expired")?;
    println!("e2e-agent: B's token for C → 403, expired → 401, both logged by agent and server");

    // 5. `rollouts-dispatch destinations`: cluster-b is an agent destination, connected.
    let listed = Command::new(&binary)
        .args(["destinations", "--server", &url, "--token-file"])
        .arg(&plugin_token)
        .output()?;
    let table = String::from_utf8_lossy(&listed.stdout).into_owned();
    println!("{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("cluster-b"))
        .unwrap_or_default();
    ensure!(
        listed.status.success() && row.contains(" agent ") && row.contains(" yes "),
        "destinations: {table} {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    ensure!(
        table
            .lines()
            .any(|l| l.starts_with("cluster-a") && l.contains(" config ")),
        "destinations: {table}"
    );
    println!("e2e-agent: OK");
    Ok(())
}
