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

impl Policy {
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
            "there are no `policy.rules`, and the policy denies by default (`policy: {allowAll: \
             true}` would allow every project everywhere)"
                .to_string()
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
mod tests {
    use super::*;

    fn rule(p: &[&str], d: &[&str], n: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            projects: v(p),
            destinations: v(d),
            namespaces: v(n),
            application_namespaces: Vec::new(),
            pod_security: Level::Restricted,
            service_accounts: crate::podsecurity::default_service_accounts(),
            automount_service_account_token: false,
            allow: Default::default(),
        }
    }

    fn rules(rules: Vec<PolicyRule>) -> PolicyConfig {
        PolicyConfig {
            rules,
            ..PolicyConfig::default()
        }
    }

    #[test]
    fn rules_allow_and_deny_with_reasons() {
        let cfg = rules(vec![
            rule(&["team-a"], &["prod-*"], &["verification"]),
            rule(&["team-*"], &["dev"], &["*"]),
        ]);
        let p = Policy::new(Some(&cfg), "config file /etc/rd.yaml");
        assert!(p.warning().is_none());
        assert!(p.check("team-a", "prod-eu", "verification").is_ok());
        assert!(p.check("team-b", "dev", "anything").is_ok());

        let e = p.check("other", "dev", "x").unwrap_err().to_string();
        assert!(
            e.contains("project \"other\"") && e.contains("no rule lists this project"),
            "{e}"
        );
        assert!(
            e.contains("`policy.rules` in config file /etc/rd.yaml"),
            "{e}"
        );

        let e = p
            .check("team-b", "prod-eu", "verification")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("destination \"prod-eu\"") && e.contains("allow destinations dev"),
            "{e}"
        );

