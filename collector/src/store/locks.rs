//! Session-level advisory locks on a connection of their own: whoever holds one leads a
//! fleet-wide task ([`crate::tasks::leader`]); Postgres releases it when the connection or its
//! process dies.

use sqlx::PgConnection;

/// Advisory lock keys (bound parameters; any collector of this project uses the same). A
/// session-level lock per fleet-wide task decides who leads it.
pub const ASSESSMENT: i64 = 0x7261_696c_6173_7365; // "railasse"
pub const RETENTION: i64 = 0x7261_696c_7265_746e; // "railretn"
pub const K8S_NODES: i64 = 0x7261_696c_6b38_736e; // "railk8sn"
/// The transaction-level lock every assessment writes under, whichever replica and task runs it.
pub const ASSESSMENT_WRITE: i64 = ASSESSMENT ^ 1;

/// Whether the connection still answers (a held lock is held as long as it does).
pub async fn answers(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1").execute(conn).await?;
    Ok(())
}

/// Takes lock `key` on this connection if nobody holds it; whether it did.
pub async fn try_lock(conn: &mut PgConnection, key: i64) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(conn).await
}

/// Gives lock `key` up.
pub async fn unlock(conn: &mut PgConnection, key: i64) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1)").bind(key).execute(conn).await?;
    Ok(())
}
