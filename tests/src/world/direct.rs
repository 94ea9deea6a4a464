//! The direct scene ([`World::start`], [`World::start_with`]): one `rollouts-dispatch serve` in
//! this process that reaches `cluster-a` and `cluster-b` through their kubeconfigs, with
//! `control` as its `controlPlane` (so every request is confirmed against the controller's
//! AnalysisRuns), the policy `kargo-demo, tenant-b → cluster-*`, and whatever config the test
//! adds ([`DirectOptions`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use dispatch_api::client::{ClientConfig, ServerClient};

use super::{plugin_args, start_clusters, World};
use crate::block::RULE_ALLOWS;
use crate::cluster::argocd::{self, RULE_APPLICATIONS};
use crate::kargo::{PROJECT, TENANT_B};
use crate::ports::free_port;
use crate::server::Server;
use crate::tls::ApiTls;

/// The signing key of the plugin's token (HS256).
pub(super) const DIRECT_KEY: &str = "e2e-signing-key-0123456789abcdef0123456789";

/// [`World`]'s dispatch side when the server reaches every destination itself.
pub struct Direct {
    /// The in-process server.
    pub server: Server,
    /// Its files: config, signing key, the plugin's token.
    pub dir: PathBuf,
    /// The API's CA, certificate and key.
    pub tls: ApiTls,
    /// The plugin's token file (`--token-file`; [`World::swap_plugin_token`] rewrites it).
    pub plugin_token: PathBuf,
}

/// What a [`Direct`] scene's server configuration adds to the two configured destinations and
/// the policy.
#[derive(Debug, Clone, Default)]
pub struct DirectOptions {
    /// `argocd: {namespace: argocd, inCluster: false}`: the Argo CD cluster Secrets in
    /// `control`'s `argocd` namespace become destinations (watched live; name them
    /// `cluster-*` for the policy to allow them), and `destination: stage` reads the Stages and
    /// Applications on `control`. No `in-cluster` destination: the scene's runs never land on
    /// the control plane.
    pub argocd: bool,
    /// More destinations: YAML list items (`- name: cluster-c\n  kubeconfig: …` or
    /// `server:`/`tokenFile:`/`caFile:`), at column 0, put after `cluster-a` and `cluster-b`
    /// (YAML has one `destinations:` key, so they cannot come in [`Self::extra_yaml`]). Name
    /// them `cluster-*` for the policy to allow them.
    pub extra_destinations: String,
    /// More top-level sections (`jobs:`, `applicationSync:`, `ui:`, `engine:`), each a
    /// complete YAML block, appended to the config as [`World::start_with_agent_config`]
    /// appends its `extra_yaml`. Not
    /// `controlPlane:`, `destinations:`, `policy:` or `argocd:`: the scene writes those.
    pub extra_yaml: String,
}

impl World<Direct> {
    /// Starts the scene with one in-process server that reaches both destinations directly.
    pub async fn start() -> Result<Self> {
        Self::start_with(DirectOptions::default()).await
    }

