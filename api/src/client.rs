//! The HTTP client the plugin uses to reach the rollouts-dispatch server.
//!
//! Pure-Rust TLS (rustls with ring) and DNS (hickory): the plugin is a static binary in a
//! distroless image, where glibc's NSS resolver does not work. The bearer token is read from its
//! file on every request, because projected ServiceAccount tokens are rotated in place; the CA
//! file is read again when its content changes ([`trust`]), so a CA rotation needs no restart.
//!
//! A reply is read chunk by chunk and refused as soon as it exceeds the client's limit
//! ([`DEFAULT_MAX_REPLY_BYTES`], or [`ServerClient::with_max_reply_bytes`]): a broken server or
//! a man in the middle cannot make the plugin or the agent buffer an unbounded body.
//!
//! Plain `http://` is refused unless the host is loopback (`127.0.0.0/8`, `::1`, `localhost`) or
//! the caller passed `--insecure-plaintext` ([`ClientConfig::insecure_plaintext`]): the bearer
//! token, and for an agent the Jobs it will run, would otherwise cross the network in clear.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::v1::ApiError;

mod trust;
pub use trust::CA_CHECK_EVERY;

/// A request body, for [`ServerClient::post_stream`] (`Body::wrap_stream`: sent as it comes).
pub use reqwest::Body;

/// The largest reply body read by default: a verdict or a destination list is a few KiB.
pub const DEFAULT_MAX_REPLY_BYTES: usize = 1 << 20;

/// How to reach the server.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// base URL, e.g. `https://rollouts-dispatch.rollouts-dispatch.svc:8443`
    pub server: String,
    /// file holding the bearer token (re-read on every request)
    pub token_file: Option<PathBuf>,
    /// CA certificate(s) (PEM; every certificate of a bundle) to trust, e.g. the server's
    /// private CA; read again when its content changes (at most every [`CA_CHECK_EVERY`])
    pub ca_file: Option<PathBuf>,
    /// with `ca_file`: trust only that CA, not the system roots too (agents pin the server's
    /// CA: a certificate from any public CA for the server's name is not enough)
    pub ca_only: bool,
    /// allow `http://` to a host that is not loopback (`--insecure-plaintext`)
    pub insecure_plaintext: bool,
    /// per-request timeout
    pub timeout: Duration,
}

/// Why a call did not produce a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Worth retrying: the server could not be reached, timed out, or answered 5xx/429/401.
    #[error("{0}")]
    Transient(String),
    /// Worth retrying, but not before `retry_after`: the server is at a budget (`503` or `429`
    /// with `Retry-After`); the message names the budget and the flag that sizes it.
    #[error("{message}")]
    Busy {
        /// the server's message and the status
        message: String,
        /// the server's `Retry-After`
        retry_after: Duration,
    },
    /// The server refused the request for a reason that retrying will not fix.
    #[error("{}", .0.message)]
    Rejected(ApiError),
}

/// The plugin's configuration could not be turned into a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--server` is not an http(s) URL.
    #[error("--server {0:?} is not an http:// or https:// URL")]
    BadUrl(String),
    /// `--server` is plain HTTP to a host that is not loopback, without `--insecure-plaintext`.
    #[error(
        "--server {0:?} is plain HTTP to a host that is not loopback: the bearer token would \
         cross the network in clear. Use https:// (with --ca-file for a private CA), or pass \
         --insecure-plaintext (ROLLOUTS_DISPATCH_INSECURE_PLAINTEXT=true) when TLS ends in a \
         sidecar on both sides"
    )]
    Plaintext(String),
    /// `--ca-file` could not be read or parsed.
    #[error("--ca-file {path}: {reason}")]
    CaFile {
        /// the file
        path: PathBuf,
        /// what went wrong
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Build(String),
}

/// A client of the server's `/v1` API.
#[derive(Debug, Clone)]
pub struct ServerClient {
    /// the HTTP client, following the CA file; shared by clones
    trust: Arc<trust::Trust>,
    ca_check_every: Duration,
    base: String,
    token_file: Option<PathBuf>,
    max_reply_bytes: usize,
}

