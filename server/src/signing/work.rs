//! Work signatures: the server signs every agent record it writes (the Job spec, the project, the
//! destination, the deadline, a sync order) with Ed25519, and the agent acts only on records
//! signed by a key it pins (`rollouts-dispatch agent --work-keys`). Whoever can write the records
//! — they are a Kubernetes resource on the control plane — gets nothing run, synced or uploaded.
//!
//! * **Asymmetric**, so an agent holds no secret that signs: a compromised edge cluster cannot
//!   sign work for another agent. The key pair of each signing key is derived from it
//!   (`HMAC-SHA256(key, WORK_DERIVATION_LABEL)` is the Ed25519 seed), so the server's key files
//!   and their rotation (`signing`: the first key signs, all verify) are the same as for
//!   references; agents pin the public keys `rollouts-dispatch work-keys` prints. Rotation
//!   without downtime: give agents the new public key beside the old one, add the new key second
//!   on the server, move it first, drop the old key (and then its public key) once the records it
//!   signed have ended.
//! * **What is signed:** the canonical JSON of the spec (object keys sorted, so a round trip
//!   through the API server, which re-orders keys, keeps the bytes) with `signature` and
//!   `delete` left out. A deletion request of a signed record needs no signature: it only
//!   deletes a Job the record made, which the agent checks by its labels, and the store's
//!   `request_delete` flips it without re-signing.
//! * **Deadline:** past the spec's `deadline` the agent creates no Job and carries out no sync
//!   for it (the record of a measurement that ended cannot be replayed later).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use dispatch_api::agent::DispatchJobSpec;
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use ring::{digest, hmac};
use serde_json::Value;

use crate::runtime::reload::{self, Reloading};

/// The label of the derived key pair: its seed is `HMAC-SHA256(signing key, WORK_DERIVATION_LABEL)`.
pub const WORK_DERIVATION_LABEL: &[u8] = b"rollouts-dispatch work signing v1";

/// The domain every work signature is made under (see [`message`]).
const DOMAIN: &[u8] = b"rollouts-dispatch work v1\n";

/// The version tag that starts every work signature: `v1.<key id>.<base64url signature>`.
const VERSION: &str = "v1";

/// The prefix of a public key in a `--work-keys` file.
const PUBLIC_PREFIX: &str = "ed25519:";

/// The key pair derived from one signing key.
pub(super) fn key_pair(signing_key: &[u8]) -> Ed25519KeyPair {
    let k = hmac::Key::new(hmac::HMAC_SHA256, signing_key);
    let seed = hmac::sign(&k, WORK_DERIVATION_LABEL);
    // A SHA-256 tag is 32 bytes, the size of an Ed25519 seed.
    Ed25519KeyPair::from_seed_unchecked(seed.as_ref()).expect("a 32-byte seed")
}

/// A public key agents pin: its id (the first 8 hex characters of its SHA-256) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    id: String,
    bytes: Vec<u8>,
}

impl PublicKey {
    /// The public half of `pair`.
    pub(super) fn of(pair: &Ed25519KeyPair) -> Self {
        Self::from_bytes(pair.public_key().as_ref().to_vec())
    }

    fn from_bytes(bytes: Vec<u8>) -> Self {
        let d = digest::digest(&digest::SHA256, &bytes);
        let id = d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect();
        Self { id, bytes }
    }

    /// The key's short id, as signatures name it.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl std::fmt::Display for PublicKey {
    /// `ed25519:<base64>`, one line of a `--work-keys` file.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.bytes);
        write!(f, "{PUBLIC_PREFIX}{b64}")
    }
}

/// Signs `spec` with `pair` (its id `id`): `v1.<key id>.<base64url signature>`.
pub(super) fn sign(pair: &Ed25519KeyPair, id: &str, spec: &DispatchJobSpec) -> String {
    let sig = pair.sign(&message(spec));
    format!(
        "{VERSION}.{id}.{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sig.as_ref())
    )
}

/// The bytes a work signature covers: [`DOMAIN`], then the canonical JSON of `spec` without its
/// `signature` and with `delete: false`.
pub fn message(spec: &DispatchJobSpec) -> Vec<u8> {
    let mut unsigned = spec.clone();
    unsigned.signature = None;
    unsigned.delete = false;
    let value = serde_json::to_value(&unsigned).expect("a spec serializes");
    let mut out = DOMAIN.to_vec();
    canonical(&value, &mut out);
    out
}

