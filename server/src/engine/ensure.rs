//! `ensure`: resolve the destinations of a measurement (names, selector or `stage`), check the
//! policy, apply the pod security profile of each placement (`podsecurity`), and create the Job
//! on each of them, or adopt ours and refuse a foreign one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dispatch_api::block::{JobConfig, Target};
use dispatch_api::observe::Observe;
use futures::future::join_all;
use k8s_openapi::api::batch::v1::Job;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};

use super::{
    api_failure, finish, no_answer, ControlPlaneError, Engine, EngineError, Ensured, JobRef,
    MeasureRequest, Outcome, Placement, MAX_PLACEMENTS,
};
use crate::destinations::client::RequestCounter;
use crate::destinations::{client, stage, Entry};
use crate::job::{self, JobInput, RunContext};
use crate::logs::Redactor;
use crate::podsecurity;
use crate::policy::Denied;
use crate::verdict::{self, DestState, DestinationStatus};

/// Remembered `destination: stage` resolutions at most (cleared when it grows beyond).
const MAX_REMEMBERED: usize = 4096;

impl Engine {
    /// Creates (or adopts) the measurement's Job on each destination.
    #[tracing::instrument(name = "ensure", skip_all, fields(
        run = %format_args!("{}/{}", req.run.namespace, req.run.name),
        metric = %req.metric,
        measurement = req.measurement,
        target = %req.config.target_display(),
    ))]
    pub async fn ensure(&self, req: &MeasureRequest) -> Result<Ensured, EngineError> {
        if let Some(too_long) = self.deadline_refused(req) {
            return Err(too_long);
        }
        let targets = self.targets(req).await?;
        let name = job::job_name(&req.run.uid, &req.metric, req.measurement);
        if let Some(observe) = req.config.observe() {
            // Nothing to build: no Job, no Pod, so no pod security either.
            let outcomes = join_all(
                targets
                    .iter()
                    .map(|(entry, ns)| self.observe_start(entry, ns, &name, req, observe)),
            )
            .await;
            return Ok(self.ensured(req, name, &targets, outcomes));
        }
        // Build and check every Job first: a bad or refused spec creates nothing anywhere.
        let mut objects = Vec::with_capacity(targets.len());
        for (entry, namespace) in &targets {
            let mut obj = job::build(&JobInput {
                run: &req.run,
                metric: &req.metric,
                measurement: req.measurement,
                config: &req.config,
                destination: entry.name(),
                namespace,
            })
            .map_err(|reason| EngineError::InvalidJob {
                metric: req.metric.clone(),
                reason,
            })?;
            let profile = self
                .inner
                .policy
                .profile(&req.run.namespace, entry.name(), namespace);
            let ours = podsecurity::our_labels(&req.run.uid, entry.name());
            podsecurity::enforce(&mut obj, &profile, &ours).map_err(|refused| {
                tracing::warn!(run = %format!("{}/{}", req.run.namespace, req.run.name),
                               metric = %req.metric, destination = entry.name(), field = %refused.path,
                               level = %refused.level, "pod security refuses the job");
                EngineError::PodSecurity {
                    metric: req.metric.clone(),
                    destination: entry.name().to_string(),
                    refused,
                }
            })?;
            job::lifecycle::set_ttl(&mut obj, self.inner.jobs.ttl_after_finished);
            if job::lifecycle::owned_by_run(self.on_control_plane(entry), namespace, &req.run) {
                job::lifecycle::set_owner(&mut obj, &req.run);
            }
            job::mark::stamp(&mut obj, self.marker(), &req.run.uid);
            objects.push(obj);
        }
        let outcomes = join_all(targets.iter().zip(objects).map(|((entry, ns), obj)| {
            let name = &name;
            async move {
                match entry {
                    Entry::Agent(a) => self.agent_create(a, ns, name, req, Some(obj), None).await,
                    _ => {
                        self.create_or_adopt(entry, ns, name, &req.run.uid, obj)
                            .await
                    }
                }
            }
        }))
        .await;
        Ok(self.ensured(req, name, &targets, outcomes))
    }

    /// The result of `ensure` from the outcome on each target: the reference (with its
    /// deadline) and the first verdict.
    fn ensured(
        &self,
        req: &MeasureRequest,
        name: String,
        targets: &[(Entry, String)],
        outcomes: Vec<Outcome>,
    ) -> Ensured {
        let mut job = job_ref(req, name, targets);
        job.deadline = self.deadline_of(req);
        let statuses = job
            .placements
            .iter()
            .zip(&outcomes)
            .map(|(p, o)| DestinationStatus {
                destination: p.destination.clone(),
                namespace: p.namespace.clone(),
                state: match o {
                    Outcome::Created | Outcome::Adopted => DestState::Running(None),
                    Outcome::Observed(what) => {
                        DestState::Running(Some(format!("observing {what}")))
                    }
                    Outcome::NotCreated(s) => s.clone(),
                },
                notes: BTreeMap::new(),
                seen: false,
            })
            .collect();
        for ((entry, ns), o) in targets.iter().zip(&outcomes) {
            tracing::info!(run = %format!("{}/{}", req.run.namespace, req.run.name), metric = %req.metric,
                           destination = entry.name(), job = %format!("{ns}/{}", job.name), outcome = ?o, "ensure");
        }
        let redactor = Redactor::new(req.secrets.iter().cloned());
        let verdict = finish(&job, verdict::combine(job.require, statuses), &redactor);
        Ensured {
            outcomes: job
                .placements
                .iter()
                .map(|p| p.destination.clone())
                .zip(outcomes)
                .collect(),
            job,
            verdict,
        }
    }

    /// The [`JobRef`] of a measurement without creating anything: where [`Engine::ensure`]
    /// put (or would put) its Jobs. For callers that identify a measurement by run, metric and
    /// index instead of keeping the [`JobRef`] (the `/v1` API). Costs no API call, except the
    /// first `destination: stage` resolution of a run. It carries no deadline: when the Jobs
    /// were created is not known here.
    pub async fn locate(&self, req: &MeasureRequest) -> Result<JobRef, EngineError> {
        let targets = self.targets(req).await?;
        let name = job::job_name(&req.run.uid, &req.metric, req.measurement);
        Ok(job_ref(req, name, &targets))
    }

    /// Refuses a block whose `activeDeadline` exceeds `engine.maxMeasurementDeadline`, before
    /// any API call: Argo Rollouts has no timeout on a metric and Kargo refuses promotions of a
    /// Stage while its verification runs, so a 30-day deadline would hold the Stage for 30 days.
    fn deadline_refused(&self, req: &MeasureRequest) -> Option<EngineError> {
        let max = self.inner.settings.max_measurement_deadline;
        let asked = req.config.active_deadline.filter(|asked| *asked > max)?;
        Some(EngineError::DeadlineTooLong {
            metric: req.metric.clone(),
            value: dispatch_api::format_go_duration(asked),
            max: dispatch_api::format_go_duration(max),
            origin: self.inner.origin.clone(),
        })
    }

    /// The deadline of a measurement whose Jobs are created now, in seconds since the epoch:
    /// the block's `activeDeadline` (else `engine.measurementDeadline`), plus
    /// `engine.deadlineGrace` for Jobs, so that their own `activeDeadlineSeconds` verdict comes
    /// first. An observe check has no Job whose verdict could come first: its deadline is the
    /// `activeDeadline` itself.
    pub(super) fn deadline_of(&self, req: &MeasureRequest) -> u64 {
        let settings = &self.inner.settings;
        let grace = match req.config.observe() {
            Some(_) => Duration::ZERO,
            None => settings.deadline_grace,
        };
        let budget = req
            .config
            .active_deadline
            .unwrap_or(settings.measurement_deadline)
            + grace;
        (std::time::SystemTime::now() + budget)
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    /// Whether the policy (still) allows project `project` every placement of `job`: a
    /// reference is checked again on every call that acts on it, as the policy may have
    /// changed since the server signed it.
    pub fn check_placements(&self, project: &str, job: &JobRef) -> Result<(), Denied> {
        job.placements.iter().try_for_each(|p| {
            self.allowed(project, job.observe.as_ref(), &p.destination, &p.namespace)
        })
    }

    /// The policy's word on one placement: an `application:` check reads an Argo CD
    /// Application, so its namespace must be one of a rule's `applicationNamespaces`; a Job
    /// (or a `rollout:` check) needs one of its `namespaces`.
    fn allowed(
        &self,
        project: &str,
        observe: Option<&Observe>,
        destination: &str,
        namespace: &str,
    ) -> Result<(), Denied> {
        let policy = &self.inner.policy;
        match observe {
            Some(Observe::Application(_)) => {
                policy.check_application(project, destination, namespace)
            }
            _ => policy.check(project, destination, namespace),
        }
    }

    /// The destinations (and namespaces) of a request, after the policy.
    pub(super) async fn targets(
        &self,
        req: &MeasureRequest,
    ) -> Result<Vec<(Entry, String)>, EngineError> {
        let registry = &self.inner.registry;
        let project = &req.run.namespace;
        let too_many = |count: usize| EngineError::TooManyPlacements {
            target: match &req.config.target {
                Target::Names(_) => "`destination`".to_string(),
                Target::Stage => "`destination: stage`".to_string(),
                Target::Selector(s) => format!("destinationSelector {:?}", s.to_string()),
            },
            count,
            max: MAX_PLACEMENTS,
        };
        let (candidates, selector) = match &req.config.target {
            Target::Names(names) => {
                // Before any lookup: a list of 10 000 names costs nothing.
                if names.len() > MAX_PLACEMENTS {
                    return Err(too_many(names.len()));
                }
                (self.lookup_all(names, project).await?, None)
            }
            Target::Selector(sel) => {
                registry.wait_sources(self.sources_wait()).await;
                // Only what the project may use: a selector matching other tenants'
                // destinations alone matches nothing, and the error names none of them.
                let found: Vec<Entry> = registry
                    .matching(sel)
                    .into_iter()
                    .filter(|e| self.inner.policy.allows_destination(project, e.name()))
                    .collect();
                if found.is_empty() {
                    let known = registry
                        .entries()
                        .iter()
                        .filter(|e| self.inner.policy.allows_destination(project, e.name()))
                        .map(|e| format!("{} {:?}", e.name(), e.labels()))
                        .collect::<Vec<_>>()
                        .join(", ");
                    return Err(EngineError::NoMatch {
                        selector: sel.to_string(),
                        known: if known.is_empty() {
                            "none".into()
                        } else {
                            known
                        },
                        origin: self.inner.origin.clone(),
                    });
                }
                if found.len() > MAX_PLACEMENTS {
                    return Err(too_many(found.len()));
                }
                (found, Some(sel))
            }
            Target::Stage => {
                let names = self.stage_destinations(&req.run).await?;
                if names.len() > MAX_PLACEMENTS {
                    return Err(too_many(names.len()));
                }
                (self.lookup_all(&names, project).await?, None)
            }
        };
        let mut allowed = Vec::new();
        let mut denied: Vec<EngineError> = Vec::new();
        for e in candidates {
            let ns = placement_namespace(&req.config, e.namespace());
            // A destination limited to namespaces (its credentials and caches cover only
            // those) refuses the others before the policy is asked and before any API call.
            if let Some(limit) = e.namespaces().filter(|l| !l.contains(&ns)) {
                denied.push(EngineError::OutsideNamespaces {
                    destination: e.name().to_string(),
                    namespace: ns,
                    allowed: limit.join(", "),
                    key: e.source().namespaces_key(),
                    origin: self.inner.origin.clone(),
                });
                continue;
            }
            match self.allowed(project, req.config.observe(), e.name(), &ns) {
                Ok(()) => allowed.push((e, ns)),
                Err(d) => denied.push(d.into()),
            }
        }
        match (selector, denied.into_iter().next()) {
            // A selector may span destinations of several teams: keep the allowed ones.
            (Some(sel), Some(d)) if !allowed.is_empty() => {
                tracing::info!(selector = %sel, project = %project, skipped = %d,
                               "policy or namespaces exclude destinations the selector matched");
                Ok(allowed)
            }
            (_, Some(d)) => Err(d),
            (_, None) => Ok(allowed),
        }
    }

    /// The destinations of the run's Stage; resolved once per run (a run belongs to one
    /// promotion), then remembered so that later lookups of the run cost no API call.
    pub(super) async fn stage_destinations(
        &self,
        run: &RunContext,
    ) -> Result<Vec<String>, EngineError> {
        let known = self
            .inner
            .stages
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&run.uid)
            .cloned();
        if let Some(names) = known {
            return Ok(names);
        }
        let cp = self
            .control_plane()
            .await
            .map_err(EngineError::StageControlPlane)?;
        let registry = &self.inner.registry;
        registry.wait_sources(self.sources_wait()).await;
        let names = stage::resolve(
            &cp,
            &self.inner.stage_instances,
            run,
            registry,
            self.inner.settings.request_timeout,
        )
        .await
        .map_err(EngineError::Stage)?;
        let mut memo = self.inner.stages.lock().unwrap_or_else(|e| e.into_inner());
        if memo.len() >= MAX_REMEMBERED {
            memo.clear();
        }
        memo.insert(run.uid.clone(), names.clone());
        Ok(names)
    }

    pub(super) fn sources_wait(&self) -> Duration {
        self.inner
            .settings
            .request_timeout
            .min(Duration::from_secs(10))
    }

    /// The entries of `names` for `project`: each one the policy lets it use somewhere (refused
    /// by name otherwise, before any lookup), then known to the registry.
    async fn lookup_all(&self, names: &[String], project: &str) -> Result<Vec<Entry>, EngineError> {
        let mut out = Vec::new();
        for n in names {
            self.inner.policy.check_destination(project, n)?;
            out.push(self.lookup(n, project).await?);
        }
        Ok(out)
    }

    /// Destination `name`, or the error naming the destinations `project` may use (never
    /// another tenant's).
    pub(super) async fn lookup(&self, name: &str, project: &str) -> Result<Entry, EngineError> {
        let registry = &self.inner.registry;
        if let Some(e) = registry.get(name) {
            return Ok(e);
        }
        // Right after start, Argo CD Secrets may not be listed yet.
        if registry.wait_sources(self.sources_wait()).await {
            if let Some(e) = registry.get(name) {
                return Ok(e);
            }
        }
        let names = self.usable_destinations(project);
        Err(EngineError::UnknownDestination {
            name: name.to_string(),
            known: if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
            origin: self.inner.origin.clone(),
        })
    }

    /// The destinations of the registry that the policy lets `project` use: all that an error
    /// or a note may name to a caller acting for it.
    pub fn usable_destinations(&self, project: &str) -> Vec<String> {
        self.inner
            .registry
            .names()
            .into_iter()
            .filter(|n| self.inner.policy.allows_destination(project, n))
            .collect()
    }

    pub(super) async fn control_plane(&self) -> Result<kube::Client, ControlPlaneError> {
        let inner = &self.inner;
        inner
            .control_plane
            .get_or_init(|| async {
                let config = client::config_for(&inner.control_plane_access, "control-plane")
                    .await
                    .map_err(|e| ControlPlaneError::Unreachable {
                        origin: inner.origin.clone(),
                        source: Arc::new(e),
                    })?;
                client::client_of(
                    &inner.control_plane_access,
                    "control-plane",
                    config,
                    &inner.settings,
                    &RequestCounter::default(),
                )
                .map_err(|e| ControlPlaneError::Client(Arc::new(e)))
            })
            .await
            .clone()
    }

    /// Creates Job `obj` (named `name`) on a direct destination, or adopts the Job of run
    /// `run_uid` already there. The agent calls this for its own cluster.
    pub async fn create_or_adopt(
        &self,
        entry: &Entry,
        namespace: &str,
        name: &str,
        run_uid: &str,
        obj: serde_json::Value,
    ) -> Outcome {
        let d = match entry {
            Entry::Ready(d) => d,
            Entry::Broken(b) => {
                return Outcome::NotCreated(DestState::Error(format!(
                    "destination is unusable: {}",
                    b.error
                )))
            }
            Entry::Agent(a) => {
                return Outcome::NotCreated(DestState::Error(format!(
                    "destination {} is reached through its agent, not directly",
                    a.name
                )))
            }
        };
        if d.jobs().is_authoritative() {
            if let Some(existing) = d.jobs().get(namespace, name) {
                return self.adopt_or_refuse(&existing, &obj, run_uid, namespace, name);
            }
        }
        let what = format!("create job {namespace}/{name}");
        let object: DynamicObject = match serde_json::from_value(obj.clone()) {
            Ok(o) => o,
            Err(e) => return Outcome::NotCreated(DestState::Error(format!("cannot {what}: {e}"))),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(
            d.client().clone(),
            namespace,
            &ApiResource::erase::<Job>(&()),
        );
        let timeout = self.inner.settings.request_timeout;
        match tokio::time::timeout(timeout, api.create(&PostParams::default(), &object)).await {
            Ok(Ok(_)) => Outcome::Created,
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                let jobs: Api<Job> = Api::namespaced(d.client().clone(), namespace);
                match tokio::time::timeout(timeout, jobs.get_opt(name)).await {
                    Ok(Ok(Some(existing))) => self.adopt_or_refuse(&existing, &obj, run_uid, namespace, name),
                    // Deleted in between (foreground deletion still running): try again later.
                    Ok(Ok(None)) => Outcome::NotCreated(DestState::Unavailable(format!(
                        "job {namespace}/{name} is being deleted; it will be created again on the next attempt"
                    ))),
                    Ok(Err(e)) => Outcome::NotCreated(api_failure(d, &format!("read job {namespace}/{name}"), &e)),
                    Err(_) => Outcome::NotCreated(no_answer(d, &what, timeout)),
                }
            }
            Ok(Err(e)) => Outcome::NotCreated(api_failure(d, &what, &e)),
            Err(_) => Outcome::NotCreated(no_answer(d, &what, timeout)),
        }
    }
}

