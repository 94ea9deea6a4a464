//! The sync trigger through the agent (`POST /v1/destinations/cluster-b/applications/argocd/
//! {name}:sync`, then `GET` until done, as Kargo's `http` steps would call it), carried out by
//! the real controller: a sync to a pushed commit, to a commit that does not exist, and a second
//! sync asked while the first still runs.

use std::time::Duration;

use anyhow::{anyhow, ensure, Result};
use dispatch_api::client::{ClientConfig, ServerClient};
use dispatch_api::observe::ApplicationState;
use dispatch_tests::analysis::{self, measurement_message, phase};
use dispatch_tests::cluster::argocd;
use dispatch_tests::cluster::argocd_real::{self, text, AppSpec, GitRepo};
use dispatch_tests::kargo::PROJECT;
use dispatch_tests::wait::{eventually, Progress};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;

use super::{
    app_spec, application_check, on_scene, record, repo_with_shop, run_report, shop_manifests,
    verdict, Scene, ARGOCD_TIMEOUT, STAGE,
};

/// Application `name` on `repo`, synced only by an operation (not automated), deploying into
/// namespace `name`, which does not exist: its `syncOptions: [CreateNamespace=true]` must reach
/// the operation the agent writes (server/src/applications/argocd.rs `sync_patch`), since the
/// controller reads them from the operation only (argo-cd v3.2.6 controller/sync.go:175-342);
/// without them the sync fails with `namespaces "…" not found`.
async fn manual_app(s: &Scene, name: &str, repo: &GitRepo) -> Result<()> {
    let spec = AppSpec {
        create_namespace: true,
        ..app_spec(name, repo, false)
    };
    argocd_real::create_application(&s.b, &spec).await?;
    Ok(())
}

/// How long a sync hook Job runs (kwok ends its pod after this), i.e. how long a sync runs.
const HOOK_DURATION: &str = "20s";

/// The API as the plugin's token calls it, acting for the project and [`STAGE`].
struct Trigger {
    client: ServerClient,
}

