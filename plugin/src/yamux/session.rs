//! The yamux session: a frame reader task, a frame writer task and the per-stream state.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::{debug, warn};

use super::frame::{flags, go_away, FrameType, Header, INITIAL_WINDOW};

enum WriterMsg {
    Frame(Header, Bytes),
    Flush(oneshot::Sender<()>),
}

/// State shared by the reader task, the writer handle and the stream owner.
struct Inner {
    writer: mpsc::UnboundedSender<WriterMsg>,
    streams: Mutex<HashMap<u32, Arc<StreamShared>>>,
    closed: watch::Sender<bool>,
}

struct StreamShared {
    id: u32,
    /// Bytes we may still send before the peer grants more.
    send_window: Mutex<u32>,
    window_changed: Notify,
    /// Bytes the peer may still send before we grant more.
    recv_window: Mutex<u32>,
    data: Mutex<Option<mpsc::UnboundedSender<Bytes>>>,
    local_closed: Mutex<bool>,
    reset: Mutex<bool>,
}

/// A yamux session over one connection, in the server role.
pub struct Session {
    inner: Arc<Inner>,
    incoming: mpsc::UnboundedReceiver<Stream>,
}

/// An inbound stream: read with [`Stream::read`], write through [`Stream::writer`].
pub struct Stream {
    shared: Arc<StreamShared>,
    inner: Arc<Inner>,
    rx: mpsc::UnboundedReceiver<Bytes>,
    /// Bytes handed to the application but not yet granted back to the peer.
    unacked: u32,
}

/// The sending half of a stream; cheap to clone.
#[derive(Clone)]
pub struct StreamWriter {
    shared: Arc<StreamShared>,
    inner: Arc<Inner>,
}

// === impl Session ===

impl Session {
    /// Starts a server session on `io`; the reader and writer run as tokio tasks.
    pub fn server<T>(io: T) -> Self
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (writer, writer_rx) = mpsc::unbounded_channel();
        let (closed, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            writer,
            streams: Mutex::new(HashMap::new()),
            closed,
        });
        let (incoming_tx, incoming) = mpsc::unbounded_channel();
        tokio::spawn(write_frames(write, writer_rx));
        tokio::spawn({
            let inner = Arc::clone(&inner);
            async move {
                if let Err(e) = read_frames(read, &inner, incoming_tx).await {
                    debug!(error = %e, "yamux session ended");
                }
                inner.shutdown();
            }
        });
        Self { inner, incoming }
    }

    /// The next stream the peer opens (already ACKed); `None` once the session is closed.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.incoming.recv().await
    }

    /// Resolves when the connection is gone (EOF, error or GoAway).
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.closed.subscribe();
        async move {
            let _ = rx.wait_for(|closed| *closed).await;
        }
    }

    /// Waits until every frame queued so far has been written to the connection.
    pub async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.inner.writer.send(WriterMsg::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

impl Inner {
    fn send(&self, header: Header, payload: Bytes) -> io::Result<()> {
        self.writer
            .send(WriterMsg::Frame(header, payload))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "yamux session is closed"))
    }

    fn shutdown(&self) {
        let streams: Vec<_> = self
            .streams
            .lock()
            .expect("streams lock")
            .drain()
            .map(|(_, s)| s)
            .collect();
        for s in streams {
            s.data.lock().expect("data lock").take();
            *s.reset.lock().expect("reset lock") = true;
            s.window_changed.notify_waiters();
        }
        self.closed.send_replace(true);
    }

    fn go_away(&self, code: u32) {
        let _ = self.send(Header::new(FrameType::GoAway, 0, 0, code), Bytes::new());
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::UnboundedReceiver<WriterMsg>) {
    let mut buf = Vec::with_capacity(64 * 1024);
    while let Some(msg) = rx.recv().await {
        // Batch whatever is queued into one write.
        let mut flushes = Vec::new();
        let mut next = Some(msg);
        while let Some(msg) = next.take() {
            match msg {
                WriterMsg::Frame(h, payload) => {
                    buf.extend_from_slice(&h.encode());
                    buf.extend_from_slice(&payload);
                }
                WriterMsg::Flush(done) => flushes.push(done),
            }
            if buf.len() < 256 * 1024 {
                next = rx.try_recv().ok();
            }
        }
        if !buf.is_empty() {
            if let Err(e) = w.write_all(&buf).await {
                debug!(error = %e, "yamux write failed");
                return;
            }
            buf.clear();
        }
        let _ = w.flush().await;
        for done in flushes {
            let _ = done.send(());
        }
    }
    let _ = w.shutdown().await;
}

