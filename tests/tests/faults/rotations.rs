//! Rotations with no downtime, each while verifications run, each following the procedure
//! `docs/security.md` ("Rotations without downtime") gives, and each checking that the old
//! material is refused once its grace ends: the API's certificate and its CA, the JWT key (and
//! the work-signing keys derived from it, which the agent pins), an agent's token, a
//! destination's kubeconfig (a new ServiceAccount token, the old ServiceAccount deleted), and the
//! agent's ServiceAccount token on its own cluster (its `tokenFile`, as the kubelet renews a
//! pod's; the old token revoked).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use dispatch_tests::cluster::Cluster;
use dispatch_tests::invariants::Outcome;
use dispatch_tests::tls::NextTls;
use dispatch_tests::wait::eventually;
use dispatch_tests::world::agents::{
    agent_sa_token_file, call_as, renew_agent_sa_token, AGENT_TOKEN_SECRET_LABEL,
};

use super::scene::{Scene, Submitted, SLOW};

/// Past the 3 s at which every reader looks at its files again, with room for a busy machine.
const IN_FORCE: Duration = Duration::from_secs(8);
/// How long each rotation's verifications run: through every step.
const THROUGH: &str = "40s";

/// Submits one verification on cluster-a and one on cluster-b that run [`THROUGH`] the
/// rotation, and waits until their Jobs run.
async fn in_flight(s: &mut Scene) -> Result<Vec<Submitted>> {
    let mut runs = Vec::new();
    for (destination, exit) in [("cluster-a", 0), ("cluster-b", 1)] {
        let v = s.verification(destination, exit, THROUGH);
        runs.push(s.submit(&v, destination).await?);
    }
    for run in &runs {
        let watch = s.watch.clone();
        let (cluster, uid) = (run.cluster, run.uid.clone());
        eventually("the run's Job", Duration::from_secs(120), || {
            let n = watch.jobs_of(cluster, &uid);
            async move { Ok(n > 0) }
        })
        .await?;
    }
    Ok(runs)
}

/// Settles `runs`; their outcomes, each with `held` and `detail`.
async fn ended(
    s: &mut Scene,
    runs: &[Submitted],
    held: bool,
    detail: &str,
) -> Result<Vec<Outcome>> {
    let mut outcomes = Vec::new();
    for run in runs {
        let last = s.settle(run, super::DEADLINE + super::GRACE).await?;
        outcomes.push(s.outcome(run, &last, held, detail.to_string()));
    }
    Ok(outcomes)
}

/// The API's certificate and CA: the CA file every client reads (the plugin's and the agent's
/// `--ca-file`, the replicas' `--peer-ca-file`) gets old + new; the certificate and key are
/// replaced by the new CA's; then the CA file holds the new CA alone. A client trusting only
/// the old CA must then be refused; one trusting the new CA served.
pub(crate) async fn api_certificate_and_ca(s: &mut Scene) -> Result<Vec<Outcome>> {
    let runs = in_flight(s).await?;
    let tls = s.w.dispatch.tls.clone();
    let old_ca = std::fs::read_to_string(&tls.ca)?;
    let next = NextTls::generate(2)?;
    std::fs::write(&tls.ca, format!("{old_ca}{}", next.ca_pem))?;
    tokio::time::sleep(IN_FORCE).await;
    std::fs::write(&tls.key, &next.key_pem)?;
    std::fs::write(&tls.cert, &next.cert_pem)?;
    tokio::time::sleep(IN_FORCE).await;
    std::fs::write(&tls.ca, &next.ca_pem)?;
    tokio::time::sleep(IN_FORCE).await;
    let dir = s.w.dispatch.dir.clone();
    let (old_only, new_only) = (dir.join("ca-old.crt"), dir.join("ca-new.crt"));
    std::fs::write(&old_only, &old_ca)?;
    std::fs::write(&new_only, &next.ca_pem)?;
    let token = s.w.dispatch.agent_token.clone();
    let path = "/v1/agents/cluster-b/work";
    let with_old = call_as(&s.w.url, &token, &old_only, path).await?;
    let with_new = call_as(&s.w.url, &token, &new_only, path).await?;
    let old_refused = with_old.starts_with("transient") && with_old.contains("ertificate");
    let new_served = !with_new.starts_with("transient");
    let held = old_refused && new_served;
    let detail = format!(
        "old CA alone: {with_old:.120}; new CA alone: {with_new:.60}; old refused: \
         {old_refused}, new served: {new_served}"
    );
    ended(s, &runs, held, &detail).await
}

