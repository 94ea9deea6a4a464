//! Which caller may use the measurement routes (`ensure`, `status`, `terminate`, `gc`), and for
//! which project, and which agent may use an agent route; checked by the routes before the
//! request reaches its feature.
//!
//! * Agent tokens serve one destination's work (`/v1/agents/{dest}/…`) and nothing else: on a
//!   measurement route they are refused outright, whatever the request says.
//! * Every other caller is bound to projects ([`Projects`]: a JWT `projects` claim, a
//!   `policy.callers` entry; `"*"` for the Rollouts controller) and may only act for
//!   AnalysisRuns in those namespaces.
//!
//! The refusal is a 403 `forbidden`, which the plugin turns into an `Error` measurement; its
//! message names the project and what to change (the token, or the config entry).

use dispatch_api::v1::RunRef;

use super::auth::{Principal, Projects, ScopeSource};
use super::DispatchError;

/// Refuses any caller but the agent of `destination` on an agent route (`/v1/agents/{dest}/…`):
/// tokens that are not agent tokens, and agent tokens of another destination.
pub fn agent_caller(caller: &Principal, destination: &str) -> Result<(), DispatchError> {
    match caller.destination.as_deref() {
        None => {
            tracing::warn!(subject = %caller.subject, destination, "refused: not an agent token");
            Err(DispatchError::Forbidden(
                format!(
                    "{} holds no agent token; an agent needs one issued for its destination \
                     (rollouts-dispatch token issue --destination {destination})",
                    caller.subject
                )
                .into(),
            ))
        }
        Some(own) if own != destination => {
            tracing::warn!(subject = %caller.subject, token_destination = own, destination,
                           "refused: agent token of another destination");
            Err(DispatchError::Forbidden(
                format!(
                    "the agent token of {} is for destination {own:?}, not {destination:?}; an \
                     agent only sees and reports the work of its own destination",
                    caller.subject
                )
                .into(),
            ))
        }
        Some(_) => Ok(()),
    }
}

/// Refuses agent tokens, and callers not bound to the run's project.
pub fn measurement_caller(caller: &Principal, run: &RunRef) -> Result<(), DispatchError> {
    not_an_agent(caller)?;
    let project = &run.namespace;
    if caller.projects.allows(project) {
        return Ok(());
    }
    refused_project(caller, run)
}

/// Refuses agent tokens on the plugin's routes.
pub fn not_an_agent(caller: &Principal) -> Result<(), DispatchError> {
    if let Some(dest) = &caller.destination {
        tracing::warn!(subject = %caller.subject, token_destination = %dest,
                       "refused: agent token on a measurement route");
        return Err(DispatchError::Forbidden(
            format!(
                "{} holds an agent token for destination {dest:?}; agent tokens may only poll and \
             report that destination's work (/v1/agents/{dest}/…), never start, read, delete or \
             garbage-collect measurements: give the plugin a plugin token (rollouts-dispatch \
             token issue without --destination)",
                caller.subject
            )
            .into(),
        ));
    }
    Ok(())
}

/// The refusal of `caller`, which is not bound to `run`'s project, naming the fix.
fn refused_project(caller: &Principal, run: &RunRef) -> Result<(), DispatchError> {
    let project = &run.namespace;
    let Projects { globs, bound_by } = &caller.projects;
    tracing::warn!(subject = %caller.subject, %project, bound_to = ?globs,
                   "refused: caller not bound to the run's project");
    let fix = match bound_by {
        ScopeSource::TokenClaim => format!(
            "its token's `projects` claim lists [{}]; issue a token that includes it \
             (rollouts-dispatch token issue --project {project}, once per project)",
            globs.join(", ")
        ),
        ScopeSource::Config { index, origin } => format!(
            "policy.callers[{index}] in {origin} binds it to [{}]; add {project:?} to that \
             entry's projects",
            globs.join(", ")
        ),
    };
    Err(DispatchError::Forbidden(
        format!(
            "{} may not act for project {project:?} (the namespace of AnalysisRun {}/{}): {fix}",
            caller.subject, run.namespace, run.name
        )
        .into(),
    ))
}

/// The project a caller acts for on the Application routes: plugin tokens only (agent tokens
/// are refused), for the project the request names (`project` in the body, `?project=`), which
/// the caller must be bound to; a caller bound to exactly one project (no glob) may leave it out.
pub fn application_caller(
    caller: &Principal,
    destination: &str,
    named: Option<&str>,
) -> Result<String, DispatchError> {
    if let Some(dest) = &caller.destination {
        tracing::warn!(subject = %caller.subject, token_destination = %dest, destination,
                       "refused: agent token on an Application route");
        return Err(DispatchError::Forbidden(
            format!(
                "{} holds an agent token for destination {dest:?}; agent tokens may only poll and \
             report that destination's work, never read or sync Applications: Kargo's http step \
             needs a plugin token (rollouts-dispatch token issue --project <project>)",
                caller.subject
            )
            .into(),
        ));
    }
    let Some(project) = named.or(caller.projects.only_one()) else {
        return Err(DispatchError::Forbidden(
            format!(
                "{} may act for more than one project: name the Kargo project the request is for \
             (`project` in the POST body, `?project=` on GET), or use a token issued for one \
             project (rollouts-dispatch token issue --project <project>)",
                caller.subject
            )
            .into(),
        ));
    };
    if caller.projects.allows(project) {
        return Ok(project.to_string());
    }
    tracing::warn!(subject = %caller.subject, %project, destination,
                   "refused: caller not bound to the project it names");
    let fix = match &caller.projects.bound_by {
        ScopeSource::Config { index, origin } => {
            format!("add {project:?} to policy.callers[{index}] in {origin}")
        }
        ScopeSource::TokenClaim => {
            format!("use a token issued for it (rollouts-dispatch token issue --project {project})")
        }
    };
    Err(DispatchError::Forbidden(
        format!(
            "{} may not act for project {project:?}: {fix}",
            caller.subject
        )
        .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(namespace: &str) -> RunRef {
        RunRef {
            name: "r".into(),
            namespace: namespace.into(),
            uid: "u".into(),
            ..RunRef::default()
        }
    }

    #[test]
    fn agents_are_refused_and_projects_bind() {
        let mut p = Principal::plugin("plugin");
        measurement_caller(&p, &run("any")).unwrap();
        p.destination = Some("edge".into());
        let e = measurement_caller(&p, &run("any")).unwrap_err().to_string();
        assert!(e.contains("agent token for destination \"edge\""), "{e}");

        let mut p = Principal::plugin("ci");
        p.projects = Projects::claimed(vec!["team-a".into()]);
        measurement_caller(&p, &run("team-a")).unwrap();
        let e = measurement_caller(&p, &run("team-b"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("project \"team-b\"") && e.contains("token issue --project team-b"),
            "{e}"
        );
        p.projects = Projects {
            globs: vec!["team-a".into()],
            bound_by: ScopeSource::Config {
                index: 2,
                origin: "config file /c.yaml".into(),
            },
        };
        let e = measurement_caller(&p, &run("team-b"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policy.callers[2] in config file /c.yaml"),
            "{e}"
        );
    }
}
