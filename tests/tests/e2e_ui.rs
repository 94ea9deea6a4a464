//! Issue #17 end to end, nothing mocked: the full log of a real verification through the log
//! API, the CLI and a real browser.
//!
//! The e2e World (`dispatch_tests::world`: the real Argo Rollouts controller with the plugin, one
//! `rollouts-dispatch serve` with `control` as its control plane, so it watches the runs, and
//! the destinations `a` and `b`). The destination's kwok serves real `pods/log` from files the
//! test writes (`dispatch_tests::cluster::pod_logs`). In project A (`kargo-demo`) a
//! Kargo-shaped verification whose Job has two containers, `check` (the failing check) and
//! `side`, each printing 100 000 numbered lines:
//!
//! * `GET /v1/runs/kargo-demo/<run>/logs` with a project-A JWT returns every line of both
//!   containers, each in order;
//! * `rollouts-dispatch logs <run> -n kargo-demo -f` on a running Job prints lines the test
//!   appends while it follows (`cli_follow=ok`);
//! * a person (a TokenRequest token of a ServiceAccount with a Role `get analysisruns` in A
//!   only) gets 403 on B's run (`tenant-b`);
//! * in Chromium (chromedriver, the W3C WebDriver JSON API over reqwest), that person logs in at
//!   `/ui/login` with their token, sees A's runs (`runs_listed=N`), opens the failing one and
//!   reads the failing container's lines in the page (`failing_log=ok`); B's run is not listed
//!   and its page is 403 (`other_project=hidden`). Screenshots go to `target/e2e-ui/`.
//!
//! `make e2e-ui` installs Debian's `chromium` and `chromium-driver` when missing and runs it.
//! Last line: `ui: login=ok runs_listed=N failing_log=ok other_project=hidden cli_follow=ok`.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine as _;
use dispatch_api::client::{CallError, ClientConfig, ServerClient};
use dispatch_api::logs::LogEvent;
use dispatch_tests::analysis::{self, phase, wait_finished};
use dispatch_tests::artifacts::{repo_path, rollouts_dispatch_binary};
use dispatch_tests::cluster::argo;
use dispatch_tests::cluster::pod_logs::{self, LogFile};
use dispatch_tests::kargo::{Verification, PROJECT, TENANT_B};
use dispatch_tests::ports::free_port;
use dispatch_tests::shared::block_on;
use dispatch_tests::summary;
use dispatch_tests::wait::{eventually, Progress};
use dispatch_tests::world::{Direct, World};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};

/// Lines each container prints in the full-log check.
const LINES: usize = 100_000;
/// Lines the test appends while the CLI follows.
const FOLLOW_LINES: usize = 5;
/// The person of project A (a ServiceAccount of the control plane).
const PERSON: &str = "person-a";

