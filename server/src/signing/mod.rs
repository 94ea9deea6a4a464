//! The server's own signing keys: HMAC-SHA256 over domain-separated messages, so that what the
//! server hands out and later gets back (the Job reference in measurement metadata, and later
//! the adoption mark on Jobs) can be told apart from what someone else wrote.
//!
//! * Several keys may be loaded at once: the **first** signs, **all** verify, so a key rotates
//!   with an overlap (add the new key second, roll the replicas, move it first, roll again,
//!   drop the old one once every reference it signed has ended).
//! * Every signature names its key by a short id (the first 8 hex characters of the key's
//!   SHA-256), so verification picks the key instead of trying each one, and a reference signed
//!   by a key the server no longer has says so.
//! * Every use signs under its own **domain** (`job-ref`, `job-mark`): the MAC covers the domain's
//!   length and bytes before the message, so a signature made for one use never verifies for
//!   another, even over the same bytes.
//! * Keys read from files ([`Signer::from_files`]) follow their files without a restart
//!   (`runtime::reload`): a rotated Secret is in force for every request after it is seen, and a
//!   bad rotation (a truncated file, a duplicate key) keeps the previous keys and is logged.
//!
//! Without a key file of its own the server derives one from each JWT key (see
//! [`Signer::derived_from_jwt_keys`]), so deployments that only configured JWT keys keep
//! working and their replicas agree.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use base64::Engine as _;
use ring::{digest, hmac};

use crate::runtime::reload::{self, Reloading};

pub mod work;
pub use work::{WorkKeys, WorkSignatureError};

/// The domain of Job references (measurement metadata `dispatch-ref`).
pub const JOB_REF: &str = "job-ref";
/// The domain of the adoption mark on Jobs we create.
pub const JOB_MARK: &str = "job-mark";

/// The label of the derived key: `HMAC-SHA256(jwt_key, DERIVATION_LABEL)`.
///
/// A separate key per purpose even when derived from the same secret: a JWT signature (HS256
/// over `header.claims`) and a reference signature can never be exchanged for one another.
pub const DERIVATION_LABEL: &[u8] = b"rollouts-dispatch job reference v1";

/// The version tag that starts every signature: `v1.<key id>.<base64url MAC>`.
const VERSION: &str = "v1";

/// A key set that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigningKeyError {
    /// no key at all
    #[error(
        "no signing key: give --signing-key-file (or at least one --jwt-key-file, from which \
         the signing key is derived)"
    )]
    None,
    /// two keys with the same id (the same key twice, or a collision of 32 bits)
    #[error("signing keys {0} and {1} have the same key id {2}; remove the duplicate")]
    Duplicate(usize, usize, String),
}

/// Why a signature does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// no signature at all
    #[error("it carries no signature")]
    Missing,
    /// not `v1.<key id>.<base64url>`
    #[error("its signature is malformed ({0})")]
    Malformed(&'static str),
    /// signed by a key this server does not hold
    #[error(
        "it was signed by key {key_id}, which this server does not hold (its keys: {known}): \
         another server's, or a key removed by a rotation"
    )]
    UnknownKey {
        /// the key id in the signature
        key_id: String,
        /// the ids this server holds
        known: String,
    },
    /// the MAC does not match: the message was changed after it was signed
    #[error("its signature (key {key_id}) does not match its content: it was changed after it was signed")]
    Mismatch {
        /// the key id in the signature
        key_id: String,
    },
}

/// Why key files give no usable key set.
#[derive(Debug, thiserror::Error)]
pub enum KeyFilesError {
    /// a file cannot be read, or holds no usable key (the reader's error names the file)
    #[error(transparent)]
    Read(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// the keys read cannot be used together
    #[error(transparent)]
    Keys(#[from] SigningKeyError),
}

/// What key files hold: the signing keys themselves, or JWT keys to derive them from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFiles {
    /// `--signing-key-file`: the keys as they are
    Signing,
    /// `--jwt-key-file`: one key [`derive_from_jwt_key`] per file
    DerivedFromJwt,
}

/// One key and its id.
struct Key {
    id: String,
    mac: hmac::Key,
    /// the Ed25519 key pair of work signatures derived from this key (`work`)
    work: ring::signature::Ed25519KeyPair,
    work_public: work::PublicKey,
}

/// The keys in force: the first signs.
struct Keys {
    keys: Vec<Key>,
}

/// HMAC-SHA256 signer and verifier with one or more keys; cheap to share behind an `Arc`.
pub struct Signer {
    keys: Reloading<Keys>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_ids", &self.key_ids())
            .finish()
    }
}