impl ServerClient {
    /// Builds a client; fails on a malformed URL or CA file.
    pub fn new(config: &ClientConfig) -> Result<Self, ClientError> {
        let base = config.server.trim_end_matches('/').to_string();
        let url = reqwest::Url::parse(&base)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
            .ok_or_else(|| ClientError::BadUrl(config.server.clone()))?;
        let plaintext = url.scheme() == "http";
        if plaintext && !config.insecure_plaintext && !is_loopback(&url) {
            return Err(ClientError::Plaintext(config.server.clone()));
        }
        let trust = trust::Trust::new(config, plaintext)?;
        Ok(Self {
            trust: Arc::new(trust),
            ca_check_every: CA_CHECK_EVERY,
            base,
            token_file: config.token_file.clone(),
            max_reply_bytes: DEFAULT_MAX_REPLY_BYTES,
        })
    }

    /// The same client, reading reply bodies of at most `max` bytes (default
    /// [`DEFAULT_MAX_REPLY_BYTES`]).
    #[must_use]
    pub fn with_max_reply_bytes(mut self, max: usize) -> Self {
        self.max_reply_bytes = max;
        self
    }

    /// The same client, looking at its CA file at most once per `every` (default
    /// [`CA_CHECK_EVERY`]; `Duration::MAX`: never again, when the caller rebuilds the client
    /// itself on a change).
    #[must_use]
    pub fn with_ca_check_every(mut self, every: Duration) -> Self {
        self.ca_check_every = every;
        self
    }

    /// The HTTP client of the next request: the one trusting the CA file as it is now.
    fn http(&self) -> reqwest::Client {
        self.trust.http(self.ca_check_every)
    }

    /// The description of a request that failed, with why a changed CA file is not trusted
    /// (a TLS failure after a broken rotation then says so).
    fn failed(&self, e: &reqwest::Error) -> CallError {
        // A connection that timed out may be half-open, or pinned to a replica that is gone:
        // the next call opens a new one (through a Service: to a ready replica).
        self.trust.reconnect();
        let mut message = describe(e, &self.base);
        if let Some(problem) = self.trust.problem() {
            message = format!("{message}; {problem}");
        }
        CallError::Transient(message)
    }

    /// The server's base URL.
    pub fn server(&self) -> &str {
        &self.base
    }

