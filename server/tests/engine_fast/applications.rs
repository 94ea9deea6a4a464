//! The Application routes of the dispatcher on a direct destination: reading an Argo CD
//! Application's state, and requesting its sync the way Argo CD's API does (one merge patch:
//! `operation` + the refresh annotation + our sync id), refused while another operation is
//! requested or running, and only where `applicationSync` enables it.

use std::sync::Arc;

use anyhow::{Context, Result};
use dispatch_api::observe::SyncRequest;
use dispatch_server::app::{Features, Options};
use dispatch_server::applications::AppRef;
use dispatch_server::http::{DispatchError, Principal};
use dispatch_server::runtime::metrics::Metrics;
use dispatch_server::signing::Signer;
use serde_json::{json, Value};

use crate::fake_api::Res;
use crate::world::{World, MARK_KEY, PROJECT};

/// `team-a` may use the Applications in namespace `argocd` of `a` and `b`; only `a` syncs.
pub(crate) const APP_POLICY: &str = "policy: {rules: [{projects: [team-a], destinations: [a, b, edge], namespaces: [verify], applicationNamespaces: [argocd]}]}\napplicationSync: {destinations: [a, edge]}";

/// The Stage of [`PROJECT`] the Applications are authorized for.
pub(crate) const STAGE: &str = "prod";

pub(crate) fn applications() -> Res {
    Res::new("argoproj.io/v1alpha1", "applications")
}

/// An Application `argocd/name` Synced to `revision` and Healthy after a finished sync,
/// authorized for [`PROJECT`]'s [`STAGE`] (and a Stage of another project).
pub(crate) fn application(name: &str, revision: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": "argocd", "annotations": {
            "kargo.akuity.io/authorized-stage": format!("team-z:prod, {PROJECT}:{STAGE}")}},
        "spec": {"project": "default", "source": {"repoURL": "https://git.example/app", "targetRevision": "main"}},
        "status": {
            "sync": {"status": "Synced", "revision": revision},
            "health": {"status": "Healthy"},
            "operationState": {"phase": "Succeeded", "message": "successfully synced",
                               "syncResult": {"revision": revision}}
        }
    })
}

pub(crate) fn dispatcher(w: &World) -> Result<Features> {
    Ok(Features::new(
        w.engine.clone(),
        Arc::new(Metrics::new()),
        Arc::new(Signer::new(&[MARK_KEY.to_vec()])?),
        Options::default(),
    ))
}

pub(crate) fn app(destination: &str, name: &str) -> AppRef {
    AppRef {
        destination: destination.into(),
        namespace: "argocd".into(),
        name: name.into(),
        project: PROJECT.into(),
        stage: STAGE.into(),
    }
}

fn sync_to(revision: &str) -> SyncRequest {
    SyncRequest {
        revision: Some(revision.into()),
        refresh: Some("hard".into()),
        project: None,
        stage: Some(STAGE.into()),
    }
}

