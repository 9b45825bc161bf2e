//! The fleet grid a page at a time: the GPUs a filter leaves, counted over the whole fleet, and
//! the cells of one page of their nodes, worst first; now, or as the fleet was at a time.
//!
//! Now, the counts of a grid nothing filters but the node's name and the GPUs' status come from
//! the per-node counts the assessment keeps (`node_status`) and its page is a range of them: a
//! refresh reads what one page shows, not every GPU of the fleet. A filter on the GPUs' other
//! facts (unverified, workload NIC, hypervisor, model) reads the GPUs it leaves, one short row
//! each, and ranks their nodes in the collector. As it was at a time, every GPU's status then is
//! read (the status history holds no per-node counts) and filtered here by
//! [`GridFilter::matches`], the same filter the SQL applies now.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::fleet::{FleetTotals, GridCell, NodeSummary, StatusChange};
use crate::model::{GpuStatus, Verification};

/// Which GPUs the grid shows. Text is matched without regard to case.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GridFilter {
    /// The node's id contains this.
    pub node: Option<String>,
    pub status: Option<StatusFilter>,
    /// The NIC its workload uses, the whole name.
    pub nic: Option<String>,
    pub hypervisor: Option<HypervisorFilter>,
    /// Its model name contains this.
    pub model: Option<String>,
}

/// A GPU's status, or its workload pair unverified (unprobed, or probed through no NIC).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Is(GpuStatus),
    Unverified,
}

/// The node's hypervisor from its latest topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HypervisorFilter {
    /// None: bare metal, or not known.
    BareMetal,
    /// Its name contains this.
    Contains(String),
}

/// Which nodes' cells to return: at most `limit` nodes (None: all) after the cursor of the
/// previous page ([`GridRead::next`]).
#[derive(Debug, Clone, Default)]
pub struct GridPage {
    pub limit: Option<i64>,
    pub after: Option<(i32, String)>,
}

/// What one read of the grid returns.
#[derive(Debug, Clone, Default)]
pub struct GridRead {
    /// The GPUs the filter leaves, in all and by status, over the whole fleet.
    pub totals: FleetTotals,
    /// Their nodes, over the whole fleet.
    pub nodes: i64,
    /// The cells the filter leaves of the page's nodes, the nodes worst first (by the worst of
    /// their cells), then by id; each node's cells by index.
    pub cells: Vec<GridCell>,
    /// The page's nodes with all their GPUs counted, in the page's order (now only).
    pub page_nodes: Vec<NodeSummary>,
    /// The status changes of the last hour, newest first, at most 200 (now only): the fleet's
    /// when nothing filters, else those of the page's GPUs.
    pub changes: Vec<StatusChange>,
    /// The cursor of the next page; None on the last.
    pub next: Option<String>,
}

impl FleetTotals {
    fn add(&mut self, status: GpuStatus, unverified: bool) {
        self.gpus += 1;
        *self.of_status_mut(status) += 1;
        self.unverified += i64::from(unverified);
    }
}

/// A status's place in `gpu_status_kind` (1-based, as `node_status.rank` holds it).
fn rank_of(status: GpuStatus) -> i32 {
    GpuStatus::ALL.iter().position(|s| *s == status).map_or(0, |i| i as i32 + 1)
}

fn is_unverified(v: Option<Verification>) -> bool {
    matches!(v, Some(Verification::Unprobed | Verification::Unproven))
}

fn contains_folded(haystack: &str, needle: &str) -> bool {
    haystack.to_lowercase().contains(&needle.to_lowercase())
}

impl GridFilter {
    /// Nothing filters the GPUs but their node's name and their status (not "unverified"): the
    /// per-node counts answer.
    pub fn by_node_counts(&self) -> bool {
        self.status != Some(StatusFilter::Unverified)
            && self.nic.is_none()
            && self.hypervisor.is_none()
            && self.model.is_none()
    }

