//! Logs, the feature: the tail of a failed container in a verdict (here), the whole log of a
//! run for people and tools (`routes`, `run`), relayed from agents (`relay`) across replicas
//! (`peers`) through the store's board (`board`), and read on the agent's side (`agent`).
//!
//! The log tail of a failed container is found, fetched, bounded and redacted here.
//!
//! The cheapest source is the container's `state.terminated.message`: with
//! `terminationMessagePolicy: FallbackToLogsOnError` (which [`crate::job::build`] sets on every
//! container that does not choose one) the kubelet fills it with the end of the log. Only when
//! it is empty does [`fetch`] call the `pods/log` API, with `tailLines` and `limitBytes`.
//! [`render`] redacts the run's secret values, then bounds the text to `logTail` lines and
//! [`MAX_LOG_BYTES`]. Before any of that leaves the destination, the values of the Secrets the
//! container could read are redacted too, or the tail is withheld ([`secrets`]).
//! [`stream`] is the whole log of a Job, for the log API.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, LogParams};

pub use dispatch_api::redact::{Redactor, REDACTED};

pub mod agent;
pub mod board;
pub mod peers;
pub mod relay;
pub mod routes;
pub mod run;
pub mod secrets;
pub mod stream;
pub mod tails;

/// The most bytes of log text a message carries.
pub const MAX_LOG_BYTES: usize = 4096;
/// Why the `pods/log` API gave no log text.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The API server refused (the pod is gone, RBAC, …): its message and HTTP code.
    #[error("pods/log: {} ({})", .0.message, .0.code)]
    Refused(#[source] Box<kube::core::Status>),
    /// The API server could not be reached or its answer not read.
    #[error("pods/log: {0}")]
    Request(#[source] kube::Error),
    /// No answer within the log timeout.
    #[error("pods/log: no answer within {0:?}")]
    Timeout(Duration),
}

/// The container whose failure decided the Job's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedContainer {
    /// the pod
    pub pod: String,
    /// the pod's namespace
    pub namespace: String,
    /// the container
    pub container: String,
    /// whether it is an init container
    pub init: bool,
    /// its exit code
    pub exit_code: i32,
    /// `state.terminated.reason` (`Error`, `OOMKilled`, …)
    pub reason: Option<String>,
    /// `state.terminated.message` (the log tail under FallbackToLogsOnError)
    pub message: Option<String>,
    /// the Secrets the container can read ([`secrets::referenced`]): their values are
    /// redacted from its log, or the log is withheld
    pub secrets: Vec<String>,
}

impl FailedContainer {
    /// `container "check" exited with code 1 (Error)`.
    pub fn describe(&self) -> String {
        let kind = if self.init {
            "init container"
        } else {
            "container"
        };
        match &self.reason {
            Some(r) if !r.is_empty() => format!(
                "{kind} {:?} exited with code {} ({r})",
                self.container, self.exit_code
            ),
            _ => format!(
                "{kind} {:?} exited with code {}",
                self.container, self.exit_code
            ),
        }
    }
}

/// The failed container of the newest pod that has one (init containers first: they run first).
pub fn failed_container(pods: &[Arc<Pod>]) -> Option<FailedContainer> {
    let mut pods: Vec<&Arc<Pod>> = pods.iter().collect();
    pods.sort_by(|a, b| {
        b.metadata
            .creation_timestamp
            .cmp(&a.metadata.creation_timestamp)
            .then_with(|| b.metadata.name.cmp(&a.metadata.name))
    });
    pods.into_iter().find_map(|pod| {
        let status = pod.status.as_ref()?;
        let init = status
            .init_container_statuses
            .iter()
            .flatten()
            .map(|c| (c, true));
        let main = status
            .container_statuses
            .iter()
            .flatten()
            .map(|c| (c, false));
        init.chain(main).find_map(|(cs, init)| {
            let t = cs.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code != 0).then(|| FailedContainer {
                pod: pod.metadata.name.clone().unwrap_or_default(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                container: cs.name.clone(),
                init,
                exit_code: t.exit_code,
                reason: t.reason.clone(),
                message: t.message.clone().filter(|m| !m.trim().is_empty()),
                secrets: secrets::referenced(pod, &cs.name),
            })
        })
    })
}

