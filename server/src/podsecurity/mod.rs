//! Pod security of the Jobs we create (pure): the one check that the server runs before it
//! creates a Job (or writes an agent's record) and that the agent runs again before it creates
//! the Job in its cluster.
//!
//! A [`Profile`] says what a Job may do: a Pod Security Standards level ([`Level`]), the service
//! accounts its pods may run as, and whether they may get an API token. [`enforce`] applies it to
//! the Job object (JSON, as `job::build` makes it):
//!
//! * **Always**, at every level: the pod runs as an allowed service account (`serviceAccountName`,
//!   default `default`); `automountServiceAccountToken` is set to `false` when unset, an explicit
//!   `true` (or a projected `serviceAccountToken` volume source) is refused unless the profile
//!   allows tokens; Job and pod template labels with the prefixes of rollouts-dispatch and of the
//!   Job controller are ours and the controller's only.
//! * **Below `privileged`**: no `spec.manualSelector`, no `spec.selector`, no
//!   `spec.template.spec.nodeName` (a Job picks neither its pods nor its node), and every check
//!   of the Kubernetes Pod Security Standards of the level ([`standards`]).
//! * **At `restricted`**, fields left unset are filled with the restricted values before the
//!   checks, so an ordinary template passes: `seccompProfile: {type: RuntimeDefault}` and
//!   `runAsNonRoot: true` in the pod's `securityContext`, `allowPrivilegeEscalation: false` and
//!   `capabilities.drop: [ALL]` in every container's; and when no container names a user, the
//!   pod's `runAsUser` and `runAsGroup` from the profile's [`DefaultUser`] (65532), since the
//!   kubelet cannot check `runAsNonRoot` against an image that runs as root or as a named user.
//!   A field *set* to a value the level does not allow is refused, never rewritten.
//!
//! * **Always, the allowlists** ([`Allowlists`], issue #27; the pods run with our credentials, so
//!   what they name in the namespace is reachable): Secrets, ConfigMaps, claims, CSI drivers and
//!   pull Secrets only by allowed name, legacy token Secret names only exactly (`references`);
//!   scheduling fields only when listed, pod template labels and annotations only by allowed key
//!   (`placement`); every container's requests and limits filled in and capped, the Job's
//!   parallelism, completions and retries capped (`resources`, with `crate::quantity`).
//!
//! A refusal ([`Refused`]) names the JSON path of the field, the value, the level, where the
//! profile comes from (a policy rule or the agent's flags) and the fix (the rule key or flag).

mod allowlists;
mod placement;
mod references;
mod resources;
mod standards;

pub use crate::quantity::{BadQuantity, Quantity};
pub use allowlists::{
    Allowlists, JobLimits, Resources, ResourcesError, SchedulingField, UnknownSchedulingField,
    BUILTIN_DEFAULT, BUILTIN_MAX, KUBERNETES_BACKOFF_LIMIT,
};

use std::fmt;
use std::str::FromStr;

use serde_json::{json, Map, Value};

use crate::job::{destination_label_value, LABEL_DESTINATION, LABEL_MANAGED, LABEL_RUN_UID};

/// A Pod Security Standards level, ordered from the strictest to the most permissive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Level {
    /// baseline plus the hardening of the restricted standard (the default)
    #[default]
    Restricted,
    /// no known privilege escalation: no privileged containers, host namespaces, hostPath …
    Baseline,
    /// anything the destination's API server accepts
    Privileged,
}

impl Level {
    /// The name in the config file and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Restricted => "restricted",
            Level::Baseline => "baseline",
            Level::Privileged => "privileged",
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a [`Level`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a pod security level; use restricted, baseline or privileged")]
pub struct UnknownLevel(pub String);

impl FromStr for Level {
    type Err = UnknownLevel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "restricted" => Ok(Level::Restricted),
            "baseline" => Ok(Level::Baseline),
            "privileged" => Ok(Level::Privileged),
            other => Err(UnknownLevel(other.to_string())),
        }
    }
}

/// Where a profile comes from: says in a refusal which knob allows the refused field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// the matching `policy.rules` entries (`policy.rules[0], policy.rules[2] in config file …`)
    Rules(String),
    /// `policy: {allowAll: true}`, which applies the defaults (`… in config file …`)
    AllowAll(String),
    /// the flags of `rollouts-dispatch agent`
    Agent,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Rules(rules) => f.write_str(rules),
            Origin::AllowAll(file) => write!(f, "`policy.allowAll` in {file}"),
            Origin::Agent => f.write_str("the agent's flags"),
        }
    }
}

