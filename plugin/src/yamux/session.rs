//! The yamux session: a frame reader task, a frame writer task and the per-stream state.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tracing::{debug, warn};

use super::frame::{flags, go_away, FrameType, Header, INITIAL_WINDOW};

/// Most streams a session keeps at once, counting every stream from its SYN until both sides have
/// closed it (or either reset it), and most streams waiting in [`Session::accept`]'s backlog.
///
/// A SYN beyond either limit is refused with RST and the session goes on, as hashicorp/yamux does
/// when its accept backlog (256) is full. go-plugin opens three streams plus one per dispensed
/// plugin, so a host never comes near; the limit bounds what a runaway peer can make us hold
/// (each stream may buffer up to [`INITIAL_WINDOW`] of unread data).
pub const MAX_STREAMS: usize = 256;

/// Most bytes (headers and payloads) queued for the connection and not yet written.
///
/// Above it the frame reader stops reading, so a peer that sends pings, SYNs or window updates
/// without reading the answers is slowed down to the pace it reads at instead of making us queue
/// answers without end; stream writes wait as well, whatever window the peer granted.
pub const MAX_QUEUED_BYTES: usize = 1 << 20;

/// How long the queue may stay above [`MAX_QUEUED_BYTES`] before the session gives up on a peer
/// that has stopped reading (hashicorp/yamux's keepalive would have failed by then too).
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest data frame we send: whatever window the peer grants, one frame never carries
/// more than a stream's initial window.
const MAX_DATA_FRAME: u32 = INITIAL_WINDOW;

/// The size of a frame header on the wire.
const HEADER_LEN: usize = 12;

enum WriterMsg {
    Frame(Header, Bytes),
    Flush(oneshot::Sender<()>),
}

/// State shared by the reader task, the writer handle and the stream owner.
struct Inner {
    writer: mpsc::UnboundedSender<WriterMsg>,
    queue: Arc<Queue>,
    streams: Mutex<HashMap<u32, Arc<StreamShared>>>,
    closed: watch::Sender<bool>,
    /// Why the frame reader stopped, when it stopped on an error.
    close_reason: Mutex<Option<String>>,
}

/// Accounting of what is queued for the writer task.
#[derive(Default)]
struct Queue {
    /// Bytes queued and not yet written.
    bytes: AtomicUsize,
    /// Notified whenever the writer has written a batch, and when it is gone.
    drained: Notify,
    /// The writer task has ended: nothing queued will be written any more.
    writer_gone: AtomicBool,
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
    incoming: mpsc::Receiver<Stream>,
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
        let queue = Arc::new(Queue::default());
        let inner = Arc::new(Inner {
            writer,
            queue: Arc::clone(&queue),
            streams: Mutex::new(HashMap::new()),
            closed,
            close_reason: Mutex::new(None),
        });
        let (incoming_tx, incoming) = mpsc::channel(MAX_STREAMS);
        tokio::spawn(write_frames(write, writer_rx, queue));
        tokio::spawn({
            let inner = Arc::clone(&inner);
            async move {
                match read_frames(read, &inner, incoming_tx).await {
                    Ok(()) => debug!("yamux session ended: the host closed the connection"),
                    Err(e) => {
                        if e.is_peer_misbehaving() {
                            warn!(error = %e, "yamux session ended");
                        } else {
                            debug!(error = %e, "yamux session ended");
                        }
                        *inner.close_reason.lock().expect("reason lock") = Some(e.to_string());
                    }
                }
                inner.shutdown();
            }
        });
        Self { inner, incoming }
    }

    /// Why the session ended, when it ended on an error (a protocol violation, a GoAway from the
    /// host, an I/O error, a host that stopped reading); `None` while it runs or after a clean EOF.
    pub fn close_reason(&self) -> Option<String> {
        self.inner.close_reason.lock().expect("reason lock").clone()
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
    /// Queues a frame for the writer task. Never waits: callers that may produce frames without
    /// end (the frame reader, stream writes) call [`Inner::wait_for_room`] first.
    fn send(&self, header: Header, payload: Bytes) -> io::Result<()> {
        let n = HEADER_LEN + payload.len();
        self.queue.bytes.fetch_add(n, Ordering::AcqRel);
        self.writer
            .send(WriterMsg::Frame(header, payload))
            .map_err(|_| {
                self.queue.bytes.fetch_sub(n, Ordering::AcqRel);
                io::Error::new(io::ErrorKind::BrokenPipe, "yamux session is closed")
            })
    }

    /// Whether more may be queued: the queue is below [`MAX_QUEUED_BYTES`], or queueing is moot
    /// (the writer or the session is gone; sends then fail on their own).
    fn has_room(&self) -> bool {
        self.queue.bytes.load(Ordering::Acquire) < MAX_QUEUED_BYTES
            || self.queue.writer_gone.load(Ordering::Acquire)
            || *self.closed.borrow()
    }

    /// Waits until [`Inner::has_room`].
    async fn wait_for_room(&self) {
        loop {
            let drained = self.queue.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.has_room() {
                return;
            }
            drained.await;
        }
    }

    /// Drops `s` from the stream table, unless its id already belongs to another stream.
    fn forget(&self, s: &Arc<StreamShared>) {
        let mut streams = self.streams.lock().expect("streams lock");
        if streams.get(&s.id).is_some_and(|t| Arc::ptr_eq(t, s)) {
            streams.remove(&s.id);
        }
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
        self.queue.drained.notify_waiters();
    }

    fn go_away(&self, code: u32) {
        let _ = self.send(Header::new(FrameType::GoAway, 0, 0, code), Bytes::new());
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    w: W,
    rx: mpsc::UnboundedReceiver<WriterMsg>,
    queue: Arc<Queue>,
) {
    write_queued(w, rx, &queue).await;
    queue.writer_gone.store(true, Ordering::Release);
    queue.drained.notify_waiters();
}

async fn write_queued<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<WriterMsg>,
    queue: &Queue,
) {
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
            queue.bytes.fetch_sub(buf.len(), Ordering::AcqRel);
            queue.drained.notify_waiters();
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
    #[error(
        "the host stopped reading: more than {MAX_QUEUED_BYTES} bytes stayed queued for it for {}s",
        WRITE_STALL_TIMEOUT.as_secs()
    )]
    Stalled,
}

