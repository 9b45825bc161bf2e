//! Session-level advisory locks on a connection of their own: whoever holds one leads a
//! fleet-wide task ([`crate::tasks::leader`]); Postgres releases it when the connection or its
//! process dies.

use sqlx::PgConnection;

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