/// What the Jobs of one placement may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// the Pod Security Standards level
    pub level: Level,
    /// service accounts the pods may run as (exact names)
    pub service_accounts: Vec<String>,
    /// whether the pods may mount an API token
    pub automount_service_account_token: bool,
    /// the rule or flags it comes from
    pub origin: Origin,
    /// what the pods may reference, set and use beyond the level (#27)
    pub allow: Allowlists,
    /// the user (and group) a restricted pod runs as when its template names none
    pub default_user: DefaultUser,
}

/// The user a restricted pod runs as when its template names none (`policy.rules[].defaultRunAsUser`,
/// the agent's `--default-run-as-user`): a numeric id set as the pod's `runAsUser` and
/// `runAsGroup`, or `none` (the image's own user, which the kubelet accepts under `runAsNonRoot`
/// only when numeric and not 0; for platforms that assign users themselves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefaultUser {
    /// this user and group id
    Id(u32),
    /// none is set
    Image,
}

/// The default [`DefaultUser`]: 65532, distroless' `nonroot` (and this project's own image's).
pub const DEFAULT_RUN_AS_USER: u32 = 65532;

impl Default for DefaultUser {
    fn default() -> Self {
        Self::Id(DEFAULT_RUN_AS_USER)
    }
}

impl fmt::Display for DefaultUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Id(id) => write!(f, "{id}"),
            Self::Image => f.write_str("none"),
        }
    }
}

/// A value that is not a [`DefaultUser`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a user for the pods: give a numeric id from 1 to 2147483647 (not 0: root), or \
     `none` to keep the image's own"
)]
pub struct BadDefaultUser(pub String);

impl DefaultUser {
    /// The id `n` (1 to 2147483647, what the API server accepts as a user id, root excepted).
    pub fn from_id(n: i64) -> Result<Self, BadDefaultUser> {
        match u32::try_from(n) {
            Ok(id) if id > 0 && i32::try_from(id).is_ok() => Ok(Self::Id(id)),
            _ => Err(BadDefaultUser(n.to_string())),
        }
    }
}

impl FromStr for DefaultUser {
    type Err = BadDefaultUser;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "none" => Ok(Self::Image),
            t => t
                .parse::<i64>()
                .map_err(|_| BadDefaultUser(s.to_string()))
                .and_then(Self::from_id),
        }
    }
}

impl Profile {
    /// The defaults: `restricted`, service account `default` only, no API token, the default
    /// allowlists (nothing referenced, built-in resources and caps), user 65532 when the
    /// template names none.
    pub fn restricted(origin: Origin) -> Self {
        Self {
            level: Level::Restricted,
            service_accounts: default_service_accounts(),
            automount_service_account_token: false,
            origin,
            allow: Allowlists::default(),
            default_user: DefaultUser::default(),
        }
    }
}

/// The service accounts allowed when a rule lists none: `default`.
pub fn default_service_accounts() -> Vec<String> {
    vec!["default".to_string()]
}

/// What would allow a refused field.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Needs {
    /// a more permissive level
    Level(Level),
    /// this service account in the allowlist
    ServiceAccount(String),
    /// API tokens allowed
    Token,
    /// nothing: the field is ours or the Job controller's
    Nothing,
    /// an allowlist entry (or a higher cap): what to do without it, the rule key and the flag
    Allow {
        /// `remove the reference from the AnalysisTemplate`, `lower it to at most 2`
        remedy: String,
        /// the rule key with the value: `` `secrets: [db]` ``
        rule: String,
        /// the agent's flag with the value: `` `rollouts-dispatch agent --secrets db` ``
        flag: String,
    },
}

/// A field of a Job that its profile does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Violation {
    path: String,
    problem: String,
    needs: Needs,
}

fn violation(path: impl Into<String>, problem: impl Into<String>, needs: Needs) -> Violation {
    Violation {
        path: path.into(),
        problem: problem.into(),
        needs,
    }
}

/// A Job its profile refuses: the field, what is wrong, the level, the rule and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod security refuses `{path}`: {problem} (level {level}, from {origin}); {fix}")]
pub struct Refused {
    /// JSON path of the field in the Job: `spec.template.spec.containers[0].securityContext.privileged`
    pub path: String,
    /// what is wrong with its value
    pub problem: String,
    /// the level applied
    pub level: Level,
    /// the rule or flags the profile comes from
    pub origin: Origin,
    /// how to get the Job accepted
    pub fix: String,
}

