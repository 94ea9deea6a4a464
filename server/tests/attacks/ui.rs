//! The pages for people (`/ui`): no session → the login page and nothing else; a session
//! holding a token bound to another project → 403 on the run page and the run left out of the
//! list; an agent token → no session (its login is 403, sets no cookie; put in the cookie
//! itself it is no session); a login posted from another site → 403; a hostile run message
//! (XSS) → escaped, under a policy that allows no script but ours; a person (a Kubernetes
//! token) sees only the runs of the namespaces a SubjectAccessReview allows them, and the
//! destinations page lists only the destinations of the projects the viewer may see. Sessions are
//! the server's (`http::sessions`): the cookie carries a random id and never the token, a
//! session logged out or past its lifetime opens nothing. None of it makes a destination API
//! call.

use anyhow::{ensure, Result};
use dispatch_api::block::PLUGIN_NAME;
use serde_json::json;

use dispatch_server::http::sessions::SESSION_COOKIE;

use crate::fake_api::Res;
use crate::scene::{agent_token, plugin_token, Scene, TENANTS_POLICY};
use crate::tally::{self, Outcome};
use crate::world::World;

const XSS: &str = "<script>alert('owned')</script><img src=x onerror=alert(1)>";

/// A failing run in `namespace` whose message is [`XSS`].
fn put_run(world: &World, namespace: &str, name: &str) {
    world.clusters.cp.put(
        &Res::new("argoproj.io/v1alpha1", "analysisruns"),
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisRun",
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}"),
                         "labels": {"kargo.akuity.io/stage": "uat"}},
            "spec": {"metrics": [
                {"name": "smoke", "provider": {"plugin": {PLUGIN_NAME: {"destination": "a"}}}}
            ]},
            "status": {"phase": "Failed", "message": format!("{namespace} secret verdict {XSS}"),
                       "startedAt": "2026-01-01T00:00:00Z",
                       "metricResults": [{"name": "smoke", "phase": "Failed", "measurements": [
                           {"phase": "Failed", "message": XSS,
                            "metadata": {"destinations": "a", "state.a": "Failed: Error"}}]}]}
        }),
    );
}

/// A page: status, `Location`, `Set-Cookie`, `Content-Security-Policy` and body.
struct Page {
    status: u16,
    location: String,
    set_cookie: String,
    csp: String,
    body: String,
}

async fn page(
    scene: &Scene,
    method: &str,
    path: &str,
    session: Option<&str>,
    form: Option<(&str, &str)>,
) -> Result<Page> {
    page_at(scene.addr, method, path, session, form).await
}

/// [`page`] of the server at `addr`.
async fn page_at(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    session: Option<&str>,
    form: Option<(&str, &str)>,
) -> Result<Page> {
    let cookie = match session {
        // The token's login, then its session's cookie; a token the login refuses goes into
        // the cookie itself (what someone holding one could try: it is no session).
        Some(token) => Some(match login_at(addr, token).await? {
            Some(cookie) => cookie,
            None => format!("{SESSION_COOKIE}={token}"),
        }),
        None => None,
    };
    request_at(addr, method, path, cookie.as_deref(), form).await
}

/// The `name=id` of the session cookie a same-origin login with `token` sets (`None`: the
/// login set none).
async fn login_at(addr: std::net::SocketAddr, token: &str) -> Result<Option<String>> {
    let origin = format!("http://{addr}");
    let p = request_at(addr, "POST", "/ui/login", None, Some((&origin, token))).await?;
    Ok(p.set_cookie
        .split(';')
        .next()
        .filter(|c| c.starts_with(&format!("{SESSION_COOKIE}=")))
        .map(str::to_string))
}

