//! Go's `time.ParseDuration` syntax (`300ms`, `1.5h`, `2h45m`), as Argo Rollouts and Kargo write
//! durations: the plugin block's `activeDeadline`, the plugin's flags and the server's config.

use std::time::Duration;

/// A string that is not a Go duration; the message says which part is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// nothing to parse
    #[error("empty duration")]
    Empty,
    /// a leading `-`
    #[error("negative durations are not allowed")]
    Negative,
    /// a unit or garbage where a number belongs
    #[error("expected a number at {0:?}")]
    ExpectedNumber(String),
    /// digits and dots that do not form a number
    #[error("bad number {0:?}")]
    BadNumber(String),
    /// a number without its unit
    #[error("missing unit (ns, us, ms, s, m, h)")]
    MissingUnit,
    /// a unit Go does not know (`d`, `w`, …)
    #[error("unknown unit {0:?}")]
    UnknownUnit(String),
    /// too large for a [`Duration`]
    #[error("out of range: {0}")]
    OutOfRange(#[from] std::time::TryFromFloatSecsError),
}

/// `d` in the syntax [`parse_go_duration`] reads, whole seconds only and without zero parts:
/// `720h`, `1h30m`, `45s`, `0s` (what a message shows next to a config key to set).
pub fn format_go_duration(d: Duration) -> String {
    let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let (h, m, s) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    for (n, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    if out.is_empty() {
        out.push_str("0s");
    }
    out
}

/// Parses Go's `time.ParseDuration` syntax: `300ms`, `1.5h`, `2h45m`.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(DurationError::Empty);
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.starts_with('-') {
        return Err(DurationError::Negative);
    }
    rest = rest.strip_prefix('+').unwrap_or(rest);
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .bytes()
            .take_while(|b| b.is_ascii_digit() || *b == b'.')
            .count();
        if num_len == 0 {
            return Err(DurationError::ExpectedNumber(rest.to_string()));
        }
        let n: f64 = rest[..num_len]
            .parse()
            .map_err(|_| DurationError::BadNumber(rest[..num_len].to_string()))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .bytes()
            .take_while(|b| !b.is_ascii_digit() && *b != b'.')
            .count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(DurationError::MissingUnit),
            u => return Err(DurationError::UnknownUnit(u.to_string())),
        };
        total += n * scale;
    }
    Ok(Duration::try_from_secs_f64(total)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_durations_parse_back() {
        for (d, text) in [
            (0, "0s"),
            (45, "45s"),
            (5400, "1h30m"),
            (21600, "6h"),
            (2_592_000, "720h"),
            (3661, "1h1m1s"),
        ] {
            let d = Duration::from_secs(d);
            assert_eq!(format_go_duration(d), text);
            assert_eq!(parse_go_duration(text).unwrap(), d);
        }
        assert_eq!(format_go_duration(Duration::from_millis(1500)), "2s");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse_go_duration("10"), Err(DurationError::MissingUnit));
        assert_eq!(parse_go_duration("-1s"), Err(DurationError::Negative));
        assert_eq!(
            parse_go_duration("1d"),
            Err(DurationError::UnknownUnit("d".into()))
        );
    }
}
