//! Kubernetes name checks, each written once: DNS-1123 labels and subdomains, label keys and
//! values.
//!
//! Every crate checks names before they reach an API server, a path or a page (the plugin block,
//! the routes, the config file, the Job builder); they all ask here, so that a namespace is the
//! same thing everywhere. The checks are predicates: each caller words its own error, naming
//! its field. Where a caller is deliberately looser or stricter than Kubernetes, the function
//! says so.

/// The longest DNS-1123 label, label value or name part: 63 bytes.
pub const MAX_LABEL: usize = 63;
/// The longest DNS-1123 subdomain: 253 bytes.
pub const MAX_SUBDOMAIN: usize = 253;
/// The longest label key [`is_loose_label_key`] accepts: a subdomain prefix, `/`, a name part.
pub const MAX_LABEL_KEY: usize = MAX_SUBDOMAIN + 1 + MAX_LABEL;

/// The characters of a DNS-1123 label or subdomain part: lowercase letters, digits and `-`.
fn is_dns_char(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// A DNS-1123 label (Kubernetes' `IsDNS1123Label`): what it accepts as a namespace name. 1 to
/// 63 lowercase letters, digits and `-`, starting and ending with a letter or digit.
pub fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_LABEL
        && s.bytes().all(is_dns_char)
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// A DNS-1123 subdomain (Kubernetes' `IsDNS1123Subdomain`): what it accepts as the name of a
/// Job and most other objects. At most 253 bytes of dot-separated parts, each non-empty, of
/// lowercase letters, digits and `-`, starting and ending with a letter or digit. As in
/// Kubernetes, a part may be longer than 63 bytes (see [`is_dns_labels`]).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_SUBDOMAIN
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(is_dns_char)
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Dot-separated DNS-1123 labels, at most 253 bytes: a DNS-1123 subdomain whose every part is
/// also a label of at most 63 bytes (a host name's rule). What the plugin block, the
/// Application routes and the log API accept as an object name: never looser than
/// [`is_dns_subdomain`], so nothing it accepts is refused by Kubernetes for its name.
pub fn is_dns_labels(s: &str) -> bool {
    s.len() <= MAX_SUBDOMAIN && s.split('.').all(is_dns_label)
}

/// A label value as Kubernetes accepts it (`IsValidLabelValue`), but not empty: 1 to 63 letters,
/// digits, `-`, `_` and `.`, starting and ending with a letter or digit. Kubernetes allows an
/// empty value; each caller says what empty means for it.
pub fn is_label_value(s: &str) -> bool {
    !s.is_empty()
        && has_label_value_chars(s)
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

/// At most 63 letters, digits, `-`, `_` and `.` (empty included): a label value's length and
/// characters without the rule on its ends. What a `destinationSelector` accepts as a value;
/// looser than [`is_label_value`], which the apiserver applies to the labels themselves.
pub fn has_label_value_chars(s: &str) -> bool {
    s.len() <= MAX_LABEL
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A label key, loosely: 1 to 317 letters, digits, `-`, `_`, `.` and `/`. Kubernetes' full rule
/// (`IsQualifiedName`: at most one `/`, a subdomain before it, a name part of at most 63 starting
/// and ending with a letter or digit) is left to the apiserver; this only keeps out what could
/// never be a key (white space, `=`, `,`, non-ASCII).
pub fn is_loose_label_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= MAX_LABEL_KEY
        && k.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_are_namespace_names() {
        for good in ["a", "kargo-demo", "0", "a-1"] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "a/b", "ä"] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        assert!(is_dns_label(&"x".repeat(63)) && !is_dns_label(&"x".repeat(64)));
    }

    #[test]
    fn dns_subdomains_are_kubernetes_object_names() {
        assert!(is_dns_subdomain("uat.01j.abc-1"));
        for bad in ["", "..", "a/b", "A", "a%2Fb", "-a", "a..b", "<x>", "a."] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(is_dns_subdomain(&"x".repeat(253)));
        assert!(!is_dns_subdomain(&"x".repeat(254)));
    }

    #[test]
    fn dns_labels_joined_by_dots_also_bound_each_part() {
        assert!(is_dns_labels("uat.01j.abc-1") && is_dns_labels(&"x".repeat(63)));
        // Kubernetes accepts a 64-byte part in a subdomain; a host name does not.
        let long_part = "x".repeat(64);
        assert!(is_dns_subdomain(&long_part) && !is_dns_labels(&long_part));
        let too_long = format!("{}xx", "x.".repeat(126));
        for bad in ["", "..", "a/b", "A", "-a", "a..b", "a.", &too_long] {
            assert!(!is_dns_labels(bad), "{bad}");
        }
    }

    #[test]
    fn label_values_start_and_end_alphanumeric() {
        for good in ["prod-eu", "a", "A.b_c-1"] {
            assert!(is_label_value(good), "{good}");
        }
        for bad in ["", "-a", "a-", "_a", "a.", "a b", "a/b", "a:b"] {
            assert!(!is_label_value(bad), "{bad}");
        }
        assert!(is_label_value(&"x".repeat(63)) && !is_label_value(&"x".repeat(64)));
        // The selector's values: the characters and length only.
        for loose in ["", "-a", "a."] {
            assert!(has_label_value_chars(loose), "{loose}");
        }
        for bad in ["a b", "a,b", "a=b"] {
            assert!(!has_label_value_chars(bad), "{bad}");
        }
        assert!(has_label_value_chars(&"x".repeat(63)) && !has_label_value_chars(&"x".repeat(64)));
    }

    #[test]
    fn loose_label_keys_keep_out_what_is_never_a_key() {
        for good in ["env", "app.kubernetes.io/name", "a//b"] {
            assert!(is_loose_label_key(good), "{good}");
        }
        for bad in ["", "bad key", "a=b", "a,b", "ä"] {
            assert!(!is_loose_label_key(bad), "{bad}");
        }
        let (longest, too_long) = ("x".repeat(MAX_LABEL_KEY), "x".repeat(MAX_LABEL_KEY + 1));
        assert!(is_loose_label_key(&longest) && !is_loose_label_key(&too_long));
    }
}
