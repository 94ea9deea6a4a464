//! A JWT key rotation with `serve`'s key files, without a restart (issue #32): the next key is
//! written into a file the server already names (empty until then), tokens of it are accepted,
//! and emptying the old key's file retires the old key, for JWTs and for the signing keys derived
//! from them alike.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{jwt_authenticator, signer, signer_every};
use crate::http::auth::{issue, Claims, AUDIENCE};
use crate::signing::{self, SignatureError, JOB_REF};

// Lengths differ so that every write changes the file's size, even within one clock tick.
const OLD: &[u8] = b"old-jwt-key-0123456789abcdef0123456789abcdef";
const NEW: &[u8] = b"new-jwt-key-0123456789abcdef0123456789abcdef-2";

fn token(key: &[u8], jti: &str) -> String {
    let now = jsonwebtoken::get_current_timestamp();
    let claims = Claims {
        sub: "plugin".into(),
        aud: AUDIENCE.into(),
        exp: now + 600,
        iat: now,
        jti: jti.into(),
        destination: None,
        projects: Some(vec!["*".into()]),
    };
    issue(key, &claims).unwrap()
}

fn scratch(case: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rd-serve-rotation-{case}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(path: &Path, text: &[u8]) {
    std::fs::write(path, text).unwrap();
}

#[test]
fn a_jwt_key_rotates_through_a_second_key_file_without_a_restart() {
    let dir = scratch("jwt");
    let (first, second) = (dir.join("jwt.key"), dir.join("jwt-next.key"));
    write(&first, OLD);
    write(&second, b"");
    let files = [first.clone(), second.clone()];
    let auth = jwt_authenticator(&files, Vec::new(), None, Duration::ZERO).unwrap();
    let (old, new) = (token(OLD, "old-1"), token(NEW, "new-1"));
    auth.authenticate(&old).unwrap();
    assert!(auth.authenticate(&new).is_err(), "not added yet");

    // Step 1: the next key in the empty slot; both are accepted.
    write(&second, NEW);
    auth.authenticate(&new).unwrap();
    auth.authenticate(&old).unwrap();
    // A half-written key file is not taken: both stay.
    write(&first, b"half");
    auth.authenticate(&old).unwrap();
    write(&first, OLD);
    // Step 3 (tokens re-issued in between): the old key's file emptied; its tokens are refused.
    write(&first, b"\n");
    auth.authenticate(&new).unwrap();
    let e = auth.authenticate(&old).unwrap_err().to_string();
    assert!(e.contains("does not match"), "{e}");
    // Every file empty is not a key set: the keys in force stay.
    write(&second, b"");
    auth.authenticate(&new).unwrap();
    // A removed file holds no key either (a key taken out of a mounted Secret).
    write(&second, NEW);
    write(&first, OLD);
    auth.authenticate(&old).unwrap();
    std::fs::remove_file(&first).unwrap();
    assert!(auth.authenticate(&old).is_err());
    auth.authenticate(&new).unwrap();
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_signing_keys_derived_from_the_jwt_key_files_rotate_with_them() {
    let dir = scratch("derived");
    let (first, second) = (dir.join("jwt.key"), dir.join("jwt-next.key"));
    write(&first, OLD);
    write(&second, b"");
    let files = [first.clone(), second.clone()];
    // `signer` looks every `reload::CHECK_EVERY`: the same one with no wait.
    let s = signer_every(&[], &files, Duration::ZERO).unwrap();
    let started = signer(&[], &files).unwrap();
    assert_eq!(
        s.key_ids(),
        started.key_ids(),
        "an empty key file adds no key"
    );
    let old_id = signing::key_id(&signing::derive_from_jwt_key(OLD));
    let new_id = signing::key_id(&signing::derive_from_jwt_key(NEW));
    assert_eq!(s.key_ids(), vec![old_id.clone()]);
    let by_old = s.sign(JOB_REF, b"m");

    // The next key second: the old one still signs, both verify.
    write(&second, NEW);
    assert_eq!(s.key_ids(), vec![old_id.clone(), new_id.clone()]);
    // The old key's file emptied: the next one signs, and what the old one signed is refused.
    write(&first, b"");
    assert_eq!(s.key_ids(), vec![new_id.clone()]);
    assert!(s.sign(JOB_REF, b"m").contains(&new_id));
    assert!(matches!(
        s.verify(JOB_REF, b"m", &by_old),
        Err(SignatureError::UnknownKey { .. })
    ));
    std::fs::remove_dir_all(dir).ok();
}
