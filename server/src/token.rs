//! `rollouts-dispatch token issue`: signs a JWT for an agent (bound to one destination) or for a
//! plugin (bound to the Kargo projects of its `projects` claim; `*` for the Rollouts
//! controller, which serves every namespace), with the server's HS256 key. A plugin token
//! without projects is not issued: the server would refuse it (#27).

use std::hash::{BuildHasher, RandomState};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::http::auth::{issue, Claims, AUDIENCE};

/// Why a token could not be issued.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The key file could not be read or is too short.
    #[error("signing key {path}: {reason}")]
    Key {
        /// the file
        path: String,
        /// what is wrong
        reason: String,
    },
    /// None of the key files holds a key (all empty or absent).
    #[error(
        "none of the key files {files} holds a key: write one (at least 32 random bytes, e.g. \
         `head -c 48 /dev/urandom | base64`) into one of them"
    )]
    NoKey {
        /// the files, comma-separated
        files: String,
    },
    /// Signing failed.
    #[error("signing the token: {0}")]
    Sign(String),
    /// A plugin token (no destination) without projects: the server refuses such a token.
    #[error(
        "a plugin token needs the Kargo projects it may act for: --project team-a (once per \
         project), --project '*' for the Rollouts controller, which serves every namespace; an \
         agent token needs --destination instead"
    )]
    NoProjects,
}

/// The shortest key accepted: HS256 with less than 256 bits of key is guessable.
pub const MIN_KEY_BYTES: usize = 32;

/// Reads an HS256 key file (raw bytes; surrounding white space is ignored).
pub fn read_key(path: &Path) -> Result<Vec<u8>, TokenError> {
    let raw = std::fs::read(path).map_err(|e| key_error(path, e.to_string()))?;
    key_of(path, &raw)
}

fn key_error(path: &Path, reason: String) -> TokenError {
    TokenError::Key {
        path: path.display().to_string(),
        reason,
    }
}

/// The key of file `path`, whose content is `raw`.
fn key_of(path: &Path, raw: &[u8]) -> Result<Vec<u8>, TokenError> {
    let err = |reason: String| key_error(path, reason);
    let key = raw.trim_ascii().to_vec();
    if key.len() < MIN_KEY_BYTES {
        return Err(err(format!(
            "{} bytes; use at least {MIN_KEY_BYTES} random bytes (e.g. `head -c 48 /dev/urandom | base64 > key`)",
            key.len()
        )));
    }
    Ok(key)
}

/// Reads one of several HS256 key files of a server (`serve --jwt-key-file`,
/// `--signing-key-file`): `None` when it is absent or holds only white space, so that a key
/// rotation adds a key by writing a file the server already names and drops one by emptying or
/// removing its file (a Secret key taken out of a mounted Secret), without a restart. A file
/// with a key too short is an error (half written: the keys in force stay).
pub fn read_key_if_any(path: &Path) -> Result<Option<Vec<u8>>, TokenError> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(key_error(path, e.to_string())),
        Ok(raw) if raw.trim_ascii().is_empty() => Ok(None),
        Ok(raw) => key_of(path, &raw).map(Some),
    }
}

