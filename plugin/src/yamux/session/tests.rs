//! Session tests against a hand-driven yamux client that behaves like hashicorp/yamux's.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::frame::{flags, FrameType, Header, INITIAL_WINDOW};
use super::{Session, Stream, MAX_DATA_FRAME, MAX_QUEUED_BYTES, MAX_STREAMS, WRITE_STALL_TIMEOUT};

struct Client {
    io: DuplexStream,
}

impl Client {
    async fn send(&mut self, ty: FrameType, flags: u16, id: u32, length: u32, payload: &[u8]) {
        self.io
            .write_all(&Header::new(ty, flags, id, length).encode())
            .await
            .unwrap();
        self.io.write_all(payload).await.unwrap();
    }

    async fn open(&mut self, id: u32) {
        self.send(FrameType::WindowUpdate, flags::SYN, id, 0, &[])
            .await;
    }

    async fn data(&mut self, id: u32, payload: &[u8]) {
        self.send(FrameType::Data, 0, id, payload.len() as u32, payload)
            .await;
    }

    async fn recv(&mut self) -> (Header, Vec<u8>) {
        let mut hdr = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), self.io.read_exact(&mut hdr))
            .await
            .expect("a frame in time")
            .unwrap();
        let h = Header::decode(&hdr).unwrap();
        let mut payload = vec![
            0;
            if h.ty == FrameType::Data {
                h.length as usize
            } else {
                0
            }
        ];
        self.io.read_exact(&mut payload).await.unwrap();
        (h, payload)
    }
}

fn pair() -> (Session, Client) {
    pair_with_buffer(1 << 20)
}

/// A session whose connection buffers at most `buffer` bytes in each direction.
fn pair_with_buffer(buffer: usize) -> (Session, Client) {
    let (a, b) = tokio::io::duplex(buffer);
    (Session::server(a), Client { io: b })
}

/// The host opens stream 1; the session ACKs it and the application accepts it.
async fn accept_stream_one(session: &mut Session, client: &mut Client) -> Stream {
    client.open(1).await;
    client.recv().await;
    session.accept().await.unwrap()
}

/// The host grants stream 1 the largest send window yamux can express (u32::MAX).
async fn grant_max_window(client: &mut Client) {
    client
        .send(
            FrameType::WindowUpdate,
            0,
            1,
            u32::MAX - INITIAL_WINDOW,
            &[],
        )
        .await;
}

/// Waits for the GoAway that ends the session, and the end itself; returns the reason.
async fn expect_protocol_error(session: &Session, client: &mut Client) -> String {
    loop {
        let (h, _) = client.recv().await;
        if h.ty == FrameType::GoAway {
            assert_eq!(h.length, 1, "GoAway code: protocol error");
            break;
        }
    }
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .expect("the session ends after a protocol error");
    session.close_reason().expect("a close reason")
}

#[tokio::test]
async fn every_stream_is_acked_on_arrival_even_if_never_used() {
    let (mut session, mut client) = pair();
    for id in [1, 3, 5] {
        client.open(id).await;
    }
    for id in [1, 3, 5] {
        let (h, _) = client.recv().await;
        assert_eq!(
            (h.ty, h.flags, h.stream_id, h.length),
            (FrameType::WindowUpdate, flags::ACK, id, 0)
        );
    }
    for id in [1, 3, 5] {
        assert_eq!(session.accept().await.unwrap().id(), id);
    }
}

#[tokio::test]
async fn pings_are_answered_while_the_application_is_busy() {
    let (_session, mut client) = pair();
    client.open(1).await;
    client.data(1, b"nobody reads this").await;
    client.recv().await; // ACK
    client.send(FrameType::Ping, flags::SYN, 0, 42, &[]).await;
    let (h, _) = client.recv().await;
    assert_eq!(
        (h.ty, h.flags, h.stream_id, h.length),
        (FrameType::Ping, flags::ACK, 0, 42)
    );
}

