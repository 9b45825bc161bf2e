//! Which database errors say "the server went away", not "the query was wrong".
//!
//! During a failover or a planned switchover every connection to the old primary, and every
//! read connection to a replica being promoted, is cut (HAProxy closes a server's sessions
//! when its health check fails; a demoted primary restarts as a replica). A query on such a
//! connection fails with an I/O error, an administrator-shutdown or cannot-connect-now
//! SQLSTATE, or a replica's recovery-conflict cancel. None of these says anything about the
//! query: the same query on a fresh connection answers. The HTTP side repeats a read on
//! exactly these (`http::retry`); every other error is reported as it is. Ingest needs no
//! such test: it answers every failed commit `UNAVAILABLE` and the agent sends the batch again,
//! stored once by its record ids.

/// True when `e` means the connection or the server was lost, so the same work on a new
/// connection may succeed. A pool that had no connection free in time is not: it is busy, and
/// repeating the read would add to what keeps it busy.
pub fn is_connection_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_lost(&c)),
        // The server's side of a new connection went away while TLS was being negotiated (a
        // member stopping behind the proxy): its answer to the SSLRequest is not 'S' or 'N'.
        sqlx::Error::Protocol(m) => m.starts_with("unexpected response from SSLRequest"),
        _ => false,
    }
}

/// SQLSTATEs of a lost server: class 08 (connection exception), 57P01–57P03 (administrator
/// or crash shutdown, cannot connect now), 40001 raised as a hot standby's recovery-conflict
/// cancel, 25006 (read-only transaction: the server behind the URL was demoted).
fn sqlstate_is_lost(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "40001" | "25006")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_and_shutdown_states_are_lost_and_query_errors_are_not() {
        let eof =
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "expected to read 5 bytes, got 0 bytes at EOF");
        assert!(is_connection_lost(&sqlx::Error::Io(eof)));
        assert!(!is_connection_lost(&sqlx::Error::PoolTimedOut), "busy, not lost: never repeated");
        assert!(!is_connection_lost(&sqlx::Error::RowNotFound));
        assert!(!is_connection_lost(&sqlx::Error::Protocol("bad".into())));
        assert!(is_connection_lost(&sqlx::Error::Protocol("unexpected response from SSLRequest: 0x00".into())));
        for lost in ["08006", "08001", "57P01", "57P03", "40001", "25006"] {
            assert!(sqlstate_is_lost(lost), "{lost}");
        }
        for wrong in ["42P01", "23505", "22P02", "57014"] {
            assert!(!sqlstate_is_lost(wrong), "{wrong}");
        }
    }
}