    /// Whether `cell` is one the filter leaves (the reference for the SQL of the grid now).
    pub fn matches(&self, cell: &GridCell) -> bool {
        self.node.as_deref().is_none_or(|q| contains_folded(&cell.node, q))
            && match self.status {
                None => true,
                Some(StatusFilter::Is(s)) => cell.status == s,
                Some(StatusFilter::Unverified) => is_unverified(cell.verification),
            }
            && self.nic.as_deref().is_none_or(|n| cell.workload_nic.as_deref() == Some(n))
            && match &self.hypervisor {
                None => true,
                Some(HypervisorFilter::BareMetal) => cell.hypervisor.is_empty(),
                Some(HypervisorFilter::Contains(h)) => contains_folded(&cell.hypervisor, h),
            }
            && self.model.as_deref().is_none_or(|m| contains_folded(&cell.gpu_model, m))
    }

    /// The SQL parameters $1–$6 of the grid's filters: texts folded to lower case, the hypervisor
    /// `''` for bare metal.
    fn binds(&self) -> Binds {
        Binds {
            node: self.node.as_deref().map(str::to_lowercase),
            status: match self.status {
                Some(StatusFilter::Is(s)) => Some(s),
                _ => None,
            },
            unverified: self.status == Some(StatusFilter::Unverified),
            nic: self.nic.clone(),
            hypervisor: self.hypervisor.as_ref().map(|h| match h {
                HypervisorFilter::BareMetal => String::new(),
                HypervisorFilter::Contains(h) => h.to_lowercase(),
            }),
            model: self.model.as_deref().map(str::to_lowercase),
        }
    }
}

struct Binds {
    node: Option<String>,
    status: Option<GpuStatus>,
    unverified: bool,
    nic: Option<String>,
    hypervisor: Option<String>,
    model: Option<String>,
}

/// Binds the grid's filters to a query, in the order of their parameters.
trait BindFilter<'q>: Sized {
    /// $1–$4: `grid_gpu_where!`.
    fn bind_gpu(self, b: &'q Binds) -> Self;
    /// $5–$6: `grid_topology_where!`.
    fn bind_topology(self, b: &'q Binds) -> Self;
}

impl<'q, O> BindFilter<'q> for sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    fn bind_gpu(self, b: &'q Binds) -> Self {
        self.bind(&b.node).bind(b.status).bind(b.unverified).bind(&b.nic)
    }

    fn bind_topology(self, b: &'q Binds) -> Self {
        self.bind(&b.hypervisor).bind(&b.model)
    }
}

// The filter on `s` (gpu_status) by $1–$4 ([`GridFilter::binds`]): node, status, unverified,
// workload NIC.
macro_rules! grid_gpu_where {
    () => {
        "($1::text IS NULL OR strpos(lower(s.node_id), $1) > 0)
         AND ($2::gpu_status_kind IS NULL OR s.status = $2)
         AND (NOT $3::bool OR s.verification IN ('unprobed', 'unproven'))
         AND ($4::text IS NULL OR s.workload_nic = $4)"
    };
}

// The filter on the node's latest topology `t` and the GPU's row of it `g` by $5–$6:
// hypervisor ('' for bare metal), model.
macro_rules! grid_topology_where {
    () => {
        "($5::text IS NULL OR CASE WHEN $5 = '' THEN coalesce(t.hypervisor, '') = ''
                                   ELSE strpos(lower(coalesce(t.hypervisor, '')), $5) > 0 END)
         AND ($6::text IS NULL OR strpos(lower(coalesce(g.name, '')), $6) > 0)"
    };
}

// `t` and `g` for a few nodes' GPUs: each GPU's node's latest snapshot by its index.
macro_rules! grid_topology_of_few {
    () => {
        "LEFT JOIN LATERAL (SELECT x.record_id, x.hypervisor FROM topology_snapshots x WHERE x.node_id = s.node_id
                            ORDER BY x.received_at DESC, x.observed_at DESC LIMIT 1) t ON true
         LEFT JOIN topology_gpus g ON g.node_id = s.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = s.gpu_index"
    };
}

// `t` and `g` for every GPU of the fleet: the latest snapshots at once.
macro_rules! grid_topology_of_all {
    () => {
        "LEFT JOIN latest_topology t ON t.node_id = s.node_id
         LEFT JOIN topology_gpus g ON g.node_id = t.node_id AND g.snapshot_id = t.record_id AND g.gpu_index = s.gpu_index"
    };
}