/// Writes `v` as JSON with every object's keys sorted and no whitespace.
fn canonical(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                canonical(&map[k], out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(scalar.to_string().as_bytes()),
    }
}

/// Why the agent does not act on a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkSignatureError {
    /// no signature at all: written by someone else than a server, or by a server from before
    /// signed work
    #[error(
        "it carries no signature: the server signs every record it writes, so this one was \
         written by someone else (or by a server older than signed work: upgrade the server first)"
    )]
    Missing,
    /// not `v1.<key id>.<base64url>`
    #[error("its signature is malformed ({0})")]
    Malformed(&'static str),
    /// signed by a key this agent does not pin
    #[error(
        "it was signed by key {key_id}, which this agent does not pin (its --work-keys: {known}); \
         add that server's key from `rollouts-dispatch work-keys` to --work-keys"
    )]
    UnknownKey {
        /// the key id in the signature
        key_id: String,
        /// the ids this agent pins
        known: String,
    },
    /// the signature does not match: the record was changed after the server signed it
    #[error(
        "its signature (key {key_id}) does not match its content: the record was changed after \
         the server signed it"
    )]
    Mismatch {
        /// the key id in the signature
        key_id: String,
    },
    /// past its deadline
    #[error("its deadline passed {ago}s ago: the measurement it was written for has ended")]
    Expired {
        /// seconds since the deadline
        ago: u64,
    },
}

/// Why a `--work-keys` file gives no key.
#[derive(Debug, thiserror::Error)]
pub enum WorkKeysFileError {
    /// unreadable
    #[error("reading {}", .path.display())]
    Read {
        /// the file
        path: PathBuf,
        /// why
        #[source]
        source: std::io::Error,
    },
    /// a line that is not `ed25519:<base64 of 32 bytes>`
    #[error(
        "{} line {line}: expected `ed25519:<base64 of 32 bytes>` as `rollouts-dispatch work-keys` prints it",
        .path.display()
    )]
    BadLine {
        /// the file
        path: PathBuf,
        /// 1-based
        line: usize,
    },
    /// no key in any file
    #[error(
        "no work key in {files}: print the server's with `rollouts-dispatch work-keys` (the same \
         --signing-key-file or --jwt-key-file flags as serve)"
    )]
    Empty {
        /// the files, comma-separated
        files: String,
    },
}

/// Parses the public keys of one `--work-keys` file: one `ed25519:<base64>` per line, blank
/// lines and `#` comments ignored.
pub fn parse_keys_file(path: &Path) -> Result<Vec<PublicKey>, WorkKeysFileError> {
    let text = std::fs::read_to_string(path).map_err(|source| WorkKeysFileError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || WorkKeysFileError::BadLine {
            path: path.to_path_buf(),
            line: i + 1,
        };
        let b64 = line.strip_prefix(PUBLIC_PREFIX).ok_or_else(bad)?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|_| bad())?;
        if bytes.len() != 32 {
            return Err(bad());
        }
        keys.push(PublicKey::from_bytes(bytes));
    }
    Ok(keys)
}

/// The public keys an agent checks work against, following their files without a restart.
#[derive(Clone)]
pub struct WorkKeys {
    keys: Reloading<Vec<PublicKey>>,
}

impl std::fmt::Debug for WorkKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkKeys")
            .field("key_ids", &self.key_ids())
            .finish()
    }
}

impl PartialEq for WorkKeys {
    fn eq(&self, other: &Self) -> bool {
        self.keys.get() == other.keys.get()
    }
}

impl Eq for WorkKeys {}

impl WorkKeys {
    /// Keys that never change (tests, and a server checking its own records).
    pub fn fixed(keys: Vec<PublicKey>) -> Self {
        Self {
            keys: Reloading::fixed("work keys", keys),
        }
    }

    /// The public keys of every key `signer` holds.
    pub fn of(signer: &super::Signer) -> Self {
        Self::fixed(signer.work_public_keys())
    }

    /// The keys of `files`, read again when one changes (a bad rotation keeps the keys in
    /// force, logged). No key at all is an error: an agent that trusts nothing runs nothing.
    pub fn from_files(files: &[PathBuf]) -> Result<Self, WorkKeysFileError> {
        Self::from_files_every(files, reload::CHECK_EVERY)
    }

