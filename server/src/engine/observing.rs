//! Observe checks (`rollout:`, `application:`): `ensure` creates nothing on a direct
//! destination and writes a record (no Job, `observe` set) for an agent destination; each
//! status call reads the observed objects with the destination's kube client — `get` and
//! `list` only, never a write — and judges them by `observe::rollout` / `observe::application`.
//! The agent reads its own cluster through [`Engine::observe_on`], so both judge alike.

use std::collections::BTreeMap;
use std::future::Future;

use dispatch_api::observe::Observe;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::{api_failure, no_answer, Engine, JobRef, MeasureRequest, Outcome, Placement};
use crate::destinations::{client, Destination, Entry};
use crate::observe::{self, ApplicationState};
use crate::store;
use crate::verdict::DestState;

/// What one placement of an observe check shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// the placement's state, combined like a Job's
    pub state: DestState,
    /// facts for the measurement's metadata (`analysisruns`, `revision`, …)
    pub notes: BTreeMap<String, String>,
    /// the observed Application as Argo CD reports it (`application:` only, when found)
    pub application: Option<ApplicationState>,
    /// `state` is what a reading of the observed objects said (see
    /// [`crate::verdict::DestinationStatus::seen`])
    pub seen: bool,
}

impl Observation {
    /// Nothing could be read: `state` says why.
    fn of(state: DestState) -> Self {
        Self {
            state,
            notes: BTreeMap::new(),
            application: None,
            seen: false,
        }
    }
}

impl Engine {
    /// `ensure` of an observe check on one target: a record for the agent of an agent
    /// destination, nothing at all on a direct one.
    pub(super) async fn observe_start(
        &self,
        entry: &Entry,
        namespace: &str,
        name: &str,
        req: &MeasureRequest,
        observe: &Observe,
    ) -> Outcome {
        match entry {
            Entry::Agent(a) => {
                self.agent_create(a, namespace, name, req, None, Some(observe.clone()))
                    .await
            }
            Entry::Broken(b) => Outcome::NotCreated(DestState::Error(format!(
                "destination is unusable: {}",
                b.error
            ))),
            Entry::Ready(_) => Outcome::Observed(described(observe, namespace)),
        }
    }

    /// The state of one placement of `job` observing `observe`: read now from a direct
    /// destination, or as the agent of an agent destination last reported it.
    pub async fn observe_placement(
        &self,
        job: &JobRef,
        p: &Placement,
        observe: &Observe,
    ) -> Observation {
        if let Some(Entry::Agent(a)) = self.inner.registry.get(&p.destination) {
            let state = self.agent_state(&a, job, p).await;
            let reported = self
                .agent_store()
                .ok()
                .and_then(|s| s.get(&store::record_name(&job.name, &a.name)))
                .and_then(|r| r.status)
                .filter(|s| !s.deleted && s.state.is_some());
            let seen = reported.is_some() && a.connected(self.inner.offline_after);
            return Observation {
                state,
                notes: reported.map(|s| s.notes).unwrap_or_default(),
                application: None,
                seen,
            };
        }
        match self.ready(&p.destination) {
            Ok(d) => self.observe_on(&d, observe, &p.namespace).await,
            Err(state) => Observation::of(state),
        }
    }

    /// Reads `observe` in `namespace` of destination `d` (the agent: its own cluster) and
    /// judges it. A Rollout: `get` it, then `list` the AnalysisRuns of its namespace labelled
    /// with its current pod-template hash. An Application: `get` it.
    pub async fn observe_on(
        &self,
        d: &Destination,
        observe: &Observe,
        namespace: &str,
    ) -> Observation {
        match observe {
            Observe::Rollout(check) => {
                let object = format!("{namespace}/{}", check.name);
                let api: Api<DynamicObject> = Api::namespaced_with(
                    d.client().clone(),
                    namespace,
                    &observe::rollout_resource(),
                );
                let what = format!("get rollout {object}");
                let rollout = match self.read(d, &what, api.get_opt(&check.name)).await {
                    Ok(r) => r.map(to_value),
                    Err(s) => return Observation::of(s),
                };
                let hash = rollout
                    .as_ref()
                    .and_then(|r| r.pointer("/status/currentPodHash"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let mut runs = Vec::new();
                if !hash.is_empty() {
                    let api: Api<DynamicObject> = Api::namespaced_with(
                        d.client().clone(),
                        namespace,
                        &observe::analysis_run_resource(),
                    );
                    let params = ListParams::default().labels(&format!(
                        "{}={hash}",
                        observe::rollout::POD_TEMPLATE_HASH_LABEL
                    ));
                    let what = format!("list analysisruns of rollout {object}");
                    match self.read(d, &what, api.list(&params)).await {
                        Ok(list) => runs = list.items.into_iter().map(to_value).collect(),
                        Err(s) => return Observation::of(s),
                    }
                }
                let judged = observe::rollout::judge(check, &object, rollout.as_ref(), &runs);
                Observation {
                    state: judged.state,
                    notes: judged.notes,
                    application: None,
                    seen: true,
                }
            }
            Observe::Application(check) => {
                let object = format!("{namespace}/{}", check.name);
                let api: Api<DynamicObject> = Api::namespaced_with(
                    d.client().clone(),
                    namespace,
                    &observe::application_resource(),
                );
                let what = format!("get application {object}");
                let app = match self.read(d, &what, api.get_opt(&check.name)).await {
                    Ok(a) => a.map(to_value),
                    Err(s) => return Observation::of(s),
                };
                let state = app
                    .as_ref()
                    .map(|a| observe::application::state_of(&d.name, a));
                let judged = observe::application::judge(check, &object, state.as_ref());
                Observation {
                    state: judged.state,
                    notes: judged.notes,
                    application: state,
                    seen: true,
                }
            }
        }
    }

    /// One read of an observed object, bounded by the request timeout.
    async fn read<T>(
        &self,
        d: &Destination,
        what: &str,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, DestState> {
        let timeout = self.inner.settings.request_timeout;
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(x)) => Ok(x),
            Ok(Err(e)) => Err(read_failure(d, what, &e)),
            Err(_) => Err(no_answer(d, what, timeout)),
        }
    }
}

/// `rollout namespace/name` or `application namespace/name`.
fn described(observe: &Observe, namespace: &str) -> String {
    let name = match observe {
        Observe::Rollout(r) => &r.name,
        Observe::Application(a) => &a.name,
    };
    format!("{} {namespace}/{name}", observe.kind())
}

fn to_value(o: DynamicObject) -> Value {
    serde_json::to_value(o).unwrap_or_default()
}

/// A failed read as a state; a denial names the RBAC the check needs.
fn read_failure(d: &Destination, what: &str, err: &kube::Error) -> DestState {
    match err {
        kube::Error::Api(s) if s.code == 403 => DestState::Error(format!(
            "forbidden to {what}: {}; grant the credentials used for destination {} (on an agent \
             destination: the agent's ServiceAccount) get on rollouts.argoproj.io and list on \
             analysisruns.argoproj.io for `rollout:` checks, get on applications.argoproj.io for \
             `application:` checks",
            client::describe(err),
            d.name
        )),
        _ => api_failure(d, what, err),
    }
}