/// The keys of `files` in their order ([`read_key_if_any`]: a file without a key adds none); at
/// least one file must hold a key.
pub fn read_keys(files: &[std::path::PathBuf]) -> Result<Vec<Vec<u8>>, TokenError> {
    let mut keys = Vec::new();
    for f in files {
        keys.extend(read_key_if_any(f)?);
    }
    if keys.is_empty() {
        return Err(TokenError::NoKey {
            files: files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(keys)
}

/// A token id unlikely to repeat: 128 bits from two independently seeded hashers.
fn token_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let a = RandomState::new().hash_one((nanos, std::process::id()));
    let b = RandomState::new().hash_one((a, nanos));
    format!("{a:016x}{b:016x}")
}

/// Issues an agent token for `subject`, bound to `destination`, valid for `ttl`
/// ([`issue_token_for`] issues plugin tokens: `destination` `None` is refused here, as such a
/// token would carry no projects).
pub fn issue_token(
    key: &[u8],
    subject: &str,
    destination: Option<&str>,
    ttl: Duration,
) -> Result<(String, Claims), TokenError> {
    issue_token_for(key, subject, destination, None, ttl)
}

/// A token for `subject` valid for `ttl`: an agent's when `destination` is set, else a
/// plugin's bound to the Kargo projects (globs) `projects` (its `projects` claim; required:
/// [`TokenError::NoProjects`] without them).
pub fn issue_token_for(
    key: &[u8],
    subject: &str,
    destination: Option<&str>,
    projects: Option<&[String]>,
    ttl: Duration,
) -> Result<(String, Claims), TokenError> {
    if destination.is_none() && projects.is_none_or(<[String]>::is_empty) {
        return Err(TokenError::NoProjects);
    }
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let claims = Claims {
        sub: subject.to_string(),
        aud: AUDIENCE.to_string(),
        exp: now + ttl.as_secs(),
        iat: now,
        jti: token_id(),
        destination: destination.map(str::to_string),
        projects: projects.map(<[String]>::to_vec),
    };
    let token = issue(key, &claims).map_err(|e| TokenError::Sign(e.to_string()))?;
    Ok((token, claims))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::auth::JwtAuthenticator;

    #[test]
    fn issued_agent_tokens_carry_their_destination_and_expire() {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let (token, claims) = issue_token(
            &key,
            "agent:edge-1",
            Some("edge-1"),
            Duration::from_secs(3600),
        )
        .unwrap();
        assert_eq!(claims.exp - claims.iat, 3600);
        let auth = JwtAuthenticator::new(std::slice::from_ref(&key), []);
        let p = auth.authenticate(&token).unwrap();
        assert_eq!(
            (p.subject.as_str(), p.destination.as_deref()),
            ("agent:edge-1", Some("edge-1"))
        );
        let revoked = JwtAuthenticator::new(&[key], [claims.jti.clone()]);
        assert!(revoked
            .authenticate(&token)
            .unwrap_err()
            .to_string()
            .contains("revoked"));
        let (_, other) = issue_token(
            b"0123456789abcdef0123456789abcdef",
            "x",
            Some("edge-1"),
            Duration::from_secs(1),
        )
        .unwrap();
        assert_ne!(other.jti, claims.jti);
    }

    #[test]
    fn project_tokens_carry_their_projects() {
        let key = b"0123456789abcdef0123456789abcdef".to_vec();
        let projects = ["team-a".to_string(), "team-b-*".to_string()];
        let (token, claims) =
            issue_token_for(&key, "ci", None, Some(&projects), Duration::from_secs(60)).unwrap();
        assert_eq!(claims.projects.as_deref(), Some(&projects[..]));
        let p = JwtAuthenticator::new(std::slice::from_ref(&key), [])
            .authenticate(&token)
            .unwrap();
        assert!(p.projects.allows("team-b-x") && !p.projects.allows("team-c"));
        // Without projects, no plugin token: the server would refuse it.
        for projects in [None, Some(&[][..])] {
            let e = issue_token_for(&key, "plugin", None, projects, Duration::from_secs(60));
            assert!(matches!(e, Err(TokenError::NoProjects)), "{e:?}");
        }
        let e = issue_token(&key, "plugin", None, Duration::from_secs(60)).unwrap_err();
        assert!(e.to_string().contains("--project '*'"), "{e}");
    }

    #[test]
    fn short_keys_are_refused() {
        let dir = std::env::temp_dir().join(format!("rd-key-{}", std::process::id()));
        std::fs::write(&dir, "short\n").unwrap();
        assert!(read_key(&dir)
            .unwrap_err()
            .to_string()
            .contains("at least 32"));
        std::fs::remove_file(dir).ok();
    }
}
