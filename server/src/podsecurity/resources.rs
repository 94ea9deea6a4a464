//! How much a Job may use (issue #27): each container's requests and limits, defaulted and
//! capped, and the Job's `parallelism`, `completions` and retries, capped.
//!
//! A template without resources would run unbounded on the destination (and a noisy check
//! starves the workloads it verifies); one with `parallelism: 1000` fills the cluster. So every
//! init and regular container gets, for each resource with a default, an unset limit set to the
//! default (at least the request) and an unset request set to the default (at most the limit);
//! then every request and limit, of every container and of the pod (`spec.resources`), must be
//! at most the cap of its resource, and a resource without a cap is refused. Ephemeral
//! containers may not set resources (the API server refuses them), so nothing is filled there,
//! but a value there is capped all the same.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::allowlists::{JobLimits, Resources, KUBERNETES_BACKOFF_LIMIT};
use super::{list, shown, violation, yaml_scalar, Needs, Violation};
use crate::quantity::Quantity;

const POD: &str = "spec.template.spec";

/// Fills the unset requests and limits of `pod`'s containers and refuses the first one over
/// its cap.
pub(super) fn fill_and_cap(
    pod: &mut Map<String, Value>,
    resources: &Resources,
) -> Result<(), Violation> {
    for l in ["initContainers", "containers"] {
        let Some(items) = pod.get_mut(l).and_then(Value::as_array_mut) else {
            continue;
        };
        for (i, c) in items.iter_mut().enumerate() {
            let at = format!("{POD}.{l}[{i}]");
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let c = c
                .as_object_mut()
                .ok_or_else(|| violation(&at, "must be an object", Needs::Nothing))?;
            fill(c, &at, resources)?;
            cap(
                c.get("resources"),
                &at,
                &format!("container {name:?}"),
                resources,
            )?;
        }
    }
    for (i, c) in list(pod.get("ephemeralContainers")).iter().enumerate() {
        let name = c.get("name").and_then(Value::as_str).unwrap_or("");
        let at = format!("{POD}.ephemeralContainers[{i}]");
        cap(
            c.get("resources"),
            &at,
            &format!("container {name:?}"),
            resources,
        )?;
    }
    cap(pod.get("resources"), POD, "the pod", resources)
}

/// `obj[key]` as an object, created when absent or null.
fn object<'a>(
    obj: &'a mut Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a mut Map<String, Value>, Violation> {
    let slot = obj.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
        .ok_or_else(|| violation(format!("{at}.{key}"), "must be an object", Needs::Nothing))
}

/// The quantities of a `requests` or `limits` map, each parsed.
fn quantities(map: &Map<String, Value>, at: &str) -> Result<BTreeMap<String, Quantity>, Violation> {
    map.iter()
        .map(|(name, v)| {
            Quantity::from_json(v)
                .map(|q| (name.clone(), q))
                .map_err(|e| violation(format!("{at}.{name}"), e.to_string(), Needs::Nothing))
        })
        .collect()
}

/// Sets the unset requests and limits of container `c` (at `at`) to the defaults.
fn fill(c: &mut Map<String, Value>, at: &str, resources: &Resources) -> Result<(), Violation> {
    if resources.default.is_empty() {
        return Ok(());
    }
    let at = format!("{at}.resources");
    let r = object(c, "resources", &at)?;
    let requests = quantities(object(r, "requests", &at)?, &format!("{at}.requests"))?;
    let limits = quantities(object(r, "limits", &at)?, &format!("{at}.limits"))?;
    let mut new_limits = Vec::new();
    let mut new_requests = Vec::new();
    for (res, default) in &resources.default {
        let limit = match limits.get(res) {
            Some(l) => l.clone(),
            None => {
                let l = requests
                    .get(res)
                    .filter(|q| *q > default)
                    .unwrap_or(default)
                    .clone();
                new_limits.push((res.clone(), l.clone()));
                l
            }
        };
        if !requests.contains_key(res) {
            new_requests.push((res.clone(), default.min(&limit).clone()));
        }
    }
    for (field, new) in [("limits", new_limits), ("requests", new_requests)] {
        let map = object(r, field, &at)?;
        for (res, q) in new {
            map.insert(res, Value::String(q.to_string()));
        }
    }
    Ok(())
}

