//! `rollouts-dispatch agent`: runs the agent of one destination until a signal stops it.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{parse_duration, AdminArgs, ServerArgs};
use crate::podsecurity::{
    Allowlists, DefaultUser, JobLimits, Level, Quantity, Resources, ResourcesError, SchedulingField,
};

/// `rollouts-dispatch agent`
#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// `--server`, `--ca-file`, `--insecure-plaintext`
    #[command(flatten)]
    pub server: ServerArgs,
    /// File holding the agent token (`rollouts-dispatch token issue --destination NAME`);
    /// re-read on every request.
    #[arg(long, env = "ROLLOUTS_DISPATCH_AGENT_TOKEN_FILE")]
    pub token_file: PathBuf,
    /// The destination this agent serves; must match the token (default: the token's).
    #[arg(long)]
    pub destination: Option<String>,
    /// `--admin-listen`
    #[command(flatten)]
    pub admin: AdminArgs,
    /// How long one long poll may stay open (Go duration, at most 55s).
    #[arg(long, default_value = "25s", value_parser = parse_duration)]
    pub poll_wait: Duration,
    /// Namespaces where the agent creates and deletes Jobs, comma-separated globs ('*': all);
    /// default: its own, `$POD_NAMESPACE` (it refuses to start without either). Work for any
    /// other namespace is refused and reported, whatever the server asks.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ROLLOUTS_DISPATCH_AGENT_NAMESPACES"
    )]
    pub namespaces: Vec<String>,
    /// Pod Security Standards level of the Jobs it creates: restricted (unset restricted fields
    /// are filled in), baseline or privileged; checked again here whatever the server allowed.
    #[arg(long, default_value = "restricted")]
    pub pod_security: Level,
    /// Service accounts the Jobs' pods may run as, comma-separated exact names.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    pub service_accounts: Vec<String>,
    /// Let the Jobs' pods mount an API token (`automountServiceAccountToken: true`, projected
    /// service account tokens); without it, `automountServiceAccountToken: false` is set.
    #[arg(long)]
    pub automount_service_account_token: bool,
    /// At restricted, the user and group a Job's pod runs as when its template names no
    /// `runAsUser` (the kubelet cannot check runAsNonRoot against an image that runs as root or
    /// as a named user): a numeric id, or `none` for the image's own.
    #[arg(long, default_value = "65532")]
    pub default_run_as_user: DefaultUser,
    /// How long a Job's container may fail to start (CreateContainerConfigError,
    /// CreateContainerError, RunContainerError, a start hook's error) before its state is an
    /// Error (Go duration; 0: at once); the server's `engine.startGrace`.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub start_grace: Duration,
    /// How long a Job's pod may stay unschedulable before its state is an Error (Go duration;
    /// 0: at once); the server's `engine.schedulingGrace`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub scheduling_grace: Duration,
    /// Carry out the Application sync orders of the server's sync trigger (`POST
    /// /v1/destinations/{d}/applications/{ns}/{name}:sync`): patch the Application's operation
    /// as Argo CD's API does, once per order. Needs `patch` on applications.argoproj.io
    /// (chart value `agent.argocd.sync: true`). Without it a sync order is refused and reported.
    #[arg(long, env = "ROLLOUTS_DISPATCH_AGENT_ARGOCD_SYNC")]
    pub argocd_sync: bool,
    /// Files of the public keys the server signs work with, one `ed25519:<base64>` per line (as
    /// `rollouts-dispatch work-keys` prints them, run with the server's key flags); repeat or
    /// comma-separate for several. The agent creates, syncs and uploads logs only for records a
    /// key of these signed, and follows the files without a restart (key rotation).
    #[arg(
        long = "work-keys",
        env = "ROLLOUTS_DISPATCH_AGENT_WORK_KEYS",
        value_delimiter = ',',
        required = true
    )]
    pub work_keys: Vec<PathBuf>,
    /// `--secrets`, `--scheduling`, `--max-resources` …
    #[command(flatten)]
    pub allow: AllowlistArgs,
}

