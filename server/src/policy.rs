//! Policy: which Kargo projects (AnalysisRun namespaces) may run Jobs on which destinations and
//! namespaces (`ARCHITECTURE.md` §7).
//!
//! Rules are globs (`*`, `?`); any matching rule allows. Without a `policy` block (or with no rules)
//! everything is allowed and [`Policy::warning`] says so once at start. A denial names the project, the
//! destination, the namespace and the config key to change.

use crate::config::{PolicyConfig, PolicyRule};

/// The policy in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    rules: Option<Vec<PolicyRule>>,
    origin: String,
}

/// A request the policy does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "policy denies project {project:?} the destination {destination:?} (namespace {namespace:?}): {why}; \
     to allow it, add a rule to `policy.rules` in {origin} with projects [{project:?}], destinations \
     [{destination:?}] and namespaces [{namespace:?}]"
)]
pub struct Denied {
    /// the Kargo project (AnalysisRun namespace)
    pub project: String,
    /// the destination
    pub destination: String,
    /// the namespace on the destination
    pub namespace: String,
    /// which part did not match
    pub why: String,
    /// the config file
    pub origin: String,
}

impl Policy {
    /// No policy: everything is allowed.
    pub fn allow_all(origin: &str) -> Self {
        Self {
            rules: None,
            origin: origin.to_string(),
        }
    }

    /// The policy of a config file; none, or one without rules, allows all.
    pub fn new(config: Option<&PolicyConfig>, origin: &str) -> Self {
        Self {
            rules: config.map(|c| c.rules.clone()).filter(|r| !r.is_empty()),
            origin: origin.to_string(),
        }
    }

    /// The warning to log at start when nothing is restricted.
    pub fn warning(&self) -> Option<String> {
        match &self.rules {
            None => Some(format!(
                "no policy in {}: every project may run Jobs on every destination and namespace; \
                 add `policy.rules` to restrict them",
                self.origin
            )),
            Some(_) => None,
        }
    }

    /// Whether `project` may run a Job on `destination` in `namespace`.
    pub fn check(&self, project: &str, destination: &str, namespace: &str) -> Result<(), Denied> {
        let Some(rules) = &self.rules else {
            return Ok(());
        };
        let for_project: Vec<&PolicyRule> = rules
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
            .any(|r| r.namespaces.iter().any(|g| glob_match(g, namespace)))
        {
            return Ok(());
        }
        let why = if for_project.is_empty() {
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
                .flat_map(|r| r.namespaces.iter().map(String::as_str))
                .collect();
            format!(
                "the rules for this project and destination allow namespaces {}",
                allowed.join(", ")
            )
        };
        Err(Denied {
            project: project.to_string(),
            destination: destination.to_string(),
            namespace: namespace.to_string(),
            why,
            origin: self.origin.clone(),
        })
    }
}

/// Glob match: `*` is any run of characters, `?` one character, everything else literal.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(p: &[&str], d: &[&str], n: &[&str]) -> PolicyRule {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect();
        PolicyRule {
            projects: v(p),
            destinations: v(d),
            namespaces: v(n),
        }
    }

    #[test]
    fn globs() {
        for (p, t, m) in [
            ("*", "", true),
            ("team-*", "team-a", true),
            ("team-*", "team", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*-prod-*", "eu-prod-1", true),
            ("prod", "prod-eu", false),
            ("**x", "abx", true),
        ] {
            assert_eq!(glob_match(p, t), m, "{p} vs {t}");
        }
    }

    #[test]
    fn rules_allow_and_deny_with_reasons() {
        let cfg = PolicyConfig {
            rules: vec![
                rule(&["team-a"], &["prod-*"], &["verification"]),
                rule(&["team-*"], &["dev"], &["*"]),
            ],
        };
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
    fn no_policy_allows_all_with_a_warning() {
        let p = Policy::new(None, "embedded default configuration");
        assert!(p.check("x", "y", "z").is_ok());
        assert!(p.warning().unwrap().contains("every project"));
        // An empty policy is no policy (ARCHITECTURE.md §7).
        let p = Policy::new(Some(&PolicyConfig::default()), "f");
        assert!(p.check("x", "y", "z").is_ok() && p.warning().is_some());
    }
}
