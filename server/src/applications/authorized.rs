//! Kargo's authorization of an Argo CD Application: a Stage may read or sync an Application only
//! when the Application's `kargo.akuity.io/authorized-stage` annotation names that Stage. The
//! server applies it before it reads (for the caller) or patches an Application on a direct
//! destination, and the agent applies it again on its own cluster before it reports or syncs
//! one (`agent/sync.rs`), so a forged record gets nothing.
//!
//! Exactly what Kargo accepts (akuity/kargo at 1c764767):
//! * the key is `kargo.akuity.io/authorized-stage` (`api/v1alpha1/annotations.go:52`);
//! * its value is a comma-separated list of `<project>:<stage>` entries, white space around each
//!   entry and around its project and Stage ignored, empty entries skipped; an entry without
//!   `:`, or with an empty project or Stage, makes the whole value invalid; so does any `*`
//!   (Kargo's deprecated globs, now "no longer supported"); a value with no entry is invalid
//!   (`pkg/api/stage.go:99-140`, `AuthorizedStages`, which cuts each entry at its first `:`);
//! * an Application is authorized when one entry's project and Stage equal the Stage's, exactly
//!   (`pkg/promotion/runner/builtin/argocd_updater.go:979-1014`, `authorizeArgoCDAppUpdate`;
//!   no annotation, or an invalid one, refuses).
//!
//! A refusal says what to add and nothing about the Application itself: not whether it exists,
//! nor what its annotation says (it may be another project's). The log gets the detail.

use dispatch_api::observe::StageRef;
use serde_json::Value;

/// Kargo's annotation naming the Stages that may manage an Application
/// (`AnnotationKeyAuthorizedStage`).
pub const ANN_AUTHORIZED_STAGE: &str = "kargo.akuity.io/authorized-stage";

/// The note of an agent's report that refused a record for want of authorization, so that the
/// server answers `403` as it does on a direct destination (`records`).
pub const NOTE_UNAUTHORIZED: &str = "authorization";

/// Why an annotation value is not one Kargo accepts (the messages are Kargo's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidAnnotation {
    /// an entry is not `<project>:<stage>`
    #[error("invalid authorized Stage {0:?}: expected format \"<project>:<stage>\"")]
    Format(String),
    /// an entry has a `*` (Kargo's deprecated glob form)
    #[error("invalid authorized Stage {0:?}: deprecated glob expressions are no longer supported")]
    Glob(String),
    /// no entry at all
    #[error("no authorized Stages found in {0:?}")]
    Empty(String),
}

/// The Stages an annotation value authorizes, as Kargo parses it (`AuthorizedStages`).
///
/// Rust's `str::trim` removes the same white space as Go's `strings.TrimSpace` (Unicode
/// `White_Space`), and `split_once(':')` cuts at the first `:` as `strings.Cut` does.
pub fn authorized_stages(value: &str) -> Result<Vec<StageRef>, InvalidAnnotation> {
    let mut stages = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let (project, stage) = entry
            .split_once(':')
            .map_or(("", ""), |(p, s)| (p.trim(), s.trim()));
        if project.is_empty() || stage.is_empty() {
            return Err(InvalidAnnotation::Format(entry.to_string()));
        }
        if project.contains('*') || stage.contains('*') {
            return Err(InvalidAnnotation::Glob(entry.to_string()));
        }
        stages.push(StageRef {
            project: project.to_string(),
            stage: stage.to_string(),
        });
    }
    if stages.is_empty() {
        return Err(InvalidAnnotation::Empty(value.to_string()));
    }
    Ok(stages)
}

/// Why Application `app` is not authorized for a Stage, for the log only (it may describe
/// another project's Application).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// no annotation
    Missing,
    /// an annotation Kargo does not accept
    Invalid(InvalidAnnotation),
    /// a valid annotation that lists other Stages
    OtherStages,
    /// no such Application (refused the same way, so that a refusal tells nothing)
    NotFound,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => write!(f, "no annotation {ANN_AUTHORIZED_STAGE}"),
            Self::Invalid(e) => write!(f, "annotation {ANN_AUTHORIZED_STAGE}: {e}"),
            Self::OtherStages => write!(f, "annotation {ANN_AUTHORIZED_STAGE} lists other Stages"),
            Self::NotFound => f.write_str("no such Application"),
        }
    }
}

/// An Application the Stage may not read or sync; its message names only what the caller
/// asked for (its project, Stage and the Application's path) and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Application {namespace}/{name} on destination {destination:?} does not exist or is not \
     authorized for Kargo Stage {stage:?} of project {project:?}: as in Kargo, its annotation \
     {ANN_AUTHORIZED_STAGE} must list \"{project}:{stage}\" (comma-separated \
     `<project>:<stage>` entries; globs such as \"{project}:*\" are not accepted); ask the \
     Application's owner to add it, or name the Stage it is authorized for (`stage`)"
)]
pub struct Unauthorized {
    /// the destination
    pub destination: String,
    /// the Application's namespace
    pub namespace: String,
    /// its name
    pub name: String,
    /// the caller's project
    pub project: String,
    /// the Stage the caller named
    pub stage: String,
    /// why, for the log
    pub why: Why,
}

/// The Application `app` (as read) may be read and synced by `stage`, else why not.
pub fn check(app: &Value, stage: &StageRef) -> Result<(), Why> {
    let Some(value) = app
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ANN_AUTHORIZED_STAGE))
        .and_then(Value::as_str)
    else {
        return Err(Why::Missing);
    };
    let listed = authorized_stages(value).map_err(Why::Invalid)?;
    if listed.iter().any(|s| s == stage) {
        Ok(())
    } else {
        Err(Why::OtherStages)
    }
}

