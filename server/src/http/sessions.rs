//! Server-side sessions of the pages: a login's cookie holds a random id, never the token.
//!
//! A person logs in with a Kubernetes token of the control plane (or a tooling token); put in a
//! cookie, that token would sit in the browser's cookie store, go with every request, and stay
//! valid after "log out". Instead the login keeps the token here, in memory, under a random id
//! (32 bytes from the system's random source; no session is opened without it), and the cookie
//! [`SESSION_COOKIE`] carries the id only: `__Host-` (so only this origin, over TLS, with
//! `Path=/` and no `Domain`, may set it), `Secure`, `HttpOnly`, `SameSite=Strict`. A session
//! lasts `ui.sessionLifetime` from login; logout removes it at once, so the cookie is worth
//! nothing afterwards, wherever it was copied to. At most `ui.maxSessions` are held: a login
//! beyond ends the session that expires first (logins need an accepted token, so only people
//! and tools we know can fill them).
//!
//! The sessions are this replica's: with several replicas, a session works on the replica that
//! took the login (route people to one replica, e.g. the Service's `sessionAffinity: ClientIP`
//! or the ingress's cookie affinity), and a restart logs everyone out. The store the server
//! shares between replicas (`agents.store`) holds agent work, not secrets: tokens are not
//! written there.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::SessionSettings;

/// The session cookie: its value is a session id (see the module).
pub const SESSION_COOKIE: &str = "__Host-rollouts-dispatch-session";

/// The sessions of this replica.
#[derive(Debug)]
pub struct Sessions {
    settings: SessionSettings,
    open: Mutex<HashMap<String, Session>>,
}

/// One login.
#[derive(Debug)]
struct Session {
    /// the bearer token the login was given
    token: String,
    /// when it ends
    expires: Instant,
}

/// A session that cannot be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// the system's random source failed: no id that cannot be guessed
    #[error("the system's random source is unavailable, so no session id can be made; log in again later")]
    NoRandomness,
}

impl Default for Sessions {
    fn default() -> Self {
        Self::new(SessionSettings::default())
    }
}

impl Sessions {
    /// No sessions yet, each to last `settings.lifetime`, at most `settings.max` at once.
    pub fn new(settings: SessionSettings) -> Self {
        Self {
            settings,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// How long a session lasts (the cookie's `Max-Age`).
    pub fn lifetime(&self) -> Duration {
        self.settings.lifetime
    }

    /// A new session holding `token` (already accepted by the login); its id.
    pub fn open(&self, token: &str) -> Result<String, SessionError> {
        self.open_at(token, Instant::now())
    }

    fn open_at(&self, token: &str, now: Instant) -> Result<String, SessionError> {
        use ring::rand::SecureRandom;
        let mut bytes = [0u8; 32];
        ring::rand::SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|_| SessionError::NoRandomness)?;
        let id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.retain(|_, s| s.expires > now);
        while open.len() >= self.settings.max.max(1) {
            let first = open
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(id, _)| id.clone());
            match first {
                Some(first) => open.remove(&first),
                None => break,
            };
        }
        open.insert(
            id.clone(),
            Session {
                token: token.to_string(),
                expires: now + self.settings.lifetime,
            },
        );
        Ok(id)
    }

    /// The token of session `id`, if it is open and has not expired.
    pub fn token(&self, id: &str) -> Option<String> {
        self.token_at(id, Instant::now())
    }

    fn token_at(&self, id: &str, now: Instant) -> Option<String> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        match open.get(id) {
            Some(s) if s.expires > now => Some(s.token.clone()),
            Some(_) => {
                open.remove(id);
                None
            }
            None => None,
        }
    }

    /// Ends session `id` (logout); nothing if there is none.
    pub fn close(&self, id: &str) {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(id);
    }

    /// How many sessions are held (expired ones included until the next login).
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sessions(lifetime: u64, max: usize) -> Sessions {
        Sessions::new(SessionSettings {
            lifetime: Duration::from_secs(lifetime),
            max,
        })
    }

    #[test]
    fn a_session_holds_its_token_until_logout() {
        let s = sessions(60, 10);
        let id = s.open("the-token").unwrap();
        assert_eq!(id.len(), 64);
        assert!(!id.contains("the-token"));
        assert_eq!(s.token(&id).as_deref(), Some("the-token"));
        assert_ne!(
            s.open("the-token").unwrap(),
            id,
            "every login gets its own id"
        );
        s.close(&id);
        assert_eq!(s.token(&id), None);
        assert_eq!(s.token("guessed"), None);
    }

    #[test]
    fn a_session_ends_with_its_lifetime() {
        let s = sessions(60, 10);
        let now = Instant::now();
        let id = s.open_at("t", now).unwrap();
        assert!(s.token_at(&id, now + Duration::from_secs(59)).is_some());
        assert_eq!(s.token_at(&id, now + Duration::from_secs(60)), None);
        assert!(s.is_empty(), "an expired session is dropped when seen");
    }

    #[test]
    fn at_most_max_sessions_are_held() {
        let s = sessions(60, 2);
        let now = Instant::now();
        let first = s.open_at("1", now).unwrap();
        let second = s.open_at("2", now + Duration::from_secs(1)).unwrap();
        let third = s.open_at("3", now + Duration::from_secs(2)).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(
            s.token_at(&first, now),
            None,
            "the first to expire made room"
        );
        assert!(s.token_at(&second, now).is_some() && s.token_at(&third, now).is_some());
    }
}
