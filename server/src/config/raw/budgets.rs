//! The `budgets:` section: per-project budgets, each a count of at least 1 named by its key in
//! errors (`config::budgets`).

use serde::Deserialize;

use super::{invalid, InvalidField, Problem};
use crate::config::budgets::{self, BudgetsConfig};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawBudgets {
    measurement_calls_per_project: Option<usize>,
    application_calls_per_project: Option<usize>,
    log_streams_per_project: Option<usize>,
    log_requests_per_project: Option<usize>,
    pending_log_requests_per_destination: Option<usize>,
}

/// `budgets:`, each unset key its default.
pub(super) fn validate_budgets(raw: Option<RawBudgets>) -> Result<BudgetsConfig, InvalidField> {
    let mut out = BudgetsConfig::default();
    let Some(raw) = raw else {
        return Ok(out);
    };
    for (key, value, slot) in [
        (
            budgets::MEASUREMENT_CALLS_PER_PROJECT,
            raw.measurement_calls_per_project,
            &mut out.measurement_calls_per_project,
        ),
        (
            budgets::APPLICATION_CALLS_PER_PROJECT,
            raw.application_calls_per_project,
            &mut out.application_calls_per_project,
        ),
        (
            budgets::LOG_STREAMS_PER_PROJECT,
            raw.log_streams_per_project,
            &mut out.log_streams_per_project,
        ),
        (
            budgets::LOG_REQUESTS_PER_PROJECT,
            raw.log_requests_per_project,
            &mut out.log_requests_per_project,
        ),
        (
            budgets::PENDING_LOG_REQUESTS_PER_DESTINATION,
            raw.pending_log_requests_per_destination,
            &mut out.pending_log_requests_per_destination,
        ),
    ] {
        match value {
            None => {}
            // A budget of 0 would refuse the project everything: say so instead.
            Some(0) => return Err(invalid(key, Problem::Zero)),
            Some(n) => *slot = n,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::config::{BudgetsConfig, ServerConfig};

    fn parse(text: &str) -> Result<BudgetsConfig, String> {
        ServerConfig::parse(text, "config file t.yaml")
            .map(|c| c.budgets)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn unset_keys_are_their_defaults_and_set_ones_apply() {
        assert_eq!(parse("").unwrap(), BudgetsConfig::default());
        assert_eq!(parse("budgets: {}").unwrap(), BudgetsConfig::default());
        let b =
            parse("budgets: {measurementCallsPerProject: 4, pendingLogRequestsPerDestination: 2}")
                .unwrap();
        assert_eq!(
            (
                b.measurement_calls_per_project,
                b.pending_log_requests_per_destination
            ),
            (4, 2)
        );
        assert_eq!(
            b.log_streams_per_project,
            BudgetsConfig::default().log_streams_per_project
        );
    }

    #[test]
    fn zero_negative_and_unknown_keys_are_refused_naming_the_key() {
        let keys = [
            "measurementCallsPerProject",
            "applicationCallsPerProject",
            "logStreamsPerProject",
            "logRequestsPerProject",
            "pendingLogRequestsPerDestination",
        ];
        for key in keys {
            let zero = parse(&format!("budgets: {{{key}: 0}}")).unwrap_err();
            assert!(
                zero.contains(&format!("budgets.{key}: must be more than 0")),
                "{zero}"
            );
            let negative = parse(&format!("budgets: {{{key}: -1}}")).unwrap_err();
            assert!(negative.contains(key), "{negative}");
        }
        // A typo is refused, listing the keys there are.
        let typo = parse("budgets: {measurementsPerProject: 3}").unwrap_err();
        assert!(keys.iter().all(|k| typo.contains(k)), "{typo}");
    }
}