/// What the Jobs' pods may reference, set and use in this cluster (issue #27), checked here
/// whatever the server allowed; the policy rule keys of the same names. The defaults allow
/// nothing beyond a plain Job.
#[derive(Debug, Clone, Args)]
pub struct AllowlistArgs {
    /// Secrets the Jobs' pods may read (secret and projected volumes, secretKeyRef, envFrom,
    /// CSI nodePublishSecretRef), comma-separated globs; default none. A legacy service-account
    /// token name (`<sa>-token-<suffix>`) needs an exact entry.
    #[arg(long, value_delimiter = ',')]
    pub secrets: Vec<String>,
    /// ConfigMaps the Jobs' pods may read (volumes, projected sources, configMapKeyRef,
    /// envFrom), comma-separated globs; default none.
    #[arg(long, value_delimiter = ',')]
    pub config_maps: Vec<String>,
    /// PersistentVolumeClaims the Jobs' pods may mount (or fill an ephemeral volume from),
    /// comma-separated globs; default none.
    #[arg(long, value_delimiter = ',')]
    pub persistent_volume_claims: Vec<String>,
    /// CSI drivers of inline `csi` volumes, comma-separated globs; default none.
    #[arg(long, value_delimiter = ',')]
    pub csi_drivers: Vec<String>,
    /// `imagePullSecrets` the Jobs' pods may name, comma-separated globs; default none.
    #[arg(long, value_delimiter = ',')]
    pub image_pull_secrets: Vec<String>,
    /// Allow `ephemeral` volumes (a PersistentVolumeClaim created for the pod).
    #[arg(long)]
    pub ephemeral_volumes: bool,
    /// Scheduling fields the Jobs' pods may set, comma-separated: tolerations, nodeSelector,
    /// affinity, priorityClassName, runtimeClassName, hostAliases, dnsConfig, dnsPolicy (other
    /// than ClusterFirst), schedulerName, topologySpreadConstraints, overhead,
    /// preemptionPolicy, resourceClaims; default none.
    #[arg(long, value_delimiter = ',')]
    pub scheduling: Vec<SchedulingField>,
    /// What an unset container request or limit becomes, `name=quantity` pairs
    /// comma-separated, over the built-ins cpu=100m,memory=128Mi.
    #[arg(long, value_delimiter = ',', value_parser = resource_pair)]
    pub default_resources: Vec<(String, Quantity)>,
    /// The most a container (or pod) may request or limit, `name=quantity` pairs
    /// comma-separated, over the built-ins cpu=2,memory=2Gi,ephemeral-storage=4Gi; any other
    /// resource (a GPU) is refused unless named here.
    #[arg(long, value_delimiter = ',', value_parser = resource_pair)]
    pub max_resources: Vec<(String, Quantity)>,
    /// The most `spec.parallelism` of a Job may be.
    #[arg(long, default_value_t = JobLimits::BUILTIN.parallelism,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallelism: u32,
    /// The most `spec.completions` of a Job may be.
    #[arg(long, default_value_t = JobLimits::BUILTIN.completions,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_completions: u32,
    /// The most `spec.backoffLimit` (and `backoffLimitPerIndex`) may be; an unset
    /// `backoffLimit` becomes 6, or this when lower.
    #[arg(long, default_value_t = JobLimits::BUILTIN.backoff_limit)]
    pub max_backoff_limit: u32,
    /// Pod template label keys the Jobs may set (ours are always set), comma-separated globs;
    /// default none.
    #[arg(long, value_delimiter = ',')]
    pub pod_labels: Vec<String>,
    /// Pod template annotation keys the Jobs may set, comma-separated globs; default none.
    #[arg(long, value_delimiter = ',')]
    pub pod_annotations: Vec<String>,
}

