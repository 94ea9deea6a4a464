//! Policy: which Kargo projects (AnalysisRun namespaces) may run Jobs on which destinations and
//! namespaces (`docs/architecture.md`), and with which pod security [`Profile`].
//!
//! Rules are globs (`*`, `?`); any matching rule allows. The policy denies by default: without a
//! `policy` block, or with one that has no rules, nothing is dispatched, and [`Policy::warning`]
//! says so once at start. `policy: {allowAll: true}` opts in to every project on every
//! destination (also with a warning). A denial names the project, the destination, the
//! namespace and the config key to change.
//!
//! An Argo CD Application is a separate grant: [`Policy::check_application`] matches its
//! namespace against a rule's `applicationNamespaces` (none by default), never `namespaces`,
//! so that a namespace where a project reads or syncs Applications (`argocd`) is not one where
//! it may also place Jobs, and the reverse (`applications::authorized` then asks the
//! Application itself).
//!
//! The pod security of a placement ([`Policy::profile`]) combines the rules that allow it: the
//! most permissive `podSecurity` level wins, and their `serviceAccounts` and
//! `automountServiceAccountToken` add up, since any matching rule allows; so do their pod
//! allowlists (the union of the lists, the larger of each default and cap: `podsecurity`).

use crate::config::{PolicyConfig, PolicyRule};
use crate::podsecurity::{Level, Origin, Profile};

mod grant;
pub use grant::Grant;
/// Why a request is denied when there are no rules.
const DENY_BY_DEFAULT: &str = "there are no `policy.rules`, and the policy denies by default \
                               (`policy: {allowAll: true}` would allow every project everywhere)";

/// The policy in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    rules: Vec<PolicyRule>,
    allow_all: bool,
    origin: String,
}

/// A request the policy does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "policy denies project {project:?} the destination {destination:?} ({kind} {namespace:?}): {why}; \
     to allow it, add a rule to `policy.rules` in {origin} with projects [{project:?}], destinations \
     [{destination:?}] and {key} [{namespace:?}]",
    kind = .grant.kind(), key = .grant.key()
)]
pub struct Denied {
    /// the Kargo project (AnalysisRun namespace)
    pub project: String,
    /// the destination
    pub destination: String,
    /// the namespace on the destination
    pub namespace: String,
    /// which part did not match (boxed: the denial stays small enough to return by value)
    pub why: Box<str>,
    /// the config file
    pub origin: String,
    /// the list of the rules that did not allow it: `namespaces` (Jobs and observed Rollouts)
    /// or `applicationNamespaces` (Applications)
    pub grant: Grant,
}

/// A destination the policy lets a project use in no namespace at all. Refused by its name, the
/// same whether or not such a destination exists, so that an error tells another tenant's
/// destination from a missing one no more than it names it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "policy denies project {project:?} the destination {destination:?}: {why}; to allow it, add \
     a rule to `policy.rules` in {origin} with projects [{project:?}] and destinations \
     [{destination:?}]"
)]
pub struct DestinationDenied {
    /// the Kargo project (AnalysisRun namespace)
    pub project: String,
    /// the destination asked for
    pub destination: String,
    /// what the project's rules allow instead
    pub why: String,
    /// the config file
    pub origin: String,
}

impl Policy {
    /// Whether `project` may use `destination` in some namespace: what an error, a listing or
    /// a log note may name to a caller acting for `project`.
    pub fn allows_destination(&self, project: &str, destination: &str) -> bool {
        self.allow_all
            || self.rules.iter().any(|r| {
                r.projects.iter().any(|g| glob_match(g, project))
                    && r.destinations.iter().any(|g| glob_match(g, destination))
            })
    }

    /// Whether a caller bound to the projects matching `globs` may be shown `destination`: some
    /// rule lets a project it acts for use it (a rule's project matched by one of `globs`, or
    /// matching one written without wildcards). Two globs that merely overlap do not count:
    /// listing less is the safe side.
    pub fn shows_destination(&self, globs: &[String], destination: &str) -> bool {
        self.allow_all
            || self.rules.iter().any(|r| {
                r.destinations.iter().any(|g| glob_match(g, destination))
                    && r.projects.iter().any(|rp| {
                        globs
                            .iter()
                            .any(|cp| glob_match(cp, rp) || glob_match(rp, cp))
                    })
            })
    }