    /// `POST {base}{path}` with a JSON body; decodes a JSON reply or an [`ApiError`].
    pub async fn post<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        path: &str,
        body: &Req,
    ) -> Result<Resp, CallError> {
        self.send(
            path,
            self.http().post(format!("{}{path}", self.base)).json(body),
        )
        .await
    }

    /// `POST {base}{path}` with a streamed `body` of media type `content_type` (an agent's log
    /// upload), allowed `timeout` in all (a followed log lasts as long as its containers run);
    /// decodes a JSON reply or an [`ApiError`].
    pub async fn post_stream<Resp: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: reqwest::Body,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let req = self
            .http()
            .post(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .timeout(timeout)
            .body(body);
        self.send(path, req).await
    }

    /// `PATCH {base}{path}` with `body` of `content_type` (e.g. a JSON patch to a Kubernetes
    /// API server, whose `Status` replies decode as [`ApiError`] code `http_<status>`).
    pub async fn patch<Resp: DeserializeOwned>(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Result<Resp, CallError> {
        let req = self
            .http()
            .patch(format!("{}{path}", self.base))
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(body);
        self.send(path, req).await
    }

    /// `GET {base}{path}`; decodes a JSON reply or an [`ApiError`].
    pub async fn get<Resp: DeserializeOwned>(&self, path: &str) -> Result<Resp, CallError> {
        self.send(path, self.http().get(format!("{}{path}", self.base)))
            .await
    }

    /// `GET {base}{path}` whose reply is newline-delimited (a log stream), calling `on_line`
    /// with each line as it arrives; bearer `token` if given, else the token file's. No line may
    /// exceed the reply limit. A refusal is [`CallError::Rejected`] with the server's message.
    pub async fn get_lines(
        &self,
        path: &str,
        token: Option<&str>,
        mut on_line: impl FnMut(&str),
    ) -> Result<(), CallError> {
        let mut req = self.http().get(format!("{}{path}", self.base));
        match token {
            Some(t) => req = req.bearer_auth(t),
            None => req = self.with_token_file(req)?,
        }
        let mut resp = req.send().await.map_err(|e| self.failed(&e))?;
        let status = resp.status();
        if !status.is_success() {
            let bytes = read_bounded(resp, self.max_reply_bytes)
                .await
                .unwrap_or_default();
            let mut api_error: ApiError =
                serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
                    code: format!("http_{}", status.as_u16()),
                    message: format!("the server answered {status} to {path}"),
                });
            api_error.message = format!("{} ({status})", api_error.message);
            return Err(CallError::Rejected(api_error));
        }
        let broken = |e: reqwest::Error| {
            CallError::Transient(format!("the stream of {}{path} broke: {e}", self.base))
        };
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(broken)? {
            pending.extend_from_slice(&chunk);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                on_line(String::from_utf8_lossy(&line[..end]).trim_end_matches('\r'));
            }
            if pending.len() > self.max_reply_bytes {
                return Err(CallError::Transient(format!(
                    "a line of {}{path} is longer than {} bytes; refused",
                    self.base, self.max_reply_bytes
                )));
            }
        }
        if !pending.is_empty() {
            on_line(&String::from_utf8_lossy(&pending));
        }
        Ok(())
    }

    /// `req` with the bearer token of the token file, if one is configured.
    fn with_token_file(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::RequestBuilder, CallError> {
        let Some(file) = &self.token_file else {
            return Ok(req);
        };
        let token = std::fs::read_to_string(file).map_err(|e| {
            CallError::Transient(format!(
                "cannot read the token file {}: {e}",
                file.display()
            ))
        })?;
        Ok(req.bearer_auth(token.trim()))
    }

    async fn send<Resp: DeserializeOwned>(
        &self,
        path: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<Resp, CallError> {
        let req = self.with_token_file(req)?;
        let resp = req.send().await.map_err(|e| self.failed(&e))?;
        let status = resp.status();
        let retry_after = retry_after(&resp);
        let bytes = read_bounded(resp, self.max_reply_bytes)
            .await
            .map_err(|e| {
                CallError::Transient(format!("reading the reply of {}{path}: {e}", self.base))
            })?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|e| {
                CallError::Transient(format!("the server's reply to {path} is not what this plugin expects ({e}); check that plugin and server versions match"))
            });
        }
        let api_error: ApiError = serde_json::from_slice(&bytes).unwrap_or_else(|_| ApiError {
            code: format!("http_{}", status.as_u16()),
            message: format!("the server answered {status} to {path}"),
        });
        let message = format!("{} ({status})", api_error.message);
        let busy = status.as_u16() == 503 || status.as_u16() == 429;
        if status.as_u16() == 503 && retry_after.is_none() {
            // This replica cannot serve now (e.g. cut from its control plane) but the others
            // may: HTTP/2 would keep every call on this one connection, so the next call opens
            // a new one, which a Service gives to a ready replica (issue #32). A budget refusal
            // (with Retry-After) keeps the connection: every replica has the same budget.
            self.trust.reconnect();
        }
        match retry_after {
            Some(retry_after) if busy => Err(CallError::Busy {
                message,
                retry_after,
            }),
            _ if status.is_server_error() || status.as_u16() == 429 || status.as_u16() == 401 => {
                Err(CallError::Transient(message))
            }
            _ => Err(CallError::Rejected(api_error)),
        }
    }
}

/// A reply's `Retry-After` in seconds (the form the server sends; an HTTP date is ignored),
/// capped at 5 minutes so that a broken proxy cannot park a caller for hours.
fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let seconds: u64 = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(300)))
}

/// Why a reply body was not read.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    /// Larger than the limit (announced, or counted while reading).
    #[error(
        "the reply is larger than {max} bytes; refused (is this the rollouts-dispatch server?)"
    )]
    TooLarge {
        /// the limit
        max: usize,
    },
    /// The connection failed mid-body.
    #[error(transparent)]
    Body(#[from] reqwest::Error),
}