/// One GPU the filter leaves: enough to count it and rank its node.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Matched {
    node: String,
    status: GpuStatus,
    verification: Option<Verification>,
}

/// The nodes of the GPUs the filter leaves, each with the rank of its worst one; their totals.
#[derive(Debug, Default)]
struct Tally {
    totals: FleetTotals,
    rank: BTreeMap<String, i32>,
}

impl Tally {
    fn add(&mut self, node: &str, status: GpuStatus, verification: Option<Verification>) {
        self.totals.add(status, is_unverified(verification));
        let r = rank_of(status);
        let have = self.rank.entry(node.to_owned()).or_insert(r);
        *have = (*have).max(r);
    }

    /// The page's nodes, worst first then by id, after `page.after`.
    fn page(&self, page: &GridPage) -> PageOfNodes {
        let mut order: Vec<(i32, &String)> = self.rank.iter().map(|(n, r)| (*r, n)).collect();
        order.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let after = |(r, n): &(i32, &String)| match &page.after {
            None => true,
            Some((ar, an)) => r < ar || (r == ar && *n > an),
        };
        let rest: Vec<(i32, &String)> = order.into_iter().filter(after).collect();
        paged(rest.into_iter().map(|(r, n)| (r, n.clone())).collect(), page.limit)
    }
}

/// One page's nodes, in order, and the cursor after them when more follow.
#[derive(Debug, Default)]
struct PageOfNodes {
    names: Vec<String>,
    next: Option<String>,
}

/// The first `limit` of `ranked` (rank, node) (all: None).
fn paged(mut ranked: Vec<(i32, String)>, limit: Option<i64>) -> PageOfNodes {
    let next = match limit.and_then(|l| usize::try_from(l).ok()) {
        Some(l) if ranked.len() > l => {
            ranked.truncate(l);
            ranked.last().map(|(r, n)| format!("{r}|{n}"))
        }
        _ => None,
    };
    PageOfNodes { names: ranked.into_iter().map(|(_, n)| n).collect(), next }
}

