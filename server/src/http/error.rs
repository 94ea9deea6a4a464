//! API errors: what the engine reports ([`DispatchError`]) and what a client sees ([`ApiFailure`]).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use dispatch_api::v1::ApiError;
use tracing::error;

/// Why the engine could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// The plugin block is unusable (the message names the field).
    #[error("{0}")]
    InvalidBlock(String),
    /// A destination name is not known, or a selector matched none (the message lists the known ones).
    #[error("{0}")]
    UnknownDestination(String),
    /// Policy or the caller's token does not allow it (the message names project, destination and config key).
    #[error("{0}")]
    Forbidden(String),
    /// Nothing matches (e.g. status of Jobs that do not exist).
    #[error("{0}")]
    NotFound(String),
    /// A foreign object is in the way (e.g. a Job of the same name that we did not create).
    #[error("{0}")]
    Conflict(String),
    /// A destination refused the Job (its API's validation, an admission policy, a quota, a
    /// foreign Job under our name): retrying the same Job cannot help. The message quotes the
    /// destination's reason.
    #[error("{0}")]
    Refused(String),
    /// A destination cannot be reached right now; retrying may help.
    #[error("{0}")]
    Unavailable(String),
    /// A caller holds too many requests of one kind open (an agent's long polls); it retries later.
    #[error("{0}")]
    TooManyPolls(String),
    /// A bug or an unexpected failure; details go to the server log only.
    #[error("{0}")]
    Internal(String),
}

/// An error reply: status code plus the stable JSON body `{"code", "message"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiFailure {
    /// HTTP status
    pub status: StatusCode,
    /// the body
    pub body: ApiError,
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
            DispatchError::Internal(detail) => {
                let id = format!(
                    "{:016x}",
                    std::collections::hash_map::RandomState::new().hash_one(detail)
                );
                error!(error_id = %id, error = %detail, "internal error");
                return Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    format!("internal error {id}; the server log has the details"),
                );
            }
        };
        Self::new(status, code, e.to_string())
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

use std::hash::BuildHasher;
