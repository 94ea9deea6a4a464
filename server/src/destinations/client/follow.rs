//! Kube clients that follow their credential files (issue #32): a destination's kubeconfig
//! rewritten with a new ServiceAccount token, a `tokenFile` or a CA file replaced, is used by the
//! next request, without a restart and without restarting the destination's watch caches.
//!
//! kube-rs reads a kubeconfig once, into a `Config`; it re-reads only a `tokenFile` (at most
//! every minute) and an in-cluster CA, never the kubeconfig itself nor its CA or client
//! certificate files. So a client of an [`Access`] with files is a [`Reloading`] kube client
//! under a kube client: every request goes to the client built from the files as they are;
//! files that do not load (half written, a context gone) keep the client in force, logged.
//! The files are looked at every [`reload::CHECK_EVERY`] by a task of the client, not only when
//! a request comes: the new client is in force within that time of the change even on a quiet
//! destination, so the old token may be invalidated then without a request of ours racing the
//! swap (a 401 is no retry: it ends the measurement in `Error`). Requests in flight, and
//! watches already open, finish on the client they started with (the API server authenticates
//! a request once, when it starts): a watch reconnects through the new client when it ends.
//! In-cluster credentials ([`Access::Infer`]) are left to kube-rs, which follows the projected
//! token and CA files itself.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt as _;
use kube::client::Body;
use kube::config::Kubeconfig;

use super::{client, config_for, read_kubeconfig, AccessError, RequestCounter};
use crate::config::{Access, EngineSettings};
use crate::runtime::reload::{self, Reloading};

/// The files the credentials of `access` are read from: a kubeconfig (`$KUBECONFIG`'s, else
/// `~/.kube/config`, when none is named) and the files its context names (CA, client
/// certificate and key, `tokenFile`), or the files of a direct access. None for in-cluster
/// credentials.
pub fn files_of(access: &Access) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match access {
        Access::Infer => Vec::new(),
        Access::Kubeconfig { path, context } => {
            let mut files = match path {
                Some(p) => vec![p.clone()],
                None => default_kubeconfigs(),
            };
            if let Ok((kubeconfig, _)) = read_kubeconfig(path.as_deref()) {
                files.extend(named_by(&kubeconfig, context.as_deref()));
            }
            files
        }
        Access::Direct(d) => [&d.token_file, &d.ca_file, &d.cert_file, &d.key_file]
            .into_iter()
            .flatten()
            .cloned()
            .collect(),
    };
    files.sort();
    files.dedup();
    files
}

/// `$KUBECONFIG`'s files, else `~/.kube/config` (as `Kubeconfig::read` reads them).
fn default_kubeconfigs() -> Vec<PathBuf> {
    let listed: Vec<PathBuf> = std::env::var_os("KUBECONFIG")
        .map(|v| {
            std::env::split_paths(&v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default();
    if !listed.is_empty() {
        return listed;
    }
    std::env::home_dir()
        .map(|h| vec![h.join(".kube").join("config")])
        .unwrap_or_default()
}

/// The files the cluster and user of `context` (else the current context) name; kube-rs has
/// already made them absolute.
fn named_by(kubeconfig: &Kubeconfig, context: Option<&str>) -> Vec<PathBuf> {
    let context = context.or(kubeconfig.current_context.as_deref());
    let Some(ctx) = kubeconfig
        .contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == context)
        .and_then(|c| c.context.as_ref())
    else {
        return Vec::new();
    };
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.as_ref());
    let user = kubeconfig
        .auth_infos
        .iter()
        .find(|a| Some(a.name.as_str()) == ctx.user.as_deref())
        .and_then(|a| a.auth_info.as_ref());
    let mut files = Vec::new();
    files.extend(cluster.and_then(|c| c.certificate_authority.clone()));
    if let Some(u) = user {
        files.extend(u.client_certificate.clone());
        files.extend(u.client_key.clone());
        files.extend(u.token_file.clone());
    }
    files.into_iter().map(PathBuf::from).collect()
}

/// A client of `access` (whose config `config` was just read): one that follows the files of
/// `access` ([`files_of`]) when it has any, else the plain [`client`] of `config`. `name` names
/// the kubeconfig entries of a direct access, as in [`config_for`].
pub fn client_of(
    access: &Access,
    name: &str,
    config: kube::Config,
    settings: &EngineSettings,
    counter: &RequestCounter,
) -> Result<kube::Client, AccessError> {
    client_of_every(access, name, config, settings, counter, reload::CHECK_EVERY)
}

/// [`client_of`] with the files looked at most once per `every`.
pub(super) fn client_of_every(
    access: &Access,
    name: &str,
    config: kube::Config,
    settings: &EngineSettings,
    counter: &RequestCounter,
    every: Duration,
) -> Result<kube::Client, AccessError> {
    let files = files_of(access);
    if files.is_empty() {
        return client(config, settings, counter);
    }
    let namespace = config.default_namespace.clone();
    let (access, name, settings, counter) =
        (access.clone(), name.to_string(), *settings, counter.clone());
    let current = Arc::new(Reloading::new(
        "destination credentials",
        files,
        every,
        move |_: &[PathBuf]| client(config_now(&access, &name)?, &settings, &counter),
    )?);
    tokio::spawn(look_every(Arc::downgrade(&current), every));
    Ok(kube::Client::new(Current(current), namespace))
}

/// Looks at the files every `every` (at least every 100 ms) until the client is dropped, so
/// that a change is in force within `every` whether requests come or not.
async fn look_every<T: Send + Sync + 'static>(current: Weak<Reloading<T>>, every: Duration) {
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(current) = current.upgrade() else {
            return;
        };
        // Building a client (an exec credential plugin runs then) may take a moment: not on
        // a worker thread of the runtime.
        if tokio::task::spawn_blocking(move || drop(current.get()))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// The config of `access` read now. Reading a kubeconfig or a direct access awaits nothing
/// (`config_for` is async for in-cluster discovery only), so it completes on its first poll.
fn config_now(access: &Access, name: &str) -> Result<kube::Config, AccessError> {
    config_for(access, name)
        .now_or_never()
        .unwrap_or(Err(AccessError::NotAtOnce))
}

/// The service under a following client: each request goes to the client of the files as
/// they are now.
#[derive(Clone)]
struct Current(Arc<Reloading<kube::Client>>);

impl tower::Service<http::Request<Body>> for Current {
    type Response = http::Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Each request is sent by a client of its own (`kube::Client` is always ready).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let client = self.0.get();
        Box::pin(async move { client.send(request).await })
    }
}

#[cfg(test)]
mod tests;
