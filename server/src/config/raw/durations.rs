//! The duration sections of the file, `engine:` and `jobs:`: Go durations, each checked against
//! its lower bound and named by its key in errors.

use std::time::Duration;

use dispatch_api::parse_go_duration;
use serde::Deserialize;

use super::{invalid, InvalidField, Problem};
use crate::config::{EngineSettings, JobsSettings};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawEngine {
    connect_timeout: Option<String>,
    request_timeout: Option<String>,
    cache_wait: Option<String>,
    log_timeout: Option<String>,
    measurement_deadline: Option<String>,
    deadline_grace: Option<String>,
    max_measurement_deadline: Option<String>,
    start_grace: Option<String>,
    scheduling_grace: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawJobs {
    ttl_after_finished: Option<String>,
    retention: Option<String>,
}

/// The lower bound of a section's durations.
#[derive(Clone, Copy)]
enum AtLeast {
    /// anything, zero too
    Zero,
    /// more than zero
    NonZero,
    /// a minute: shorter would delete Jobs before their verdict is read
    OneMinute,
}

/// Parses each `(key, value, slot)` of section `section` into its slot.
fn durations(
    section: &str,
    example: &'static str,
    at_least: AtLeast,
    entries: Vec<(&str, Option<String>, &mut Duration)>,
) -> Result<(), InvalidField> {
    for (field, value, slot) in entries {
        let Some(v) = value else { continue };
        let key = format!("{section}.{field}");
        let d = parse_go_duration(&v).map_err(|source| {
            invalid(
                key.clone(),
                Problem::NotADuration {
                    value: v.clone(),
                    example,
                    source,
                },
            )
        })?;
        match at_least {
            AtLeast::NonZero if d.is_zero() => return Err(invalid(key, Problem::Zero)),
            AtLeast::OneMinute if d < Duration::from_secs(60) => {
                return Err(invalid(key, Problem::UnderOneMinute))
            }
            _ => {}
        }
        *slot = d;
    }
    Ok(())
}

/// `engine:`: timeouts and the measurement deadline.
pub(super) fn validate_engine(raw: Option<RawEngine>) -> Result<EngineSettings, InvalidField> {
    let mut engine = EngineSettings::default();
    if let Some(e) = raw {
        durations(
            "engine",
            "5s",
            AtLeast::NonZero,
            vec![
                (
                    "connectTimeout",
                    e.connect_timeout,
                    &mut engine.connect_timeout,
                ),
                (
                    "requestTimeout",
                    e.request_timeout,
                    &mut engine.request_timeout,
                ),
                ("cacheWait", e.cache_wait, &mut engine.cache_wait),
                ("logTimeout", e.log_timeout, &mut engine.log_timeout),
                (
                    "measurementDeadline",
                    e.measurement_deadline,
                    &mut engine.measurement_deadline,
                ),
                (
                    "deadlineGrace",
                    e.deadline_grace,
                    &mut engine.deadline_grace,
                ),
                (
                    "maxMeasurementDeadline",
                    e.max_measurement_deadline,
                    &mut engine.max_measurement_deadline,
                ),
            ],
        )?;
        // Zero: a pod that cannot start or be scheduled ends the measurement at once.
        durations(
            "engine",
            "30s",
            AtLeast::Zero,
            vec![
                ("startGrace", e.start_grace, &mut engine.start_grace),
                (
                    "schedulingGrace",
                    e.scheduling_grace,
                    &mut engine.scheduling_grace,
                ),
            ],
        )?;
    }
    if engine.measurement_deadline > engine.max_measurement_deadline {
        return Err(invalid(
            "engine.measurementDeadline",
            Problem::DeadlineOverMax {
                deadline: engine.measurement_deadline,
                max: engine.max_measurement_deadline,
            },
        ));
    }
    Ok(engine)
}

/// `jobs:`: how long our Jobs stay once done.
pub(super) fn validate_jobs(raw: Option<RawJobs>) -> Result<JobsSettings, InvalidField> {
    let mut jobs = JobsSettings::default();
    if let Some(raw) = raw {
        durations(
            "jobs",
            "1h",
            AtLeast::OneMinute,
            vec![
                (
                    "ttlAfterFinished",
                    raw.ttl_after_finished,
                    &mut jobs.ttl_after_finished,
                ),
                ("retention", raw.retention, &mut jobs.retention),
            ],
        )?;
    }
    Ok(jobs)
}
