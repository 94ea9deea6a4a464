//! The agent's side of the log relay: the server asks for a Job's log in the agent's work
//! ([`LogRequest`]), the agent streams it to `POST /v1/agents/{destination}/logs/{id}` over its
//! own outbound connection (its cluster has no inbound path).
//!
//! A request is checked first, whatever the server asks: only the Job of one of this agent's
//! records, in one of its `--namespaces`; any other is answered with a note and nothing is read.
//! The log is redacted as the failed container's tail is (`logs::secrets`): the values of every
//! Secret the Job's containers can read, or nothing but a note when one of them cannot be read.
//! One task per request, at most [`MAX_UPLOADS`] uploading at once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dispatch_api::agent::{self as api, LogUploadReply, WorkItem, MAX_LOG_UPLOAD_LINE};
use dispatch_api::client::{CallError, ServerClient};
use dispatch_api::logs::{LogEvent, LogRequest, CONTENT_TYPE};
use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use tokio::sync::Semaphore;
use tracing::{info, info_span, warn, Instrument};

use super::stream::{job_log, JobLog};
use super::{secrets, Redactor};
use crate::policy::glob_match;
use crate::runtime::reload::Reloading;

/// The most log uploads one agent runs at once; more wait their turn.
pub const MAX_UPLOADS: usize = 4;
/// How long reading the Secrets to redact may take.
const SECRET_TIMEOUT: Duration = Duration::from_secs(10);
/// Request ids remembered so that a request listed in several replies is served once.
const MAX_SEEN: usize = 1024;
/// The most lines sent in one chunk of an upload's body (see [`ndjson_chunks`]).
const LINES_PER_CHUNK: usize = 256;
/// The longest text of one line sent, so that its JSON stays below [`MAX_LOG_UPLOAD_LINE`].
const MAX_TEXT: usize = MAX_LOG_UPLOAD_LINE - 2048;

/// Serves the log requests of one agent.
pub struct LogServer {
    client: Reloading<ServerClient>,
    kube: kube::Client,
    destination: String,
    /// `--namespaces` (globs)
    namespaces: Vec<String>,
    permits: Arc<Semaphore>,
    seen: Mutex<HashSet<String>>,
}

impl LogServer {
    /// The log server of the agent of `destination`, reading its cluster with `kube`, allowed
    /// `namespaces`, uploading with `client`.
    pub fn new(
        client: Reloading<ServerClient>,
        kube: kube::Client,
        destination: &str,
        namespaces: Vec<String>,
    ) -> Arc<Self> {
        Arc::new(Self {
            client,
            kube,
            destination: destination.to_string(),
            namespaces,
            permits: Arc::new(Semaphore::new(MAX_UPLOADS)),
            seen: Mutex::new(HashSet::new()),
        })
    }

    /// Starts one upload task per request not seen before; `work` is the reply's records.
    pub fn serve(self: &Arc<Self>, requests: Vec<LogRequest>, work: &[WorkItem]) {
        for req in requests {
            if !self.first_time(&req.id) {
                continue;
            }
            let events = self.events(&req, work);
            let me = self.clone();
            let span = info_span!("log_upload", destination = %self.destination, id = %req.id,
                                  namespace = %req.namespace, job = %req.job, follow = req.follow);
            tokio::spawn(
                async move {
                    let Ok(_permit) = me.permits.clone().acquire_owned().await else {
                        return;
                    };
                    match me.upload(&req.id, events).await {
                        Ok(r) => info!(
                            delivered = r.delivered,
                            reader_gone = r.reader_gone,
                            "log uploaded"
                        ),
                        Err(e) => warn!(error = %e, "log upload failed"),
                    }
                }
                .instrument(span),
            );
        }
    }

