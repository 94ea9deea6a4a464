//! Kubernetes resource quantities (`100m`, `128Mi`, `1.5`, `2e3`), read and compared: for the
//! resource caps of a profile (`podsecurity/resources.rs`), and by value in the Job mark's
//! digest (`job/mark.rs`), since the API server rewrites them in its canonical form (`0.5` comes
//! back as `500m`). A leaf module, so that `job` and `podsecurity` can both use it.
//!
//! The grammar is apimachinery's (`k8s.io/apimachinery/pkg/api/resource/quantity.go`, the
//! comment above `type Quantity`): a decimal number, then a binary suffix (`Ki` … `Ei`), a
//! decimal suffix (`n`, `u`, `m`, none, `k`, `M` … `E`) or a decimal exponent (`e3`, `E-2`).
//! Values are held in nano-units, as precise as Kubernetes itself (finer values round up, as
//! apimachinery rounds them). Negative quantities are refused: no request or limit is negative.
//! k8s-openapi's `Quantity` is only the string; this is the smallest parser the caps need, so
//! no crate comes in for it.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KubeQuantity;
use serde_json::Value;

/// A quantity as written, with its value: compared by value whatever the suffix (`1Gi` >
/// `1000Mi` > `1G`), shown as written.
#[derive(Debug, Clone)]
pub struct Quantity {
    text: KubeQuantity,
    nanos: u128,
}

/// A string that is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not a Kubernetes quantity ({why}); write e.g. 100m, 0.5, 2, 128Mi, 1Gi or 1G")]
pub struct BadQuantity {
    /// what was written
    pub text: String,
    /// what is wrong with it
    pub why: &'static str,
}

impl Quantity {
    /// The quantity as written (`128Mi`), as the Kubernetes type.
    pub fn kube(&self) -> &KubeQuantity {
        &self.text
    }

    /// The value in nano-units (`1` is 10^9), whatever the suffix.
    pub fn nanos(&self) -> u128 {
        self.nanos
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text.0
    }

    /// A quantity from a pod spec: a string, or a JSON number (YAML `cpu: 1`).
    pub fn from_json(v: &Value) -> Result<Self, BadQuantity> {
        match v {
            Value::String(s) => s.parse(),
            Value::Number(n) => n.to_string().parse(),
            other => Err(BadQuantity {
                text: other.to_string(),
                why: "not a string or a number",
            }),
        }
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Quantity {
    type Err = BadQuantity;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why| BadQuantity {
            text: text.to_string(),
            why,
        };
        let nanos = nanos(text).map_err(bad)?;
        Ok(Self {
            text: KubeQuantity(text.to_string()),
            nanos,
        })
    }
}

/// The value of `text` in nano-units, or why it is not a quantity.
fn nanos(text: &str) -> Result<u128, &'static str> {
    // Longer than any quantity a pod spec needs; also bounds the arithmetic below.
    if text.is_empty() || text.len() > 40 {
        return Err("empty or too long");
    }
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned.starts_with('-') {
        return Err("negative");
    }
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err("no number");
    }
    // The value is digits × 10^exp10 × 2^exp2, with the fraction's digits moved into `digits`.
    let digits: u128 = format!("{whole}{fraction}")
        .parse()
        .map_err(|_| "no number")?;
    let (mut exp10, exp2): (i32, u32) = match suffix {
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "" => (0, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let exp = exp.strip_prefix('+').unwrap_or(exp);
            let valid = !exp.is_empty()
                && exp
                    .strip_prefix('-')
                    .unwrap_or(exp)
                    .chars()
                    .all(|c| c.is_ascii_digit());
            (
                valid
                    .then(|| exp.parse::<i32>().ok())
                    .flatten()
                    .filter(|e| e.abs() <= 40)
                    .ok_or("bad exponent")?,
                0,
            )
        }
        _ => return Err("unknown suffix"),
    };
    exp10 += 9 - i32::try_from(fraction.len()).map_err(|_| "too long")?;
    let scaled = digits.checked_mul(1u128 << exp2).ok_or("too large")?;
    if exp10 >= 0 {
        10u128
            .checked_pow(exp10.unsigned_abs())
            .and_then(|p| scaled.checked_mul(p))
            .ok_or("too large")
    } else {
        // Finer than a nano-unit: round up, as apimachinery does.
        let divisor = 10u128
            .checked_pow(exp10.unsigned_abs())
            .unwrap_or(u128::MAX);
        Ok(scaled.div_ceil(divisor))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn suffixes_and_numbers_have_their_kubernetes_values() {
        for (text, nanos) in [
            ("1", 1_000_000_000u128),
            ("0.5", 500_000_000),
            (".5", 500_000_000),
            ("1.", 1_000_000_000),
            ("+2", 2_000_000_000),
            ("100m", 100_000_000),
            ("1500u", 1_500_000),
            ("3n", 3),
            ("1k", 1_000_000_000_000),
            ("1M", 1_000_000_000_000_000),
            ("1Ki", 1024 * 1_000_000_000),
            ("128Mi", 128 * (1 << 20) * 1_000_000_000),
            ("1.5Gi", 3 * (1 << 29) * 1_000_000_000),
            ("2e3", 2_000_000_000_000),
            ("2E-3", 2_000_000),
            ("1e-10", 1), // rounds up to one nano-unit
            ("1Ei", (1u128 << 60) * 1_000_000_000),
        ] {
            assert_eq!(q(text).nanos, nanos, "{text}");
        }
    }

    #[test]
    fn values_compare_whatever_the_suffix() {
        assert!(q("1Gi") > q("1G"));
        assert!(q("1000Mi") > q("1G"));
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1k"), q("1e3"));
        assert!(q("0.1") < q("101m"));
        assert_eq!(q("128Mi").to_string(), "128Mi");
        assert_eq!(
            Quantity::from_json(&serde_json::json!(2)).unwrap(),
            q("2000m")
        );
        assert_eq!(
            Quantity::from_json(&serde_json::json!(0.25)).unwrap(),
            q("250m")
        );
    }

    #[test]
    fn what_is_not_a_quantity_is_refused() {
        for text in [
            "", "-1", "1Kb", "1 Gi", "Gi", ".", "1..2", "1.2.3", "1e", "1e+", "1e99", "0x10",
            "1mi", "1Ki2", "١", "1e-", "1e--2",
        ] {
            assert!(text.parse::<Quantity>().is_err(), "{text:?}");
        }
        assert!(format!("9{}", "9".repeat(40)).parse::<Quantity>().is_err());
        assert!("99999999999999999999Ei".parse::<Quantity>().is_err());
        let e = "lots".parse::<Quantity>().unwrap_err().to_string();
        assert!(e.contains("\"lots\"") && e.contains("128Mi"), "{e}");
        assert!(Quantity::from_json(&serde_json::json!(true)).is_err());
    }
}
