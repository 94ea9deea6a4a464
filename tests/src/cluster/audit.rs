//! A test cluster's audit log of writes ([`super::ClusterOptions::audit_writes`]): who wrote
//! what to the API server, counted by client. `make bench-scale` reads it to put our write rate
//! (the plugin's `resumeAt` patches on the control plane, the server's Jobs on a destination)
//! beside the Rollouts controller's, from the API server's own record rather than from what
//! each side says it did.
//!
//! Every client here authenticates as the same admin, so the client is told apart by its
//! `User-Agent`'s first product token (`rollouts-controller`, `rollouts-dispatch-plugin`,
//! `rollouts-dispatch`, `kube-controller-manager`, …). Writes are logged at `Metadata` level,
//! except those of the fake node's pod lifecycle (pods, nodes, leases), which are neither
//! ours nor the controller's and would only make the log large.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The log's file name in the cluster directory.
pub const LOG_FILE: &str = "audit.log";

const POLICY: &str = "\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  resources:
  - group: \"\"
    resources: [pods, pods/status, pods/binding, nodes, nodes/status]
  - group: coordination.k8s.io
    resources: [leases]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
";

/// The API server's flags for the log of writes in `dir`.
pub(crate) fn apiserver_args(dir: &Path) -> Result<Vec<String>> {
    let policy = dir.join("audit-policy.yaml");
    std::fs::write(&policy, POLICY).with_context(|| format!("writing {}", policy.display()))?;
    Ok(vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", dir.join(LOG_FILE).display()),
        "--audit-log-format=json".into(),
        // Batched: the log does not hold up the requests it records.
        "--audit-log-mode=batch".into(),
        "--audit-log-maxsize=0".into(),
    ])
}

/// Where a count of writes starts: the log's length at a moment (the log only grows).
#[derive(Debug, Clone)]
pub struct Mark {
    path: PathBuf,
    offset: u64,
}

impl Mark {
    /// The log at `path` as it is now.
    pub fn now(path: &Path) -> Self {
        let offset = std::fs::metadata(path).map_or(0, |m| m.len());
        Self {
            path: path.to_path_buf(),
            offset,
        }
    }

    /// The writes logged since this mark, by client, and where the next count starts.
    pub fn writes_since(&self) -> Result<(BTreeMap<String, u64>, Mark)> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((BTreeMap::new(), self.clone()))
            }
            Err(e) => return Err(e).with_context(|| format!("opening {}", self.path.display())),
        };
        file.seek(SeekFrom::Start(self.offset))?;
        let mut counts = BTreeMap::new();
        let mut read = 0u64;
        let mut reader = BufReader::new(file.by_ref());
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line)?;
            // A line without its newline is still being written: the next count reads it.
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            read += n as u64;
            if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) {
                let agent = event["userAgent"].as_str().unwrap_or_default();
                *counts.entry(client_of(agent)).or_default() += 1;
            }
        }
        let next = Mark {
            path: self.path.clone(),
            offset: self.offset + read,
        };
        Ok((counts, next))
    }
}

/// A `User-Agent`'s first product token: `rollouts-controller/v1.10.1 (linux/amd64) …` →
/// `rollouts-controller`; no agent at all → `-`.
pub fn client_of(user_agent: &str) -> String {
    let token = user_agent.split(['/', ' ']).next().unwrap_or_default();
    if token.is_empty() {
        "-".into()
    } else {
        token.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_are_their_first_product_token() {
        assert_eq!(
            client_of("rollouts-controller/v1.10.1 (linux/amd64) argo-rollouts/x"),
            "rollouts-controller"
        );
        assert_eq!(
            client_of("rollouts-dispatch-plugin/0.1.0"),
            "rollouts-dispatch-plugin"
        );
        assert_eq!(client_of(""), "-");
    }

    #[test]
    fn a_count_reads_only_whole_lines_after_its_mark() {
        let dir = std::env::temp_dir().join(format!("audit-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(LOG_FILE);
        std::fs::write(&path, "{\"userAgent\":\"old/1\"}\n").unwrap();
        let mark = Mark::now(&path);
        std::fs::write(
            &path,
            "{\"userAgent\":\"old/1\"}\n{\"userAgent\":\"a/1\"}\n{\"userAgent\":\"a/2 x\"}\n{\"userAgent\":\"b/1\"}\n{\"userA",
        )
        .unwrap();
        let (counts, next) = mark.writes_since().unwrap();
        assert_eq!(counts, BTreeMap::from([("a".into(), 2), ("b".into(), 1)]));
        let (again, _) = next.writes_since().unwrap();
        assert!(
            again.is_empty(),
            "the half-written line is not counted yet: {again:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