#[test]
#[ignore = "needs the Go-built cluster binaries, the release plugin and chromium: run `make e2e-ui`"]
fn logs_through_the_api_the_cli_and_the_browser() -> Result<()> {
    block_on(async {
        let w = World::start().await?;
        let out = repo_path("target/e2e-ui");
        std::fs::create_dir_all(&out)?;
        let a_client = w.a.client().await?;
        let logs_dir = w.a.dir().join("container-logs");

        // The files the Jobs' containers print on destination a (kwok serves them as pods/log).
        let check = LogFile::create(logs_dir.join("check.log"))?;
        let side = LogFile::create(logs_dir.join("side.log"))?;
        check.append((1..=LINES).map(|i| format!("check {i:06}")))?;
        side.append((1..=LINES).map(|i| format!("side {i:06}")))?;
        let tail = LogFile::create(logs_dir.join("tail.log"))?;
        tail.append(["tail 1"])?;
        let files = [("check", &check), ("side", &side), ("tail", &tail)];
        pod_logs::serve_in_namespace(&a_client, "e2e-ui", None, &files).await?;
        argo::apply_namespace(&w.client, TENANT_B).await?;

        // 1. A failing two-container verification in A (kwok ends every container of the pod
        //    with the check's exit code), and one in B.
        let failing = Verification::new("uat", "01jui000000000000000000001", "cluster-a")
            .exits(1)
            .runs_for("3s");
        let failing = submit(&w, &failing, &["check", "side"], PROJECT).await?;
        let other = Verification::new("uat", "01jui000000000000000000002", "cluster-b");
        let other = submit(&w, &other, &["check"], TENANT_B).await?;
        let other_name = analysis::name(&other).to_owned();
        let failing = w.finished(&failing).await?;
        let failing_name = analysis::name(&failing).to_owned();
        ensure!(
            phase(&failing) == "Failed",
            "run {failing_name} is {}, want Failed",
            phase(&failing)
        );

        let jwt = project_jwt(&w)?;
        let api = api_client(&w)?;
        let path = format!("/v1/runs/{PROJECT}/{failing_name}/logs");
        let events = read_log(&api, &path, &jwt).await?;
        check_full_log(&events)?;
        println!("e2e-ui: GET {path} returned the {LINES} lines of check and of side, in order");

        // 2. A person with `get analysisruns` in A only: 403 on B's run.
        let person = person_token(&w).await?;
        let b_path = format!("/v1/runs/{TENANT_B}/{other_name}/logs");
        match api.get_lines(&b_path, Some(&person), |_| {}).await {
            Err(CallError::Rejected(e)) if e.message.contains("403") => {
                println!("e2e-ui: {PERSON} on {b_path}: {}", e.message);
            }
            other => bail!("{PERSON} on {b_path}: {other:?}, want 403"),
        }

        // 3. The CLI follows a running Job.
        let cli_follow = cli_follows(&w, &tail, &jwt).await?;

        // 4. The browser.
        let ui = browse(&w, &person, &failing_name, &other_name, &out).await?;
        summary::report(&format!("ui: {ui} cli_follow={cli_follow}"))
    })
}

/// Creates the run of `verification` in `namespace`, its Job's containers named `containers`
/// (the first is the check; the others copy it). Outside A it has no Freight to belong to.
async fn submit(
    w: &World<Direct>,
    verification: &Verification,
    containers: &[&str],
    namespace: &str,
) -> Result<DynamicObject> {
    let mut run = verification.analysis_run(&w.freight)?;
    let block = run.data["spec"]["metrics"][0]["provider"]["plugin"]
        .as_object_mut()
        .and_then(|plugin| plugin.values_mut().next())
        .context("the run has a plugin block")?;
    let spec = &mut block["spec"]["template"]["spec"];
    let first = spec["containers"][0].clone();
    spec["containers"] = containers
        .iter()
        .map(|name| {
            let mut c = first.clone();
            c["name"] = json!(name);
            c
        })
        .collect();
    if namespace != PROJECT {
        run.metadata.namespace = Some(namespace.to_owned());
        run.metadata.owner_references = None;
    }
    let name = analysis::name(&run).to_owned();
    argo::analysis_runs(&w.client, namespace)
        .create(&PostParams::default(), &run)
        .await
        .with_context(|| format!("creating AnalysisRun {namespace}/{name}"))
}

/// A JWT bound to project A, signed with the World's key.
fn project_jwt(w: &World<Direct>) -> Result<String> {
    w.issue_token("e2e-ui", Some(&[PROJECT.to_owned()]))
}

fn api_client(w: &World<Direct>) -> Result<ServerClient> {
    Ok(ServerClient::new(&ClientConfig {
        server: w.url.clone(),
        token_file: None,
        ca_file: Some(w.ca_file().to_path_buf()),
        ca_only: true,
        insecure_plaintext: false,
        timeout: Duration::from_secs(600),
    })?)
}

/// Every event of the log at `path`.
async fn read_log(api: &ServerClient, path: &str, token: &str) -> Result<Vec<LogEvent>> {
    let mut events = Vec::new();
    let mut bad = None;
    api.get_lines(path, Some(token), |line| match serde_json::from_str(line) {
        Ok(e) => events.push(e),
        Err(e) => bad = Some(format!("{line:?}: {e}")),
    })
    .await
    .with_context(|| format!("GET {path}"))?;
    if let Some(bad) = bad {
        bail!("GET {path}: a line is no LogEvent: {bad}");
    }
    Ok(events)
}