/// Container `container` of pod `pod` that the kubelet restarts with back-off
/// (`CrashLoopBackOff`): its last run, from `lastState.terminated`. Its log is read without
/// `previous`: while the container waits, the kubelet serves the last run's log
/// (kubernetes pkg/kubelet/kubelet_pods.go:1585-1589, `validateContainerLogStatus`).
pub fn crashed_container(pods: &[Arc<Pod>], pod: &str, container: &str) -> Option<FailedContainer> {
    let p = pods
        .iter()
        .find(|p| p.metadata.name.as_deref() == Some(pod))?;
    let status = p.status.as_ref()?;
    let init = status
        .init_container_statuses
        .iter()
        .flatten()
        .map(|c| (c, true));
    let main = status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| (c, false));
    let (cs, init) = init.chain(main).find(|(c, _)| c.name == container)?;
    let t = cs.last_state.as_ref()?.terminated.as_ref()?;
    Some(FailedContainer {
        pod: pod.to_string(),
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        container: cs.name.clone(),
        init,
        exit_code: t.exit_code,
        reason: t.reason.clone(),
        message: t.message.clone().filter(|m| !m.trim().is_empty()),
        secrets: secrets::referenced(p, &cs.name),
    })
}

/// The last `lines` lines of `text`, then at most `max_bytes` of their end (on a char boundary).
pub fn bound(text: &str, lines: u32, max_bytes: usize) -> String {
    let text = text.trim_end_matches(['\n', '\r']);
    let all: Vec<&str> = text.lines().collect();
    let keep = all.len().saturating_sub(lines as usize);
    let joined = all[keep..].join("\n");
    if joined.len() <= max_bytes {
        return joined;
    }
    let mut start = joined.len() - max_bytes;
    while !joined.is_char_boundary(start) {
        start += 1;
    }
    // Start at a line boundary when one is near, so the first line is whole.
    let cut = &joined[start..];
    match cut.find('\n') {
        Some(i) if i < cut.len() / 4 => cut[i + 1..].to_string(),
        _ => cut.to_string(),
    }
}

/// The message block for a log tail: a heading line, then the lines.
pub fn format_tail(failed: &FailedContainer, text: &str, source: &str) -> String {
    let n = text.lines().count();
    if n == 0 {
        return format!(
            "{} of pod {} left no log ({source})",
            failed.describe(),
            failed.pod
        );
    }
    format!(
        "last {n} log line{} of {} {:?} (pod {}, {source}):\n{text}",
        if n == 1 { "" } else { "s" },
        if failed.init {
            "init container"
        } else {
            "container"
        },
        failed.container,
        failed.pod
    )
}

/// The message block when the tail is withheld because a Secret the container reads could not
/// be read to redact its values.
pub fn withheld(failed: &FailedContainer, why: &secrets::SecretReadError) -> String {
    format!(
        "log of {} (pod {}) withheld: the container reads Secret(s) {} and {why}, so their values \
         cannot be redacted from it; let the reader of the log (the server for this destination, \
         or its agent) `get` those Secrets, or set `logTail: 0`",
        failed.describe(),
        failed.pod,
        failed.secrets.join(", "),
    )
}

/// The message block for `raw` log text of `failed`: redacted, then bounded to `lines` lines
/// and [`MAX_LOG_BYTES`]. `source` says where the text came from.
pub fn render(
    failed: &FailedContainer,
    raw: &str,
    source: &str,
    lines: u32,
    redactor: &Redactor,
) -> String {
    let text = bound(&redactor.redact(raw), lines, MAX_LOG_BYTES);
    format_tail(failed, &text, source)
}