    fn first_time(&self, id: &str) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.len() >= MAX_SEEN {
            // Ids of answered requests are never listed again; forgetting them is safe.
            seen.clear();
        }
        seen.insert(id.to_string())
    }

    /// What the agent sends for `req`: a note refusing it (not a Job of its records, or outside
    /// its namespaces; nothing is read), else the Job's log, redacted.
    pub fn events(&self, req: &LogRequest, work: &[WorkItem]) -> BoxStream<'static, LogEvent> {
        let refuse = |why: String| {
            warn!(destination = %self.destination, namespace = %req.namespace, job = %req.job,
                  reason = %why, "refused: log request");
            stream::iter([LogEvent::Note {
                destination: self.destination.clone(),
                pod: None,
                text: format!(
                    "the agent of {} refuses to stream Job {}/{}: {why}",
                    self.destination, req.namespace, req.job
                ),
            }])
            .boxed()
        };
        if !self
            .namespaces
            .iter()
            .any(|g| glob_match(g, &req.namespace))
        {
            return refuse(format!(
                "namespace {} is not one of its --namespaces ({})",
                req.namespace,
                self.namespaces.join(", ")
            ));
        }
        let ours = work.iter().any(|w| {
            w.spec.destination == self.destination
                && w.spec.namespace == req.namespace
                && w.spec.job_name == req.job
                && w.spec.observe.is_none()
        });
        if !ours {
            return refuse("it is not the Job of one of its records".into());
        }
        let target = JobLog {
            destination: self.destination.clone(),
            namespace: req.namespace.clone(),
            job: req.job.clone(),
            container: req.container.clone(),
            follow: req.follow,
            // Read by name in its own cluster: `job_log` finds its uid.
            job_uid: None,
        };
        let kube = self.kube.clone();
        stream::once(async move {
            match redactor(&kube, &target).await {
                Ok(r) => job_log(kube, target, Arc::new(r)),
                Err(e) => {
                    warn!(destination = %target.destination, job = %target.job, error = %e,
                          "log withheld: a Secret the Job reads cannot be read to redact it");
                    stream::iter([LogEvent::Note {
                        destination: target.destination.clone(),
                        pod: None,
                        text: format!(
                            "the log of Job {}/{} is withheld: {e}",
                            target.namespace, target.job
                        ),
                    }])
                    .boxed()
                }
            }
        })
        .flatten()
        .boxed()
    }

    /// `POST`s `events` as NDJSON to the server, streamed as they come.
    async fn upload(
        &self,
        id: &str,
        events: BoxStream<'static, LogEvent>,
    ) -> Result<LogUploadReply, CallError> {
        let body = dispatch_api::client::Body::wrap_stream(ndjson_chunks(events));
        let path = api::logs_path(&self.destination, id);
        self.client
            .get()
            .post_stream(&path, CONTENT_TYPE, body, api::LOG_UPLOAD_TIMEOUT)
            .await
    }
}

/// `events` as NDJSON, the lines ready at once joined into one chunk (at most
/// [`LINES_PER_CHUNK`]): each chunk is one HTTP/2 DATA frame, and h2 (0.4.20, the server's
/// hyper) counts every buffered frame under 256 bytes against a budget of half the connection
/// window (h2 src/proto/streams/counts.rs:120-138, src/proto/connection.rs:99-109) and closes the
/// whole connection with `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"` when it runs out
/// (src/proto/streams/streams.rs:655-662). One frame per line did exactly that as soon as a slow
/// reader let a few thousand lines wait in the server's window (issue #17).
pub fn ndjson_chunks(
    events: BoxStream<'static, LogEvent>,
) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> + Send + 'static {
    events.ready_chunks(LINES_PER_CHUNK).map(|batch| {
        let mut chunk = Vec::new();
        for ev in batch {
            // A LogEvent always serialises; an empty line would be skipped by the server.
            chunk.extend(serde_json::to_vec(&bounded(ev)).unwrap_or_default());
            chunk.push(b'\n');
        }
        Ok(chunk)
    })
}