/// A `name=quantity` pair of `--default-resources` / `--max-resources` that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ResourcePairError {
    /// no `=`, or no name
    #[error("{0:?} is not name=quantity (e.g. cpu=500m)")]
    NotAPair(String),
    /// the quantity
    #[error(transparent)]
    Quantity(#[from] crate::podsecurity::BadQuantity),
}

fn resource_pair(s: &str) -> Result<(String, Quantity), ResourcePairError> {
    let (name, q) = s
        .split_once('=')
        .filter(|(n, _)| !n.trim().is_empty())
        .ok_or_else(|| ResourcePairError::NotAPair(s.to_string()))?;
    Ok((name.trim().to_string(), q.trim().parse()?))
}

impl AllowlistArgs {
    /// The allowlists of these flags; a default over its max is refused.
    pub fn allowlists(&self) -> Result<Allowlists, ResourcesError> {
        let clean = |v: &[String]| -> Vec<String> {
            v.iter()
                .map(|g| g.trim().to_string())
                .filter(|g| !g.is_empty())
                .collect()
        };
        let mut scheduling = self.scheduling.clone();
        scheduling.sort();
        scheduling.dedup();
        Ok(Allowlists {
            secrets: clean(&self.secrets),
            config_maps: clean(&self.config_maps),
            persistent_volume_claims: clean(&self.persistent_volume_claims),
            csi_drivers: clean(&self.csi_drivers),
            image_pull_secrets: clean(&self.image_pull_secrets),
            ephemeral_volumes: self.ephemeral_volumes,
            scheduling,
            resources: Resources::over_builtins(
                self.default_resources.iter().cloned().collect(),
                self.max_resources.iter().cloned().collect(),
            )?,
            job_limits: JobLimits {
                parallelism: self.max_parallelism,
                completions: self.max_completions,
                backoff_limit: self.max_backoff_limit,
            },
            pod_labels: clean(&self.pod_labels),
            pod_annotations: clean(&self.pod_annotations),
        })
    }
}

