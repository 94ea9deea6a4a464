//! The observe checks: instead of running a Job, follow what is already deployed on the
//! destination — an Argo Rollout to the end of its own analysis (`rollout:`), or an Argo CD
//! Application to Synced and Healthy (`application:`) — and the wire types of the Application
//! sync trigger (`/v1/destinations/{d}/applications/{ns}/{name}`).
//!
//! The same values travel in the plugin block (as written), in the signed Job reference (so
//! that an edited block cannot change what a running measurement observes) and in an agent's
//! record (so that the agent observes its own cluster).

use serde::{Deserialize, Serialize};

use crate::error::{fail, BlockError};
use crate::names::{is_dns_label, is_dns_labels, is_dns_subdomain};

/// The namespace of an Application when the block names none (Argo CD's default install).
pub const DEFAULT_ARGOCD_NAMESPACE: &str = "argocd";

/// `GET`: an Application's sync, health, revision and operation ([`ApplicationState`]).
pub const APPLICATION: &str = "/v1/destinations/{destination}/applications/{namespace}/{name}";
/// `POST`: refresh and sync an Application ([`SyncRequest`] → [`ApplicationState`]).
pub const APPLICATION_SYNC: &str =
    "/v1/destinations/{destination}/applications/{namespace}/{name}:sync";

/// What an observe check follows on each destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Observe {
    /// an Argo Rollout and the AnalysisRuns of its revision
    Rollout(RolloutCheck),
    /// an Argo CD Application
    Application(ApplicationCheck),
}

impl Observe {
    /// `rollout` or `application`: the block field, also used in messages and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Rollout(_) => "rollout",
            Self::Application(_) => "application",
        }
    }

    /// `namespace/name` of the observed object, where a namespace is known.
    pub fn object(&self) -> String {
        match self {
            Self::Rollout(r) => match &r.namespace {
                Some(ns) => format!("{ns}/{}", r.name),
                None => r.name.clone(),
            },
            Self::Application(a) => format!("{}/{}", a.namespace, a.name),
        }
    }
}

/// `rollout:` — wait until the Rollout runs the expected revision, then follow it to the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutCheck {
    /// the Rollout's name
    pub name: String,
    /// its namespace; `None`: the block's `namespace`, else the destination's default
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// the expected image (`<repo>:<tag>` or `<repo>@<digest>`) of one of the pod template's
    /// containers
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// the expected revision: the pod-template hash (`status.currentPodHash`) or the
    /// `rollout.argoproj.io/revision` annotation
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// `application:` — the Argo CD Application must be Synced (to `revision`, if given) and Healthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplicationCheck {
    /// the Application's name
    pub name: String,
    /// its namespace ([`DEFAULT_ARGOCD_NAMESPACE`] when the block names none)
    #[serde(default = "default_argocd_namespace")]
    pub namespace: String,
    /// the revision it must be synced to (a commit SHA, as in `status.sync.revision`); `None`:
    /// any
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

fn default_argocd_namespace() -> String {
    DEFAULT_ARGOCD_NAMESPACE.to_string()
}

impl RolloutCheck {
    /// Validates a `rollout:` block as written.
    pub fn parse(value: serde_json::Value) -> Result<Self, BlockError> {
        let check: Self = serde_json::from_value(value).map_err(|e| {
            BlockError(format!(
                "field `rollout`: {e}; fix it in the AnalysisTemplate"
            ))
        })?;
        object_name("rollout.name", &check.name)?;
        if let Some(ns) = &check.namespace {
            namespace("rollout.namespace", ns)?;
        }
        if check.image.is_some() && check.revision.is_some() {
            return fail(
                "fields `rollout.image` and `rollout.revision` are mutually exclusive: keep one",
            );
        }
        for (field, value) in [
            ("rollout.image", &check.image),
            ("rollout.revision", &check.revision),
        ] {
            if let Some(v) = value {
                unresolved(field, v)?;
                if v.is_empty() || v.chars().any(char::is_whitespace) {
                    return fail(format!(
                        "field `{field}` must be a non-empty value without white space, got {v:?} \
                         (an empty value usually means the Stage passed an empty verification arg)"
                    ));
                }
            }
        }
        Ok(check)
    }
}