/// The redactor of `target`'s log: the values of every Secret its pods' containers (or the one
/// container asked for) can read; `Err` when one cannot be read: the log is then withheld, as
/// the log tail is.
async fn redactor(
    kube: &kube::Client,
    target: &JobLog,
) -> Result<Redactor, secrets::SecretReadError> {
    let pods: Api<Pod> = Api::namespaced(kube.clone(), &target.namespace);
    let lp = ListParams::default().labels(&format!("job-name={}", target.job));
    let Ok(list) = pods.list(&lp).await else {
        // job_log lists them again and says why it cannot.
        return Ok(Redactor::default());
    };
    let mut names: Vec<String> = Vec::new();
    for pod in &list.items {
        let spec = pod.spec.iter();
        let containers = spec.flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
                .map(|c| c.name.clone())
        });
        for c in containers.filter(|c| target.container.as_ref().is_none_or(|o| o == c)) {
            names.extend(secrets::referenced(pod, &c));
        }
    }
    names.sort();
    names.dedup();
    if names.is_empty() {
        return Ok(Redactor::default());
    }
    secrets::read(kube, &target.namespace, &names, SECRET_TIMEOUT)
        .await
        .map(Redactor::new)
}

/// `ev` with a text short enough for one upload line (cut at a character boundary).
fn bounded(ev: LogEvent) -> LogEvent {
    let cut = |mut text: String| {
        if text.len() > MAX_TEXT {
            let mut end = MAX_TEXT;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push_str(" …[line cut]");
        }
        text
    };
    match ev {
        LogEvent::Line {
            destination,
            pod,
            container,
            text,
        } => LogEvent::Line {
            destination,
            pod,
            container,
            text: cut(text),
        },
        LogEvent::Note {
            destination,
            pod,
            text,
        } => LogEvent::Note {
            destination,
            pod,
            text: cut(text),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upload body through a real hyper HTTP/2 server (the API's listener) whose handler
    /// stops reading for a while, as the relay does when its reader is slow: every line must
    /// arrive. One DATA frame per line made h2 close the connection (`too_many_data_frames`).
    #[tokio::test]
    async fn a_long_upload_survives_a_reader_that_pauses_over_http2() {
        use axum::routing::post;
        const LINES: usize = 20_000;
        let app = axum::Router::new().route(
            "/up",
            post(|body: axum::body::Body| async move {
                // The reader is slow: the client fills the server's window meanwhile.
                tokio::time::sleep(Duration::from_secs(1)).await;
                let mut data = body.into_data_stream();
                let mut lines = 0usize;
                while let Some(chunk) = data.next().await {
                    let Ok(chunk) = chunk else {
                        return format!("broke after {lines} lines");
                    };
                    lines += chunk.iter().filter(|b| **b == b'\n').count();
                }
                lines.to_string()
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(crate::runtime::listener::serve(
            listener,
            app,
            None,
            async move {
                let _ = stopped.await;
            },
        ));
        let events = stream::iter((0..LINES).map(|i| LogEvent::Line {
            destination: "d".into(),
            pod: "p".into(),
            container: "c".into(),
            text: format!("relay {i:06}"),
        }))
        .boxed();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .http2_prior_knowledge()
            .build()
            .unwrap();
        let reply = tokio::time::timeout(
            Duration::from_secs(60),
            client
                .post(format!("http://{addr}/up"))
                .body(reqwest::Body::wrap_stream(ndjson_chunks(events)))
                .send(),
        )
        .await
        .expect("the upload ends");
        let text = reply.expect("the upload is answered").text().await.unwrap();
        assert_eq!(text, LINES.to_string());
        let _ = stop.send(());
        let _ = server.await;
    }

    #[test]
    fn a_long_line_is_cut_below_the_upload_limit_on_a_char_boundary() {
        let ev = bounded(LogEvent::Line {
            destination: "d".into(),
            pod: "p".into(),
            container: "c".into(),
            text: "é".repeat(MAX_LOG_UPLOAD_LINE),
        });
        let json = serde_json::to_vec(&ev).unwrap();
        assert!(json.len() < MAX_LOG_UPLOAD_LINE, "{}", json.len());
        assert!(ev.to_text().ends_with("…[line cut]"));
        let short = LogEvent::Note {
            destination: "d".into(),
            pod: None,
            text: "ok".into(),
        };
        assert_eq!(bounded(short.clone()), short);
    }
}
