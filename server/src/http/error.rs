//! API errors: what the engine reports ([`DispatchError`]) and what a client sees ([`ApiFailure`]).
//!
//! A [`DispatchError`] is a class (the variant: status and `code`) and a [`Reason`]: the message
//! the client reads, and the error value it came from, kept as its `source` so that the server
//! log can render the whole chain ([`Chain`]) once, at the edge, instead of each layer
//! flattening it to text.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dispatch_api::v1::ApiError;
use tracing::error;

/// Why the engine could not do what was asked. Each class displays its message, exactly what
/// the client reads; the error it came from, if any, is its `source`.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    /// The plugin block is unusable (the message names the field).
    #[error(transparent)]
    InvalidBlock(Reason),
    /// A destination name is not known, or a selector matched none (the message lists the known ones).
    #[error(transparent)]
    UnknownDestination(Reason),
    /// Policy or the caller's token does not allow it (the message names project, destination and config key).
    #[error(transparent)]
    Forbidden(Reason),
    /// Nothing matches (e.g. status of Jobs that do not exist).
    #[error(transparent)]
    NotFound(Reason),
    /// A foreign object is in the way (e.g. a Job of the same name that we did not create).
    #[error(transparent)]
    Conflict(Reason),
    /// A destination refused the Job (its API's validation, an admission policy, a quota, a
    /// foreign Job under our name): retrying the same Job cannot help. The message quotes the
    /// destination's reason.
    #[error(transparent)]
    Refused(Reason),
    /// A destination cannot be reached right now; retrying may help.
    #[error(transparent)]
    Unavailable(Reason),
    /// A caller holds too many requests of one kind open (an agent's long polls); it retries later.
    #[error(transparent)]
    TooManyPolls(Reason),
    /// A project (or agent destination) holds its whole share of a per-owner budget
    /// (`runtime::quota`: the message names the owner and the config key); it retries after
    /// `Retry-After`, and other projects are not affected.
    #[error(transparent)]
    OverBudget(Reason),
    /// A bug or an unexpected failure; details go to the server log only.
    #[error(transparent)]
    Internal(Reason),
}

impl DispatchError {
    /// What the client reads.
    pub fn message(&self) -> &str {
        match self {
            Self::InvalidBlock(r)
            | Self::UnknownDestination(r)
            | Self::Forbidden(r)
            | Self::NotFound(r)
            | Self::Conflict(r)
            | Self::Refused(r)
            | Self::Unavailable(r)
            | Self::TooManyPolls(r)
            | Self::OverBudget(r)
            | Self::Internal(r) => r.message(),
        }
    }
}

impl From<crate::runtime::quota::OverQuota> for DispatchError {
    fn from(e: crate::runtime::quota::OverQuota) -> Self {
        Self::OverBudget(Reason::of(e))
    }
}

/// The error a cause keeps: any error value, for the server log.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// A [`DispatchError`]'s message and, when it came from an error value, that error.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Reason {
    message: String,
    #[source]
    source: Option<Cause>,
}

impl Reason {
    /// What the client reads.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The text of `e` is the message, and `e` stays its source.
    pub fn of(e: impl Into<Cause>) -> Self {
        let source = e.into();
        Self {
            message: source.to_string(),
            source: Some(source),
        }
    }

    /// `message` for the client, `source` kept for the log.
    pub fn caused_by(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

impl From<String> for Reason {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for Reason {
    fn from(message: &str) -> Self {
        message.to_string().into()
    }
}

/// Renders an error and its sources, `: `-separated, once, where it is logged; a source whose
/// text the line already holds is left out (a message made from its source's text).
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut line = self.0.to_string();
        let mut next = self.0.source();
        while let Some(cause) = next {
            let text = cause.to_string();
            if !line.contains(&text) {
                line = format!("{line}: {text}");
            }
            next = cause.source();
        }
        f.write_str(&line)
    }
}

/// An error reply: status code plus the stable JSON body `{"code", "message"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// HTTP status
    pub status: StatusCode,
    /// the body
    pub body: ApiError,
    /// seconds for `Retry-After` (a refusal by a budget)
    pub retry_after: Option<u32>,
}

impl ApiFailure {
    /// An error reply.
    pub fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self {
            status,
            body: ApiError {
                code: code.to_string(),
                message: message.into(),
            },
            retry_after: None,
        }
    }
}

impl From<DispatchError> for ApiFailure {
    fn from(e: DispatchError) -> Self {
        let (status, code) = match &e {
            DispatchError::InvalidBlock(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_block"),
            DispatchError::UnknownDestination(_) => (StatusCode::NOT_FOUND, "unknown_destination"),
            DispatchError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            DispatchError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            DispatchError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
            DispatchError::Refused(_) => {
                (StatusCode::UNPROCESSABLE_ENTITY, "refused_by_destination")
            }
            DispatchError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            DispatchError::TooManyPolls(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_polls"),
            DispatchError::OverBudget(_) => {
                let mut reply =
                    Self::new(StatusCode::TOO_MANY_REQUESTS, "over_budget", e.message());
                reply.retry_after = Some(crate::runtime::quota::RETRY_AFTER_SECONDS);
                return reply;
            }
            DispatchError::Internal(_) => {
                let id = format!(
                    "{:016x}",
                    std::collections::hash_map::RandomState::new().hash_one(e.message())
                );
                // The full chain goes to the log only; the client gets the id to quote.
                error!(error_id = %id, error = %Chain(&e), "internal error");
                return Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("internal error {id}; the server log has the details"),
                );
            }
        };
        Self::new(status, code, e.message())
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let mut reply = (self.status, Json(self.body)).into_response();
        if let Some(seconds) = self.retry_after {
            reply.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(seconds),
            );
        }
        reply
    }
}

use std::hash::BuildHasher;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_reads_the_message_and_the_log_the_chain() {
        let io = std::io::Error::other("connection refused");
        let e = DispatchError::Unavailable(Reason::caused_by("destination a is unreachable", io));
        assert_eq!(e.to_string(), "destination a is unreachable");
        assert_eq!(
            Chain(&e).to_string(),
            "destination a is unreachable: connection refused"
        );
        let reply = ApiFailure::from(e);
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.body.message, "destination a is unreachable");
    }

    #[test]
    fn over_budget_is_429_with_retry_after_naming_the_key() {
        let refused = crate::runtime::quota::Quota::new("budgets.x", "project", "calls", 1, None);
        let _held = refused.take("team-a").unwrap();
        let e = DispatchError::from(refused.take("team-a").unwrap_err());
        let reply = ApiFailure::from(e).into_response();
        assert_eq!(reply.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.headers()[axum::http::header::RETRY_AFTER], "1");
        let plain = ApiFailure::new(StatusCode::CONFLICT, "conflict", "x").into_response();
        assert!(plain
            .headers()
            .get(axum::http::header::RETRY_AFTER)
            .is_none());
    }

    #[test]
    fn a_message_made_of_its_source_is_not_repeated() {
        let e = DispatchError::Internal(Reason::of(std::io::Error::other("disk full")));
        assert!(std::error::Error::source(&e).is_some(), "the cause is kept");
        assert_eq!(Chain(&e).to_string(), "disk full");
        let reply = ApiFailure::from(e);
        assert_eq!(reply.body.code, "internal");
        assert!(
            !reply.body.message.contains("disk full"),
            "{}",
            reply.body.message
        );
    }
}
