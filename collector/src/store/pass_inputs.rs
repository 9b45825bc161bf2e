//! The rows an assessment pass reads of its nodes (`filter`: the nodes, or NULL for all) in its
//! window, beside the probe evidence ([`crate::evidence`]): latest topologies, signals, in-line
//! counts, mismatches that are another end's, and the latest in-line failures. Making them a
//! GPU's inputs is [`crate::assess`]'s.
//!
//! Every query serves the whole fleet and a few nodes alike; [`begin`] opens the pass's read
//! transaction with each query planned for its own parameters (a cached generic plan cannot use
//! the node-first indexes for `($1 IS NULL OR node_id = ANY($1))`).

use chrono::{DateTime, Utc};
use railguard_schema::SignalKind;
use sqlx::types::Json;
use sqlx::{PgPool, Postgres, Transaction};

type Filter = Option<Vec<String>>;

/// The pass's read transaction.
pub async fn begin(pool: &PgPool) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(&mut *tx).await?;
    Ok(tx)
}

/// The pass's read of its nodes' latest topologies (`$1`: the nodes, or NULL for all): each
/// child table is reached by its key, node first, so one node's read costs the same whatever
/// the fleet's size (`e2e/tests/plans.rs` checks the plan).
pub const TOPOLOGY_READ: &str = "SELECT t.node_id, t.risks, t.gpudirect, t.gone_gpus,
        coalesce((SELECT array_agg(n.name ORDER BY n.name) FROM topology_nics n
                  WHERE n.node_id = t.node_id AND n.snapshot_id = t.record_id), '{}') AS nics,
        coalesce((SELECT jsonb_agg(jsonb_build_array(p.a, p.b, p.class)) FROM topology_paths p
                  WHERE p.node_id = t.node_id AND p.snapshot_id = t.record_id AND p.a LIKE 'GPU%'), '[]') AS paths
 FROM latest_topology t WHERE ($1::text[] IS NULL OR t.node_id = ANY($1))";

/// A node's latest topology as a pass reads it: its risks and its gone GPUs as stored (decoded
/// by the reader, which says what a row that no longer decodes damaged), its GPUDirect facts,
/// its NICs and its GPUs' paths `(a, b, class)`.
#[derive(sqlx::FromRow)]
pub struct TopologyRow {
    pub node_id: String,
    pub risks: Json<serde_json::Value>,
    pub gone_gpus: Json<serde_json::Value>,
    pub gpudirect: String,
    pub nics: Vec<String>,
    pub paths: Json<Vec<(String, String, String)>>,
}

pub async fn topologies(tx: &mut sqlx::PgConnection, filter: &Filter) -> Result<Vec<TopologyRow>, sqlx::Error> {
    sqlx::query_as(TOPOLOGY_READ).bind(filter).fetch_all(&mut *tx).await
}

/// Signals of one kind (and Xid) on one GPU or NIC, counted, with the latest summary.
#[derive(sqlx::FromRow)]
pub struct SignalGroup {
    pub node_id: String,
    pub gpu_index: Option<i32>,
    pub nic: String,
    pub kind: SignalKind,
    pub xid: Option<String>,
    pub count: i64,
    pub summary: String,
}

/// Signals in (`since`, `until`] grouped by GPU or NIC, kind and Xid; the agent's own
/// bookkeeping and events from libraries a non-root user could have written left out.
pub async fn signal_groups(
    tx: &mut sqlx::PgConnection,
    filter: &Filter,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<SignalGroup>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, nic, kind, attrs->>'xid' AS xid, count(*) AS count,
                (array_agg(summary ORDER BY observed_at DESC))[1] AS summary
         FROM signal_events
         WHERE observed_at > $2 AND observed_at <= $3 AND kind NOT IN ('agent_spool_drops', 'agent_spool_quarantine')
           -- events from a library a non-root user could have written: kept and shown, never evidence
           AND attrs->>'untrusted' IS NULL
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY node_id, gpu_index, nic, kind, attrs->>'xid'",
    )
    .bind(filter)
    .bind(since)
    .bind(until)
    .fetch_all(&mut *tx)
    .await
}

