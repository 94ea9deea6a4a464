//! The log tails of failed containers in verdicts, and what is remembered of them: a `pods/log`
//! answer (or failure) per container, so a broken log API costs one timeout; a tail that needed
//! the container's Secrets once rendered (redacted, or withheld), because the agent asks again
//! every loop until its record goes and must not read the Secrets each time. Held by the engine,
//! whose verdicts carry them; both maps are cleared when they grow beyond [`MAX_CACHED`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{fetch, render, withheld, FailedContainer, LogError, Redactor};
use crate::destinations::Destination;

/// `(destination, namespace, pod, container)`
type LogKey = (String, String, String, String);

/// Remembered answers at most, per map.
pub const MAX_CACHED: usize = 4096;

/// The tails of one engine.
#[derive(Debug)]
pub struct Tails {
    /// `pods/log` answers (or failures) per (destination, namespace, pod, container)
    logs: Mutex<HashMap<LogKey, Result<String, Arc<LogError>>>>,
    /// rendered tails of containers that read Secrets, per `(container, logTail lines)`
    secret_tails: Mutex<HashMap<(LogKey, u32), String>>,
    /// how long reading a log or a Secret may take
    timeout: Duration,
}

impl Tails {
    /// Tails read within `timeout` each.
    pub fn new(timeout: Duration) -> Self {
        Self {
            logs: Mutex::new(HashMap::new()),
            secret_tails: Mutex::new(HashMap::new()),
            timeout,
        }
    }

    /// The failed container's log tail: its termination message (free), else `pods/log`
    /// (cached per container, failures too, so a broken log API costs one timeout). A tail that
    /// needed the container's Secrets is kept once rendered (redacted, or withheld): the agent
    /// asks again every loop until its record goes, and must not read the Secrets each time.
    pub async fn tail(
        &self,
        d: &Destination,
        failed: &FailedContainer,
        lines: u32,
        secrets: &Redactor,
    ) -> Option<String> {
        if lines == 0 {
            return None;
        }
        if failed.secrets.is_empty() {
            return self.render(d, failed, lines, secrets).await;
        }
        let key = (
            (
                d.name.clone(),
                failed.namespace.clone(),
                failed.pod.clone(),
                failed.container.clone(),
            ),
            lines,
        );
        let known = self
            .secret_tails
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        if known.is_some() {
            return known;
        }
        let tail = self.render(d, failed, lines, secrets).await?;
        let mut cache = self.secret_tails.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        cache.insert(key, tail.clone());
        Some(tail)
    }

    /// [`Tails::tail`] without the cache of tails that needed Secrets.
    async fn render(
        &self,
        d: &Destination,
        failed: &FailedContainer,
        lines: u32,
        secrets: &Redactor,
    ) -> Option<String> {
        // The Secrets the container could print: read them to redact their values, or withhold.
        let with_values;
        let secrets = if failed.secrets.is_empty() {
            secrets
        } else {
            let timeout = self.timeout;
            match super::secrets::read(d.client(), &failed.namespace, &failed.secrets, timeout)
                .await
            {
                Ok(values) => {
                    with_values = secrets.with(values);
                    &with_values
                }
                Err(e) => {
                    tracing::warn!(destination = %d.name, pod = %failed.pod, error = %e,
                                   "log tail withheld: a Secret the container reads cannot be read to redact it");
                    return Some(withheld(failed, &e));
                }
            }
        };
        if let Some(m) = &failed.message {
            return Some(render(failed, m, "termination message", lines, secrets));
        }
        let key = (
            d.name.clone(),
            failed.namespace.clone(),
            failed.pod.clone(),
            failed.container.clone(),
        );
        let known = self
            .logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let raw = match known {
            Some(r) => r,
            None => {
                let r = fetch(d.client(), failed, lines, self.timeout)
                    .await
                    .map_err(Arc::new);
                let mut cache = self.logs.lock().unwrap_or_else(|e| e.into_inner());
                if cache.len() >= MAX_CACHED {
                    cache.clear();
                }
                cache.insert(key, r.clone());
                r
            }
        };
        Some(match raw {
            Ok(text) => render(failed, &text, "pods/log", lines, secrets),
            Err(e) => format!(
                "no log of {} (pod {}): {}",
                failed.describe(),
                failed.pod,
                secrets.redact(&e.to_string())
            ),
        })
    }
}