    /// [`Self::start`], the server configured with `options` as well.
    pub async fn start_with(options: DirectOptions) -> Result<Self> {
        let [control, a, b] = start_clusters().await?;
        let dir = control.dir.join("dispatch");
        std::fs::create_dir_all(&dir)?;
        let key = dir.join("jwt.key");
        std::fs::write(&key, DIRECT_KEY)?;
        let config = dir.join("server.yaml");
        let kubeconfigs = [&control, &a, &b].map(|c| c.kubeconfig.as_path());
        std::fs::write(&config, server_yaml(kubeconfigs, &options))?;
        // The Rollouts controller serves every namespace: `projects: ["*"]`, written out.
        let (token, _) = dispatch_server::token::issue_token_for(
            DIRECT_KEY.as_bytes(),
            "argo-rollouts-controller",
            None,
            Some(&["*".to_string()]),
            Duration::from_secs(3600),
        )?;
        let plugin_token = dir.join("plugin.token");
        std::fs::write(&plugin_token, token)?;
        let tls = ApiTls::write(&dir)?;
        let (port, admin) = (free_port()?, free_port()?);
        let [tls_cert, tls_key] = tls.serve_flags();
        let server = Server::start([
            "--config".into(),
            config.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin}"),
            "--jwt-key-file".into(),
            key.display().to_string(),
            "--sync-timeout".into(),
            "30s".into(),
            // The sweep removes Jobs still running under a completed run. Argo Rollouts v1.9 and
            // older complete a run terminated between two resumes without calling Terminate
            // (analysis/analysis.go:189 in v1.9.1 skips a measurement whose resumeAt is ahead;
            // v1.10 added `!terminating &&`), so on those versions the sweep is what deletes an
            // aborted Job: every 15 s here instead of 5 m, so `make e2e` sees it on both.
            "--sweep-orphans-every".into(),
            "15s".into(),
            tls_cert,
            tls_key,
        ])
        .await?;
        let url = format!("https://127.0.0.1:{port}");
        let plugin_args = plugin_args(&url, &plugin_token, &tls.ca);
        let direct = Direct {
            server,
            dir,
            tls,
            plugin_token,
        };
        Self::assemble([control, a, b], url, plugin_args, direct).await
    }

    /// A client of the server's `/v1` API with the plugin's token and the API's CA.
    pub fn api_client(&self) -> Result<ServerClient> {
        Ok(ServerClient::new(&ClientConfig {
            server: self.url.clone(),
            token_file: Some(self.dispatch.plugin_token.clone()),
            ca_file: Some(self.dispatch.tls.ca.clone()),
            ca_only: true,
            insecure_plaintext: false,
            timeout: Duration::from_secs(30),
        })?)
    }
}

/// The server's config: `control` the control plane, `a` and `b` (these kubeconfigs) as
/// `cluster-a` and `cluster-b`, then `options`.
fn server_yaml([control, a, b]: [&Path; 3], options: &DirectOptions) -> String {
    let argocd = if options.argocd {
        format!(
            "argocd: {{namespace: {}, inCluster: false}}\n",
            argocd::NAMESPACE
        )
    } else {
        String::new()
    };
    // A block without its last newline would run into the next key.
    let block = |s: &str| {
        if s.is_empty() || s.ends_with('\n') {
            s.to_string()
        } else {
            format!("{s}\n")
        }
    };
    format!(
        "controlPlane: {{kubeconfig: {}}}\n{argocd}\
         destinations:\n\
         - name: cluster-a\n  kubeconfig: {}\n  labels: {{env: e2e}}\n\
         - name: cluster-b\n  kubeconfig: {}\n  labels: {{env: e2e}}\n\
         {}\
         policy:\n  rules:\n  - projects: [\"{PROJECT}\", \"{TENANT_B}\"]\n    destinations: [\"cluster-*\"]\n    namespaces: [\"*\"]\n    {RULE_ALLOWS}\n    {RULE_APPLICATIONS}\n\
         {}",
        control.display(),
        a.display(),
        b.display(),
        block(&options.extra_destinations),
        block(&options.extra_yaml),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use dispatch_server::config::ServerConfig;

    fn parse(options: &DirectOptions) -> ServerConfig {
        let paths = ["/k/control", "/k/a", "/k/b"].map(Path::new);
        let text = server_yaml(paths, options);
        ServerConfig::parse(&text, "the direct scene's config")
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn the_scene_config_parses_as_the_server_parses_it() {
        let config = parse(&DirectOptions::default());
        let names: Vec<_> = config.destinations.iter().map(|d| &d.name).collect();
        assert_eq!(names, ["cluster-a", "cluster-b"]);
        assert!(config.argocd.is_empty() && config.application_sync.is_empty());
    }

    #[test]
    fn extra_destinations_and_sections_reach_the_server_config() {
        let config = parse(&DirectOptions {
            argocd: true,
            // No newline at the end: the scene adds it.
            extra_destinations: "- name: cluster-c\n  server: https://127.0.0.1:1\n  \
                                 tokenFile: /t/c.token\n  caFile: /t/c.crt"
                .into(),
            extra_yaml: "applicationSync:\n  destinations: [\"cluster-c\"]".into(),
        });
        let names: Vec<_> = config.destinations.iter().map(|d| &d.name).collect();
        assert_eq!(names, ["cluster-a", "cluster-b", "cluster-c"]);
        assert_eq!(config.application_sync, ["cluster-c"]);
        assert_eq!(config.argocd.len(), 1);
    }
}