impl Unauthorized {
    /// The refusal of Application `namespace/name` on `destination` to `stage`, because `why`.
    pub fn new(destination: &str, namespace: &str, name: &str, stage: &StageRef, why: Why) -> Self {
        Self {
            destination: destination.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
            project: stage.project.clone(),
            stage: stage.stage.clone(),
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn s(project: &str, stage: &str) -> StageRef {
        StageRef {
            project: project.into(),
            stage: stage.into(),
        }
    }

    #[test]
    fn parses_what_kargo_parses() {
        // The cases of Kargo's own test (pkg/api/authorized_stage_test.go, TestAuthorizedStages).
        assert_eq!(
            authorized_stages("proj:stage"),
            Ok(vec![s("proj", "stage")])
        );
        assert_eq!(
            authorized_stages("proj:stage-a,proj:stage-b,other:stage-c"),
            Ok(vec![
                s("proj", "stage-a"),
                s("proj", "stage-b"),
                s("other", "stage-c")
            ])
        );
        assert_eq!(
            authorized_stages(" proj : stage-a , , other:stage-b ,"),
            Ok(vec![s("proj", "stage-a"), s("other", "stage-b")])
        );
        assert_eq!(
            authorized_stages("team-a:prod,team-b:uat"),
            Ok(vec![s("team-a", "prod"), s("team-b", "uat")])
        );
        assert_eq!(
            authorized_stages("  team-a : prod ,\tteam-b:uat\n,,"),
            Ok(vec![s("team-a", "prod"), s("team-b", "uat")])
        );
        // Cut at the first colon, as strings.Cut: the rest is the Stage (which then matches no
        // real Stage name).
        assert_eq!(authorized_stages("a:b:c"), Ok(vec![s("a", "b:c")]));
        // Go's TrimSpace and Rust's trim agree on Unicode white space.
        assert_eq!(
            authorized_stages("\u{a0}team-a:prod\u{3000}"),
            Ok(vec![s("team-a", "prod")])
        );
    }

    #[test]
    fn refuses_what_kargo_refuses() {
        let malformed = |s: &str| InvalidAnnotation::Format(s.into());
        let glob = |s: &str| InvalidAnnotation::Glob(s.into());
        let empty = |s: &str| InvalidAnnotation::Empty(s.into());
        for (value, want) in [
            // Kargo's (authorized_stage_test.go), then more of the same rules.
            ("bogus", malformed("bogus")),
            ("proj:", malformed("proj:")),
            (":stage", malformed(":stage")),
            ("", empty("")),
            (",, ,", empty(",, ,")),
            ("*:stage", glob("*:stage")),
            ("proj:*", glob("proj:*")),
            ("proj:stage,proj:*", glob("proj:*")),
            (" , ,", empty(" , ,")),
            ("team-a", malformed("team-a")),
            (" : ", malformed(":")),
            ("team-a:prod,oops", malformed("oops")),
            ("*:*", glob("*:*")),
            ("team-a:prod-*", glob("team-a:prod-*")),
            ("team-*:prod", glob("team-*:prod")),
            // One bad entry spoils the list, even after a good one.
            ("team-a:prod,team-a:*", glob("team-a:*")),
        ] {
            assert_eq!(authorized_stages(value), Err(want), "{value:?}");
        }
    }

    fn app(annotation: Option<&str>) -> Value {
        match annotation {
            None => json!({"metadata": {"name": "web", "annotations": {"other": "x"}}}),
            Some(v) => {
                json!({"metadata": {"name": "web", "annotations": {ANN_AUTHORIZED_STAGE: v}}})
            }
        }
    }

    #[test]
    fn only_the_named_stage_of_the_named_project_is_authorized() {
        let me = s("team-a", "prod");
        assert_eq!(check(&app(Some("team-a:prod")), &me), Ok(()));
        assert_eq!(check(&app(Some("team-b:x, team-a:prod")), &me), Ok(()));
        assert_eq!(check(&app(None), &me), Err(Why::Missing));
        assert_eq!(check(&json!({"metadata": {}}), &me), Err(Why::Missing));
        for other in [
            "team-b:prod",  // another project's Stage of the same name
            "team-a:uat",   // another Stage of the same project
            "team-a:Prod",  // case matters
            "Team-a:prod",  //
            "team-a:prod2", // no prefix matching
            "team-a:pro",   //
            "team-ab:prod", //
            "team:a:prod",  // cut at the first colon
        ] {
            assert_eq!(
                check(&app(Some(other)), &me),
                Err(Why::OtherStages),
                "{other:?}"
            );
        }
        for glob in ["team-a:*", "*:*", "*", "team-a:prod,*:*"] {
            assert!(
                matches!(check(&app(Some(glob)), &me), Err(Why::Invalid(_))),
                "{glob:?}"
            );
        }
        // A non-string annotation value is none.
        let odd = json!({"metadata": {"annotations": {ANN_AUTHORIZED_STAGE: 7}}});
        assert_eq!(check(&odd, &me), Err(Why::Missing));
    }

    #[test]
    fn the_refusal_names_the_fix_and_nothing_of_the_application() {
        let me = s("team-b", "prod");
        let e = Unauthorized::new("a", "argocd", "web", &me, Why::OtherStages).to_string();
        assert!(e.contains(ANN_AUTHORIZED_STAGE), "{e}");
        assert!(e.contains("\"team-b:prod\""), "{e}");
        assert!(e.contains("does not exist or is not authorized"), "{e}");
        // The same words whatever the reason: missing, foreign, invalid or absent.
        for why in [
            Why::Missing,
            Why::NotFound,
            Why::Invalid(InvalidAnnotation::Glob("team-a:*".into())),
        ] {
            assert_eq!(
                Unauthorized::new("a", "argocd", "web", &me, why).to_string(),
                e
            );
        }
    }
}
