//! One error type for the HTTP API: JSON bodies, 4xx for the caller's mistakes, 500s logged
//! in full here and reported without internals. A lost database connection (a failover cut
//! it) is a 503 with `Retry-After`, marked with [`ConnectionLost`] so [`super::retry`] can
//! answer the same read again on a fresh connection before the caller sees it.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Every error's body: `{"error": "..."}`.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// What was wrong, for a person (internals of a 500 are only in the collector's log).
    pub error: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("a valid `Authorization: Bearer <token>` header is required")]
    Unauthorized,
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
}

/// Marks a response whose database connection was lost mid-request: the same read on a
/// fresh connection may answer.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLost;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Database(e) = &self
            && crate::store::pg::is_connection_lost(e)
        {
            tracing::warn!(error = %e, "the database connection was lost; the read may be retried");
            let mut resp = (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "1")],
                Json(ErrorBody { error: "the database connection was lost (a failover?); retry".to_owned() }),
            )
                .into_response();
            resp.extensions_mut().insert(ConnectionLost);
            return resp;
        }
        if let ApiError::Database(sqlx::Error::PoolTimedOut) = &self {
            // Every read connection busy: the caller comes back later; ingest is not touched
            // (it has a pool of its own).
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "2")],
                Json(ErrorBody { error: "the collector's reads are all busy; retry".to_owned() }),
            )
                .into_response();
        }
        if let ApiError::Database(sqlx::Error::Database(db)) = &self
            && db.code().as_deref() == Some("57014")
        {
            // A read past its statement timeout: bounded, so no reader holds a connection long.
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(axum::http::header::RETRY_AFTER, "5")],
                Json(ErrorBody {
                    error: "the read took longer than its time limit; narrow it (since, limit) or retry".to_owned(),
                }),
            )
                .into_response();
        }
        let status = match &self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Database(e) => {
                tracing::error!(error = %e, "API request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        let message = match &self {
            ApiError::Database(_) => "internal error; see the collector's log".to_owned(),
            other => other.to_string(),
        };
        (status, Json(ErrorBody { error: message })).into_response()
    }
}