/// The grid now: the GPUs `filter` leaves counted over the fleet, one page of their nodes'
/// cells, those nodes' counts and the last hour's changes (the fleet's, or the page's GPUs').
pub async fn grid_page_now(pool: &PgPool, filter: &GridFilter, page: &GridPage) -> Result<GridRead, sqlx::Error> {
    let b = filter.binds();
    let (totals, nodes, PageOfNodes { names, next }) = if filter.by_node_counts() {
        let (totals, nodes) = node_totals(pool, b.node.as_deref(), b.status).await?;
        (totals, nodes, ranked_nodes(pool, b.node.as_deref(), b.status, page).await?)
    } else {
        // The topology is read only when the filter needs it.
        let matched: Vec<Matched> = if b.hypervisor.is_none() && b.model.is_none() {
            sqlx::query_as(concat!(
                "SELECT s.node_id AS node, s.status, s.verification FROM gpu_status s WHERE ",
                grid_gpu_where!()
            ))
            .bind_gpu(&b)
            .fetch_all(pool)
            .await?
        } else {
            sqlx::query_as(concat!(
                "SELECT s.node_id AS node, s.status, s.verification FROM gpu_status s ",
                grid_topology_of_all!(),
                " WHERE ",
                grid_gpu_where!(),
                " AND ",
                grid_topology_where!()
            ))
            .bind_gpu(&b)
            .bind_topology(&b)
            .fetch_all(pool)
            .await?
        };
        let mut tally = Tally::default();
        for m in &matched {
            tally.add(&m.node, m.status, m.verification);
        }
        (tally.totals.clone(), tally.rank.len() as i64, tally.page(page))
    };
    let mut cells: Vec<GridCell> = sqlx::query_as(concat!(
        "SELECT s.node_id AS node, s.gpu_index AS gpu, s.status, s.since, s.workload_nic, s.verification,
                coalesce(s.reasons->>0, '') AS reason, coalesce(t.hypervisor, '') AS hypervisor,
                coalesce(g.name, '') AS gpu_model
         FROM gpu_status s ",
        grid_topology_of_few!(),
        " WHERE s.node_id = ANY($7) AND ",
        grid_gpu_where!(),
        " AND ",
        grid_topology_where!()
    ))
    .bind_gpu(&b)
    .bind_topology(&b)
    .bind(&names)
    .fetch_all(pool)
    .await?;
    let place = PagePlace::of(&names);
    place.sort_cells(&mut cells);
    let mut page_nodes: Vec<NodeSummary> = sqlx::query_as(
        "SELECT n.node_id AS node, n.hostname, n.agent_version, n.last_seen, n.spool_dropped_total,
                s.gpus, s.ok, s.watch, s.unknown, s.at_risk, s.corrupting, s.unverified, s.worst
         FROM node_status s JOIN nodes n ON n.node_id = s.node_id WHERE s.node_id = ANY($1)",
    )
    .bind(&names)
    .fetch_all(pool)
    .await?;
    page_nodes.sort_by_key(|n| place.of_node(&n.node));
    // Unfiltered, the fleet's newest changes; filtered, those of the page's GPUs (by their
    // node-first index: a filter that leaves few GPUs never scans the hour's changes).
    let changes = if *filter == GridFilter::default() {
        sqlx::query_as(
            "SELECT node_id AS node, gpu_index AS gpu, at, from_status AS \"from\", to_status AS \"to\", reasons
             FROM gpu_status_changes WHERE at > now() - interval '1 hour' ORDER BY at DESC LIMIT 200",
        )
        .fetch_all(pool)
        .await?
    } else {
        let (nodes, gpus): (Vec<&str>, Vec<i32>) = cells.iter().map(|c| (c.node.as_str(), c.gpu)).unzip();
        sqlx::query_as(
            "SELECT c.node_id AS node, c.gpu_index AS gpu, c.at, c.from_status AS \"from\", c.to_status AS \"to\", c.reasons
             FROM unnest($1::text[], $2::int4[]) k (node_id, gpu_index)
             CROSS JOIN LATERAL (SELECT * FROM gpu_status_changes x
                                 WHERE x.node_id = k.node_id AND x.gpu_index = k.gpu_index
                                   AND x.at > now() - interval '1 hour') c
             ORDER BY c.at DESC LIMIT 200",
        )
        .bind(&nodes)
        .bind(&gpus)
        .fetch_all(pool)
        .await?
    };
    let mut read = GridRead { totals, nodes, cells, page_nodes, changes, next };
    read.brief();
    Ok(read)
}

/// The grid as it was at `at` ([`super::grid_at`]), filtered and paged here.
pub async fn grid_page_at(
    pool: &PgPool,
    at: DateTime<Utc>,
    filter: &GridFilter,
    page: &GridPage,
) -> Result<GridRead, sqlx::Error> {
    let cells: Vec<GridCell> = super::grid_at(pool, at).await?.into_iter().filter(|c| filter.matches(c)).collect();
    let mut tally = Tally::default();
    for c in &cells {
        tally.add(&c.node, c.status, c.verification);
    }
    let PageOfNodes { names, next } = tally.page(page);
    let shown: std::collections::BTreeSet<&str> = names.iter().map(String::as_str).collect();
    let mut cells: Vec<GridCell> = cells.into_iter().filter(|c| shown.contains(c.node.as_str())).collect();
    PagePlace::of(&names).sort_cells(&mut cells);
    let mut read =
        GridRead { totals: tally.totals, nodes: tally.rank.len() as i64, cells, next, ..GridRead::default() };
    read.brief();
    Ok(read)
}

/// The most characters of a reason a page of the grid carries: a cell's first reason, a
/// change's first, cut there (`…` marks the cut). The GPU's own page reads its reasons whole; a
/// page of 250 nodes stays under 1 MB whatever its reasons say.
pub const GRID_REASON_CHARS: usize = 120;