/// Refuses the first request or limit in `r` (a `resources` object at `at`) over its cap, or of
/// a resource without one; `who` names the container for the message.
fn cap(r: Option<&Value>, at: &str, who: &str, resources: &Resources) -> Result<(), Violation> {
    let Some(r) = r.filter(|r| !r.is_null()) else {
        return Ok(());
    };
    for field in ["requests", "limits"] {
        let Some(map) = r.get(field).and_then(Value::as_object) else {
            continue;
        };
        let path = format!("{at}.resources.{field}");
        for (res, q) in quantities(map, &path)? {
            let raise = |to: &str| Needs::Allow {
                remedy: match resources.max.get(&res) {
                    Some(max) => format!("lower it to at most {max}"),
                    None => "remove it".into(),
                },
                rule: format!(
                    "`resources: {{max: {{{}: {}}}}}`",
                    yaml_scalar(&res),
                    yaml_scalar(to)
                ),
                flag: format!("`rollouts-dispatch agent --max-resources {res}={to}`"),
            };
            let Some(max) = resources.max.get(&res) else {
                let capped: Vec<&str> = resources.max.keys().map(String::as_str).collect();
                return Err(violation(
                    format!("{path}.{res}"),
                    format!(
                        "{who} asks for {q} of {res:?}, a resource the profile does not cap, so \
                         does not allow (capped: {})",
                        capped.join(", ")
                    ),
                    raise(q.as_str()),
                ));
            };
            if q > *max {
                return Err(violation(
                    format!("{path}.{res}"),
                    format!("{who} asks for {q} of {res}, more than the cap {max}"),
                    raise(q.as_str()),
                ));
            }
        }
    }
    Ok(())
}

/// Caps the Job's `parallelism`, `completions`, `backoffLimit` and `backoffLimitPerIndex`, and
/// sets an unset `backoffLimit` (the Job controller's default is 6, and without bound with
/// `backoffLimitPerIndex`) to 6 or the cap when lower.
pub(super) fn cap_job(spec: &mut Map<String, Value>, limits: JobLimits) -> Result<(), Violation> {
    let caps = [
        (
            "parallelism",
            "parallelism",
            limits.parallelism,
            "pods at once",
        ),
        (
            "completions",
            "completions",
            limits.completions,
            "completions",
        ),
        (
            "backoffLimit",
            "backoffLimit",
            limits.backoff_limit,
            "retries",
        ),
        (
            "backoffLimitPerIndex",
            "backoffLimit",
            limits.backoff_limit,
            "retries per index",
        ),
    ];
    for (field, key, max, what) in caps {
        let Some(v) = spec.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        let Some(n) = v.as_u64() else {
            return Err(violation(
                format!("spec.{field}"),
                format!("{} is not a whole number", shown(Some(v))),
                Needs::Nothing,
            ));
        };
        if n > u64::from(max) {
            let flag = match key {
                "parallelism" => "max-parallelism",
                "completions" => "max-completions",
                _ => "max-backoff-limit",
            };
            return Err(violation(
                format!("spec.{field}"),
                format!("{n} {what} is more than the cap {max}"),
                Needs::Allow {
                    remedy: format!("lower it to at most {max}"),
                    rule: format!("`jobLimits: {{{key}: {n}}}`"),
                    flag: format!("`rollouts-dispatch agent --{flag} {n}`"),
                },
            ));
        }
    }
    if spec.get("backoffLimit").is_none_or(Value::is_null) {
        let limit = KUBERNETES_BACKOFF_LIMIT.min(limits.backoff_limit);
        spec.insert("backoffLimit".into(), limit.into());
    }
    Ok(())
}