        let e = p
            .check("team-a", "prod-eu", "default")
            .unwrap_err()
            .to_string();
        assert!(e.contains("allow namespaces verification"), "{e}");
    }

    #[test]
    fn no_policy_denies_everything_and_names_the_config_to_add() {
        for p in [
            Policy::new(None, "embedded default configuration"),
            // An empty policy is no policy (docs/architecture.md, `policy.rs`).
            Policy::new(
                Some(&PolicyConfig::default()),
                "embedded default configuration",
            ),
        ] {
            let e = p.check("x", "y", "z").unwrap_err();
            let text = e.to_string();
            assert!(
                e.why.contains("denies by default") && text.contains("policy: {allowAll: true}"),
                "{text}"
            );
            assert!(
                text.contains("add a rule to `policy.rules` in embedded default configuration"),
                "{text}"
            );
            let w = p.warning().unwrap();
            assert!(
                w.contains("every measurement is refused") && w.contains("allowAll"),
                "{w}"
            );
        }
    }

    #[test]
    fn a_rule_for_every_namespace_is_warned_about_by_its_index() {
        let cfg = rules(vec![
            rule(&["team-a"], &["prod-*"], &["verification", "team-*"]),
            rule(&["team-b"], &["edge"], &["*"]),
            rule(&["team-c"], &["edge"], &["web", "**"]),
        ]);
        let w = Policy::new(Some(&cfg), "config file f.yaml").namespace_warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("policy.rules[1] in config file f.yaml allows every namespace")
                && w[0].contains("projects [team-b]")
                && w[0].contains("destinations [edge]")
                && w[0].contains("`namespaces: [verification]`"),
            "{}",
            w[0]
        );
        assert!(w[1].starts_with("policy.rules[2] "), "{}", w[1]);
        assert!(Policy::allow_all("f").namespace_warnings().is_empty());
    }

    #[test]
    fn allow_all_is_an_explicit_opt_in_with_a_warning() {
        let cfg = PolicyConfig {
            allow_all: true,
            ..PolicyConfig::default()
        };
        for p in [Policy::new(Some(&cfg), "f"), Policy::allow_all("f")] {
            assert!(p.check("x", "y", "z").is_ok());
            assert!(p.warning().unwrap().contains("every project may run Jobs"));
            let profile = p.profile("x", "y", "z");
            assert_eq!(profile, Profile::restricted(Origin::AllowAll("f".into())));
        }
    }

    #[test]
    fn the_most_permissive_matching_rule_sets_the_pod_security() {
        let with = |level, sas: &[&str], token, r: PolicyRule| PolicyRule {
            pod_security: level,
            service_accounts: sas.iter().map(|s| s.to_string()).collect(),
            automount_service_account_token: token,
            ..r
        };
        let p = Policy::new(
            Some(&rules(vec![
                rule(&["team-a"], &["*"], &["*"]),
                with(
                    Level::Baseline,
                    &["ci"],
                    false,
                    rule(&["team-*"], &["prod-*"], &["*"]),
                ),
                with(
                    Level::Privileged,
                    &["node-debug"],
                    true,
                    rule(&["team-a"], &["lab"], &["debug"]),
                ),
            ])),
            "f",
        );
        let prod = p.profile("team-a", "prod-eu", "verification");
        assert_eq!(prod.level, Level::Baseline);
        assert_eq!(prod.service_accounts, vec!["default", "ci"]);
        assert!(!prod.automount_service_account_token);
        assert_eq!(
            prod.origin,
            Origin::Rules("policy.rules[0], policy.rules[1] in f".into())
        );
        let lab = p.profile("team-a", "lab", "debug");
        assert_eq!(
            (lab.level, lab.automount_service_account_token),
            (Level::Privileged, true)
        );
        // Another namespace of the lab: only rule 0 matches.
        let plain = p.profile("team-a", "lab", "verification");
        assert_eq!(plain.level, Level::Restricted);
        assert_eq!(plain.origin, Origin::Rules("policy.rules[0] in f".into()));
        // team-b gets rule 1's level on prod only, and nothing elsewhere (check refuses it).
        assert_eq!(p.profile("team-b", "prod-us", "x").level, Level::Baseline);
        assert!(p.check("team-b", "lab", "debug").is_err());
    }

    /// The policy of the bypass tests: team-a may verify on the prod destinations, in one namespace.
    fn strict() -> Policy {
        let cfg = rules(vec![
            rule(&["team-a"], &["prod-*"], &["verification"]),
            rule(&["team-a"], &["staging"], &["team-a-*"]),
            rule(&["team-b*"], &["dev"], &["*"]),
        ]);
        Policy::new(Some(&cfg), "f")
    }

    #[test]
    fn a_namespace_outside_the_allowed_set_is_denied() {
        let p = strict();
        assert!(p.check("team-a", "prod-eu", "verification").is_ok());
        for ns in [
            "default",
            "kube-system",
            "verification-2",
            "verificatio",
            "Verification",
            "verification ",
            " verification",
            "verification\n",
            "",
            "*",
            "verif*",
            "verification,default",
            "verification/../kube-system",
            "../verification",
        ] {
            let e = p.check("team-a", "prod-eu", ns).unwrap_err();
            assert!(
                e.why.contains("allow namespaces verification"),
                "{ns:?}: {e}"
            );
        }
        // A namespace glob allows its prefix's namespaces only.
        assert!(p.check("team-a", "staging", "team-a-checks").is_ok());
        for ns in ["team-a", "team-ab-checks", "team-b-checks", "kube-system"] {
            assert!(p.check("team-a", "staging", ns).is_err(), "{ns:?}");
        }
    }

    #[test]
    fn rules_do_not_combine_across_each_other() {
        // Rule 1 gives prod-* with `verification`, rule 2 gives staging with team-a-*: neither
        // gives prod-eu with team-a-checks.
        let p = strict();
        let e = p.check("team-a", "prod-eu", "team-a-checks").unwrap_err();
        assert!(e.why.contains("allow namespaces verification"), "{e}");
        assert!(p.check("team-a", "staging", "verification").is_err());
        // Nor does team-b's `*` namespace leak to team-a's destinations.
        assert!(p.check("team-b", "prod-eu", "verification").is_err());
    }

    #[test]
    fn destination_globs_are_not_fooled() {
        let p = strict();
        for ok in ["prod-eu", "prod-us-east-1", "prod-"] {
            assert!(p.check("team-a", ok, "verification").is_ok(), "{ok:?}");
        }
        for bad in [
            "prod",            // `prod-*` needs the dash
            "production",      // … and the dash right after `prod`
            "xprod-eu",        // anchored at the start
            " prod-eu",        // no trimming
            "Prod-eu",         // case matters
            "PROD-EU",         //
            "prоd-eu",         // Cyrillic о
            "ｐrod-eu",        // fullwidth p
            "prod\u{2010}eu",  // Unicode hyphen
            "prod\u{200b}-eu", // zero-width space
            "",                // empty
            "../prod-eu",      // path tricks
            "staging,prod-eu", // a list is one (unknown) name here
            "dev",             // team-b's destination
        ] {
            let e = p.check("team-a", bad, "verification").unwrap_err();
            assert!(e.why.contains("allow destinations"), "{bad:?}: {e}");
        }
        // A comma-separated string is one name to the policy: allowing `prod-eu` exactly does
        // not allow `prod-eu,evil` (the plugin block's lists are split and checked per name
        // before the policy sees them).
        let exact = Policy::new(
            Some(&rules(vec![rule(&["team-a"], &["prod-eu"], &["*"])])),
            "f",
        );
        assert!(exact.check("team-a", "prod-eu", "x").is_ok());
        for bad in [
            "prod-eu,evil",
            "evil,prod-eu",
            "prod-eu evil",
            "prod-eu/evil",
            "prod-eu\0",
        ] {
            assert!(exact.check("team-a", bad, "x").is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wildcards_in_a_requested_name_are_literal() {
        // Only the rule's pattern is a glob: a requested `*` or `?` is a character like any other.
        let exact = Policy::new(
            Some(&rules(vec![rule(
                &["team-a"],
                &["prod-eu"],
                &["verification"],
            )])),
            "f",
        );
        for (d, ns) in [
            ("*", "verification"),
            ("prod-*", "verification"),
            ("prod-e?", "verification"),
            ("?????-eu", "verification"),
            ("prod-eu", "*"),
            ("prod-eu", "verif*"),
            ("prod-eu", "????????????"),
        ] {
            assert!(exact.check("team-a", d, ns).is_err(), "{d:?} {ns:?}");
        }
        for project in ["*", "team-?", "team-*"] {
            assert!(
                exact.check(project, "prod-eu", "verification").is_err(),
                "{project:?}"
            );
        }
        for (pattern, text) in [("abc", "*"), ("abc", "a*"), ("abc", "???"), ("a?c", "a*")] {
            assert!(!glob_match(pattern, text), "{pattern} vs {text}");
        }
        // A `*` in the name is still matched by a `*` in the rule, as any character is.
        assert!(glob_match("prod-*", "prod-*"));
    }

    #[test]
    fn project_globs_match_exactly_what_they_say() {
        let cfg = rules(vec![
            rule(&["team-a"], &["a-dest"], &["*"]),
            rule(&["team-a*"], &["a-star-dest"], &["*"]),
            rule(&["team-a-*"], &["a-dash-dest"], &["*"]),
        ]);
        let p = Policy::new(Some(&cfg), "f");
        // `team-a` (exact) is team-a only.
        assert!(p.check("team-a", "a-dest", "ns").is_ok());
        for project in [
            "team-ab", "team-a-x", "team-", "team", "Team-a", "team-a ", "xteam-a",
        ] {
            assert!(p.check(project, "a-dest", "ns").is_err(), "{project:?}");
        }
        // `team-a*` is team-a and everything that starts with it (team-ab included: that is
        // what the glob says; `team-a-*` is the way to keep team-ab out).
        for project in ["team-a", "team-ab", "team-a-x"] {
            assert!(p.check(project, "a-star-dest", "ns").is_ok(), "{project:?}");
        }
        for project in ["team-", "team-b", "Team-a", "TEAM-AB", "xteam-a"] {
            assert!(
                p.check(project, "a-star-dest", "ns").is_err(),
                "{project:?}"
            );
        }
        // `team-a-*` is neither team-a nor team-ab.
        assert!(p.check("team-a-x", "a-dash-dest", "ns").is_ok());
        for project in ["team-a", "team-ab", "team-b-x"] {
            assert!(
                p.check(project, "a-dash-dest", "ns").is_err(),
                "{project:?}"
            );
        }
    }

    #[test]
    fn matching_is_case_sensitive_everywhere() {
        // Kubernetes names are lowercase; a rule never matches another spelling.
        let p = strict();
        assert!(p.check("Team-A", "prod-eu", "verification").is_err());
        assert!(p.check("team-a", "Prod-EU", "verification").is_err());
        assert!(p.check("team-a", "prod-eu", "VERIFICATION").is_err());
        assert!(!glob_match("Prod-*", "prod-eu"));
        assert!(!glob_match("prod-*", "PROD-EU"));
        // Case folding that changes length (ß → SS) does not sneak in either.
        assert!(!glob_match("strasse", "straße"));
    }

    #[test]
    fn denials_quote_hostile_names() {
        // Names go into logs and API errors quoted and escaped: no forged log lines.
        let e = strict()
            .check(
                "team-a\nlevel=info msg=allowed",
                "prod-eu\r\n",
                "x\u{1b}[2J",
            )
            .unwrap_err()
            .to_string();
        assert!(
            !e.contains('\n') && !e.contains('\r') && !e.contains('\u{1b}'),
            "{e}"
        );
        assert!(e.contains(r#""team-a\nlevel=info msg=allowed""#), "{e}");
    }
}