impl Trigger {
    fn new(s: &Scene) -> Result<Self> {
        let client = ServerClient::new(&ClientConfig {
            server: s.w.url.clone(),
            token_file: Some(s.w.dispatch.plugin_token.clone()),
            ca_file: Some(s.w.dispatch.ca.clone()),
            ca_only: true,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?;
        Ok(Self { client })
    }

    fn path(name: &str) -> String {
        dispatch_api::observe::APPLICATION
            .replace("{destination}", "cluster-b")
            .replace("{namespace}", argocd::NAMESPACE)
            .replace("{name}", name)
    }

    /// `POST …:sync` to `revision`, with a hard refresh.
    async fn sync(&self, name: &str, revision: &str) -> Result<ApplicationState> {
        let path = Self::path(name);
        self.client
            .post(
                &format!("{path}:sync"),
                &json!({"revision": revision, "refresh": "hard", "project": PROJECT,
                        "stage": STAGE}),
            )
            .await
            .map_err(|e| anyhow!("POST {path}:sync: {e}"))
    }

    /// `GET` the Application's state as the agent last reported it.
    async fn get(&self, name: &str) -> Result<ApplicationState> {
        let path = Self::path(name);
        self.client
            .get(&format!("{path}?project={PROJECT}&stage={STAGE}"))
            .await
            .map_err(|e| anyhow!("GET {path}: {e}"))
    }

    /// GETs until `done` holds for the state, for up to [`ARGOCD_TIMEOUT`].
    async fn until(
        &self,
        what: &str,
        name: &str,
        done: impl Fn(&ApplicationState) -> bool,
    ) -> Result<ApplicationState> {
        eventually(what, ARGOCD_TIMEOUT, || async {
            let state = self.get(name).await?;
            Ok(if done(&state) {
                Progress::Done(state)
            } else {
                Progress::Waiting(format!("{state:?}"))
            })
        })
        .await
    }
}

/// Whether `state` shows a finished sync to `sha`, Succeeded.
fn synced_to(state: &ApplicationState, sha: &str) -> bool {
    state.sync.revision == sha
        && state
            .operation
            .as_ref()
            .is_some_and(|op| op.phase == "Succeeded" && op.revision == sha)
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn sync_trigger_makes_the_real_controller_sync_each_pushed_commit() -> Result<()> {
    on_scene(async |s| sync_trigger(s).await)
}

async fn sync_trigger(s: &Scene) -> Result<()> {
    let name = "shop-sync";
    let (repo, c1) = repo_with_shop(s, name, "v1")?;
    // Not automated: only the trigger syncs it.
    manual_app(s, name, &repo).await?;
    let t = Trigger::new(s)?;
    let first = t.sync(name, &c1).await?;
    ensure!(
        first.name == name && first.destination == "cluster-b",
        "POST :sync answered the state of another Application: {first:?}"
    );
    let state = t
        .until("the first sync through the agent", name, |st| {
            synced_to(st, &c1)
        })
        .await;
    // The operation ends before the comparison that follows it: then Synced and Healthy.
    let state = match state {
        Ok(state) => super::wait_synced_healthy(s, name, &c1)
            .await
            .map(|_| state),
        Err(e) => Err(e),
    };
    let state = match state {
        Ok(state) => state,
        Err(e) => {
            record("sync_trigger", "failed")?;
            return Err(anyhow!("{e:#}\n{}", s.report(name).await));
        }
    };
    record("sync_trigger", "ok")?;
    println!("e2e-argocd: sync_trigger=ok: {state:?}");

    // A new commit: the trigger asks for it, the controller applies it.
    let c2 = repo.commit(&shop_manifests("v2", json!({}), json!({})), "shop v2")?;
    t.sync(name, &c2).await?;
    let synced = t
        .until("the sync to the second commit", name, |st| {
            synced_to(st, &c2)
        })
        .await;
    let deployed = image_of(s, name).await.unwrap_or_default();
    let app = argocd::applications(&s.b).get(name).await?;
    let ok = synced.is_ok()
        && deployed == "example.invalid/shop:v2"
        && text(&app.data, "/status/operationState/syncResult/revision") == c2;
    record("synced_revision", if ok { "ok" } else { "failed" })?;
    ensure!(
        ok,
        "the sync to {c2} did not deploy it: GET {:?}, Deployment image {deployed:?}\n{}",
        synced.map_err(|e| format!("{e:#}")),
        s.report(name).await
    );
    // And the `application:` check at that commit passes, started before Argo CD has it
    // Healthy there: its agent record goes `Running` (with a message: Progressing) then
    // `Succeeded`, the transition the Kubernetes store once lost (the status merge patch kept
    // the old `state.detail`; server/src/store/kubernetes.rs `status_patch`).
    let check = application_check("app-synced", "01jargocd00000000000000003", name, Some(&c2));
    let run = verdict(s, None, &check).await?;
    ensure!(
        phase(&run) == "Successful",
        "want Successful at {c2}: {}",
        run_report(&run)
    );
    println!(
        "e2e-argocd: synced_revision=ok: {c2} deployed image {deployed}; operationState={}",
        app.data["status"]["operationState"]
    );
    Ok(())
}

/// The image of Deployment `web` that Argo CD applied in namespace `namespace`.
async fn image_of(s: &Scene, namespace: &str) -> Result<String> {
    let d = Api::<Deployment>::namespaced(s.b.clone(), namespace)
        .get("web")
        .await?;
    let v = serde_json::to_value(d)?;
    Ok(text(&v, "/spec/template/spec/containers/0/image"))
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn a_sync_to_a_commit_that_does_not_exist_ends_in_argo_cds_error() -> Result<()> {
    on_scene(async |s| {
        let name = "shop-missing";
        let (repo, _c1) = repo_with_shop(s, name, "v1")?;
        manual_app(s, name, &repo).await?;
        let missing = "0123456789abcdef0123456789abcdef01234567";
        let t = Trigger::new(s)?;
        t.sync(name, missing).await?;
        let ended = t
            .until("the sync to a missing commit to end", name, |st| {
                st.operation
                    .as_ref()
                    .is_some_and(|op| matches!(op.phase.as_str(), "Failed" | "Error"))
            })
            .await;
        let state = match ended {
            Ok(state) => state,
            Err(e) => {
                record("missing_revision", "none")?;
                return Err(anyhow!("{e:#}\n{}", s.report(name).await));
            }
        };
        let op = state.operation.clone().unwrap_or_default();
        record("missing_revision", &op.phase)?;
        ensure!(
            op.message.contains(missing) || op.message.contains(&missing[..7]),
            "Argo CD's message does not name the revision: {op:?}"
        );
        // The check for that revision fails with Argo CD's message (cut to the measurement's
        // bound, but naming the revision).
        let check = application_check(
            "app-missing",
            "01jargocd00000000000000004",
            name,
            Some(missing),
        );
        let run = verdict(s, None, &check).await?;
        let message = measurement_message(&run);
        let quoted: String = op.message.chars().take(80).collect();
        ensure!(
            phase(&run) == "Failed"
                && message.contains("SyncError")
                && message.contains(&quoted)
                && message.contains(missing),
            "want Failed quoting {:?}: {}",
            op.message,
            run_report(&run)
        );
        println!(
            "e2e-argocd: missing_revision={}: {:?}; the check: {message:?}",
            op.phase, op.message
        );
        Ok(())
    })
}

#[test]
#[ignore = "needs the Go-built cluster binaries, the real Argo CD (`make argocd-bin`), the release plugin and the debug binary: run `make e2e-argocd`"]
fn a_sync_asked_while_one_runs_waits_for_it_then_runs() -> Result<()> {
    on_scene(async |s| {
        let outcome = sync_while_running(s).await;
        record(
            "sync_while_running",
            match &outcome {
                Ok(how) => how,
                Err(_) => "failed",
            },
        )?;
        outcome.map(|_| ())
    })
}

/// The shop at `tag` and a `Sync` hook Job that runs [`HOOK_DURATION`]: the sync operation
/// stays Running until the Job completes.
fn shop_with_hook(tag: &str) -> Vec<(&'static str, String)> {
    let hook = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "migrate", "annotations": {"argocd.argoproj.io/hook": "Sync"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"annotations": {"test.rollouts-dispatch.io/duration": HOOK_DURATION}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "migrate", "image": format!("example.invalid/migrate:{tag}")}]}
        }}
    });
    let mut files = shop_manifests(tag, json!({}), json!({}));
    files.push(("deploy/migrate.yaml", hook.to_string()));
    files
}