/// The body of `resp`, read chunk by chunk and refused as soon as it exceeds `max` bytes: a
/// `Content-Length` beyond it is refused before reading anything, a body without one (chunked)
/// when the count passes it, so at most `max` bytes plus one chunk are ever held.
async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ReadError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(ReadError::TooLarge { max });
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(ReadError::TooLarge { max });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Whether `url` names this machine: `127.0.0.0/8`, `::1` (or IPv4-mapped loopback) or
/// `localhost`, where plain HTTP does not leave the host.
pub fn is_loopback(url: &reqwest::Url) -> bool {
    use std::net::IpAddr;
    // The URL parser has already normalised IPv4 forms (`127.1`) and bracketed IPv6.
    let Some(host) = url.host_str() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => host.eq_ignore_ascii_case("localhost"),
    }
}

fn describe(e: &reqwest::Error, base: &str) -> String {
    if e.is_timeout() {
        format!("the server {base} did not answer in time")
    } else if e.is_connect() {
        format!("cannot connect to the server {base}: {}", root_cause(e))
    } else {
        format!("request to the server {base} failed: {}", root_cause(e))
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server that answers every request with `head` and then streams zeros (up to 64 MiB)
    /// until the client hangs up; returns its URL and the bytes of body it managed to send.
    async fn flood(head: &'static str) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = tcp.read(&mut buf).await;
                    if tcp.write_all(head.as_bytes()).await.is_err() {
                        return;
                    }
                    let chunked = head.contains("chunked");
                    let block = vec![b'0'; 64 * 1024];
                    for _ in 0..1024 {
                        let framed = if chunked {
                            let mut f = format!("{:x}\r\n", block.len()).into_bytes();
                            f.extend_from_slice(&block);
                            f.extend_from_slice(b"\r\n");
                            f
                        } else {
                            block.clone()
                        };
                        if tcp.write_all(&framed).await.is_err() {
                            return;
                        }
                        counter.fetch_add(block.len(), Ordering::SeqCst);
                    }
                });
            }
        });
        (url, sent)
    }

    fn client(url: &str) -> ServerClient {
        ServerClient::new(&ClientConfig {
            server: url.to_string(),
            token_file: None,
            ca_file: None,
            ca_only: false,
            insecure_plaintext: false,
            timeout: Duration::from_secs(20),
        })
        .unwrap()
    }

    #[tokio::test]
    async fn an_oversized_reply_is_refused_without_reading_it_all() {
        for head in [
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 67108864\r\n\r\n",
            "HTTP/1.1 500 Internal Server Error\r\ntransfer-encoding: chunked\r\n\r\n",
        ] {
            let (url, sent) = flood(head).await;
            let e = client(&url)
                .get::<serde_json::Value>("/v1/destinations")
                .await
                .unwrap_err();
            assert!(
                matches!(&e, CallError::Transient(m) if m.contains("larger than 1048576 bytes")),
                "{head}: {e:?}"
            );
            // The client hung up long before the 64 MiB were sent.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(sent.load(Ordering::SeqCst) < 32 << 20, "{head}: {}", sent.load(Ordering::SeqCst));
        }
    }

    /// A server answering every request with `head` and the JSON `body`.
    async fn answering(head: &'static str, body: &'static str) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = tcp.read(&mut buf).await;
                let reply = format!(
                    "{head}content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tcp.write_all(reply.as_bytes()).await;
            }
        });
        url
    }

    /// A keep-alive server answering its requests, in order, with the heads of `answers` (a
    /// JSON body each); its URL and the count of connections it accepted.
    async fn keeping_alive(answers: &'static [&'static str]) -> (String, Arc<AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (connections, next) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut tcp, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let next = next.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {
                        let head =
                            answers[next.fetch_add(1, Ordering::SeqCst).min(answers.len() - 1)];
                        let reply = format!(
                            "{head}content-type: application/json\r\ncontent-length: 2\r\n\r\n{{}}"
                        );
                        if tcp.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (url, connections)
    }

    #[tokio::test]
    async fn a_replica_that_cannot_serve_is_left_for_a_new_connection_a_budget_is_not() {
        const OK: &str = "HTTP/1.1 200 OK\r\n";
        // Kept alive: two calls, one connection.
        let (url, connections) = keeping_alive(&[OK, OK]).await;
        let c = client(&url);
        for _ in 0..2 {
            c.get::<serde_json::Value>("/v1/destinations")
                .await
                .unwrap();
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1);
        // A 503 without Retry-After (a replica cut from its control plane): the next call
        // connects anew, so that a Service can give it to another replica.
        let (url, connections) = keeping_alive(&["HTTP/1.1 503 Service Unavailable\r\n", OK]).await;
        let c = client(&url);
        assert!(c
            .get::<serde_json::Value>("/v1/destinations")
            .await
            .is_err());
        c.get::<serde_json::Value>("/v1/destinations")
            .await
            .unwrap();
        assert_eq!(connections.load(Ordering::SeqCst), 2);
        // A budget's 503 (Retry-After): every replica has the same budget; the connection stays.
        let (url, connections) =
            keeping_alive(&["HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\n", OK]).await;
        let c = client(&url);
        assert!(c
            .get::<serde_json::Value>("/v1/destinations")
            .await
            .is_err());
        c.get::<serde_json::Value>("/v1/destinations")
            .await
            .unwrap();
        assert_eq!(connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_budget_refusal_is_busy_with_the_servers_retry_after_and_message() {
        let body = r#"{"code":"overloaded","message":"the server is serving its maximum of 2048 agent long polls (serve --max-agent-polls); retry shortly"}"#;
        let refusal = |head: &'static str| async move {
            let url = answering(head, body).await;
            client(&url)
                .get::<serde_json::Value>("/v1/destinations")
                .await
                .unwrap_err()
        };
        let e = refusal("HTTP/1.1 503 Service Unavailable\r\nretry-after: 5\r\n").await;
        assert!(
            matches!(&e, CallError::Busy { message, retry_after }
                if message.contains("--max-agent-polls") && message.contains("503")
                    && *retry_after == Duration::from_secs(5)),
            "{e:?}"
        );
        // Without Retry-After, a 503 is a plain transient error; a huge one is capped.
        let e = refusal("HTTP/1.1 503 Service Unavailable\r\n").await;
        assert!(
            matches!(&e, CallError::Transient(m) if m.contains("maximum")),
            "{e:?}"
        );
        let e = refusal("HTTP/1.1 429 Too Many Requests\r\nretry-after: 99999\r\n").await;
        assert!(
            matches!(&e, CallError::Busy { retry_after, .. } if *retry_after == Duration::from_secs(300)),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn a_reply_within_the_limit_is_read() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut tcp, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let _ = tcp.read(&mut buf).await;
            let body = format!("[\"{}\"]", "x".repeat(1000));
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            tcp.write_all(head.as_bytes()).await.unwrap();
            tcp.write_all(body.as_bytes()).await.unwrap();
        });
        let c = client(&url).with_max_reply_bytes(2000);
        let v: Vec<String> = c.get("/v1/destinations").await.unwrap();
        assert_eq!(v[0].len(), 1000);
    }

    fn config(server: &str, insecure_plaintext: bool) -> ClientConfig {
        ClientConfig {
            server: server.into(),
            token_file: None,
            ca_file: None,
            ca_only: false,
            insecure_plaintext,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn plain_http_is_refused_unless_loopback_or_allowed() {
        for loopback in [
            "http://127.0.0.1:8443",
            "http://127.1.2.3",
            "http://[::1]:8443/",
            "http://localhost:8443",
            "http://LOCALHOST",
            "http://[::ffff:127.0.0.1]:1",
        ] {
            assert!(
                ServerClient::new(&config(loopback, false)).is_ok(),
                "{loopback}"
            );
        }
        for remote in [
            "http://rollouts-dispatch.rollouts-dispatch.svc:8443",
            "http://10.0.0.1:8443",
            "http://[fd00::1]:8443",
            "http://localhost.evil.example",
            "http://127.0.0.1.nip.io",
        ] {
            let e = ServerClient::new(&config(remote, false)).unwrap_err();
            assert!(matches!(e, ClientError::Plaintext(_)), "{remote}: {e:?}");
            assert!(e.to_string().contains("--insecure-plaintext"), "{e}");
            assert!(ServerClient::new(&config(remote, true)).is_ok(), "{remote}");
        }
        assert!(ServerClient::new(&config("https://dispatch.example:8443", false)).is_ok());
        for bad in ["ftp://x", "dispatch:8443", "https://", ""] {
            assert!(
                matches!(
                    ServerClient::new(&config(bad, false)),
                    Err(ClientError::BadUrl(_))
                ),
                "{bad}"
            );
        }
    }
}