impl ApplicationCheck {
    /// Validates an `application:` block as written.
    pub fn parse(value: serde_json::Value) -> Result<Self, BlockError> {
        let check: Self = serde_json::from_value(value).map_err(|e| {
            BlockError(format!(
                "field `application`: {e}; fix it in the AnalysisTemplate"
            ))
        })?;
        object_name("application.name", &check.name)?;
        namespace("application.namespace", &check.namespace)?;
        if let Some(rev) = &check.revision {
            unresolved("application.revision", rev)?;
            if rev.is_empty() || rev.chars().any(char::is_whitespace) {
                return fail(format!(
                    "field `application.revision` must be a non-empty value without white space, got {rev:?}"
                ));
            }
        }
        Ok(check)
    }
}

fn unresolved(field: &str, value: &str) -> Result<(), BlockError> {
    if value.contains("{{") {
        return fail(format!(
            "field `{field}` still contains {value:?}: the arg was not resolved; pass it from the \
             Stage's verification.args or give the AnalysisTemplate arg a value"
        ));
    }
    Ok(())
}

fn namespace(field: &str, ns: &str) -> Result<(), BlockError> {
    if is_dns_label(ns) {
        Ok(())
    } else {
        fail(format!(
            "field `{field}` is not a valid namespace name: {ns:?} (lowercase letters, digits and '-', at most 63)"
        ))
    }
}

/// An object name: a DNS-1123 subdomain (what Kubernetes accepts for Rollouts and Applications).
fn object_name(field: &str, name: &str) -> Result<(), BlockError> {
    unresolved(field, name)?;
    if is_dns_labels(name) {
        Ok(())
    } else {
        fail(format!(
            "field `{field}` is not a valid object name: {name:?} (lowercase letters, digits, '-' and '.', at most 253)"
        ))
    }
}

/// The Application a route names (`…/applications/{namespace}/{name}`), validated like the
/// block's `application:`: a namespace name and an object name, nothing else (no `..`, no `/`).
pub fn application_of_route(namespace: &str, name: &str) -> Result<ApplicationCheck, BlockError> {
    if !is_dns_label(namespace) {
        return fail(format!(
            "path segment {{namespace}} is not a valid namespace name: {namespace:?} (lowercase \
             letters, digits and '-', at most 63)"
        ));
    }
    if !is_dns_labels(name) {
        return fail(format!(
            "path segment {{name}} is not a valid Application name: {name:?} (lowercase letters, \
             digits, '-' and '.', at most 253)"
        ));
    }
    Ok(ApplicationCheck {
        name: name.to_string(),
        namespace: namespace.to_string(),
        revision: None,
    })
}

/// The refresh Argo CD is asked for when a sync request names none.
pub const DEFAULT_REFRESH: &str = "normal";
/// The longest revision a sync request may name (a SHA-256 commit is 64; a tag or branch fits).
pub const MAX_REVISION: usize = 255;

impl SyncRequest {
    /// The refresh asked for (`normal` when none): `normal` or `hard`, Argo CD's
    /// `RefreshTypeNormal`/`RefreshTypeHard`.
    pub fn refresh(&self) -> &str {
        self.refresh.as_deref().unwrap_or(DEFAULT_REFRESH)
    }

    /// Checks the body of [`APPLICATION_SYNC`]; the error names the field.
    pub fn validate(&self) -> Result<(), BlockError> {
        if !matches!(self.refresh(), "normal" | "hard") {
            return fail(format!(
                "field `refresh` must be \"normal\" or \"hard\", got {:?}",
                self.refresh()
            ));
        }
        if let Some(rev) = &self.revision {
            unresolved("revision", rev)?;
            if rev.is_empty()
                || rev.len() > MAX_REVISION
                || rev.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return fail(format!(
                    "field `revision` must be a commit, tag or branch without white space, at \
                     most {MAX_REVISION} bytes, got {rev:?}"
                ));
            }
        }
        if let Some(p) = &self.project {
            if !is_dns_label(p) {
                return fail(format!(
                    "field `project` is not a Kargo project name: {p:?} (a namespace name)"
                ));
            }
        }
        stage_name("field `stage`", self.stage.as_deref())?;
        Ok(())
    }
}