impl GridRead {
    /// Cuts each cell's reason and each change's first reason to [`GRID_REASON_CHARS`], and
    /// drops a change's other reasons.
    fn brief(&mut self) {
        for c in &mut self.cells {
            cut_reason(&mut c.reason);
        }
        for c in &mut self.changes {
            c.reasons.truncate(1);
            c.reasons.iter_mut().for_each(cut_reason);
        }
    }
}

/// `reason` cut to [`GRID_REASON_CHARS`] characters, `…` where it was cut.
fn cut_reason(reason: &mut String) {
    if let Some((at, _)) = reason.char_indices().nth(GRID_REASON_CHARS) {
        reason.truncate(at);
        reason.push('…');
    }
}

/// Each node of a page and its place on it.
struct PagePlace<'a>(BTreeMap<&'a str, usize>);

impl<'a> PagePlace<'a> {
    fn of(names: &'a [String]) -> Self {
        PagePlace(names.iter().enumerate().map(|(i, n)| (n.as_str(), i)).collect())
    }

    /// The node's place on the page; after every node of it when it is not there.
    fn of_node(&self, node: &str) -> usize {
        self.0.get(node).copied().unwrap_or(usize::MAX)
    }

    /// Sorts `cells` by their node's place, then by index.
    fn sort_cells(&self, cells: &mut [GridCell]) {
        cells.sort_by_key(|c| (self.of_node(&c.node), c.gpu));
    }
}

/// The GPUs of `status` (every GPU: None) counted, of the nodes whose id contains `node`
/// (lower case; every node: None), and those nodes: from the per-node counts, but for the
/// unverified ones of one status, counted from the GPUs.
async fn node_totals(
    pool: &PgPool,
    node: Option<&str>,
    status: Option<GpuStatus>,
) -> Result<(FleetTotals, i64), sqlx::Error> {
    let (mut sums, nodes) = super::fleet::node_status_sums(pool, node, status).await?;
    let Some(status) = status else { return Ok((sums, nodes)) };
    let unverified: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM gpu_status
         WHERE status = $2 AND verification IN ('unprobed', 'unproven')
           AND ($1::text IS NULL OR strpos(lower(node_id), $1) > 0)",
    )
    .bind(node)
    .bind(status)
    .fetch_one(pool)
    .await?;
    let n = *sums.of_status_mut(status);
    let mut totals = FleetTotals { gpus: n, unverified, ..FleetTotals::default() };
    *totals.of_status_mut(status) = n;
    Ok((totals, nodes))
}

