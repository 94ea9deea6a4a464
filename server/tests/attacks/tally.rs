//! The outcome of one attack, appended as a line to `$ATTACKS_FILE` (when set) for `make
//! attacks` to sum up. A case records only after its assertions ran, so the counts are of
//! checked outcomes; an attack that got through records what it reached *and then* fails the
//! test, so the summary line and the failure agree.

use std::io::Write;

/// The environment variable naming the file that receives one line per attack.
pub(crate) const ATTACKS_FILE_ENV: &str = "ATTACKS_FILE";

/// What one attack achieved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// the server (or agent) refused it
    pub(crate) refused: bool,
    /// it read another project's Job state, log or metadata
    pub(crate) cross_tenant_read: bool,
    /// it deleted (or changed) another project's Job
    pub(crate) cross_tenant_delete: bool,
    /// a secret value reached a message, a log line, a metric or a reply
    pub(crate) secret_leak: bool,
    /// it read or synced an Application its project's Stages are not authorized for
    pub(crate) cross_tenant_sync: bool,
    /// a Job pod of its got a volume, Secret, ConfigMap, claim or pull Secret its rule does not
    /// allow (or a scheduling field, a resource beyond the cap, a label or annotation outside
    /// the allowlist)
    pub(crate) foreign_mount: bool,
    /// a caller bound to no project acted for one
    pub(crate) unbound_caller: bool,
    /// a plugin call was refused because another tenant (or its log readers) held the slots
    pub(crate) starved_call: bool,
}

impl Outcome {
    /// Refused, nothing reached.
    pub(crate) fn refused() -> Self {
        Self {
            refused: true,
            ..Self::default()
        }
    }
}

/// Appends `name` and its outcome to `$ATTACKS_FILE` as
/// `name\trefused\tread\tdelete\tleak\tsync\tmount\tunbound\tstarved` (0 or 1 each); tests run in
/// parallel, so each line is one `write` in append mode.
pub(crate) fn record(name: &str, outcome: &Outcome) {
    let Some(path) = std::env::var_os(ATTACKS_FILE_ENV) else {
        return;
    };
    let bit = |b: bool| u8::from(b);
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        name.replace(['\t', '\n'], " "),
        bit(outcome.refused),
        bit(outcome.cross_tenant_read),
        bit(outcome.cross_tenant_delete),
        bit(outcome.secret_leak),
        bit(outcome.cross_tenant_sync),
        bit(outcome.foreign_mount),
        bit(outcome.unbound_caller),
        bit(outcome.starved_call),
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(line.as_bytes()));
    if let Err(e) = written {
        panic!(
            "writing the attack tally to {}: {e}",
            path.to_string_lossy()
        );
    }
}

/// Asserts `outcome` is a clean refusal and records it under `name`.
pub(crate) fn refused(name: &str, outcome: Outcome) {
    record(name, &outcome);
    assert_eq!(
        outcome,
        Outcome::refused(),
        "attack {name} was not cleanly refused"
    );
}