/// Checks the Kargo Stage an Application route names (`what`: `field `stage`` or `query
/// parameter `stage``): required, since the Application is authorized for a Stage
/// (`kargo.akuity.io/authorized-stage`), and a Stage name (a Kubernetes object name).
pub fn stage_name<'a>(what: &str, stage: Option<&'a str>) -> Result<&'a str, BlockError> {
    let Some(stage) = stage else {
        return fail(format!(
            "{what} is required: the Kargo Stage the request is for (`${{{{ ctx.stage }}}}` in \
             Kargo's http step); the Application must list `<project>:<stage>` in its annotation \
             kargo.akuity.io/authorized-stage"
        ));
    };
    if !is_dns_subdomain(stage) {
        return fail(format!(
            "{what} is not a Kargo Stage name: {stage:?} (lowercase letters, digits, '-' and \
             '.', at most 253; no globs)"
        ));
    }
    Ok(stage)
}

/// The Kargo Stage an Application is read or synced for: the caller's project and the Stage it
/// names. Carried in an agent destination's record ([`crate::agent::DispatchJobSpec::for_stage`])
/// so that the agent checks the live Application's annotation itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StageRef {
    /// the Kargo project (the project namespace)
    pub project: String,
    /// the Stage's name in that project
    pub stage: String,
}

impl std::fmt::Display for StageRef {
    /// `<project>:<stage>`, the form of Kargo's annotation.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.project, self.stage)
    }
}

/// An Application's state as Argo CD reports it, in a shape Kargo's `http` promotion step can
/// test (`response.body.sync.status == 'Synced'`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationState {
    /// the destination the Application lives on
    pub destination: String,
    /// its namespace
    pub namespace: String,
    /// its name
    pub name: String,
    /// `status.sync`
    #[serde(default)]
    pub sync: SyncState,
    /// `status.health`
    #[serde(default)]
    pub health: HealthState,
    /// `status.operationState`, when a sync operation ran or runs
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationState>,
    /// a sync operation is requested and not yet picked up by Argo CD (`operation` is set)
    #[serde(default)]
    pub sync_requested: bool,
    /// resources that are not Healthy (kind, namespace/name, health and message)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy: Vec<ResourceHealth>,
    /// `status.reconciledAt` (RFC 3339), when Argo CD last compared it
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_at: Option<String>,
}

/// The most unhealthy resources a state carries.
pub const MAX_UNHEALTHY: usize = 20;
/// The most notes (metadata facts) one destination's report carries.
pub const MAX_NOTES: usize = 8;

impl ApplicationState {
    /// The same state with every text cut to `max` bytes and at most [`MAX_UNHEALTHY`]
    /// resources: what the server keeps of an agent's report, whatever its size.
    #[must_use]
    pub fn bounded(mut self, max: usize) -> Self {
        let cut = |s: &mut String| *s = crate::state::truncate(s, max);
        for s in [
            &mut self.destination,
            &mut self.namespace,
            &mut self.name,
            &mut self.sync.status,
            &mut self.sync.revision,
            &mut self.health.status,
            &mut self.health.message,
        ] {
            cut(s);
        }
        if let Some(op) = &mut self.operation {
            for s in [&mut op.phase, &mut op.message, &mut op.revision] {
                cut(s);
            }
        }
        self.unhealthy.truncate(MAX_UNHEALTHY);
        for r in &mut self.unhealthy {
            for s in [
                &mut r.kind,
                &mut r.object,
                &mut r.health.status,
                &mut r.health.message,
            ] {
                cut(s);
            }
        }
        self
    }
}

