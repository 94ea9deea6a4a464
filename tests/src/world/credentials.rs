//! What a scene needs to speak to the World's API as someone: the servers' signing key, the
//! API's CA and the plugin's token, through accessors of [`World`] ([`Credentials`] is what
//! each dispatch side provides), so that a test never builds a path into the World's
//! directories; where those files live is the World's business.
//!
//! # The plugin's token, and why there is no token per run
//!
//! Every controller of a World reads the one `argo-rollouts-config` ConfigMap (the scene's own
//! and any [`ArgoRollouts::start_instance`](crate::cluster::argo::ArgoRollouts::start_instance)),
//! whose `args` give the plugin one `--token-file`; each controller starts one plugin process
//! for all its runs. The plugin reads that file again on every request
//! (`ServerClient::with_token_file`, `api/src/client.rs`). So a run cannot carry a token of its
//! own: what a test can do is rewrite the file ([`World::swap_plugin_token`]), and every call
//! of every run in flight uses the new token from then on. A run gets a token of its own only
//! while it is the only one in flight: hold the World alone (`alone` in `tests/e2e`), swap,
//! submit, wait until the run is decided, then drop the swap. Runs that need different tokens
//! at the same time need a World each.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::agents::{Agents, KEY};
use super::direct::{Direct, DIRECT_KEY};
use super::World;
use crate::tls::ApiTls;

/// How long [`World::issue_token`]'s tokens last: longer than any scene.
const TOKEN_TTL: Duration = Duration::from_secs(3600);

/// What a dispatch side of [`World`] gives a test: the servers' key, the API's TLS, the file the
/// plugin reads its token from.
pub trait Credentials {
    /// The key the servers verify tokens with (HS256), as `--jwt-key-file` holds it.
    fn signing_key(&self) -> &[u8];
    /// The API's CA, certificate and key.
    fn tls(&self) -> &ApiTls;
    /// The plugin's `--token-file`.
    fn plugin_token_file(&self) -> &Path;
}

impl Credentials for Direct {
    fn signing_key(&self) -> &[u8] {
        DIRECT_KEY.as_bytes()
    }
    fn tls(&self) -> &ApiTls {
        &self.tls
    }
    fn plugin_token_file(&self) -> &Path {
        &self.plugin_token
    }
}

impl Credentials for Agents {
    fn signing_key(&self) -> &[u8] {
        KEY.as_bytes()
    }
    fn tls(&self) -> &ApiTls {
        &self.tls
    }
    fn plugin_token_file(&self) -> &Path {
        &self.plugin_token
    }
}

impl<D: Credentials> World<D> {
    /// The key the servers verify tokens with: a test mints its own with it.
    pub fn signing_key(&self) -> &[u8] {
        self.dispatch.signing_key()
    }

    /// The PEM of the CA that signed the API's certificate, for a client built in the test.
    pub fn ca_pem(&self) -> &str {
        &self.dispatch.tls().ca_pem
    }

    /// The same CA as a file, for what takes a path: a `--ca-file` flag, a
    /// [`ClientConfig`](dispatch_api::client::ClientConfig).
    pub fn ca_file(&self) -> &Path {
        &self.dispatch.tls().ca
    }

    /// A token for `subject` bound to the Kargo projects `projects` (`None`: an error, as the
    /// server refuses a plugin token without projects), signed with [`Self::signing_key`],
    /// valid for an hour.
    pub fn issue_token(&self, subject: &str, projects: Option<&[String]>) -> Result<String> {
        let key = self.signing_key();
        let (token, _) =
            dispatch_server::token::issue_token_for(key, subject, None, projects, TOKEN_TTL)?;
        Ok(token)
    }

    /// The token the plugin sends now.
    pub fn plugin_token(&self) -> Result<String> {
        let file = self.dispatch.plugin_token_file();
        let token = std::fs::read_to_string(file)
            .with_context(|| format!("reading the plugin's token {}", file.display()))?;
        Ok(token.trim().to_string())
    }

    /// Makes the plugin send `token` from its next request on, for every run of every
    /// controller of this World (the module docs say why there is no token per run); the
    /// previous token comes back when the returned swap is dropped. `&mut`: only a test that
    /// holds the World alone may change what every run in flight sends.
    pub fn swap_plugin_token(&mut self, token: &str) -> Result<PluginTokenSwap> {
        PluginTokenSwap::write(self.dispatch.plugin_token_file(), token)
    }
}

/// The plugin's token changed by [`World::swap_plugin_token`]; dropping it writes the previous
/// token back.
#[must_use = "dropping the swap at once puts the previous token back"]
#[derive(Debug)]
pub struct PluginTokenSwap {
    file: PathBuf,
    previous: String,
}

impl PluginTokenSwap {
    /// Writes `token` to `file`, keeping what it held.
    fn write(file: &Path, token: &str) -> Result<Self> {
        let previous = std::fs::read_to_string(file)
            .with_context(|| format!("reading the plugin's token {}", file.display()))?;
        write_token(file, token)?;
        Ok(Self {
            file: file.to_path_buf(),
            previous,
        })
    }
}

impl Drop for PluginTokenSwap {
    fn drop(&mut self) {
        if let Err(e) = write_token(&self.file, &self.previous) {
            eprintln!("putting the plugin's token back: {e:#}");
        }
    }
}

/// Replaces the token in `file` at once (a new file renamed over it): the plugin reads the file
/// on every request, and must never read it half written.
pub(super) fn write_token(file: &Path, token: &str) -> Result<()> {
    let next = file.with_extension("token.next");
    std::fs::write(&next, token).with_context(|| format!("writing {}", next.display()))?;
    std::fs::rename(&next, file).with_context(|| format!("replacing {}", file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_swap_replaces_the_token_file_and_dropping_it_puts_the_previous_back() {
        let dir = std::env::temp_dir().join(format!("plugin-token-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("plugin.token");
        std::fs::write(&file, "first\n").unwrap();
        let swap = PluginTokenSwap::write(&file, "second").unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "second");
        drop(swap);
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "first\n");
        assert!(!file.with_extension("token.next").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