impl Refused {
    fn new(v: Violation, profile: &Profile) -> Self {
        let knob = |policy: String, agent: String| {
            match &profile.origin {
            Origin::Rules(rules) => format!("{policy} on {rules}"),
            Origin::AllowAll(file) => format!(
                "write `policy.rules` for this project in {file} instead of `allowAll`, with {policy}"
            ),
            Origin::Agent => agent,
        }
        };
        let fix = match &v.needs {
            Needs::Level(l) => format!(
                "change the field in the AnalysisTemplate, or allow it with {}",
                knob(
                    format!("`podSecurity: {l}`"),
                    format!("`rollouts-dispatch agent --pod-security {l}`")
                )
            ),
            Needs::ServiceAccount(sa) => {
                // The list as it must be written: the names allowed now and this one (a
                // suggestion of `[sa]` alone would take the others away).
                let mut widened = profile.service_accounts.clone();
                widened.push(sa.clone());
                format!(
                    "use an allowed service account ({}), or allow it with {}",
                    profile.service_accounts.join(", "),
                    knob(
                        format!("`serviceAccounts: [{}]`", widened.join(", ")),
                        format!(
                            "`rollouts-dispatch agent --service-accounts {}`",
                            widened.join(",")
                        )
                    )
                )
            }
            Needs::Token => format!(
                "remove it (the verification then has no API token), or allow tokens with {}",
                knob(
                    "`automountServiceAccountToken: true`".to_string(),
                    "`rollouts-dispatch agent --automount-service-account-token`".to_string()
                )
            ),
            Needs::Nothing => {
                "remove it from the AnalysisTemplate; no setting allows it".to_string()
            }
            Needs::Allow { remedy, rule, flag } => format!(
                "{remedy}, or allow it with {}",
                knob(rule.clone(), flag.clone())
            ),
        };
        Self {
            path: v.path,
            problem: v.problem,
            level: profile.level,
            origin: profile.origin.clone(),
            fix,
        }
    }
}

pub use crate::job::RESERVED_LABEL_PREFIXES;

/// The labels `job::build` puts on the Job and its pods, with their values: the only reserved
/// labels [`enforce`] lets through.
pub fn our_labels(run_uid: &str, destination: &str) -> Vec<(String, String)> {
    vec![
        (LABEL_RUN_UID.to_string(), run_uid.to_string()),
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (
            LABEL_DESTINATION.to_string(),
            destination_label_value(destination),
        ),
    ]
}

/// Applies `profile` to `job` (a `batch/v1` Job as JSON): fills the unset restricted fields and
/// refuses the first field the profile does not allow. `ours` are the reserved labels `job`
/// may carry ([`our_labels`]).
pub fn enforce(
    job: &mut Value,
    profile: &Profile,
    ours: &[(String, String)],
) -> Result<(), Refused> {
    check(job, profile, ours).map_err(|v| Refused::new(v, profile))
}

fn check(job: &mut Value, profile: &Profile, ours: &[(String, String)]) -> Result<(), Violation> {
    let not_object = |path: &str| violation(path, "must be an object", Needs::Nothing);
    let job = job.as_object_mut().ok_or_else(|| not_object("(the Job)"))?;
    check_labels(job.get("metadata"), "metadata", ours)?;
    let spec = job
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_object("spec"))?;
    if profile.level < Level::Privileged {
        // A Job that picks its pods (or labels them for another selector) can adopt or disturb
        // pods that are not its own.
        if truthy(spec.get("manualSelector")) {
            return Err(violation(
                "spec.manualSelector",
                "a Job must not choose its own pod selector",
                Needs::Level(Level::Privileged),
            ));
        }
        if is_set(spec.get("selector")) {
            return Err(violation(
                "spec.selector",
                "a Job must not set its pod selector (the Job controller generates it)",
                Needs::Level(Level::Privileged),
            ));
        }
    }
    resources::cap_job(spec, profile.allow.job_limits)?;
    let template = spec
        .get_mut("template")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_object("spec.template"))?;
    check_labels(template.get("metadata"), "spec.template.metadata", ours)?;
    let meta = template.get("metadata").cloned().unwrap_or(Value::Null);
    placement::check_pod_metadata(&meta, &profile.allow, ours)?;
    let pod = template
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| not_object("spec.template.spec"))?;
    const POD: &str = "spec.template.spec";
    check_identity(pod, profile)?;
    if profile.level < Level::Privileged {
        if let Some(node) = pod.get("nodeName").filter(|v| is_set(Some(v))) {
            return Err(violation(
                format!("{POD}.nodeName"),
                format!("{node} pins the pod to a node, bypassing the scheduler"),
                Needs::Level(Level::Privileged),
            ));
        }
    }
    placement::check_scheduling(pod, &profile.allow)?;
    references::check(pod, &profile.allow)?;
    resources::fill_and_cap(pod, &profile.allow.resources)?;
    if profile.level == Level::Restricted {
        standards::fill_restricted(pod, profile.default_user)?;
    }
    standards::check(&meta, pod, profile.level)
}