#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("connection: {0}")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Header(#[from] super::frame::HeaderError),
    #[error("yamux protocol error: {0}")]
    Protocol(String),
    #[error("peer sent GoAway with code {0}")]
    GoAway(u32),
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut r: R,
    inner: &Arc<Inner>,
    incoming: mpsc::UnboundedSender<Stream>,
) -> Result<(), ReadError> {
    let mut hdr = [0u8; 12];
    loop {
        match r.read_exact(&mut hdr).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let h = match Header::decode(&hdr) {
            Ok(h) => h,
            Err(e) => {
                inner.go_away(go_away::PROTOCOL_ERROR);
                return Err(e.into());
            }
        };
        match h.ty {
            FrameType::Ping => {
                if h.has(flags::SYN) {
                    inner.send(
                        Header::new(FrameType::Ping, flags::ACK, 0, h.length),
                        Bytes::new(),
                    )?;
                }
            }
            FrameType::GoAway => return Err(ReadError::GoAway(h.length)),
            FrameType::Data | FrameType::WindowUpdate => {
                let payload = if h.ty == FrameType::Data && h.length > 0 {
                    if h.length > INITIAL_WINDOW {
                        inner.go_away(go_away::PROTOCOL_ERROR);
                        return Err(ReadError::Protocol(format!(
                            "data frame of {} bytes exceeds any window",
                            h.length
                        )));
                    }
                    let mut p = vec![0u8; h.length as usize];
                    r.read_exact(&mut p).await?;
                    Bytes::from(p)
                } else {
                    Bytes::new()
                };
                handle_stream_frame(inner, &incoming, h, payload)?;
            }
        }
    }
}