/// One pair's in-line counts in the window.
#[derive(sqlx::FromRow)]
pub struct InlineSums {
    pub node_id: String,
    pub gpu_index: i32,
    pub nic: String,
    pub ok: i64,
    pub ok_nic: i64,
    pub ok_gpu: i64,
    pub mismatch: i64,
    pub mismatch_nic: i64,
    pub mismatch_simulated: i64,
    pub mismatch_misplaced: i64,
    pub in_gpu: i64,
    pub error: i64,
    pub engines: Json<serde_json::Value>,
    /// The pods whose transfers on the pair arrived wrong.
    pub pods: Json<serde_json::Value>,
}

/// Each attributed pair's in-line counts in (`since`, `until`]. Sums are numeric in SQL; each is
/// capped where it becomes a bigint (2^62), so no stored count, however large, fails the read.
/// `mismatch_misplaced` counts too the mismatches of transfers the source's own node reported
/// changed at the source before the READ was confirmed (`railguard_changed_at_source`).
pub async fn inline_sums(
    tx: &mut sqlx::PgConnection,
    filter: &Filter,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<InlineSums>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, nic,
                least(sum(transfers_ok), 4611686018427387904)::bigint AS ok,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND NOT simulated), 0), 4611686018427387904)::bigint AS ok_nic,
                least(coalesce(sum(transfers_ok) FILTER (WHERE path = 'nic_dma' AND nic <> '' AND memory = 'cuda' AND NOT simulated), 0), 4611686018427387904)::bigint AS ok_gpu,
                least(sum(transfers_mismatch), 4611686018427387904)::bigint AS mismatch,
                least(coalesce(sum(transfers_mismatch) FILTER (WHERE path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_nic,
                least(coalesce(sum(transfers_mismatch) FILTER (WHERE simulated AND path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_simulated,
                least(coalesce(sum(transfers_mismatch_misplaced
                                  + CASE WHEN transfers_mismatch > transfers_mismatch_misplaced
                                         THEN railguard_mismatches_changed_at_source(failures, observed_at, transfers_mismatch,
                                                                                     transfers_mismatch_misplaced)
                                         ELSE 0 END)
                              FILTER (WHERE path IN ('nic_dma', 'simulated') AND nic <> ''), 0), 4611686018427387904)::bigint AS mismatch_misplaced,
                least(coalesce(sum(transfers_ok + transfers_mismatch + transfers_error) FILTER (WHERE memory = 'cuda' AND path = 'nic_dma' AND nic <> '' AND NOT simulated), 0), 4611686018427387904)::bigint AS in_gpu,
                least(sum(transfers_error), 4611686018427387904)::bigint AS error,
                coalesce(jsonb_agg(DISTINCT engine) FILTER (WHERE (transfers_mismatch > 0 AND path = 'host_copy'
                                                                   OR transfers_mismatch_misplaced > 0)
                                                            AND engine IS NOT NULL), '[]') AS engines,
                coalesce(jsonb_agg(DISTINCT pod) FILTER (WHERE transfers_mismatch > 0 AND pod IS NOT NULL), '[]') AS pods
         FROM inline_reports
         WHERE observed_at > $2 AND observed_at <= $3 AND gpu_index IS NOT NULL
           AND ($1::text[] IS NULL OR node_id = ANY($1))
         GROUP BY node_id, gpu_index, nic",
    )
    .bind(filter)
    .bind(since)
    .bind(until)
    .fetch_all(&mut *tx)
    .await
}

/// One destination pair's mismatches from one source (`REMOTE_MISMATCHES`).
#[derive(sqlx::FromRow)]
pub struct RemoteRow {
    pub node_id: String,
    pub gpu_index: i32,
    pub nic: String,
    pub n: i64,
    pub dests: i64,
    pub source: String,
    pub end_node: Option<String>,
    pub end_gpu: Option<i32>,
    pub end_gpu_bdf: Option<String>,
    pub end_nic: Option<String>,
    pub announced_by: i64,
}

impl RemoteRow {
    pub fn end(&self) -> crate::store::read::SourceEnd {
        crate::store::read::SourceEnd::of(
            self.source.clone(),
            self.announced_by,
            self.end_node.clone(),
            self.end_gpu,
            self.end_gpu_bdf.clone(),
            self.end_nic.clone(),
        )
    }
}

/// Per destination pair (`$1`: its nodes, or NULL), the NIC-moved mismatches in `$2..$3` from
/// each source that sent wrong bytes to two or more GPUs of the fleet, where the destination
/// got wrong bytes from no other source. A source is counted by its `source_key`
/// (`inline_source_failures`): the GPU/NIC pair its own node attested, else its name. A source
/// whose own node proves that pair clean (`end_proven_clean`) is never the one to blame.
pub const REMOTE_MISMATCHES: &str = "WITH f AS (
        SELECT * FROM inline_source_failures WHERE observed_at > $2 AND observed_at <= $3
     ), dest AS (
        SELECT node_id, gpu_index, count(DISTINCT source_key) AS sources FROM f GROUP BY 1, 2
     ), src AS (
        SELECT source_key, count(DISTINCT (node_id, gpu_index)) AS dests FROM f GROUP BY 1
     )
     SELECT f.node_id, f.gpu_index, f.nic, count(*)::bigint AS n, src.dests, min(f.source) AS source,
            min(f.end_node) AS end_node, min(f.end_gpu) AS end_gpu, min(f.end_gpu_bdf) AS end_gpu_bdf,
            min(f.end_nic) AS end_nic, max(f.announced_by) AS announced_by
     FROM f JOIN src USING (source_key) JOIN dest USING (node_id, gpu_index)
     WHERE f.path IN ('nic_dma', 'simulated') AND src.dests >= 2 AND dest.sources = 1 AND NOT f.end_proven_clean
       AND ($1::text[] IS NULL OR f.node_id = ANY($1))
     GROUP BY f.node_id, f.gpu_index, f.nic, f.source_key, src.dests";

pub async fn remote_mismatches(
    tx: &mut sqlx::PgConnection,
    filter: &Filter,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<RemoteRow>, sqlx::Error> {
    sqlx::query_as(REMOTE_MISMATCHES).bind(filter).bind(since).bind(until).fetch_all(&mut *tx).await
}

/// One failed in-line transfer of a pair, as stored (decoded by the reader).
#[derive(sqlx::FromRow)]
pub struct FailureRow {
    pub node_id: String,
    pub gpu_index: i32,
    pub nic: String,
    pub f: Json<serde_json::Value>,
}

/// The latest three failed in-line transfers of each attributed pair in (`since`, `until`].
pub async fn latest_inline_failures(
    tx: &mut sqlx::PgConnection,
    filter: &Filter,
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<Vec<FailureRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT node_id, gpu_index, nic, f FROM (
            SELECT r.node_id, r.gpu_index, r.nic, f.value AS f,
                   row_number() OVER (PARTITION BY r.node_id, r.gpu_index, r.nic
                                      ORDER BY r.observed_at DESC, f.ordinality DESC) AS rn
            FROM inline_reports r, jsonb_array_elements(r.failures) WITH ORDINALITY AS f(value, ordinality)
            WHERE r.observed_at > $2 AND r.observed_at <= $3 AND r.gpu_index IS NOT NULL
              AND (r.transfers_mismatch > 0 OR r.transfers_error > 0)
              AND f.value->>'source_changed' IS DISTINCT FROM 'true'
              AND ($1::text[] IS NULL OR r.node_id = ANY($1))
         ) x WHERE rn <= 3 ORDER BY node_id, gpu_index, nic, rn",
    )
    .bind(filter)
    .bind(since)
    .bind(until)
    .fetch_all(&mut *tx)
    .await
}
