//! The assessment schedule's state in `nodes`: which nodes have a batch not yet claimed by a
//! pass (`evidence_pending`), when each was last assessed (`assessed_at`) and which part of the
//! split assessment it is of (`assess_part`); each part's last pass (`assessment_parts`); and
//! the nodes with evidence dated in a slice of time. The decisions over these (which nodes a pass takes)
//! are [`crate::assess`]'s.
//!
//! Invariant: a pending flag is cleared only by [`claim_pending`], which returns the nodes it
//! cleared; ingest sets it in the batch's own transaction, so a claim never precedes the
//! evidence it stands for.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// How many parts the split assessment divides the fleet into: `nodes.assess_part` is
/// `hash & 63` (migration 0049), so every collector of this schema agrees on it.
pub const PARTS: i16 = 64;

/// The nodes a claim took, and how many it left pending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claimed {
    pub nodes: Vec<String>,
    /// Nodes of the claim's parts still pending after it (counted only when it took its limit).
    pub left: usize,
}

/// Clears the flag of the nodes with a batch stored since their last claim, of `parts` (every
/// part: None), at most `limit` of them (None: all), those assessed longest ago (never first),
/// and returns them: a claim writes only the nodes it takes, however many are pending. A node
/// whose row a batch in flight holds is skipped, left pending for the next claim: a claim never
/// waits behind ingest.
pub async fn claim_pending(pool: &PgPool, parts: Option<&[i16]>, limit: Option<usize>) -> Result<Claimed, sqlx::Error> {
    let limit = limit.map(|l| i64::try_from(l).unwrap_or(i64::MAX));
    let nodes: Vec<String> = sqlx::query_scalar(
        "UPDATE nodes SET evidence_pending = false
         WHERE evidence_pending
           AND node_id IN (SELECT node_id FROM nodes
                           WHERE evidence_pending AND ($1::int2[] IS NULL OR assess_part = ANY($1))
                           ORDER BY assessed_at NULLS FIRST, node_id LIMIT $2
                           FOR UPDATE SKIP LOCKED)
         RETURNING node_id",
    )
    .bind(parts)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let left = if limit.is_some_and(|l| i64::try_from(nodes.len()).unwrap_or(i64::MAX) >= l) {
        pending_count(pool, parts).await?
    } else {
        0
    };
    Ok(Claimed { nodes, left })
}

/// How many nodes of `parts` (every part: None) are pending.
pub async fn pending_count(pool: &PgPool, parts: Option<&[i16]>) -> Result<usize, sqlx::Error> {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM nodes WHERE evidence_pending AND ($1::int2[] IS NULL OR assess_part = ANY($1))",
    )
    .bind(parts)
    .fetch_one(pool)
    .await?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Which of `nodes` are of `parts`.
pub async fn of_parts(pool: &PgPool, nodes: &[String], parts: &[i16]) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar("SELECT node_id FROM nodes WHERE node_id = ANY($1) AND assess_part = ANY($2)")
        .bind(nodes)
        .bind(parts)
        .fetch_all(pool)
        .await
}

/// The nodes of `parts` (every part: None) not pending whose newest evidence of any kind is
/// dated after `after` (`nodes.newest_evidence_at`, kept by ingest). A pending node is left
/// out: a claim takes it, and the pass after that claim's looks at its dates again.
pub async fn claimed_nodes_with_evidence_after(
    pool: &PgPool,
    after: DateTime<Utc>,
    parts: Option<&[i16]>,
) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT node_id FROM nodes
         WHERE newest_evidence_at > $1 AND NOT evidence_pending AND ($2::int2[] IS NULL OR assess_part = ANY($2))",
    )
    .bind(after)
    .bind(parts)
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

/// The nodes of `parts` (every part: None) not assessed since `before` (or never), oldest
/// first, at most one `share`-th of those parts' nodes (rounded up).
pub async fn assessed_before(
    pool: &PgPool,
    before: DateTime<Utc>,
    share: u32,
    parts: Option<&[i16]>,
) -> Result<Vec<String>, sqlx::Error> {
    let share = f64::from(share.max(1));
    match parts {
        None => {
            sqlx::query_scalar(
                "SELECT node_id FROM nodes WHERE assessed_at IS NULL OR assessed_at <= $1
                 ORDER BY assessed_at NULLS FIRST, node_id
                 LIMIT (SELECT ceil(count(*) / $2::float8)::bigint FROM nodes)",
            )
            .bind(before)
            .bind(share)
            .fetch_all(pool)
            .await
        }
        Some(parts) => {
            sqlx::query_scalar(
                "SELECT node_id FROM nodes WHERE assess_part = ANY($3) AND (assessed_at IS NULL OR assessed_at <= $1)
                 ORDER BY assessed_at NULLS FIRST, node_id
                 LIMIT (SELECT ceil(count(*) / $2::float8)::bigint FROM nodes WHERE assess_part = ANY($3))",
            )
            .bind(before)
            .bind(share)
            .bind(parts)
            .fetch_all(pool)
            .await
        }
    }
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

/// Marks every node of `parts` pending, for a pass to claim.
pub async fn mark_parts_pending(pool: &PgPool, parts: &[i16]) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE nodes SET evidence_pending = true WHERE assess_part = ANY($1) AND NOT evidence_pending")
        .bind(parts)
        .execute(pool)
        .await?;
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

/// Records that `holder` finished a pass over `parts` now: where a collector that takes one of
/// them over goes on from ([`part_passes`]).
pub async fn record_parts(pool: &PgPool, parts: &[i16], holder: &str) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO assessment_parts (part, finished_at, holder) SELECT unnest($1::int2[]), now(), $2
         ON CONFLICT (part) DO UPDATE SET finished_at = EXCLUDED.finished_at, holder = EXCLUDED.holder",
    )
    .bind(parts)
    .bind(holder)
    .execute(pool)
    .await?;
    Ok(())
}

/// When each of `parts` last finished a pass (a part never passed over is left out).
pub async fn part_passes(pool: &PgPool, parts: &[i16]) -> Result<Vec<(i16, DateTime<Utc>)>, sqlx::Error> {
    sqlx::query_as("SELECT part, finished_at FROM assessment_parts WHERE part = ANY($1)")
        .bind(parts)
        .fetch_all(pool)
        .await
}
