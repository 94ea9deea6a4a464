//! Fuzz the yamux session from the wire: arbitrary bytes are what the host sends, while an
//! application accepts streams, reads, echoes, closes or drops them. The session must answer or
//! refuse every frame and wind down at EOF — never panic, hang or hold more than its limits.
//!
//! Input: byte 0 picks the application's behaviour, byte 1 how the bytes are fed (chunk size and
//! connection buffer), the rest is the host's byte stream. Time is paused (tokio test-util), so a
//! session that stops making progress trips the one-hour virtual deadline at once: a hang is a
//! panic here, not a libFuzzer timeout.
#![no_main]

use std::time::Duration;

use dispatch_plugin::yamux::{Session, Stream, INITIAL_WINDOW};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Application behaviour bits (byte 0).
const ECHO: u8 = 0x01;
const CLOSE_AFTER_FIRST_READ: u8 = 0x02;
const NEVER_ACCEPT: u8 = 0x04;
const DROP_ON_ACCEPT: u8 = 0x08;
const FLUSH: u8 = 0x10;
const STOP_READING_AFTER_FIRST: u8 = 0x20;

/// The yamux ACK flag.
const ACK: u16 = 0x2;

fuzz_target!(|data: &[u8]| {
    let [mode, feed, ref wire @ ..] = *data else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(3600), run(mode, feed, wire))
            .await
            .expect("the yamux session hung");
    });
});

async fn run(mode: u8, feed: u8, wire: &[u8]) {
    let chunk = 1 + usize::from(feed & 0x0f) * 97;
    let buffer = if feed & 0x10 != 0 { 64 } else { 64 * 1024 };
    let (server, client) = tokio::io::duplex(buffer);
    let mut session = Session::server(server);
    let (mut client_read, mut client_write) = tokio::io::split(client);

    // The host reads everything the session writes, until the session ends, and checks that it
    // is well-formed yamux from a server: valid headers, bounded data frames, odd stream ids.
    let drain = tokio::spawn(async move {
        let mut hdr = [0u8; 12];
        let mut payload = Vec::new();
        while client_read.read_exact(&mut hdr).await.is_ok() {
            let (version, ty) = (hdr[0], hdr[1]);
            let flags = u16::from_be_bytes([hdr[2], hdr[3]]);
            let stream = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
            let length = u32::from_be_bytes([hdr[8], hdr[9], hdr[10], hdr[11]]);
            assert_eq!(version, 0, "frame version");
            match ty {
                0 | 1 => {
                    assert!(
                        stream % 2 == 1,
                        "frame for stream {stream}: not one the host opened"
                    );
                    if ty == 0 {
                        assert!(length <= INITIAL_WINDOW, "data frame of {length} bytes");
                        payload.resize(length as usize, 0);
                        if client_read.read_exact(&mut payload).await.is_err() {
                            break;
                        }
                    }
                }
                2 => assert_eq!((flags, stream), (ACK, 0), "we only answer pings"),
                3 => assert!(length <= 2, "GoAway code {length}"),
                _ => panic!("frame type {ty}"),
            }
        }
    });

    // The host writes its bytes, then closes its side, unless the session ended first.
    let wire = wire.to_vec();
    let closed = session.closed();
    let feeder = tokio::spawn(async move {
        let write_all = async {
            for piece in wire.chunks(chunk) {
                if client_write.write_all(piece).await.is_err() {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::select! {
            () = write_all => {}
            () = closed => {}
        }
        let _ = client_write.shutdown().await;
    });

    let mut apps = Vec::new();
    if mode & NEVER_ACCEPT == 0 {
        while let Some(stream) = session.accept().await {
            if mode & DROP_ON_ACCEPT != 0 {
                continue;
            }
            apps.push(tokio::spawn(app(stream, mode)));
            if mode & FLUSH != 0 {
                session.flush().await;
            }
        }
    } else {
        session.closed().await;
    }
    assert!(
        session.close_reason().map_or(true, |r| !r.is_empty()),
        "an empty close reason"
    );
    drop(session);
    feeder.await.expect("feeder");
    for a in apps {
        a.await.expect("application task");
    }
    drain.await.expect("drain");
}

/// One stream's application: reads until the host closes, echoing if asked.
async fn app(mut stream: Stream, mode: u8) {
    let writer = stream.writer();
    let mut reads = 0usize;
    while let Some(chunk) = stream.read().await {
        reads += 1;
        if mode & ECHO != 0 && writer.write(&chunk).await.is_err() {
            break;
        }
        if mode & CLOSE_AFTER_FIRST_READ != 0 {
            writer.close();
        }
        if mode & STOP_READING_AFTER_FIRST != 0 && reads == 1 {
            // Leave the rest unread: the host's window runs out, the session must not wait on us.
            return;
        }
    }
    writer.close();
    // Writing after close fails cleanly.
    assert!(writer.write(b"x").await.is_err());
}
