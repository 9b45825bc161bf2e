//! A cap on concurrent reads: the API and /metrics take a permit each, and a request that finds
//! none is answered 503 with `Retry-After` at once rather than queued. With the readers' pool
//! bounded too (`--database-read-connections`), no number of readers can take ingest's or the
//! assessment's connections, or make a read wait behind a thousand others.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ErrorBody;

/// Reads in flight at most for a readers' pool of `connections`: twice over (a read holds a
/// connection only while its statements run).
pub fn max_concurrent_reads(connections: u32) -> usize {
    2 * connections.max(1) as usize
}

/// The permits for a readers' pool of `connections`, shared by every route that reads.
pub fn permits(connections: u32) -> Arc<tokio::sync::Semaphore> {
    Arc::new(tokio::sync::Semaphore::new(max_concurrent_reads(connections)))
}

/// Runs the request with a permit, or answers 503 when every one is taken.
pub async fn limit(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Ok(_permit) = s.readers.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            axum::Json(ErrorBody { error: "every read slot of the collector is taken; retry".to_owned() }),
        )
            .into_response();
    };
    next.run(req).await
}