/// `serviceAccountName` (and its deprecated alias `serviceAccount`) in the allowlist, and the
/// API token only when allowed.
fn check_identity(pod: &mut Map<String, Value>, profile: &Profile) -> Result<(), Violation> {
    const POD: &str = "spec.template.spec";
    for field in ["serviceAccountName", "serviceAccount"] {
        let Some(v) = pod.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let name = v.as_str().unwrap_or_default();
        if !profile.service_accounts.iter().any(|a| a == name) {
            return Err(violation(
                format!("{POD}.{field}"),
                format!("service account {v} is not allowed"),
                Needs::ServiceAccount(name.to_string()),
            ));
        }
    }
    let unset = !is_set(pod.get("serviceAccountName")) && !is_set(pod.get("serviceAccount"));
    if unset && !profile.service_accounts.iter().any(|a| a == "default") {
        return Err(violation(
            format!("{POD}.serviceAccountName"),
            "is unset, so the pod runs as service account \"default\", which is not allowed",
            Needs::ServiceAccount("default".into()),
        ));
    }
    if profile.automount_service_account_token {
        return Ok(());
    }
    match pod.get("automountServiceAccountToken") {
        None | Some(Value::Null) => {
            pod.insert("automountServiceAccountToken".into(), json!(false));
        }
        Some(Value::Bool(false)) => {}
        Some(v) => {
            return Err(violation(
                format!("{POD}.automountServiceAccountToken"),
                format!("is {v}: the pod would get an API token"),
                Needs::Token,
            ))
        }
    }
    // A projected token is the same token by another door.
    for (i, volume) in list(pod.get("volumes")).iter().enumerate() {
        for (j, source) in list(volume.pointer("/projected/sources"))
            .iter()
            .enumerate()
        {
            if is_set(source.get("serviceAccountToken")) {
                return Err(violation(
                    format!("{POD}.volumes[{i}].projected.sources[{j}].serviceAccountToken"),
                    "mounts an API token of the pod's service account",
                    Needs::Token,
                ));
            }
        }
    }
    Ok(())
}

/// Reserved label keys only as `job::build` sets them.
fn check_labels(
    metadata: Option<&Value>,
    at: &str,
    ours: &[(String, String)],
) -> Result<(), Violation> {
    let Some(labels) = metadata
        .and_then(|m| m.get("labels"))
        .and_then(Value::as_object)
    else {
        return Ok(());
    };
    for (key, value) in labels {
        let expected = ours.iter().find(|(k, _)| k == key).map(|(_, v)| v);
        if expected.is_none() && !RESERVED_LABEL_PREFIXES.iter().any(|p| key.starts_with(p)) {
            continue;
        }
        if expected.is_none_or(|v| value.as_str() != Some(v)) {
            return Err(violation(
                format!("{at}.labels[{key:?}]"),
                format!(
                    "the label prefix is reserved for rollouts-dispatch and the Job controller ({})",
                    RESERVED_LABEL_PREFIXES.join(", ")
                ),
                Needs::Nothing,
            ));
        }
    }
    Ok(())
}

/// The items of a JSON list (none when absent or not a list).
pub(crate) fn list(v: Option<&Value>) -> &[Value] {
    v.and_then(Value::as_array).map_or(&[], Vec::as_slice)
}

/// Present and not `null`.
pub(crate) fn is_set(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null())
}

/// Set to anything but `false`/`null` (a value the API server would refuse counts too).
pub(crate) fn truthy(v: Option<&Value>) -> bool {
    !matches!(v, None | Some(Value::Null) | Some(Value::Bool(false)))
}

/// A JSON value for a message, cut short.
pub(crate) fn shown(v: Option<&Value>) -> String {
    let text = match v {
        None => "(unset)".to_string(),
        Some(v) => v.to_string(),
    };
    if text.chars().count() > 80 {
        let cut: String = text.chars().take(77).collect();
        format!("{cut}…")
    } else {
        text
    }
}

/// Whether `is_set` and not an empty list, object or string (which the API server drops).
pub(crate) fn meaningful(v: Option<&Value>) -> bool {
    is_set(v)
        && match v {
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            _ => true,
        }
}

/// `s` as a YAML flow scalar for a fix: plain when it is a name or key, else quoted.
pub(crate) fn yaml_scalar(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'))
        && !s.starts_with('-');
    if plain {
        s.to_string()
    } else {
        format!("{s:?}")
    }
}

#[cfg(test)]
mod allowlist_tests;
#[cfg(test)]
mod tests;