/// Both containers' lines, every number once and in order; nothing else but notes.
fn check_full_log(events: &[LogEvent]) -> Result<()> {
    for container in ["check", "side"] {
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                LogEvent::Line {
                    container: c, text, ..
                } if c == container => Some(text.as_str()),
                _ => None,
            })
            .collect();
        let expected: Vec<String> = (1..=LINES).map(|i| format!("{container} {i:06}")).collect();
        if texts != expected {
            let first_wrong = texts.iter().zip(&expected).position(|(a, b)| a != b);
            bail!(
                "container {container}: {} lines, first out of place at {first_wrong:?}, want {LINES} \
                 numbered in order; notes: {:?}",
                texts.len(),
                events.iter().filter(|e| matches!(e, LogEvent::Note { .. })).take(5).collect::<Vec<_>>()
            );
        }
    }
    Ok(())
}

/// A ServiceAccount `person-a` on the control plane with `get analysisruns` in A only, and a
/// token for it (TokenRequest): the person the pages and the log API meet.
async fn person_token(w: &World<Direct>) -> Result<String> {
    let pp = PostParams::default();
    let accounts: Api<ServiceAccount> = Api::namespaced(w.client.clone(), PROJECT);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(PERSON.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts
        .create(&pp, &account)
        .await
        .context("creating the person's ServiceAccount")?;
    let role = Role {
        metadata: ObjectMeta {
            name: Some(PERSON.into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["argoproj.io".into()]),
            resources: Some(vec!["analysisruns".into()]),
            verbs: vec!["get".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(w.client.clone(), PROJECT)
        .create(&pp, &role)
        .await?;
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some(PERSON.into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: PERSON.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: PERSON.into(),
            namespace: Some(PROJECT.into()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(w.client.clone(), PROJECT)
        .create(&pp, &binding)
        .await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = accounts
        .create_token_request(PERSON, &pp, &request)
        .await
        .context("TokenRequest for the person")?;
    issued
        .status
        .and_then(|s| s.token)
        .context("the TokenRequest returned no token")
}

/// `rollouts-dispatch logs RUN -n A -f` on a running Job: the lines the test appends while it
/// follows reach its output, and it exits once the Job's containers end.
async fn cli_follows(w: &World<Direct>, tail: &LogFile, jwt: &str) -> Result<&'static str> {
    let running =
        Verification::new("uat", "01jui000000000000000000003", "cluster-a").runs_for("25s");
    let run = submit(w, &running, &["tail"], PROJECT).await?;
    let name = analysis::name(&run).to_owned();
    let token_file = w.dispatch.dir.join("e2e-ui.token");
    std::fs::write(&token_file, jwt)?;
    let mut cli = tokio::process::Command::new(rollouts_dispatch_binary()?)
        .args(["logs", &name, "-n", PROJECT, "-f", "--server", &w.url])
        .arg("--token-file")
        .arg(&token_file)
        .arg("--ca-file")
        .arg(w.ca_file())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting rollouts-dispatch logs -f")?;
    let mut lines = BufReader::new(cli.stdout.take().context("stdout")?).lines();
    let mut seen: Vec<String> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut appended = 1;
    let mut next_append = Instant::now() + Duration::from_secs(2);
    loop {
        let wait = next_append
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(50));
        tokio::select! {
            line = lines.next_line() => match line? {
                Some(l) => seen.push(l),
                None => break,
            },
            () = tokio::time::sleep(wait) => {
                if appended < FOLLOW_LINES + 1 {
                    appended += 1;
                    tail.append([format!("tail {appended}")])?;
                    next_append = Instant::now() + Duration::from_secs(1);
                } else {
                    next_append = Instant::now() + Duration::from_secs(3600);
                }
            }
        }
        if Instant::now() > deadline {
            bail!("rollouts-dispatch logs -f did not end within 120 s; it printed {seen:?}");
        }
    }
    let status = cli.wait().await?;
    let want: Vec<String> = (1..=appended).map(|i| format!("tail {i}")).collect();
    let got: Vec<&str> = seen
        .iter()
        .filter_map(|l| l.rsplit("] ").next())
        .filter(|t| t.starts_with("tail "))
        .collect();
    ensure!(
        got == want,
        "rollouts-dispatch logs -f printed {seen:?}, want the lines {want:?}"
    );
    let decided = wait_finished(&w.runs(), &name).await?;
    ensure!(
        status.success(),
        "rollouts-dispatch logs -f exited {status}; run {}",
        phase(&decided)
    );
    Ok("ok")
}

/// Drives Chromium as the person; returns `login=ok runs_listed=N failing_log=ok other_project=hidden`.
async fn browse(
    w: &World<Direct>,
    person: &str,
    failing: &str,
    other: &str,
    out: &Path,
) -> Result<String> {
    let driver = Driver::start().await?;
    let s = driver.session().await?;
    let seen = browse_in(&s, w, person, failing, other, out).await;
    // The browser goes with its session, before the driver is killed (a chromedriver killed
    // under an open session leaves Chromium running, orphaned).
    let quit = s.quit().await;
    let seen = seen?;
    quit?;
    Ok(seen)
}

/// What the person sees in the browser session `s`.
async fn browse_in(
    s: &Session<'_>,
    w: &World<Direct>,
    person: &str,
    failing: &str,
    other: &str,
    out: &Path,
) -> Result<String> {
    s.go(&format!("{}/ui/login", w.url)).await?;
    s.type_into("#token", person).await?;
    s.click("#login").await?;
    let who = eventually("the person logged in", Duration::from_secs(30), || async {
        Ok(match s.text("#who").await {
            Ok(t) if !t.is_empty() => Progress::Done(t),
            Ok(_) => Progress::Waiting("empty #who".into()),
            Err(e) => Progress::Waiting(e.to_string()),
        })
    })
    .await?;
    s.screenshot(&out.join("list.png")).await?;
    let rows = s.all_attr("tr.run", "data-run").await?;
    ensure!(
        rows.iter().any(|r| r == &format!("{PROJECT}/{failing}")),
        "{who} sees {rows:?}, not {PROJECT}/{failing}"
    );
    ensure!(
        !rows.iter().any(|r| r.starts_with(&format!("{TENANT_B}/"))),
        "{who} sees B's runs: {rows:?}"
    );
    let listed = rows.len();
    s.click(&format!(
        "tr.run[data-run=\"{PROJECT}/{failing}\"] a.run-link"
    ))
    .await?;
    let want = format!("check {LINES:06}");
    eventually(
        "the failing container's log in the page",
        Duration::from_secs(120),
        || async {
            let text = s.text("#logs").await.unwrap_or_default();
            Ok(if text.contains(&want) && text.contains("check 000001") {
                Progress::Done(())
            } else {
                Progress::Waiting(format!(
                    "{} characters of log, status {:?}",
                    text.len(),
                    s.text("#logs-status").await.ok()
                ))
            })
        },
    )
    .await?;
    s.screenshot(&out.join("run.png")).await?;
    s.go(&format!("{}/ui/runs/{TENANT_B}/{other}", w.url))
        .await?;
    let problem = s.text("#problem").await.unwrap_or_default();
    let status = http_status_of_page(w, person, other).await?;
    s.screenshot(&out.join("other.png")).await?;
    ensure!(
        status == 403,
        "B's run page answered {status} to {who}: {problem}"
    );
    Ok(format!(
        "login=ok runs_listed={listed} failing_log=ok other_project=hidden"
    ))
}

/// The HTTP status of B's run page for the person's session (the browser does not expose it).
async fn http_status_of_page(w: &World<Direct>, person: &str, other: &str) -> Result<u16> {
    let ca = reqwest::Certificate::from_pem(w.ca_pem().as_bytes())?;
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()?;
    let resp = http
        .get(format!("{}/ui/runs/{TENANT_B}/{other}", w.url))
        .bearer_auth(person)
        .send()
        .await?;
    Ok(resp.status().as_u16())
}

/// chromedriver on a free port, in a process group of its own with the browsers it starts:
/// the group is killed on drop, so no Chromium outlives the test even when a session was left
/// open (an error, a panic).
struct Driver {
    child: tokio::process::Child,
    url: String,
    http: reqwest::Client,
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.start_kill();
    }
}

impl Driver {
    async fn start() -> Result<Self> {
        let port = free_port()?;
        let child = tokio::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .context("starting chromedriver (make e2e-ui installs chromium-driver)")?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::builder().build()?;
        let status = format!("{url}/status");
        eventually(
            "chromedriver /status ready",
            Duration::from_secs(30),
            || async {
                Ok(match http.get(&status).send().await {
                    Ok(r) => match r.json::<Value>().await {
                        Ok(v) if v["value"]["ready"] == json!(true) => Progress::Done(()),
                        Ok(v) => Progress::Waiting(v.to_string()),
                        Err(e) => Progress::Waiting(e.to_string()),
                    },
                    Err(e) => Progress::Waiting(e.to_string()),
                })
            },
        )
        .await?;
        Ok(Self { child, url, http })
    }

    async fn session(&self) -> Result<Session<'_>> {
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "acceptInsecureCerts": true,
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--ignore-certificate-errors",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"]
            }
        }}});
        let v = call(
            &self.http,
            reqwest::Method::POST,
            &format!("{}/session", self.url),
            Some(caps),
        )
        .await?;
        let id = v["sessionId"]
            .as_str()
            .context("new session: no sessionId")?
            .to_owned();
        Ok(Session {
            driver: self,
            base: format!("{}/session/{id}", self.url),
        })
    }
}