/// A random HS256 key.
fn new_key() -> String {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..48)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

/// `rollouts-dispatch work-keys` for `keys` (in order: the first signs).
fn work_keys(binary: &Path, keys: &[&Path]) -> Result<Vec<u8>> {
    let mut cmd = Command::new(binary);
    cmd.arg("work-keys");
    for k in keys {
        cmd.arg("--jwt-key-file").arg(k);
    }
    let out = cmd.output()?;
    ensure!(out.status.success(), "work-keys: {out:?}");
    Ok(out.stdout)
}

/// `rollouts-dispatch token issue` with `key`: (token, the token id from its stderr).
fn issue(binary: &Path, key: &Path, destination: Option<&str>) -> Result<(Vec<u8>, String)> {
    let mut cmd = Command::new(binary);
    cmd.args(["token", "issue", "--ttl", "1h", "--key-file"])
        .arg(key);
    match destination {
        Some(d) => cmd.args(["--destination", d]),
        None => cmd.args(["--subject", "argo-rollouts-controller", "--project", "*"]),
    };
    let out = cmd.output()?;
    ensure!(out.status.success(), "token issue: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let id = stderr
        .split_whitespace()
        .skip_while(|w| *w != "id")
        .nth(1)
        .context("no token id on stderr")?
        .to_string();
    Ok((out.stdout, id))
}

/// The second JWT key file and the revocation file, named at every replica's start from now on
/// (the procedure's precondition); the replicas are rolled once to take them.
async fn prepare_keys(s: &mut Scene) -> Result<(PathBuf, PathBuf)> {
    let dir = s.w.dispatch.dir.clone();
    let (second, revoked) = (dir.join("jwt-2.key"), dir.join("revoked.ids"));
    if !s.w.dispatch.more_serve_args.is_empty() {
        return Ok((second, revoked));
    }
    std::fs::write(&second, "")?;
    std::fs::write(&revoked, "# revoked token ids\n")?;
    s.w.dispatch.more_serve_args = vec![
        "--jwt-key-file".into(),
        second.display().to_string(),
        "--revoked-tokens-file".into(),
        revoked.display().to_string(),
    ];
    let base = s.base_config.clone();
    s.roll_replicas(&base).await?;
    Ok((second, revoked))
}

/// The JWT key, with the work-signing keys derived from it (the agent pins them): the agent
/// pins new + old; the new key goes into the second file; the plugin and the agent get tokens
/// of the new key; the files swap (the new key signs); once the runs started before the swap
/// ended, the old key's file is emptied and the agent pins the new key alone. A token of the old
/// key must then be refused, and a verification after the rotation end right.
pub(crate) async fn signing_key(s: &mut Scene) -> Result<Vec<Outcome>> {
    let (second, _) = prepare_keys(s).await?;
    let runs = in_flight(s).await?;
    let d = &s.w.dispatch;
    let (binary, first, pinned) = (d.binary.clone(), d.key.clone(), d.work_keys.clone());
    let staged = d.dir.join("jwt-new.key");
    let old = std::fs::read_to_string(&first)?;
    std::fs::write(&staged, new_key())?;
    let old_staged = d.dir.join("jwt-old.key");
    std::fs::write(&old_staged, &old)?;
    // 1. The agent pins both; 2. the new key verifies too.
    std::fs::write(&pinned, work_keys(&binary, &[&staged, &old_staged])?)?;
    std::fs::write(&second, std::fs::read(&staged)?)?;
    tokio::time::sleep(IN_FORCE).await;
    // 3. New tokens; the old agent token is kept to be tried at the end.
    let old_agent_token = d.dir.join("agent-b.old-key.token");
    std::fs::copy(&d.agent_token, &old_agent_token)?;
    let (plugin, _) = issue(&binary, &staged, None)?;
    std::fs::write(&d.plugin_token, plugin)?;
    let (agent, _) = issue(&binary, &staged, Some("cluster-b"))?;
    std::fs::write(&d.agent_token, agent)?;
    tokio::time::sleep(IN_FORCE).await;
    // 4. The new key signs.
    std::fs::write(&first, std::fs::read(&staged)?)?;
    std::fs::write(&second, &old)?;
    tokio::time::sleep(IN_FORCE).await;
    let mut outcomes = ended(s, &runs, true, "in flight through the key rotation").await?;
    // The retention and a sweep, so that the Jobs the old key marked are swept while it still
    // verifies (docs/security.md, step 5).
    tokio::time::sleep(super::RETENTION + 2 * super::SWEEP_EVERY + IN_FORCE).await;
    // 5. The old key's file emptied; 6. the agent pins the new key alone.
    std::fs::write(&second, "")?;
    std::fs::write(&pinned, work_keys(&binary, &[&staged])?)?;
    tokio::time::sleep(IN_FORCE).await;
    let (ca, url) = (s.w.dispatch.ca.clone(), s.w.url.clone());
    let answer = call_as(&url, &old_agent_token, &ca, "/v1/agents/cluster-b/work").await?;
    // The client takes a 401 for a retry (a token being rotated): its message says why.
    let refused = answer.contains("(401 Unauthorized)") && answer.contains("does not match");
    let after = in_flight_short(s).await?;
    outcomes.extend(
        ended(
            s,
            &after,
            refused,
            &format!("after the rotation; the old key's token: {answer:.100}"),
        )
        .await?,
    );
    Ok(outcomes)
}

/// One verification on each destination of a few seconds.
async fn in_flight_short(s: &mut Scene) -> Result<Vec<Submitted>> {
    let mut runs = Vec::new();
    for (destination, exit) in [("cluster-a", 1), ("cluster-b", 0)] {
        let v = s.verification(destination, exit, "3s");
        runs.push(s.submit(&v, destination).await?);
    }
    Ok(runs)
}

/// An agent's token: a new one is issued and written to the agent's token file; after a long
/// poll and the reload, the old one's id is revoked. The old token must then be refused.
pub(crate) async fn agent_token(s: &mut Scene) -> Result<Vec<Outcome>> {
    let (_, revoked) = prepare_keys(s).await?;
    let runs = in_flight(s).await?;
    let d = &s.w.dispatch;
    let (binary, key, token) = (d.binary.clone(), d.key.clone(), d.agent_token.clone());
    let old_token = d.dir.join("agent-b.old.token");
    std::fs::copy(&token, &old_token)?;
    let old_id = token_id(&std::fs::read_to_string(&old_token)?)?;
    let (fresh, _) = issue(&binary, &key, Some("cluster-b"))?;
    std::fs::write(&token, fresh)?;
    // The agent's long poll (--poll-wait 10s) ends with the old token; then the revocation.
    tokio::time::sleep(Duration::from_secs(10) + IN_FORCE).await;
    std::fs::write(&revoked, format!("# revoked token ids\n{old_id}\n"))?;
    tokio::time::sleep(IN_FORCE).await;
    let (ca, url) = (s.w.dispatch.ca.clone(), s.w.url.clone());
    let answer = call_as(&url, &old_token, &ca, "/v1/agents/cluster-b/work").await?;
    let refused = answer.contains("(401 Unauthorized)") && answer.contains("revoked");
    ended(
        s,
        &runs,
        refused,
        &format!("old token {old_id}: {answer:.100}"),
    )
    .await
}

/// The `jti` of a JWT, read from its payload.
fn token_id(token: &str) -> Result<String> {
    use base64::Engine;
    let payload = token.trim().split('.').nth(1).context("not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload)?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes)?;
    Ok(claims["jti"].as_str().context("no jti")?.to_string())
}

/// `kubectl` on `cluster` as its admin.
fn kubectl(cluster: &Cluster, args: &[&str]) -> Result<String> {
    let out = Command::new(&cluster.binaries.kubectl)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .args(args)
        .output()?;
    ensure!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A ServiceAccount `name` on `cluster` bound to cluster-admin; a token of it.
fn service_account_token(cluster: &Cluster, name: &str) -> Result<String> {
    kubectl(
        cluster,
        &["create", "serviceaccount", name, "-n", "default"],
    )?;
    kubectl(
        cluster,
        &[
            "create",
            "clusterrolebinding",
            name,
            "--clusterrole=cluster-admin",
            &format!("--serviceaccount=default:{name}"),
        ],
    )?;
    kubectl(
        cluster,
        &["create", "token", name, "-n", "default", "--duration", "1h"],
    )
}

/// cluster-a-slow's kubeconfig with `token` instead of the admin's.
fn write_with_token(s: &Scene, token: &str) -> Result<()> {
    let text = std::fs::read_to_string(&s.slow_kubeconfig)?;
    let admin = &s.w.a.token;
    ensure!(
        text.contains(admin.as_str()) || text.contains("token: "),
        "no token in the kubeconfig"
    );
    let rewritten: String = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("token: ") {
            Some(_) => format!("{}token: {token}\n", &l[..l.len() - l.trim_start().len()]),
            None => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&s.slow_kubeconfig, rewritten)?;
    Ok(())
}

/// cluster-a-slow's kubeconfig: a ServiceAccount's token, then (while a run is in flight)
/// another's, then the first ServiceAccount deleted (its tokens refused by cluster-a from then
/// on). The run in flight and one after must end right; each replica logs that it reloaded.
pub(crate) async fn destination_kubeconfig(s: &mut Scene) -> Result<Vec<Outcome>> {
    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_secs();
    let (first, second) = (format!("rd-rot-{stamp}-1"), format!("rd-rot-{stamp}-2"));
    let t1 = service_account_token(&s.w.a, &first)?;
    let t2 = service_account_token(&s.w.a, &second)?;
    write_with_token(s, &t1)?;
    tokio::time::sleep(IN_FORCE).await;
    let v = s.verification(SLOW, 0, "30s");
    let run = s.submit(&v, "cluster-a").await?;
    let watch = s.watch.clone();
    let uid = run.uid.clone();
    eventually("the run's Job", Duration::from_secs(120), || {
        let n = watch.jobs_of("cluster-a", &uid);
        async move { Ok(n > 0) }
    })
    .await?;
    write_with_token(s, &t2)?;
    tokio::time::sleep(IN_FORCE).await;
    kubectl(
        &s.w.a,
        &["delete", "serviceaccount", &first, "-n", "default"],
    )?;
    kubectl(&s.w.a, &["delete", "clusterrolebinding", &first])?;
    let reloaded = s.w.dispatch.replicas.iter().all(|r| {
        std::fs::read_to_string(s.w.control.log_path(&r.name))
            .unwrap_or_default()
            .contains("reloaded from changed files")
    });
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await?;
    let mut outcomes = vec![s.outcome(
        &run,
        &last,
        reloaded,
        format!("in flight through the rotation; every replica logged the reload: {reloaded}"),
    )];
    let v = s.verification(SLOW, 1, "3s");
    let after = s.submit(&v, "cluster-a").await?;
    let last = s.settle(&after, super::DEADLINE + super::GRACE).await?;
    outcomes.push(s.outcome(
        &after,
        &last,
        true,
        "after the old ServiceAccount was deleted".into(),
    ));
    // Back to the admin's token for what follows.
    let admin = s.w.a.token.clone();
    write_with_token(s, &admin)?;
    tokio::time::sleep(IN_FORCE).await;
    kubectl(
        &s.w.a,
        &["delete", "serviceaccount", &second, "-n", "default"],
    )?;
    kubectl(&s.w.a, &["delete", "clusterrolebinding", &second])?;
    Ok(outcomes)
}

/// How long after a new `tokenFile` is written the agent surely uses it: kube-rs reads the file
/// again once its copy is 50 s old (kube-client 5.0 `client/auth/mod.rs` `TokenFile`), with
/// room for a busy machine.
const TOKEN_FILE_FOLLOWED: Duration = Duration::from_secs(65);

/// The agent's credential on its own cluster: the ServiceAccount token in the file its
/// kubeconfig names (`tokenFile`, as a pod's projected token the kubelet renews), replaced
/// while a verification runs on cluster-b, then every earlier token revoked (the Secrets they
/// were bound to deleted). The agent follows the file: the run in flight and one after end
/// right, and cluster-b's API server refuses the old token. An agent that kept its first token
/// would be refused from the revocation on (the run in flight could not be observed nor its Job
/// deleted, the run after not created). A fixed token outlived by the test failed the 2-hour
/// soak's last deletions (#32).
pub(crate) async fn agent_cluster_token(s: &mut Scene) -> Result<Vec<Outcome>> {
    let old = std::fs::read_to_string(agent_sa_token_file(&s.w.b))?;
    let v = s.verification("cluster-b", 1, "100s");
    let run = s.submit(&v, "cluster-b").await?;
    let (watch, uid) = (s.watch.clone(), run.uid.clone());
    eventually("the run's Job", Duration::from_secs(120), || {
        let n = watch.jobs_of("cluster-b", &uid);
        async move { Ok(n > 0) }
    })
    .await?;
    let kept = renew_agent_sa_token(&s.w.b)?;
    tokio::time::sleep(TOKEN_FILE_FOLLOWED).await;
    let selector = format!("{AGENT_TOKEN_SECRET_LABEL}=true");
    let ns = ["-n", "rollouts-dispatch"];
    let secrets = kubectl(
        &s.w.b,
        &[&["get", "secrets", "-l", &selector, "-o", "name"][..], &ns].concat(),
    )?;
    for secret in secrets
        .lines()
        .filter(|l| !l.ends_with(&format!("/{kept}")))
    {
        kubectl(&s.w.b, &[&["delete", secret][..], &ns].concat())?;
    }
    let refused = refused_by_api_server(&s.w.b, &old).await;
    let last = s.settle(&run, super::DEADLINE + super::GRACE).await?;
    let mut outcomes = vec![s.outcome(
        &run,
        &last,
        refused.is_ok(),
        format!("in flight through the rotation; the old token: {refused:?}"),
    )];
    let v = s.verification("cluster-b", 0, "3s");
    let after = s.submit(&v, "cluster-b").await?;
    let last = s.settle(&after, super::DEADLINE + super::GRACE).await?;
    outcomes.push(s.outcome(
        &after,
        &last,
        true,
        "after the old token was revoked".into(),
    ));
    Ok(outcomes)
}

/// `Ok` with its answer once `b`'s API server refuses `token` (401) within a minute: a
/// revocation is in force within seconds (the API server caches token reviews for 10 s).
async fn refused_by_api_server(b: &Cluster, token: &str) -> Result<String> {
    let until = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = Command::new(&b.binaries.kubectl)
            .args(["--kubeconfig", "/dev/null", "--server", &b.server])
            .arg("--certificate-authority")
            .arg(&b.ca_file)
            .args(["--token", token, "get", "jobs", "-n", "default"])
            .output()?;
        let answer = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if answer.contains("Unauthorized") {
            return Ok(answer);
        }
        ensure!(
            std::time::Instant::now() < until,
            "still accepted a minute after its Secret was deleted: {answer:.200}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