#[tokio::test]
async fn receive_window_is_granted_back_as_data_is_consumed() {
    let (mut session, mut client) = pair();
    let mut stream = accept_stream_one(&mut session, &mut client).await;
    let chunk = vec![7u8; 64 * 1024];
    for _ in 0..4 {
        client.data(1, &chunk).await; // exactly the initial window
    }
    let mut got = 0;
    while got < INITIAL_WINDOW as usize {
        got += stream.read().await.unwrap().len();
    }
    let mut granted = 0;
    while granted < INITIAL_WINDOW {
        let (h, _) = client.recv().await;
        assert_eq!((h.ty, h.stream_id), (FrameType::WindowUpdate, 1));
        granted += h.length;
    }
    assert_eq!(granted, INITIAL_WINDOW);
    // The granted credit can be used: a fifth chunk is accepted.
    client.data(1, &chunk).await;
    assert_eq!(stream.read().await.unwrap().len(), chunk.len());
}

#[tokio::test]
async fn exceeding_the_window_is_a_protocol_error() {
    let (session, mut client) = pair();
    client.open(1).await;
    client.recv().await;
    let chunk = vec![0u8; 128 * 1024];
    for _ in 0..3 {
        client.data(1, &chunk).await;
    }
    let (h, _) = client.recv().await;
    assert_eq!((h.ty, h.length), (FrameType::GoAway, 1));
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();
}

#[tokio::test]
async fn writes_wait_for_send_window_credit() {
    let (mut session, mut client) = pair();
    let stream = accept_stream_one(&mut session, &mut client).await;
    let writer = stream.writer();
    let big = vec![1u8; INITIAL_WINDOW as usize + 1000];
    let write = tokio::spawn(async move { writer.write(&big).await });
    let mut got = 0usize;
    while got < INITIAL_WINDOW as usize {
        let (h, p) = client.recv().await;
        assert_eq!(h.ty, FrameType::Data);
        got += p.len();
    }
    assert_eq!(
        got, INITIAL_WINDOW as usize,
        "no more than the window before credit"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!write.is_finished());
    client.send(FrameType::WindowUpdate, 0, 1, 4096, &[]).await;
    let (h, p) = client.recv().await;
    assert_eq!((h.ty, p.len()), (FrameType::Data, 1000));
    write.await.unwrap().unwrap();
}

#[tokio::test]
async fn fin_ends_reads_and_close_sends_fin() {
    let (mut session, mut client) = pair();
    let mut stream = accept_stream_one(&mut session, &mut client).await;
    client.data(1, b"last words").await;
    client
        .send(FrameType::WindowUpdate, flags::FIN, 1, 0, &[])
        .await;
    assert_eq!(&stream.read().await.unwrap()[..], b"last words");
    assert!(stream.read().await.is_none());
    stream.writer().close();
    let (h, _) = client.recv().await;
    assert_eq!(
        (h.ty, h.flags, h.stream_id),
        (FrameType::WindowUpdate, flags::FIN, 1)
    );
}

