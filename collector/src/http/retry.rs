//! Reads answered across a database failover.
//!
//! Every route the HTTP side serves is a read (the API is read-only), so a request whose
//! database connection was lost mid-query ([`ConnectionLost`] on the response) can be run
//! again on a fresh connection without changing anything. During a Patroni switchover the
//! replica being promoted leaves the read port and HAProxy cuts the pool's connections to
//! it; the pool's next connection lands on a replica still serving. The middleware runs the
//! request again after short pauses (at most [`PAUSES`] in total) and answers the first
//! result that is not a lost connection, or the last 503 with its `Retry-After`.
//!
//! Only `GET` and `HEAD` are repeated: they are the only methods the router serves, and a
//! method that could write must never run twice on a guess.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use super::error::ConnectionLost;

/// The pauses before each repeat. Their sum bounds how long a read waits for the read port
/// to route to a serving replica again: HAProxy's health checks take a second or two to mark
/// a member down, and a replica that restarts to follow a new primary is gone for a few.
const PAUSES: [Duration; 5] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(1000),
    Duration::from_millis(2000),
    Duration::from_millis(3000),
];

pub async fn retry_lost_connection(req: Request, next: Next) -> Response {
    if !matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    // A GET's body carries nothing the routes read; each attempt gets the same head.
    let (head, _body) = req.into_parts();
    let mut pauses = PAUSES.iter();
    loop {
        let resp = next.clone().run(Request::from_parts(head.clone(), Body::empty())).await;
        if resp.extensions().get::<ConnectionLost>().is_none() {
            return resp;
        }
        match pauses.next() {
            Some(pause) => tokio::time::sleep(*pause).await,
            None => return resp,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::get;
    use tower::ServiceExt;

    use super::*;
    use crate::http::ApiError;

    /// A route whose first `lost` calls lose their connection, then answers.
    fn flaky(lost: usize) -> (Router, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let handler = move || {
            let c = c.clone();
            async move {
                if c.fetch_add(1, Ordering::SeqCst) < lost {
                    let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "got 0 bytes at EOF");
                    return ApiError::Database(sqlx::Error::Io(eof)).into_response();
                }
                "answered".into_response()
            }
        };
        let app = Router::new()
            .route("/r", get(handler.clone()).post(handler))
            .layer(axum::middleware::from_fn(retry_lost_connection));
        (app, calls)
    }

    fn req(method: Method) -> Request {
        Request::builder().method(method).uri("/r").body(Body::empty()).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_lost_its_connection_is_answered_on_the_next() {
        let (app, calls) = flaky(2);
        let resp = app.oneshot(req(Method::GET)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_stays_lost_is_a_503_with_retry_after() {
        let (app, calls) = flaky(usize::MAX);
        let resp = app.oneshot(req(Method::GET)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[axum::http::header::RETRY_AFTER], "1");
        assert_eq!(calls.load(Ordering::SeqCst), PAUSES.len() + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_method_that_could_write_runs_once() {
        let (app, calls) = flaky(1);
        let resp = app.oneshot(req(Method::POST)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
