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

/// Reads in flight at least, whatever the pool: a dashboard's page asks for a few at once.
pub const MIN_READS_IN_FLIGHT: usize = 8;

/// Reads in flight at most for a readers' pool of `connections`: twice over (a read holds a
/// connection only while its statements run), and never fewer than a page's reads. Those past
/// the pool's connections wait for one; the pool, not this cap, bounds the database's share.
pub fn max_concurrent_reads(connections: u32) -> usize {
    (2 * connections.max(1) as usize).max(MIN_READS_IN_FLIGHT)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::pg::{READ_CONNECTIONS, REPLICA_READ_CONNECTIONS, default_read_connections};

    #[test]
    fn a_small_pool_still_admits_a_pages_reads_and_a_replica_gets_more_connections() {
        assert_eq!(default_read_connections(false), READ_CONNECTIONS);
        assert_eq!(default_read_connections(true), REPLICA_READ_CONNECTIONS);
        const { assert!(READ_CONNECTIONS < REPLICA_READ_CONNECTIONS) };
        assert_eq!(max_concurrent_reads(0), MIN_READS_IN_FLIGHT, "no pool is smaller than one connection");
        assert_eq!(max_concurrent_reads(READ_CONNECTIONS), MIN_READS_IN_FLIGHT);
        assert_eq!(max_concurrent_reads(REPLICA_READ_CONNECTIONS), 12);
        assert_eq!(permits(64).available_permits(), 128);
    }
}
