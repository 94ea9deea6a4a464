//! Where a destination comes from ([`Source`]): which config entry, kubeconfig context, Argo CD
//! cluster Secret or agent defines it, its precedence when two define one name, and how
//! messages name it.

use std::fmt;

use super::argocd;
use crate::config::DEFAULT_ARGOCD_INSTANCE;

/// Where a destination comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `destinations[index]` of the config file
    Config {
        /// position in the file
        index: usize,
    },
    /// an Argo CD cluster Secret
    ArgoCd {
        /// the Argo CD instance (`argocd[].name`) whose Secret it is
        instance: String,
        /// its namespace
        namespace: String,
        /// its name
        secret: String,
    },
    /// Argo CD's implicit `in-cluster` (the control plane), of the instance on the control plane
    ArgoCdInCluster {
        /// the instance (`argocd[].name`)
        instance: String,
    },
    /// the cluster an Argo CD instance with `kubeconfig` runs on, named after the instance
    ArgoCdHome {
        /// the instance (`argocd[].name`)
        instance: String,
    },
    /// a kubeconfig context
    Kubeconfig {
        /// the file
        path: String,
        /// the context
        context: String,
    },
    /// `agents.destinations[index]` of the config file: reached through its agent
    Agent {
        /// position in the file
        index: usize,
    },
    /// the cluster an agent runs in (the agent's own registry)
    Local,
}

impl Source {
    /// Lower wins when two sources define the same name (or, for an Application, the same
    /// server): what the platform team configured, then `in-cluster`, then Argo CD cluster
    /// Secrets, which whoever may write Secrets in the Argo CD namespace controls.
    pub(super) fn priority(&self) -> u8 {
        match self {
            // An instance's own cluster is configured like a destination: no Secret replaces it.
            Self::Config { .. } | Self::Agent { .. } | Self::Local | Self::ArgoCdHome { .. } => 0,
            Self::ArgoCdInCluster { .. } => 1,
            Self::ArgoCd { .. } => 2,
            Self::Kubeconfig { .. } => 3,
        }
    }

    /// The setting that limits a destination of this source to namespaces, for messages.
    pub fn namespaces_key(&self) -> String {
        match self {
            Self::Config { index } => format!("`destinations[{index}].namespaces`"),
            Self::ArgoCd { .. } => {
                format!("annotation `{}` of {self}", argocd::NAMESPACES_ANNOTATION)
            }
            Self::ArgoCdInCluster { instance } | Self::ArgoCdHome { instance } => {
                if instance == DEFAULT_ARGOCD_INSTANCE {
                    "`argocd.inClusterNamespaces`".to_string()
                } else {
                    format!("`argocd[].inClusterNamespaces` of Argo CD instance {instance}")
                }
            }
            Self::Kubeconfig { .. } => "`namespaces` (kubeconfig contexts have none)".to_string(),
            Self::Agent { index } => {
                format!("the agent's `--namespaces` (agents.destinations[{index}])")
            }
            Self::Local => "the agent's `--namespaces`".to_string(),
        }
    }

    /// Whether Argo CD defines it.
    pub fn is_argocd(&self) -> bool {
        self.argocd_instance().is_some()
    }

    /// The Argo CD instance (`argocd[].name`) that defines it, if one does.
    pub fn argocd_instance(&self) -> Option<&str> {
        match self {
            Self::ArgoCd { instance, .. }
            | Self::ArgoCdInCluster { instance }
            | Self::ArgoCdHome { instance } => Some(instance),
            _ => None,
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config { index } => write!(f, "config destinations[{index}]"),
            // The single-map form's instance is not named: its messages read as before.
            Self::ArgoCd {
                instance,
                namespace,
                secret,
            } => {
                write!(f, "Argo CD cluster Secret {namespace}/{secret}")?;
                if instance != DEFAULT_ARGOCD_INSTANCE {
                    write!(f, " of Argo CD instance {instance}")?;
                }
                Ok(())
            }
            Self::ArgoCdInCluster { .. } => {
                f.write_str("Argo CD's implicit in-cluster destination")
            }
            Self::ArgoCdHome { instance } => write!(
                f,
                "the cluster Argo CD instance {instance} runs on (its `kubeconfig`)"
            ),
            Self::Kubeconfig { path, context } => write!(f, "kubeconfig {path} context {context}"),
            Self::Agent { index } => write!(f, "config agents.destinations[{index}]"),
            Self::Local => f.write_str("the agent's own cluster"),
        }
    }
}