#[tokio::test]
async fn get_reads_the_state_and_a_sync_is_requested_once() -> Result<()> {
    let w = World::start(APP_POLICY).await?;
    let features = dispatcher(&w)?;
    let d = &features.applications;
    w.clusters.a.put(&applications(), application("web", "old"));

    let state = d.read(app("a", "web")).await?;
    assert_eq!(
        (state.sync.status.as_str(), state.sync.revision.as_str()),
        ("Synced", "old")
    );
    assert_eq!(state.health.status, "Healthy");
    assert_eq!(
        state.operation.as_ref().map(|o| o.phase.as_str()),
        Some("Succeeded")
    );
    assert_eq!(
        w.clusters.a.calls("PATCH", "/applications/"),
        0,
        "GET only reads"
    );

    let state = d.sync(app("a", "web"), sync_to("new")).await?;
    assert!(state.sync_requested, "{state:?}");
    assert!(
        state.operation.is_none(),
        "the old operationState is cleared: {state:?}"
    );
    let stored = w
        .clusters
        .a
        .get(&applications(), "argocd", "web")
        .context("the application")?;
    assert_eq!(stored["operation"]["sync"]["revision"], "new");
    assert_eq!(
        stored["operation"]["initiatedBy"]["username"],
        "rollouts-dispatch:team-a/prod"
    );
    assert_eq!(
        stored["operation"]["info"][1],
        json!({"name": "rollouts-dispatch.io/project", "value": "team-a"})
    );
    assert_eq!(
        stored["operation"]["info"][2],
        json!({"name": "rollouts-dispatch.io/stage", "value": "prod"})
    );
    let annotations = &stored["metadata"]["annotations"];
    assert_eq!(annotations["argocd.argoproj.io/refresh"], "hard");
    let id = annotations["rollouts-dispatch.io/sync-id"]
        .as_str()
        .context("a sync id")?;
    assert_eq!(id.len(), 32, "{id}");
    assert!(stored["status"].get("operationState").is_none(), "{stored}");
    assert_eq!(
        w.clusters
            .a
            .calls("PATCH", "/namespaces/argocd/applications/web"),
        1
    );

    // Requested and not yet picked up by Argo CD: a second sync is refused.
    let again = d.sync(app("a", "web"), sync_to("newer")).await.unwrap_err();
    assert!(
        matches!(&again, DispatchError::Conflict(m) if m.message().contains("already requested")),
        "{again:?}"
    );
    // Argo CD picked it up and runs it: still refused.
    w.clusters.a.update(&applications(), "argocd", "web", |o| {
        o.as_object_mut().map(|m| m.remove("operation"));
        o["status"]["operationState"] = json!({"phase": "Running", "message": "syncing"});
    });
    let running = d.sync(app("a", "web"), sync_to("newer")).await.unwrap_err();
    assert!(
        matches!(&running, DispatchError::Conflict(m) if m.message().contains("running")),
        "{running:?}"
    );
    assert_eq!(
        w.clusters.a.calls("PATCH", "/applications/"),
        1,
        "exactly one sync"
    );
    let state = d.read(app("a", "web")).await?;
    assert_eq!(state.operation.map(|o| o.phase), Some("Running".into()));
    Ok(())
}

#[tokio::test]
async fn sync_needs_the_policy_and_application_sync() -> Result<()> {
    let w = World::start(APP_POLICY).await?;
    let features = dispatcher(&w)?;
    let d = &features.applications;
    w.clusters.b.put(&applications(), application("web", "old"));
    // `b` is in the policy (reads work) but not in applicationSync.destinations.
    d.read(app("b", "web")).await?;
    let e = d.sync(app("b", "web"), sync_to("new")).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::Forbidden(m) if m.message().contains("applicationSync.destinations")),
        "{e:?}"
    );
    // Another project, or another namespace: the policy denies both, reads included.
    let mut other = app("a", "web");
    other.project = "team-b".into();
    let e = d.read(other).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::Forbidden(m) if m.message().contains("policy.rules")),
        "{e:?}"
    );
    let mut kube_system = app("a", "web");
    kube_system.namespace = "kube-system".into();
    let e = d.sync(kube_system, sync_to("new")).await.unwrap_err();
    assert!(matches!(&e, DispatchError::Forbidden(_)), "{e:?}");
    // A missing Application is refused as one not authorized (403 saying both), not a sync.
    let e = d.read(app("a", "nope")).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::Forbidden(m) if m.message().contains("argocd/nope")
            && m.message().contains("does not exist or is not authorized")),
        "{e:?}"
    );
    // Another Stage of the project: the Application does not list it.
    let mut uat = app("a", "web");
    uat.stage = "uat".into();
    let e = d.read(uat).await.unwrap_err();
    assert!(
        matches!(&e, DispatchError::Forbidden(m) if m.message().contains("\"team-a:uat\"")),
        "{e:?}"
    );
    for api in [&w.clusters.a, &w.clusters.b] {
        assert_eq!(api.calls("PATCH", "/applications/"), 0);
    }
    Ok(())
}

/// The agent of `edge`, played by a [`Worker`] on destination `a` (its "own cluster").
mod through_an_agent {
    use super::*;
    use dispatch_api::agent::{ReportRequest, WorkItem};
    use dispatch_server::agent::{Guard, Worker};
    use dispatch_server::http::auth::Projects;
    use dispatch_server::podsecurity::{Origin, Profile};

    const AGENTS: &str = "agents: {store: memory, destinations: [{name: edge, namespace: verify}]}";

    fn agent(w: &World, argocd_sync: bool) -> Result<Worker> {
        let guard = Guard {
            namespaces: vec!["argocd".into()],
            profile: Profile::restricted(Origin::Agent),
            work_keys: w.engine.work_keys(),
        };
        Ok(Worker::new(w.engine.clone(), "a", guard)
            .context("destination a")?
            .with_argocd_sync(argocd_sync))
    }

    fn work(w: &World) -> Result<Arc<Vec<WorkItem>>> {
        let store = w.engine.store().context("an agent store")?;
        Ok(Arc::new(
            store
                .for_destination("edge")
                .into_iter()
                .map(dispatch_server::store::DispatchJob::into_work_item)
                .collect(),
        ))
    }