/// The short id of a key: the first 8 hex characters of its SHA-256.
pub fn key_id(key: &[u8]) -> String {
    let d = digest::digest(&digest::SHA256, key);
    d.as_ref()[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// `HMAC-SHA256(jwt_key, DERIVATION_LABEL)`: the signing key derived from a JWT key.
pub fn derive_from_jwt_key(jwt_key: &[u8]) -> Vec<u8> {
    let k = hmac::Key::new(hmac::HMAC_SHA256, jwt_key);
    hmac::sign(&k, DERIVATION_LABEL).as_ref().to_vec()
}

fn build(keys: &[Vec<u8>]) -> Result<Keys, SigningKeyError> {
    if keys.is_empty() {
        return Err(SigningKeyError::None);
    }
    let keys: Vec<Key> = keys
        .iter()
        .map(|k| {
            let work = work::key_pair(k);
            Key {
                id: key_id(k),
                mac: hmac::Key::new(hmac::HMAC_SHA256, k),
                work_public: work::PublicKey::of(&work),
                work,
            }
        })
        .collect();
    for (i, a) in keys.iter().enumerate() {
        if let Some(j) = keys[i + 1..].iter().position(|b| b.id == a.id) {
            return Err(SigningKeyError::Duplicate(i, i + 1 + j, a.id.clone()));
        }
    }
    Ok(Keys { keys })
}

/// The bytes under the MAC: the domain's length (4 bytes, big endian), the domain, the message.
fn framed(domain: &str, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + domain.len() + msg.len());
    out.extend_from_slice(&(domain.len() as u32).to_be_bytes());
    out.extend_from_slice(domain.as_bytes());
    out.extend_from_slice(msg);
    out
}

impl Signer {
    /// Signs with `keys[0]`, verifies with every one of `keys`.
    pub fn new(keys: &[Vec<u8>]) -> Result<Self, SigningKeyError> {
        Ok(Self {
            keys: Reloading::fixed("signing keys", build(keys)?),
        })
    }

    /// The signer of a server with JWT keys but no signing key of its own: one key
    /// [`derive_from_jwt_key`] per JWT key, in the same order (the first JWT key's derived key
    /// signs), so every replica with the same JWT keys signs and verifies alike.
    pub fn derived_from_jwt_keys(jwt_keys: &[Vec<u8>]) -> Result<Self, SigningKeyError> {
        let derived: Vec<Vec<u8>> = jwt_keys.iter().map(|k| derive_from_jwt_key(k)).collect();
        Self::new(&derived)
    }

    /// The keys in `files` (each read by `read`, which validates a key and names its file in
    /// errors; `None`: the file holds no key, as an emptied slot of a rotation), taken as they
    /// are or derived from JWT keys, in the order of their files, and read again whenever a file
    /// changes (looked at most every [`reload::CHECK_EVERY`]). Files that cannot be used now (or
    /// hold no key at all) are an error; after a change they keep the previous keys (logged).
    pub fn from_files<E>(
        files: &[PathBuf],
        kind: KeyFiles,
        read: impl Fn(&Path) -> Result<Option<Vec<u8>>, E> + Send + Sync + 'static,
    ) -> Result<Self, KeyFilesError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        Self::from_files_every(files, kind, read, reload::CHECK_EVERY)
    }

    /// [`Signer::from_files`] with the files looked at most once per `every`.
    pub fn from_files_every<E>(
        files: &[PathBuf],
        kind: KeyFiles,
        read: impl Fn(&Path) -> Result<Option<Vec<u8>>, E> + Send + Sync + 'static,
        every: std::time::Duration,
    ) -> Result<Self, KeyFilesError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        let derive = move |files: &[PathBuf]| -> Result<Keys, KeyFilesError> {
            let mut raw = Vec::new();
            for f in files {
                raw.extend(read(f).map_err(|e| KeyFilesError::Read(Box::new(e)))?);
            }
            let keys = match kind {
                KeyFiles::Signing => raw,
                KeyFiles::DerivedFromJwt => raw.iter().map(|k| derive_from_jwt_key(k)).collect(),
            };
            Ok(build(&keys)?)
        };
        Ok(Self {
            keys: Reloading::new("signing keys", files.to_vec(), every, derive)?,
        })
    }

    fn current(&self) -> Arc<Keys> {
        self.keys.get()
    }

    /// The ids of the keys in force, the signing one first.
    pub fn key_ids(&self) -> Vec<String> {
        self.current().keys.iter().map(|k| k.id.clone()).collect()
    }

    /// Signs `msg` for `domain` with the first key: `v1.<key id>.<base64url MAC>`.
    pub fn sign(&self, domain: &str, msg: &[u8]) -> String {
        let keys = self.current();
        // `build` refuses an empty key set, so there always is a first key.
        let key = &keys.keys[0];
        let tag = hmac::sign(&key.mac, &framed(domain, msg));
        format!(
            "{VERSION}.{}.{}",
            key.id,
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// Signs agent work `spec` (its `signature`) with the work key pair of the first key.
    pub fn sign_work(&self, spec: &mut dispatch_api::agent::DispatchJobSpec) {
        let keys = self.current();
        let key = &keys.keys[0];
        spec.signature = Some(work::sign(&key.work, key.work_public.id(), spec));
    }

    /// The public work keys of every key in force, the signing one first: what agents pin
    /// (`rollouts-dispatch work-keys`).
    pub fn work_public_keys(&self) -> Vec<work::PublicKey> {
        self.current()
            .keys
            .iter()
            .map(|k| k.work_public.clone())
            .collect()
    }

    /// Checks that `sig` is a signature of `msg` for `domain` by one of the keys in force
    /// (compared in constant time).
    pub fn verify(&self, domain: &str, msg: &[u8], sig: &str) -> Result<(), SignatureError> {
        if sig.is_empty() {
            return Err(SignatureError::Missing);
        }
        let mut parts = sig.splitn(3, '.');
        let (Some(version), Some(key_id), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(SignatureError::Malformed("expected v1.<key id>.<mac>"));
        };
        if version != VERSION {
            return Err(SignatureError::Malformed("unknown version"));
        }
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| SignatureError::Malformed("the MAC is not base64url"))?;
        let keys = self.current();
        let Some(key) = keys.keys.iter().find(|k| k.id == key_id) else {
            return Err(SignatureError::UnknownKey {
                key_id: key_id.chars().take(16).collect(),
                known: keys
                    .keys
                    .iter()
                    .map(|k| k.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        hmac::verify(&key.mac, &framed(domain, msg), &mac).map_err(|_| SignatureError::Mismatch {
            key_id: key.id.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const A: &[u8] = b"key-a-0123456789abcdef0123456789abcdef";
    const B: &[u8] = b"key-b-0123456789abcdef0123456789abcdef";

    #[test]
    fn signatures_verify_and_name_their_key() {
        let s = Signer::new(&[A.to_vec()]).unwrap();
        let sig = s.sign(JOB_REF, b"hello");
        assert!(sig.starts_with(&format!("v1.{}.", key_id(A))), "{sig}");
        assert_eq!(key_id(A).len(), 8);
        s.verify(JOB_REF, b"hello", &sig).unwrap();
        assert_eq!(
            s.verify(JOB_REF, b"hellO", &sig),
            Err(SignatureError::Mismatch { key_id: key_id(A) })
        );
    }

    #[test]
    fn domains_are_separated() {
        let s = Signer::new(&[A.to_vec()]).unwrap();
        let sig = s.sign(JOB_REF, b"x");
        assert!(matches!(
            s.verify(JOB_MARK, b"x", &sig),
            Err(SignatureError::Mismatch { .. })
        ));
        // The length prefix keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(s.sign("ab", b"c"), s.sign("a", b"bc"));
    }

    #[test]
    fn the_first_key_signs_and_all_verify_so_keys_rotate() {
        let old = Signer::new(&[A.to_vec()]).unwrap();
        let overlap = Signer::new(&[B.to_vec(), A.to_vec()]).unwrap();
        let by_old = old.sign(JOB_REF, b"m");
        overlap.verify(JOB_REF, b"m", &by_old).unwrap();
        let by_new = overlap.sign(JOB_REF, b"m");
        assert!(by_new.contains(&key_id(B)));
        let e = old.verify(JOB_REF, b"m", &by_new).unwrap_err();
        assert!(
            matches!(&e, SignatureError::UnknownKey { key_id: k, known } if *k == key_id(B) && *known == key_id(A)),
            "{e:?}"
        );
    }

    #[test]
    fn keys_follow_their_files_and_a_bad_rotation_keeps_the_old_ones() {
        // Lengths differ so that every write changes the file's stamp even within one tick.
        const K1: &[u8] = b"key-1-0123456789abcdef0123456789abcdef";
        const K2: &[u8] = b"key-22-0123456789abcdef0123456789abcdef";
        const K3: &[u8] = b"key-333-0123456789abcdef0123456789abcdef";
        let dir = std::env::temp_dir().join(format!("rd-signing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (first, second) = (dir.join("first"), dir.join("second"));
        std::fs::write(&first, K1).unwrap();
        std::fs::write(&second, K2).unwrap();
        let read = |p: &Path| std::fs::read(p).map(Some);
        let files = [first.clone(), second.clone()];
        let s = Signer::from_files_every(&files, KeyFiles::Signing, read, Duration::ZERO).unwrap();
        assert_eq!(s.key_ids(), vec![key_id(K1), key_id(K2)]);
        let by_k1 = s.sign(JOB_REF, b"m");

        // Rotation step: the new key moves first and signs; the old one still verifies.
        std::fs::write(&first, K2).unwrap();
        std::fs::write(&second, K1).unwrap();
        assert_eq!(s.key_ids(), vec![key_id(K2), key_id(K1)]);
        s.verify(JOB_REF, b"m", &by_k1).unwrap();
        assert!(s.sign(JOB_REF, b"m").contains(&key_id(K2)));

        // A broken rotation (the same key twice) is not taken: the keys in force stay.
        std::fs::write(&second, K2).unwrap();
        assert_eq!(s.key_ids(), vec![key_id(K2), key_id(K1)]);

        // Dropping the old key: what it signed no longer verifies.
        std::fs::write(&second, K3).unwrap();
        assert_eq!(s.key_ids(), vec![key_id(K2), key_id(K3)]);
        assert!(matches!(
            s.verify(JOB_REF, b"m", &by_k1),
            Err(SignatureError::UnknownKey { .. })
        ));

        // Derived from JWT key files: the same keys as derived in memory.
        let jwt =
            Signer::from_files_every(&files[..1], KeyFiles::DerivedFromJwt, read, Duration::ZERO)
                .unwrap();
        let in_memory = Signer::derived_from_jwt_keys(&[K2.to_vec()]).unwrap();
        assert_eq!(jwt.key_ids(), in_memory.key_ids());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_signatures_are_refused() {
        let s = Signer::new(&[A.to_vec()]).unwrap();
        assert_eq!(s.verify(JOB_REF, b"m", ""), Err(SignatureError::Missing));
        for bad in ["v1", "v1.x", "v2.abcd.AAAA", "v1.abcd.!!!"] {
            assert!(
                matches!(
                    s.verify(JOB_REF, b"m", bad),
                    Err(SignatureError::Malformed(_))
                ),
                "{bad}"
            );
        }
        let good = s.sign(JOB_REF, b"m");
        let truncated = &good[..good.len() - 4];
        assert!(s.verify(JOB_REF, b"m", truncated).is_err());
    }

    #[test]
    fn derived_keys_are_stable_and_not_the_jwt_key() {
        let a = Signer::derived_from_jwt_keys(&[A.to_vec()]).unwrap();
        let b = Signer::derived_from_jwt_keys(&[A.to_vec()]).unwrap();
        b.verify(JOB_REF, b"m", &a.sign(JOB_REF, b"m")).unwrap();
        assert_ne!(derive_from_jwt_key(A), A.to_vec());
        assert_ne!(a.key_ids(), vec![key_id(A)]);
        let plain = Signer::new(&[A.to_vec()]).unwrap();
        assert!(plain.verify(JOB_REF, b"m", &a.sign(JOB_REF, b"m")).is_err());
    }

    #[test]
    fn key_sets_must_be_usable() {
        assert_eq!(Signer::new(&[]).unwrap_err(), SigningKeyError::None);
        assert!(matches!(
            Signer::new(&[A.to_vec(), A.to_vec()]),
            Err(SigningKeyError::Duplicate(0, 1, _))
        ));
        assert!(SigningKeyError::None
            .to_string()
            .contains("--signing-key-file"));
    }
}
