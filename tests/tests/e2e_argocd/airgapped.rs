//! `config/kargo-stage-airgapped.yaml`'s promotion and verification against the real Argo CD:
//! the commit the `git-push` step would push, then the Stage's two `http` steps as Kargo's `http`
//! step sends them (method, URL, headers and body from the file, with the Stage's vars; akuity/
//! kargo pkg/promotion/runner/builtin/http_requester.go at 1c764767: sent again after
//! `pollInterval` while neither expression is met, :186-201; failed once `failureExpression` is,
//! :137-159), then the Stage's AnalysisTemplate `application-healthy` as the verification.
//!
//! Kargo's expression language is not evaluated here: each step's expressions are checked to be
//! the ones this file implements (the same text), and implemented in Rust on the response
//! (`{status, body}`, :409-441). The `pollInterval`s are the file's divided by 5, to keep the
//! test short; a project token (`token issue --project kargo-demo`, what the file's Secret
//! holds) is the bearer.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use dispatch_tests::analysis::{measurement_message, phase};
use dispatch_tests::artifacts::repo_path;
use dispatch_tests::cluster::{argocd, argocd_real};
use dispatch_tests::kargo::{Verification, PROJECT};
use kube::api::{Patch, PatchParams};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{
    app_spec, on_scene, record, run_report, shop_manifests, verdict, Scene, ARGOCD_TIMEOUT,
};

/// The Stage's name in the file, which the Application must authorize.
const STAGE: &str = "edge-2";

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn the_airgapped_stages_http_steps_and_verification_run_against_the_real_argo_cd() -> Result<()> {
    on_scene(async |s| {
        let outcome = airgapped(s).await;
        record(
            "airgapped_flow",
            if outcome.is_ok() { "ok" } else { "failed" },
        )?;
        outcome
    })
}

/// The YAML documents of the file.
fn documents() -> Result<Vec<Value>> {
    let path = repo_path("config/kargo-stage-airgapped.yaml");
    let text = std::fs::read_to_string(&path)?;
    text.split("\n---\n")
        .map(|d| serde_saphyr::from_str(d).with_context(|| format!("parsing {}", path.display())))
        .collect()
}

/// `${{ vars.<name> }}` and `${{ ctx.stage }}` of `template` replaced.
fn expand(template: &str, vars: &[(&str, &str)]) -> String {
    let mut out = template.replace("${{ ctx.stage }}", STAGE);
    for (name, value) in vars {
        out = out.replace(&format!("${{{{ vars.{name} }}}}"), value);
    }
    out
}

/// One `http` step as the file configures it.
struct Step {
    method: reqwest::Method,
    url: String,
    config: Value,
    poll: Duration,
}

