//! Globs (`*`, `?`), the one pattern language of the configuration: the policy's projects,
//! destinations and namespaces, `policy.callers`, the agent's `--namespaces`, and the names and
//! label keys a pod security profile allows (`podsecurity`). A leaf, so that both `policy` and
//! `podsecurity` (which `policy` imports) can use it.

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
    fn globs_stay_fast_on_hostile_input() {
        // Backtracking is bounded: a pathological pattern against a long name answers at once.
        let pattern = "*a*a*a*a*a*a*a*a*a*a*b";
        let text = "a".repeat(10_000);
        let start = std::time::Instant::now();
        assert!(!glob_match(pattern, &text));
        assert!(start.elapsed() < std::time::Duration::from_secs(2));
    }
}
