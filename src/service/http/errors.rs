//! The HTTP layer's error: [`ApiError`], a status and one sentence, answered as
//! `{"error": "..."}` (the table of statuses is in [`super`]'s doc), and how the service's
//! other errors map to it (the store's, the model host's, a model that does not run, the
//! engine's).

use actix_web::http::header::ALLOW;
use actix_web::http::{Method, StatusCode};
use actix_web::{HttpResponse, ResponseError};

use super::wire::ErrorBody;
use crate::service::host::HostError;
use crate::service::runtime::NotRunning;
use crate::service::store::StoreError;

/// What a handler answers: its value, or an [`ApiError`].
pub(super) type Result<T, E = ApiError> = std::result::Result<T, E>;

/// An API error: a status and one sentence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct ApiError {
    pub(super) status: u16,
    pub(super) message: String,
    /// The methods the route takes (a 405's `Allow`).
    allow: Option<&'static str>,
}

impl ApiError {
    pub(super) fn new(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), allow: None }
    }
    pub(super) fn not_allowed(method: &Method, allow: &'static str) -> Self {
        Self { allow: Some(allow), ..Self::new(405, format!("method {method} is not allowed here: use {allow}")) }
    }
    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }
    pub(super) fn internal(message: impl Into<String>) -> Self {
        Self::new(500, message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
    fn error_response(&self) -> HttpResponse {
        let mut res = HttpResponse::build(self.status_code());
        if let Some(allow) = self.allow {
            res.insert_header((ALLOW, allow));
        }
        res.json(ErrorBody { error: self.message.clone() })
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match &e {
            StoreError::NotFound(_) | StoreError::NoApplication(_) | StoreError::NoToken(_) => 404,
            StoreError::ModelDying | StoreError::Refused(_) => 409,
            StoreError::Invalid { .. } => 400,
            // The database cannot be reached: no answer rather than a stale one.
            StoreError::Unavailable(_) => 503,
            StoreError::Postgres { source, .. } if source.connection_lost || source.timed_out() => 503,
            _ => 500,
        };
        Self::new(status, e.to_string())
    }
}

impl From<NotRunning> for ApiError {
    fn from(e: NotRunning) -> Self {
        match e {
            NotRunning::Follower { .. } => ApiError::new(503, e.to_string()),
            NotRunning::Internal(message) => ApiError::internal(message),
        }
    }
}

impl From<crate::ProvisionerError> for ApiError {
    fn from(e: crate::ProvisionerError) -> Self {
        match e {
            crate::ProvisionerError::Config(c) => Self::bad_request(c.to_string()),
            other => Self::internal(other.to_string()),
        }
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> Self {
        Self::new(e.status(), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MachineId;

    #[test]
    fn store_errors_map_to_statuses() {
        assert_eq!(ApiError::from(StoreError::NotFound(MachineId::new("3"))).status, 404);
        assert_eq!(ApiError::from(StoreError::ModelDying).status, 409);
        assert_eq!(ApiError::from(StoreError::Stopped(actix::MailboxError::Closed)).status, 500);
    }
}