fn handle_stream_frame(
    inner: &Arc<Inner>,
    incoming: &mpsc::UnboundedSender<Stream>,
    h: Header,
    payload: Bytes,
) -> Result<(), ReadError> {
    let mut stream = inner
        .streams
        .lock()
        .expect("streams lock")
        .get(&h.stream_id)
        .cloned();
    if h.has(flags::SYN) {
        if stream.is_some() || h.stream_id == 0 {
            inner.go_away(go_away::PROTOCOL_ERROR);
            return Err(ReadError::Protocol(format!(
                "duplicate or invalid SYN for stream {}",
                h.stream_id
            )));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(StreamShared {
            id: h.stream_id,
            send_window: Mutex::new(INITIAL_WINDOW),
            window_changed: Notify::new(),
            recv_window: Mutex::new(INITIAL_WINDOW),
            data: Mutex::new(Some(tx)),
            local_closed: Mutex::new(false),
            reset: Mutex::new(false),
        });
        inner
            .streams
            .lock()
            .expect("streams lock")
            .insert(h.stream_id, Arc::clone(&shared));
        // ACK at once: the host gives up on the whole session if a stream stays un-ACKed for 75 s.
        inner.send(
            Header::new(FrameType::WindowUpdate, flags::ACK, h.stream_id, 0),
            Bytes::new(),
        )?;
        let _ = incoming.send(Stream {
            shared: Arc::clone(&shared),
            inner: Arc::clone(inner),
            rx,
            unacked: 0,
        });
        stream = Some(shared);
    }
    let Some(s) = stream else {
        if h.ty == FrameType::Data && !payload.is_empty() {
            warn!(
                stream = h.stream_id,
                bytes = payload.len(),
                "yamux: data for an unknown stream discarded"
            );
        }
        return Ok(());
    };
    match h.ty {
        FrameType::WindowUpdate => {
            let mut w = s.send_window.lock().expect("window lock");
            *w = w.saturating_add(h.length);
            drop(w);
            s.window_changed.notify_waiters();
        }
        FrameType::Data if !payload.is_empty() => {
            let mut w = s.recv_window.lock().expect("window lock");
            if payload.len() as u32 > *w {
                drop(w);
                inner.go_away(go_away::PROTOCOL_ERROR);
                return Err(ReadError::Protocol(format!(
                    "stream {} exceeded its receive window",
                    s.id
                )));
            }
            *w -= payload.len() as u32;
            drop(w);
            if let Some(tx) = s.data.lock().expect("data lock").as_ref() {
                let _ = tx.send(payload);
            }
        }
        _ => {}
    }
    if h.has(flags::RST) {
        *s.reset.lock().expect("reset lock") = true;
        s.data.lock().expect("data lock").take();
        s.window_changed.notify_waiters();
        inner.streams.lock().expect("streams lock").remove(&s.id);
    } else if h.has(flags::FIN) {
        s.data.lock().expect("data lock").take();
        if *s.local_closed.lock().expect("closed lock") {
            inner.streams.lock().expect("streams lock").remove(&s.id);
        }
    }
    Ok(())
}

// === impl Stream ===

impl Stream {
    /// The stream id (odd: opened by the host).
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// The next chunk of data; `None` once the peer closed (FIN/RST) or the session ended.
    ///
    /// Consumed bytes are granted back to the peer once half the window is used, like Go's yamux.
    pub async fn read(&mut self) -> Option<Bytes> {
        let chunk = self.rx.recv().await?;
        self.unacked += chunk.len() as u32;
        if self.unacked >= INITIAL_WINDOW / 2 {
            let delta = std::mem::take(&mut self.unacked);
            *self.shared.recv_window.lock().expect("window lock") += delta;
            let _ = self.inner.send(
                Header::new(FrameType::WindowUpdate, 0, self.shared.id, delta),
                Bytes::new(),
            );
        }
        Some(chunk)
    }

    /// A handle for writing to this stream.
    pub fn writer(&self) -> StreamWriter {
        StreamWriter {
            shared: Arc::clone(&self.shared),
            inner: Arc::clone(&self.inner),
        }
    }
}

// === impl StreamWriter ===

impl StreamWriter {
    /// Sends `data`, waiting for window credit from the peer as needed.
    pub async fn write(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let notified = self.shared.window_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if *self.shared.reset.lock().expect("reset lock") {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "yamux stream was reset",
                ));
            }
            if *self.shared.local_closed.lock().expect("closed lock") {
                return Err(io::Error::new(
                    io::ErrorKind::BrokenPipe,
                    "yamux stream is closed",
                ));
            }
            let n = {
                let mut w = self.shared.send_window.lock().expect("window lock");
                let n = (*w as usize).min(data.len());
                *w -= n as u32;
                n
            };
            if n == 0 {
                notified.await;
                continue;
            }
            self.inner.send(
                Header::new(FrameType::Data, 0, self.shared.id, n as u32),
                Bytes::copy_from_slice(&data[..n]),
            )?;
            data = &data[n..];
        }
        Ok(())
    }

    /// Half-closes the stream (FIN). Further writes fail.
    pub fn close(&self) {
        let mut closed = self.shared.local_closed.lock().expect("closed lock");
        if std::mem::replace(&mut *closed, true) {
            return;
        }
        drop(closed);
        let _ = self.inner.send(
            Header::new(FrameType::WindowUpdate, flags::FIN, self.shared.id, 0),
            Bytes::new(),
        );
        if self.shared.data.lock().expect("data lock").is_none() {
            self.inner
                .streams
                .lock()
                .expect("streams lock")
                .remove(&self.shared.id);
        }
        self.shared.window_changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
