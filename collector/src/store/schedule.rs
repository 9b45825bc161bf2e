//! The assessment schedule's state in `nodes`: which nodes have a batch not yet claimed by a
//! pass (`evidence_pending`), and when each was last assessed (`assessed_at`); and the nodes
//! with evidence dated in a slice of time. The decisions over these (which nodes a pass takes)
//! are [`crate::assess`]'s.
//!
//! Invariant: a pending flag is cleared only by [`claim_pending`], which returns the nodes it
//! cleared; ingest sets it in the batch's own transaction, so a claim never precedes the
//! evidence it stands for.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Clears the flag of every node with a batch stored since its last claim; returns them.
pub async fn claim_pending(pool: &PgPool) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("UPDATE nodes SET evidence_pending = false WHERE evidence_pending RETURNING node_id")
        .fetch_all(pool)
        .await
}

/// The nodes with evidence of any kind observed in (`from`, `to`].
pub async fn nodes_with_evidence_dated(
    pool: &PgPool,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT node_id FROM probe_results WHERE observed_at > $1 AND observed_at <= $2
         UNION SELECT node_id FROM probe_summary_sets WHERE observed_at > $1 AND observed_at <= $2
         UNION SELECT node_id FROM signal_events WHERE observed_at > $1 AND observed_at <= $2
         UNION SELECT node_id FROM inline_reports WHERE observed_at > $1 AND observed_at <= $2",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
}

/// The nodes outside `nodes` whose in-line failures observed in (`since`, `until`] name a
/// source that a failure of `nodes` names too, or a transfer a source of `nodes` reported changed
/// at the source (`inline_source_changes`). Sorted.
pub async fn nodes_sharing_a_source(
    pool: &PgPool,
    nodes: &[String],
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "WITH f AS (
            SELECT node_id, source_key FROM inline_source_failures WHERE observed_at > $2 AND observed_at <= $3
         )
         SELECT node_id FROM f
         WHERE source_key IN (SELECT source_key FROM f WHERE node_id = ANY($1)) AND NOT node_id = ANY($1)
         UNION
         SELECT r.node_id FROM inline_reports r, jsonb_array_elements(r.failures) x
         WHERE r.observed_at > $2 AND r.observed_at <= $3 AND r.transfers_mismatch > 0 AND NOT r.node_id = ANY($1)
           AND x.value->>'mismatch' = 'true'
           AND x.value->>'remote' IN (SELECT transfer FROM inline_source_changes
                                      WHERE node_id = ANY($1) AND observed_at > $2 AND observed_at <= $3)
         ORDER BY node_id",
    )
    .bind(nodes)
    .bind(since)
    .bind(until)
    .fetch_all(pool)
    .await
}

/// The nodes not assessed since `before` (or never), oldest first, at most one `share`-th of
/// the fleet (rounded up).
pub async fn assessed_before(pool: &PgPool, before: DateTime<Utc>, share: u32) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT node_id FROM nodes WHERE assessed_at IS NULL OR assessed_at <= $1
         ORDER BY assessed_at NULLS FIRST, node_id
         LIMIT (SELECT ceil(count(*) / $2::float8)::bigint FROM nodes)",
    )
    .bind(before)
    .bind(f64::from(share.max(1)))
    .fetch_all(pool)
    .await
}

/// Marks `nodes` (every node: None) assessed at `now`, never moving a mark back.
pub async fn mark_assessed(pool: &PgPool, nodes: Option<&[String]>, now: DateTime<Utc>) -> Result<(), sqlx::Error> {
    // Two statements, not `$1 IS NULL OR …`: a cached generic plan of that could not use the
    // primary key for a few nodes.
    match nodes {
        Some(nodes) => {
            sqlx::query(
                "UPDATE nodes SET assessed_at = $2
                 WHERE node_id = ANY($1) AND (assessed_at IS NULL OR assessed_at < $2)",
            )
            .bind(nodes)
            .bind(now)
            .execute(pool)
            .await?;
        }
        None => {
            sqlx::query("UPDATE nodes SET assessed_at = $1 WHERE assessed_at IS NULL OR assessed_at < $1")
                .bind(now)
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

/// At most `max` of `nodes`, those assessed longest ago (never first).
pub async fn assessed_longest_ago(pool: &PgPool, nodes: &[String], max: usize) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT node_id FROM nodes WHERE node_id = ANY($1) ORDER BY assessed_at NULLS FIRST, node_id LIMIT $2",
    )
    .bind(nodes)
    .bind(i64::try_from(max).unwrap_or(i64::MAX))
    .fetch_all(pool)
    .await
}

/// Marks `nodes` (every node: None) pending, for a pass to claim.
pub async fn mark_pending(pool: &PgPool, nodes: Option<&[String]>) -> Result<(), sqlx::Error> {
    match nodes {
        Some(nodes) => {
            sqlx::query("UPDATE nodes SET evidence_pending = true WHERE node_id = ANY($1) AND NOT evidence_pending")
                .bind(nodes)
                .execute(pool)
                .await?;
        }
        None => {
            sqlx::query("UPDATE nodes SET evidence_pending = true WHERE NOT evidence_pending").execute(pool).await?;
        }
    }
    Ok(())
}

/// How many nodes the fleet has.
pub async fn node_count(pool: &PgPool) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT count(*) FROM nodes").fetch_one(pool).await
}

/// Records that `holder` finished a pass now: where a new leader goes on from
/// ([`crate::store::read::last_assessment`]).
pub async fn record_pass(pool: &PgPool, holder: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO assessment_runs (id, finished_at, holder) VALUES (1, now(), $1)
         ON CONFLICT (id) DO UPDATE SET finished_at = EXCLUDED.finished_at, holder = EXCLUDED.holder",
    )
    .bind(holder)
    .execute(pool)
    .await?;
    Ok(())
}