    /// [`WorkKeys::from_files`] with the files looked at most once per `every`.
    fn from_files_every(files: &[PathBuf], every: Duration) -> Result<Self, WorkKeysFileError> {
        let derive = |files: &[PathBuf]| -> Result<Vec<PublicKey>, WorkKeysFileError> {
            let mut keys = Vec::new();
            for f in files {
                keys.extend(parse_keys_file(f)?);
            }
            if keys.is_empty() {
                return Err(WorkKeysFileError::Empty {
                    files: files
                        .iter()
                        .map(|f| f.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            Ok(keys)
        };
        Ok(Self {
            keys: Reloading::new("work keys", files.to_vec(), every, derive)?,
        })
    }

    /// The ids of the pinned keys.
    pub fn key_ids(&self) -> Vec<String> {
        self.keys.get().iter().map(|k| k.id.clone()).collect()
    }

    /// Checks that a pinned key signed `spec` as it is now.
    pub fn verify(&self, spec: &DispatchJobSpec) -> Result<(), WorkSignatureError> {
        let sig = spec
            .signature
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or(WorkSignatureError::Missing)?;
        let mut parts = sig.splitn(3, '.');
        let (Some(version), Some(key_id), Some(b64)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(WorkSignatureError::Malformed(
                "expected v1.<key id>.<signature>",
            ));
        };
        if version != VERSION {
            return Err(WorkSignatureError::Malformed("unknown version"));
        }
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(b64)
            .map_err(|_| WorkSignatureError::Malformed("the signature is not base64url"))?;
        let keys: Arc<Vec<PublicKey>> = self.keys.get();
        let Some(key) = keys.iter().find(|k| k.id == key_id) else {
            return Err(WorkSignatureError::UnknownKey {
                key_id: key_id.chars().take(16).collect(),
                known: keys
                    .iter()
                    .map(|k| k.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        UnparsedPublicKey::new(&ED25519, &key.bytes)
            .verify(&message(spec), &raw)
            .map_err(|_| WorkSignatureError::Mismatch {
                key_id: key.id.clone(),
            })
    }

    /// [`Self::verify`], and that `spec`'s deadline (if any) has not passed at `now` (seconds
    /// since the epoch): what the agent checks before it creates a Job or carries out a sync.
    pub fn verify_in_time(
        &self,
        spec: &DispatchJobSpec,
        now: u64,
    ) -> Result<(), WorkSignatureError> {
        self.verify(spec)?;
        match spec.deadline {
            0 => Ok(()),
            d if now > d => Err(WorkSignatureError::Expired { ago: now - d }),
            _ => Ok(()),
        }
    }
}

/// Seconds since the epoch now.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signing::Signer;
    use serde_json::json;

    const A: &[u8] = b"key-a-0123456789abcdef0123456789abcdef";
    const B: &[u8] = b"key-b-0123456789abcdef0123456789abcdef";

    fn spec() -> DispatchJobSpec {
        DispatchJobSpec {
            destination: "edge".into(),
            namespace: "verify".into(),
            job_name: "j".into(),
            run_uid: "u".into(),
            project: "team-a".into(),
            job: Some(json!({"metadata": {"name": "j", "namespace": "verify"},
                             "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}]}}}})),
            ..DispatchJobSpec::default()
        }
    }

    fn signed(signer: &Signer) -> DispatchJobSpec {
        let mut s = spec();
        signer.sign_work(&mut s);
        s
    }

    #[test]
    fn a_signed_spec_verifies_and_any_change_but_delete_breaks_it() {
        let signer = Signer::new(&[A.to_vec()]).unwrap();
        let keys = WorkKeys::of(&signer);
        let s = signed(&signer);
        keys.verify(&s).unwrap();
        let mut deleting = s.clone();
        deleting.delete = true;
        keys.verify(&deleting).unwrap();
        let edits: [fn(&mut DispatchJobSpec); 5] = [
            |s| s.namespace = "kube-system".into(),
            |s| s.project = "team-b".into(),
            |s| s.deadline += 1,
            |s| s.job.as_mut().unwrap()["spec"]["template"]["spec"]["volumes"] = json!([]),
            |s| s.destination = "edge2".into(),
        ];
        for edit in edits {
            let mut forged = s.clone();
            edit(&mut forged);
            assert!(
                matches!(
                    keys.verify(&forged),
                    Err(WorkSignatureError::Mismatch { .. })
                ),
                "{forged:?}"
            );
        }
        let mut bare = s;
        bare.signature = None;
        assert_eq!(keys.verify(&bare), Err(WorkSignatureError::Missing));
    }

    #[test]
    fn key_order_in_the_job_does_not_matter_as_the_api_server_reorders_keys() {
        let signer = Signer::new(&[A.to_vec()]).unwrap();
        let s = signed(&signer);
        // Through text with the keys reversed: serde_json sorts objects, a round trip through
        // the API server may not; the canonical form does not care.
        let text = serde_json::to_string(&s).unwrap();
        let back: DispatchJobSpec = serde_json::from_str(&text).unwrap();
        WorkKeys::of(&signer).verify(&back).unwrap();
        let mut out = Vec::new();
        canonical(&json!({"b": 1, "a": [{"d": "x", "c": null}]}), &mut out);
        assert_eq!(out, br#"{"a":[{"c":null,"d":"x"}],"b":1}"#);
    }

    #[test]
    fn keys_rotate_and_an_unpinned_key_is_named() {
        let old = Signer::new(&[A.to_vec()]).unwrap();
        let new = Signer::new(&[B.to_vec(), A.to_vec()]).unwrap();
        let pinned_both = WorkKeys::of(&new);
        pinned_both.verify(&signed(&old)).unwrap();
        pinned_both.verify(&signed(&new)).unwrap();
        let e = WorkKeys::of(&old).verify(&signed(&new)).unwrap_err();
        assert!(
            matches!(&e, WorkSignatureError::UnknownKey { key_id, .. } if *key_id == new.work_public_keys()[0].id),
            "{e:?}"
        );
        assert!(e.to_string().contains("rollouts-dispatch work-keys"), "{e}");
    }

    #[test]
    fn pinned_keys_follow_their_file_through_a_rotation() {
        let (old, new) = (
            Signer::new(&[A.to_vec()]).unwrap(),
            Signer::new(&[B.to_vec(), A.to_vec()]).unwrap(),
        );
        let printed = |s: &Signer| -> String {
            s.work_public_keys()
                .iter()
                .map(|k| format!("{k}\n"))
                .collect()
        };
        let dir = std::env::temp_dir().join(format!("rd-work-rotation-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("work.keys");
        std::fs::write(&file, printed(&old)).unwrap();
        let keys = WorkKeys::from_files_every(std::slice::from_ref(&file), Duration::ZERO).unwrap();
        assert!(keys.verify(&signed(&new)).is_err(), "not pinned yet");
        // The agents pin both before the server signs with the new key...
        std::fs::write(&file, printed(&new)).unwrap();
        keys.verify(&signed(&new)).unwrap();
        keys.verify(&signed(&old)).unwrap();
        // ...and drop the old one once its work is over.
        let only_new = Signer::new(&[B.to_vec()]).unwrap();
        std::fs::write(&file, printed(&only_new)).unwrap();
        assert!(keys.verify(&signed(&old)).is_err());
        keys.verify(&signed(&new)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_deadline_holds_for_creates() {
        let signer = Signer::new(&[A.to_vec()]).unwrap();
        let keys = WorkKeys::of(&signer);
        let mut s = spec();
        s.deadline = 1_000;
        signer.sign_work(&mut s);
        keys.verify_in_time(&s, 1_000).unwrap();
        assert_eq!(
            keys.verify_in_time(&s, 1_060),
            Err(WorkSignatureError::Expired { ago: 60 })
        );
    }

    #[test]
    fn keys_files_round_trip_what_work_keys_prints() {
        let signer = Signer::new(&[A.to_vec(), B.to_vec()]).unwrap();
        let dir = std::env::temp_dir().join(format!("rd-work-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        let printed: String = signer
            .work_public_keys()
            .iter()
            .map(|k| format!("# key {}\n{k}\n", k.id()))
            .collect();
        std::fs::write(&file, printed).unwrap();
        let keys = WorkKeys::from_files(std::slice::from_ref(&file)).unwrap();
        assert_eq!(keys, WorkKeys::of(&signer));
        std::fs::write(&file, "ed25519:AAAA\n").unwrap();
        let e = parse_keys_file(&file).unwrap_err();
        assert!(
            matches!(e, WorkKeysFileError::BadLine { line: 1, .. }),
            "{e}"
        );
        std::fs::write(&file, "# nothing\n").unwrap();
        assert!(matches!(
            WorkKeys::from_files(std::slice::from_ref(&file)),
            Err(WorkKeysFileError::Empty { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