/// One WebDriver session (W3C WebDriver, https://www.w3.org/TR/webdriver2/).
struct Session<'a> {
    driver: &'a Driver,
    base: String,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Session<'_> {
    /// Ends the session: chromedriver closes its browser (W3C WebDriver "Delete Session").
    async fn quit(&self) -> Result<()> {
        call(&self.driver.http, reqwest::Method::DELETE, &self.base, None)
            .await
            .map(drop)
            .context("deleting the WebDriver session")
    }
    async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value> {
        call(
            &self.driver.http,
            method,
            &format!("{}{path}", self.base),
            body,
        )
        .await
    }
    async fn go(&self, url: &str) -> Result<()> {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await
            .map(drop)
    }
    async fn find(&self, css: &str) -> Result<String> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await
            .with_context(|| format!("finding {css}"))?;
        v[ELEMENT]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("{css}: {v}"))
    }
    async fn type_into(&self, css: &str, text: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/value"),
            Some(json!({"text": text})),
        )
        .await
        .map(drop)
    }
    async fn click(&self, css: &str) -> Result<()> {
        let id = self.find(css).await?;
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{id}/click"),
            Some(json!({})),
        )
        .await
        .map(drop)
    }
    async fn text(&self, css: &str) -> Result<String> {
        let id = self.find(css).await?;
        let v = self
            .cmd(reqwest::Method::GET, &format!("/element/{id}/text"), None)
            .await?;
        Ok(v.as_str().unwrap_or_default().to_owned())
    }
    async fn all_attr(&self, css: &str, attr: &str) -> Result<Vec<String>> {
        let v = self
            .cmd(
                reqwest::Method::POST,
                "/elements",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        let mut out = Vec::new();
        for e in v.as_array().into_iter().flatten() {
            let id = e[ELEMENT].as_str().context("an element without id")?;
            let a = self
                .cmd(
                    reqwest::Method::GET,
                    &format!("/element/{id}/attribute/{attr}"),
                    None,
                )
                .await?;
            out.push(a.as_str().unwrap_or_default().to_owned());
        }
        Ok(out)
    }
    async fn screenshot(&self, path: &Path) -> Result<()> {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().context("screenshot: no data")?)?;
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }
}

/// One WebDriver command; its `value`, or the error it answered.
async fn call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) -> Result<Value> {
    let mut req = http.request(method, url);
    if let Some(body) = body {
        req = req.json(&body);
    }
    let resp = req
        .send()
        .await
        .with_context(|| format!("WebDriver {url}"))?;
    let status = resp.status();
    let v: Value = resp
        .json()
        .await
        .with_context(|| format!("WebDriver {url}: no JSON"))?;
    if !status.is_success() {
        bail!("WebDriver {url}: {status} {}", v["value"]);
    }
    Ok(v["value"].clone())
}