    /// [`Policy::allows_destination`] as an error naming what `project`'s rules allow.
    pub fn check_destination(
        &self,
        project: &str,
        destination: &str,
    ) -> Result<(), DestinationDenied> {
        if self.allows_destination(project, destination) {
            return Ok(());
        }
        let allowed: Vec<&str> = self
            .rules
            .iter()
            .filter(|r| r.projects.iter().any(|g| glob_match(g, project)))
            .flat_map(|r| r.destinations.iter().map(String::as_str))
            .collect();
        let why = if self.rules.is_empty() {
            DENY_BY_DEFAULT.to_string()
        } else if allowed.is_empty() {
            "no rule lists this project".to_string()
        } else {
            format!(
                "the rules for this project allow destinations {}",
                allowed.join(", ")
            )
        };
        Err(DestinationDenied {
            project: project.to_string(),
            destination: destination.to_string(),
            why,
            origin: self.origin.clone(),
        })
    }

    /// Everything is allowed, with the default pod security profile: what
    /// `policy: {allowAll: true}` says, and the engine of an agent (whose own checks are its
    /// flags, see `agent`).
    pub fn allow_all(origin: &str) -> Self {
        Self {
            rules: Vec::new(),
            allow_all: true,
            origin: origin.to_string(),
        }
    }

    /// The policy of a config file; none, or one without rules or `allowAll`, denies everything.
    pub fn new(config: Option<&PolicyConfig>, origin: &str) -> Self {
        Self {
            rules: config.map(|c| c.rules.clone()).unwrap_or_default(),
            allow_all: config.is_some_and(|c| c.allow_all),
            origin: origin.to_string(),
        }
    }

    /// The warning to log at start when everything, or nothing, is allowed.
    pub fn warning(&self) -> Option<String> {
        if self.allow_all {
            return Some(format!(
                "`policy.allowAll` in {}: every project may run Jobs on every destination and \
                 namespace (pod security: restricted, service account default, no API token, no \
                 Secret or other reference, the built-in resource caps); \
                 write `policy.rules` to restrict them",
                self.origin
            ));
        }
        if self.rules.is_empty() {
            return Some(format!(
                "no `policy.rules` in {}: every measurement is refused (the policy denies by \
                 default); add rules such as `policy: {{rules: [{{projects: [team-a], \
                 destinations: [\"prod-*\"], namespaces: [verification]}}]}}`, or \
                 `policy: {{allowAll: true}}`",
                self.origin
            ));
        }
        None
    }

    /// One warning per rule that allows every namespace (a `namespaces` glob of `*` alone,
    /// which must be written out: a rule without `namespaces` is a config error): logged at
    /// start and printed by `doctor`.
    pub fn namespace_warnings(&self) -> Vec<String> {
        self.rules
            .iter()
            .enumerate()
            .filter(|(_, r)| r.namespaces.iter().any(|g| is_match_all(g)))
            .map(|(i, r)| {
                format!(
                    "policy.rules[{i}] in {} allows every namespace (`namespaces: [\"*\"]`): \
                     projects [{}] may place Jobs in any namespace of destinations [{}], \
                     kube-system, argocd and other tenants' namespaces included; name the \
                     namespaces its Jobs need (`namespaces: [verification]`)",
                    self.origin,
                    r.projects.join(", "),
                    r.destinations.join(", ")
                )
            })
            .collect()
    }

    /// Whether `project` may run a Job on `destination` in `namespace`.
    pub fn check(&self, project: &str, destination: &str, namespace: &str) -> Result<(), Denied> {
        self.check_grant(Grant::Placement, project, destination, namespace)
    }

    /// Whether `project` may read (and, with `applicationSync`, sync) the Argo CD Applications
    /// of `namespace` on `destination`: a rule's `applicationNamespaces`, not its `namespaces`.
    pub fn check_application(
        &self,
        project: &str,
        destination: &str,
        namespace: &str,
    ) -> Result<(), Denied> {
        self.check_grant(Grant::Application, project, destination, namespace)
    }