/// A page of the nodes with assessed GPUs whose id contains `node` (lower case; every node:
/// None): worst first then by id, a range of the per-node counts' (rank, node) index; or, of
/// those with GPUs of `status`, by id (the GPUs left all have that status, so their nodes rank
/// alike).
async fn ranked_nodes(
    pool: &PgPool,
    node: Option<&str>,
    status: Option<GpuStatus>,
    page: &GridPage,
) -> Result<PageOfNodes, sqlx::Error> {
    let limit = page.limit.map(|l| l + 1);
    let rows: Vec<(i32, String)> = match status {
        None => {
            sqlx::query_as(
                "SELECT rank, node_id FROM node_status
                 WHERE gpus > 0 AND ($1::text IS NULL OR strpos(lower(node_id), $1) > 0)
                   AND ($2::int IS NULL OR rank < $2 OR (rank = $2 AND node_id > $3))
                 ORDER BY rank DESC, node_id
                 LIMIT $4",
            )
            .bind(node)
            .bind(page.after.as_ref().map(|a| a.0))
            .bind(page.after.as_ref().map(|a| a.1.clone()))
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
        Some(status) => {
            let names: Vec<String> = sqlx::query_scalar(concat!(
                "SELECT node_id FROM node_status
                 WHERE gpus > 0 AND ($1::text IS NULL OR strpos(lower(node_id), $1) > 0) AND ",
                status_count!(),
                " > 0 AND ($3::text IS NULL OR node_id > $3)
                 ORDER BY node_id
                 LIMIT $4"
            ))
            .bind(node)
            .bind(status)
            .bind(page.after.as_ref().map(|a| a.1.clone()))
            .bind(limit)
            .fetch_all(pool)
            .await?;
            names.into_iter().map(|n| (rank_of(status), n)).collect()
        }
    };
    Ok(paged(rows, page.limit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(node: &str, gpu: i32, status: GpuStatus, nic: &str, hv: &str, model: &str) -> GridCell {
        GridCell {
            node: node.into(),
            gpu,
            status,
            since: Utc::now(),
            workload_nic: Some(nic.into()),
            verification: Some(Verification::GpuMemory),
            reason: String::new(),
            hypervisor: hv.into(),
            gpu_model: model.into(),
        }
    }

    #[test]
    fn a_filter_leaves_what_each_of_its_parts_leaves() {
        let c = cell("Gpu-Node-07", 3, GpuStatus::Corrupting, "mlx5_1", "QEMU", "NVIDIA H100");
        let f = |g: GridFilter| g.matches(&c);
        assert!(f(GridFilter::default()));
        assert!(f(GridFilter { node: Some("node-0".into()), ..Default::default() }));
        assert!(!f(GridFilter { node: Some("node-1".into()), ..Default::default() }));
        assert!(f(GridFilter { status: Some(StatusFilter::Is(GpuStatus::Corrupting)), ..Default::default() }));
        assert!(!f(GridFilter { status: Some(StatusFilter::Unverified), ..Default::default() }));
        assert!(!f(GridFilter { nic: Some("mlx5_10".into()), ..Default::default() }), "the whole name");
        assert!(!f(GridFilter { nic: Some("mlx5".into()), ..Default::default() }), "the whole name");
        assert!(f(GridFilter { hypervisor: Some(HypervisorFilter::Contains("qemu".into())), ..Default::default() }));
        assert!(!f(GridFilter { hypervisor: Some(HypervisorFilter::BareMetal), ..Default::default() }));
        assert!(f(GridFilter { model: Some("h100".into()), ..Default::default() }));
        let metal = cell("n", 0, GpuStatus::Ok, "mlx5_0", "", "");
        assert!(GridFilter { hypervisor: Some(HypervisorFilter::BareMetal), ..Default::default() }.matches(&metal));
        let mut unv = metal.clone();
        unv.verification = Some(Verification::Unproven);
        assert!(GridFilter { status: Some(StatusFilter::Unverified), ..Default::default() }.matches(&unv));
    }

    #[test]
    fn pages_go_worst_first_and_a_cursor_never_repeats_or_skips_a_node() {
        let mut t = Tally::default();
        for (n, s) in
            [("a", GpuStatus::Ok), ("b", GpuStatus::Corrupting), ("c", GpuStatus::Ok), ("d", GpuStatus::Watch)]
        {
            t.add(n, s, None);
            t.add(n, GpuStatus::Ok, Some(Verification::Unprobed));
        }
        assert_eq!(t.totals.gpus, 8);
        assert_eq!((t.totals.ok, t.totals.corrupting, t.totals.watch, t.totals.unverified), (6, 1, 1, 4));
        let mut seen = Vec::new();
        let mut page = GridPage { limit: Some(3), after: None };
        loop {
            let PageOfNodes { names, next } = t.page(&page);
            seen.extend(names);
            let Some(next) = next else { break };
            let (r, n) = next.split_once('|').unwrap();
            page.after = Some((r.parse().unwrap(), n.to_owned()));
        }
        assert_eq!(seen, ["b", "d", "a", "c"]);
        assert_eq!(t.page(&GridPage::default()).names, ["b", "d", "a", "c"]);
    }

    #[test]
    fn a_long_reason_is_cut_on_a_character_and_marked() {
        let mut long = "GPU0↔mlx5_0 ".repeat(20);
        cut_reason(&mut long);
        assert_eq!(long.chars().count(), GRID_REASON_CHARS + 1);
        assert!(long.ends_with('…'));
        let mut short = "silent corruption".to_owned();
        cut_reason(&mut short);
        assert_eq!(short, "silent corruption");
        let mut exact = "x".repeat(GRID_REASON_CHARS);
        cut_reason(&mut exact);
        assert_eq!(exact.len(), GRID_REASON_CHARS);
    }
}
