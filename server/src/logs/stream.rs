//! The whole log of one Job, as a stream of [`LogEvent`]s: every pod (one per attempt, oldest
//! first) and in each its init containers then its containers, line by line, redacted.
//!
//! Shared by the server (direct destinations, with its client of the destination) and the agent
//! (its own cluster, streaming to the server on request), so both label and redact alike.
//!
//! Without `follow` the containers are read one after the other, so the whole log arrives in
//! order. With `follow` they are read side by side (a sidecar never ends, and a Job's containers
//! run at once), each container's lines in order; a container still waiting to start is waited
//! for. Pods created after the stream opened (a retry) are not followed: ask again. Only the
//! pods whose controller is the Job (by uid) are read, not any pod with its `job-name` label.

use std::sync::Arc;
use std::time::Duration;

use dispatch_api::logs::LogEvent;
use futures::stream::{self, BoxStream, StreamExt};
use futures::{AsyncBufRead, AsyncBufReadExt};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};

use super::Redactor;

/// The label the Job controller puts on its pods (also set as `batch.kubernetes.io/job-name`
/// since Kubernetes 1.27; the short one is on pods of every version).
const JOB_NAME_LABEL: &str = "job-name";
/// How often a container still waiting to start is asked again when following.
const WAITING_POLL: Duration = Duration::from_secs(1);
/// The longest line kept: the rest of a longer one is dropped (marked [`CUT`]), so that a
/// container printing megabytes without a newline cannot make the server or the agent hold them.
pub const MAX_LINE: usize = 32 << 10;
/// What ends a line cut at [`MAX_LINE`].
pub const CUT: &str = " …[line cut]";

/// Which Job's log, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLog {
    /// the destination's name (labels every event)
    pub destination: String,
    /// the Job's namespace
    pub namespace: String,
    /// the Job
    pub job: String,
    /// only this container
    pub container: Option<String>,
    /// keep streaming until the containers end
    pub follow: bool,
    /// the Job's uid, when the caller read the Job; `None`: read it first. Only pods whose
    /// controller is the Job of this uid are shown: anyone who can create pods in the namespace
    /// can give one the Job's `job-name` label, and its lines would pass for the Job's.
    pub job_uid: Option<String>,
}

/// The log of `target`'s pods on the cluster of `client`, secret values replaced by `redactor`.
/// Never fails: what cannot be read becomes a [`LogEvent::Note`].
pub fn job_log(
    client: kube::Client,
    target: JobLog,
    redactor: Arc<Redactor>,
) -> BoxStream<'static, LogEvent> {
    let jobs: Api<Job> = Api::namespaced(client.clone(), &target.namespace);
    let pods: Api<Pod> = Api::namespaced(client, &target.namespace);
    let target = Arc::new(target);
    stream::once(async move {
        let uid = match &target.job_uid {
            Some(uid) => uid.clone(),
            None => match jobs.get_opt(&target.job).await {
                Ok(Some(job)) => job.metadata.uid.unwrap_or_default(),
                Ok(None) => {
                    return note(
                        &target,
                        None,
                        format!("Job {}/{} does not exist", target.namespace, target.job),
                    )
                    .boxed()
                }
                Err(e) => return note(&target, None, format!("cannot read the Job: {e}")).boxed(),
            },
        };
        let lp = ListParams::default().labels(&format!("{JOB_NAME_LABEL}={}", target.job));
        let listed = pods.list(&lp).await.map(|mut list| {
            list.items.retain(|pod| owned_by(pod, &uid));
            list
        });
        match listed {
            Err(e) => note(&target, None, format!("cannot list the Job's pods: {e}")).boxed(),
            Ok(list) if list.items.is_empty() => note(
                &target,
                None,
                format!(
                    "Job {}/{} has no pods (not started yet, or deleted with its Job)",
                    target.namespace, target.job
                ),
            )
            .boxed(),
            Ok(list) => {
                let mut items = list.items;
                items.sort_by(|a, b| {
                    (&a.metadata.creation_timestamp, &a.metadata.name)
                        .cmp(&(&b.metadata.creation_timestamp, &b.metadata.name))
                });
                let parts: Vec<BoxStream<'static, LogEvent>> = items
                    .iter()
                    .flat_map(|pod| containers_of(pod, target.container.as_deref()))
                    .map(|(pod, container)| {
                        container_log(
                            pods.clone(),
                            target.clone(),
                            pod,
                            container,
                            redactor.clone(),
                        )
                    })
                    .collect();
                if target.follow {
                    stream::select_all(parts).boxed()
                } else {
                    stream::iter(parts).flatten().boxed()
                }
            }
        }
    })
    .flatten()
    .boxed()
}

/// `(pod, container)` for the pod's init containers then its containers, maybe only `only`.
fn containers_of(pod: &Pod, only: Option<&str>) -> Vec<(String, String)> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let Some(spec) = &pod.spec else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .map(|c| c.name.clone())
        .filter(|c| only.is_none_or(|o| o == c))
        .map(|c| (name.clone(), c))
        .collect()
}