impl Step {
    fn of(stage: &Value, alias: &str, vars: &[(&str, &str)]) -> Result<Self> {
        let step = stage["spec"]["promotionTemplate"]["spec"]["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["uses"] == "http" && s["as"] == alias)
            .with_context(|| format!("no http step `{alias}` in the Stage"))?;
        let config = step["config"].clone();
        let text = |k: &str| config[k].as_str().unwrap_or_default().to_string();
        let poll = humantime::parse_duration(&text("pollInterval"))
            .with_context(|| format!("step {alias}: pollInterval"))?;
        Ok(Self {
            method: text("method").parse()?,
            url: expand(&text("url"), vars),
            poll: poll / 5,
            config,
        })
    }

    /// The step's expression `key`, whitespace folded.
    fn expression(&self, key: &str) -> String {
        self.config[key]
            .as_str()
            .unwrap_or_default()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Sends the request until `judge` says done (`Some(Ok)`) or failed (`Some(Err)`).
    async fn run(
        &self,
        http: &reqwest::Client,
        token: &str,
        body: Option<&Value>,
        judge: impl Fn(u16, &Value) -> Option<Result<()>>,
    ) -> Result<Value> {
        let deadline = Instant::now() + ARGOCD_TIMEOUT;
        loop {
            let mut request = http
                .request(self.method.clone(), &self.url)
                .header("Authorization", format!("Bearer {token}"));
            if let Some(body) = body {
                request = request
                    .header("Content-Type", "application/json")
                    .body(body.to_string());
            }
            let response = request.send().await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            match judge(status, &body) {
                Some(Ok(())) => return Ok(body),
                Some(Err(e)) => return Err(e.context(format!("{} {}", self.method, self.url))),
                None if Instant::now() > deadline => {
                    bail!(
                        "{} {}: still {status} {body} after {ARGOCD_TIMEOUT:?}",
                        self.method,
                        self.url
                    )
                }
                None => tokio::time::sleep(self.poll).await,
            }
        }
    }
}

async fn airgapped(s: &Scene) -> Result<()> {
    let docs = documents()?;
    let stage = docs
        .iter()
        .find(|d| d["kind"] == "Stage")
        .context("no Stage in the file")?;
    let template = docs
        .iter()
        .find(|d| d["kind"] == "AnalysisTemplate")
        .context("no AnalysisTemplate in the file")?;
    ensure!(
        stage["metadata"]["name"] == STAGE,
        "the Stage is not {STAGE}"
    );
    let var = |name: &str| {
        stage["spec"]["vars"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["name"] == name)
            .and_then(|v| v["value"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let app = var("app");
    // This scene's server, and its agent destination in place of the file's `edge-2`.
    let vars = [
        ("dispatch", s.w.url.as_str()),
        ("destination", "cluster-b"),
        ("app", app.as_str()),
    ];

    // The remote Argo CD's Application, authorized for the Stage, and the commit `git-push`
    // would push.
    let repo = s.argocd.repo(&app)?;
    // its namespace comes from the sync (CreateNamespace=true, carried into our operation)
    let spec = argocd_real::AppSpec {
        create_namespace: true,
        ..app_spec(&app, &repo, false)
    };
    argocd_real::create_application(&s.b, &spec).await?;
    let authorized = json!({"metadata": {"annotations": {
        argocd::AUTHORIZED_STAGE: format!("{PROJECT}:{STAGE}")}}});
    argocd::applications(&s.b)
        .patch(&app, &PatchParams::default(), &Patch::Merge(&authorized))
        .await?;
    let commit = repo.commit(&shop_manifests("v7", json!({}), json!({})), "my-app v7")?;

    let token =
        s.w.issue_token("kargo-controller", Some(&[PROJECT.to_string()]))?;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(s.w.ca_pem().as_bytes())?)
        .timeout(Duration::from_secs(30))
        .build()?;

    // `sync`: POST …:sync until 202.
    let sync = Step::of(stage, "sync", &vars)?;
    let body_text = sync.config["body"].as_str().unwrap_or_default();
    for part in [
        r#""revision": outputs.push.commit"#,
        r#""refresh": "hard""#,
        r#""stage": ctx.stage"#,
    ] {
        ensure!(
            body_text.contains(part),
            "the sync step's body has no {part}: {body_text}"
        );
    }
    ensure!(
        sync.expression("successExpression") == "response.status == 202"
            && sync.expression("failureExpression")
                == "response.status in [400, 401, 403, 404, 422]",
        "the sync step's expressions changed: implement them here"
    );
    let body = json!({"revision": commit, "refresh": "hard", "stage": STAGE});
    sync.run(&http, &token, Some(&body), |status, body| match status {
        202 => Some(Ok(())),
        400 | 401 | 403 | 404 | 422 => Some(Err(anyhow::anyhow!("{status}: {body}"))),
        _ => None,
    })
    .await?;

    // `synced`: GET until Synced, Healthy, at the commit, the sync Succeeded.
    let synced = Step::of(stage, "synced", &vars)?;
    let success = "response.status == 200 && response.body.sync.status == 'Synced' && \
         response.body.health.status == 'Healthy' && response.body.sync.revision == \
         '${{ outputs.push.commit }}' && response.body.operation?.phase == 'Succeeded'";
    ensure!(
        synced.expression("successExpression") == success,
        "the synced step's successExpression changed: implement it here: {}",
        synced.expression("successExpression")
    );
    let text = |v: &Value, p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let state = synced
        .run(&http, &token, None, |status, body| {
            let at_commit = text(body, "/sync/revision") == commit;
            let op = text(body, "/operation/phase");
            if matches!(status, 400 | 401 | 403 | 404 | 422)
                || (status == 200 && at_commit && matches!(op.as_str(), "Failed" | "Error"))
            {
                let message = text(body, "/message");
                return Some(Err(anyhow::anyhow!("{status}: {message} {body}")));
            }
            (status == 200
                && text(body, "/sync/status") == "Synced"
                && text(body, "/health/status") == "Healthy"
                && at_commit
                && op == "Succeeded")
                .then_some(Ok(()))
        })
        .await?;
    println!("e2e-argocd: airgapped: {} answered {state}", synced.url);

    // The verification: the template's metric, its args as the Stage passes them.
    let block = &template["spec"]["metrics"][0]["provider"]["plugin"]["rollouts-dispatch/job"];
    ensure!(
        block["application"]["name"] == "{{args.app}}"
            && block["application"]["namespace"] == argocd::NAMESPACE,
        "the template's check changed: {block}"
    );
    let check = Verification::new(STAGE, "01jargocd00000000000000006", "cluster-b")
        .observes(json!({"application": {"name": app, "namespace": argocd::NAMESPACE}}));
    let run = verdict(s, None, &check).await?;
    ensure!(
        phase(&run) == "Successful",
        "the verification: {}",
        run_report(&run)
    );
    println!(
        "e2e-argocd: airgapped_flow=ok: {commit} synced through POST/GET, verification {:?}",
        measurement_message(&run)
    );
    Ok(())
}
