//! One error type for the HTTP API: JSON bodies, 4xx for the caller's mistakes, 500s logged
//! in full here and reported without internals.

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

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
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