/// One container's log, line by line.
fn container_log(
    pods: Api<Pod>,
    target: Arc<JobLog>,
    pod: String,
    container: String,
    redactor: Arc<Redactor>,
) -> BoxStream<'static, LogEvent> {
    let params = LogParams {
        container: Some(container.clone()),
        follow: target.follow,
        ..LogParams::default()
    };
    let opened = {
        let (target, pod) = (target.clone(), pod.clone());
        async move {
            loop {
                match pods.log_stream(&pod, &params).await {
                    Ok(reader) => return Ok(bounded_lines(Box::pin(reader))),
                    Err(e) if target.follow && is_waiting(&e) => {
                        tokio::time::sleep(WAITING_POLL).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    };
    stream::once(opened)
        .flat_map(move |opened| match opened {
            Err(e) => note(
                &target,
                Some(pod.clone()),
                format!("container {container}: cannot read its log: {e}"),
            )
            .boxed(),
            Ok(lines) => {
                let (target, pod, container, redactor) = (
                    target.clone(),
                    pod.clone(),
                    container.clone(),
                    redactor.clone(),
                );
                lines
                    .map(move |line| match line {
                        Ok(text) => LogEvent::Line {
                            destination: target.destination.clone(),
                            pod: pod.clone(),
                            container: container.clone(),
                            text: redactor.redact(&text),
                        },
                        Err(e) => LogEvent::Note {
                            destination: target.destination.clone(),
                            pod: Some(pod.clone()),
                            text: format!("container {container}: the log stream broke: {e}"),
                        },
                    })
                    .boxed()
            }
        })
        .boxed()
}

/// The lines of `reader` (without `\n` or `\r\n`; invalid UTF-8 replaced), each at most
/// [`MAX_LINE`] bytes: the rest of a longer line is skipped, never held.
fn bounded_lines(
    reader: std::pin::Pin<Box<dyn AsyncBufRead + Send>>,
) -> BoxStream<'static, std::io::Result<String>> {
    stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut line = Vec::new();
        let mut cut = false;
        loop {
            let buf = match reader.fill_buf().await {
                Ok(buf) => buf,
                Err(e) => return Some((Err(e), None)),
            };
            if buf.is_empty() {
                return (!line.is_empty() || cut).then(|| (Ok(finish(&line, cut)), None));
            }
            let newline = buf.iter().position(|b| *b == b'\n');
            let take = newline.unwrap_or(buf.len());
            let room = MAX_LINE.saturating_sub(line.len());
            cut |= take > room;
            line.extend_from_slice(&buf[..take.min(room)]);
            reader.consume_unpin(take + usize::from(newline.is_some()));
            if newline.is_some() {
                return Some((Ok(finish(&line, cut)), Some(reader)));
            }
        }
    })
    .boxed()
}

fn finish(line: &[u8], cut: bool) -> String {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let mut text = String::from_utf8_lossy(line).into_owned();
    if cut {
        text.push_str(CUT);
    }
    text
}

/// Whether `pods/log` refused because the container has not started yet (HTTP 400 "… is
/// waiting to start" or "PodInitializing"), which a follower waits out.
fn is_waiting(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => {
            s.code == 400
                && (s.message.contains("waiting to start") || s.message.contains("PodInitializing"))
        }
        _ => false,
    }
}

/// Whether `pod`'s controller is the Job of `uid` (as the Job controller sets it).
fn owned_by(pod: &Pod, uid: &str) -> bool {
    !uid.is_empty()
        && pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.kind == "Job" && o.uid == uid)
}

fn note(
    target: &JobLog,
    pod: Option<String>,
    text: String,
) -> impl futures::Stream<Item = LogEvent> {
    stream::iter([LogEvent::Note {
        destination: target.destination.clone(),
        pod,
        text,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines_of(text: Vec<u8>) -> Vec<String> {
        let reader = futures::io::Cursor::new(text);
        bounded_lines(Box::pin(futures::io::BufReader::with_capacity(7, reader)))
            .map(|l| l.expect("a cursor does not fail"))
            .collect()
            .await
    }

    #[tokio::test]
    async fn lines_are_split_and_a_long_one_is_cut_without_holding_it() {
        assert_eq!(
            lines_of(b"a\r\nbb\n\nlast".to_vec()).await,
            ["a", "bb", "", "last"]
        );
        assert!(lines_of(Vec::new()).await.is_empty());
        let mut long = vec![b'x'; MAX_LINE * 3];
        long.extend_from_slice(b"\nnext\n\xff\n");
        let lines = lines_of(long).await;
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), MAX_LINE + CUT.len());
        assert!(lines[0].ends_with(CUT));
        assert_eq!(lines[1], "next");
        assert_eq!(lines[2], "\u{fffd}");
    }
}
