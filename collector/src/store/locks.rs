//! Session-level advisory locks on a connection of their own: whoever holds one leads a
//! fleet-wide task ([`crate::tasks::leader`]) or assesses a part of the fleet
//! ([`crate::tasks::share`]); Postgres releases it when the connection or its process dies.

use sqlx::PgConnection;

/// Advisory lock keys (bound parameters; any collector of this project uses the same). A
/// session-level lock per fleet-wide task decides who leads it.
pub const ASSESSMENT: i64 = 0x7261_696c_6173_7365; // "railasse"
pub const RETENTION: i64 = 0x7261_696c_7265_746e; // "railretn"
pub const K8S_NODES: i64 = 0x7261_696c_6b38_736e; // "railk8sn"
/// The transaction-level lock every assessment writes under, whichever replica and task runs it:
/// shared by a write of some nodes (which also takes their parts' [`ASSESSMENT_WRITE_PART`]
/// locks), exclusive for a write of the whole fleet.
pub const ASSESSMENT_WRITE: i64 = ASSESSMENT ^ 1;
/// Two-key lock classes (`pg_advisory_lock(class, key)`): a collector's member slot in the
/// split assessment (key: the slot), and the parts of the fleet (key: the part).
pub const ASSESSMENT_MEMBER: i32 = 0x7261_6d62; // "ramb"
pub const ASSESSMENT_PART: i32 = 0x7261_7074; // "rapt"
/// Transaction-level lock class (key: the part) a write of some nodes takes for each of their
/// parts, in ascending order, under [`ASSESSMENT_WRITE`] shared: writes of different parts go
/// on together, writes of one node one at a time.
pub const ASSESSMENT_WRITE_PART: i32 = 0x7261_7770; // "rawp"

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

/// Takes lock (`class`, `key`) on this connection if nobody holds it; whether it did.
pub async fn try_lock_in(conn: &mut PgConnection, class: i32, key: i32) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar("SELECT pg_try_advisory_lock($1, $2)").bind(class).bind(key).fetch_one(conn).await
}

/// The keys of `class` held now by any session on this database, sorted.
pub async fn held_in(conn: &mut PgConnection, class: i32) -> Result<Vec<i32>, sqlx::Error> {
    let keys: Vec<i64> = sqlx::query_scalar(
        "SELECT objid::int8 FROM pg_locks
         WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND classid::int8 = $1
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
         ORDER BY 1",
    )
    .bind(i64::from(class))
    .fetch_all(conn)
    .await?;
    Ok(keys.into_iter().filter_map(|k| i32::try_from(k).ok()).collect())
}

/// Gives up every session-level advisory lock this connection holds.
pub async fn unlock_all(conn: &mut PgConnection) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock_all()").execute(conn).await?;
    Ok(())
}

/// Takes, of locks (`class`, key) for `keys`, those nobody holds, in one statement; the keys
/// taken, in the order given.
pub async fn try_lock_each_in(conn: &mut PgConnection, class: i32, keys: &[i32]) -> Result<Vec<i32>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT k FROM unnest($2::int4[]) WITH ORDINALITY AS t(k, i) WHERE pg_try_advisory_lock($1, k) ORDER BY i",
    )
    .bind(class)
    .bind(keys)
    .fetch_all(conn)
    .await
}

/// Gives up locks (`class`, key) for `keys`, in one statement.
pub async fn unlock_each_in(conn: &mut PgConnection, class: i32, keys: &[i32]) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT pg_advisory_unlock($1, k) FROM unnest($2::int4[]) AS t(k)")
        .bind(class)
        .bind(keys)
        .execute(conn)
        .await?;
    Ok(())
}
