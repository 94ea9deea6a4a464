//! Secret values out of every text we show: one [`Redactor`] for the plugin's messages and the
//! server's log tails, so both hide the same things the same way.

/// What a secret value is replaced with.
pub const REDACTED: &str = "*****";

/// Replaces the values of a run's secret args wherever they appear.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} values)", self.secrets.len())
    }
}

impl Redactor {
    /// A redactor for `values` (empty values are ignored).
    pub fn new<I, S>(values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut secrets: Vec<String> = values
            .into_iter()
            .map(Into::into)
            .filter(|s| !s.is_empty())
            .collect();
        // Longest first, so that a secret containing another is replaced whole.
        secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Self { secrets }
    }

    /// This redactor plus `values` (a log tail's Secret values on top of the run's secrets).
    #[must_use]
    pub fn with<I, S>(&self, values: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::new(
            self.secrets
                .iter()
                .cloned()
                .chain(values.into_iter().map(Into::into)),
        )
    }

    /// `text` with every secret value replaced by [`REDACTED`].
    pub fn redact(&self, text: &str) -> String {
        let mut out = text.to_string();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_containing_another_is_hidden_whole_whatever_the_input_order() {
        for values in [["abc", "abcdef"], ["abcdef", "abc"]] {
            let r = Redactor::new(values);
            assert_eq!(r.redact("x=abcdef y=abc"), "x=***** y=*****");
        }
        assert_eq!(Redactor::new([""]).redact("keep"), "keep");
    }

    #[test]
    fn with_adds_values_longest_first() {
        let r = Redactor::new(["abc"]).with(["abcdef", ""]);
        assert_eq!(r.redact("x=abcdef y=abc"), "x=***** y=*****");
        assert_eq!(format!("{r:?}"), "Redactor(2 values)");
    }
}