async fn sync_while_running(s: &Scene) -> Result<&'static str> {
    let name = "shop-busy";
    let repo = s.argocd.repo(name)?;
    let c1 = repo.commit(&shop_with_hook("v1"), "shop v1 with a migration")?;
    manual_app(s, name, &repo).await?;
    let t = Trigger::new(s)?;
    t.sync(name, &c1).await?;
    let running = t
        .until("the first sync Running (its hook Job)", name, |st| {
            st.operation
                .as_ref()
                .is_some_and(|op| op.phase == "Running")
        })
        .await
        .map_err(|e| anyhow!("{e:#}"))?;
    // While it runs, the `application:` check says so (Running), and a second sync is asked.
    let c2 = repo.commit(&shop_with_hook("v2"), "shop v2 with a migration")?;
    let check = application_check("app-busy", "01jargocd00000000000000005", name, Some(&c2));
    let run = s.w.submit(&check).await?;
    let second = t.sync(name, &c2).await?;
    // The first sync's hook still runs: the check at c2 is Running, saying Argo CD syncs.
    let runs = s.w.runs();
    let seen = eventually(
        "the check at c2 Running while Argo CD syncs",
        ARGOCD_TIMEOUT,
        || async {
            let now = runs.get(analysis::name(&run)).await?;
            let message = measurement_message(&now);
            let decided = !matches!(phase(&now).as_str(), "" | "Running" | "Pending");
            ensure!(
                !decided,
                "the check at {c2} was decided while a sync runs: {}",
                run_report(&now)
            );
            Ok(message.contains("is syncing").then_some(message))
        },
    )
    .await?;
    println!("e2e-argocd: while the first sync runs, the check at {c2}: {seen:?}");
    println!(
        "e2e-argocd: second sync asked while {:?}; the POST answered {second:?}",
        running.operation
    );
    let done = t
        .until("the second sync once the first ended", name, |st| {
            synced_to(st, &c2)
        })
        .await
        .map_err(|e| anyhow!("{e:#}"));
    let app = argocd::applications(&s.b).get(name).await?;
    let history: Vec<String> = app.data["status"]["history"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| text(h, "/revision"))
        .collect();
    ensure!(
        done.is_ok() && history == [c1.clone(), c2.clone()],
        "want the first sync ({c1}) to finish and then the second ({c2}); history {history:?}, \
         {:?}\n{}",
        done.err(),
        s.report(name).await
    );
    // The check at c2, Running while the first sync ran, ends Successful once Argo CD is there.
    let run = s.w.finished(&run).await?;
    ensure!(
        phase(&run) == "Successful",
        "the check at {c2}, started while a sync ran, ended {}",
        run_report(&run)
    );
    println!("e2e-argocd: sync_while_running=waited: history {history:?}");
    Ok("waited")
}
