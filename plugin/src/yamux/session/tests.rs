//! Session tests against a hand-driven yamux client that behaves like hashicorp/yamux's.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::super::frame::{flags, FrameType, Header, INITIAL_WINDOW};
use super::Session;

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
    let (a, b) = tokio::io::duplex(1 << 20);
    (Session::server(a), Client { io: b })
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
    client.open(1).await;
    client.recv().await;
    let mut stream = session.accept().await.unwrap();
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
    client.open(1).await;
    client.recv().await;
    let stream = session.accept().await.unwrap();
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
    client.open(1).await;
    client.recv().await;
    let mut stream = session.accept().await.unwrap();
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
    client.open(1).await;
    client.recv().await;
    let stream = session.accept().await.unwrap();
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
    client.open(1).await;
    client.recv().await;
    let mut stream = session.accept().await.unwrap();
    drop(client);
    assert!(stream.read().await.is_none());
    assert!(session.accept().await.is_none());
    tokio::time::timeout(Duration::from_secs(5), session.closed())
        .await
        .unwrap();
}