/// The namespace of a placement on a destination whose default namespace is `default`: the
/// observed object's for an observe check (`rollout.namespace`, else the block's `namespace`,
/// else the default; `application.namespace`), else the Job's (the block's `namespace`, else the
/// default). The policy and a destination's `namespaces` are checked on it.
fn placement_namespace(config: &JobConfig, default: &str) -> String {
    let block = || {
        config
            .namespace
            .clone()
            .unwrap_or_else(|| default.to_string())
    };
    match config.observe() {
        Some(Observe::Rollout(r)) => r.namespace.clone().unwrap_or_else(block),
        Some(Observe::Application(a)) => a.namespace.clone(),
        None => block(),
    }
}

/// The (unsigned) reference to the Jobs named `name` of `req` on `targets`.
fn job_ref(req: &MeasureRequest, name: String, targets: &[(Entry, String)]) -> JobRef {
    JobRef {
        run_uid: req.run.uid.clone(),
        run_namespace: req.run.namespace.clone(),
        run_name: req.run.name.clone(),
        metric: req.metric.clone(),
        measurement: req.measurement,
        name,
        require: req.config.require,
        log_tail: req.config.log_tail,
        placements: targets
            .iter()
            .map(|(e, ns)| Placement {
                destination: e.name().to_string(),
                namespace: ns.clone(),
            })
            .collect(),
        deadline: 0,
        observe: req.config.observe().cloned(),
        sig: String::new(),
    }
}
