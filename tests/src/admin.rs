//! The plain-HTTP admin ports (`/ready`, `/metrics`) of the servers and agents the scenes start:
//! a minimal HTTP/1.1 GET, and the wait until one is ready.

use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::wait::{eventually, Progress};

/// How long a server or agent may take to become ready (its caches sync first).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// GET `path` on 127.0.0.1:`port`: the status and body, or `None` if nothing answers (yet).
pub async fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.ok()?;
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, body)| body.to_string());
    Some((status, body))
}

/// The body of GET `path`, or `None` if nothing answers.
pub async fn get_body(port: u16, path: &str) -> Option<String> {
    get(port, path).await.map(|(_, body)| body)
}

/// Waits up to [`READY_TIMEOUT`] until the admin port `admin` of `what` answers `/ready` with 200.
pub async fn wait_ready(what: &str, admin: u16) -> Result<()> {
    eventually(&format!("{what} ready"), READY_TIMEOUT, || async {
        Ok(match get(admin, "/ready").await {
            Some((200, _)) => Progress::Done(()),
            Some((status, body)) => Progress::Waiting(format!("/ready: {status} {body}")),
            None => Progress::Waiting(format!("nothing answers on admin port {admin}")),
        })
    })
    .await
}