    fn check_grant(
        &self,
        grant: Grant,
        project: &str,
        destination: &str,
        namespace: &str,
    ) -> Result<(), Denied> {
        if self.allow_all {
            return Ok(());
        }
        let for_project: Vec<&PolicyRule> = self
            .rules
            .iter()
            .filter(|r| r.projects.iter().any(|g| glob_match(g, project)))
            .collect();
        let for_destination: Vec<&PolicyRule> = for_project
            .iter()
            .copied()
            .filter(|r| r.destinations.iter().any(|g| glob_match(g, destination)))
            .collect();
        if for_destination
            .iter()
            .any(|r| grant.list(r).iter().any(|g| glob_match(g, namespace)))
        {
            return Ok(());
        }
        let why = if self.rules.is_empty() {
            DENY_BY_DEFAULT.to_string()
        } else if for_project.is_empty() {
            "no rule lists this project".to_string()
        } else if for_destination.is_empty() {
            let allowed: Vec<&str> = for_project
                .iter()
                .flat_map(|r| r.destinations.iter().map(String::as_str))
                .collect();
            format!(
                "the rules for this project allow destinations {}",
                allowed.join(", ")
            )
        } else {
            let allowed: Vec<&str> = for_destination
                .iter()
                .flat_map(|r| grant.list(r).iter().map(String::as_str))
                .collect();
            match (grant, allowed.is_empty()) {
                (Grant::Application, true) => "the rules for this project and destination \
                    list no `applicationNamespaces` (none by default: a rule's `namespaces` are \
                    for Jobs only)"
                    .to_string(),
                (Grant::Application, false) => format!(
                    "the rules for this project and destination allow Application namespaces {}",
                    allowed.join(", ")
                ),
                (Grant::Placement, _) => format!(
                    "the rules for this project and destination allow namespaces {}",
                    allowed.join(", ")
                ),
            }
        };
        Err(Denied {
            project: project.to_string(),
            destination: destination.to_string(),
            namespace: namespace.to_string(),
            why: why.into_boxed_str(),
            origin: self.origin.clone(),
            grant,
        })
    }

    /// The pod security profile of the Jobs `project` runs on `destination` in `namespace`: the
    /// rules that allow the placement combined (most permissive level, the union of their
    /// service accounts, tokens if any allows them). `allowAll`, and a placement no rule allows
    /// (which [`Policy::check`] refuses anyway), get the defaults.
    pub fn profile(&self, project: &str, destination: &str, namespace: &str) -> Profile {
        let matching: Vec<(usize, &PolicyRule)> = self
            .rules
            .iter()
            .enumerate()
            .filter(|(_, r)| {
                r.projects.iter().any(|g| glob_match(g, project))
                    && r.destinations.iter().any(|g| glob_match(g, destination))
                    && r.namespaces.iter().any(|g| glob_match(g, namespace))
            })
            .collect();
        if matching.is_empty() {
            return Profile::restricted(Origin::AllowAll(self.origin.clone()));
        }
        let names: Vec<String> = matching
            .iter()
            .map(|(i, _)| format!("policy.rules[{i}]"))
            .collect();
        let mut profile = Profile {
            level: Level::Restricted,
            service_accounts: Vec::new(),
            automount_service_account_token: false,
            origin: Origin::Rules(format!("{} in {}", names.join(", "), self.origin)),
            // The first rule's, widened by the others': a rule's lower cap holds when it is
            // the only one that matches.
            allow: matching[0].1.allow.clone(),
            // A user id does not widen: the first matching rule's.
            default_user: matching[0].1.default_user,
        };
        for (_, r) in matching {
            profile.allow.widen(&r.allow);
            profile.level = profile.level.max(r.pod_security);
            profile.automount_service_account_token |= r.automount_service_account_token;
            for a in &r.service_accounts {
                if !profile.service_accounts.contains(a) {
                    profile.service_accounts.push(a.clone());
                }
            }
        }
        profile
    }
}

/// Whether glob `g` matches every name (`*`, `**` …).
fn is_match_all(g: &str) -> bool {
    !g.is_empty() && g.chars().all(|c| c == '*')
}

/// The globs of the rules (`*`, `?`), shared with the pod security allowlists: see [`crate::glob`].
pub use crate::glob::glob_match;

#[cfg(test)]
mod tests;