    /// One pass of `worker` over edge's records, reported to the server as the agent does.
    async fn pass(features: &Features, w: &World, worker: &mut Worker) -> Result<usize> {
        let reports = worker.pass(&work(w)?).await;
        let n = reports.len();
        let me = Principal {
            subject: "agent:edge".into(),
            destination: Some("edge".into()),
            // An agent acts for no project.
            projects: Projects::claimed(Vec::new()),
        };
        let reply = features
            .agents
            .report(
                &me,
                "edge".into(),
                ReportRequest {
                    reports: reports.clone(),
                },
            )
            .await?;
        worker.accepted(reports, &reply.unknown);
        Ok(n)
    }

    #[tokio::test]
    async fn the_agent_syncs_once_per_order_across_restarts() -> Result<()> {
        let w = World::start(&format!("{APP_POLICY}\n{AGENTS}")).await?;
        let features = dispatcher(&w)?;
        let d = &features.applications;
        let a = &w.clusters.a;
        a.put(&applications(), application("web", "old"));
        let patches = || a.calls("PATCH", "/namespaces/argocd/applications/web");

        // No agent has reported yet: the first GET waits for it, then asks to retry (503).
        let e = d.read(app("edge", "web")).await.unwrap_err();
        assert!(
            matches!(&e, DispatchError::Unavailable(m) if m.message().contains("has not reported")),
            "{e:?}"
        );
        assert_eq!(work(&w)?.len(), 1, "the GET wrote the agent's record");
        assert!(work(&w)?[0].spec.sync.is_none(), "a read orders no sync");

        let placed = d.sync(app("edge", "web"), sync_to("new")).await?;
        assert!(placed.sync_requested, "{placed:?}");
        assert_eq!(patches(), 0, "the server never reaches an agent's cluster");

        let mut worker = agent(&w, true)?;
        assert_eq!(pass(&features, &w, &mut worker).await?, 1);
        assert_eq!(patches(), 1);
        let stored = a.get(&applications(), "argocd", "web").context("web")?;
        assert_eq!(stored["operation"]["sync"]["revision"], "new");
        assert_eq!(
            stored["metadata"]["annotations"]["argocd.argoproj.io/refresh"],
            "hard"
        );
        let state = d.read(app("edge", "web")).await?;
        assert!(state.sync_requested, "{state:?}");
        assert_eq!(state.destination, "edge");

        // More passes, and a restarted agent (a new Worker with no memory): no second sync.
        pass(&features, &w, &mut worker).await?;
        let mut restarted = agent(&w, true)?;
        pass(&features, &w, &mut restarted).await?;
        assert_eq!(patches(), 1, "an order is carried out once");

        // Argo CD syncs; the agent reports the new state on its next pass.
        a.update(&applications(), "argocd", "web", |o| {
            o.as_object_mut().map(|m| m.remove("operation"));
            o["status"]["sync"]["revision"] = json!("new");
            o["status"]["operationState"] =
                json!({"phase": "Succeeded", "syncResult": {"revision": "new"}});
        });
        assert_eq!(pass(&features, &w, &mut restarted).await?, 1);
        let state = d.read(app("edge", "web")).await?;
        assert_eq!(state.sync.revision, "new");
        assert_eq!(state.operation.map(|o| o.phase), Some("Succeeded".into()));
        assert!(!state.sync_requested);

        // A new order to an agent started without --argocd-sync: refused, named, not patched.
        d.sync(app("edge", "web"), sync_to("newer")).await?;
        let mut no_flag = agent(&w, false)?;
        pass(&features, &w, &mut no_flag).await?;
        let e = d.read(app("edge", "web")).await.unwrap_err();
        assert!(
            matches!(&e, DispatchError::Refused(m) if m.message().contains("--argocd-sync")),
            "{e:?}"
        );
        assert_eq!(patches(), 1);
        // The records of the routes belong to no run: only idleness removes them.
        assert!(d
            .expire_idle(std::time::Duration::from_secs(60))
            .await
            .deleted
            .is_empty());
        assert!(w.engine.expire_records().await.deleted.is_empty());
        let gone = d.expire_idle(std::time::Duration::ZERO).await;
        assert_eq!(gone.deleted.len(), 1, "{gone:?}");
        assert!(
            a.get(&applications(), "argocd", "web").is_some(),
            "never the Application"
        );
        Ok(())
    }
}