/// At most [`MAX_NOTES`] notes, keys of at most 63 bytes made of `[a-z0-9-]`, values cut to
/// `max` bytes: what the server keeps of an agent's notes.
pub fn bounded_notes(
    notes: std::collections::BTreeMap<String, String>,
    max: usize,
) -> std::collections::BTreeMap<String, String> {
    notes
        .into_iter()
        .filter(|(k, _)| {
            !k.is_empty()
                && k.len() <= 63
                && k.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
        .take(MAX_NOTES)
        .map(|(k, v)| (k, crate::state::truncate(&v, max)))
        .collect()
}

/// `status.sync` of an Application.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncState {
    /// `Synced`, `OutOfSync` or `Unknown` (empty before Argo CD's first look)
    #[serde(default)]
    pub status: String,
    /// the revision it is compared with
    #[serde(default)]
    pub revision: String,
}

/// `status.health` of an Application or a resource.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthState {
    /// `Healthy`, `Progressing`, `Degraded`, `Suspended`, `Missing` or `Unknown`
    #[serde(default)]
    pub status: String,
    /// why, when Argo CD says
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// `status.operationState` of an Application.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationState {
    /// `Running`, `Succeeded`, `Failed`, `Error` or `Terminating`
    #[serde(default)]
    pub phase: String,
    /// Argo CD's message
    #[serde(default)]
    pub message: String,
    /// the revision the sync went to (`syncResult.revision`)
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// RFC 3339
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

/// One resource of an Application that is not Healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceHealth {
    /// e.g. `Deployment`
    pub kind: String,
    /// `namespace/name` (or `name` for cluster-scoped resources)
    pub object: String,
    /// its health
    pub health: HealthState,
}

/// Body of [`APPLICATION_SYNC`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SyncRequest {
    /// the revision to sync to; `None`: the Application's target revision
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// `normal` or `hard`: ask Argo CD to refresh first; `None`: `normal`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
    /// the Kargo project asking (the token's project when it is bound to one)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// the Kargo Stage asking (`${{ ctx.stage }}`): required, the Application must be
    /// authorized for it (`kargo.akuity.io/authorized-stage`); `Option` so that its absence is
    /// a `400` naming the field ([`SyncRequest::validate`])
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn observe_checks_round_trip_with_their_kind() {
        let o = Observe::Rollout(RolloutCheck {
            name: "web".into(),
            namespace: Some("shop".into()),
            image: Some("ghcr.io/x/web:1.2".into()),
            revision: None,
        });
        let v = serde_json::to_value(&o).unwrap();
        assert_eq!(v["kind"], "rollout");
        assert_eq!(serde_json::from_value::<Observe>(v).unwrap(), o);
        assert_eq!(o.object(), "shop/web");
    }

    #[test]
    fn application_namespace_defaults_to_argocd() {
        let a = ApplicationCheck::parse(json!({"name": "web"})).unwrap();
        assert_eq!(a.namespace, DEFAULT_ARGOCD_NAMESPACE);
    }

    #[test]
    fn each_mistake_names_its_field() {
        for (value, needle) in [
            (json!({"name": "Web"}), "rollout.name"),
            (
                json!({"name": "web", "namespace": "A_B"}),
                "rollout.namespace",
            ),
            (
                json!({"name": "web", "image": "a:1", "revision": "abc"}),
                "mutually exclusive",
            ),
            (json!({"name": "web", "image": ""}), "rollout.image"),
            (
                json!({"name": "web", "image": "{{args.image}}"}),
                "not resolved",
            ),
            (json!({"name": "web", "replicas": 2}), "replicas"),
            (json!({}), "name"),
        ] {
            let e = RolloutCheck::parse(value.clone()).unwrap_err().0;
            assert!(e.contains(needle), "{value}: {e}");
        }
        for (value, needle) in [
            (
                json!({"name": "web", "namespace": ""}),
                "application.namespace",
            ),
            (
                json!({"name": "web", "revision": " "}),
                "application.revision",
            ),
            (json!({"name": "web", "project": "x"}), "project"),
        ] {
            let e = ApplicationCheck::parse(value.clone()).unwrap_err().0;
            assert!(e.contains(needle), "{value}: {e}");
        }
    }
}