#[tokio::test]
async fn rst_fails_pending_writes() {
    let (mut session, mut client) = pair();
    let stream = accept_stream_one(&mut session, &mut client).await;
    let writer = stream.writer();
    let big = vec![1u8; INITIAL_WINDOW as usize * 2];
    let write = tokio::spawn(async move { writer.write(&big).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    client
        .send(FrameType::WindowUpdate, flags::RST, 1, 0, &[])
        .await;
    assert!(write.await.unwrap().is_err());
}

#[tokio::test]
async fn duplicate_syn_and_bad_frames_end_the_session() {
    let (session, mut client) = pair();
    client.open(1).await;
    client.recv().await;
    client.open(1).await;
    let (h, _) = client.recv().await;
    assert_eq!((h.ty, h.length), (FrameType::GoAway, 1));
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();

    let (session, mut client) = pair();
    client.io.write_all(&[9; 12]).await.unwrap();
    let (h, _) = client.recv().await;
    assert_eq!(h.ty, FrameType::GoAway);
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();
}

#[tokio::test]
async fn eof_closes_the_session_and_its_streams() {
    let (mut session, mut client) = pair();
    let mut stream = accept_stream_one(&mut session, &mut client).await;
    drop(client);
    assert!(stream.read().await.is_none());
    assert!(session.accept().await.is_none());
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();
}

#[tokio::test]
async fn streams_beyond_the_limit_are_refused_with_rst_and_the_session_lives_on() {
    let (mut session, mut client) = pair();
    let ids: Vec<u32> = (0..MAX_STREAMS as u32).map(|i| 2 * i + 1).collect();
    for &id in &ids {
        client.open(id).await;
        let (h, _) = client.recv().await;
        assert_eq!((h.flags, h.stream_id), (flags::ACK, id));
    }
    let over = 2 * MAX_STREAMS as u32 + 1;
    client.open(over).await;
    let (h, _) = client.recv().await;
    assert_eq!(
        (h.ty, h.flags, h.stream_id),
        (FrameType::WindowUpdate, flags::RST, over),
        "stream {} of {MAX_STREAMS} allowed is refused",
        MAX_STREAMS + 1
    );
    // Data for the refused stream is dropped; the session still answers pings.
    client.data(over, b"ignored").await;
    client.send(FrameType::Ping, flags::SYN, 0, 7, &[]).await;
    let (h, _) = client.recv().await;
    assert_eq!((h.ty, h.flags, h.length), (FrameType::Ping, flags::ACK, 7));
    // Once a stream is done on both sides, there is room for a new one.
    let first = session.accept().await.unwrap();
    first.writer().close();
    client.recv().await; // our FIN
    client
        .send(FrameType::WindowUpdate, flags::FIN, first.id(), 0, &[])
        .await;
    client.open(over + 2).await;
    let (h, _) = client.recv().await;
    assert_eq!((h.flags, h.stream_id), (flags::ACK, over + 2));
}

#[tokio::test]
async fn unaccepted_streams_are_capped_even_when_the_host_resets_them() {
    // Streams that are opened and reset at once leave the stream table, but still wait in the
    // accept backlog: without a cap there, a host could make it grow without end.
    let (mut session, mut client) = pair();
    let mut id = 1;
    for _ in 0..MAX_STREAMS {
        client.open(id).await;
        client
            .send(FrameType::WindowUpdate, flags::RST, id, 0, &[])
            .await;
        let (h, _) = client.recv().await;
        assert_eq!((h.flags, h.stream_id), (flags::ACK, id));
        id += 2;
    }
    client.open(id).await;
    let (h, _) = client.recv().await;
    assert_eq!(
        (h.flags, h.stream_id),
        (flags::RST, id),
        "the backlog is full"
    );
    // Accepting one makes room for one more.
    let reset = session.accept().await.unwrap();
    assert_eq!(reset.id(), 1);
    id += 2;
    client.open(id).await;
    let (h, _) = client.recv().await;
    assert_eq!((h.flags, h.stream_id), (flags::ACK, id));
}

#[tokio::test]
async fn a_reset_stream_id_cannot_be_reused() {
    let (mut session, mut client) = pair();
    client.open(3).await;
    client.recv().await;
    let old = session.accept().await.unwrap();
    client
        .send(FrameType::WindowUpdate, flags::RST, 3, 0, &[])
        .await;
    // Reopening id 3 would let the old stream's writer talk on the new one (and the old stream's
    // close drop the new one's entry): refused as a protocol error.
    client.open(3).await;
    let reason = expect_protocol_error(&session, &mut client).await;
    assert!(reason.contains("stream ids must grow"), "{reason}");
    assert!(old.writer().write(b"late").await.is_err());
}

#[tokio::test]
async fn stream_ids_must_grow_and_be_odd() {
    let (session, mut client) = pair();
    client.open(5).await;
    client.recv().await;
    client.open(3).await;
    let reason = expect_protocol_error(&session, &mut client).await;
    assert!(reason.contains("highest opened so far: 5"), "{reason}");

    let (session, mut client) = pair();
    client.open(2).await;
    let reason = expect_protocol_error(&session, &mut client).await;
    assert!(reason.contains("only odd ids"), "{reason}");

    let (session, mut client) = pair();
    client.open(0).await;
    let reason = expect_protocol_error(&session, &mut client).await;
    assert!(reason.contains("SYN for stream 0"), "{reason}");
}

#[tokio::test]
async fn an_overflowing_window_update_is_a_protocol_error() {
    let (mut session, mut client) = pair();
    let _stream = accept_stream_one(&mut session, &mut client).await;
    // Up to u32::MAX is accepted …
    grant_max_window(&mut client).await;
    client.send(FrameType::Ping, flags::SYN, 0, 1, &[]).await;
    let (h, _) = client.recv().await;
    assert_eq!(h.ty, FrameType::Ping, "still alive at a window of u32::MAX");
    // … one byte more is not.
    client.send(FrameType::WindowUpdate, 0, 1, 1, &[]).await;
    let reason = expect_protocol_error(&session, &mut client).await;
    assert!(reason.contains("overflows its send window"), "{reason}");
}

#[tokio::test]
async fn a_huge_window_still_sends_bounded_frames() {
    let (mut session, mut client) = pair();
    let stream = accept_stream_one(&mut session, &mut client).await;
    grant_max_window(&mut client).await;
    let data = vec![3u8; 3 * MAX_DATA_FRAME as usize + 10];
    let writer = stream.writer();
    let write = tokio::spawn({
        let data = data.clone();
        async move { writer.write(&data).await }
    });
    let mut got = Vec::new();
    while got.len() < data.len() {
        let (h, p) = client.recv().await;
        assert_eq!(h.ty, FrameType::Data);
        assert!(h.length <= MAX_DATA_FRAME, "frame of {} bytes", h.length);
        got.extend_from_slice(&p);
    }
    assert_eq!(got, data);
    write.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_host_that_pings_without_reading_is_throttled_then_dropped() {
    // The connection buffers 64 KiB each way; the host floods pings and never reads the answers.
    let (session, client) = pair_with_buffer(64 * 1024);
    let (_client_read, mut client_write) = tokio::io::split(client.io);
    let mut ping = Vec::new();
    for i in 0..1024u32 {
        ping.extend_from_slice(&Header::new(FrameType::Ping, flags::SYN, 0, i).encode());
    }
    let flood = 8 * MAX_QUEUED_BYTES;
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flooding = tokio::spawn({
        let written = std::sync::Arc::clone(&written);
        async move {
            while written.load(std::sync::atomic::Ordering::Relaxed) < flood {
                if client_write.write_all(&ping).await.is_err() {
                    return;
                }
                written.fetch_add(ping.len(), std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let taken = written.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        taken < 2 * MAX_QUEUED_BYTES,
        "the session kept reading pings it could not answer: {taken} bytes taken"
    );
    assert!(!flooding.is_finished(), "the host is made to wait");
    // A host that stays stuck is given up on.
    tokio::time::timeout(
        WRITE_STALL_TIMEOUT + Duration::from_secs(5),
        session.closed(),
    )
    .await
    .expect("the session ends once the host stalls too long");
    let reason = session.close_reason().unwrap();
    assert!(reason.contains("stopped reading"), "{reason}");
    flooding.abort();
}

#[tokio::test(start_paused = true)]
async fn writes_wait_for_the_connection_whatever_the_window() {
    let (mut session, mut client) = pair_with_buffer(64 * 1024);
    let stream = accept_stream_one(&mut session, &mut client).await;
    grant_max_window(&mut client).await;
    let writer = stream.writer();
    let total = 8 * MAX_QUEUED_BYTES;
    let write = tokio::spawn(async move { writer.write(&vec![9u8; total]).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !write.is_finished(),
        "8 MiB cannot be queued for a host that does not read"
    );
    // The host reads: everything arrives and the write completes.
    let mut got = 0;
    while got < total {
        let (h, p) = client.recv().await;
        assert_eq!(h.ty, FrameType::Data);
        got += p.len();
    }
    write.await.unwrap().unwrap();
}
