//! An agent's upload read line by line into its reader's channel: each line at most
//! [`MAX_LOG_UPLOAD_LINE`] (longer ones cut with a note), relabelled with the route's
//! destination, waiting for the reader when it is slow.

use bytes::{Buf, Bytes, BytesMut};
use dispatch_api::agent::{LogUploadReply, MAX_LOG_UPLOAD_LINE};
use dispatch_api::logs::LogEvent;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::mpsc;

use super::note;

/// Feeds the NDJSON `body` into `sender`, line by line, each at most [`MAX_LOG_UPLOAD_LINE`].
pub(super) async fn relay_lines(
    destination: &str,
    mut body: BoxStream<'static, Result<Bytes, axum::Error>>,
    sender: &mpsc::Sender<LogEvent>,
) -> LogUploadReply {
    let mut reply = LogUploadReply::default();
    let mut buf = BytesMut::new();
    // Skipping the rest of a line that was too long.
    let mut skipping = false;
    let send = |ev: LogEvent| {
        let sender = sender.clone();
        async move { sender.send(ev).await.is_ok() }
    };
    loop {
        let chunk = match body.next().await {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                let ev = note(destination, format!("the agent's stream broke: {e}"));
                reply.reader_gone = !send(ev).await;
                return reply;
            }
            None => break,
        };
        buf.extend_from_slice(&chunk);
        while let Some(end) = buf.iter().position(|b| *b == b'\n') {
            let line = buf.split_to(end + 1);
            if std::mem::take(&mut skipping) {
                continue;
            }
            if let Some(ev) = event(destination, &line[..end]) {
                if !send(ev).await {
                    reply.reader_gone = true;
                    return reply;
                }
                reply.delivered += 1;
            }
        }
        if buf.len() > MAX_LOG_UPLOAD_LINE {
            buf.advance(buf.len());
            if !skipping {
                skipping = true;
                let ev = note(
                    destination,
                    format!(
                        "a line longer than {} KiB was cut",
                        MAX_LOG_UPLOAD_LINE >> 10
                    ),
                );
                if !send(ev).await {
                    reply.reader_gone = true;
                    return reply;
                }
            }
        }
    }
    if !buf.is_empty() && !skipping {
        if let Some(ev) = event(destination, &buf) {
            reply.reader_gone = !send(ev).await;
            reply.delivered += u64::from(!reply.reader_gone);
        }
    }
    reply
}

/// One uploaded line as an event of `destination` (`None`: blank); a line that is no event
/// becomes a note.
fn event(destination: &str, line: &[u8]) -> Option<LogEvent> {
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(match serde_json::from_slice::<LogEvent>(line) {
        Ok(LogEvent::Line {
            pod,
            container,
            text,
            ..
        }) => LogEvent::Line {
            destination: destination.to_string(),
            pod,
            container,
            text,
        },
        Ok(LogEvent::Note { pod, text, .. }) => LogEvent::Note {
            destination: destination.to_string(),
            pod,
            text,
        },
        Err(e) => note(
            destination,
            format!("the agent sent a line that is not a log event: {e}"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use futures::stream;

    use super::*;

    fn body(parts: Vec<&'static [u8]>) -> BoxStream<'static, Result<Bytes, axum::Error>> {
        stream::iter(parts.into_iter().map(|p| Ok(Bytes::from_static(p)))).boxed()
    }

    async fn relayed(parts: Vec<&'static [u8]>) -> (LogUploadReply, Vec<LogEvent>) {
        let (tx, mut rx) = mpsc::channel(super::super::CHANNEL);
        let reply = relay_lines("edge", body(parts), &tx).await;
        drop(tx);
        let mut out = Vec::new();
        while let Some(ev) = rx.recv().await {
            out.push(ev);
        }
        (reply, out)
    }

    #[tokio::test]
    async fn lines_split_across_chunks_arrive_whole_and_relabelled() {
        let (reply, events) = relayed(vec![
            br#"{"kind":"line","destination":"other","pod":"p","container":"c","text":"o"#,
            b"ne\"}\n\n{\"kind\":\"note\",\"destination\":\"x\",\"text\":\"end\"}",
        ])
        .await;
        assert_eq!(reply.delivered, 2);
        assert_eq!(
            events,
            vec![
                LogEvent::Line {
                    destination: "edge".into(),
                    pod: "p".into(),
                    container: "c".into(),
                    text: "one".into()
                },
                note("edge", "end".into())
            ]
        );
    }

    #[tokio::test]
    async fn a_line_too_long_is_cut_with_a_note_and_the_next_line_still_arrives() {
        let long: &'static [u8] =
            Box::leak(vec![b'x'; MAX_LOG_UPLOAD_LINE + 10].into_boxed_slice());
        let (_, events) = relayed(vec![
            long,
            b"yyy\n",
            br#"{"kind":"note","destination":"edge","text":"after"}"#,
            b"\nnot json\n",
        ])
        .await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(events[0].to_text().contains("longer than 64 KiB was cut"));
        assert_eq!(events[1], note("edge", "after".into()));
        assert!(events[2].to_text().contains("not a log event"));
    }
}
