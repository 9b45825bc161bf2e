//! A cap on concurrent reads: the API and /metrics take a permit each, and a request that finds
//! none is answered 503 with `Retry-After` at once rather than queued. With the readers' pool
//! bounded too ([`crate::store::pg::READ_CONNECTIONS`]), no number of readers can take ingest's or the
//! assessment's connections, or make a read wait behind a thousand others.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ErrorBody;

/// Reads in flight at most: the readers' pool's connections, twice over (a read holds one only
/// while its statements run).
pub const MAX_CONCURRENT_READS: usize = 2 * crate::store::pg::READ_CONNECTIONS as usize;

/// The permits, shared by every route that reads.
pub fn permits() -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_READS))
}

/// Runs the request with a permit, or answers 503 when every one is taken.
pub async fn limit(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Ok(_permit) = s.readers.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(ErrorBody { error: format!("{MAX_CONCURRENT_READS} reads are in flight already; retry") }),
        )
            .into_response();
    };
    next.run(req).await
}
