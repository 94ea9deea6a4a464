//! net/rpc over a real yamux session with a hand-driven client: concurrency, `Seq` matching and
//! error replies that leave the connection usable. (The Go conformance suite covers the same path
//! with Go's own client; this keeps the loop fast.)

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::{
    ready, serve_stream, unknown_method, Body, Reply, ReplyFuture, Request, Response, Service,
};
use crate::gob::{self, Decoder, Empty, Encoder};
use crate::yamux::Session;

/// `Test.Sleep(ms u64) -> u64`: answers after `ms` milliseconds with `ms`.
struct Sleeper;

impl Service for Sleeper {
    fn name(&self) -> &str {
        "Test"
    }

    fn call(&self, method: &str, body: Body<'_>) -> Result<ReplyFuture, gob::Error> {
        match method {
            "Sleep" => {
                let ms: u64 = body.decode()?;
                Ok(Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    Reply::ok(ms)
                }))
            }
            "Fail" => {
                body.skip()?;
                Ok(ready(Reply::error("it failed")))
            }
            _ => unknown_method(&format!("Test.{method}"), body),
        }
    }
}

struct Client {
    io: DuplexStream,
    enc: Encoder,
    dec: Decoder,
    inbound: BytesMut,
}

impl Client {
    async fn start() -> Self {
        let (a, b) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let mut session = Session::server(a);
            let stream = session.accept().await.unwrap();
            serve_stream(
                stream,
                Arc::from(vec![Arc::new(Sleeper) as Arc<dyn Service>]),
                BytesMut::new(),
            )
            .await;
        });
        let mut c = Client {
            io: b,
            enc: Encoder::new(),
            dec: Decoder::new(),
            inbound: BytesMut::new(),
        };
        c.frame(1, 1, &[]).await; // WindowUpdate SYN: open stream 1
        c
    }

    async fn frame(&mut self, ty: u8, flags: u16, payload: &[u8]) {
        let mut h = vec![0, ty];
        h.extend_from_slice(&flags.to_be_bytes());
        h.extend_from_slice(&1u32.to_be_bytes());
        h.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        self.io.write_all(&h).await.unwrap();
        self.io.write_all(payload).await.unwrap();
    }

    async fn call<T: gob::GobEncode>(&mut self, method: &str, seq: u64, arg: &T) {
        let mut out = Vec::new();
        self.enc.encode(
            &Request {
                service_method: method.into(),
                seq,
            },
            &mut out,
        );
        self.enc.encode(arg, &mut out);
        self.frame(0, 0, &out).await;
    }

    /// The next reply: its header and, when it succeeded, its u64 body.
    async fn reply(&mut self) -> (Response, Option<u64>) {
        loop {
            if let Ok(resp) = self.dec.decode::<Response>(&mut self.inbound) {
                let body = if resp.error.is_empty() {
                    Some(self.next_value::<u64>().await)
                } else {
                    self.next_value::<Empty>().await;
                    None
                };
                return (resp, body);
            }
            self.read_frame().await;
        }
    }

    async fn next_value<T: gob::GobDecode>(&mut self) -> T {
        loop {
            match self.dec.decode::<T>(&mut self.inbound) {
                Ok(v) => return v,
                Err(gob::Error::Incomplete) => self.read_frame().await,
                Err(e) => panic!("bad reply body: {e}"),
            }
        }
    }

    async fn read_frame(&mut self) {
        let mut h = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(5), self.io.read_exact(&mut h))
            .await
            .expect("reply in time")
            .unwrap();
        let len = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
        if h[1] == 0 {
            let mut p = vec![0; len];
            self.io.read_exact(&mut p).await.unwrap();
            self.inbound.extend_from_slice(&p);
        }
    }
}

#[tokio::test]
async fn concurrent_calls_are_answered_as_they_finish_and_matched_by_seq() {
    let mut c = Client::start().await;
    c.call("Test.Sleep", 0, &300u64).await;
    c.call("Test.Sleep", 1, &10u64).await;
    let (first, body) = c.reply().await;
    assert_eq!((first.seq, body), (1, Some(10)));
    let (second, body) = c.reply().await;
    assert_eq!(
        (second.seq, second.service_method.as_str(), body),
        (0, "Test.Sleep", Some(300))
    );
}

#[tokio::test]
async fn errors_get_replies_and_the_connection_lives_on() {
    let mut c = Client::start().await;
    let cases: [(&str, &str); 4] = [
        ("Test.Nope", "rpc: can't find method Test.Nope"),
        ("Other.Call", "rpc: can't find service Other.Call"),
        ("NoDot", "rpc: service/method request ill-formed: NoDot"),
        ("Test.Fail", "it failed"),
    ];
    for (seq, (method, want)) in cases.iter().enumerate() {
        c.call(method, seq as u64, &true).await;
        let (resp, body) = c.reply().await;
        assert_eq!(
            (resp.seq, resp.error.as_str(), body),
            (seq as u64, *want, None)
        );
    }
    // Arguments of the wrong type: an error naming the call, then business as usual.
    c.call("Test.Sleep", 10, &"not a number".to_string()).await;
    let (resp, _) = c.reply().await;
    assert!(
        resp.error
            .contains("cannot decode the arguments of Test.Sleep"),
        "{}",
        resp.error
    );
    c.call("Test.Sleep", 11, &1u64).await;
    assert_eq!(c.reply().await.1, Some(1));
}
