//! A destination's kubeconfig rewritten under a running client: the next request carries the new
//! token, a broken rewrite keeps the old one.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::config::DirectAccess;

/// An API server answering `ok` to everything; the `Authorization` of each request to /version.
async fn api_server() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let recorded = recorded.clone();
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tcp.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                if head.starts_with("GET /version") {
                    let auth = head
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("authorization")
                                .then(|| value.trim().to_string())
                        })
                        .unwrap_or_default();
                    recorded.lock().unwrap().push(auth);
                }
                let reply = "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\
                             connection: close\r\n\r\nok";
                let _ = tcp.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, seen)
}

fn kubeconfig(server: &str, user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: edge\n\
         clusters: [{{name: edge, cluster: {{server: \"{server}\"}}}}]\n\
         users: [{{name: edge, user: {user}}}]\n\
         contexts: [{{name: edge, context: {{cluster: edge, user: edge}}}}]\n"
    )
}

fn scratch(case: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rd-follow-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A following client of `access`, looking at its files on every request.
async fn following(access: &Access) -> kube::Client {
    let config = config_for(access, "edge").await.unwrap();
    let settings = EngineSettings::default();
    client_of_every(
        access,
        "edge",
        config,
        &settings,
        &RequestCounter::default(),
        Duration::ZERO,
    )
    .unwrap()
}

/// The `Authorization` the API server saw on a request `client` sends now.
async fn sent(client: &kube::Client, seen: &Mutex<Vec<String>>) -> String {
    let request = http::Request::get("/version").body(Vec::new()).unwrap();
    assert_eq!(client.request_text(request).await.unwrap(), "ok");
    seen.lock().unwrap().last().cloned().unwrap_or_default()
}

/// Writes `text` into `path`, then gives the client's task time to look (every 100 ms here).
async fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// The `Authorization` of the requests `client` sends, once it is `expected` (a request sent
/// while the task builds the new client still goes out on the one in force), within 5 s.
async fn sent_eventually(client: &kube::Client, seen: &Mutex<Vec<String>>, expected: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let auth = sent(client, seen).await;
        if auth == expected || std::time::Instant::now() > deadline {
            assert_eq!(auth, expected);
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_rewritten_kubeconfig_is_used_by_new_requests() {
    let (url, seen) = api_server().await;
    let dir = scratch("kubeconfig");
    let file = dir.join("kubeconfig");
    write(&file, &kubeconfig(&url, "{token: old-token}")).await;
    let access = Access::Kubeconfig {
        path: Some(file.clone()),
        context: None,
    };
    assert_eq!(files_of(&access), vec![file.clone()]);
    let client = following(&access).await;
    assert_eq!(sent(&client, &seen).await, "Bearer old-token");

    // A new ServiceAccount token written into the kubeconfig; the old one is then invalid.
    write(&file, &kubeconfig(&url, "{token: new-token-2}")).await;
    sent_eventually(&client, &seen, "Bearer new-token-2").await;
    // A half-written kubeconfig is not taken: the client in force stays.
    write(&file, "apiVersion: v1\nkind: Config\nclusters: [{name: ed").await;
    assert_eq!(sent(&client, &seen).await, "Bearer new-token-2");
    std::fs::remove_dir_all(dir).ok();
}

#[tokio::test]
async fn a_token_file_is_followed_at_once_not_after_kube_rs_minute() {
    let (url, seen) = api_server().await;
    let dir = scratch("token-file");
    let (file, token) = (dir.join("kubeconfig"), dir.join("token"));
    write(&token, "first-token").await;
    let user = format!("{{tokenFile: {}}}", token.display());
    write(&file, &kubeconfig(&url, &user)).await;
    let access = Access::Kubeconfig {
        path: Some(file.clone()),
        context: Some("edge".into()),
    };
    let mut expected = vec![file.clone(), token.clone()];
    expected.sort();
    assert_eq!(files_of(&access), expected);
    let client = following(&access).await;
    assert_eq!(sent(&client, &seen).await, "Bearer first-token");
    write(&token, "second-token-2").await;
    sent_eventually(&client, &seen, "Bearer second-token-2").await;

    // A direct access's token file, the same way.
    let direct = Access::Direct(Box::new(DirectAccess {
        server: url.clone(),
        token_file: Some(token.clone()),
        ..DirectAccess::default()
    }));
    assert_eq!(files_of(&direct), vec![token.clone()]);
    let client = following(&direct).await;
    assert_eq!(sent(&client, &seen).await, "Bearer second-token-2");
    write(&token, "third-token-33").await;
    sent_eventually(&client, &seen, "Bearer third-token-33").await;
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn in_cluster_credentials_are_left_to_kube_rs() {
    assert!(files_of(&Access::Infer).is_empty());
    let direct = Access::Direct(Box::new(DirectAccess {
        server: "https://10.0.0.1:6443".into(),
        ..DirectAccess::default()
    }));
    assert!(files_of(&direct).is_empty(), "an inline token has no file");
}

#[tokio::test]
async fn the_files_are_looked_at_without_a_request_until_the_client_goes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = scratch("look");
    let file = dir.join("n");
    std::fs::write(&file, "1").unwrap();
    let derived = Arc::new(AtomicUsize::new(0));
    let counted = derived.clone();
    let current = Arc::new(
        Reloading::new(
            "n",
            vec![file.clone()],
            Duration::ZERO,
            move |f: &[PathBuf]| {
                counted.fetch_add(1, Ordering::SeqCst);
                std::fs::read_to_string(&f[0])
            },
        )
        .unwrap(),
    );
    let task = tokio::spawn(look_every(Arc::downgrade(&current), Duration::ZERO));
    std::fs::write(&file, "22").unwrap();
    // No `get` here: the task alone sees the change.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        derived.load(Ordering::SeqCst),
        2,
        "derived at start and after the change"
    );
    drop(current);
    tokio::time::timeout(Duration::from_secs(2), task)
        .await
        .expect("the task ends with its client")
        .unwrap();
    std::fs::remove_dir_all(dir).ok();
}