/// Reads the end of the container's log from the API server.
pub async fn fetch(
    client: &kube::Client,
    failed: &FailedContainer,
    lines: u32,
    timeout: Duration,
) -> Result<String, LogError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &failed.namespace);
    let params = LogParams {
        container: Some(failed.container.clone()),
        tail_lines: Some(i64::from(lines)),
        // Room for redaction and line trimming; bounded again afterwards.
        limit_bytes: Some(4 * MAX_LOG_BYTES as i64),
        ..LogParams::default()
    };
    match tokio::time::timeout(timeout, pods.logs(&failed.pod, &params)).await {
        Ok(Ok(text)) => Ok(text),
        Ok(Err(kube::Error::Api(s))) => Err(LogError::Refused(s)),
        Ok(Err(e)) => Err(LogError::Request(e)),
        Err(_) => Err(LogError::Timeout(timeout)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(name: &str, secs: i64, statuses: &[(&str, i32, Option<&str>)], init: bool) -> Arc<Pod> {
        let list: Vec<ContainerStatus> = statuses
            .iter()
            .map(|(n, code, msg)| ContainerStatus {
                name: (*n).into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: *code,
                        reason: Some(if *code == 0 { "Completed" } else { "Error" }.into()),
                        message: msg.map(String::from),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            })
            .collect();
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                creation_timestamp: Some(Time(
                    k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap(),
                )),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                init_container_statuses: init.then(|| list.clone()),
                container_statuses: (!init).then_some(list),
                ..PodStatus::default()
            }),
            ..Pod::default()
        })
    }

    #[test]
    fn redaction_replaces_every_secret() {
        let r = Redactor::new(["hunter2", "", "hunter2-long", "tok"]);
        assert_eq!(
            r.redact("pw=hunter2-long x=hunter2 tok tok"),
            "pw=***** x=***** ***** *****"
        );
        assert_eq!(Redactor::default().redact("a"), "a");
        assert_eq!(format!("{r:?}"), "Redactor(3 values)");
    }

    #[test]
    fn bound_keeps_the_end() {
        let text = (1..=100)
            .map(|i| format!("line {i}"))
            .collect::<Vec<_>>()
            .join("\n")
            + "\n";
        let b = bound(&text, 3, MAX_LOG_BYTES);
        assert_eq!(b, "line 98\nline 99\nline 100");
        let long = format!("{}\nend", "é".repeat(5000));
        let b = bound(&long, 10, 100);
        assert!(b.len() <= 100 && b.ends_with("end"), "{b}");
        assert_eq!(bound("", 5, 10), "");
        assert_eq!(bound("a\nb\n", 0, 10), "");
    }

    #[test]
    fn the_newest_failed_container_is_chosen() {
        let pods = vec![
            pod("old", 0, &[("check", 2, Some("old failure"))], false),
            pod(
                "new",
                10,
                &[("side", 0, None), ("check", 1, Some("boom\n"))],
                false,
            ),
        ];
        let f = failed_container(&pods).unwrap();
        assert_eq!(f.pod, "new");
        assert_eq!(f.container, "check");
        assert_eq!(f.exit_code, 1);
        assert_eq!(f.message.as_deref(), Some("boom\n"));
        assert_eq!(
            f.describe(),
            "container \"check\" exited with code 1 (Error)"
        );
        let init = failed_container(&[pod("p", 0, &[("setup", 3, Some("   "))], true)]).unwrap();
        assert!(init.init && init.message.is_none());
        assert!(init.describe().starts_with("init container"));
        assert!(failed_container(&[pod("ok", 0, &[("c", 0, None)], false)]).is_none());
    }

    #[test]
    fn a_crash_looping_container_is_read_from_its_last_run() {
        let mut p = (*pod("p", 0, &[("check", 1, None)], false)).clone();
        let cs = &mut p
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[0];
        cs.last_state = cs.state.take();
        cs.state = Some(ContainerState {
            waiting: Some(k8s_openapi::api::core::v1::ContainerStateWaiting {
                reason: Some("CrashLoopBackOff".into()),
                message: Some("back-off 10s restarting failed container=check".into()),
            }),
            ..ContainerState::default()
        });
        let pods = vec![Arc::new(p)];
        assert!(failed_container(&pods).is_none(), "it waits now");
        let f = crashed_container(&pods, "p", "check").unwrap();
        assert_eq!((f.exit_code, f.init), (1, false));
        assert_eq!(
            f.describe(),
            "container \"check\" exited with code 1 (Error)"
        );
        assert!(crashed_container(&pods, "p", "other").is_none());
        assert!(crashed_container(&pods, "q", "check").is_none());
    }

    #[test]
    fn tails_are_formatted() {
        let f = failed_container(&[pod("p", 0, &[("check", 1, None)], false)]).unwrap();
        assert_eq!(
            format_tail(&f, "a\nb", "pods/log"),
            "last 2 log lines of container \"check\" (pod p, pods/log):\na\nb"
        );
        assert!(format_tail(&f, "", "pods/log").contains("left no log"));
        let raw = (1..=50)
            .map(|i| format!("l{i} pw=s3cret"))
            .collect::<Vec<_>>()
            .join("\n");
        let r = render(
            &f,
            &raw,
            "termination message",
            2,
            &Redactor::new(["s3cret"]),
        );
        assert_eq!(
            r,
            "last 2 log lines of container \"check\" (pod p, termination message):\nl49 pw=*****\nl50 pw=*****"
        );
    }
}