/// One request to the pages at `addr` with the `Cookie` header `cookie`.
async fn request_at(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: Option<(&str, &str)>,
) -> Result<Page> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let url = format!("http://{addr}{path}");
    let mut req = client.request(reqwest::Method::from_bytes(method.as_bytes())?, &url);
    if let Some(cookie) = cookie {
        req = req.header("cookie", cookie);
    }
    if let Some((origin, token)) = form {
        req = req
            .header("origin", origin)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"));
    }
    let resp = req.send().await?;
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    Ok(Page {
        status: resp.status().as_u16(),
        location: header("location"),
        set_cookie: header("set-cookie"),
        csp: header("content-security-policy"),
        body: resp.text().await?,
    })
}

/// Waits until the list shows `run` to the holder of `token` (the watch of runs lists them in
/// the background).
async fn wait_listed(scene: &Scene, token: &str, run: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !page(scene, "GET", "/ui", Some(token), None)
        .await?
        .body
        .contains(run)
    {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "run {run} never listed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The pages read only the watch caches: no destination API call, whatever was asked.
fn no_destination_call(scene: &Scene) -> Result<()> {
    let calls = scene.destination_calls();
    ensure!(calls.is_empty(), "{calls:?}");
    Ok(())
}

async fn scene() -> Result<Scene> {
    let world = World::start(TENANTS_POLICY).await?;
    put_run(&world, "team-a", "uat.a.1");
    put_run(&world, "team-b", "uat.b.1");
    Scene::serve_confirming(world, TENANTS_POLICY).await
}

#[tokio::test]
async fn without_a_session_every_page_sends_to_the_login() -> Result<()> {
    let scene = scene().await?;
    for session in [None, Some("not-a-token"), Some("")] {
        for path in [
            "/ui",
            "/ui/destinations",
            "/ui/runs/team-a/uat.a.1",
            "/ui/runs/x/y",
        ] {
            let p = page(&scene, "GET", path, session, None).await?;
            ensure!(
                p.status == 303 && p.location == "/ui/login",
                "{path} with {session:?}: {} {}",
                p.status,
                p.location
            );
            ensure!(!p.body.contains("secret verdict"), "{path}: {}", p.body);
        }
    }
    let login = page(&scene, "GET", "/ui/login", None, None).await?;
    ensure!(login.status == 200 && login.body.contains("id=\"token\""));
    no_destination_call(&scene)?;
    tally::refused("ui: no session → login page", Outcome::refused());
    Ok(())
}

#[tokio::test]
async fn another_projects_run_is_forbidden_and_not_listed() -> Result<()> {
    let scene = scene().await?;
    let team_b = plugin_token("tooling-b", Some(&["team-b"]));
    wait_listed(&scene, &team_b, "uat.b.1").await?;
    let p = page(
        &scene,
        "GET",
        "/ui/runs/team-a/uat.a.1",
        Some(&team_b),
        None,
    )
    .await?;
    let leaked = p.body.contains("team-a secret verdict");
    ensure!(p.status == 403, "{} {}", p.status, p.body);
    ensure!(p.body.contains("not bound to project team-a"), "{}", p.body);
    // A run that does not exist in a project not theirs: the same 403, nothing said of it.
    let ghost = page(&scene, "GET", "/ui/runs/team-a/ghost", Some(&team_b), None).await?;
    ensure!(ghost.status == 403, "{}", ghost.status);
    let list = page(&scene, "GET", "/ui", Some(&team_b), None).await?;
    ensure!(list.status == 200, "{}", list.status);
    ensure!(
        list.body.contains("data-run=\"team-b/uat.b.1\""),
        "{}",
        list.body
    );
    let listed = list.body.contains("team-a");
    let filtered = page(&scene, "GET", "/ui?project=team-a", Some(&team_b), None).await?;
    let listed = listed || filtered.body.contains("uat.a.1");
    // The destinations page lists team-b's destination, not team-a's.
    let dest = page(&scene, "GET", "/ui/destinations", Some(&team_b), None).await?;
    ensure!(
        dest.status == 200 && dest.body.contains("<td>b</td>"),
        "{}",
        dest.body
    );
    let listed = listed || dest.body.contains("<td>a</td>");
    no_destination_call(&scene)?;
    tally::refused(
        "ui: another project's run page and list",
        Outcome {
            refused: true,
            cross_tenant_read: leaked || listed,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn an_agent_token_opens_no_page_and_gets_no_session() -> Result<()> {
    let scene = scene().await?;
    let agent = agent_token("a");
    let origin = format!("http://{}", scene.addr);
    let login = page(&scene, "POST", "/ui/login", None, Some((&origin, &agent))).await?;
    ensure!(login.status == 403, "{} {}", login.status, login.body);
    ensure!(
        login.body.contains("agent tokens read no logs or pages"),
        "{}",
        login.body
    );
    ensure!(login.set_cookie.is_empty(), "{}", login.set_cookie);
    // Put in the cookie itself, the agent token is no session: the login page, nothing else.
    for path in ["/ui", "/ui/destinations", "/ui/runs/team-a/uat.a.1"] {
        let p = page(&scene, "GET", path, Some(&agent), None).await?;
        ensure!(
            p.status == 303 && p.location == "/ui/login",
            "{path}: {} {}",
            p.status,
            p.body
        );
        ensure!(!p.body.contains("secret verdict"), "{}", p.body);
    }
    // The genuine login of a tooling token sets the cookie and sends to the list.
    let tooling = plugin_token("tooling-a", Some(&["team-a"]));
    let ok = page(&scene, "POST", "/ui/login", None, Some((&origin, &tooling))).await?;
    ensure!(
        ok.status == 303 && ok.location == "/ui",
        "{} {}",
        ok.status,
        ok.location
    );
    ensure!(
        ok.set_cookie.starts_with(&format!("{SESSION_COOKIE}="))
            && ok.set_cookie.contains("HttpOnly")
            && ok.set_cookie.contains("SameSite=Strict"),
        "{}",
        ok.set_cookie
    );
    no_destination_call(&scene)?;
    tally::refused("ui: agent token as session or login", Outcome::refused());
    // The cookie is a random id: not the token, nor any part of it worth a bearer's while.
    let id = ok.set_cookie.split(';').next().unwrap_or_default();
    let id = id.trim_start_matches(&format!("{SESSION_COOKIE}="));
    let leaked = ok.set_cookie.contains(&tooling)
        || tooling
            .split('.')
            .any(|part| part.len() > 8 && id.contains(part));
    tally::refused(
        "ui: the session cookie carries no token",
        Outcome {
            refused: id.len() == 64
                && id.bytes().all(|b| b.is_ascii_hexdigit())
                && ok.set_cookie.contains("; Secure")
                && ok.set_cookie.contains("Path=/")
                && !ok.set_cookie.contains("Domain"),
            secret_leak: leaked,
            ..Outcome::default()
        },
    );
    Ok(())
}

#[tokio::test]
async fn a_login_posted_from_another_site_sets_no_session() -> Result<()> {
    let scene = scene().await?;
    let tooling = plugin_token("tooling-a", Some(&["team-a"]));
    let p = page(
        &scene,
        "POST",
        "/ui/login",
        None,
        Some(("https://evil.example", &tooling)),
    )
    .await?;
    ensure!(
        p.status == 403 && p.set_cookie.is_empty(),
        "{} {}",
        p.status,
        p.set_cookie
    );
    tally::refused("ui: cross-site login", Outcome::refused());
    Ok(())
}

#[tokio::test]
async fn a_hostile_run_message_is_escaped_under_a_strict_policy() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("tooling-a", Some(&["team-a"]));
    wait_listed(&scene, &team_a, "uat.a.1").await?;
    for path in ["/ui", "/ui/runs/team-a/uat.a.1"] {
        let p = page(&scene, "GET", path, Some(&team_a), None).await?;
        ensure!(p.status == 200, "{path}: {} {}", p.status, p.body);
        ensure!(
            p.body
                .contains("&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;"),
            "{path}: the message is not shown escaped: {}",
            p.body
        );
        ensure!(
            !p.body.contains(XSS) && !p.body.contains("<img"),
            "{path}: {}",
            p.body
        );
        ensure!(
            p.csp.starts_with("default-src 'none'")
                && p.csp.contains("script-src 'sha256-")
                && !p.csp.contains("unsafe"),
            "{path}: {}",
            p.csp
        );
    }
    no_destination_call(&scene)?;
    tally::refused("ui: XSS in a run message", Outcome::refused());
    Ok(())
}

/// The pages as `serve` wires them with a control plane: runs confirmed and summed up from the
/// fake control plane's AnalysisRuns, people of [`crate::logs::control_plane`] (alice, group
/// team-a, may get analysisruns in team-a only; bob in none). Returns the world and the address.
async fn serve_people(
    world: World,
    sessions: std::sync::Arc<dispatch_server::http::sessions::Sessions>,
) -> Result<(World, std::net::SocketAddr)> {
    use dispatch_server::app::{router_over, Options};
    use dispatch_server::config::PeopleConfig;
    use dispatch_server::http::{auth::JwtAuthenticator, people::ControlPlanePeople, Gate};
    use dispatch_server::runtime::metrics::Metrics;
    use std::sync::Arc;
    let yaml = world.clusters.config("", TENANTS_POLICY);
    let config = dispatch_server::config::ServerConfig::parse(&yaml, "scene.yaml")?;
    let runs = dispatch_server::cmd::serve::confirming_runs(config.confirm_runs, &world.engine)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the scene confirms no runs"))?;
    let people = ControlPlanePeople::new(
        crate::logs::control_plane().await?,
        PeopleConfig {
            token_review: true,
            proxy: None,
        },
    );
    let metrics = Arc::new(Metrics::new());
    let signer = Arc::new(crate::scene::signer());
    let gate = Gate {
        auth: Arc::new(JwtAuthenticator::new(&[crate::scene::KEY.to_vec()], []).into()),
        people: Arc::new(people.into()),
        sessions,
    };
    let options = Options {
        runs: Some(runs),
        ..Options::default()
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = router_over(world.engine.clone(), metrics, signer, options, gate)
        .into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((world, addr))
}

#[tokio::test]
async fn a_person_sees_only_the_namespaces_kubernetes_allows() -> Result<()> {
    let world = World::start(TENANTS_POLICY).await?;
    put_run(&world, "team-a", "uat.a.1");
    put_run(&world, "team-b", "uat.b.1");
    let (world, addr) = serve_people(world, Default::default()).await?;
    // alice logs in with her Kubernetes token and sees team-a's run once the watch has it.
    let origin = format!("http://{addr}");
    let login = page_at(
        addr,
        "POST",
        "/ui/login",
        None,
        Some((&origin, "alice-token")),
    )
    .await?;
    ensure!(login.status == 303, "{} {}", login.status, login.body);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let list = loop {
        let list = page_at(addr, "GET", "/ui", Some("alice-token"), None).await?;
        if list.body.contains("uat.a.1") {
            break list;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "alice never sees uat.a.1: {}",
            list.body
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let mut read = list.body.contains("uat.b.1") || list.body.contains("team-b secret");
    let other = page_at(
        addr,
        "GET",
        "/ui/runs/team-b/uat.b.1",
        Some("alice-token"),
        None,
    )
    .await?;
    ensure!(other.status == 403, "{} {}", other.status, other.body);
    ensure!(
        other
            .body
            .contains("user alice may not get analysisruns in namespace team-b"),
        "{}",
        other.body
    );
    read |= other.body.contains("team-b secret");
    // bob may see no namespace: an empty list and 403 on every run.
    let bob = page_at(addr, "GET", "/ui", Some("bob-token"), None).await?;
    ensure!(
        bob.status == 200 && bob.body.contains("id=\"empty\""),
        "{}",
        bob.body
    );
    read |= bob.body.contains("uat.");
    let bob_run = page_at(
        addr,
        "GET",
        "/ui/runs/team-a/uat.a.1",
        Some("bob-token"),
        None,
    )
    .await?;
    ensure!(bob_run.status == 403, "{}", bob_run.status);
    // The destinations page: alice sees team-a's destination only, bob none.
    let alice_dest = page_at(addr, "GET", "/ui/destinations", Some("alice-token"), None).await?;
    let bob_dest = page_at(addr, "GET", "/ui/destinations", Some("bob-token"), None).await?;
    ensure!(
        alice_dest.status == 200 && alice_dest.body.contains("<td>a</td>"),
        "{}",
        alice_dest.body
    );
    let foreign = alice_dest.body.contains("<td>b</td>")
        || bob_dest.body.contains("<td>a</td>")
        || bob_dest.body.contains("<td>b</td>");
    tally::refused(
        "ui: a person sees only the destinations of the projects whose runs they may see",
        Outcome {
            refused: !foreign,
            cross_tenant_read: foreign,
            ..Outcome::default()
        },
    );
    let calls: Vec<_> = [&world.clusters.a, &world.clusters.b]
        .iter()
        .flat_map(|c| c.requests())
        .filter(|r| r.method != "GET" || r.path.ends_with("/log"))
        .collect();
    ensure!(calls.is_empty(), "{} destination calls", calls.len());
    tally::refused(
        "ui: a person sees only the namespaces a SubjectAccessReview allows",
        Outcome {
            refused: true,
            cross_tenant_read: read,
            ..Outcome::default()
        },
    );
    Ok(())
}

/// A session that was logged out opens nothing: the cookie, kept (or copied) from before the
/// logout, sends to the login page.
#[tokio::test]
async fn a_logged_out_session_opens_nothing() -> Result<()> {
    let scene = scene().await?;
    let team_a = plugin_token("tooling-a", Some(&["team-a"]));
    let cookie = login_at(scene.addr, &team_a)
        .await?
        .ok_or_else(|| anyhow::anyhow!("the login set no cookie"))?;
    let before = request_at(scene.addr, "GET", "/ui", Some(&cookie), None).await?;
    ensure!(before.status == 200, "{} {}", before.status, before.body);
    let origin = format!("http://{}", scene.addr);
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let out = client
        .post(format!("http://{}/ui/logout", scene.addr))
        .header("cookie", &cookie)
        .header("origin", &origin)
        .send()
        .await?;
    ensure!(out.status() == 303, "{}", out.status());
    let after = request_at(scene.addr, "GET", "/ui", Some(&cookie), None).await?;
    let run = request_at(
        scene.addr,
        "GET",
        "/ui/runs/team-a/uat.a.1",
        Some(&cookie),
        None,
    )
    .await?;
    let refused = [&after, &run]
        .iter()
        .all(|p| p.status == 303 && p.location == "/ui/login");
    tally::refused(
        "ui: a logged-out session",
        Outcome {
            refused,
            cross_tenant_read: run.body.contains("secret verdict"),
            ..Outcome::default()
        },
    );
    no_destination_call(&scene)
}

/// A session past `ui.sessionLifetime` opens nothing (here a lifetime of one second).
#[tokio::test]
async fn an_expired_session_opens_nothing() -> Result<()> {
    use dispatch_server::config::SessionSettings;
    use dispatch_server::http::sessions::Sessions;
    let world = World::start(TENANTS_POLICY).await?;
    put_run(&world, "team-a", "uat.a.1");
    let sessions = std::sync::Arc::new(Sessions::new(SessionSettings {
        lifetime: std::time::Duration::from_secs(1),
        max: 10,
    }));
    let (_world, addr) = serve_people(world, sessions).await?;
    let cookie = login_at(addr, "alice-token")
        .await?
        .ok_or_else(|| anyhow::anyhow!("alice's login set no cookie"))?;
    let fresh = request_at(addr, "GET", "/ui", Some(&cookie), None).await?;
    ensure!(fresh.status == 200, "{} {}", fresh.status, fresh.body);
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let stale = request_at(addr, "GET", "/ui", Some(&cookie), None).await?;
    tally::refused(
        "ui: an expired session",
        Outcome {
            refused: stale.status == 303 && stale.location == "/ui/login",
            ..Outcome::default()
        },
    );
    Ok(())
}
