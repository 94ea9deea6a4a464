//! The fake node's kubelet endpoint: a TLS pass-through to kwok's kubelet API that ends a
//! followed `containerLogs` stream once its container has terminated, as a kubelet does.
//!
//! kwok v0.8.0 never ends a followed log: it reads the file with cri-client's `ReadLogs`, which
//! asks the runtime whether the container still runs, and kwok's runtime stub answers
//! `Unavailable` (sigs.k8s.io/kwok@v0.8.0 pkg/kwok/server/debugging_logs.go:173-175), which
//! cri-client takes for "running" (k8s.io/cri-client@v0.36.1 pkg/logs/logs.go:431-439). A
//! kubelet's stream ends when the container exits; `rollouts-dispatch logs -f` and the page
//! rely on that. So the node's kubelet port is this shim: it forwards every connection to kwok
//! (kwok answers plain HTTP and TLS on one port, pkg/kwok/server/server.go:494-501, so the shim
//! speaks plain HTTP to it), asks for `Connection: close` so one connection carries one request,
//! and for `/containerLogs/{ns}/{pod}/{container}?follow=true` polls the pod and cuts the
//! connection once the container is terminated and kwok has sent nothing for [`GRACE`]. The
//! kube-apiserver copies the kubelet's body with `io.Copy` and ignores its error
//! (k8s.io/apiserver@v0.37.2 pkg/endpoints/handlers/responsewriters/writers.go:84), so its
//! client sees a clean end.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::Client;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

/// How long kwok must have sent nothing, once the container terminated, before a followed
/// stream is cut: the whole file is sent first, as a kubelet sends a finished container's log.
const GRACE: Duration = Duration::from_secs(1);
/// How often a followed container's state is read.
const POLL: Duration = Duration::from_millis(500);
/// The largest request head accepted.
const MAX_HEAD: usize = 64 * 1024;

/// Listens on `127.0.0.1:port` (TLS with a self-signed certificate: the kube-apiserver does
/// not verify the kubelet's without `--kubelet-certificate-authority`) and forwards to kwok's
/// kubelet API on `127.0.0.1:kwok_port`, for as long as the current tokio runtime runs.
pub(crate) async fn start(client: Client, port: u16, kwok_port: u16) -> Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()])
        .context("the kubelet shim's certificate")?;
    let key = rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der())
        .map_err(|e| anyhow::anyhow!("the kubelet shim's key: {e}"))?;
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![certified.cert.der().clone()], key)
        .context("the kubelet shim's TLS config")?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("binding the kubelet shim on 127.0.0.1:{port}"))?;
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, client) = (acceptor.clone(), client.clone());
            tokio::spawn(async move {
                // A failed connection is the apiserver's to report (as a kubelet error).
                let _ = forward(acceptor, tcp, client, kwok_port).await;
            });
        }
    });
    Ok(())
}

async fn forward(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    client: Client,
    kwok_port: u16,
) -> Result<()> {
    let mut tls = acceptor.accept(tcp).await?;
    let mut head = Vec::new();
    let end = loop {
        let mut buf = [0u8; 8192];
        let n = tls.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        if head.len() > MAX_HEAD {
            bail!("request head over {MAX_HEAD} bytes");
        }
    };
    let line_end = head.iter().position(|b| *b == b'\r').unwrap_or(0);
    let followed = followed_container(&String::from_utf8_lossy(&head[..line_end]));
    // One request per connection: the response's end is the connection's.
    let mut request = head[..end].to_vec();
    request.extend_from_slice(b"\r\nConnection: close\r\n\r\n");
    request.extend_from_slice(&head[end + 4..]);
    let mut upstream = TcpStream::connect(("127.0.0.1", kwok_port)).await?;
    upstream.write_all(&request).await?;
    // When the upstream last sent bytes, in ms since `started`: a terminated container's log
    // is cut only once kwok has gone quiet, so a long log is sent whole first.
    let started = Instant::now();
    let last_byte = AtomicU64::new(0);
    let pipe = async {
        let (mut up_read, mut up_write) = upstream.split();
        let (mut down_read, mut down_write) = tokio::io::split(&mut tls);
        let down = async {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = up_read.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<(), std::io::Error>(());
                }
                down_write.write_all(&buf[..n]).await?;
                last_byte.store(millis(started), Ordering::Relaxed);
            }
        };
        tokio::select! {
            _ = down => {}
            _ = tokio::io::copy(&mut down_read, &mut up_write) => {}
        }
    };
    match followed {
        None => pipe.await,
        Some((namespace, pod, container)) => {
            let pods: Api<Pod> = Api::namespaced(client, &namespace);
            let quiet = async {
                terminated(&pods, &pod, &container).await;
                let grace = u64::try_from(GRACE.as_millis()).unwrap_or(u64::MAX);
                while millis(started).saturating_sub(last_byte.load(Ordering::Relaxed)) < grace {
                    tokio::time::sleep(POLL).await;
                }
            };
            tokio::select! {
                () = pipe => {}
                () = quiet => {}
            }
        }
    }
    Ok(())
}

fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// `(namespace, pod, container)` of a followed `GET /containerLogs/{ns}/{pod}/{container}`.
fn followed_container(request_line: &str) -> Option<(String, String, String)> {
    let target = request_line.strip_prefix("GET ")?.split(' ').next()?;
    let (path, query) = target.split_once('?')?;
    if !query.split('&').any(|p| p == "follow=true") {
        return None;
    }
    let mut parts = path.strip_prefix("/containerLogs/")?.split('/');
    let (ns, pod, container) = (parts.next()?, parts.next()?, parts.next()?);
    Some((ns.to_owned(), pod.to_owned(), container.to_owned()))
}

/// Returns once `container` of `pod` is terminated, or the pod is gone.
async fn terminated(pods: &Api<Pod>, pod: &str, container: &str) {
    loop {
        match pods.get_opt(pod).await {
            Ok(None) => return,
            Ok(Some(p)) => {
                let done = p
                    .status
                    .and_then(|s| s.container_statuses)
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.name == container && c.state.is_some_and(|s| s.terminated.is_some())
                    });
                if done {
                    return;
                }
            }
            // The apiserver is away for a moment: ask again.
            Err(_) => {}
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::followed_container;

    #[test]
    fn only_followed_container_logs_are_watched() {
        assert_eq!(
            followed_container("GET /containerLogs/ns/pod-1/check?follow=true&stream=All HTTP/1.1"),
            Some(("ns".into(), "pod-1".into(), "check".into()))
        );
        assert_eq!(
            followed_container("GET /containerLogs/ns/pod-1/check?stream=All HTTP/1.1"),
            None
        );
        assert_eq!(
            followed_container("GET /containerLogs/ns/pod-1/check HTTP/1.1"),
            None
        );
        assert_eq!(
            followed_container("GET /exec/ns/pod-1/check?follow=true HTTP/1.1"),
            None
        );
    }
}