impl ReadError {
    /// Errors worth a warning: the peer broke the protocol or stopped reading.
    fn is_peer_misbehaving(&self) -> bool {
        matches!(self, Self::Header(_) | Self::Protocol(_) | Self::Stalled)
    }
}

/// What the frame reader remembers between frames.
#[derive(Default)]
struct ReaderState {
    /// The highest stream id opened so far: ids only grow, so a reset id is never reused.
    last_opened: u32,
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut r: R,
    inner: &Arc<Inner>,
    incoming: mpsc::Sender<Stream>,
) -> Result<(), ReadError> {
    let mut hdr = [0u8; HEADER_LEN];
    let mut state = ReaderState::default();
    loop {
        // Backpressure: while the host leaves our answers unread, leave its frames unread.
        if !inner.has_room()
            && tokio::time::timeout(WRITE_STALL_TIMEOUT, inner.wait_for_room())
                .await
                .is_err()
        {
            return Err(ReadError::Stalled);
        }
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
                handle_stream_frame(inner, &incoming, &mut state, h, payload)?;
            }
        }
    }
}

fn protocol_error(inner: &Inner, message: String) -> ReadError {
    inner.go_away(go_away::PROTOCOL_ERROR);
    ReadError::Protocol(message)
}

fn handle_stream_frame(
    inner: &Arc<Inner>,
    incoming: &mpsc::Sender<Stream>,
    state: &mut ReaderState,
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
        if h.stream_id.is_multiple_of(2) {
            return Err(protocol_error(
                inner,
                format!(
                    "SYN for stream {}: only odd ids may be opened by the host (the yamux client)",
                    h.stream_id
                ),
            ));
        }
        if stream.is_some() || h.stream_id <= state.last_opened {
            return Err(protocol_error(
                inner,
                format!(
                    "SYN for stream {}, but stream ids must grow (highest opened so far: {}): a \
                     duplicate, or the reuse of a closed or reset stream",
                    h.stream_id, state.last_opened
                ),
            ));
        }
        state.last_opened = h.stream_id;
        let open = inner.streams.lock().expect("streams lock").len();
        let permit = match incoming.try_reserve() {
            Ok(permit) if open < MAX_STREAMS => permit,
            _ => {
                warn!(
                    stream = h.stream_id,
                    open,
                    "yamux: refusing a stream (RST): {MAX_STREAMS} streams open or waiting to be accepted already"
                );
                inner.send(
                    Header::new(FrameType::WindowUpdate, flags::RST, h.stream_id, 0),
                    Bytes::new(),
                )?;
                return Ok(());
            }
        };
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
        permit.send(Stream {
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
            let Some(grown) = w.checked_add(h.length) else {
                let window = *w;
                drop(w);
                return Err(protocol_error(
                    inner,
                    format!(
                        "window update of {} bytes for stream {} overflows its send window of {window} bytes",
                        h.length, s.id
                    ),
                ));
            };
            *w = grown;
            drop(w);
            s.window_changed.notify_waiters();
        }
        FrameType::Data if !payload.is_empty() => {
            let mut w = s.recv_window.lock().expect("window lock");
            if payload.len() as u32 > *w {
                let window = *w;
                drop(w);
                return Err(protocol_error(
                    inner,
                    format!(
                        "stream {} sent {} bytes, more than its receive window of {window} bytes",
                        s.id,
                        payload.len()
                    ),
                ));
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
        inner.forget(&s);
    } else if h.has(flags::FIN) {
        s.data.lock().expect("data lock").take();
        if *s.local_closed.lock().expect("closed lock") {
            inner.forget(&s);
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
    ///
    /// Also waits while more than [`MAX_QUEUED_BYTES`] are queued for the connection, so a peer
    /// that grants a huge window but does not read cannot make the session buffer without end.
    pub async fn write(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            self.inner.wait_for_room().await;
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
                let n = (*w).min(MAX_DATA_FRAME) as usize;
                let n = n.min(data.len());
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
            self.inner.forget(&self.shared);
        }
        self.shared.window_changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests;
