//! How Kargo v1.11 fits a Stage name of any valid length (a DNS subdomain, up to 253
//! characters) into the names and label values of what it creates, so that a fixture with a
//! long Stage name produces the objects Kargo would, not ones the API server refuses.
//!
//! * a label value (at most 63): `kubernetes.ShortenLabelValue` (akuity/kargo v1.11.2
//!   pkg/kubernetes/naming.go:20-30) through `strings.HashShorten(value, 63, "-", 8)`
//!   (pkg/strings/strings.go:51-84): the leading characters, `-`, the first 8 hex digits of the
//!   SHA-256 of the whole value;
//! * an AnalysisRun's or Promotion's name prefix: the Stage name cut (no hash) to
//!   `253 - (1 + 26) - (1 + 7)` = 218 characters, so that `<prefix>.<ulid>.<7>` stays within an
//!   object name (pkg/rollouts/options.go:12-23,83-93; pkg/api/promotion.go:31-36,101-104).

/// Kubernetes' longest label value.
pub const MAX_LABEL_VALUE: usize = 63;

/// The longest Stage-name prefix of an AnalysisRun or Promotion name.
pub const MAX_NAME_PREFIX: usize = 253 - (1 + ULID_LEN) - (1 + SHORT_ID_LEN);

/// A ULID's length (`ulidLength`, pkg/rollouts/options.go:14).
const ULID_LEN: usize = 26;

/// The short form of a Freight name or freight collection id that ends a name
/// (`maxNameSuffixLength`, pkg/rollouts/options.go:18; `promotionShortHashLength`,
/// pkg/api/promotion.go:29).
pub const SHORT_ID_LEN: usize = 7;

/// Hex digits of the hash that ends a shortened label value (`shortHashLen`,
/// pkg/kubernetes/naming.go:6).
const SHORT_HASH_LEN: usize = 8;

/// `value` as Kargo writes it into a label: itself when it fits, else shortened with a hash.
pub fn label_value(value: &str) -> String {
    hash_shorten(value, MAX_LABEL_VALUE, "-", SHORT_HASH_LEN)
}

/// Stage `stage` as the prefix of an AnalysisRun's or Promotion's name.
pub fn name_prefix(stage: &str) -> &str {
    cut(stage, MAX_NAME_PREFIX)
}

/// The first [`SHORT_ID_LEN`] characters of a Freight name or freight collection id.
pub fn short_id(id: &str) -> &str {
    cut(id, SHORT_ID_LEN)
}

/// `strings.HashShorten` (pkg/strings/strings.go:51-84), for the arguments Kargo passes: `s`
/// when it fits in `max_len`, else as many leading characters as fit before `sep` and the first
/// `hash_len` hex digits of the SHA-256 of `s`, with no separator doubled.
fn hash_shorten(s: &str, max_len: usize, sep: &str, hash_len: usize) -> String {
    if s.len() <= max_len {
        return s.to_string();
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, s.as_bytes());
    let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    let hash = &hex[..hash_len];
    if max_len <= hash_len + sep.len() {
        return hash.to_string();
    }
    let prefix = cut(s, max_len - (hash_len + sep.len())).trim_end_matches(sep);
    format!("{prefix}{sep}{hash}")
}

/// The longest prefix of `s` of at most `len` bytes. Go slices bytes; Kubernetes names are
/// ASCII, where this is the same, and a test's odd name does not panic.
fn cut(s: &str, len: usize) -> &str {
    let mut end = len.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SHA-256 of `s` in hex, from coreutils: a check independent of `ring`.
    fn sha256sum(s: &str) -> String {
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("printf %s {s} | sha256sum")])
            .output()
            .expect("sh and sha256sum (coreutils)");
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn a_label_value_that_fits_is_kept_and_a_longer_one_ends_in_its_hash() {
        let fits = "s".repeat(63);
        assert_eq!(label_value(&fits), fits);
        let long = "s".repeat(64);
        let short = label_value(&long);
        assert_eq!(short.len(), 63);
        assert_eq!(
            short,
            format!("{}-{}", "s".repeat(54), &sha256sum(&long)[..8])
        );
    }

    #[test]
    fn a_separator_before_the_hash_is_not_doubled() {
        let long = format!("{}-{}", "a".repeat(53), "b".repeat(20));
        let short = label_value(&long);
        assert_eq!(
            short,
            format!("{}-{}", "a".repeat(53), &sha256sum(&long)[..8])
        );
    }

    #[test]
    fn a_name_prefix_is_cut_to_218() {
        assert_eq!(MAX_NAME_PREFIX, 218);
        assert_eq!(name_prefix(&"x".repeat(253)).len(), 218);
        assert_eq!(name_prefix("uat"), "uat");
        assert_eq!(short_id("9811bd09b0"), "9811bd0");
    }
}
