//! The two grants of a policy rule: `namespaces`, where a project places Jobs (and observes
//! Rollouts), and `applicationNamespaces`, where it reads and syncs Argo CD Applications. Kept
//! apart so that allowing one never allows the other (issue #27: `argocd` granted for syncs
//! also let a tenant place Jobs there).

use crate::config::PolicyRule;

/// Which namespace list of a rule a check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grant {
    /// `namespaces`: where Jobs run (and `rollout:` checks look)
    Placement,
    /// `applicationNamespaces`: where Argo CD Applications may be read and synced
    Application,
}

impl Grant {
    pub(super) fn list(self, rule: &PolicyRule) -> &[String] {
        match self {
            Self::Placement => &rule.namespaces,
            Self::Application => &rule.application_namespaces,
        }
    }

    /// The rule key: `namespaces` or `applicationNamespaces`.
    pub fn key(self) -> &'static str {
        match self {
            Self::Placement => "namespaces",
            Self::Application => "applicationNamespaces",
        }
    }

    /// What the namespace is, in a denial.
    pub fn kind(self) -> &'static str {
        match self {
            Self::Placement => "namespace",
            Self::Application => "Application namespace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Policy;
    use crate::config::{PolicyConfig, PolicyRule};
    use crate::podsecurity::Level;

    fn rule(namespaces: &[&str], applications: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            projects: v(&["team-a"]),
            destinations: v(&["prod-*"]),
            namespaces: v(namespaces),
            application_namespaces: v(applications),
            pod_security: Level::Restricted,
            service_accounts: crate::podsecurity::default_service_accounts(),
            automount_service_account_token: false,
            allow: Default::default(),
            default_user: Default::default(),
        }
    }

    fn policy(rules: Vec<PolicyRule>) -> Policy {
        let cfg = PolicyConfig {
            rules,
            ..PolicyConfig::default()
        };
        Policy::new(Some(&cfg), "f")
    }

    #[test]
    fn placement_and_application_namespaces_are_separate_grants() {
        let p = policy(vec![rule(&["verification"], &["argocd"])]);
        assert!(p.check("team-a", "prod-eu", "verification").is_ok());
        assert!(p.check_application("team-a", "prod-eu", "argocd").is_ok());
        // Neither list allows the other's use.
        let e = p.check("team-a", "prod-eu", "argocd").unwrap_err();
        assert_eq!(e.grant.key(), "namespaces");
        assert!(e.why.contains("allow namespaces verification"), "{e}");
        let e = p
            .check_application("team-a", "prod-eu", "verification")
            .unwrap_err();
        assert_eq!(e.grant.key(), "applicationNamespaces");
        let text = e.to_string();
        assert!(
            text.contains("allow Application namespaces argocd")
                && text.contains("applicationNamespaces [\"verification\"]"),
            "{text}"
        );
        // The rest of the rule still applies.
        assert!(p.check_application("team-b", "prod-eu", "argocd").is_err());
        assert!(p.check_application("team-a", "dev", "argocd").is_err());
    }

    #[test]
    fn a_rule_without_application_namespaces_allows_no_application() {
        // `namespaces: ["*"]` is for Jobs: it does not open every Application namespace.
        let p = policy(vec![rule(&["*"], &[])]);
        assert!(p.check("team-a", "prod-eu", "argocd").is_ok());
        let e = p
            .check_application("team-a", "prod-eu", "argocd")
            .unwrap_err();
        assert!(
            e.why.contains("no `applicationNamespaces`") && e.why.contains("none by default"),
            "{e}"
        );
        // allowAll is still everything (its warning says so).
        assert!(Policy::allow_all("f")
            .check_application("x", "y", "argocd")
            .is_ok());
    }
}