/// Runs the agent; returns the exit code.
pub(super) async fn run(args: AgentArgs) -> ExitCode {
    let allowlists = match args.allow.allowlists() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rollouts-dispatch agent: --default-resources/--max-resources: {e}");
            return ExitCode::from(2);
        }
    };
    let work_keys = match crate::signing::WorkKeys::from_files(&args.work_keys) {
        Ok(k) => k,
        Err(e) => {
            eprintln!(
                "rollouts-dispatch agent: --work-keys: {}",
                crate::http::Chain(&e)
            );
            return ExitCode::from(2);
        }
    };
    let opts = crate::agent::AgentOptions {
        server: args.server.server,
        token_file: args.token_file,
        ca_file: args.server.ca_file,
        insecure_plaintext: args.server.insecure_plaintext,
        destination: args.destination,
        admin_listen: args.admin.admin_listen,
        poll_wait: args.poll_wait.min(Duration::from_secs(u64::from(
            dispatch_api::agent::MAX_WAIT_SECONDS,
        ))),
        namespaces: args.namespaces,
        pod_security: args.pod_security,
        service_accounts: args.service_accounts,
        automount_service_account_token: args.automount_service_account_token,
        argocd_sync: args.argocd_sync,
        allowlists,
        work_keys,
        default_user: args.default_run_as_user,
        graces: crate::verdict::Graces {
            start: args.start_grace,
            scheduling: args.scheduling_grace,
        },
    };
    match crate::agent::run(opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Rendered here, once: the error, then each source whose text the line does not
            // hold yet (a message that quotes its source is not followed by it again).
            tracing::error!(error = %crate::http::Chain(&e), "agent stopped");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cmd::{Cli, Command};
    use crate::podsecurity::{BUILTIN_DEFAULT, BUILTIN_MAX};

    fn agent(extra: &[&str]) -> AgentArgs {
        let mut argv = vec![
            "rollouts-dispatch",
            "agent",
            "--server",
            "https://s",
            "--token-file",
            "t",
            "--work-keys",
            "k",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("{argv:?}: {e}"))
            .command
        {
            Command::Agent(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_allowlist_flags_default_to_the_safe_values() {
        let a = agent(&[]).allow.allowlists().unwrap();
        assert_eq!(a, Allowlists::default());
        let names =
            |list: &[(&str, &str)]| list.iter().map(|(n, _)| n.to_string()).collect::<Vec<_>>();
        assert_eq!(
            a.resources.default.keys().cloned().collect::<Vec<_>>(),
            names(BUILTIN_DEFAULT)
        );
        assert_eq!(a.resources.max.len(), BUILTIN_MAX.len());
    }

    #[test]
    fn the_user_and_grace_flags_default_to_the_servers_defaults() {
        let a = agent(&[]);
        let engine = crate::config::EngineSettings::default();
        assert_eq!(a.default_run_as_user, DefaultUser::default());
        assert_eq!(a.start_grace, engine.start_grace);
        assert_eq!(a.scheduling_grace, engine.scheduling_grace);
        let a = agent(&[
            "--default-run-as-user",
            "1000",
            "--start-grace",
            "0s",
            "--scheduling-grace",
            "5m",
        ]);
        assert_eq!(a.default_run_as_user, DefaultUser::Id(1000));
        assert_eq!(a.start_grace, Duration::ZERO);
        assert_eq!(a.scheduling_grace, Duration::from_secs(300));
        assert_eq!(
            agent(&["--default-run-as-user", "none"]).default_run_as_user,
            DefaultUser::Image
        );
        for bad in ["0", "2147483648", "nobody"] {
            let argv = [
                "rollouts-dispatch",
                "agent",
                "--server",
                "https://s",
                "--token-file",
                "t",
                "--work-keys",
                "k",
                "--default-run-as-user",
                bad,
            ];
            let Err(e) = Cli::try_parse_from(argv) else {
                panic!("{bad} is accepted")
            };
            let e = e.to_string();
            assert!(e.contains("not a user for the pods"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_allowlist_flags_fill_the_profile() {
        let a = agent(&[
            "--secrets",
            "db,tls-*",
            "--config-maps",
            "ca",
            "--scheduling",
            "tolerations,nodeSelector",
            "--max-resources",
            "cpu=4,nvidia.com/gpu=1",
            "--default-resources",
            "memory=256Mi",
            "--max-parallelism",
            "3",
            "--pod-annotations",
            "test.rollouts-dispatch.io/*",
            "--ephemeral-volumes",
        ])
        .allow
        .allowlists()
        .unwrap();
        assert_eq!(a.secrets, vec!["db", "tls-*"]);
        assert_eq!(
            a.scheduling,
            vec![SchedulingField::Tolerations, SchedulingField::NodeSelector]
        );
        assert_eq!(a.resources.max["cpu"], "4".parse().unwrap());
        assert_eq!(a.resources.max["nvidia.com/gpu"], "1".parse().unwrap());
        assert_eq!(a.resources.default["memory"], "256Mi".parse().unwrap());
        assert_eq!(a.job_limits.parallelism, 3);
        assert!(a.ephemeral_volumes);
        let over = agent(&["--default-resources", "cpu=3"])
            .allow
            .allowlists()
            .unwrap_err();
        assert!(over.to_string().contains("more than its max"), "{over}");
        for bad in [
            ["--scheduling", "nodeName"],
            ["--max-resources", "cpu"],
            ["--max-resources", "cpu=lots"],
            ["--max-parallelism", "0"],
        ] {
            let mut argv = vec![
                "rollouts-dispatch",
                "agent",
                "--server",
                "https://s",
                "--token-file",
                "t",
            ];
            argv.extend_from_slice(&bad);
            assert!(Cli::try_parse_from(&argv).is_err(), "{bad:?}");
        }
    }
}
