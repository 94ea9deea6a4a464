//! Full logs of a run's Jobs, for people and tools (wire types).
//!
//! `GET /v1/runs/{namespace}/{name}/logs` ([`RUN_LOGS`], query [`LogsQuery`]) streams
//! [`LogEvent`]s as newline-delimited JSON ([`CONTENT_TYPE`]): every line of every container of
//! every pod (all attempts) of the run's Jobs, labelled by destination, pod and container, and
//! notes for what is not a line (a Job already deleted, an agent not connected, a stream cut).
//! On agent destinations the agent streams the log on request ([`LogRequest`], carried by its
//! long-polled work) to [`AGENT_LOGS`] over its own outbound connection.

use serde::{Deserialize, Serialize};

/// `GET`: the logs of one AnalysisRun's Jobs ([`LogsQuery`] → a stream of [`LogEvent`]).
pub const RUN_LOGS: &str = "/v1/runs/{namespace}/{name}/logs";
/// `POST`: an agent's stream of the log it was asked for (`{id}`: [`LogRequest::id`]); the body is
/// [`LogEvent`]s as newline-delimited JSON.
pub const AGENT_LOGS: &str = "/v1/agents/{destination}/logs/{id}";
/// The media type of a stream of [`LogEvent`]s: one JSON object per line.
pub const CONTENT_TYPE: &str = "application/x-ndjson";

/// The path of [`RUN_LOGS`] for one run (Kubernetes names need no escaping).
pub fn run_logs_path(namespace: &str, name: &str) -> String {
    RUN_LOGS
        .replace("{namespace}", namespace)
        .replace("{name}", name)
}

/// Which logs of the run; every field narrows, none set means all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogsQuery {
    /// only this metric's Jobs
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<String>,
    /// only this destination
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// only this container (or init container)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// keep the stream open and send new lines until the containers end
    #[serde(default)]
    pub follow: bool,
}

/// One event of a log stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum LogEvent {
    /// One line of a container's log (without its newline; secret values redacted).
    Line {
        /// the destination the Job runs on
        destination: String,
        /// the pod (one per attempt)
        pod: String,
        /// the container
        container: String,
        /// the line
        text: String,
    },
    /// What is not a line: a Job already deleted, an agent not connected, a stream cut short.
    Note {
        /// the destination it is about
        destination: String,
        /// the pod it is about, if one
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pod: Option<String>,
        /// what happened, for a person
        text: String,
    },
}

impl LogEvent {
    /// The event as `[destination/pod/container] text` (a note: `[destination] -- text`), as the
    /// CLI prints it.
    pub fn to_text(&self) -> String {
        match self {
            LogEvent::Line {
                destination,
                pod,
                container,
                text,
            } => format!("[{destination}/{pod}/{container}] {text}"),
            LogEvent::Note {
                destination,
                pod: Some(pod),
                text,
            } => format!("[{destination}/{pod}] -- {text}"),
            LogEvent::Note {
                destination,
                pod: None,
                text,
            } => format!("[{destination}] -- {text}"),
        }
    }
}

/// A log an agent is asked to stream: every pod of one Job (or one container of them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogRequest {
    /// where to send it: `POST` [`AGENT_LOGS`] with this id
    pub id: String,
    /// the Job's namespace
    pub namespace: String,
    /// the Job
    pub job: String,
    /// only this container
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// keep streaming until the containers end
    #[serde(default)]
    pub follow: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_tagged_json_lines() {
        let line = LogEvent::Line {
            destination: "cluster-a".into(),
            pod: "p-1".into(),
            container: "check".into(),
            text: "ok".into(),
        };
        let json = serde_json::to_string(&line).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"line","destination":"cluster-a","pod":"p-1","container":"check","text":"ok"}"#
        );
        assert_eq!(serde_json::from_str::<LogEvent>(&json).unwrap(), line);
        assert_eq!(line.to_text(), "[cluster-a/p-1/check] ok");
        let note: LogEvent =
            serde_json::from_str(r#"{"kind":"note","destination":"edge","text":"gone"}"#).unwrap();
        assert_eq!(note.to_text(), "[edge] -- gone");
    }

    #[test]
    fn the_path_names_the_run() {
        assert_eq!(
            run_logs_path("kargo-demo", "uat.01j.abc1234"),
            "/v1/runs/kargo-demo/uat.01j.abc1234/logs"
        );
    }
}
